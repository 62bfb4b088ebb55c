"""VectorEnvCollector against TorchRL's Collector on the same env, policy and seeds: the same
rollouts, key for key and value for value; and what it refuses."""
import gymnasium as gym
import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import (NormalParamExtractor, ProbabilisticTensorDictModule, TensorDictModule, TensorDictModuleBase,
                           TensorDictSequential)
from torch import nn
from torchrl.collectors import Collector
from torchrl.data import Bounded, Unbounded
from torchrl.envs import Compose, InitTracker, RewardSum, SerialEnv, StepCounter, TensorDictPrimer, TransformedEnv
from torchrl.envs.libs.gym import default_info_dict_reader
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import (EGreedyModule, GRUModule, OneHotCategorical, OrnsteinUhlenbeckProcessModule,
                             ProbabilisticActor, QValueModule, SafeModule, TanhNormal)

from torchrl_seqchunk import ResetRNN, ReturnScaledReward, RunningObservationNorm, VectorEnvCollector, tensor_policy
from torchrl_seqchunk.envs import SyncVectorGymWrapper, make_masked_env, make_vector_env
from torchrl_seqchunk.recipes.common.agent import make_agent  # the main job's agent
from torchrl_seqchunk.recipes.common.config import Config
from torchrl_seqchunk.recipes.common.envs import make_acting_env, make_env


def rollouts(kind, cfg, seed: int, batches: int) -> list:
    torch.manual_seed(seed)
    actor, critic, rnns = make_agent(cfg, make_env(cfg), carry=False)
    env = make_acting_env(cfg, rnns, seed)
    per_batch = cfg.num_envs * cfg.rollout_len
    collector = kind(env, TensorDictSequential(actor, critic), frames_per_batch=per_batch,
                     total_frames=batches * per_batch)
    out = list(collector)  # seeded once, before the collector is built (it may draw from torch's generator)
    collector.shutdown()
    return out


@pytest.mark.parametrize("options", [
    dict(env="CartPole-v1", max_episode_steps=19, cell="gru"),  # truncations and terminations inside rollouts
    dict(env="Pendulum-v1", keep="all", max_episode_steps=21, cell="lstm"),  # TanhNormal actions, (h, c) state
])
def test_rollouts_are_the_collectors(options):
    cfg = Config(**options, num_envs=3, rollout_len=16, progress=False)
    theirs, ours = rollouts(Collector, cfg, 5, 3), rollouts(VectorEnvCollector, cfg, 5, 3)
    assert set(ours[0].keys(True, True)) == set(theirs[0].keys(True, True))
    for mine, want in zip(ours, theirs):
        assert mine.batch_size == want.batch_size == torch.Size([3, 16])
        for key in want.keys(True, True):
            assert torch.equal(mine[key], want[key]), key
    flags = torch.cat([r["next", "truncated"] for r in ours])
    assert flags.any() and torch.cat([r["is_init"] for r in ours])[:, 1:].any()
    if options["env"] == "CartPole-v1":
        assert torch.cat([r["next", "terminated"] for r in ours]).any()
        # trajectory ids as the Collector numbers them: 0..N-1 first, then one new id per episode start
        ids = ours[0]["collector", "traj_ids"]
        assert ids[:, 0].tolist() == [0, 1, 2]


def vector_env(*transforms, num_envs=2):
    env = TransformedEnv(make_vector_env("CartPole-v1", num_envs), Compose(*transforms))
    env.set_seed(0)
    return env


def first_action(obs):  # always push right: the pole falls within a few dozen steps
    return nn.functional.one_hot(torch.ones(obs.shape[0], dtype=torch.long), 2)


POLICY = TensorDictModule(first_action, ["observation"], ["action"])


def test_episode_returns_and_flags_by_hand():
    # a fixed policy on CartPole: the raw return counts steps; each env's first episode ends
    # where its "done" first shows, and the next step is an episode start
    env = vector_env(InitTracker(), RewardSum(), RunningObservationNorm(), ReturnScaledReward(gamma=0.9))
    rollout = next(iter(VectorEnvCollector(env, POLICY, frames_per_batch=2 * 60, total_frames=120)))
    done = rollout["next", "done"].squeeze(-1)
    for row in range(2):
        end = int(done[row].nonzero()[0])
        assert rollout["next", "episode_reward"][row, : end + 1].squeeze(-1).tolist() == list(range(1, end + 2))
        assert bool(rollout["is_init"][row, end + 1]) and not rollout["is_init"][row, 1: end + 1].any()
        assert rollout["episode_reward"][row, end + 1].item() == 0.0
        assert rollout["collector", "traj_ids"][row, end + 1].item() >= 2  # a new trajectory
    assert not rollout["done"].any()  # root flags follow a reset or a step that went on
    assert rollout["next", "reward"].abs().max() <= 10.0  # scaled and clipped, not the raw 1


