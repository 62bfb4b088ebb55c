"""Pipelines to check: the library's own, TorchRL's recipes, and broken ones written the way a user
writes them (TorchRL pieces and plain torch), one per bug class the checker names.

Every pipeline is ``(policy, env, layout, options)`` for ``check_recurrence(policy, env, layout,
steps=STEPS, **options)``; the env is masked CartPole (position and angle only) with episodes of
at most 40 steps, so that a rollout holds many starts, ends and truncations.
"""
from __future__ import annotations

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule as Mod
from tensordict.nn import TensorDictModuleBase
from tensordict.nn import TensorDictSequential as Seq
from torch import nn
from torchrl.data import SliceSampler, Unbounded
from torchrl.envs import Compose, InitTracker, TensorDictPrimer, TransformedEnv
from torchrl.envs.transforms import BurnInTransform
from torchrl.modules import (MLP, EGreedyModule, GRUModule, LSTMModule, OneHotCategorical, ProbabilisticActor,
                             QValueModule, ValueOperator, recurrent_mode)
from torchrl.objectives import ClipPPOLoss, DQNLoss, SoftUpdate

from torchrl_seqchunk import RecurrentDQNLoss, RecurrentPPOLoss, ResetRNN
from torchrl_seqchunk.check import DQNStreamLayout, SliceLayout, StreamLayout, WindowLayout
from torchrl_seqchunk.check.reference import EPISODE
from torchrl_seqchunk.envs import make_vector_env

NUM_ENVS, STEPS, HIDDEN = 6, 64, 16
SEED = 0  # the envs' seed


def env_with(*primers) -> TransformedEnv:
    """Masked CartPole, ``NUM_ENVS`` in one vector env, with InitTracker and the primers, seeded."""
    env = TransformedEnv(make_vector_env("CartPole-v1", NUM_ENVS, keep=(0, 2), max_episode_steps=40),
                         Compose(InitTracker(), *primers))
    env.set_seed(SEED)
    return env


def encoder(out_key: str) -> Mod:
    return Mod(nn.Sequential(nn.Linear(2, HIDDEN), nn.Tanh()), ["observation"], [out_key])


def q_head(in_key: str) -> Mod:
    return Mod(MLP(in_features=HIDDEN, out_features=2, num_cells=[HIDDEN]), [in_key], ["action_value"])


def acting(qnet, env) -> Seq:
    """The Q-network, greedy actions, epsilon-greedy exploration: the policy a collector steps."""
    spec = env.full_action_spec_unbatched["action"]
    return Seq(qnet, QValueModule(spec=spec), EGreedyModule(spec, eps_init=0.3, eps_end=0.3))


# -- the library's PPO agent: encoder -> ResetRNN -> heads ------------------------------------------
def ppo_agent(cell=nn.GRU, *, carry=False, is_first_key="is_first"):
    """Actor and critic, each encoder -> ResetRNN (stored memory at reset slots) -> head."""
    rnns = []

    def trunk(prefix):
        rnn = ResetRNN(cell(HIDDEN, HIDDEN, batch_first=True), in_key=f"{prefix}_embed", out_key=f"{prefix}_features",
                       state_key=f"{prefix}_state", reset_state_key=f"{prefix}_state", carry=carry,
                       is_first_key=is_first_key)
        rnns.append(rnn)
        return Seq(encoder(f"{prefix}_embed"), rnn)

    actor = ProbabilisticActor(Seq(trunk("actor"), Mod(nn.Linear(HIDDEN, 2), ["actor_features"], ["logits"])),
                               in_keys=["logits"], distribution_class=OneHotCategorical, return_log_prob=True)
    critic = Seq(trunk("critic"), ValueOperator(nn.Linear(HIDDEN, 1), in_keys=["critic_features"]))
    primers = {k: s for r in rnns for k, s in r.make_tensordict_primer().primers.items(True, True)}
    return actor, critic, env_with(TensorDictPrimer(primers, expand_specs=True))


