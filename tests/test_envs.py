import functools
import importlib.util
import pickle

import gymnasium as gym
from gymnasium import spaces
import numpy as np
import pytest
import torch
from tensordict.nn import TensorDictModule, TensorDictSequential
from torchrl.collectors import Collector
from torchrl.envs import Compose, InitTracker, RewardSum, SerialEnv, TransformedEnv, VecNormV2
from torchrl.modules import OneHotCategorical, ProbabilisticActor

from torchrl_seqchunk import EncodeObservation, MaskObservation, PreviousReward, ResetRNN, ReturnScaledReward, RunningObservationNorm
from torchrl_seqchunk.envs import SyncVectorGymWrapper, make_masked_env, make_vector_env


class _Declares(gym.Env):
    """An env that only declares an observation space, all that EncodeObservation reads."""

    def __init__(self, observation_space):
        self.observation_space, self.action_space = observation_space, spaces.Discrete(2)


def test_mask_keeps_positions_and_leaves_dynamics_alone():
    full = gym.make("CartPole-v1")
    masked = MaskObservation(gym.make("CartPole-v1"), keep=[0, 2])
    assert masked.observation_space.shape == (2,)
    # CartPole's bounds: cart position +-4.8, pole angle +-0.418879 rad (24 degrees * 2).
    np.testing.assert_allclose(masked.observation_space.high, [4.8, 0.41887903], rtol=1e-6)
    assert masked.observation_space.dtype == np.float32

    obs_full, _ = full.reset(seed=3)
    obs, _ = masked.reset(seed=3)
    np.testing.assert_array_equal(obs, obs_full[[0, 2]])
    for action in [1, 1, 0, 1, 0, 0, 1]:
        obs_full, r_full, term_full, trunc_full, _ = full.step(action)
        obs, r, term, trunc, _ = masked.step(action)
        np.testing.assert_array_equal(obs, obs_full[[0, 2]])
        assert (r, term, trunc) == (r_full, term_full, trunc_full)


def test_previous_reward_appends_the_last_steps_reward_and_zero_after_a_reset():
    env, plain = PreviousReward(gym.make("Pendulum-v1")), gym.make("Pendulum-v1")
    assert env.observation_space.shape == (4,) and env.observation_space.dtype == np.float32
    obs, _ = env.reset(seed=3)
    want, _ = plain.reset(seed=3)
    assert obs.dtype == np.float32 and np.array_equal(obs, np.append(want, 0.0).astype(np.float32))
    for action in ([2.0], [-1.0], [0.5]):
        obs, reward, *_ = env.step(np.array(action, dtype=np.float32))
        want, want_reward, *_ = plain.step(np.array(action, dtype=np.float32))
        assert reward == want_reward and np.array_equal(obs[:3], want) and obs[3] == np.float32(want_reward)
    assert env.reset(seed=4)[0][3] == 0.0
    with pytest.raises(TypeError, match="1-D float Box"):
        PreviousReward(gym.make("FrozenLake-v1"))
    # through TorchRL, after the mask: [kept entries, previous reward]; a batch of them alike
    td = make_masked_env("Pendulum-v1", keep=(2,), prev_reward=True).rollout(3)
    assert td["observation"].shape == (3, 2) and td["observation"][0, 1] == 0
    assert torch.equal(td["next", "observation"][:, 1], td["next", "reward"][:, 0])
    assert torch.equal(td["observation"][1:, 1], td["next", "reward"][:-1, 0])
    vector = make_vector_env("Pendulum-v1", 2, keep=(2,), prev_reward=True)
    assert vector.reset()["observation"].shape == (2, 2)


def test_mask_order_and_negative_indices():
    env = MaskObservation(gym.make("CartPole-v1"), keep=[-1, 0])
    obs, _ = env.reset(seed=0)
    full, _ = gym.make("CartPole-v1").reset(seed=0)
    np.testing.assert_array_equal(obs, [full[3], full[0]])
    np.testing.assert_array_equal(env.keep, [3, 0])


@pytest.mark.parametrize(
    "keep, error, match",
    [([], ValueError, "keeps nothing"),
     ([0, 4], ValueError, "out of range"),
     ([1, -3], ValueError, "repeats"),
     ([0.5], TypeError, "integers"),
     ([True], TypeError, "integers")],
)
def test_mask_rejects_bad_keep(keep, error, match):
    with pytest.raises(error, match=match):
        MaskObservation(gym.make("CartPole-v1"), keep=keep)