def test_refusals():
    with pytest.raises(TypeError, match="SyncVectorGymWrapper"):
        VectorEnvCollector(TransformedEnv(SerialEnv(2, lambda: make_masked_env("CartPole-v1")), InitTracker()),
                           POLICY, frames_per_batch=4)
    with pytest.raises(TypeError, match="StepCounter"):
        VectorEnvCollector(vector_env(InitTracker(), StepCounter()), POLICY, frames_per_batch=4)
    with pytest.raises(ValueError, match="before RewardSum"):
        VectorEnvCollector(vector_env(InitTracker(), ReturnScaledReward(), RewardSum()), POLICY, frames_per_batch=4)
    with pytest.raises(ValueError, match="no InitTracker"):
        VectorEnvCollector(vector_env(RewardSum()), POLICY, frames_per_batch=4)
    with pytest.raises(ValueError, match="more than once"):  # the first copy would be skipped
        VectorEnvCollector(vector_env(InitTracker(), RunningObservationNorm(), RunningObservationNorm()), POLICY,
                           frames_per_batch=4)
    with pytest.raises(ValueError, match="default keys"):
        VectorEnvCollector(vector_env(InitTracker(init_key="is_first")), POLICY, frames_per_batch=4)
    with pytest.raises(ValueError, match="multiple of the env batch"):
        VectorEnvCollector(vector_env(InitTracker()), POLICY, frames_per_batch=5)
    with pytest.raises(ValueError, match="total_frames"):
        VectorEnvCollector(vector_env(InitTracker()), POLICY, frames_per_batch=4, total_frames=0)
    with pytest.raises(TypeError, match="not a TensorDict module"):
        tensor_policy(nn.Linear(2, 2))



class DiscountedSum(RewardSum):  # a subclass whose step the plain-tensor rule would skip
    def _step(self, tensordict, next_tensordict):
        return next_tensordict.set("episode_reward", 0.5 * tensordict["episode_reward"] + next_tensordict["reward"])


class OwnTracker(InitTracker):
    pass


def test_subclasses_of_the_applied_transforms_are_refused_by_name():
    for transforms in ((InitTracker(), DiscountedSum()), (OwnTracker(),)):
        with pytest.raises(TypeError, match=rf"{type(transforms[-1]).__name__} \(a subclass, whose changes"):
            VectorEnvCollector(vector_env(*transforms), POLICY, frames_per_batch=4)


def test_changes_after_the_collector_is_built_are_refused():
    """A hook on the policy or a transform appended after building: the Collector would run them,
    this collector runs what it read when built, so it refuses to go on."""
    for change in ("hook", "transform"):
        policy = TensorDictModule(nn.Linear(4, 2), ["observation"], ["logits"])
        full = TensorDictSequential(policy, TensorDictModule(sample_action, ["logits"], ["action"]))
        env = vector_env(InitTracker(), RewardSum())
        collector = VectorEnvCollector(env, full, frames_per_batch=4, total_frames=8)
        rollouts = iter(collector)
        next(rollouts)
        if change == "hook":
            policy.register_forward_hook(lambda module, args, out: out)
        else:
            env.append_transform(StepCounter())
        with pytest.raises(ValueError, match="changed since the VectorEnvCollector was built"):
            next(rollouts)