def ppo_windows(boundary_mode):
    actor, critic, env = ppo_agent()
    loss = RecurrentPPOLoss(actor, critic, boundary_mode=boundary_mode)
    return Seq(actor, critic), env, WindowLayout(8, boundary_mode=boundary_mode), {"ppo_loss": loss}


def ppo_streams(second_pass=None):
    """ClipPPOLoss on chunks with the carry; its own passes (or ``second_pass``) after the carrying one."""
    actor, critic, env = ppo_agent(nn.LSTM, carry=True)
    loss = ClipPPOLoss(actor, critic)

    def update(chunk):  # the loss's own passes of the actor and the critic (advantages as boundary_gae wrote them)
        chunk["advantage"] = chunk["value_target"] = torch.zeros(*chunk.shape, 1)
        loss(chunk)

    layout = StreamLayout(3, 16, second_pass=second_pass or update)
    return Seq(actor, critic), env, layout, {"ppo_loss": loss}


# -- the library's recurrent DQN recipe --------------------------------------------------------------
def dqn_agent():
    rnn = ResetRNN(nn.GRU(HIDDEN, HIDDEN, batch_first=True), in_key="q_embed", out_key="q_features",
                   state_key="q_state", reset_state_key="q_state")
    qnet = Seq(encoder("q_embed"), rnn, q_head("q_features"))
    env = env_with(rnn.make_tensordict_primer())
    return qnet, rnn, env


def dqn_streams():
    qnet, rnn, env = dqn_agent()
    loss = RecurrentDQNLoss(qnet, rnn, n_steps=3)
    SoftUpdate(loss, tau=0.01)  # the recipe's target network
    return acting(qnet, env), env, DQNStreamLayout(loss, 3, 16), {"network": qnet}


def dqn_streams_torchrl_loss():
    """ResetRNN's carry under TorchRL's own DQNLoss, whose double-DQN passes run the network on the
    chunk's step_mdp view with the online and the target parameters."""
    qnet, rnn, env = dqn_agent()
    loss = DQNLoss(Seq(qnet, QValueModule(spec=env.full_action_spec_unbatched["action"])), delay_value=True,
                   double_dqn=True, action_space="one_hot")
    SoftUpdate(loss, tau=0.01)
    return acting(qnet, env), env, StreamLayout(3, 16, second_pass=loss), {"network": qnet}


# -- TorchRL's own recurrent modules ------------------------------------------------------------------
def torchrl_lstm():
    lstm = LSTMModule(input_size=HIDDEN, hidden_size=HIDDEN, in_key="embed", out_key="features")
    qnet = Seq(encoder("embed"), lstm, q_head("features"))
    env = env_with(lstm.make_tensordict_primer())
    return qnet, lstm, env


def lstm_slices():
    """TorchRL's dqn_with_rnn recipe: LSTMModule, SliceSampler slices from the stored state."""
    qnet, _, env = torchrl_lstm()
    return acting(qnet, env), env, SliceLayout(8), {"network": qnet}


def lstm_slices_burn_in():
    """SliceSampler slices inside episodes after TorchRL's BurnInTransform: a burn-in that never
    crosses an episode start."""
    qnet, lstm, env = torchrl_lstm()
    layout = SliceLayout(8, burn_in=4, transform=BurnInTransform([qnet[0], lstm], burn_in=4))
    return acting(qnet, env), env, layout, {"network": qnet}


def gru_windows():
    gru = GRUModule(input_size=HIDDEN, hidden_size=HIDDEN, in_key="embed", out_key="features")
    qnet = Seq(encoder("embed"), gru, q_head("features"))
    env = env_with(gru.make_tensordict_primer())
    return acting(qnet, env), env, WindowLayout(8, is_first_key="is_init"), {"network": qnet}


CORRECT = {
    "windows_reset_continue": lambda: ppo_windows("reset_continue"),
    "windows_mask": lambda: ppo_windows("mask"),
    "windows_inverse_count": lambda: ppo_windows("inverse_count"),
    "streams_carry_clippo": ppo_streams,
    "streams_carry_next_view": lambda: ppo_streams(second_pass="next"),
    "dqn_recipe_streams": dqn_streams,
    "streams_carry_torchrl_dqnloss": dqn_streams_torchrl_loss,
    "torchrl_lstm_slices": lstm_slices,
    "torchrl_lstm_slices_burn_in": lstm_slices_burn_in,
    "torchrl_gru_windows": gru_windows,
}