def test_mask_rejects_non_flat_space():
    with pytest.raises(TypeError, match="1-D Box"):
        MaskObservation(gym.make("FrozenLake-v1"), keep=[0])


def test_factory_in_serial_env_matches_gymnasium():
    env = SerialEnv(2, functools.partial(make_masked_env, "CartPole-v1", (0, 2)))
    env.set_seed(7)
    td = env.reset()
    assert td["observation"].shape == (2, 2)
    assert td["observation"].dtype == torch.float32
    # Each worker is an unmodified CartPole: its masked reset observation lies in the
    # uniform(-0.05, 0.05) initial range, and every step pays reward 1.
    assert td["observation"].abs().max() <= 0.05
    rollout = env.rollout(20, break_when_any_done=False)
    assert rollout["next", "reward"].eq(1).all()
    assert rollout["observation"].shape == (2, 20, 2)
    env.close()


# Each case: a space, observations, and their encodings written out by hand.
ENCODINGS = {
    "discrete_start": (spaces.Discrete(3, start=-1), [-1, 1], [[1, 0, 0], [0, 0, 1]]),
    # the edges, given as numpy ints of other widths, a bool and a [1] array
    "discrete_edges": (spaces.Discrete(2, start=5), [np.int8(5), np.uint32(6), np.array([6])],
                       [[1, 0], [0, 1], [0, 1]]),
    "discrete_bool": (spaces.Discrete(2), [True, np.bool_(False)], [[0, 1], [1, 0]]),
    "multidiscrete_start_edges": (spaces.MultiDiscrete([2, 3], start=[1, -1]),
                                  [np.array([1, -1]), np.array([2, 1])],
                                  [[1, 0, 1, 0, 0], [0, 1, 0, 0, 1]]),
    "multibinary_2d": (spaces.MultiBinary([2, 2]), [np.array([[True, False], [False, True]]),
                                                   np.array([[0.0, 1.0], [1.0, 0.0]])],
                       [[1, 0, 0, 1], [0, 1, 1, 0]]),
    "box_int_bounds": (spaces.Box(0, 255, (2,), np.uint8), [np.array([0.0, 255.0])], [[0, 255]]),
    # nvec [[2, 3], [4, 2]] is read in C order: blocks of 2, 3, 4, 2 at offsets 0, 2, 5, 9.
    "multidiscrete_2d": (spaces.MultiDiscrete([[2, 3], [4, 2]]), [np.array([[1, 2], [0, 1]])],
                         [[0, 1, 0, 0, 1, 1, 0, 0, 0, 0, 1]]),
    "multidiscrete_start": (spaces.MultiDiscrete([3, 2], start=[-1, 5]), [np.array([0, 6])],
                            [[0, 1, 0, 0, 1]]),
    "box_uint8_2d": (spaces.Box(0, 255, (2, 2), np.uint8), [np.array([[0, 255], [7, 1]], np.uint8)],
                     [[0, 255, 7, 1]]),
    "box_bool": (spaces.Box(0, 1, (3,), bool), [np.array([True, False, True])], [[1, 0, 1]]),
    "box_int": (spaces.Box(-5, 5, (2,), np.int64), [np.array([-5, 3])], [[-5, 3]]),
    "box_float64": (spaces.Box(-1, 1, (2,), np.float64), [np.array([0.25, -0.5])], [[0.25, -0.5]]),
    "multibinary": (spaces.MultiBinary(3), [np.array([1, 0, 1], np.int8)], [[1, 0, 1]]),
    "tuple": (spaces.Tuple((spaces.Discrete(2), spaces.Box(0, 9, (1,), np.int32))),
              [(1, np.array([4], np.int32))], [[0, 1, 4]]),
    # A Dict built from a plain dict sorts its keys: "a" comes before "b".
    "dict_sorted": (spaces.Dict({"b": spaces.Discrete(2), "a": spaces.Tuple((spaces.MultiBinary(1),
                                                                              spaces.Discrete(3)))}),
                    [{"b": 0, "a": (np.array([1], np.int8), 2)}], [[1, 0, 0, 1, 1, 0]]),
}


