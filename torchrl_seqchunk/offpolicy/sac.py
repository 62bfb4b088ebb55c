""":class:`RecurrentSACLoss`: soft actor-critic with recurrent actor and critic on ``[B, T]`` chunks.

Three recurrent passes run per batch, each through
:func:`~torchrl_seqchunk.offpolicy.unroll.unroll_with_next` and each carrying its own state per
stream (:class:`~torchrl_seqchunk.offpolicy.carry.Carries`): the actor (its distribution at every
step, and at every step's next observation under the memory after the step: the next actions of
the targets), the critic (its features at every step) and the target critic (its features at
every next observation). The twin Q heads read the critic's features and an action; the n-step
targets are :func:`~torchrl_seqchunk.boundary_nstep_targets`'s, so right at every boundary.
"""
from __future__ import annotations

import copy
import math

import torch
from tensordict import TensorDict, TensorDictBase, unravel_key
from tensordict.nn import ProbabilisticTensorDictSequential, TensorDictModuleBase, TensorDictParams
from tensordict.utils import NestedKey
from torch import nn
from torchrl.modules.distributions.utils import rsample_and_log_prob
from torchrl.objectives import LossModule
from torchrl.objectives.utils import distance_loss

from .._checks import check_int, check_real
from ..recurrent.torchrl_modules import warn_uncarried
from .carry import Carries, check_rnn, kept_mean
from .targets import boundary_nstep_targets

__all__ = ["RecurrentSACLoss"]


class _Critic(nn.Module):
    """The recurrent critic trunk and its Q heads, one module (one set of parameters, one target copy)."""

    def __init__(self, encoder: nn.Module, heads: list):
        super().__init__()
        self.encoder, self.heads = encoder, nn.ModuleList(heads)


def _contains(network: nn.Module, rnn: nn.Module) -> bool:
    return any(module is rnn for module in network.modules())


