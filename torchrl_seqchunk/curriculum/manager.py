""":class:`ResetManager`: the starting-point schedule of a reverse curriculum (pure logic).

Reverse curriculum from a single demonstration (Salimans & Chen 2018); reference
implementation: openai/atari-reset (``ResetManager`` in ``atari_reset/wrappers.py``).
"""
from __future__ import annotations

import torch

from .._checks import check_int, check_real

__all__ = ["ResetManager"]


class ResetManager:
    """Shared starting-point schedule of a reverse curriculum (pure logic).

    Algorithm (Salimans & Chen 2018; openai/atari-reset ``ResetManager``):

    - :meth:`assign`: env ``i`` of ``num_envs`` starts at
      ``max(maximum - (i * window) // num_envs, 0)``, i.e. the envs are
      staggered evenly over ``window`` demo steps below the current maximum.
    - :meth:`record`: collects finished episodes as (starting point, success).
    - :meth:`update`: the success rate of each starting point is the fraction
      of the recorded batch's episodes from that point that succeeded; it
      overwrites the stored rate of that point (stored rates of other points
      are multiplied by ``decay`` first). The new maximum is the first index
      ``i`` where the cumulative sum of stored rates from index 0 reaches
      ``move_threshold * min(window, i + 1)`` (the mass the points ``0..i``
      can hold, so the maximum can reach 0), if that index is at or below the
      current maximum. If no point at or below the current maximum reaches the
      mass (success collapsed where episodes now start), the maximum is nudged
      forward by ``nudge``, capped at ``demo_length - 1``: the rates of points
      above the maximum, measured before it moved back below them, do not hold
      it there. With ``decay < 1`` the stored rates shrink at every update, so
      the nudge can also follow a batch of successes whose points do not make
      the mass by themselves. So 0 is not final either: where too few episodes from the env's
      own start succeed, the maximum goes back up by ``nudge`` and returns.

    .. note::
        The schedule moves backward by itself only with at least two distinct
        starting points in play (``num_envs >= 2`` and ``window >= 2``): a mass
        first reached at the maximum itself leaves it there, so a single env keeps
        its starting point unless the maximum is set by hand.

    .. note::
        The reference moves the maximum to the first index that reaches the mass,
        forward too; here it moves forward only by ``nudge`` (a measured point
        above the maximum is not trusted to hold after the policy changed).

    .. note::
        Choices the reference leaves implicit: its rates never expire (our
        ``decay=1.0``); it updates every 1024 vectorized steps, we every
        ``update_every`` finished episodes (:attr:`due`).

    Args:
        demo_length (int): number of demo steps ``N``; starting points are
            ``0 .. N - 1``.
        num_envs (int): envs sharing the schedule.

    Keyword Args:
        move_threshold (float): success mass per window step needed to move
            back. Defaults to ``0.1``.
        nudge (int): demo steps to move forward when success collapses.
            Defaults to ``100``.
        window (int, optional): span of starting points below the maximum.
            Defaults to ``num_envs``.
        update_every (int, optional): finished episodes per update. Defaults to
            ``num_envs``.
        decay (float): factor in ``(0, 1]`` applied to stored rates at each
            update that folds in at least one episode. Defaults to ``1.0`` (rates
            are kept until overwritten).
        maximum (int, optional): initial maximum. Defaults to ``N - 1``.

    Raises:
        TypeError: a count or ``maximum`` is not an int (Python or NumPy, not
            bool), or ``move_threshold``/``decay`` not a real number.
        ValueError: a count is not positive, ``decay`` is outside ``(0, 1]``,
            ``move_threshold`` is not positive, ``move_threshold * window``
            exceeds ``max(min(num_envs, window) - 1, 1)`` (the most success mass
            the window's points below the maximum can hold, so it could never
            move back by itself), or ``maximum`` is outside ``[0, N - 1]``.

    Examples:
        >>> manager = ResetManager(1000, 8, window=32)
        >>> manager.maximum = 900
        >>> manager.assign().tolist()
        [900, 896, 892, 888, 884, 880, 876, 872]
        >>> manager.record(torch.tensor([500, 501, 502, 503]), torch.ones(4, dtype=torch.bool))
        >>> manager.update()
        503
    """

    def __init__(
        self,
        demo_length: int,
        num_envs: int,
        *,
        move_threshold: float = 0.1,
        nudge: int = 100,
        window: int | None = None,
        update_every: int | None = None,
        decay: float = 1.0,
        maximum: int | None = None,
    ) -> None:
        window = num_envs if window is None else window
        update_every = num_envs if update_every is None else update_every
        counts = {
            "demo_length": demo_length,
            "num_envs": num_envs,
            "window": window,
            "update_every": update_every,
            "nudge": nudge,
        }
        demo_length, num_envs, window, update_every, nudge = (
            check_int(name, value, low=1) for name, value in counts.items()
        )
        move_threshold = check_real("move_threshold", move_threshold, low=0.0, open_low=True)
        decay = check_real("decay", decay, low=0.0, high=1.0, open_low=True)
        # the distinct starting points below the maximum (one env or a window of 1 has none: documented)
        below = max(min(num_envs, window) - 1, 1)
        if move_threshold * window > below:
            raise ValueError(
                f"move_threshold * window = {move_threshold * window:g} exceeds the success mass the "
                f"{below} distinct starting points below the maximum can reach (a mass first reached "
                "at the maximum leaves it there), so it could never move back; lower move_threshold "
                "or window, or add envs."
            )
        self.demo_length, self.num_envs = demo_length, num_envs
        self.move_threshold, self.nudge, self.window = move_threshold, nudge, window
        self.update_every, self.decay = update_every, decay
        self.maximum = demo_length - 1 if maximum is None else maximum
        self.rates = torch.zeros(demo_length, dtype=torch.float64)
        self.last_success_rate = float("nan")
        self._points: list[torch.Tensor] = []
        self._successes: list[torch.Tensor] = []

    @property
    def maximum(self) -> int:
        """The current maximum starting point, an int in ``[0, demo_length - 1]``.

        Raises:
            TypeError: on assignment of a non-int, at once (not later, in a worker).
            ValueError: on assignment of an int outside that range, at once.
        """
        return self._maximum

    @maximum.setter
    def maximum(self, value: int) -> None:
        self._maximum = check_int("maximum", value, low=0, high=self.demo_length - 1)

    def assign(self) -> torch.Tensor:
        """Starting points for all envs: int64 ``[num_envs]``."""
        offsets = torch.arange(self.num_envs) * self.window // self.num_envs
        return (self.maximum - offsets).clamp_min(0)

    def record(self, starting_points, successes) -> None:
        """Adds finished episodes.

        Args:
            starting_points: integer tensor/array ``[M]`` in ``[0, demo_length)``.
            successes: bool tensor/array ``[M]``, True where the episode ended
                at least as well as the demo.

        Raises:
            TypeError: ``starting_points`` is not integer or ``successes`` not bool.
            ValueError: shapes differ or a starting point is out of range.
        """
        points, successes = torch.as_tensor(starting_points), torch.as_tensor(successes)
        if points.numel() == 0 and successes.numel() == 0:
            return  # no episode ended (a plain [] has no integer dtype to check)
        if points.is_floating_point() or points.is_complex() or points.dtype == torch.bool:
            raise TypeError(
                f"starting_points must be integers, got dtype {points.dtype}; pass the int64 "
                "points the episodes started from."
            )
        if successes.dtype != torch.bool:
            raise TypeError(
                f"successes must be bool, got dtype {successes.dtype}; pass one True/False per "
                "episode (e.g. score >= demo.total), not a rate."
            )
        points, successes = points.reshape(-1).long(), successes.reshape(-1)
        if points.shape != successes.shape:
            raise ValueError(
                f"starting_points and successes must have the same number of elements, got "
                f"{points.numel()} and {successes.numel()}."
            )
        if points.numel() and (points.min() < 0 or points.max() >= self.demo_length):
            raise ValueError(
                f"starting_points must lie in [0, {self.demo_length - 1}], got range "
                f"[{points.min().item()}, {points.max().item()}]; record the points this "
                "manager assigned."
            )
        self._points.append(points)
        self._successes.append(successes)

    @property
    def num_pending(self) -> int:
        """Finished episodes recorded since the last :meth:`update`."""
        return sum(p.numel() for p in self._points)

    @property
    def due(self) -> bool:
        """True once ``update_every`` episodes are pending."""
        return self.num_pending >= self.update_every

    def update(self) -> int:
        """Folds the pending episodes into the rates and moves the maximum; returns it."""
        if self._points:
            points, successes = torch.cat(self._points), torch.cat(self._successes).double()
            counts = torch.bincount(points, minlength=self.demo_length).double()
            wins = torch.bincount(points, weights=successes, minlength=self.demo_length)
            seen = counts > 0
            self.rates *= self.decay
            self.rates[seen] = wins[seen] / counts[seen]
            self.last_success_rate = successes.mean().item()
            self._points, self._successes = [], []
        # the points 0..i hold at most i + 1 rates: near the demo's start the mass shrinks with them
        points = torch.arange(1, self.demo_length + 1, dtype=torch.float64).clamp(max=self.window)
        reached = (self.rates.cumsum(0) >= self.move_threshold * points - 1e-9).nonzero()
        if len(reached) and int(reached[0]) <= self.maximum:
            self.maximum = int(reached[0])
        else:
            self.maximum = min(self.maximum + self.nudge, self.demo_length - 1)
        return self.maximum

    def state_dict(self) -> dict:
        """Maximum, stored rates (float64 ``[demo_length]``), last batch success rate and pending episodes."""
        return {
            "maximum": self.maximum,
            "rates": self.rates.clone(),
            "last_success_rate": self.last_success_rate,
            "pending_points": torch.cat(self._points) if self._points else torch.zeros(0, dtype=torch.long),
            "pending_successes": torch.cat(self._successes) if self._successes else torch.zeros(0, dtype=torch.bool),
        }

    def load_state_dict(self, state_dict: dict) -> None:
        """Restores :meth:`state_dict`.

        Raises:
            ValueError: it was saved for another demo length, its rates are not in
                ``[0, 1]``, its maximum is outside ``[0, demo_length - 1]`` or a pending
                episode is out of range (the manager is left unchanged).
        """
        rates = torch.as_tensor(state_dict["rates"], dtype=torch.float64)
        if rates.shape != (self.demo_length,):
            raise ValueError(
                f"state_dict['rates'] has shape {tuple(rates.shape)}, expected ({self.demo_length},); "
                "it was saved for a demo of another length."
            )
        if not bool(((rates >= 0) & (rates <= 1)).all()):  # NaN too
            raise ValueError("state_dict['rates'] holds values outside [0, 1] (success rates); it is corrupt.")
        kept = (self._maximum, self.rates, self.last_success_rate, self._points, self._successes)
        try:
            self.maximum = state_dict["maximum"]
            self.rates = rates.clone()
            self.last_success_rate = float(state_dict["last_success_rate"])
            self._points, self._successes = [], []
            self.record(state_dict["pending_points"], state_dict["pending_successes"])
        except Exception:
            self._maximum, self.rates, self.last_success_rate, self._points, self._successes = kept
            raise