@pytest.mark.parametrize("name", ENCODINGS)
def test_encode_matches_hand_written_values(name):
    space, observations, expected = ENCODINGS[name]
    env = EncodeObservation(_Declares(space))
    assert env.observation_space.shape == (len(expected[0]),)
    assert env.observation_space.dtype == np.float32
    for obs, want in zip(observations, expected):
        got = env.observation(obs)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, want)
        assert env.observation_space.contains(got)


def test_encode_box_bounds_are_float32_of_the_original():
    box = spaces.Box(np.array([-3, 0]), np.array([3, 255]), dtype=np.int64)
    space = spaces.Tuple((spaces.Discrete(2), box))
    env = EncodeObservation(_Declares(space))
    np.testing.assert_array_equal(env.observation_space.low, [0, 0, -3, 0])
    np.testing.assert_array_equal(env.observation_space.high, [1, 1, 3, 255])


@pytest.mark.parametrize(
    "space, where",
    [(spaces.Text(5), r"env.observation_space=Text"),
     (spaces.Sequence(spaces.Discrete(2)), r"env.observation_space=Sequence"),
     (spaces.Graph(spaces.Box(0, 1, (2,)), None), r"env.observation_space=Graph"),
     (spaces.Tuple((spaces.Discrete(2), spaces.Text(3))), r"env.observation_space\[1\]=Text"),
     (spaces.Dict({"x": spaces.OneOf((spaces.Discrete(2), spaces.Discrete(3)))}),
      r"env.observation_space\['x'\]=OneOf")],
)
def test_encode_names_an_unsupported_space(space, where):
    with pytest.raises(TypeError, match=where + r".*cannot be encoded.*ObservationWrapper"):
        EncodeObservation(_Declares(space))


# Observations outside their space: gymnasium's flatten raised an IndexError deep inside, or
# encoded them silently wrong (a one-hot at the wrong index, a bit of 2).
OUTSIDE = {
    "discrete_above": (spaces.Discrete(3), 5, r"observation=5 is outside its space Discrete\(3\)"),
    "discrete_below": (spaces.Discrete(3), -1, r"observation=-1 is outside its space Discrete\(3\)"),
    "discrete_start": (spaces.Discrete(3, start=2), 0, r"observation=0 .* Discrete\(3, start=2\)"),
    "discrete_fraction": (spaces.Discrete(3), 1.5, r"observation=1.5 .* Discrete\(3\)"),
    "multidiscrete_above": (spaces.MultiDiscrete([2, 3]), np.array([1, 3]),
                            r"observation=array\(\[1, 3\]\) .* MultiDiscrete\(\[2 3\]\)"),
    "multidiscrete_below": (spaces.MultiDiscrete([2, 3]), np.array([-1, 0]),
                            r"observation=array\(\[-1,  0\]\) .* MultiDiscrete\(\[2 3\]\)"),
    "multidiscrete_shape": (spaces.MultiDiscrete([2, 3]), np.array([1]), r"MultiDiscrete\(\[2 3\]\)"),
    "multibinary": (spaces.MultiBinary(3), np.array([0, 2, 1]),
                    r"observation=array\(\[0, 2, 1\]\) .* MultiBinary\(3\)"),
    "discrete_float": (spaces.Discrete(3), 1.0, r"observation=1.0 .* Discrete\(3\)"),  # IndexError
    "discrete_uint64": (spaces.Discrete(3), np.uint64(1), r"observation=np.uint64\(1\)"),  # IndexError
    "discrete_str": (spaces.Discrete(3), "2", r"observation='2' .* Discrete\(3\)"),
    # 2**53 below start 2**53 + 1: equal as float64, so a one-hot at index -1 (the last)
    "discrete_huge_start": (spaces.Discrete(3, start=2**53 + 1), 2**53,
                            r"observation=9007199254740992 .* start=9007199254740993"),
    "multidiscrete_float": (spaces.MultiDiscrete([2, 3]), np.array([1.0, 2.0]), r"MultiDiscrete"),
    # gymnasium's cast to the Box dtype would change these: NaN to -2**63, 2.7 to 2, 300 to 44
    "box_int_nan": (spaces.Box(0, 9, (2,), np.int64), np.array([np.nan, 1.0]), r"array\(\[nan,"),
    "box_int_fraction": (spaces.Box(0, 9, (2,), np.int64), np.array([2.7, 1.0]), r"int64\)"),
    "box_uint8_wraps": (spaces.Box(0, 255, (2,), np.uint8), np.array([300, 1]), r"uint8\)"),
    "box_bool_two": (spaces.Box(0, 1, (2,), bool), np.array([2, 0]), r"bool\)"),
    # another shape: a Dict of (2,) and (3,) Boxes given (3,) and (2,) would swap silently
    "box_shape": (spaces.Dict({"a": spaces.Box(0, 1, (2,)), "b": spaces.Box(0, 1, (3,))}),
                  {"a": np.zeros(3), "b": np.zeros(2)}, r"observation\['a'\]=array"),
    "box_scalar": (spaces.Box(0, 1, (3,)), 0.5, r"observation=0.5 .* \(3,\)"),
    "dict_missing": (spaces.Dict({"a": spaces.Discrete(2), "b": spaces.Discrete(2)}), {"a": 1},
                     r"observation=\{'a': 1\} .* Dict"),  # KeyError
    "dict_extra": (spaces.Dict({"a": spaces.Discrete(2)}), {"a": 1, "c": 5}, r"Dict"),
    "tuple_short": (spaces.Tuple((spaces.Discrete(2), spaces.Discrete(2))), (1,),
                    r"observation=\(1,\) .* Tuple"),  # IndexError
    "tuple_nested_long": (spaces.Dict({"t": spaces.Tuple((spaces.Discrete(2),))}), {"t": (1, 0)},
                          r"observation\['t'\]=\(1, 0\) .* Tuple"),
    # a Box value outside its bounds is encoded as it is: the part named is the MultiDiscrete
    "nested": (spaces.Dict({"a": spaces.Discrete(2),
                            "b": spaces.Tuple((spaces.Box(0, 1, (1,)), spaces.MultiDiscrete([4])))}),
               {"a": 1, "b": (np.array([9.0], np.float32), np.array([4]))},
               r"observation\['b'\]\[1\]=array\(\[4\]\) .* MultiDiscrete\(\[4\]\)"),
}


