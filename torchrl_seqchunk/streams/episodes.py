"""Which episodes a storage holds: write stamps, the drawable-episode index and the tracker.

Small pieces do the bookkeeping for :class:`~torchrl_seqchunk.StreamChunkSampler`,
none of them scanning the whole storage:

- :class:`_WriteLog`: a write stamp per storage slot (how many steps had been written
  before it), fed by the replay buffer's ``extend``/``add`` calls; it keeps the slots
  written since the last sample, in write order, and tells which slots were rewritten
  after a given moment.
- :class:`_Episodes`: the drawable episodes; add and remove in O(1), draw one in
  proportion to its length by a binary search over cumulative lengths.
- :class:`_EpisodeTracker`: reads the end flags of newly written steps only, grows the
  episodes being written (one per trajectory id when the writes interleave several envs),
  files each in :class:`_Episodes` when it ends and removes episodes whose steps were
  overwritten.
"""
from __future__ import annotations

import warnings

import torch
from tensordict import TensorDictBase

_UNSET = torch.iinfo(torch.long).min
_COLLECTOR_TRAJ_KEY = ("collector", "traj_ids")  # written by TorchRL collectors


def _as_long(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long)


class _WriteLog:
    """Write stamp of every storage slot: the number of steps written before it.

    Stamps grow with every write, so a slot whose stamp is ``>= t`` was rewritten after
    the moment the clock read ``t``. ``pending`` keeps the writes not yet read by the
    tracker. Slots filled before any write was recorded (a storage handed to the sampler
    already filled) count as written before everything else, in the storage's time order.
    """

    def __init__(self):
        self.stamps = torch.full((0,), _UNSET, dtype=torch.long)
        self.clock = 0  # stamp of the next written step
        self.origin = 0  # stamp of the oldest step ever written
        self.pending = []  # (slots, stamps) of writes not yet taken, in write order
        self.known = 0  # number of slots holding a stamp
        self.last_slot = None  # slot of the last recorded step (None: none since built)

    def record(self, index: torch.Tensor) -> None:
        index = index.reshape(-1).to("cpu", torch.long)
        skipped = index < 0  # rows a writer did not store (TensorDictMaxValueWriter: -1)
        if skipped.any():
            warnings.warn(
                f"the writer stored only {int((~skipped).sum())} of {index.numel()} written rows "
                "(index -1 for the others, e.g. TensorDictMaxValueWriter): the sampler reads "
                "the stored steps as consecutive, so an episode that lost a step is drawn "
                "without it. Use a writer that stores every step (RoundRobinWriter) for streams.",
                stacklevel=2,
            )
            index = index[~skipped]
        if not index.numel():  # an empty write
            return
        self._grow(int(index.max()) + 1)
        self.known += int((self.stamps[index.unique()] == _UNSET).sum())
        stamps = self.clock + torch.arange(index.numel())
        self.stamps[index] = stamps
        self.pending.append((index, stamps))
        self.clock += index.numel()
        self.last_slot = int(index[-1])

    def _grow(self, size: int) -> None:
        if self.stamps.numel() < size:
            grown = torch.full((size,), _UNSET, dtype=torch.long)
            grown[: self.stamps.numel()] = self.stamps
            self.stamps = grown

    def put_back(self, slots: torch.Tensor, stamps: torch.Tensor) -> None:
        """Returns what :meth:`take_pending` gave to the pending writes (a read that failed)."""
        self.pending.insert(0, (slots, stamps))

    def take_pending(self, size: int, newest: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Slots ``[0, size)`` written since the last call, in write order, with their stamps.

        Slots filled without a recorded write count as written before everything else, in
        ring order after ``newest`` (the slot a wrapped storage wrote last), else slot order.
        """
        self._grow(size)
        unknown = []
        if self.known < size:  # slots filled without a recorded write: older than every write
            unknown = (self.stamps[:size] == _UNSET).nonzero().squeeze(-1)
            if newest is not None:
                unknown = unknown[((unknown - newest - 1) % size).argsort()]
        if len(unknown):
            self.known += unknown.numel()
            self.origin -= unknown.numel()
            stamps = self.origin + torch.arange(unknown.numel())
            self.stamps[unknown] = stamps
            self.pending.insert(0, (unknown, stamps))
        if not self.pending:
            return torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)
        slots, stamps = (torch.cat(parts) for parts in zip(*self.pending))
        self.pending = []
        return slots, stamps

    def state(self) -> dict:
        slots, stamps = self.take_pending(0)  # merged into one entry, kept pending
        self.pending = [(slots, stamps)] if slots.numel() else []
        return {"stamps": self.stamps.clone(), "clock": self.clock, "origin": self.origin,
                "known": self.known, "pending_slots": slots, "pending_stamps": stamps}

    def load(self, state: dict) -> None:
        self.stamps, self.clock = state["stamps"].clone(), state["clock"]
        self.origin, self.known = state["origin"], state["known"]
        slots = state["pending_slots"]
        self.pending = [(slots.clone(), state["pending_stamps"].clone())] if slots.numel() else []


class _Episodes:
    """Drawable episodes, id -> storage slots in time order (DreamerV3 selector style).

    ``add`` appends, ``remove`` swaps the episode with the last one and pops: O(1).
    ``at_step(u)`` for a uniform ``u < total`` picks an episode with P(e) = len(e) / total;
    the cumulative lengths it searches are rebuilt only after a change.
    """

    def __init__(self):
        self.ids, self.slots, self.where = [], [], {}
        self._cumulative = None

    def __len__(self) -> int:
        return len(self.ids)

    def __contains__(self, episode: int) -> bool:
        return episode in self.where

    def add(self, episode: int, slots: torch.Tensor) -> None:
        self.where[episode] = len(self.ids)
        self.ids.append(episode)
        self.slots.append(slots)
        self._cumulative = None

    def remove(self, episode: int) -> None:
        position = self.where.pop(episode)
        last_id, last_slots = self.ids.pop(), self.slots.pop()
        if position < len(self.ids):
            self.ids[position], self.slots[position] = last_id, last_slots
            self.where[last_id] = position
        self._cumulative = None

    def cumulative(self) -> torch.Tensor:
        if self._cumulative is None:
            lengths = torch.tensor([s.numel() for s in self.slots], dtype=torch.long)
            self._cumulative = lengths.cumsum(0)
        return self._cumulative

    @property
    def total(self) -> int:
        return int(self.cumulative()[-1]) if self.ids else 0

    def at_step(self, step: int) -> tuple[int, torch.Tensor]:
        """The episode holding step ``step`` of all episodes laid end to end."""
        position = int(torch.searchsorted(self.cumulative(), torch.tensor([step]), right=True))
        return self.ids[position], self.slots[position]


class _Open:
    """An episode still being written: id, slots so far (in parts; none kept once it is not
    whole, as it can no longer be drawn), whether whole, and how many slots it still owns."""

    __slots__ = ("id", "parts", "whole", "stored")

    def __init__(self, episode, parts, whole, stored=0):
        self.id, self.parts, self.whole, self.stored = episode, parts, whole, stored


class _EpisodeTracker:
    """Finds episodes in the steps written since the last call, in write order.

    It reads the end flags (and trajectory ids) of the new steps only, extends the episodes
    being written (the *open* ones), and files each episode that ends into
    :class:`_Episodes` unless steps of it were lost. An episode whose slots get
    overwritten is removed. ``only_complete=False`` also lets open episodes be drawn. An
    open episode none of whose steps is stored any more is forgotten (a trajectory that
    never ends, e.g. cut by a collector reset), so the bookkeeping never outgrows the storage.

    With end flags alone there is one open episode. With trajectory ids and end flags an
    episode ends at its end flag only: a collector's flattened ``[num_envs, T]`` batch
    interleaves the envs' trajectories, so steps are filed under their trajectory id and a
    trajectory cut by the batch end continues with its steps in the next batch. With
    trajectory ids alone an episode ends where the id changes.
    """

    def __init__(self, end_key, traj_key, only_complete):
        self.end_key, self.traj_key, self.only_complete = end_key, traj_key, only_complete
        self.episodes = _Episodes()
        self.owner = torch.full((0,), -1, dtype=torch.long)  # episode id per slot, -1 none
        self.open = {}  # trajectory id (a tuple; None without stitching) -> _Open
        self.last_traj = None  # trajectory id of the last step read

    def __len__(self) -> int:
        """Number of drawable episodes."""
        return len(self.episodes) + len(self._open_drawable())

    def _open_drawable(self) -> list[_Open]:
        if self.only_complete:
            return []
        return [entry for entry in self.open.values() if entry.whole and entry.parts]

    def update(self, data: TensorDictBase, slots, stamps, alive, after_loss=False) -> None:
        """Reads new steps: ``slots`` in write order with their ``stamps``; ``alive`` is
        False where a slot was written again since (that step is lost); ``after_loss``:
        the step written just before ``slots[0]`` is lost too (a ring that wrapped before
        the sampler saw it). The data is checked before anything changes, so after an
        error the tracker is as it was."""
        # keep the stored steps; an episode with lost steps before one of them is not whole
        lost_just_before = torch.cat([torch.tensor([after_loss]), ~alive[:-1]])
        lost_before = lost_just_before[alive]
        ends = self._read(data, self.end_key, slots[alive], required=self.traj_key is None)
        stitch = ends is not None and self.traj_key is not None  # file steps per trajectory
        if stitch:  # a lost step may be any trajectory's: none written after it is whole
            lost_before = lost_just_before.cumsum(0)[alive] > 0
        written, slots, stamps = slots, slots[alive], stamps[alive]
        if ends is None:
            ends = torch.zeros(slots.numel(), dtype=torch.bool)
        elif ends.dtype != torch.bool:
            raise TypeError(
                f"end_key {self.end_key!r} must hold bool flags, got dtype {ends.dtype}; "
                "store done flags as torch.bool (TorchRL's convention) or cast them before "
                "rb.extend."
            )
        if ends.shape[1:].numel() != 1:
            raise ValueError(
                f"end_key {self.end_key!r} must hold one flag per step, shaped [N] or [N, 1], "
                f"got {list(ends.shape[1:])} per step; store the step's own done flag (as "
                "TorchRL's samplers require), not a reduction of several."
            )
        ends = ends.reshape(-1)  # last step of an episode
        if self.traj_key is None:
            self._check_not_interleaved(data, slots, ends, lost_before)
            traj = None
        else:
            traj = self._read(data, self.traj_key, slots, required=True)
            traj = traj.reshape(slots.numel(), -1)
        overwritten = int((~alive).sum())
        if overwritten or after_loss:
            unknown = (  # with end flags alone, the end flag of the last lost step is gone
                "their trajectories are unknown, so every episode written after them in that "
                "stretch is dropped" if stitch else "whether the first step stored after them "
                "starts an episode is unknown, so the episode holding it is dropped even if "
                "it is whole"
            )
            what, fix = (
                (f"{overwritten} step(s) were overwritten before any sample read them (more "
                 "than the storage capacity written between two samples)",
                 "Sample more often or raise the capacity")
                if overwritten else
                ("the storage's ring wrapped before the sampler first saw it, so the steps "
                 "written before its oldest one were overwritten unread",
                 "Build the buffer with this sampler before writing, or write no more than "
                 "the capacity before its first sample")
            )
            warnings.warn(f"{what}; {unknown}. {fix}.", stacklevel=2)
        if self.owner.numel() < data.shape[0]:
            grown = torch.full((data.shape[0],), -1, dtype=torch.long)
            grown[: self.owner.numel()] = self.owner
            self.owner = grown
        open_by_id = {entry.id: (key, entry) for key, entry in self.open.items()}
        losing = []  # open (key, entry) losing steps
        previous, lost = self.owner[written.unique()].unique(return_counts=True)
        for episode, count in zip(previous.tolist(), lost.tolist()):  # episodes losing steps
            if episode in open_by_id:
                key, entry = open_by_id[episode]
                entry.whole, entry.parts = False, []
                entry.stored -= count
                losing.append((key, entry))
            elif episode in self.episodes:
                self.episodes.remove(episode)
        cut_after = ends.clone()  # cut_after: last step of a run of one episode
        if traj is not None:
            cut_after[:-1] |= (traj[1:] != traj[:-1]).any(-1)
            if not stitch:  # the id alone delimits episodes
                if self.open and (traj[0] != self.last_traj).any():
                    self._close(None)
                self.last_traj = traj[-1]
                ends, traj = cut_after, None
        start = 0
        for stop in (cut_after.nonzero().squeeze(-1) + 1).tolist() + [slots.numel()]:
            if start == stop:
                continue
            key = None if traj is None else tuple(traj[start].tolist())
            self._extend(key, slots[start:stop], lost_before[start:stop], int(stamps[start]))
            if ends[stop - 1]:
                self._close(key)
            start = stop
        for key, entry in losing:  # none of its steps left: forget it
            if entry.stored == 0 and self.open.get(key) is entry:
                del self.open[key]

    def _check_not_interleaved(self, data, slots, ends, lost_before) -> None:
        """Refuses collector trajectory ids that change inside what ``end_key`` calls one
        episode: the writes interleave several envs, or a trajectory was cut without an end
        flag; either way steps of different trajectories would be joined."""
        ids = self._read(data, _COLLECTOR_TRAJ_KEY, slots, required=False)
        if ids is None:
            return
        ids = ids.reshape(slots.numel(), -1)
        mixed = (ids[1:] != ids[:-1]).any(-1) & ~ends[:-1] & ~lost_before[1:]
        if mixed.any():
            t = int(mixed.nonzero()[0])
            raise ValueError(
                f"{_COLLECTOR_TRAJ_KEY!r} changes from {ids[t].tolist()} to "
                f"{ids[t + 1].tolist()} between two steps written one after the other, with no "
                f"{self.end_key!r} flag between them: either the writes interleave several envs "
                "(a flattened [num_envs, T] collector batch), or a trajectory was cut without an "
                "end flag (a collector with reset_at_each_iter=True starts new trajectories at "
                f"every batch). Pass traj_key={_COLLECTOR_TRAJ_KEY!r} so that each trajectory's "
                "steps stay apart."
            )

    @staticmethod
    def _read(data, key, slots, *, required):
        value = data.get(key, default=None)
        if value is None and required:
            raise ValueError(
                f"key {key!r} not found in the storage (its keys: "
                f"{sorted(map(str, data.keys(True, True)))}); pass end_key=/traj_key= naming "
                "the episode-end flag or trajectory id the data holds."
            )
        return None if value is None else value[slots.to(value.device)].cpu()

    def _extend(self, key, slots, lost_before, first_stamp) -> None:
        entry = self.open.setdefault(key, _Open(first_stamp, [], True))
        entry.whole &= not bool(lost_before.any())
        if entry.whole:
            entry.parts.append(slots)
        else:  # never drawn now: keep no slot list
            entry.parts = []
        entry.stored += slots.numel()
        self.owner[slots] = entry.id

    def _close(self, key) -> None:
        entry = self.open.pop(key, None)
        if entry is not None and entry.parts and entry.whole:
            self.episodes.add(entry.id, torch.cat(entry.parts))

    def draw(self, generator: torch.Generator) -> tuple[int, torch.Tensor]:
        """(id, slots) of the episode of a uniformly drawn drawable step."""
        total = self.episodes.total
        drawable = self._open_drawable()
        open_lengths = [sum(p.numel() for p in entry.parts) for entry in drawable]
        step = int(torch.randint(total + sum(open_lengths), (1,), generator=generator))
        if step < total:
            return self.episodes.at_step(step)
        step -= total
        for entry, length in zip(drawable, open_lengths):
            if step < length:
                return entry.id, torch.cat(entry.parts)
            step -= length

    def all(self) -> list[tuple[int, torch.Tensor]]:
        """(id, slots) of every drawable episode."""
        drawn = list(zip(self.episodes.ids, self.episodes.slots))
        drawn += [(entry.id, torch.cat(entry.parts)) for entry in self._open_drawable()]
        return drawn

    def state(self) -> dict:
        opened = [torch.cat(e.parts or [_as_long([])]) for e in self.open.values()]
        return {
            "ids": _as_long(self.episodes.ids),
            "lengths": _as_long([s.numel() for s in self.episodes.slots]),
            "slots": torch.cat(self.episodes.slots or [_as_long([])]),
            "open_keys": list(self.open),
            "open_ids": _as_long([e.id for e in self.open.values()]),
            "open_lengths": _as_long([s.numel() for s in opened]),
            "open_slots": torch.cat(opened or [_as_long([])]),
            "open_whole": [e.whole for e in self.open.values()],
            "last_traj": self.last_traj,
            "owner": self.owner.clone(),  # a running episode may list slots rewritten since
        }

    def load(self, state: dict) -> None:
        self.owner = state["owner"].clone()
        slots = state["slots"].split(state["lengths"].tolist())
        for episode, episode_slots in zip(state["ids"].tolist(), slots):
            self.episodes.add(episode, episode_slots.clone())
        open_slots = state["open_slots"].split(state["open_lengths"].tolist())
        ids, whole = state["open_ids"].tolist(), state["open_whole"]
        owners, owned = self.owner.unique(return_counts=True)
        stored = dict(zip(owners.tolist(), owned.tolist()))
        fields = zip(state["open_keys"], ids, open_slots, whole)
        for key, episode, episode_slots, is_whole in fields:
            parts = [episode_slots.clone()] if episode_slots.numel() and is_whole else []
            self.open[key] = _Open(episode, parts, is_whole, stored.get(episode, 0))
        self.last_traj = state["last_traj"]
