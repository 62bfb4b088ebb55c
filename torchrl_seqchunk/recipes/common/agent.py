"""The recurrent actor-critic of the recipes: encoder -> ResetRNN -> head, for the actor and the critic."""
from __future__ import annotations

import torch
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.modules import MLP, GRUModule, LSTMModule, OneHotCategorical, ProbabilisticActor, TanhNormal, ValueOperator
from torchrl.modules.distributions import NormalParamExtractor

from torchrl_seqchunk import ResetRNN


def recurrent_layer(kind: str, cell: str, in_size: int, hidden: int, *, in_key: str, out_key: str,
                    state_key: str, carry: bool = True) -> ResetRNN:
    """The recurrent layer of a recipe's network: a ResetRNN over ``nn.GRU`` / ``nn.LSTM``
    (``kind="resetrnn"``, memory under ``state_key``) or over TorchRL's ``GRUModule`` /
    ``LSTMModule`` (``kind="torchrl"``, TorchRL's keys: ``state_key``, or ``state_key + "_h"`` and
    ``"_c"``). Either way the same weights for the same seed, reset to the memory stored when
    acting at a reset inside a training sequence, and carrying its state with ``carry``."""
    if kind == "torchrl":
        names = [state_key] if cell == "gru" else [f"{state_key}_h", f"{state_key}_c"]
        module = {"gru": GRUModule, "lstm": LSTMModule}[cell](
            input_size=in_size, hidden_size=hidden, in_keys=[in_key, *names, "is_init"],
            out_keys=[out_key, *(("next", name) for name in names)])
        return ResetRNN(module, reset_state_key=names, carry=carry)
    return ResetRNN({"gru": nn.GRU, "lstm": nn.LSTM}[cell](in_size, hidden, batch_first=True), in_key=in_key,
                    out_key=out_key, state_key=state_key, reset_state_key=state_key, carry=carry)


class IndependentOneHotCategorical(torch.distributions.Independent):
    """k independent one-hot categoricals, logits ``[*, k, n]``; log-probs summed over k."""

    def __init__(self, logits: torch.Tensor):
        super().__init__(OneHotCategorical(logits=logits), 1)

    @property
    def deterministic_sample(self) -> torch.Tensor:
        """The most likely one-hot of each categorical, ``[*, k, n]``: what TorchRL draws in
        its deterministic interaction mode (as its own ``OneHotCategorical`` does)."""
        return self.mode


def make_agent(cfg, env, *, carry: bool):
    """Actor and critic, each an MLP encoder -> ResetRNN(GRU or LSTM) -> head, shaped by ``env``'s specs.

    Uses ``cfg.hidden``, ``cfg.rnn``, ``cfg.cell``, ``cfg.encoder`` and ``cfg.activation``; ``carry``: the
    ResetRNNs carry their state from one training sequence to the next (stream chunks).
    Returns ``(actor, critic, (actor_rnn, critic_rnn))``."""
    obs_dim = env.observation_spec["observation"].shape[-1]
    action_spec = env.full_action_spec_unbatched["action"]
    activation = {"tanh": nn.Tanh, "relu": nn.ReLU}[cfg.activation]

    def trunk(prefix: str) -> tuple[TensorDictSequential, ResetRNN]:
        in_size = cfg.hidden if cfg.encoder else obs_dim
        # at a reset slot inside a training sequence, the memory stored when acting
        rnn = recurrent_layer(cfg.rnn, cfg.cell, in_size, cfg.hidden, in_key=f"{prefix}_embed",
                              out_key=f"{prefix}_features", state_key=f"{prefix}_state", carry=carry)
        encoder = TensorDictModule(
            nn.Sequential(nn.Linear(obs_dim, cfg.hidden), nn.Tanh()) if cfg.encoder else nn.Identity(),
            in_keys=["observation"], out_keys=[f"{prefix}_embed"],
        )
        return TensorDictSequential(encoder, rnn), rnn

    actor_trunk, actor_rnn = trunk("actor")
    critic_trunk, critic_rnn = trunk("critic")
    if action_spec.domain == "discrete":  # one-hot [n], or [k, n] for a MultiDiscrete action (k choices of n)
        head = TensorDictModule(
            nn.Sequential(MLP(in_features=cfg.hidden, out_features=action_spec.shape.numel(),
                              num_cells=[cfg.hidden], activation_class=activation),
                          nn.Unflatten(-1, action_spec.shape)),
            in_keys=["actor_features"], out_keys=["logits"])
        dist_class = OneHotCategorical if len(action_spec.shape) == 1 else IndependentOneHotCategorical
        dist_keys, dist_kwargs = ["logits"], {}
    else:
        head = TensorDictModule(
            nn.Sequential(MLP(in_features=cfg.hidden, out_features=2 * action_spec.shape[-1],
                              num_cells=[cfg.hidden], activation_class=activation), NormalParamExtractor()),
            in_keys=["actor_features"], out_keys=["loc", "scale"])
        dist_keys, dist_class = ["loc", "scale"], TanhNormal
        dist_kwargs = {"low": action_spec.space.low, "high": action_spec.space.high}
    actor = ProbabilisticActor(
        TensorDictSequential(actor_trunk, head), in_keys=dist_keys, spec=action_spec,
        distribution_class=dist_class, distribution_kwargs=dist_kwargs, return_log_prob=True,
    )
    critic = TensorDictSequential(
        critic_trunk,
        ValueOperator(MLP(in_features=cfg.hidden, out_features=1, num_cells=[cfg.hidden],
                          activation_class=activation),
                      in_keys=["critic_features"]),
    )
    return actor, critic, (actor_rnn, critic_rnn)