@pytest.mark.parametrize("name", OUTSIDE)
def test_encode_names_an_observation_outside_its_space(name):
    space, obs, match = OUTSIDE[name]
    with pytest.raises(ValueError, match=match + r".*, which EncodeObservation would encode wrongly"
                                                 r".*Fix the env, or declare a space that holds it"):
        EncodeObservation(_Declares(space)).observation(obs)


def test_frozenlake_is_one_hot_through_torchrl():
    env = make_masked_env("FrozenLake-v1", is_slippery=False)
    td = env.reset()
    assert td["observation"].shape == (16,) and td["observation"].dtype == torch.float32
    np.testing.assert_array_equal(td["observation"], np.eye(16)[0])  # the start state, 0
    # Deterministic moves: down (1) to state 4, then right (2) into the hole at state 5.
    for action, state in [(1, 4), (2, 5)]:
        td["action"] = torch.nn.functional.one_hot(torch.tensor(action), 4)
        td = env.step(td)["next"]
        np.testing.assert_array_equal(td["observation"], np.eye(16)[state])
    assert td["terminated"].item() and td["reward"].item() == 0


def test_mask_indexes_the_encoded_vector():
    env = make_masked_env("FrozenLake-v1", keep=[0, 4, 5])
    assert env.observation_spec["observation"].shape == (3,)
    np.testing.assert_array_equal(env.reset()["observation"], [1, 0, 0])


needs_popgym = pytest.mark.skipif(importlib.util.find_spec("popgym") is None, reason="popgym not installed")


def _one_hots(values, n):
    return np.eye(n)[np.asarray(values)].reshape(-1)


# popgym id -> (encoded size, the encoding of a raw observation written out by hand).
POPGYM = {
    "RepeatFirstEasy": (4, lambda o: _one_hots(o, 4)),  # Discrete(4)
    "AutoencodeEasy": (6, lambda o: np.concatenate([_one_hots(o[0], 2), _one_hots(o[1], 4)])),  # Tuple
    "ConcentrationEasy": (156, lambda o: _one_hots(o, 3)),  # MultiDiscrete([3] * 52)
    "BattleshipEasy": (2, lambda o: _one_hots(o, 2)),  # Discrete(2); MultiDiscrete([8, 8]) action
    "PositionOnlyPendulumEasy": (2, lambda o: o),  # Box(2) float32; Box(1) action
}


