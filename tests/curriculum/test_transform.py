"""ReverseCurriculum restores and judges (a toy env, SerialEnv, ParallelEnv, Montezuma's Revenge)."""
import functools
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict import TensorDict
from torchrl.collectors import Collector
from torchrl.envs import GymEnv, GymWrapper, ParallelEnv, SerialEnv, TransformedEnv

from torchrl_seqchunk import Demo, ResetManager, ReverseCurriculum, recipes, record_demo

DEMO_PATH = Path(recipes.__file__).parent / "data" / "montezuma_revenge_demo.npz"  # shipped with the package


# --- a deterministic toy env ---------------------------------------------------------------
class ChainEnv(gym.Env):
    """Deterministic: state s <- (3 s + a) mod 1009; obs (s, t); reward 1 for action 2; ends at t = horizon."""

    def __init__(self, horizon: int = 40):
        self.horizon = horizon
        self.observation_space = gym.spaces.Box(0, 10_000, shape=(2,), dtype=np.int64)
        self.action_space = gym.spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.s, self.t = int(self.np_random.integers(1009)), 0
        return np.array([self.s, self.t]), {}

    def step(self, action):
        self.s, self.t = (3 * self.s + int(action)) % 1009, self.t + 1
        return np.array([self.s, self.t]), float(action == 2), self.t >= self.horizon, False, {}


# reward only in the first 10 steps: from points >= 10 the demo total is already reached
DEMO_ACTIONS = [2, 0, 1, 2, 2, 1, 0, 2, 1, 2] + [1, 0] * 15
TOY_SEED = 7


def toy_demo() -> Demo:
    return record_demo(ChainEnv(), DEMO_ACTIONS, seed=TOY_SEED)


def make_worker(demo, **kwargs):
    """Picklable factory: a gymnasium env with the restoring role."""
    return TransformedEnv(GymWrapper(ChainEnv()), ReverseCurriculum(demo, restore="replay", **kwargs))


def reset_at(env, k):
    return env.reset(TensorDict({"starting_point": torch.tensor([k])}, []))


@pytest.mark.parametrize("k", [0, 1, 9, 23, 39])
def test_restore_matches_stepping_the_demo(k):
    demo = toy_demo()
    env = make_worker(demo)
    td = reset_at(env, k)
    reference = ChainEnv()
    obs, _ = reference.reset(seed=TOY_SEED)
    score = 0.0
    for a in DEMO_ACTIONS[:k]:
        obs, r, *_ = reference.step(a)
        score += r
    assert td["observation"].tolist() == obs.tolist()
    assert td["score"].item() == score == demo.returns[k]
    assert td["starting_point"].item() == td["demo_index"].item() == k
    # stepping on from the restore continues the demo exactly
    for a in DEMO_ACTIONS[k : k + 3]:
        td = env.step(td.set("action", env.action_spec.encode(a)))
        obs, r, *_ = reference.step(a)
        score += r
        assert td["next", "observation"].tolist() == obs.tolist()
        assert td["next", "score"].item() == score
        td = td["next"]


def test_user_callable_restore():
    demo = toy_demo()

    def restore(env, k):
        env.reset(seed=TOY_SEED)
        env.unwrapped.s, env.unwrapped.t = 123, k
        return np.array([123, k])

    env = TransformedEnv(GymWrapper(ChainEnv()), ReverseCurriculum(demo, restore=restore))
    td = reset_at(env, 5)
    assert td["observation"].tolist() == [123, 5] and td["score"].item() == demo.returns[5]
    with pytest.raises(TypeError, match="'starting_point' must hold an integer demo step, got dtype torch.float32"):
        env.reset(TensorDict({"starting_point": torch.tensor([2.7])}, []))
    for wrong in (lambda env, k: env.reset(seed=TOY_SEED), lambda env, k: None):  # (obs, info), nothing
        env = TransformedEnv(GymWrapper(ChainEnv()), ReverseCurriculum(demo, restore=wrong))
        with pytest.raises(TypeError, match=r"must return the observation there, got (tuple|NoneType)"):
            reset_at(env, 5)


def test_diverging_demo_is_detected_on_first_use():
    demo = toy_demo()
    rewards = demo.rewards.copy()
    rewards[3] = 5.0
    bad = Demo(demo.actions, rewards, meta=demo.meta)
    env = make_worker(bad)
    reset_at(env, 3)  # the first 3 steps agree
    with pytest.raises(ValueError, match="diverged at step 3"):
        reset_at(env, 4)