# -- a recurrent module in plain torch, as a user writes one -----------------------------------------
class UserGRU(TensorDictModuleBase):
    """A GRU cell over ``"embed"`` writing ``"features"``, with TorchRL's conventions.

    Step mode (acting): the memory at the root ``"h"`` (zeros where ``"is_init"``), the memory
    after the step under ``("next", "h")``. Sequence mode (training, ``[N, L]``): from the memory
    stored at the first step, reset to zeros wherever ``reset_key`` is set, step 0 included.
    """

    def __init__(self, reset_key="is_init"):
        super().__init__()
        self.cell = nn.GRUCell(HIDDEN, HIDDEN)
        self.reset_key = reset_key
        self.in_keys = ["embed", "h", "is_init"] + ([reset_key] if reset_key != "is_init" else [])
        self.out_keys = ["features", ("next", "h")]

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        return self.sequence(td) if recurrent_mode() else self.step(td)

    def step(self, td):
        h = torch.where(td["is_init"], 0.0, td["h"])
        new = self.cell(td["embed"], h)
        td["features"], td["next", "h"] = new, new
        return td

    def start(self, td):
        return td["h"][:, 0]

    def flags(self, td):
        return td[self.reset_key].reshape(td.shape)

    def sequence(self, td):
        h, out = self.start(td), []
        flags = self.flags(td)
        for t in range(td.shape[1]):
            h = torch.where(flags[:, t:t + 1], 0.0, h)
            h = self.cell(td["embed"][:, t], h)
            out.append(h)
        self.end(h)
        td["features"] = torch.stack(out, 1)
        return td

    def end(self, h):
        pass

    @staticmethod
    def primer():
        return TensorDictPrimer({"h": Unbounded(shape=(HIDDEN,))}, expand_specs=True)


class StoresAfterStep(UserGRU):
    """Acting writes the memory after the step at the root: the buffer stores post-step memory."""

    def step(self, td):
        super().step(td)
        td["h"] = td["next", "h"]
        return td


class CarryingGRU(UserGRU):
    """Training on consecutive chunks: starts each row from the state the previous chunk ended with.

    ``reset_first``: whether a chunk's first step resets where it starts an episode (the bug is
    to reset only inside the chunk). Every call keeps its final state (so a second pass moves it)."""

    def __init__(self, reset_first=True):
        super().__init__(reset_key="is_first")
        self.reset_first, self.carry = reset_first, None

    def start(self, td):
        if self.carry is None or self.carry.shape[0] != td.shape[0]:
            return torch.zeros(td.shape[0], HIDDEN)
        return self.carry

    def flags(self, td):
        flags = super().flags(td)
        if not self.reset_first:  # resets inside the chunk only: t = 0 goes on from the carry
            flags = flags.clone()
            flags[:, 0] = False
        return flags

    def end(self, h):
        self.carry = h.detach()

    def reset_carry(self):
        self.carry = None


def user_pipeline(module, layout_of, **options):
    qnet = Seq(encoder("embed"), module, q_head("features"))
    env = env_with(UserGRU.primer())
    return acting(qnet, env), env, layout_of(module), {"network": qnet, "state_keys": "h", **options}


def done_shifted():
    """Training resets with the post-step done (``("next", "done")``), acting reset on ``is_init``."""
    return user_pipeline(UserGRU(reset_key=("next", "done")), lambda m: WindowLayout(8))


def slice_starts_reset():
    """TorchRL's SliceSampler flags every slice start ``is_init``; the module resets to zeros there."""
    return user_pipeline(UserGRU(), lambda m: SliceLayout(8))


