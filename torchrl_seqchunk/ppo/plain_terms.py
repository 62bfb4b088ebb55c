"""RecurrentPPOLoss's plain-tensor path: ClipPPOLoss's terms computed on the windows' tensors.

Where the networks allow it (:func:`plain_networks`), the loss calls their modules on plain
tensors and computes ClipPPOLoss's per-element terms itself, the same operations in the same
order (bitwise equal to its forward, tested), without a TensorDict per module or a parameter
swap per call; the entropy term leaves the graph where its coefficient is 0, the logging
entries are computed only with diagnostics.
"""
from __future__ import annotations

import torch
from tensordict import TensorDictBase
from tensordict.nn import ProbabilisticTensorDictModule, ProbabilisticTensorDictSequential
from tensordict.utils import unravel_key
from torchrl.objectives.ppo import _broadcast_advantage_to_log_weight, _check_advantage_broadcast
from torchrl.objectives.utils import _clip_value_loss, distance_loss

from ..collect.policy import plain_steps


def weighs_entropy(loss) -> bool:
    """Whether the entropy coefficient is not 0 (read once per change of its buffer)."""
    coeff = loss.entropy_coeff
    seen = (coeff, coeff._version)
    if loss._entropy_weighs is None or loss._entropy_weighs[0][0] is not coeff or loss._entropy_weighs[0][1] != seen[1]:
        loss._entropy_weighs = (seen, bool((coeff != 0).any()))
    return loss._entropy_weighs[1]


def clip_terms(loss, tensordict: TensorDictBase, in_keys, actor_steps, dist_module, critic_steps) -> dict:
    """ClipPPOLoss's forward entries (its per-element ``"loss_*"`` terms, ``reduction="none"``),
    the same operations on plain tensors: the networks' modules called on the windows' entries;
    the entropy term left out of the graph where its coefficient is 0 (its value, 0, kept), the
    logging entries left out without :attr:`RecurrentPPOLoss.diagnostics`."""
    keys, diagnostics = loss.tensor_keys, loss.diagnostics
    advantage = loss._maybe_normalize_advantage(tensordict.get(keys.advantage), tensordict, update_norm=False)
    data = {key: value for key in in_keys if (value := tensordict.get(key, None)) is not None}
    for run in actor_steps:
        run(data)
    dist = dist_module.get_dist(data)
    previous = tensordict.get(keys.sample_log_prob, None)
    if previous is None:
        raise KeyError(f"Couldn't find the log-prob {keys.sample_log_prob} in the input data.")
    action = tensordict.get(keys.action)
    for key, value in ((keys.sample_log_prob, previous), (keys.action, action)):
        if value.requires_grad:
            raise RuntimeError(f"tensordict stored {key} requires grad.")
    log_prob = dist.log_prob(action)
    log_weight = (log_prob - previous).unsqueeze(-1)
    advantage = _broadcast_advantage_to_log_weight(advantage, log_weight)
    if advantage.shape != log_weight.shape:  # equal shapes broadcast to themselves
        _check_advantage_broadcast(advantage, log_weight)
    clipped = log_weight.clamp(*loss._clip_bounds)
    gain = torch.stack([log_weight.exp() * advantage, clipped.exp() * advantage], -1).min(dim=-1).values
    out = {"loss_objective": -gain}
    if diagnostics:
        out["clip_fraction"] = (clipped != log_weight).to(log_weight.dtype).mean()
        out["kl_approx"] = (previous - log_prob).unsqueeze(-1).detach().mean()
    if loss.entropy_bonus:
        weighs = weighs_entropy(loss)
        entropy = loss._get_entropy(dist, adv_shape=advantage.shape[:-1]) if weighs or diagnostics else None
        if diagnostics:
            out["entropy"] = entropy.detach().mean()
        out["loss_entropy"] = (loss._weighted_loss_entropy(entropy) if weighs
                               else torch.zeros_like(log_weight) if entropy is None
                               else loss._weighted_loss_entropy(entropy.detach()))
    if loss._has_critic:
        out.update(critic_terms(loss, tensordict, data, critic_steps))
    if diagnostics:
        with torch.no_grad():
            weight = log_weight.squeeze(-1)
            out["ESS"] = (2 * weight.logsumexp(0) - (2 * weight).logsumexp(0)).exp() / log_weight.shape[0]
            ratio = log_weight.exp()
            out["max_ratio"], out["mean_ratio"] = ratio.max(), ratio.mean()
    return out


def critic_terms(loss, tensordict: TensorDictBase, data: dict, critic_steps) -> dict:
    """ClipPPOLoss's ``loss_critic`` on plain tensors: the weighted value loss and, with
    :attr:`RecurrentPPOLoss.diagnostics`, the value clip fraction and the explained variance."""
    keys = loss.tensor_keys
    target = tensordict.get(keys.value_target, None)
    if target is None:
        raise KeyError(
            f"the key {keys.value_target} was not found in the input tensordict. Make sure you provided the "
            "right key and the value_target (i.e. the target return) has been retrieved accordingly."
        )
    old = None
    if loss.clip_value:
        old = tensordict.get(keys.value, None)
        if old is None:
            raise KeyError(f"clip_value is set to {loss.clip_value}, but the key {keys.value} was not found in "
                           "the input tensordict.")
    for run in critic_steps:
        run(data)
    value = data.get(keys.value)
    if value is None:
        raise KeyError(f"the key {keys.value} was not found in the critic output tensordict. Make sure that the "
                       "'value_key' passed to PPO is accurate.")
    target, value, old = loss._critic_loss_inputs(target, value, old)
    error = distance_loss(target, value, loss_function=loss.loss_critic_type)
    out = {}
    if loss.clip_value:
        error, fraction = _clip_value_loss(old, value, loss.clip_value, target, error, loss.loss_critic_type)
        if loss.diagnostics:
            out["value_clip_fraction"] = fraction
    out = {"loss_critic": loss.critic_coeff * error, **out}
    if loss.diagnostics and loss.log_explained_variance:
        with torch.no_grad():
            target, value = target.detach(), value.detach()
            residual = torch.var(target - value, correction=0, dim=0)
            total = torch.var(target, correction=0, dim=0)
            out["explained_variance"] = 1.0 - residual / (total + torch.finfo(target.dtype).eps)
    return out


def plain_networks(actor, critic):
    """RecurrentPPOLoss's plain path's walk of the networks (``critic`` None: none runs), or
    ``None``: the actor must be TorchRL's probabilistic sequence (its distribution built by its last
    module from its deterministic part's outputs), each module one that runs on plain tensors."""
    sequence = ProbabilisticTensorDictSequential
    if not (isinstance(actor, sequence) and not actor.return_composite and actor.det_part is not None
            and all(getattr(type(actor), name) is getattr(sequence, name)
                    for name in ("get_dist", "get_dist_params", "build_dist_from_params"))):
        return None
    dist_module = list(actor._module_iter())[-1]
    last = [m for m in actor.modules() if isinstance(m, ProbabilisticTensorDictModule)][-1]
    if dist_module is not last or type(dist_module).get_dist is not ProbabilisticTensorDictModule.get_dist:
        return None
    actor_steps = plain_steps(actor.det_part)
    critic_steps = [] if critic is None else plain_steps(critic)
    if actor_steps is None or critic_steps is None:
        return None
    in_keys = list(dict.fromkeys(unravel_key(key) for net in (actor, critic) if net is not None for key in net.in_keys))
    return in_keys, actor_steps, dist_module, critic_steps