def lake(**kwargs):
    return TransformedEnv(
        GymEnv("FrozenLake-v1", **{"is_slippery": False, **kwargs}),
        ReverseCurriculum(record_demo(gym.make("FrozenLake-v1", is_slippery=False), LAKE_WIN), restore="replay"),
    )


LAKE_WIN = [2, 2, 1, 1, 1, 2]  # right, right, down, down, down, right reaches the 4x4 goal


def test_demo_from_another_env_is_refused_at_the_first_restore():
    # on the 8x8 map the first 5 moves (right, right, down x 3) earn 0 as on the 4x4 one: before,
    # no reward disagreed and the restore silently went to another state (row 3, column 2: cell
    # 3 * 8 + 2 = 26 instead of 3 * 4 + 2 = 14)
    assert reset_at(lake(), 5)["observation"].argmax().item() == 14
    with pytest.raises(ValueError, match=r"recorded in env .*'4x4'.* replayed in env .*'8x8'"):
        reset_at(lake(map_name="8x8"), 5)
    # a slippery lake is another env too
    with pytest.raises(ValueError, match=r"'is_slippery': False.*'is_slippery': True"):
        reset_at(lake(is_slippery=True), 0)


def test_demo_action_outside_the_action_space_is_a_value_error():
    # FrozenLake has 4 actions; action 7 at step 3 raised a KeyError inside the env before
    demo = record_demo(gym.make("FrozenLake-v1", is_slippery=False), LAKE_WIN)
    bad = Demo([2, 2, 1, 7, 1, 2], demo.rewards, meta=demo.meta)
    env = TransformedEnv(GymEnv("FrozenLake-v1", is_slippery=False), ReverseCurriculum(bad, restore="replay"))
    with pytest.raises(ValueError, match=r"demo action 7 at step 3 is outside the env's action space Discrete\(4\)"):
        reset_at(env, 5)


def test_demo_without_env_spec_warns_and_restores():
    demo = record_demo(gym.make("FrozenLake-v1", is_slippery=False), LAKE_WIN)
    old = Demo(demo.actions, demo.rewards, meta={"reset_seed": 0})
    env = TransformedEnv(GymEnv("FrozenLake-v1", is_slippery=False), ReverseCurriculum(old, restore="replay"))
    with pytest.warns(UserWarning, match="no 'env_spec'"):
        td = reset_at(env, 5)
    assert td["observation"].argmax().item() == 14


def test_replay_ended_by_the_env_names_the_end():
    # a time limit shorter than the replay ends the episode although every reward agrees
    demo = toy_demo()
    env = TransformedEnv(
        GymWrapper(gym.wrappers.TimeLimit(ChainEnv(), max_episode_steps=5)),
        ReverseCurriculum(demo, restore="replay"),
    )
    with pytest.raises(ValueError, match="episode ended .*truncated.* at step 4"):
        reset_at(env, 10)


def test_lag_and_success_end_the_episode():
    demo = toy_demo()
    env = make_worker(demo, max_lag=2)
    # from 3 the demo earns at steps 3 and 4; playing 0 lags: returns[index - 2] > score at index 6
    td = reset_at(env, 3)
    dones = []
    for _ in range(3):
        td = env.step(td.set("action", env.action_spec.encode(0)))
        dones.append(td["next", "truncated"].item())
        td = td["next"]
    assert dones == [False, False, True]
    # playing the demo's actions reaches the total at step 9 -> truncated (success)
    td = reset_at(env, 7)
    for a in DEMO_ACTIONS[7:10]:
        td = env.step(td.set("action", env.action_spec.encode(a)))["next"]
    assert td["truncated"].item() and td["score"].item() == demo.total


