"""The recurrent actor-critic of the recipes: encoder -> ResetRNN -> head, for the actor and the critic."""
from __future__ import annotations

import torch
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.modules import MLP, OneHotCategorical, ProbabilisticActor, TanhNormal, ValueOperator
from torchrl.modules.distributions import NormalParamExtractor

from torchrl_seqchunk import ResetRNN


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

    Uses ``cfg.hidden``, ``cfg.cell``, ``cfg.encoder`` and ``cfg.activation``; ``carry``: the
    ResetRNNs carry their state from one training sequence to the next (stream chunks).
    Returns ``(actor, critic, (actor_rnn, critic_rnn))``."""
    obs_dim = env.observation_spec["observation"].shape[-1]
    action_spec = env.full_action_spec_unbatched["action"]
    activation = {"tanh": nn.Tanh, "relu": nn.ReLU}[cfg.activation]

    def trunk(prefix: str) -> tuple[TensorDictSequential, ResetRNN]:
        in_size = cfg.hidden if cfg.encoder else obs_dim
        rnn = ResetRNN(
            {"gru": nn.GRU, "lstm": nn.LSTM}[cfg.cell](in_size, cfg.hidden, batch_first=True),
            in_key=f"{prefix}_embed",
            out_key=f"{prefix}_features",
            state_key=f"{prefix}_state",
            # at a reset slot inside a training sequence, use the memory stored when acting
            reset_state_key=f"{prefix}_state",
            carry=carry,
        )
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