class RecurrentSACLoss(LossModule):
    """Soft actor-critic on ``[B, T]`` stream chunks (or windows), a recurrent actor and critic
    each carrying its own state per stream, targets right at every boundary.

    Per step ``t`` (Haarnoja et al., 2018, "Soft Actor-Critic Algorithms and Applications"; the
    recurrent form of Ni, Eysenbach and Salakhutdinov, ICML 2022: separate actor and critic
    encoders, trained on sequences):

    * critic: every head ``Q_i(z_t, a_t)`` (``z_t`` the critic's features after ``o_t``)
      regresses on the n-step target of :func:`~torchrl_seqchunk.boundary_nstep_targets` whose
      bootstrap is ``V'_t = min_i Q'_i(z'_t, a'_t) - alpha log pi(a'_t | h'_t)``: ``z'_t`` the
      target critic's and ``h'_t`` the actor's features at the observation step ``t`` reaches,
      each under its memory after step ``t`` (the final observation after a truncation,
      ``("next", "observation")`` at a chunk end; no bootstrap after a termination), ``a'_t``
      drawn from the actor there;
    * actor: ``alpha log pi(a | h_t) - min_i Q_i(z_t, a)``, ``a`` drawn with the
      reparameterization trick, the critic's features and heads fixed (no gradient);
    * temperature: ``-log_alpha (log pi(a | h_t) + target_entropy)`` (automatic entropy tuning).

    Losses are means over the steps (those ``mask_key`` keeps); ``loss_qvalue`` sums the heads.
    The twin heads share one recurrent critic trunk, as in Ni et al.'s recurrent critic: what
    their study found to matter is that the actor and the critic do not share an encoder (the
    actor's gradients would otherwise shape the critic's memory), while one trunk for both heads
    halves the critic's recurrent cost; the heads are independent (re-initialized copies).
    Where each row starts (``initial_state``, ``burn_in``, ``overlap``, ``stream_key``) is as for
    :class:`~torchrl_seqchunk.RecurrentDQNLoss` (R2D2's stored state and burn-in: Kapturowski et
    al., ICLR 2019), for each of the actor, the critic and the target critic. The target critic is
    TorchRL's (update it with ``SoftUpdate``); the actor has no target copy. Actions are drawn
    from torch's global generator: first the next actions ``a'`` (one draw ``[B, T, *A]``), then
    the actor loss's ``a``.

    Args:
        actor_network (ProbabilisticTensorDictSequential): observations -> distribution
            parameters (e.g. ``"loc"``, ``"scale"``) -> action, e.g. TorchRL's
            ``ProbabilisticActor`` with ``TanhNormal``; contains ``actor_rnn``.
        actor_rnn (ResetRNN): the actor's recurrent module (``carry=True``, a ``reset_state_key``).
        critic_network (TensorDictModuleBase): observations -> the critic's features; contains
            ``critic_rnn``; does not read the action.
        critic_rnn (ResetRNN): the critic's recurrent module, not the actor's.
        qvalue_head (TensorDictModuleBase): the critic's features and ``action_key`` ->
            ``state_action_value_key`` ``[..., 1]``; copied ``num_qvalue_nets`` times, each copy
            re-initialized (or a list of heads, one per Q-function).

    Keyword Args:
        num_qvalue_nets (int): Q heads, ``>= 1``. Default ``2``.
        gamma (float): discount in ``[0, 1]``. Default ``0.99``.
        n_steps (int): n of the n-step targets, ``>= 1``. Default ``1``.
        alpha_init (float): initial temperature, ``> 0``. Default ``1.0``.
        min_alpha, max_alpha (float, optional): bounds of the temperature. Default ``None``.
        fixed_alpha (bool): keep ``alpha_init`` (no temperature loss gradient). Default ``False``.
        target_entropy (float or "auto"): ``"auto"``: minus the action's size (its spec's last
            dim, from ``action_spec`` or ``actor_network.spec``). Default ``"auto"``.
        action_spec (TensorSpec, optional): the action's spec, for ``target_entropy="auto"``.
        loss_function (str): ``"l2"``, ``"l1"`` or ``"smooth_l1"``. Default ``"smooth_l1"``.
        initial_state (str): ``"carry"``, ``"stored"`` (each network from its memory stored at the
            row's first step: the critic's too, so store both) or ``"zero"``. Default ``"carry"``.
        mask_key (NestedKey, optional): bool ``[B, T]`` (or ``[B, T, 1]``), the steps that count.
        burn_in (int): steps per row unrolled without gradient first, ``>= 0``. Default ``0``.
        stream_key (NestedKey, optional): integer ``[B, T]`` stream ids (a carry per stream).
        overlap (bool): batches of a stream overlap by ``burn_in`` steps. Default ``False``.
        action_key, state_action_value_key, reward_key, done_key, terminated_key,
        truncated_key (NestedKey): TorchRL's keys.

    Returns (forward):
        TensorDict with scalars ``"loss_actor"``, ``"loss_qvalue"``, ``"loss_alpha"`` (sum them to
        train all three), ``"alpha"``, ``"entropy"`` (mean ``-log pi``), ``"td_error"`` (mean
        absolute over heads and steps), ``"recurrent_steps"`` (``int64``, the three passes,
        burn-in included) and ``"value_target"`` (the targets, ``[B, T - burn_in, 1]``, detached).

    Raises:
        TypeError / ValueError: at construction, an actor that is not a probabilistic sequence,
            an rnn outside its network or shared by actor and critic, a head that reads no
            action or no feature, bad options, no action spec for ``target_entropy="auto"``;
            at call time, those of :class:`~torchrl_seqchunk.RecurrentDQNLoss` for the carry,
            stream ids and burn-in, and of ``unroll_with_next``.

    Examples:
        >>> import torch
        >>> from torch import nn
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import NormalParamExtractor, TensorDictModule as Mod, TensorDictSequential as Seq
        >>> from torchrl.modules import MLP, ProbabilisticActor, TanhNormal
        >>> from torchrl.objectives import SoftUpdate
        >>> from torchrl_seqchunk import RecurrentSACLoss, ResetRNN
        >>> def gru(key):  # one recurrent encoder each, starting every row from the loss's state
        ...     return ResetRNN(nn.GRU(3, 8, batch_first=True), in_key="observation",
        ...                     out_key=f"{key}_features", state_key=f"{key}_state", reset_state_key=f"{key}_state")
        >>> actor_rnn, critic_rnn = gru("actor"), gru("critic")
        >>> actor = ProbabilisticActor(Seq(actor_rnn, Mod(nn.Sequential(nn.Linear(8, 2), NormalParamExtractor()),
        ...     ["actor_features"], ["loc", "scale"])), in_keys=["loc", "scale"], distribution_class=TanhNormal,
        ...     distribution_kwargs={"low": -2.0, "high": 2.0})
        >>> head = Mod(MLP(in_features=9, out_features=1, num_cells=[16]), ["critic_features", "action"],
        ...            ["state_action_value"])
        >>> loss = RecurrentSACLoss(actor, actor_rnn, critic_rnn, critic_rnn, head, target_entropy=-1.0)
        >>> updater = SoftUpdate(loss, tau=0.005)
        >>> flags = torch.zeros(4, 10, 1, dtype=torch.bool)
        >>> chunk = TensorDict({  # a [B, T] chunk, e.g. from StreamChunkSampler(4, 10)
        ...     "observation": torch.randn(4, 10, 3), ("next", "observation"): torch.randn(4, 10, 3),
        ...     "is_first": flags, ("next", "done"): flags, ("next", "terminated"): flags,
        ...     ("next", "reward"): torch.ones(4, 10, 1), "action": torch.rand(4, 10, 1) * 4 - 2,
        ... }, [4, 10])
        >>> out = loss(chunk)
        >>> (out["loss_actor"] + out["loss_qvalue"] + out["loss_alpha"]).backward()
        >>> int(out["recurrent_steps"])  # actor 4 x (10 + 1), critic 4 x 10, target critic 4 x (10 + 1)
        128
    """

    actor_network: ProbabilisticTensorDictSequential
    actor_network_params: TensorDictParams
    target_actor_network_params: TensorDictParams
    qvalue_network: _Critic
    qvalue_network_params: TensorDictParams
    target_qvalue_network_params: TensorDictParams

    def __init__(
        self,
        actor_network: ProbabilisticTensorDictSequential,
        actor_rnn,
        critic_network: TensorDictModuleBase,
        critic_rnn,
        qvalue_head: TensorDictModuleBase | list,
        *,
        num_qvalue_nets: int = 2,
        gamma: float = 0.99,
        n_steps: int = 1,
        alpha_init: float = 1.0,
        min_alpha: float | None = None,
        max_alpha: float | None = None,
        fixed_alpha: bool = False,
        target_entropy: float | str = "auto",
        action_spec=None,
        loss_function: str = "smooth_l1",
        initial_state: str = "carry",
        mask_key: NestedKey | None = None,
        burn_in: int = 0,
        stream_key: NestedKey | None = None,
        overlap: bool = False,
        action_key: NestedKey = "action",
        state_action_value_key: NestedKey = "state_action_value",
        reward_key: NestedKey = ("next", "reward"),
        done_key: NestedKey = ("next", "done"),
        terminated_key: NestedKey = ("next", "terminated"),
        truncated_key: NestedKey = ("next", "truncated"),
    ):
        super().__init__()
        self.gamma = check_real("gamma", gamma, low=0.0, high=1.0)
        self.n_steps = check_int("n_steps", n_steps, low=1)
        self.burn_in = check_int("burn_in", burn_in, low=0)
        if loss_function not in ("l2", "l1", "smooth_l1"):
            raise ValueError(f"loss_function must be 'l2', 'l1' or 'smooth_l1', got {loss_function!r}.")
        if not isinstance(actor_network, ProbabilisticTensorDictSequential):
            raise TypeError(f"actor_network must be a ProbabilisticTensorDictSequential (e.g. TorchRL's "
                            f"ProbabilisticActor with TanhNormal), got {type(actor_network).__name__}.")
        check_rnn(actor_rnn, "actor_rnn", "actor_network")
        check_rnn(critic_rnn, "critic_rnn", "critic_network")
        if actor_rnn is critic_rnn:
            raise ValueError("actor_rnn and critic_rnn are the same module: give the actor and the critic a recurrent "
                             "encoder each (Ni et al. 2022: a shared one lets the actor's gradients shape the "
                             "critic's memory).")
        for arg, network, rnn in (("actor", actor_network, actor_rnn), ("critic", critic_network, critic_rnn)):
            if not _contains(network, rnn):
                raise ValueError(f"{arg}_network does not contain {arg}_rnn: pass the ResetRNN inside it.")
        if unravel_key(actor_rnn.is_first_key) != unravel_key(critic_rnn.is_first_key):
            raise ValueError(f"actor_rnn and critic_rnn read other episode-start flags ({actor_rnn.is_first_key!r}, "
                             f"{critic_rnn.is_first_key!r}): build both with the same is_first_key.")
        heads = list(qvalue_head) if isinstance(qvalue_head, (list, tuple)) else [qvalue_head]
        if len(heads) == 1:
            count = check_int("num_qvalue_nets", num_qvalue_nets, low=1)
            heads += [copy.deepcopy(heads[0]) for _ in range(count - 1)]
            for head in heads[1:]:
                head.reset_parameters_recursive()
        action_key = unravel_key(action_key)
        self.features_keys = [unravel_key(k) for k in heads[0].in_keys if unravel_key(k) != action_key]
        if action_key not in [unravel_key(k) for k in heads[0].in_keys] or not self.features_keys:
            raise ValueError(f"qvalue_head must read the critic's features and {action_key!r} (its in_keys are "
                             f"{heads[0].in_keys}): e.g. TensorDictModule(mlp, ['critic_features', 'action'], "
                             "['state_action_value']).")
        self.carries = Carries(["actor", "critic", "target_critic"], initial_state=initial_state,
                               burn_in=self.burn_in, overlap=overlap, stream_key=stream_key, done_key=done_key,
                               terminated_key=terminated_key, truncated_key=truncated_key)
        self.initial_state, self.loss_function, self.mask_key = initial_state, loss_function, mask_key
        self.keys = dict(action=action_key, value=state_action_value_key, reward=reward_key,
                         done=done_key, terminated=terminated_key, truncated=truncated_key)
        self.rnns = [actor_rnn, critic_rnn]  # a list: not a second registration of the networks' submodules
        warn_uncarried(actor_network, "RecurrentSACLoss")
        warn_uncarried(critic_network, "RecurrentSACLoss")
        self.convert_to_functional(actor_network, "actor_network")
        self.convert_to_functional(_Critic(critic_network, heads), "qvalue_network", create_target_params=True)
        self._alpha_parameters(alpha_init, min_alpha, max_alpha, fixed_alpha)
        self.register_buffer("target_entropy", torch.tensor(self._target_entropy(target_entropy, action_spec)))

    def _alpha_parameters(self, alpha_init, min_alpha, max_alpha, fixed_alpha) -> None:
        alpha_init = check_real("alpha_init", alpha_init, low=0.0, open_low=True)
        bounds = [None if a is None else math.log(check_real(name, a, low=0.0, open_low=True))
                  for name, a in (("min_alpha", min_alpha), ("max_alpha", max_alpha))]
        if None not in bounds and bounds[0] > bounds[1]:
            raise ValueError(f"min_alpha ({min_alpha}) must be <= max_alpha ({max_alpha}).")
        self.log_alpha_bounds, self.fixed_alpha = bounds, bool(fixed_alpha)
        log_alpha = torch.tensor(math.log(alpha_init))
        if self.fixed_alpha:
            self.register_buffer("log_alpha", log_alpha)
        else:
            self.log_alpha = nn.Parameter(log_alpha)

    def _target_entropy(self, target_entropy, action_spec) -> float:
        if target_entropy != "auto":
            return check_real("target_entropy", target_entropy)
        spec = action_spec if action_spec is not None else getattr(self.actor_network, "spec", None)
        if spec is not None and hasattr(spec, "keys") and self.keys["action"] in spec.keys(True):
            spec = spec[self.keys["action"]]
        if spec is None or hasattr(spec, "keys") or not spec.shape:
            raise ValueError("target_entropy='auto' takes minus the action's size from an action spec: pass "
                             "action_spec=env.action_spec (or a spec on the actor), or a number as target_entropy.")
        return -float(spec.shape[-1])

    @property
    def alpha(self) -> torch.Tensor:
        """The temperature ``exp(log_alpha)``, clamped to its bounds, without gradient."""
        low, high = self.log_alpha_bounds
        if low is not None or high is not None:
            self.log_alpha.data.clamp_(low, high)
        return self.log_alpha.detach().exp()

    # -- carry ---------------------------------------------------------------
    def reset_carry(self, mask: torch.Tensor | None = None) -> None:
        """Forget the carried states of the actor, the critic and the target critic: all rows, or
        rows where ``mask`` (bool ``[B]``; with ``stream_key``, ``[S]`` over stream ids).

        Raises:
            ValueError: without ``stream_key``, a mask of other than ``B`` entries."""
        self.carries.reset(mask)

    def get_extra_state(self):
        return self.carries.state()

    def set_extra_state(self, state) -> None:
        self.carries.load(state)

    # -- loss ----------------------------------------------------------------
    def _q(self, features: TensorDictBase, action: torch.Tensor) -> torch.Tensor:
        """Every head's value ``[n, B, T, 1]`` at ``features`` and ``action`` (under the caller's parameters)."""
        td = features.copy()
        td.set(self.keys["action"], action)
        return torch.stack([head(td.copy()).get(self.keys["value"]) for head in self.qvalue_network.heads])

    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        actor_rnn, critic_rnn = self.rnns
        if self.keys["action"] not in tensordict.keys(True):  # before any pass moves a carry
            raise ValueError(f"action_key={self.keys['action']!r} is not in the batch; store the actions taken.")
        warm, tensordict = self.carries.split(tensordict, actor_rnn.is_first_key)
        streams, ended = self.carries.streams(tensordict), self.carries.ends(tensordict)
        common = dict(tensordict=tensordict, warm=warm, streams=streams, ended=ended)
        with self.actor_network_params.to_module(self.actor_network, preserve_module_state=False):
            actor = self.carries.unroll("actor", self.actor_network.det_part, actor_rnn,
                                        value_key=list(self.actor_network.dist_params_keys), **common)
        critic_keys = dict(value_key=self.features_keys)
        with self.qvalue_network_params.to_module(self.qvalue_network, preserve_module_state=False):
            critic = self.carries.unroll("critic", self.qvalue_network.encoder, critic_rnn, bootstrap=False,
                                         **critic_keys, **common)
            chosen = self._q(critic.values, tensordict.get(self.keys["action"]))  # [n, B, T, 1]
        alpha = self.alpha
        with torch.no_grad():
            with self.target_qvalue_network_params.to_module(self.qvalue_network, preserve_module_state=False):
                target = self.carries.unroll("target_critic", self.qvalue_network.encoder, critic_rnn,
                                             **critic_keys, **common)
                next_action, next_log_prob = rsample_and_log_prob(
                    self.actor_network.build_dist_from_params(actor.next_values.detach()))
                next_q = self._q(target.next_values, next_action).min(0).values
            work = tensordict.select(*(self.keys[k] for k in ("reward", "done", "terminated", "truncated")),
                                     actor_rnn.is_first_key, strict=False)
            work.set(("next", "state_value"), next_q - alpha * next_log_prob.unsqueeze(-1))
            value_target = boundary_nstep_targets(
                work, gamma=self.gamma, n_steps=self.n_steps, reward_key=self.keys["reward"],
                done_key=self.keys["done"], terminated_key=self.keys["terminated"],
                truncated_key=self.keys["truncated"], is_first_key=actor_rnn.is_first_key,
            ).get("value_target")
        mask = None if self.mask_key is None else tensordict.get(self.mask_key).reshape(value_target.shape).to(
            value_target.dtype)
        loss_qvalue = distance_loss(chosen, value_target.expand_as(chosen), loss_function=self.loss_function).sum(0)

        pi_action, log_prob = rsample_and_log_prob(self.actor_network.build_dist_from_params(actor.values))
        with self.qvalue_network_params.detach().to_module(self.qvalue_network, preserve_module_state=False):
            pi_q = self._q(critic.values.detach(), pi_action).min(0).values
        log_prob = log_prob.unsqueeze(-1)  # [B, T, 1]
        loss_alpha = -self.log_alpha * (log_prob.detach() + self.target_entropy)
        steps = actor.recurrent_steps + critic.recurrent_steps + target.recurrent_steps
        return TensorDict(
            loss_actor=kept_mean(alpha * log_prob - pi_q, mask),
            loss_qvalue=kept_mean(loss_qvalue, mask),
            loss_alpha=kept_mean(loss_alpha, mask),
            alpha=alpha,
            entropy=kept_mean(-log_prob.detach(), mask),
            td_error=kept_mean((chosen - value_target).abs().mean(0).detach(), mask),
            recurrent_steps=torch.tensor(steps),
            value_target=value_target,
        )
