""":class:`RecurrentDQNLoss`: (double) n-step Q-learning on ``[B, T]`` chunks or replay windows.

Each network (online, and the target through TorchRL's target parameters) is unrolled
once per batch by :func:`~torchrl_seqchunk.offpolicy.unroll.unroll_with_next`, which
yields the values at every step and at every step's next observation under the right
memory; :func:`~torchrl_seqchunk.boundary_nstep_targets` sums them into targets. The
loss holds the carried state of each network itself (``initial_state="carry"``), so
what a stream carries to its next chunk is the state of the pass over that stream,
whatever else the loss runs; with ``stream_key`` it keeps one carry per stream id, so
that a batch may hold any of the streams (e.g. ``P`` streams trained ``B`` rows at a time).
"""
from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModuleBase, TensorDictParams
from tensordict.utils import NestedKey
from torchrl.objectives import LossModule
from torchrl.objectives.utils import distance_loss

from .._checks import check_int, check_real
from ..recurrent.torchrl_modules import warn_uncarried
from .carry import Carries, check_rnn, kept_mean
from .targets import boundary_nstep_targets

__all__ = ["RecurrentDQNLoss"]


class RecurrentDQNLoss(LossModule):
    """Recurrent (double) n-step DQN loss on ``[B, T]`` chunks, right at every boundary.

    For every step the chosen action's online value ``Q(s_t, a_t)`` regresses on the
    n-step target of :func:`~torchrl_seqchunk.boundary_nstep_targets`, whose bootstrap
    ``V'_t`` is ``Q_target(s', argmax_a Q_online(s', a))`` (double DQN) or
    ``max_a Q_target(s', a)``, ``s'`` the observation step ``t`` reaches, under the
    memory after step ``t`` (see :func:`~torchrl_seqchunk.offpolicy.unroll.unroll_with_next`).
    Where each row starts (``initial_state``):

    * ``"carry"``: from the state each network (online and target, each its own)
      reached at the end of the previous batch's same row, detached (stream chunks
      from :class:`~torchrl_seqchunk.StreamChunkSampler`; truncated BPTT, no burn-in
      unless ``overlap``);
      with ``stream_key``, at the end of the last batch that held the row's stream
      (zeros for a stream never seen); with ``overlap=True``, ``burn_in`` steps before
      that end (see below);
    * ``"stored"``: from the memory the actor stored at the row's first step,
      ``tensordict[rnn.state_keys][:, 0]`` (R2D2's stored state, for replay windows);
    * ``"zero"``: from zeros.

    Every row resets to zeros at ``is_first`` (also at ``t = 0``) and after a done step,
    also one that ends the previous batch (``"carry"`` keeps zeros for that row).
    With ``burn_in=K`` each network first unrolls every row's first ``K`` steps without
    gradient, from that start, only to rebuild its memory (R2D2's burn-in, Kapturowski et
    al., ICLR 2019); the loss then covers steps ``K..T-1`` from the state reached there.
    With ``initial_state="carry"`` and ``overlap=True``, consecutive batches of a stream
    overlap by ``K`` steps (R2D2's overlapping sequences): each batch's burn-in repeats the
    previous batch's last ``K`` steps, so the carry kept is the state before a row's last
    ``K`` steps, which the next batch unrolls again with the network as it is then (a
    fresher memory than a carry taken at the end). For ``L`` learned steps per row that
    costs ``L`` more recurrent steps per row and network than plain chunks: the burn-in's
    ``K``, and an unroll without gradient over the ``L - K`` steps before the overlap (the
    gradient pass cannot hand over that state without cutting its backpropagation there:
    a ``ResetRNN``'s carried state is detached).
    The target network is TorchRL's (``delay_value=True``: update it with
    ``SoftUpdate`` / ``HardUpdate``).

    Args:
        value_network (TensorDictModuleBase): observations -> ``action_value``
            ``[B, T, n_actions]``, containing ``rnn`` (e.g. encoder, ``rnn``, Q head in a
            ``TensorDictSequential``; the actor adds ``QValueModule`` on top).
        rnn (ResetRNN): the recurrent module inside ``value_network``, with ``carry=True``
            and a ``reset_state_key`` (e.g. the same key as ``state_key``). A TorchRL
            ``LSTMModule`` / ``GRUModule`` goes in wrapped: ``ResetRNN(module,
            reset_state_key=module.in_keys[1:-1])`` (a TypeError otherwise; an unwrapped one
            elsewhere in ``value_network`` is warned about).

    Keyword Args:
        gamma (float): discount in ``[0, 1]``. Default ``0.99``.
        n_steps (int): n of the n-step targets, ``>= 1``. Default ``1``.
        double_dqn (bool): online argmax, target value. Default ``True``.
        delay_value (bool): a target network (else the online one, detached).
            Default ``True``.
        initial_state (str): ``"carry"``, ``"stored"`` or ``"zero"``. Default ``"carry"``.
        loss_function (str): ``"l2"``, ``"l1"`` or ``"smooth_l1"``. Default ``"smooth_l1"``.
        action_space (str): ``"one_hot"`` (``action`` ``[B, T, n_actions]``) or
            ``"categorical"`` (``[B, T]`` or ``[B, T, 1]``). Default ``"one_hot"``.
        mask_key (NestedKey, optional): bool ``[B, T]`` (or ``[B, T, 1]``), the steps that
            count in the loss (e.g. a window's learning region); the others only unroll.
        burn_in (int): steps at the start of every row unrolled without gradient, out of
            the loss and of the targets, ``>= 0`` and below the batch's T. Default ``0``.
        stream_key (NestedKey, optional): ``initial_state="carry"`` only: integer ``[B, T]``
            (or ``[B, T, 1]``), the stream each row continues, the same at every step, in
            ``[0, 2**20)``, no two rows alike. The carry is then kept per stream id, in a
            table of ``max id + 1`` rows (so number the streams ``0..P-1``, e.g. by their row
            in the sampler's chunk, not by trajectory ids); a batch may hold any subset of
            the streams in any order: e.g. a ``[P, T]`` chunk of
            ``StreamChunkSampler(P, T)`` trained ``B`` rows per gradient step, in turn,
            so that consecutive steps see different streams (each stream's carry is then
            ``P / B`` updates old). ``None``: row ``b`` continues row ``b`` of the
            previous batch. Default ``None``.
        overlap (bool): ``initial_state="carry"`` with ``burn_in=K >= 1`` only: each row's
            first ``K`` steps must repeat the last ``K`` of the row's previous batch (the
            caller builds the batches so; nothing checks it), and the carry is the state
            before the row's last ``K`` steps (one more unroll without gradient over the
            steps before them, per network). Batches then need more than ``2 K`` steps per
            row. Default ``False``.
        action_key, action_value_key, reward_key, done_key, terminated_key,
        truncated_key (NestedKey): TorchRL's keys.

    Returns (forward):
        TensorDict with ``"loss"`` (scalar), ``"td_error"`` (mean absolute, detached; both over the
        steps ``mask_key`` keeps, 0 where it keeps none) and
        ``"recurrent_steps"`` (recurrent steps computed by both networks, burn-in and the
        unroll before an overlap included, ``int64``).

    Raises:
        TypeError / ValueError: bad options (construction); at call time, a carried
            state whose rows differ from the batch (call :meth:`reset_carry` when the
            number of streams changes; not with ``stream_key``), stream ids missing, not
            integers (TypeError), out of range, repeated or changing along a row, a batch of at most ``burn_in``
            steps (``2 burn_in`` with ``overlap``), actions missing, of another shape than
            ``action_space`` says or not one-hot / out of range (float indices: TypeError),
            or the errors of ``unroll_with_next``.

    .. note:: The loss holds the carry; it does not use the ``ResetRNN``'s own carry
        (every unroll starts each row explicitly). The carry is in ``state_dict``.

    Examples:
        >>> import torch
        >>> from torch import nn
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule as Mod, TensorDictSequential as Seq
        >>> from torchrl.objectives import SoftUpdate
        >>> from torchrl_seqchunk import RecurrentDQNLoss, ResetRNN
        >>> rnn = ResetRNN(nn.GRU(3, 8, batch_first=True), in_key="observation",
        ...                state_key="q_state", reset_state_key="q_state")
        >>> qnet = Seq(rnn, Mod(nn.Linear(8, 2), ["features"], ["action_value"]))
        >>> loss = RecurrentDQNLoss(qnet, rnn, gamma=0.99, n_steps=3)
        >>> updater = SoftUpdate(loss, tau=0.005)
        >>> flags = torch.zeros(4, 10, 1, dtype=torch.bool)
        >>> chunk = TensorDict({  # a [B, T] chunk, e.g. from StreamChunkSampler(4, 10)
        ...     "observation": torch.randn(4, 10, 3), ("next", "observation"): torch.randn(4, 10, 3),
        ...     "is_first": flags, ("next", "done"): flags, ("next", "terminated"): flags,
        ...     ("next", "reward"): torch.ones(4, 10, 1),
        ...     "action": nn.functional.one_hot(torch.randint(2, (4, 10)), 2),
        ... }, [4, 10])
        >>> out = loss(chunk)
        >>> out["loss"].backward()
        >>> int(out["recurrent_steps"])  # two networks x 4 rows x (10 + 1 chunk end)
        88
    """

    value_network: TensorDictModuleBase
    value_network_params: TensorDictParams
    target_value_network_params: TensorDictParams

    def __init__(
        self,
        value_network: TensorDictModuleBase,
        rnn,
        *,
        gamma: float = 0.99,
        n_steps: int = 1,
        double_dqn: bool = True,
        delay_value: bool = True,
        initial_state: str = "carry",
        loss_function: str = "smooth_l1",
        action_space: str = "one_hot",
        mask_key: NestedKey | None = None,
        burn_in: int = 0,
        stream_key: NestedKey | None = None,
        overlap: bool = False,
        action_key: NestedKey = "action",
        action_value_key: NestedKey = "action_value",
        reward_key: NestedKey = ("next", "reward"),
        done_key: NestedKey = ("next", "done"),
        terminated_key: NestedKey = ("next", "terminated"),
        truncated_key: NestedKey = ("next", "truncated"),
    ):
        super().__init__()
        self.gamma = check_real("gamma", gamma, low=0.0, high=1.0)
        self.n_steps = check_int("n_steps", n_steps, low=1)
        self.burn_in = check_int("burn_in", burn_in, low=0)
        if action_space not in ("one_hot", "categorical"):
            raise ValueError(f"action_space must be 'one_hot' or 'categorical', got {action_space!r}.")
        if loss_function not in ("l2", "l1", "smooth_l1"):
            raise ValueError(f"loss_function must be 'l2', 'l1' or 'smooth_l1', got {loss_function!r}.")
        if double_dqn and not delay_value:
            raise ValueError("double_dqn=True needs delay_value=True (a target network).")
        check_rnn(rnn, "rnn", "value_network")
        self.carries = Carries(["online", "target"], initial_state=initial_state, burn_in=self.burn_in,
                               overlap=overlap, stream_key=stream_key, done_key=done_key,
                               terminated_key=terminated_key, truncated_key=truncated_key)
        self.double_dqn, self.delay_value = bool(double_dqn), bool(delay_value)
        self.initial_state, self.loss_function, self.action_space = initial_state, loss_function, action_space
        self.mask_key, self.stream_key, self.overlap = mask_key, self.carries.stream_key, overlap
        self.keys = dict(action=action_key, action_value=action_value_key, reward=reward_key,
                         done=done_key, terminated=terminated_key, truncated=truncated_key)
        self.rnn = [rnn]  # a list: not a second registration of the network's submodule
        warn_uncarried(value_network, "RecurrentDQNLoss")
        self.convert_to_functional(value_network, "value_network", create_target_params=self.delay_value)

    # -- carry ---------------------------------------------------------------
    def reset_carry(self, mask: torch.Tensor | None = None) -> None:
        """Forget the carried states of both networks: all rows, or rows where ``mask`` (bool
        ``[B]``; with ``stream_key``, bool ``[S]`` over the stream ids ``0..S-1``, any ``S``:
        a stream past it keeps its carry, one not yet seen has none to forget).

        Raises:
            ValueError: without ``stream_key``, a mask of other than ``B`` entries."""
        self.carries.reset(mask)

    @property
    def _carries(self) -> dict:
        """The carried states by network name (``"online"``, ``"target"``)."""
        return self.carries.states

    @_carries.setter
    def _carries(self, states: dict) -> None:
        self.carries.states = dict(states)

    def get_extra_state(self):
        return self.carries.state()

    def set_extra_state(self, state) -> None:
        self.carries.load(state)

    # -- loss ----------------------------------------------------------------
    def _pick(self, values: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """Q of the taken action ``[B, T, 1]``; a ValueError for actions of another shape than
        ``action_space`` says (a broadcast would give a wrong value without an error)."""
        key = self.keys["action"]
        if action is None:
            raise ValueError(f"action_key={key!r} is not in the batch; store the actions taken, or pass the key "
                             "that holds them as action_key.")
        given = list(action.shape)
        if self.action_space == "one_hot":
            if action.shape != values.shape:
                raise ValueError(
                    f"action_space='one_hot' takes one-hot actions shaped as the action values "
                    f"{list(values.shape)} ([B, T, n_actions]), got {key!r} of shape {given}; "
                    "for action indices ([B, T] or [B, T, 1]) pass action_space='categorical'."
                )
            if bool(((action != 0) & (action != 1)).any()) or bool((action.sum(-1) != 1).any()):
                raise ValueError(f"action_space='one_hot' takes one-hot actions, a single 1 per step and 0 elsewhere; "
                                 f"{key!r} holds other values.")
            return (values * action.to(values.dtype)).sum(-1, keepdim=True)
        if action.shape not in (values.shape[:-1], (*values.shape[:-1], 1)):
            raise ValueError(
                f"action_space='categorical' takes action indices shaped {list(values.shape[:-1])} or "
                f"{[*values.shape[:-1], 1]}, got {key!r} of shape {given}; for one-hot "
                "actions ([B, T, n_actions]) pass action_space='one_hot'."
            )
        if action.is_floating_point() or action.is_complex() or action.dtype == torch.bool:
            raise TypeError(f"action_space='categorical' takes integer action indices, got {key!r} of dtype "
                            f"{action.dtype}; convert with .long().")
        if bool(((action < 0) | (action >= values.shape[-1])).any()):
            raise ValueError(f"action indices at {key!r} must be in [0, {values.shape[-1]}) (the action values' "
                             f"last dim), got {int(action.min())} to {int(action.max())}.")
        return values.gather(-1, action.reshape(*values.shape[:-1], 1).long())

    def _unroll(self, params, tensordict: TensorDictBase, name: str, warm, streams, ended):
        with params.to_module(self.value_network, preserve_module_state=False):
            return self.carries.unroll(name, self.value_network, self.rnn[0], tensordict, warm, streams, ended,
                                       value_key=self.keys["action_value"])

    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        warm, tensordict = self.carries.split(tensordict, self.rnn[0].is_first_key)
        streams = self.carries.streams(tensordict)  # one read for both networks
        ended = self.carries.ends(tensordict)
        online = self._unroll(self.value_network_params, tensordict, "online", warm, streams, ended)
        with torch.no_grad():
            if self.delay_value:
                target = self._unroll(self.target_value_network_params, tensordict, "target", warm, streams, ended)
            else:
                target = online
            target_next = target.next_values.detach()
            if self.double_dqn:
                greedy = online.next_values.detach().argmax(-1, keepdim=True)
                next_value = target_next.gather(-1, greedy)
            else:
                next_value = target_next.max(-1, keepdim=True).values
            keys = [self.keys[k] for k in ("reward", "done", "terminated", "truncated")]
            work = tensordict.select(*keys, self.rnn[0].is_first_key, strict=False)
            work.set(("next", "state_value"), next_value)
            work = boundary_nstep_targets(
                work, gamma=self.gamma, n_steps=self.n_steps, reward_key=self.keys["reward"],
                done_key=self.keys["done"], terminated_key=self.keys["terminated"],
                truncated_key=self.keys["truncated"], is_first_key=self.rnn[0].is_first_key,
            )
        chosen = self._pick(online.values, tensordict.get(self.keys["action"], None))  # [B, T, 1]
        value_target = work.get("value_target")
        mask = None if self.mask_key is None else tensordict.get(self.mask_key).reshape(chosen.shape).to(chosen.dtype)
        steps = online.recurrent_steps + (target.recurrent_steps if self.delay_value else 0)
        return TensorDict(
            loss=kept_mean(distance_loss(chosen, value_target, self.loss_function), mask),
            td_error=kept_mean((chosen - value_target).abs().detach(), mask),
            recurrent_steps=torch.tensor(steps),
        )
