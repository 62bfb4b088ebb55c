"""Clipped PPO for recurrent policies trained on windows that cross episode boundaries."""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import dispatch
from tensordict.utils import NestedKey, unravel_key
from torchrl.modules import set_recurrent_mode
from torchrl.objectives import ClipPPOLoss
from torchrl.objectives.common import AUTO_LOSS_MASK_KEYS

from ..collect.policy import Watch
from ..recurrent.module import ResetRNN
from .plain_terms import clip_terms, plain_networks
from .slots import BOUNDARY_MODES, reduce_windows, trained_slots

def _check_window_rnns(is_first_key: NestedKey, actor_network, critic_network) -> None:
    """Every ResetRNN of a window loss's networks must restart from the stored memory on the loss's flag."""
    for role, network in (("actor_network", actor_network), ("critic_network", critic_network)):
        for module in network.modules() if network is not None else ():
            if isinstance(module, ResetRNN):
                _check_window_rnn(role, module, is_first_key)


def _check_window_rnn(role: str, rnn: ResetRNN, is_first_key: NestedKey) -> None:
    if rnn.reset_state_keys is None:
        raise ValueError(
            f"a ResetRNN in {role} has reset_state_key=None, so every window would start from "
            f"zeros instead of the stored memory {rnn.state_keys}; build it with reset_state_key "
            "equal to its state_key and carry=False."
        )
    if rnn.is_first_key != is_first_key:
        raise ValueError(
            f"a ResetRNN in {role} reads is_first_key={rnn.is_first_key!r} but the windows carry "
            f"their reset flags under is_first_key={is_first_key!r}; pass the same key to both."
        )
    if rnn.initial is not None:
        raise ValueError(
            f"a ResetRNN in {role} has initial_state='learned', but in a window every reset, an "
            "episode start too, takes the stored memory (the learned state's value when acting, "
            "detached), so the learned state would never be trained; build it with "
            "initial_state='zeros'."
        )