@needs_popgym
@pytest.mark.parametrize("name", POPGYM)
def test_popgym_encodings_match_the_raw_observations(name):
    size, encode = POPGYM[name]
    raw, env = gym.make(f"popgym:popgym-{name}-v0"), EncodeObservation(gym.make(f"popgym:popgym-{name}-v0"))
    raw.action_space.seed(0)
    observations = [(raw.reset(seed=1)[0], env.reset(seed=1)[0])]
    for _ in range(4):
        action = raw.action_space.sample()
        observations.append((raw.step(action)[0], env.step(action)[0]))
    for raw_obs, obs in observations:
        assert obs.shape == (size,) and obs.dtype == np.float32
        np.testing.assert_array_equal(obs, encode(raw_obs))


@needs_popgym
@pytest.mark.parametrize("name", POPGYM)
def test_popgym_by_name_through_torchrl(name):
    env = make_masked_env(f"popgym:popgym-{name}-v0")
    rollout = env.rollout(5, break_when_any_done=False)
    assert rollout["observation"].shape == (5, POPGYM[name][0])
    assert rollout["observation"].dtype == torch.float32


def test_pendulum_continuous_action():
    env = make_masked_env("Pendulum-v1")
    rollout = env.rollout(5)
    assert rollout["observation"].shape == (5, 3) and rollout["observation"].dtype == torch.float32
    assert rollout["action"].shape == (5, 1) and rollout["action"].dtype == torch.float32
    # Pendulum observes [cos(theta), sin(theta), theta_dot]: a point on the unit circle.
    torch.testing.assert_close(rollout["observation"][:, :2].norm(dim=-1), torch.ones(5))


@needs_popgym
def test_popgym_factory_pickles_into_serial_env():
    factory = functools.partial(make_masked_env, "popgym:popgym-AutoencodeEasy-v0")
    env = SerialEnv(2, pickle.loads(pickle.dumps(factory)))
    rollout = env.rollout(5, break_when_any_done=False)
    assert rollout["observation"].shape == (2, 5, 6)
    # Two one-hot blocks: sizes 2 and 4, each summing to 1.
    obs = rollout["observation"]
    assert obs[..., :2].sum(-1).eq(1).all() and obs[..., 2:].sum(-1).eq(1).all()
    env.close()


# The in-process vector path against SerialEnv: same seeds, same episodes, step for step.
def _serial(env_id, num_envs, keep=None, **make_kwargs):
    return SerialEnv(num_envs, functools.partial(make_masked_env, env_id, keep, **make_kwargs))


def _agent_pipeline(batched, seed, obs_norm=None):
    """The main job's transforms and a sampling ResetRNN actor on `batched`, collected by TorchRL."""
    torch.manual_seed(seed)  # the actor's weights and actions
    rnn = ResetRNN(torch.nn.GRU(8, 8, batch_first=True), in_key="embed", out_key="features",
                   state_key="actor_state")
    norm = {None: [], "vecnorm": [VecNormV2(in_keys=["observation"], decay=1.0, reduce_batch_dims=True)],
            "running": [RunningObservationNorm()]}[obs_norm]
    env = TransformedEnv(batched, Compose(InitTracker(init_key="is_first"), RewardSum(), *norm,
                                          ReturnScaledReward(gamma=0.98), rnn.make_tensordict_primer()))
    env.set_seed(seed)
    obs_dim, spec = env.observation_spec["observation"].shape[-1], env.full_action_spec_unbatched["action"]
    actor = ProbabilisticActor(TensorDictSequential(
        TensorDictModule(torch.nn.Linear(obs_dim, 8), ["observation"], ["embed"]), rnn,
        TensorDictModule(torch.nn.Linear(8, spec.shape[-1]), ["features"], ["logits"])),
        in_keys=["logits"], spec=spec, distribution_class=OneHotCategorical, return_log_prob=True)
    collector = Collector(env, actor, frames_per_batch=4 * 40, total_frames=3 * 4 * 40,
                          auto_register_policy_transforms=False)
    rollouts = [r.clone() for r in collector]
    collector.shutdown()
    return torch.cat(rollouts, -1)


