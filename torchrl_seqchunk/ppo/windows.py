"""Fixed-length training windows cut from on-policy rollouts, with per-slot reset flags."""
from __future__ import annotations

from collections.abc import Sequence

import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey

from .._checks import check_int


def make_windows(
    rollout: TensorDictBase,
    window: int,
    stride: int = 1,
    *,
    memory_key: NestedKey | Sequence[NestedKey] = "recurrent_state",
    is_first_key: NestedKey = "is_first",
    init_key: NestedKey | None = "is_init",
    done_key: NestedKey = ("next", "done"),
    terminated_key: NestedKey = ("next", "terminated"),
    truncated_key: NestedKey = ("next", "truncated"),
    count_weight_key: NestedKey = "count_weight",
) -> TensorDictBase:
    """Cuts windows of ``window`` consecutive steps from every row of a rollout.

    Windows start at steps ``0, stride, 2 * stride, ...`` of each row while they fit
    (``start + window <= T``) and never cross from one row (env) into another; they
    may cross episode boundaries inside a row. Window ``n = e * S + j`` (``S``
    starts per row) is row ``e`` from step ``j * stride``. Every entry of the
    rollout is kept, so the stored recurrent memory (the memory the policy had at
    each step, written by :class:`~torchrl_seqchunk.ResetRNN` in step mode) and,
    when :func:`~torchrl_seqchunk.boundary_gae` ran on the rollout first, the
    advantages and value targets travel with their steps. Two entries are written:

    * ``is_first_key``: bool ``[N, W, 1]``, the per-slot reset flag. True at slot 0
      (a window starts from the stored memory) and at every slot whose previous
      step was done, terminated or truncated, or that the rollout itself marks as
      an episode start. A recurrent module built with ``reset_state_key=memory_key``
      replaces its memory by the stored one at these slots. The same flags go under
      ``init_key`` (TorchRL's ``is_init``): a TorchRL ``LSTMModule`` / ``GRUModule`` in
      recurrent mode restarts from the stored memory at slot 0 and at every ``is_init``,
      which is ``"reset_continue"`` as it is.
    * ``count_weight_key``: float ``[N, W, 1]``, ``1 / (number of windows holding
      the slot's step)``, so that the weights of every covered step sum to 1.

    The last step of a row needs no done or truncated flag: a window never runs past
    it, so it is handled as a chunk end (and ``boundary_gae`` bootstraps it from
    ``("next", "state_value")``). When ``(T - window) % stride != 0`` the last
    ``(T - window) % stride`` steps of each row are in no window, and with
    ``stride > window`` neither are the ``stride - window`` steps between windows.

    Args:
        rollout: batch size ``[num_envs, T]`` (time last), as a TorchRL collector
            returns it; needs ``done_key`` (bool ``[num_envs, T, 1]``) and the memory
            entries ``[num_envs, T, *state]``.
        window (int): window length ``W``, ``1 <= W <= T``.
        stride (int): steps between consecutive window starts, ``>= 1``. Defaults
            to 1 (a window at every step).

    Keyword Args:
        memory_key (NestedKey or list of NestedKey): stored memory entries that must
            be present (pass ``rnn.state_keys`` of the actor and critic, for
            instance). A tuple of strings is one nested key; a tuple holding
            tuples, like a list, is several keys. Defaults to ``"recurrent_state"``.
        is_first_key (NestedKey): episode-start flag of the rollout, overwritten
            with the per-slot reset flag. Defaults to ``"is_first"``.
        init_key (NestedKey, optional): TorchRL's episode-start flag, read beside
            ``is_first_key`` (a step either marks starts an episode) and overwritten with the
            per-slot reset flag too; ``None``: neither. Defaults to ``"is_init"``.
        done_key, terminated_key, truncated_key (NestedKey): episode-end flags;
            ``terminated_key`` and ``truncated_key`` are used when present. Every
            flag, ``is_first_key`` included, must be bool ``[num_envs, T, 1]``.
        count_weight_key (NestedKey): where the count weight goes. Defaults to
            ``"count_weight"``.

    Returns:
        A new TensorDict of batch size ``[num_envs * S, window]``,
        ``S = (T - window) // stride + 1``.

    Raises:
        TypeError: ``rollout`` is not a TensorDict, ``window``/``stride`` are not
            integers (``int`` or numpy integers), or a flag is not bool ``[num_envs, T, 1]``.
        ValueError: ``rollout`` is not ``[num_envs, T]``, ``window`` outside
            ``[1, T]``, ``stride < 1``, or a memory or done entry is missing.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_seqchunk import make_windows
        >>> done = torch.tensor([[False, True, False, False]]).unsqueeze(-1)
        >>> rollout = TensorDict({
        ...     "recurrent_state": torch.zeros(1, 4, 8),
        ...     ("next", "done"): done,
        ... }, batch_size=[1, 4])
        >>> windows = make_windows(rollout, 3)
        >>> windows.batch_size
        torch.Size([2, 3])
        >>> windows["is_first"].squeeze(-1)
        tensor([[ True, False,  True],
                [ True,  True, False]])
        >>> windows["count_weight"].squeeze(-1)
        tensor([[1.0000, 0.5000, 0.5000],
                [0.5000, 0.5000, 1.0000]])
    """
    if not isinstance(rollout, TensorDictBase):
        raise TypeError(
            f"rollout must be a TensorDict, got {type(rollout).__name__}; pass the "
            "collector's output TensorDict of batch size [num_envs, T]."
        )
    if rollout.batch_dims != 2:
        raise ValueError(
            f"rollout has batch_size={tuple(rollout.batch_size)}, expected [num_envs, T]; "
            "add the env dimension with rollout.unsqueeze(0) or flatten extra ones."
        )
    num_envs, steps = rollout.batch_size
    window = check_int("window", window, low=1, high=steps)  # at most the rollout's T
    stride = check_int("stride", stride, low=1)

    one_key = isinstance(memory_key, str) or (
        isinstance(memory_key, tuple) and all(isinstance(part, str) for part in memory_key)
    )
    memory_keys = [memory_key] if one_key else list(memory_key)
    for key in memory_keys:
        if rollout.get(key, None) is None:
            raise ValueError(
                f"memory_key={key!r} is not in the rollout; the recurrent policy must "
                "store the memory it used at every step (ResetRNN does in step mode), "
                "or pass the key(s) that hold it as memory_key."
            )

    flags = {}
    for arg, key in (
        ("done_key", done_key),
        ("terminated_key", terminated_key),
        ("truncated_key", truncated_key),
        ("is_first_key", is_first_key),
        ("init_key", init_key),
    ):
        if key is None:
            continue
        flag = rollout.get(key, None)
        if flag is None:
            if arg == "done_key":
                raise ValueError(
                    f"done_key={key!r} is not in the rollout; pass the key of the "
                    "episode-end flag as done_key."
                )
            continue
        if flag.dtype != torch.bool or tuple(flag.shape) != (num_envs, steps, 1):
            raise TypeError(
                f"{arg}={key!r} must be bool of shape {(num_envs, steps, 1)}, got "
                f"{flag.dtype} of shape {tuple(flag.shape)}; convert it with "
                ".bool().reshape(num_envs, T, 1)."
            )
        flags[arg] = flag
    is_first = flags.pop("is_first_key", None)
    stored_init = flags.pop("init_key", None)
    if stored_init is not None:  # an episode start either flag marks
        is_first = stored_init if is_first is None else is_first | stored_init
    ended = torch.stack(list(flags.values())).any(0)

    # reset[e, t]: step t begins an episode (its predecessor ended, or the rollout says so)
    reset = torch.ones_like(ended)
    reset[:, 1:] = ended[:, :-1]
    if is_first is not None:
        reset = reset | is_first

    device = ended.device
    starts = torch.arange(0, steps - window + 1, stride, device=device)
    index = starts[:, None] + torch.arange(window, device=device)  # [S, W]
    windows = rollout[:, index].reshape(num_envs * len(starts), window)  # [E * S, W], E = 0 too

    slot_reset = reset[:, index]  # [E, S, W, 1]
    slot_reset[:, :, 0] = True
    counts = torch.zeros(steps, device=device).index_add_(
        0, index.reshape(-1), torch.ones(index.numel(), device=device)
    )
    count_weight = (1.0 / counts[index]).expand(num_envs, *index.shape)
    windows.set(is_first_key, slot_reset.reshape(windows.shape[0], window, 1))
    if init_key is not None:
        windows.set(init_key, windows.get(is_first_key))
    windows.set(count_weight_key, count_weight.reshape(windows.shape[0], window, 1))
    return windows