def test_rules_that_would_cut_or_pass_every_episode_are_refused():
    # a cost per step: the demo's score falls, so an episode on its pace trails the score of
    # max_lag steps before at its first step
    with pytest.raises(ValueError, match="max_lag=2 compares the score .*negative rewards"):
        ReverseCurriculum(Demo([0, 1, 1], [-1.0, -1.0, -1.0]), restore="replay", seed=0, max_lag=2)
    with pytest.raises(ValueError, match="max_lag=2"):  # returns 0, 1, 1, 0.5: 1 > 0.5 two steps on
        ReverseCurriculum(Demo([0, 1, 1], [1.0, 0.0, -0.5]), restore="replay", seed=0, max_lag=2)
    # max_lag 0 compares the score with the demo's at the same step; a score that never falls
    # over the lag (returns 0, 1, 0.5, 1.5) is fine
    ReverseCurriculum(Demo([0, 1, 1], [-1.0, -1.0, -1.0]), restore="replay", seed=0, max_lag=0)
    ReverseCurriculum(Demo([0, 1, 1], [1.0, -0.5, 1.0]), restore="replay", seed=0, max_lag=2)
    # a demo that scores nothing: success="score" would pass every episode at its first step
    with pytest.raises(ValueError, match="success='score' with a demo that scores nothing"):
        ReverseCurriculum(Demo([0, 1], [0.0, 0.0]), restore="replay", seed=0)
    ReverseCurriculum(Demo([0, 1], [0.0, 0.0]), restore="replay", seed=0, success="goal")
    ReverseCurriculum(Demo([0, 1], [0.0, 0.0]), restore="replay", seed=0, end_on_success=False)  # the rule is not read
    ReverseCurriculum(Demo([0, 1, 1], [-1.0, -1.0, -1.0]), restore="replay", seed=0, success="goal")


class CorridorEnv(gym.Env):
    """Position p in 0..5: action 0 stays, 1 moves right, 2 falls in a pit (ends); every step costs 1; p = 5 ends."""

    def __init__(self):
        self.observation_space = gym.spaces.Box(0, 5, shape=(1,), dtype=np.int64)
        self.action_space = gym.spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.p = 0
        return np.array([self.p]), {}

    def step(self, action):
        self.p += int(action == 1)
        return np.array([self.p]), -1.0, action == 2 or self.p == 5, False, {}


def test_negative_rewards_success_needs_the_demos_final_step():
    # demo: right x 5, rewards -1 each, total -5, final from step F = 5. From k = 3 (score -3):
    demo = record_demo(CorridorEnv(), [1] * 5)
    manager = ResetManager(5, 1, window=1, move_threshold=1.0, update_every=1, maximum=3)
    env = TransformedEnv(GymWrapper(CorridorEnv()), ReverseCurriculum(demo, manager, restore="replay"))

    def play(actions):
        manager.maximum = 3  # a failure nudges it forward
        td = env.reset()
        assert td["starting_point"].item() == 3 and td["score"].item() == -3.0
        out = []
        for a in actions:
            td = env.step(td.set("action", env.action_spec.encode(a)))
            out.append((td["next", "score"].item(), td["next", "done"].item(), td["next", "success"].item()))
            td = td["next"]
        return out

    # the pit ends the episode at demo step 4 with score -4 >= -5: before, a success
    assert play([2]) == [(-4.0, True, False)]
    assert manager.rates[3] == 0.0
    # waiting one step: score -4 >= -5 at step 4 ended it as a success before; now it goes on,
    # and at step 5 the score -5 equals the demo's total
    assert play([0, 1]) == [(-4.0, False, False), (-5.0, True, True)]
    assert manager.rates[3] == 1.0
    # the demo's own way: the goal at step 5 with score -5
    assert play([1, 1]) == [(-4.0, False, False), (-5.0, True, True)]


def test_single_env_assigns_records_and_moves():
    demo = toy_demo()
    manager = ResetManager(len(demo), 1, window=1, move_threshold=1.0, update_every=1)
    env = TransformedEnv(GymWrapper(ChainEnv()), ReverseCurriculum(demo, manager, restore="replay"))
    starts = []
    for _ in range(4):
        td = env.reset()
        starts.append(td["starting_point"].item())
        td = env.step(td.set("action", env.action_spec.encode(1)))
        assert td["next", "done"].item() and td["next", "success"].item()  # total already reached
    # each success moves the maximum to the first index with cumsum >= 1, i.e. the point itself
    assert starts == [39, 39, 39, 39]
    assert manager.maximum == 39 and manager.rates[39] == 1.0
    manager.record([20], [True])
    manager.update()
    assert env.reset()["starting_point"].item() == 20