def test_named_modules_private_nested_keys_device_and_weights_as_the_collector():
    from collections import OrderedDict
    named = lambda: TensorDictSequential(OrderedDict(  # noqa: E731
        net=TensorDictModule(nn.Linear(2, 2), ["observation"], ["logits"]),
        aux=TensorDictModule(lambda logits: 2 * logits, ["logits"], [("_aux", "x")]),  # private: left out
        act=TensorDictModule(sample_action, ["logits"], ["action"])))
    ours = same_rollouts(short_cartpole(lambda: [InitTracker()]), named)
    assert "_aux" not in ours[0].keys()
    env = vector_env(InitTracker())
    with pytest.raises(ValueError, match=r"parameters are on \['cpu'\] but device='meta'"):
        VectorEnvCollector(env, TensorDictSequential(TensorDictModule(nn.Linear(4, 2), ["observation"], ["logits"]),
                                                     TensorDictModule(sample_action, ["logits"], ["action"])),
                           frames_per_batch=4, device="meta")
    VectorEnvCollector(env, POLICY, frames_per_batch=4, device="cpu:0")  # the same device, written otherwise
    # weights given are copied into the policy in place, as the Collector loads them
    mine, theirs = (TensorDictModule(nn.Linear(4, 2), ["observation"], ["action"]) for _ in range(2))
    collector = VectorEnvCollector(env, mine, frames_per_batch=4)
    weight = mine.module.weight
    collector.update_policy_weights_()
    collector.update_policy_weights_(TensorDict.from_module(mine))  # its own weights: unchanged
    collector.update_policy_weights_(policy_or_weights=theirs)
    assert mine.module.weight is weight and torch.equal(weight, theirs.module.weight)
    with pytest.raises(TypeError, match="policy_or_weights must be a module"):
        collector.update_policy_weights_([1.0])


def test_lazy_modules_collect_as_under_the_collector():
    """A LazyLinear (TorchRL's MLP without in_features) drops its own pre-hook when it first runs:
    not a change of the policy."""
    from torchrl.modules import MLP

    def policy():
        return TensorDictSequential(TensorDictModule(MLP(out_features=2, num_cells=[8]), ["observation"], ["logits"]),
                                    TensorDictModule(sample_action, ["logits"], ["action"]))
    same_rollouts(short_cartpole(lambda: [InitTracker(), RewardSum()]), policy, batches=3)

def wrapped(env_id: str, **kwargs) -> TransformedEnv:
    vector = gym.vector.SyncVectorEnv([lambda: gym.make(env_id)] * 2, autoreset_mode=gym.vector.AutoresetMode.DISABLED)
    return TransformedEnv(SyncVectorGymWrapper(vector, **kwargs), InitTracker())


def test_wrappers_whose_torchrl_step_does_more_are_refused():
    # each would step or read otherwise than TorchRL's step of the same wrapper (the Collector's)
    with pytest.raises(ValueError, match="frame_skip=3"):  # three gymnasium steps per action there, one here
        VectorEnvCollector(wrapped("CartPole-v1", frame_skip=3), POLICY, frames_per_batch=4)
    env = wrapped("CartPole-v1")
    env.base_env.set_info_dict_reader(default_info_dict_reader(["x"], spec={"x": Unbounded(shape=(2,))}))
    with pytest.raises(ValueError, match="info dict reader"):  # keys the Collector's rollouts would hold
        VectorEnvCollector(env, POLICY, frames_per_batch=4)
    with pytest.raises(TypeError, match="OneHot"):  # TorchRL one-hot encodes a Discrete observation
        VectorEnvCollector(wrapped("FrozenLake-v1"), POLICY, frames_per_batch=4)


def test_reset_rnn_step_on_tensors_is_step_mode():
    rnn = ResetRNN(nn.LSTM(3, 5, batch_first=True), in_key="x", default_recurrent_mode=False)
    x, reset = torch.randn(4, 3), torch.tensor([True, False, True, False])
    state = (torch.randn(4, 1, 5), torch.randn(4, 1, 5))
    y, used, new = rnn.step(x, state, reset)
    from tensordict import TensorDict
    td = rnn(TensorDict({"x": x, "is_init": reset.unsqueeze(-1), ("recurrent_state", "h"): state[0],
                         ("recurrent_state", "c"): state[1]}, [4]))
    assert torch.equal(y, td["features"]) and torch.equal(new[0], td["next", "recurrent_state", "h"])
    assert used[0][0].abs().sum() == 0 and torch.equal(used[1][1], state[1][1])  # reset row 0, kept row 1
    with pytest.raises(ValueError, match="absent"):
        rnn.step(x, None, reset)