def _collected(obs_norm=None):
    # CartPole without velocities truncated at 25 steps: episodes end by falling and by truncation
    return [_agent_pipeline(make("CartPole-v1", 4, (0, 2), max_episode_steps=25), 7, obs_norm)
            for make in (_serial, make_vector_env)]


def test_vector_env_collects_what_serial_env_collects():
    serial, vector = _collected()
    assert set(serial.keys(True, True)) == set(vector.keys(True, True))
    assert (serial == vector).all()  # observations, actions, flags, returns, stored states
    done, truncated = serial["next", "done"], serial["next", "truncated"]
    assert truncated.any() and (done & ~truncated).any() and serial["is_first"][:, 1:].any()
    # a truncated step keeps its episode's last observation, not the next episode's first
    ends = truncated[:, :-1].squeeze(-1)
    last, first = serial["next", "observation"][:, :-1][ends], serial["observation"][:, 1:][ends]
    assert not torch.isclose(last, first).all(-1).any()
    assert (serial["next", "episode_reward"][truncated] == 25).all()  # the raw return (RewardSum)


@pytest.mark.filterwarnings("ignore:Support of VecNormV2")  # the main job's batched statistics
def test_vector_env_with_vecnorm_agrees_until_the_first_partial_reset():
    # VecNormV2 updates its statistics with every row of a reset, the envs not reset too:
    # SerialEnv gives those rows the observation of their last reset, the vector env their
    # current one, so the statistics (and all after) part at the first partial reset.
    serial, vector = _collected("vecnorm")
    first_reset = int(serial["is_first"][:, 1:].any(0).squeeze(-1).nonzero()[0]) + 1
    assert 0 < first_reset < serial.shape[-1] - 1
    assert (serial[:, :first_reset] == vector[:, :first_reset]).all()
    assert (serial[:, first_reset:]["observation"] != vector[:, first_reset:]["observation"]).any()


def test_vector_env_with_running_observation_norm_agrees_throughout():
    # RunningObservationNorm counts only the envs reset: nothing of the rows not reset enters
    serial, vector = _collected("running")
    assert serial["is_first"][:, 1:].any() and not (serial["is_first"][:, 1:].all(0)).any()  # partial resets
    assert (serial == vector).all()


@pytest.mark.parametrize("env_id", [
    "Pendulum-v1",  # Box action, TimeLimit truncation at 200
    pytest.param("popgym:popgym-BattleshipEasy-v0", marks=needs_popgym),  # MultiDiscrete action
    pytest.param("popgym:popgym-AutoencodeEasy-v0", marks=needs_popgym),  # Tuple observation
])
def test_vector_env_specs_and_random_rollouts_match_serial_env(env_id):
    serial, vector = _serial(env_id, 3), make_vector_env(env_id, 3)
    for spec in ("observation_spec", "full_action_spec", "full_done_spec", "full_reward_spec"):
        assert getattr(serial, spec) == getattr(vector, spec), spec
    rollouts = []
    for env in (serial, vector):
        assert env.set_seed(11) == serial.set_seed(11) if env is vector else True  # next seed alike
        env.set_seed(11)
        torch.manual_seed(0)  # the random actions: the action spec's draws
        rollouts.append(env.rollout(210, break_when_any_done=False))
    assert (rollouts[0] == rollouts[1]).all()
    assert rollouts[0]["next", "done"].any()


def test_vector_env_seeds_like_serial_env_and_refuses_autoreset():
    vector, serial = make_vector_env("CartPole-v1", 3), _serial("CartPole-v1", 3)
    assert vector.set_seed(5) == serial.set_seed(5)
    assert (vector.reset()["observation"] == serial.reset()["observation"]).all()
    assert vector.set_seed(5, static_seed=True) == 5
    same = vector.reset()["observation"]
    assert (same == same[0]).all()  # one seed for every env
    with pytest.raises(ValueError, match=r"autoreset_mode=AutoresetMode.NEXT_STEP.*DISABLED"):
        SyncVectorGymWrapper(gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")]))
    with pytest.raises(TypeError, match=r"SyncVectorEnv, got AsyncVectorEnv"):
        SyncVectorGymWrapper(gym.vector.AsyncVectorEnv([lambda: gym.make("CartPole-v1")]))
    with pytest.raises(ValueError, match=r"num_envs must be >= 1, got 0"):
        make_vector_env("CartPole-v1", 0)