def test_single_env_rollout_auto_resets_get_fresh_points():
    demo = toy_demo()
    manager = ResetManager(len(demo), 1, window=1, move_threshold=1.0, update_every=1)
    env = TransformedEnv(GymWrapper(ChainEnv()), ReverseCurriculum(demo, manager, restore="replay"))
    manager.maximum = 30
    manager.record([12], [True])  # pending until the first episode ends
    data = env.rollout(4, break_when_any_done=False)
    # from >= 10 the total is already reached: every episode is one successful step; the first
    # one triggers an update that moves the maximum to 12, and the auto-resets pick it up
    assert data["starting_point"].squeeze(-1).tolist() == [30, 12, 12, 12]
    assert data["observation"][:, 1].tolist() == [30, 12, 12, 12]
    assert data["next", "success"].all() and manager.maximum == 12


def test_manager_size_must_match_env():
    demo = toy_demo()
    env = TransformedEnv(
        GymWrapper(ChainEnv()), ReverseCurriculum(demo, ResetManager(len(demo), 2), restore="replay")
    )
    with pytest.raises(ValueError, match=r"ResetManager\(len\(demo\), 1\)"):
        env.reset()


def test_assigning_role_needs_restoring_workers():
    demo = toy_demo()
    env = TransformedEnv(GymWrapper(ChainEnv()), ReverseCurriculum(demo, ResetManager(len(demo), 1)))
    with pytest.raises(ValueError, match="inside every worker"):
        env.reset()


def test_restoring_role_rejects_batched_env():
    demo = toy_demo()
    env = TransformedEnv(
        SerialEnv(2, functools.partial(GymWrapper, ChainEnv())),
        ReverseCurriculum(demo, ResetManager(len(demo), 2), restore="replay"),
    )
    with pytest.raises(TypeError, match="unbatched"):
        env.reset()



def test_the_lag_rule_allows_float32_rewards_on_the_demos_pace():
    """A demo reward that float32 rounds down (0.7): the demo's own actions are not behind it."""
    class Points(ChainEnv):
        def step(self, action):
            obs, _, terminated, truncated, info = super().step(action)
            return obs, 0.7 if self.t == 2 else 0.0, terminated, truncated, info
    demo = record_demo(Points(horizon=6), [1] * 6, seed=3)
    env = TransformedEnv(GymWrapper(Points(horizon=6)), ReverseCurriculum(demo, restore="replay", max_lag=1, end_on_success=False))
    td = reset_at(env, 0)
    for action in demo.actions[:5]:
        td = env.step(td.set("action", env.action_spec.encode(int(action))))["next"]
        assert not td["truncated"].item(), td["demo_index"].item()


def test_a_nan_reward_is_refused_where_it_would_pass_every_rule():
    """A NaN score is never behind the demo nor as good: the episode ran on, judged by nothing."""
    class Broken(ChainEnv):
        nan_at = None  # the demo is recorded before the env breaks

        def step(self, action):
            obs, reward, terminated, truncated, info = super().step(action)
            return obs, float("nan") if self.t == self.nan_at else reward, terminated, truncated, info
    demo = record_demo(Broken(), DEMO_ACTIONS, seed=TOY_SEED)
    Broken.nan_at = 3
    env = TransformedEnv(GymWrapper(Broken()), ReverseCurriculum(demo, restore="replay", max_lag=0))
    td = reset_at(env, 1)
    td = env.step(td.set("action", env.action_spec.encode(0)))["next"]  # the env's step to t = 2
    with pytest.raises(ValueError, match=r"NaN reward \('reward'\) at the step from demo index \[2\]"):
        env.step(td.set("action", env.action_spec.encode(0)))  # to t = 3: the NaN


def test_seedless_replays_and_options_of_the_other_role_are_refused():
    with pytest.raises(ValueError, match="holds none .*Pass seed="):
        ReverseCurriculum(record_demo(ChainEnv(), DEMO_ACTIONS, seed=None), restore="replay")
    demo = toy_demo()
    manager = ResetManager(len(demo), 2)
    for option in (dict(max_lag=2), dict(env_reset_at_zero=True), dict(end_on_success=False),
                   dict(frames_per_step=4), dict(seed=1), dict(snapshot_every=10)):
        with pytest.raises(ValueError, match=f"{next(iter(option))} act where episodes are restored"):
            ReverseCurriculum(demo, manager, **option)
    with pytest.raises(TypeError, match="manager must be a ResetManager"):
        ReverseCurriculum(demo, 5, restore="replay")
    with pytest.raises(TypeError, match="seed must be an int"):
        ReverseCurriculum(demo, restore="replay", seed="0")