@pytest.mark.parametrize("distribution_class", [OneHotCategorical, torch.distributions.Categorical])
@pytest.mark.parametrize("shape", [(5, 3), (2, 4, 6)])
def test_categorical_draws_are_the_distributions(distribution_class, shape, monkeypatch):
    # the plain-tensor draw of a categorical actor builds no distribution, and draws what it draws
    actor = ProbabilisticActor(TensorDictModule(lambda x: 3 * x, ["observation"], ["logits"]), in_keys=["logits"],
                               distribution_class=distribution_class, return_log_prob=True)
    logits = torch.randn(*shape)
    step = tensor_policy(actor)
    torch.manual_seed(7)
    with set_exploration_type(ExplorationType.RANDOM):
        want = actor(TensorDict(observation=logits, batch_size=shape[:-1]))
    with monkeypatch.context() as patch:
        patch.setattr(ProbabilisticTensorDictModule, "get_dist", lambda *a: pytest.fail("built a distribution"))
        torch.manual_seed(7)
        mine = step({"observation": logits})
    for key in want.keys(True, True):
        assert torch.equal(mine[key], want[key]) and mine[key].dtype == want[key].dtype, key
    assert want["action"].shape == ((*shape[:-1], shape[-1]) if distribution_class is OneHotCategorical else shape[:-1])
    # with argument validation on (not TorchRL's default), the distribution is built and validates
    monkeypatch.setattr(torch.distributions.Distribution, "_validate_args", True)
    with pytest.raises(ValueError, match="logits"):
        step({"observation": torch.full(shape, float("nan"))})


def sample_action(logits):
    return nn.functional.one_hot(torch.distributions.Categorical(logits=logits).sample(), 2)


def same_rollouts(make_env, make_policy, frames_per_batch=12, batches=2):
    out = []
    for kind in (Collector, VectorEnvCollector):
        torch.manual_seed(0)
        policy, env = make_policy(), make_env()
        collector = kind(env, policy, frames_per_batch=frames_per_batch, total_frames=frames_per_batch * batches)
        out.append([r.clone() for r in collector])  # no reseed: a Collector built calls some policies once
    theirs, ours = out
    assert set(ours[0].keys(True, True)) == set(theirs[0].keys(True, True))
    for mine, want in zip(ours, theirs):
        for key in want.keys(True, True):
            assert torch.equal(mine[key], want[key]), key
    return ours


def short_cartpole(transforms):
    def make():
        env = TransformedEnv(make_vector_env("CartPole-v1", 3, (0, 2), max_episode_steps=3), Compose(*transforms()))
        env.set_seed(0)
        return env
    return make


def test_policies_of_other_shapes_act_as_under_the_collector():
    # keyword in_keys (x = "b", y = "a"), private "_" keys (the collector leaves them out), a
    # module reading the root flags, one writing an env-owned ("next", ...) key (the env's wins)
    def make_policy():
        return TensorDictSequential(
            TensorDictModule(nn.Linear(2, 2), ["observation"], ["a"]),
            TensorDictModule(nn.Linear(2, 2), ["observation"], ["_b"]),
            TensorDictModule(lambda x, y: x - y, in_keys={"y": "a", "x": "_b"}, out_keys=["logits"]),
            TensorDictModule(lambda logits, truncated: (sample_action(logits - truncated.float()), logits + 1),
                             ["logits", "truncated"], ["action", ("next", "observation")]))
    ours = same_rollouts(short_cartpole(lambda: [InitTracker(), RewardSum()]), make_policy)
    assert "_b" not in ours[0].keys()


def test_a_tensordict_state_and_a_single_transform():
    from tensordict import TensorDict

    class RSSM(nn.Module):  # ResetRNN's docstring cell: deterministic and latent parts
        def __init__(self):
            super().__init__()
            self.gru, self.latent = nn.GRUCell(8 + 2, 8), nn.Linear(8, 2)

        def forward(self, x_t, h):
            deter = self.gru(torch.cat([x_t, h["stoch"]], -1), h["deter"])
            return TensorDict(deter=deter, stoch=torch.tanh(self.latent(deter)), batch_size=h.batch_size)

    rnn = ResetRNN(RSSM(), state_shape={"deter": (8,), "stoch": (2,)}, default_recurrent_mode=False)
    policy = TensorDictSequential(TensorDictModule(nn.Linear(2, 8), ["observation"], ["embed"]), rnn,
                                  TensorDictModule(sample_action, [("features", "stoch")], ["action"]))
    same_rollouts(short_cartpole(lambda: [InitTracker(), rnn.make_tensordict_primer()]), lambda: policy)
    env = TransformedEnv(make_vector_env("CartPole-v1", 2), InitTracker())  # not a Compose
    assert next(iter(VectorEnvCollector(env, POLICY, frames_per_batch=4, device=None))).shape == (2, 2)