class RecurrentPPOLoss(ClipPPOLoss):
    """TorchRL's clipped PPO loss unrolled over windows ``[N, W]`` of a recurrent actor and critic.

    The actor and critic are called once on the whole window TensorDict ``[N, W]``
    (time last). Their recurrent part must honour the per-slot reset flag
    ``is_first`` and take the stored memory at reset slots: with
    :class:`~torchrl_seqchunk.ResetRNN`, build it with ``reset_state_key`` equal to
    its ``state_key`` and ``carry=False``. Windows come from
    :func:`~torchrl_seqchunk.make_windows`, after
    :func:`~torchrl_seqchunk.boundary_gae` wrote advantages and value targets on the
    rollout (the loss does not estimate them itself: window ends would otherwise be
    bootstrapped by a critic that lacks their memory).

    ``boundary_mode`` chooses which slots train and how the ``"loss_*"`` entries are
    reduced (``reduction="mean"``; ``"sum"`` drops the denominator, ``"none"`` returns
    the weighted per-slot terms ``[N, W]``):

    * ``"reset_continue"`` (default): at every reset slot the memory is the stored
      one (no gradient crosses the boundary) and every slot trains:
      ``sum(loss) / (N * W)``. A step lands in ``W`` windows (stride 1) except
      within ``W - 1`` steps of a rollout end, whatever its episode's length.
    * ``"mask"``: the usual baseline. Slots after the first boundary inside a window
      (the first reset slot past slot 0) are dropped, and the mean still divides by
      all ``N * W`` slots, as common implementations do; so a step ``k`` steps into
      its episode trains in ``min(k + 1, W)`` windows and the loss shrinks with
      shorter episodes.
    * ``"inverse_count"``: every slot trains with weight ``count_weight``
      (``1 / number of windows holding its step``):
      ``sum(w * loss) / sum(w)``, each covered step counting once.

    Diagnostics added to the output (detached): ``"real_slots"`` (slots that train,
    also honouring TorchRL's loss masks such as ``("collector", "mask")``),
    ``"mean_count_weight"`` (mean ``count_weight`` over them) and, for every
    ``"loss_<name>"``, ``"real_mean_<name>"``: its plain mean over real slots, never
    diluted by dropped slots (so comparable across modes and episode lengths).
    TorchRL's other logging entries (``entropy``, ``clip_fraction``, ``kl_approx``,
    ``ESS``, ratios, ``explained_variance``) are computed over all slots as
    :class:`~torchrl.objectives.ClipPPOLoss` computes them on a ``[N, W]`` batch;
    ``ESS`` and ``explained_variance``, which it computes per window position, are
    averaged over the ``W`` positions, so (with ``reduction="mean"`` or ``"sum"``)
    every output entry is a 0-d tensor.

    .. note:: One reduction: during the call ClipPPOLoss runs with ``reduction="none"``
        (TorchRL's per-element contract), so every ``"loss_*"`` entry comes back per
        slot, and this class reduces it once by ``boundary_mode`` with the ``reduction``
        given here. TorchRL's loss masks (``loss_mask_key``) drop slots from both the
        terms and the denominator, as in TorchRL; ``normalize_advantage=True`` standardizes over
        the slots that train (as sb3-contrib's ``RecurrentPPO`` leaves out its padding), given to
        TorchRL as its ``"shifted_valid"`` mask. A dropped slot's inputs must still be
        finite (a NaN advantage, target or log-probability there makes the gradients NaN,
        as in TorchRL's ``ClipPPOLoss``). A log-probability with dims after ``[N, W]`` (an
        element-wise ``Normal``'s ``[N, W, A]``, per-token heads) gives terms per element, as
        in ClipPPOLoss: ``"none"`` returns them ``[N, W, A]``, ``"sum"`` sums them, ``"mean"``
        averages each slot's before reducing over slots (with every slot kept, ClipPPOLoss's
        own mean), and ``"real_mean_*"`` is the mean over the slots that train of each slot's
        mean. :attr:`in_keys` is sorted.

    .. note:: The networks' pass: where TorchRL's forward only reads the windows and calls the
        modules (a ``ProbabilisticActor``-style actor and a critic of ``TensorDictModule`` s and
        :class:`~torchrl_seqchunk.ResetRNN` s without a carry; not with ``functional=True``,
        ``delay_actor``, ``max_importance_ratio``, an ``advantage_norm``, ``separate_losses``,
        per-head entropy coefficients or composite keys), the same modules run on the windows'
        entries as plain tensors and the terms are ClipPPOLoss's operations on them, without its
        TensorDict work: the same values and gradients (tested against ClipPPOLoss). An entropy
        term whose coefficient is 0 stays out of the graph (its value, 0, is kept), and with
        ``diagnostics=False`` only the ``"loss_*"`` entries are computed. Elsewhere ClipPPOLoss's
        own forward runs.

    .. warning:: ``functional`` defaults to ``False`` here, where TorchRL's default is ``True``:
        the networks keep their parameters (the same tensors, in the same order, in
        ``parameters()``) instead of having them swapped in at every call. Pass
        ``functional=True`` for what needs TorchRL's functional parameters (replacing them, a
        proximal actor with ``delay_actor``); its ``state_dict`` names the parameters
        ``actor_network_params.*`` where this default names them ``actor_network.*``, and loading
        one into a loss built the other way is a ValueError that says so.

    Reset-and-continue follows the stored-state strategy of Kapturowski et al.,
    "Recurrent Experience Replay in Distributed Reinforcement Learning" (R2D2),
    ICLR 2019, applied at every episode boundary inside a window; PPO is Schulman
    et al., "Proximal Policy Optimization Algorithms", 2017.

    Args:
        actor_network (ProbabilisticTensorDictSequential): recurrent policy.
        critic_network (TensorDictModule): recurrent value network writing
            ``"state_value"`` ``[N, W, 1]``.

    Keyword Args:
        boundary_mode (str): ``"reset_continue"``, ``"mask"`` or ``"inverse_count"``.
        is_first_key (NestedKey): per-slot reset flag, bool ``[N, W, 1]``. Defaults to
            ``"is_first"`` (also settable with ``set_keys(is_first=...)``).
        count_weight_key (NestedKey): per-slot count weight, float ``[N, W, 1]``.
            Defaults to ``"count_weight"`` (``set_keys(count_weight=...)``).
        diagnostics (bool): compute the logging entries (TorchRL's ``clip_fraction``,
            ``kl_approx``, ``entropy``, ``ESS``, ratios, ``explained_variance``,
            ``value_clip_fraction`` and this class's ``real_slots``, ``mean_count_weight``,
            ``real_mean_*``); ``False``: the ``"loss_*"`` entries alone (e.g. set
            :attr:`diagnostics` on for one batch per rollout). Default ``True``.
        functional (bool): TorchRL's option (see the warning above). Default ``False``.
        **kwargs: every other :class:`~torchrl.objectives.ClipPPOLoss` option
            (``clip_epsilon``, ``entropy_bonus``, ``entropy_coeff``, ``critic_coeff``,
            ``loss_critic_type``, ``clip_value``, ``normalize_advantage``,
            ``reduction``, ...), unchanged.

    Raises:
        ValueError: unknown ``boundary_mode``, or a :class:`~torchrl_seqchunk.ResetRNN`
            in the actor or critic with a learned initial state (it would get no gradient),
            without ``reset_state_key`` or reading another
            ``is_first_key`` (at construction, and in ``set_keys(is_first=...)``); input that is not
            ``[N, W]`` or lacks the advantage, the reset flag or the count weight,
            entries of the wrong shape (the advantage and value target ``[N, W, 1]``), a window whose
            slot 0 is not a reset slot, a stored log-probability neither ``[N, W]`` nor with leading
            dims of the action's (a trailing 1 beside a Categorical's ``[N, W]``), or losses neither
            ``[N, W]`` nor the log-probability's shape (ClipPPOLoss broadcast a stored entry
            against the policy's) (at call time); a ``state_dict`` of a loss built with the other
            ``functional`` (at load time).
        TypeError: ``diagnostics`` or ``functional`` not a bool; a reset flag that is not bool
            (at call time).

    Examples:
        >>> import torch
        >>> from torch import nn
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule, ProbabilisticTensorDictModule
        >>> from tensordict.nn import ProbabilisticTensorDictSequential, TensorDictSequential
        >>> from torchrl_seqchunk import RecurrentPPOLoss, ResetRNN, make_windows
        >>> def rnn(key):
        ...     return ResetRNN(nn.GRUCell(3, 8), in_key="obs", out_key=key + "_h",
        ...                     state_key=key + "_state", reset_state_key=key + "_state",
        ...                     carry=False)
        >>> actor = ProbabilisticTensorDictSequential(
        ...     rnn("actor"), TensorDictModule(nn.Linear(8, 2), ["actor_h"], ["logits"]),
        ...     ProbabilisticTensorDictModule(["logits"], ["action"],
        ...         distribution_class=torch.distributions.Categorical, return_log_prob=True))
        >>> critic = TensorDictSequential(
        ...     rnn("critic"), TensorDictModule(nn.Linear(8, 1), ["critic_h"], ["state_value"]))
        >>> done = torch.zeros(2, 6, 1, dtype=torch.bool)
        >>> done[:, 2] = True
        >>> rollout = TensorDict({
        ...     "obs": torch.randn(2, 6, 3), "action": torch.randint(2, (2, 6)),
        ...     "action_log_prob": torch.full((2, 6), -0.7),
        ...     "actor_state": torch.zeros(2, 6, 8), "critic_state": torch.zeros(2, 6, 8),
        ...     "advantage": torch.randn(2, 6, 1), "value_target": torch.randn(2, 6, 1),
        ...     ("next", "done"): done}, batch_size=[2, 6])
        >>> windows = make_windows(rollout, 4, memory_key=["actor_state", "critic_state"])
        >>> loss = RecurrentPPOLoss(actor, critic, boundary_mode="mask")
        >>> out = loss(windows)
        >>> out["real_slots"].item(), windows.numel()  # slots 0..2, 0..1, 0 of each row's windows
        (12, 24)
        >>> sum(out[k] for k in out.keys() if k.startswith("loss_")).backward()
    """

    @dataclass
    class _AcceptedKeys(ClipPPOLoss._AcceptedKeys):
        """ClipPPOLoss's keys plus ``is_first`` and ``count_weight`` (see the class docstring)."""

        is_first: NestedKey = "is_first"
        count_weight: NestedKey = "count_weight"

    default_keys = _AcceptedKeys
    tensor_keys: _AcceptedKeys

    def __init__(
        self,
        actor_network=None,
        critic_network=None,
        *,
        boundary_mode: str = "reset_continue",
        is_first_key: NestedKey = "is_first",
        count_weight_key: NestedKey = "count_weight",
        diagnostics: bool = True,
        functional: bool = False,
        **kwargs,
    ):
        if boundary_mode not in BOUNDARY_MODES:
            raise ValueError(
                f"boundary_mode must be one of {BOUNDARY_MODES}, got {boundary_mode!r}."
            )
        for name, value in (("diagnostics", diagnostics), ("functional", functional)):
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be a bool, got {value!r}.")
        _check_window_rnns(unravel_key(is_first_key), actor_network, critic_network)
        super().__init__(actor_network, critic_network, functional=functional, **kwargs)
        self.boundary_mode = boundary_mode
        self._diagnostics = diagnostics
        self._plain = None  # (the networks' watches, their plain-tensor walk or None)
        self._entropy_weighs = None  # (the entropy coefficient's buffer and version, whether it is not 0)
        self.set_keys(is_first=is_first_key, count_weight=count_weight_key)
        self.register_load_state_dict_pre_hook(_refuse_other_layout)

    @property
    def diagnostics(self) -> bool:
        """Whether a call computes the logging entries (see the class docstring); settable, e.g. to
        log one batch per rollout."""
        return self._diagnostics

    @diagnostics.setter
    def diagnostics(self, value: bool) -> None:
        if not isinstance(value, bool):
            raise TypeError(f"diagnostics must be a bool, got {value!r}.")
        self._diagnostics, self._out_keys = value, None

    def set_keys(self, **kwargs) -> None:
        """ClipPPOLoss's ``set_keys``; a new ``is_first`` checked as ``is_first_key`` is (ValueError)."""
        if "is_first" in kwargs and hasattr(self, "actor_network"):
            _check_window_rnns(unravel_key(kwargs["is_first"]), self.actor_network, getattr(self, "critic_network", None))
        super().set_keys(**kwargs)

    @property
    def in_keys(self):
        """ClipPPOLoss's input keys plus ``is_first`` and ``count_weight``, sorted (a fixed order)."""
        keys = {*ClipPPOLoss.in_keys.fget(self), self.tensor_keys.is_first, self.tensor_keys.count_weight}
        return sorted(keys, key=lambda key: (key,) if isinstance(key, str) else key)

    @in_keys.setter
    def in_keys(self, values):
        ClipPPOLoss.in_keys.fset(self, values)

    @property
    def out_keys(self):
        if self._out_keys is None:
            keys = list(super().out_keys)
            losses = [key for key in keys if key.startswith("loss_")]
            if self.diagnostics:
                self._out_keys = keys + ["real_slots", "mean_count_weight"] + [f"real_mean_{key[5:]}" for key in losses]
            else:
                self._out_keys = losses
        return self._out_keys

    @out_keys.setter
    def out_keys(self, values):
        self._out_keys = values

    @contextmanager
    def _per_slot_terms(self):
        """ClipPPOLoss reduces with ``self.reduction``: run it with ``"none"`` for per-slot terms."""
        reduction, self.reduction = self.reduction, "none"
        try:
            yield reduction
        finally:
            self.reduction = reduction

    def _input_mask(self, tensordict: TensorDictBase) -> torch.Tensor | None:
        """TorchRL's loss masks found in the input (see ``loss_mask_key``), ANDed, bool ``[N, W]``."""
        key = self.loss_mask_key
        keys = () if key is None else AUTO_LOSS_MASK_KEYS if key == "auto" else (key,)
        mask = None
        for mask_key in keys:
            value = tensordict.get(mask_key, None)
            if value is not None:
                value = value.reshape(tensordict.batch_size).bool()
                mask = value if mask is None else mask & value
        return mask

    def _window_entry(self, tensordict: TensorDictBase, name: str, *, trailing=((), (1,)),
                      required: bool = True) -> torch.Tensor | None:  # [N, W]; trailing: dims allowed after
        key = getattr(self.tensor_keys, name)
        value = tensordict.get(key, None)
        if value is None and not required:
            return None
        if value is None:
            fix = (
                "run boundary_gae on the rollout before make_windows"
                if name == "advantage"
                else "build the windows with make_windows"
            )
            raise ValueError(f"{name}_key={key!r} is not in the windows; {fix}.")
        if value.shape[:2] != tensordict.batch_size or value.shape[2:] not in trailing:
            raise ValueError(
                f"{name}_key={key!r} has shape {tuple(value.shape)}, expected "
                f"{(*tensordict.batch_size, 1)}."
            )
        return value.reshape(tensordict.batch_size)

    def _slots(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, torch.Tensor]:
        """Checks the windows; returns which slots train (bool) and ``count_weight``, ``[N, W]``."""
        if tensordict.batch_dims != 2:
            raise ValueError(
                f"tensordict has batch_size={tuple(tensordict.batch_size)}; RecurrentPPOLoss "
                "expects windows [N, W] (time last), e.g. from make_windows."
            )
        self._window_entry(tensordict, "advantage", trailing=((1,),))  # ClipPPOLoss's batch: its shape[:-1]
        self._window_entry(tensordict, "value_target", trailing=((1,),), required=False)
        is_first = self._window_entry(tensordict, "is_first")
        if is_first.dtype != torch.bool:
            raise TypeError(
                f"is_first_key={self.tensor_keys.is_first!r} has dtype {is_first.dtype}; "
                "reset flags must be torch.bool."
            )
        if not is_first[:, 0].all():
            raise ValueError(
                f"is_first_key={self.tensor_keys.is_first!r} is False at slot 0 of window "
                f"{int((~is_first[:, 0]).nonzero()[0])}; every window starts from its stored "
                "memory, so slot 0 must be a reset slot (make_windows sets it)."
            )
        count_weight = self._window_entry(tensordict, "count_weight")
        return trained_slots(is_first, self.boundary_mode), count_weight

    def _log_prob_event(self, tensordict: TensorDictBase) -> tuple | None:
        """The stored log-probability's dims after ``[N, W]``: none, or leading dims of the
        action's (an element-wise ``Normal``'s ``[N, W, A]``, per-token heads' ``[N, W, K]``);
        ``None`` where the keys are lists (a composite policy's heads)."""
        keys = self.tensor_keys.sample_log_prob, self.tensor_keys.action
        if not all(isinstance(key, (str, tuple)) for key in keys):
            return None
        stored, action = (tensordict.get(key, None) for key in keys)
        if not isinstance(stored, torch.Tensor):
            return None
        event = tuple(stored.shape[2:])
        if event and not (isinstance(action, torch.Tensor) and tuple(action.shape[2 : 2 + len(event)]) == event):
            raise ValueError(
                f"sample_log_prob_key={keys[0]!r} has shape {tuple(stored.shape)} beside the action's "
                f"{None if action is None else tuple(action.shape)}: a policy's log-probability is [N, W] "
                "(Categorical, TanhNormal, an Independent distribution) or has leading dims of the action's "
                "(an element-wise one); store it as the policy writes it (ClipPPOLoss would broadcast a "
                "trailing 1 against the policy's [N, W])."
            )
        return event

    def _plain_path(self):
        """``(input keys, actor steps, distribution module, critic steps)`` that compute the
        networks' outputs on plain tensors, or ``None`` where ClipPPOLoss's own forward runs: its
        parameters swapped in (``functional=True``), a proximal actor, a capped ratio, an advantage
        ``ValueNorm``, separate losses, per-head entropy coefficients, composite keys, or a module
        that runs only on a TensorDict. Rebuilt when the networks' modules or hooks change."""
        keys = self.tensor_keys
        if (self.functional or self.delay_actor or self.separate_losses or self.max_importance_ratio is not None
                or self.advantage_norm is not None or self._entropy_coeff_map is not None
                or not all(isinstance(k, (str, tuple)) for k in (keys.sample_log_prob, keys.action, keys.value))):
            return None
        if self._plain is None or any(watch.changed() for watch in self._plain[0]):
            critic = self.critic_network if self._has_critic else None
            watches = [Watch(self.actor_network)] + ([] if critic is None else [Watch(critic)])
            self._plain = (watches, plain_networks(self.actor_network, critic))
        return self._plain[1]

    @dispatch
    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Clipped PPO losses of windows ``[N, W]``, reduced once by ``boundary_mode``.

        ClipPPOLoss's terms are computed per slot (its ``reduction="none"``; on plain tensors where
        the networks allow it, see the class docstring); they are then reduced by
        :func:`~torchrl_seqchunk.ppo.slots.reduce_windows` with this loss's ``reduction``.
        Returns ClipPPOLoss's entries plus ``"real_slots"``, ``"mean_count_weight"`` and
        ``"real_mean_<name>"`` for every ``"loss_<name>"`` (the ``"loss_*"`` entries alone without
        :attr:`diagnostics`).
        """
        trains, count_weight = self._slots(tensordict)
        event = self._log_prob_event(tensordict)
        input_mask = self._input_mask(tensordict)
        every = self.boundary_mode != "mask" and input_mask is None  # every slot trains (no select needed)
        real = trains if input_mask is None else trains & input_mask
        if self.normalize_advantage and not every and (self.boundary_mode == "mask" or not real.all()):
            # over the slots that train, one estimator for every batch
            tensordict = tensordict.copy().set("shifted_valid", real)
        plain = self._plain_path()
        with self._per_slot_terms() as reduction:
            if plain is not None:
                out = clip_terms(self, tensordict, *plain)  # per element: reduced as ClipPPOLoss reduces them
                out.update({name: self._reduce_loss(value, tensordict).squeeze(-1)
                            for name, value in out.items() if name.startswith("loss_")})
            else:
                with set_recurrent_mode(True):
                    out = dict(super().forward(tensordict).items())
                if not self.diagnostics:
                    out = {name: value for name, value in out.items() if name.startswith("loss_")}
        weight = count_weight if self.boundary_mode == "inverse_count" else None
        kept = None if every else real
        for name in [key for key in out if key.startswith("loss_")]:
            terms = out[name]  # [N, W], or [N, W, *event] per element of the log-probability
            if terms.shape[:2] != trains.shape or (event is not None and terms.shape[2:] not in ((), event)):
                stored = tensordict.get(self.tensor_keys.sample_log_prob, None) if event is not None else None
                raise ValueError(  # ClipPPOLoss broadcast a stored entry against the policy's
                    f"ClipPPOLoss gave {name} of shape {tuple(terms.shape)} for windows "
                    f"{tuple(trains.shape)}: a stored entry broadcast against the policy's output, e.g. "
                    f"sample_log_prob_key={self.tensor_keys.sample_log_prob!r} of shape "
                    f"{None if stored is None else tuple(stored.shape)}; store it as the policy writes it."
                )
            per_slot = terms.flatten(2).mean(-1) if terms.dim() > 2 else terms
            if self.diagnostics:
                out[f"real_mean_{name[5:]}"] = per_slot.detach().mean() if every else per_slot.detach()[real].mean()
            if terms.dim() > 2 and reduction != "mean":  # "sum" sums and "none" keeps the terms, as ClipPPOLoss
                view = (*trains.shape, *[1] * (terms.dim() - 2))
                out[name] = reduce_windows(terms, None if kept is None else kept.view(view),
                                           None if weight is None else weight.view(view), input_mask, reduction)
            else:
                out[name] = reduce_windows(per_slot, kept, weight, input_mask, reduction)
        if self.diagnostics:
            for name in ("ESS", "explained_variance"):
                # ClipPPOLoss reduces these over dim 0 only: one value per window position
                if name in out:
                    out[name] = out[name].mean()
            out["real_slots"] = real.sum()
            out["mean_count_weight"] = count_weight.mean() if every else count_weight[real].mean()
        return TensorDict(out, batch_size=[])


def _refuse_other_layout(loss, state_dict, prefix, *args) -> None:
    """A ``state_dict`` saved by a loss built with the other ``functional`` names its parameters
    otherwise: a ValueError naming the option, before torch's list of missing keys."""
    theirs = "actor_network." if loss.functional else "actor_network_params."
    if any(key.startswith(prefix + theirs) for key in state_dict):
        raise ValueError(
            f"this state_dict names the actor's parameters {theirs}*: it was saved by a RecurrentPPOLoss built "
            f"with functional={not loss.functional}; build this one with functional={not loss.functional} to load it."
        )