def test_envs_left_out_of_a_partial_step_are_not_recorded_again():
    """rollout(break_when_all_done=True) steps only the envs still running: one that ended
    earlier still shows done, and must not be recorded once more at every later step."""
    demo = toy_demo()
    manager = ResetManager(len(demo), 2, window=10, update_every=100, maximum=38)
    worker = functools.partial(make_worker, demo, end_on_success=False)  # episodes end at the horizon
    env = TransformedEnv(SerialEnv(2, worker), ReverseCurriculum(demo, manager))
    try:
        env.rollout(20, break_when_any_done=False, break_when_all_done=True)  # from 38 and 33: 2 and 7 steps
    finally:
        env.close()
    assert manager.state_dict()["pending_points"].tolist() == [38, 33]  # each episode once

@pytest.mark.parametrize("batched", [SerialEnv, ParallelEnv])
def test_batched_envs_restore_in_workers_and_collector_resets(batched):
    demo = toy_demo()
    manager = ResetManager(len(demo), 2, window=4, move_threshold=0.25, update_every=2, nudge=1)
    env = TransformedEnv(
        batched(2, functools.partial(make_worker, demo)), ReverseCurriculum(demo, manager)
    )
    try:
        td = env.reset()
        assert td["starting_point"].squeeze(-1).tolist() == [39, 37]
        # the worker restored there: the toy obs carries the step index t
        assert td["observation"][:, 1].tolist() == [39, 37]
        # after a step, a partial reset gives only env 1 a fresh point
        td = env.rand_step(td)
        assert td["next", "starting_point"].squeeze(-1).tolist() == [39, 37]
        manager.maximum = 30
        td = env.reset(td["next"].set("_reset", torch.tensor([[False], [True]])))
        # (rows that did not reset hold placeholders; callers keep their old data there)
        assert td["starting_point"][1].item() == td["observation"][1, 1].item() == 28

        manager.maximum = len(demo) - 1
        collector = Collector(env, None, frames_per_batch=40, total_frames=40)
        data = next(iter(collector))
        collector.shutdown()
    finally:
        if not env.is_closed:
            env.close()
    # every step's obs index equals starting point + steps since the restore
    assert torch.equal(data["observation"][..., 1:], data["demo_index"])
    assert torch.equal(data["next", "observation"][..., 1:], data["next", "demo_index"])
    points = data["starting_point"].unique()
    assert len(points) > 2  # auto-resets got fresh points as the maximum moved
    assert manager.maximum < len(demo) - 1
    ended = data["next", "done"].squeeze(-1)
    success = data["next", "score"][ended] >= demo.total
    assert torch.equal(data["next", "success"][ended], success)


# --- Montezuma's Revenge ---------------------------------------------------------------------
def montezuma(frameskip=1, **kwargs):
    import ale_py

    gym.register_envs(ale_py)
    return GymEnv(
        kwargs.pop("game", "ALE/MontezumaRevenge-v5"),
        frameskip=frameskip,
        repeat_action_probability=kwargs.pop("repeat_action_probability", 0.0),
        obs_type="grayscale",
        **kwargs,
    )


def test_sticky_actions_are_rejected():
    demo = Demo.load(DEMO_PATH)
    env = TransformedEnv(montezuma(repeat_action_probability=0.25), ReverseCurriculum(demo, restore="ale"))
    with pytest.raises(ValueError, match="sticky"):
        reset_at(env, 10)


def test_montezuma_demo_is_checked_against_the_game():
    demo = Demo.load(DEMO_PATH)
    with pytest.raises(ValueError, match=r"MontezumaRevenge-v5.*replayed in env .*Pitfall-v5"):
        reset_at(TransformedEnv(montezuma(game="ALE/Pitfall-v5"), ReverseCurriculum(demo, restore="ale")), 10)
    # the example's workers skip 4 frames per step: restore="ale" replays single frames anyway
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        td = reset_at(TransformedEnv(montezuma(frameskip=4), ReverseCurriculum(demo, restore="ale")), 10)
    assert td["score"].item() == 0.0