def test_float64_observations_keep_their_dtype():
    import gymnasium as gym
    import numpy as np

    from torchrl_seqchunk.envs import SyncVectorGymWrapper

    def one():
        env = gym.wrappers.TimeLimit(gym.make("CartPole-v1").unwrapped, 3)
        return gym.wrappers.TransformObservation(env, lambda o: o.astype(np.float64) + 1e-9,
                                                 gym.spaces.Box(-np.inf, np.inf, (4,), np.float64))

    def make_env():
        vector = gym.vector.SyncVectorEnv([one] * 3, autoreset_mode=gym.vector.AutoresetMode.DISABLED)
        env = TransformedEnv(SyncVectorGymWrapper(vector), Compose(InitTracker(), RewardSum()))
        env.set_seed(0)
        return env

    policy = TensorDictSequential(TensorDictModule(nn.Linear(4, 2).double(), ["observation"], ["logits"]),
                                  TensorDictModule(sample_action, ["logits"], ["action"]))
    ours = same_rollouts(make_env, lambda: policy)
    assert ours[0]["next", "observation"].dtype == torch.float64


def q_policy():
    """A recurrent Q-network, TorchRL's QValueModule and EGreedyModule (per-step random draws)."""
    spec = short_cartpole(lambda: [InitTracker()])().full_action_spec_unbatched["action"]
    rnn = ResetRNN(nn.GRU(2, 8, batch_first=True), in_key="observation", default_recurrent_mode=False)
    return TensorDictSequential(rnn, TensorDictModule(nn.Linear(8, 2), ["features"], ["action_value"]),
                                QValueModule(spec=spec), EGreedyModule(spec, eps_init=0.5, eps_end=0.5))


class Tempered(TensorDictModule):
    def forward(self, tensordict, *args, **kwargs):  # skipped by a plain-tensor call of its module
        out = super().forward(tensordict, *args, **kwargs)
        return out.set("logits", out["logits"] * 3)


class Doubled(TensorDictSequential):
    def forward(self, tensordict, *args, **kwargs):  # skipped by walking its modules
        out = super().forward(tensordict, *args, **kwargs)
        return out.set("logits", out["logits"] * 2)


def hooked():
    module = TensorDictModule(nn.Linear(2, 2), ["observation"], ["logits"])
    module.register_forward_hook(lambda mod, args, out: out.set("logits", out["logits"].flip(-1)))
    return module


def sampled(logits_module):
    return lambda: TensorDictSequential(logits_module(), TensorDictModule(sample_action, ["logits"], ["action"]))


@pytest.mark.parametrize("make_policy", [
    q_policy,
    sampled(lambda: SafeModule(nn.Linear(2, 2), ["observation"], ["logits"], spec=Bounded(-0.1, 0.1, (2,)),
                               safe=True)),
    sampled(lambda: Tempered(nn.Linear(2, 2), ["observation"], ["logits"])),
    sampled(hooked),
    lambda: TensorDictSequential(Doubled(TensorDictModule(nn.Linear(2, 2), ["observation"], ["logits"])),
                                 TensorDictModule(sample_action, ["logits"], ["action"])),
    lambda: ProbabilisticActor(TensorDictModule(nn.Linear(2, 2), ["observation"], ["logits"]), in_keys=["logits"],
                               distribution_class=OneHotCategorical, return_log_prob=True,
                               generator=torch.Generator().manual_seed(123)),
    # partial_tolerant: a module whose keys are absent (no "action" before the first step) is skipped
    lambda: TensorDictSequential(TensorDictModule(nn.Linear(2, 2), ["observation"], ["logits"]),
                                 TensorDictModule(lambda a: a.float().sum(-1, keepdim=True), ["action"], ["had_action"]),
                                 TensorDictModule(sample_action, ["logits"], ["action"]), partial_tolerant=True),
], ids=["q_value_egreedy", "safe", "overridden_forward", "forward_hook", "overridden_sequential",
        "own_generator", "partial_tolerant"])
def test_modules_run_on_a_tensordict_act_as_under_the_collector(make_policy):
    # what a plain-tensor call would skip or cannot run: the module itself on a TensorDict of the step
    def transforms():
        primer = TensorDictPrimer(recurrent_state=Unbounded(shape=(1, 8)), expand_specs=True)
        return [InitTracker(), RewardSum(), *[primer] * (make_policy is q_policy)]

    ours = same_rollouts(short_cartpole(transforms), make_policy)
    if make_policy is q_policy:
        greedy = nn.functional.one_hot(torch.cat([r["action_value"] for r in ours]).argmax(-1), 2)
        explored = torch.cat([r["action"] for r in ours]) != greedy
        assert explored.any() and not explored.all()  # epsilon 0.5: some steps random, not all changed


