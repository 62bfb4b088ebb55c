"""The episode index of :class:`~torchrl_seqchunk.StreamChunkSampler`: which episodes the storage holds.

- :class:`_Episodes`: the drawable episodes; add and remove in O(1), draw in proportion to length.
- :class:`_EpisodeTracker`: reads the end flags of new steps only, grows the episodes being
  written and files each when it ends; drops episodes whose steps were overwritten.
"""
from __future__ import annotations

import warnings

import torch
from tensordict import TensorDictBase
from torchrl.data.replay_buffers.storages import TensorStorage

from .writes import _as_long

_COLLECTOR_TRAJ_KEY = ("collector", "traj_ids")  # written by TorchRL collectors


class _Episodes:
    """Drawable episodes, id -> storage slots in time order (DreamerV3 selector style).

    ``add`` appends, ``remove`` swaps the episode with the last one and pops: O(1).
    ``at_steps(u)`` for uniform ``u < total`` picks an episode with P(e) = len(e) / total;
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

    def at_steps(self, steps: torch.Tensor) -> list[int]:
        """The positions of the episodes holding ``steps`` (long ``[n]``, each ``< total``)
        of all episodes laid end to end."""
        return torch.searchsorted(self.cumulative(), steps, right=True).tolist()


class _Open:
    """An episode still being written: its id, its stored steps in time order (in parts),
    whether it lost no step (``whole``: it may be filed when it ends) and whether it lost a
    step between stored ones (``broken``: never drawn, no slot list kept), and how many
    slots it still owns. Losing its oldest steps to a ring wrap leaves the rest drawable
    (a continuing task's stream goes on with ``only_complete=False``)."""

    __slots__ = ("id", "parts", "whole", "broken", "stored")

    def __init__(self, episode, parts, whole, broken=False, stored=0):
        self.id, self.parts, self.whole, self.broken = episode, parts, whole, broken
        self.stored = stored

    def lose(self, slots: torch.Tensor, count: int) -> None:
        """``count`` of its slots, among ``slots``, are being rewritten."""
        self.whole, self.stored = False, self.stored - count
        held = torch.cat(self.parts) if self.parts else _as_long([])
        lost = torch.isin(held, slots)
        kept = int(lost.logical_not().nonzero()[0]) if not lost.all() else held.numel()
        if self.broken or lost[kept:].any():  # not its oldest steps: a gap
            self.broken, self.parts = True, []
        else:
            self.parts = [held[kept:]] if kept < held.numel() else []

    def extend(self, slots: torch.Tensor, lost_before: bool) -> None:
        if lost_before:
            self.whole, self.broken = False, True
        if self.broken:
            self.parts = []
        else:
            self.parts.append(slots)
        self.stored += slots.numel()


class _EpisodeTracker:
    """Finds episodes in the steps written since the last call, in write order.

    It reads the end flags (and trajectory ids) of the new steps only, extends the episodes
    being written (the *open* ones), and files each episode that ends into
    :class:`_Episodes` unless steps of it were lost. An episode whose slots get
    overwritten is removed. ``only_complete=False`` also lets open episodes be drawn. An
    open episode none of whose steps is stored any more is forgotten (a trajectory that
    never ends, e.g. cut by a collector reset), so the bookkeeping never outgrows the storage.

    With end flags alone there is one open episode. With trajectory ids and end flags an
    episode ends at its end flag only (steps are filed under their trajectory id, so the
    envs of a flattened collector batch stay apart). With trajectory ids alone an episode
    ends where the id changes. A stored start flag (``init_key``, TorchRL's ``is_init``) on
    a trajectory's first step in a write starts an episode: with end flags, an open episode
    of the same trajectory id is *cut* (it never ends: a collector restarted under the same
    ids, as after a checkpoint), never filed, and drawable as it is only with
    ``only_complete=False``; with ids alone the flag ends the previous episode as an id
    change does.
    """

    def __init__(self, end_key, traj_key, only_complete, init_key=None):
        self.end_key, self.traj_key, self.only_complete = end_key, traj_key, only_complete
        self.init_key = init_key
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
        return [entry for entry in self.open.values() if entry.parts]

    def end_rule(self, storage) -> str:
        """How episodes end here, said as the condition that never held."""
        if self.traj_key is None or (
            len(storage) and storage[:].get(self.end_key, default=None) is not None
        ):
            return f"{self.end_key!r} is never True at the end of a whole episode"
        return (
            f"{self.traj_key!r} never changes after a whole episode (no {self.end_key!r} is "
            "stored, so an episode ends where the trajectory id changes)"
        )

    @staticmethod
    def steps_of(storage) -> TensorDictBase:
        """The storage's steps as one TensorDict ``[N]``; raises for anything else."""
        data = storage[:]
        if not isinstance(data, TensorDictBase):
            fix = (
                "extend the buffer with TensorDicts of steps, e.g. "
                "rb.extend(TensorDict({'observation': obs, ('next', 'done'): done}, [N]))"
                if isinstance(storage, TensorStorage)
                else f"a {type(storage).__name__} keeps every written item apart; build the "
                "buffer with LazyTensorStorage(capacity) or LazyMemmapStorage(capacity), "
                "which stack the steps"
            )
            raise TypeError(
                f"StreamChunkSampler reads its storage as one TensorDict of steps [N], but "
                f"{type(storage).__name__}[:] gives a {type(data).__name__}: {fix}."
            )
        if data.batch_dims != 1:
            raise ValueError(
                f"StreamChunkSampler needs one step per storage slot, got entries of batch "
                f"shape {list(data.shape[1:])}; write collector batches [num_envs, T] flat, "
                "rb.extend(batch.reshape(-1)), with traj_key=('collector', 'traj_ids') so that "
                "the envs' episodes stay apart."
            )
        return data

    def update(self, data: TensorDictBase, slots, stamps, writes, alive, after_loss=False) -> None:
        """Reads new steps: ``slots`` in write order with their ``stamps`` and the index of
        the write each came in (``writes``); ``alive`` is False where a
        slot was written again since (that step is lost); ``after_loss``: the step written
        just before ``slots[0]`` is lost too (a ring that wrapped before the sampler saw
        it). The data is checked before anything changes, so after an error the tracker is
        as it was."""
        writes = writes[alive]
        starts = self._flags(data, self.init_key, slots[alive], "init_key", "starts")
        restarts = torch.zeros_like(starts)  # a write that begins an episode (a collector restarted?)
        restarts[1:] = starts[1:] & (writes[1:] != writes[:-1])
        ends, traj, lost_before, stitch = self._read_steps(data, slots, alive, after_loss, restarts)
        self._warn_lost(int((~alive).sum()), after_loss, stitch)
        if self.owner.numel() < data.shape[0]:
            grown = torch.full((data.shape[0],), -1, dtype=torch.long)
            grown[: self.owner.numel()] = self.owner
            self.owner = grown
        losing = self._forget_overwritten(slots)
        self._file_runs(slots[alive], stamps[alive], ends, traj, lost_before, stitch, starts, writes)
        for key, entry in losing:  # none of its steps left: forget it
            if entry.stored == 0 and self.open.get(key) is entry:
                del self.open[key]

    def _read_steps(self, data, slots, alive, after_loss, restarts):
        """End flags ``[n]`` and trajectory ids ``[n, k]`` (or None) of the stored new steps,
        and whether a step before each was lost; raises on data that does not fit (an id
        change with no end flag between is allowed where ``restarts``)."""
        lost_just_before = torch.cat([torch.tensor([after_loss]), ~alive[:-1]])
        lost_before = lost_just_before[alive]
        slots = slots[alive]
        ends = self._flags(data, self.end_key, slots, "end_key", "ends", required=self.traj_key is None)
        # with both, steps are filed per trajectory
        stitch = self.traj_key is not None and data.get(self.end_key, default=None) is not None
        if stitch:  # a lost step may be any trajectory's: none written after it is whole
            lost_before = lost_just_before.cumsum(0)[alive] > 0
        if self.traj_key is None:
            self._check_not_interleaved(data, slots, ends, lost_before | restarts)
            return ends, None, lost_before, stitch
        traj = self._read(data, self.traj_key, slots, required=True)
        return ends, traj.reshape(slots.numel(), -1), lost_before, stitch

    def _flags(self, data, key, slots, name: str, what: str, required: bool = False) -> torch.Tensor:
        """bool ``[n]``: the flags stored under ``key`` at ``slots`` (all False where ``key`` is
        None or absent and not ``required``); a TypeError / ValueError naming ``name`` for
        flags of another dtype or more than one per step."""
        flags = None if key is None else self._read(data, key, slots, required=required)
        if flags is None:
            return torch.zeros(slots.numel(), dtype=torch.bool)
        if flags.dtype != torch.bool:
            raise TypeError(
                f"{name} {key!r} must hold bool flags, got dtype {flags.dtype}; store them as "
                "torch.bool (TorchRL's convention) or cast them before rb.extend."
            )
        if flags.shape[1:].numel() != 1:
            raise ValueError(
                f"{name} {key!r} must hold one flag per step, shaped [N] or [N, 1], got "
                f"{list(flags.shape[1:])} per step; store the step's own flag (the step {what} an "
                "episode), as TorchRL's samplers require, not a reduction of several."
            )
        return flags.reshape(-1)

    @staticmethod
    def _warn_lost(overwritten: int, after_loss: bool, stitch: bool) -> None:
        if not (overwritten or after_loss):
            return
        unknown = (  # with end flags alone, the end flag of the last lost step is gone
            "their trajectories are unknown, so every episode written after them in that "
            "stretch is dropped" if stitch else "whether the first step stored after them "
            "starts an episode is unknown, so the episode holding it is dropped even if it "
            "is whole"
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
        warnings.warn(f"{what}; {unknown}. {fix}.", stacklevel=3)

    def _forget_overwritten(self, written: torch.Tensor) -> list:
        """Removes filed episodes that lose slots to this write; open ones lose those
        steps. Returns the open ``(key, entry)`` pairs that lost steps."""
        open_by_id = {entry.id: (key, entry) for key, entry in self.open.items()}
        written = written.unique()
        losing = []
        previous, lost = self.owner[written].unique(return_counts=True)
        for episode, count in zip(previous.tolist(), lost.tolist()):
            if episode in open_by_id:
                key, entry = open_by_id[episode]
                entry.lose(written, count)
                losing.append((key, entry))
            elif episode in self.episodes:
                self.episodes.remove(episode)
        return losing

    def _file_runs(self, slots, stamps, ends, traj, lost_before, stitch, starts, writes) -> None:
        """Cuts the new steps into runs of one episode each and extends, closes or cuts them.
        A start flag counts only on a trajectory's first step in a write: inside a write
        a collector's steps of one id follow each other, and a storage keeps a flag a
        write lacks (an earlier step's, in a slot written again without it)."""
        cut_after = ends.clone()  # cut_after: last step of a run of one episode
        ids_alone, seen = traj is not None and not stitch, set()
        if traj is not None:
            cut_after[:-1] |= (traj[1:] != traj[:-1]).any(-1)
            if ids_alone:  # the id alone delimits episodes
                if self.open and (traj[0] != self.last_traj).any():
                    self._close(None)
                self.last_traj = traj[-1]
                ends, traj = cut_after.clone(), None
        cut_after[:-1] |= writes[1:] != writes[:-1]  # a run per write: each may start with a flag
        start = 0
        for stop in (cut_after.nonzero().squeeze(-1) + 1).tolist() + [slots.numel()]:
            if start == stop:
                continue
            key = None if traj is None else tuple(traj[start].tolist())
            first = (int(writes[start]), key) not in seen  # the trajectory's first step in its write
            seen.add((int(writes[start]), key))
            if first and starts[start] and key in self.open:  # an episode starts where one is open
                self._close(key) if ids_alone else self._cut(key)
            entry = self.open.setdefault(key, _Open(int(stamps[start]), [], True))
            entry.extend(slots[start:stop], bool(lost_before[start:stop].any()))
            self.owner[slots[start:stop]] = entry.id
            if ends[stop - 1]:
                self._close(key)
            start = stop

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

    def _close(self, key) -> None:
        entry = self.open.pop(key, None)
        if entry is not None and entry.parts and entry.whole:
            self.episodes.add(entry.id, torch.cat(entry.parts))

    def _cut(self, key) -> None:
        """The open episode of ``key`` never ends (another starts under its trajectory id):
        never filed; drawable as it is where open episodes are, under a key no id has."""
        entry = self.open.pop(key)
        if not self.only_complete and entry.parts:
            self.open[("cut", entry.id)] = entry

    def draw(self, generator: torch.Generator, n: int) -> list[tuple[int, torch.Tensor]]:
        """(id, slots) of the episodes of ``n`` uniformly drawn drawable steps."""
        total = self.episodes.total
        drawable = self._open_drawable()
        open_lengths = [sum(p.numel() for p in entry.parts) for entry in drawable]
        steps = torch.randint(total + sum(open_lengths), (n,), generator=generator)
        positions = self.episodes.at_steps(steps) if total else [None] * n
        drawn = []
        for step, position in zip(steps.tolist(), positions):
            if step < total:
                drawn.append((self.episodes.ids[position], self.episodes.slots[position]))
                continue
            step -= total
            for entry, length in zip(drawable, open_lengths):
                if step < length:
                    drawn.append((entry.id, torch.cat(entry.parts)))
                    break
                step -= length
        return drawn

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
            "open_broken": [e.broken for e in self.open.values()],
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
        broken = state.get("open_broken", [not w for w in whole])
        owners, owned = self.owner.unique(return_counts=True)
        stored = dict(zip(owners.tolist(), owned.tolist()))
        fields = zip(state["open_keys"], ids, open_slots, whole, broken)
        for key, episode, episode_slots, is_whole, is_broken in fields:
            parts = [episode_slots.clone()] if episode_slots.numel() and not is_broken else []
            self.open[key] = _Open(episode, parts, is_whole, is_broken, stored.get(episode, 0))
        self.last_traj = state["last_traj"]