def test_montezuma_restore_short_prefix():
    demo = Demo.load(DEMO_PATH)
    k = 2000
    env = TransformedEnv(montezuma(), ReverseCurriculum(demo, restore="ale", snapshot_every=500))
    td = reset_at(env, k)
    rewards = np.load(DEMO_PATH)["rewards"]
    assert td["score"].item() == rewards[:k].sum() == 600.0
    # same screen as playing the prefix through gymnasium
    reference = gym.make("ALE/MontezumaRevenge-v5", frameskip=1, repeat_action_probability=0.0, obs_type="grayscale")
    obs, _ = reference.reset(seed=0)
    for a in demo.actions[:k]:
        obs, *_ = reference.step(int(a))
    assert np.array_equal(td["observation"].numpy(), obs)
    # restoring again starts from this process's cache (the state one frame before 2000, since a
    # restored state shows its screen only after the next frame) and gives the same observation
    restore = env.transform.restore
    assert sorted(restore.cache) == [0, 500, 1000, 1500, 2000] and restore.last[0] == k - 1
    again = reset_at(env, k)
    assert np.array_equal(again["observation"].numpy(), obs) and again["score"].item() == 600.0
    # a point between cached states replays from the nearest one below it
    previous = reset_at(env, 1001)
    assert previous["score"].item() == rewards[:1001].sum() and restore.last[0] == 1000


@pytest.mark.slow
@pytest.mark.parametrize("k", [10_000, 50_000])
def test_montezuma_replays_to_the_end_as_success(k):
    demo = Demo.load(DEMO_PATH)
    rewards = np.load(DEMO_PATH)["rewards"]
    manager = ResetManager(len(demo), 1)
    manager.maximum = k
    env = TransformedEnv(montezuma(), ReverseCurriculum(demo, manager, restore="ale", max_lag=50))
    td = env.reset()
    assert td["starting_point"].item() == k
    assert td["score"].item() == rewards[:k].sum()
    for a in demo.actions[k:]:
        td = env.step(td.set("action", env.action_spec.encode(int(a))))
        if td["next", "done"].item():
            break
        td = td["next"]
    assert td["next", "score"].item() == 71_500.0
    assert td["next", "success"].item()
    assert manager.last_success_rate == 1.0 and manager.rates[k] == 1.0  # recorded and folded in

    if k == 50_000:  # random actions from 50,000 do not make it
        generator = np.random.default_rng(0)
        td = env.reset()
        for _ in range(len(demo)):
            td = env.step(td.set("action", env.action_spec.encode(int(generator.integers(18)))))
            if td["next", "done"].item():
                break
            td = td["next"]
        assert td["next", "done"].item() and not td["next", "success"].item()
        assert td["next", "score"].item() < 71_500.0


def test_errors_name_the_value_and_the_fix():
    demo = toy_demo()
    with pytest.raises(ValueError, match=r"manager.demo_length=10 .* ResetManager\(len\(demo\)"):
        ReverseCurriculum(demo, ResetManager(10, 1))
    env = make_worker(demo)
    with pytest.raises(ValueError, match=r"'starting_point'=40 is outside the demo \[0, 39\]; .*ResetManager"):
        reset_at(env, 40)


def test_ale_restore_refuses_a_skipping_demo_and_observation_wrappers():
    """restore="ale" replays single frames from the emulator: a demo recorded in a v5 env (its
    registered frameskip=4) is refused, and so are wrappers whose observation it would skip."""
    import ale_py
    from gymnasium.wrappers import TransformObservation

    gym.register_envs(ale_py)
    actions = [0, 1, 2, 3] * 3
    skipping = record_demo(gym.make("ALE/Pong-v5", repeat_action_probability=0.0), actions, seed=0)
    with pytest.raises(ValueError, match="recorded with frameskip=4"):
        ReverseCurriculum(skipping, restore="ale")

    def inverted():
        env = gym.make("ALE/Pong-v5", repeat_action_probability=0.0, frameskip=1, obs_type="ram")
        return TransformObservation(env, lambda obs: 255 - obs, env.observation_space)
    demo = record_demo(inverted(), actions, seed=3)
    with pytest.raises(TypeError, match="past the env's TransformObservation"):
        reset_at(TransformedEnv(GymWrapper(inverted()), ReverseCurriculum(demo, restore="ale", end_on_success=False)), 5)
    replayed = reset_at(TransformedEnv(GymWrapper(inverted()), ReverseCurriculum(demo, restore="replay",
                                                                                 end_on_success=False)), 5)
    reference = inverted()
    obs, _ = reference.reset(seed=3)
    for action in actions[:5]:
        obs, *_ = reference.step(action)
    assert np.array_equal(replayed["observation"].numpy(), obs)  # replay goes through the wrapper