def short_pendulum(transforms=lambda: [InitTracker(), RewardSum()]):
    def make():
        env = TransformedEnv(make_vector_env("Pendulum-v1", 3, max_episode_steps=4), Compose(*transforms()))
        env.set_seed(0)
        return env
    return make


class Peek(TensorDictModuleBase):
    """Reads the stored state before the ResetRNN: the primer's zeros at an episode start."""
    in_keys, out_keys = ["recurrent_state"], ["seen"]

    def forward(self, tensordict):
        return tensordict.set("seen", tensordict.get("recurrent_state")[:, 0, 0].clone())


def gaussian(make_module):
    net = TensorDictModule(nn.Sequential(nn.Linear(3, 2), NormalParamExtractor()), ["observation"], ["loc", "scale"])
    return lambda: TensorDictSequential(net, make_module(in_keys=["loc", "scale"], out_keys=["action"],
                                                         distribution_class=TanhNormal, return_log_prob=True))


def gru_module():
    return GRUModule(input_size=2, hidden_size=4, in_key="observation", out_key="feat", default_recurrent_mode=False)


def resets(rnn_policy):
    return TensorDictSequential(Peek(), rnn_policy, TensorDictModule(nn.Linear(8, 2), ["features"], ["logits"]),
                                TensorDictModule(sample_action, ["logits"], ["action"]))


@pytest.mark.parametrize("make_env, make_policy", [
    # the noise state OrnsteinUhlenbeckProcessModule keeps in private root keys goes on to the next step
    (short_pendulum(), lambda: TensorDictSequential(
        TensorDictModule(lambda obs: torch.zeros(obs.shape[0], 1), ["observation"], ["action"]),
        OrnsteinUhlenbeckProcessModule(spec=short_pendulum()().full_action_spec_unbatched["action"], sigma=0.0,
                                       theta=0.5, x0=0.0, mu=1.0, dt=1.0))),
    # TorchRL's GRUModule: its state primed (carried, zeros at a reset), and without a primer (dropped)
    (short_cartpole(lambda: [InitTracker(), gru_module().make_tensordict_primer()]),
     lambda: TensorDictSequential(gru_module(), TensorDictModule(nn.Linear(4, 2), ["feat"], ["logits"]),
                                  TensorDictModule(sample_action, ["logits"], ["action"]))),
    (short_cartpole(lambda: [InitTracker()]),
     lambda: TensorDictSequential(gru_module(), TensorDictModule(nn.Linear(4, 2), ["feat"], ["logits"]),
                                  TensorDictModule(sample_action, ["logits"], ["action"]))),
    # a ResetRNN's stored state read before it: the primer's zeros at the first step and at resets
    (short_cartpole(lambda: [InitTracker(), TensorDictPrimer(recurrent_state=Unbounded(shape=(1, 8)),
                                                             expand_specs=True)]),
     lambda: resets(ResetRNN(nn.GRU(2, 8, batch_first=True), in_key="observation", default_recurrent_mode=False))),
    # tensordict's probabilistic module computes its log-probability its own way; TorchRL's actor too
    (short_pendulum(), gaussian(ProbabilisticTensorDictModule)),
    (short_pendulum(), gaussian(lambda **kwargs: ProbabilisticActor(TensorDictModule(lambda loc, scale: (loc, scale),
                                                                                     ["loc", "scale"], ["loc", "scale"]),
                                                                    **kwargs))),
], ids=["ou_noise", "gru_module_primed", "gru_module_unprimed", "state_read_before_reset_rnn",
        "tensordict_probabilistic", "torchrl_probabilistic"])
@pytest.mark.filterwarnings("ignore:The env passed to Collector is missing transforms:FutureWarning")  # unprimed
def test_what_the_collector_carries_between_steps_is_carried(make_env, make_policy):
    ours = same_rollouts(make_env, make_policy, frames_per_batch=15)
    assert torch.cat([r["is_init"] for r in ours])[:, 1:].any()  # resets inside the rollouts