def slice_starts_kept():
    """The fix: ``SliceSampler(init_key=None)`` leaves the stored flags, so slices go on from the stored memory."""
    sampler = SliceSampler(slice_len=8, traj_key=EPISODE, strict_length=True, init_key=None)
    return user_pipeline(UserGRU(), lambda m: SliceLayout(8, sampler=sampler))


def burn_in_leak():
    """TorchRL's BurnInTransform on slices across episodes: the burnt-in state is copied into a kept
    first step that starts an episode."""
    qnet, lstm, env = torchrl_lstm()
    layout = SliceLayout(8, burn_in=4, cross_episodes=True, transform=BurnInTransform([qnet[0], lstm], burn_in=4))
    return acting(qnet, env), env, layout, {"network": qnet}


def stored_after_step():
    sampler = SliceSampler(slice_len=8, traj_key=EPISODE, strict_length=True, init_key=None)
    return user_pipeline(StoresAfterStep(), lambda m: SliceLayout(8, sampler=sampler))


def carry_not_reset():
    return user_pipeline(CarryingGRU(reset_first=False), lambda m: StreamLayout(3, 4, second_pass=None,
                                                                                reset_carry=m.reset_carry))


def carry_kept():
    """The carrying module that resets at every episode start, a chunk's first step included."""
    return user_pipeline(CarryingGRU(), lambda m: StreamLayout(3, 4, second_pass=None, reset_carry=m.reset_carry))


def second_pass_moves_carry():
    """A target pass over each chunk through the same module (functional target parameters, as
    TorchRL's losses run it) moves a carry that every call keeps."""
    module = CarryingGRU()
    qnet = Seq(encoder("embed"), module, q_head("features"))
    target = {name: p.detach().clone() for name, p in qnet.named_parameters()}

    def target_pass(chunk):
        torch.func.functional_call(qnet, target, (chunk,))

    env = env_with(UserGRU.primer())
    layout = StreamLayout(3, 4, second_pass=target_pass, reset_carry=module.reset_carry)
    return acting(qnet, env), env, layout, {"network": qnet, "state_keys": "h"}


def second_pass_resetrnn():
    """The same target pass over ResetRNN's chunks: only the first pass carries."""
    qnet, rnn, env = dqn_agent()
    target = {name: p.detach().clone() for name, p in qnet.named_parameters()}

    def target_pass(chunk):
        torch.func.functional_call(qnet, target, (chunk,))

    return acting(qnet, env), env, StreamLayout(3, 4, second_pass=target_pass), {"network": qnet}


def exploration_after_log_prob():
    """PPO with epsilon-greedy on top of the stochastic actor: the stored action is not always the
    one the stored log-probability is of."""
    actor, critic, env = ppo_agent()
    spec = env.full_action_spec_unbatched["action"]
    policy = Seq(actor, critic, EGreedyModule(spec, eps_init=0.2, eps_end=0.2))
    loss = RecurrentPPOLoss(actor, critic)
    return policy, env, WindowLayout(8), {"ppo_loss": loss, "network": Seq(actor, critic)}


#: broken pipeline -> (the check that names its bug, every check that must fail)
BROKEN = {
    "done_shifted": (done_shifted, "done_alignment", {"done_alignment", "step_vs_sequence"}),
    "slice_starts_reset": (slice_starts_reset, "resets", {"resets", "step_vs_sequence"}),
    "burn_in_leak": (burn_in_leak, "resets", {"resets", "step_vs_sequence"}),
    "stored_after_step": (stored_after_step, "stored_memory", {"stored_memory", "step_vs_sequence"}),
    "carry_not_reset": (carry_not_reset, "carry", {"carry", "resets", "step_vs_sequence"}),
    "second_pass_moves_carry": (second_pass_moves_carry, "carry", {"carry", "step_vs_sequence"}),
    "exploration_after_log_prob": (exploration_after_log_prob, "ppo_ratio", {"ppo_ratio"}),
}

#: the fixed counterparts of broken pipelines, written the same way
FIXED = {
    "slice_starts_kept": slice_starts_kept,
    "carry_kept": carry_kept,
    "second_pass_resetrnn": second_pass_resetrnn,
}