def test_what_would_act_differently_is_refused():
    rnn = ResetRNN(nn.GRU(2, 8, batch_first=True), in_key="observation", default_recurrent_mode=False)
    recurrent = TensorDictSequential(rnn, TensorDictModule(lambda f: sample_action(f[:, :2]), ["features"], ["action"]))
    with pytest.raises(ValueError, match="no primer"):  # the Collector would feed back a stale state
        VectorEnvCollector(vector_env(InitTracker()), recurrent, frames_per_batch=4)
    wrong = TensorDictPrimer(recurrent_state=Unbounded(shape=(2, 8)), expand_specs=True)
    with pytest.raises(ValueError, match="no primer of that shape"):
        VectorEnvCollector(vector_env(InitTracker(), wrong), recurrent, frames_per_batch=4)
    noisy = TensorDictPrimer(foo=Unbounded(shape=(3,)), random=True, expand_specs=True)
    with pytest.raises(ValueError, match="random=True or a default_value other than 0"):
        VectorEnvCollector(vector_env(InitTracker(), noisy), POLICY, frames_per_batch=4)
    with pytest.raises(TypeError, match="selected_out_keys"):
        tensor_policy(TensorDictSequential(POLICY, selected_out_keys=["action"]))
    silent = TensorDictModule(nn.Linear(4, 2), ["observation"], ["logits"])
    with pytest.raises(ValueError, match="wrote no"):
        next(iter(VectorEnvCollector(vector_env(InitTracker()), silent, frames_per_batch=4)))


def test_plain_tensor_rules_refuse_masks_and_states_of_the_wrong_kind():
    with pytest.raises(TypeError, match="bool"):  # an int mask would index rows 1, 0, 1, 0
        RunningObservationNorm().normalize(torch.ones(4, 1), counted=torch.tensor([1, 0, 1, 0]))
    with pytest.raises(TypeError, match="bool"):
        ReturnScaledReward().scale(torch.ones(4, 1), torch.zeros(4, 1))
    lstm = ResetRNN(nn.LSTM(3, 5, batch_first=True), in_key="x", default_recurrent_mode=False)
    x, h = torch.randn(4, 3), torch.randn(4, 1, 5)
    for state in (h, (h, h, h), (h[:3], h[:3])):  # a bare tensor, 3 entries for (h, c), 3 rows for 4
        with pytest.raises(ValueError, match="tuple of 2 tensors"):
            lstm.step(x, state, torch.zeros(4))


def agent_collector(seed: int, *, env_seed: int = 0, kind=VectorEnvCollector, **kwargs):
    """The main job's agent and acting env (observation and return statistics, two ResetRNNs)."""
    cfg = Config(num_envs=3, rollout_len=8, max_episode_steps=15, progress=False)
    torch.manual_seed(seed)
    actor, critic, rnns = make_agent(cfg, make_env(cfg), carry=False)
    return kind(make_acting_env(cfg, rnns, env_seed), TensorDictSequential(actor, critic), frames_per_batch=24,
                **kwargs)


def test_set_seed_after_building_is_seeding_before():
    # TorchRL's Collector.set_seed would keep its observation from before the seed (the env's
    # next step starts elsewhere); here the envs give the episodes of a collector built on the
    # env seeded the same way
    policy = TensorDictModule(sample_action, ["observation"], ["action"])
    make_env = short_cartpole(lambda: [InitTracker(), RewardSum()])
    seeded_before = VectorEnvCollector(make_env(), policy, frames_per_batch=12)
    seeded_before.env.set_seed(4)
    seeded_before.reset()
    torch.manual_seed(1)
    want = [seeded_before.rollout() for _ in range(2)]
    seeded_after = VectorEnvCollector(make_env(), policy, frames_per_batch=12)
    seeded_after.rollout()
    with pytest.warns(UserWarning, match="starts every env anew"):
        assert seeded_after.set_seed(4) == make_env().set_seed(4)  # the same next seed
    torch.manual_seed(1)
    got = [seeded_after.rollout() for _ in range(2)]
    for mine, theirs in zip(got, want):
        for key in theirs.keys(True, True):
            if key != ("collector", "traj_ids"):  # numbered on from the ids used before the seed
                assert torch.equal(mine[key], theirs[key]), key
    assert got[0]["is_init"][:, 0].all() and got[0]["done"].sum() == 0
    assert torch.equal(got[0]["collector", "traj_ids"] - got[0]["collector", "traj_ids"][0, 0],
                       want[0]["collector", "traj_ids"] - want[0]["collector", "traj_ids"][0, 0])


@pytest.mark.parametrize("source", [Collector, VectorEnvCollector])
def test_a_state_of_either_collector_loads_into_either(source):
    # a state of either kind, loaded into TorchRL's Collector and into a VectorEnvCollector: both
    # hold it then (the next trajectory id past the new envs' ids), the env's statistics aside
    # (the VectorEnvCollector resets its envs, counting their observations), and go on alike
    saved = agent_collector(0, kind=source, total_frames=96)
    for _ in zip(range(2), saved):
        pass
    state = saved.state_dict()
    first = int(state["traj_pool"]["traj_id"])
    assert state["frames"] == 48 and state["iter"] == 1 and first > 3
    theirs, mine = (agent_collector(1, env_seed=3, kind=kind, total_frames=96)  # other weights, statistics, envs
                    for kind in (Collector, VectorEnvCollector))
    theirs.load_state_dict(state)
    with pytest.warns(UserWarning, match="starts every env anew"):
        mine.load_state_dict(state)
    reference = agent_collector(1, env_seed=3).env  # the same env, reset once as at building
    reference.transform.load_state_dict(state["env_state_dict"])
    reset = reference.reset()  # its first observation normalized by the loaded statistics, then counted
    want = {**state, "traj_pool": {"traj_id": torch.tensor(first + 3, dtype=torch.int)}}
    for collector, env_state in ((theirs, state["env_state_dict"]), (mine, reference.transform.state_dict())):
        torch.testing.assert_close(collector.state_dict(), {**want, "env_state_dict": env_state}, rtol=0, atol=0)
    for collector in (theirs, mine):
        rollouts = list(collector)  # counted on from the saved 48: 96 in all
        assert len(rollouts) == 2 and collector.state_dict()["iter"] == 3
        assert rollouts[0]["collector", "traj_ids"][:, 0].tolist() == list(range(first, first + 3))
        collector.shutdown()
    assert torch.equal(rollouts[0]["observation"][:, 0], reset["observation"])
    with pytest.raises(KeyError, match=r"lacks \['traj_pool'\]"):  # a Collector's state with track_traj_ids=False
        mine.load_state_dict({k: v for k, v in state.items() if k != "traj_pool"})


@pytest.mark.parametrize("total_frames", [float("-inf"), -0.5, torch.tensor(12), torch.tensor(-1), torch.tensor([12.0])],
                         ids=["-inf", "-0.5", "tensor(12)", "tensor(-1)", "tensor([12.])"])
def test_total_frames_the_collector_accepts_are_read_as_it_reads_them(total_frames):
    # negative (-inf too): endless; a one-element tensor: its number
    batches = []
    for kind in (Collector, VectorEnvCollector):
        collector = kind(vector_env(InitTracker()), POLICY, frames_per_batch=4, total_frames=total_frames)
        batches.append(len(list(zip(range(10), collector))))
        collector.shutdown()
    assert batches == [3, 3] if total_frames > 0 else batches == [10, 10]


@pytest.mark.filterwarnings("ignore:split_trajs=True produces:UserWarning")  # TorchRL's advice on the layout
def test_endless_collectors_and_split_trajectories_as_the_collectors():
    for endless in (None, -1, -5, float("inf")):
        collector = VectorEnvCollector(vector_env(InitTracker()), POLICY, frames_per_batch=4, total_frames=endless)
        assert len(list(zip(range(30), collector))) == 30
    with pytest.raises(ValueError, match="total_frames must be positive, or negative or None"):
        VectorEnvCollector(vector_env(InitTracker()), POLICY, frames_per_batch=4, total_frames=0)
    assert len(list(VectorEnvCollector(vector_env(InitTracker()), POLICY, frames_per_batch=4, total_frames=1.2e1))) == 3
    for fractional_or_many in (12.5, torch.tensor(12.5), torch.tensor([12, 12])):
        with pytest.raises(TypeError, match="total_frames must be an int"):
            VectorEnvCollector(vector_env(InitTracker()), POLICY, frames_per_batch=4, total_frames=fractional_or_many)
    make_env = short_cartpole(lambda: [InitTracker(), RewardSum()])
    out = []
    for kind in (Collector, VectorEnvCollector):
        torch.manual_seed(0)
        out.append(list(kind(make_env(), TensorDictModule(sample_action, ["observation"], ["action"]),
                             frames_per_batch=12, total_frames=24, split_trajs=True)))
    for theirs, mine in zip(*out):
        assert mine.batch_size == theirs.batch_size and mine.batch_size[0] > 3  # episodes of at most 3 steps
        for key in theirs.keys(True, True):
            assert torch.equal(mine[key], theirs[key]), key
