"""The write log of :class:`~torchrl_seqchunk.StreamChunkSampler`: what was written when, and what was lost."""
from __future__ import annotations

import warnings

import torch
from torchrl.data.replay_buffers.storages import Storage
from torchrl.data.replay_buffers.writers import RoundRobinWriter

_UNSET = torch.iinfo(torch.long).min


def _as_long(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long)


class _WriteLog:
    """Write stamp of every storage slot: the number of steps written before it.

    Stamps grow with every write, so a slot whose stamp is ``>= t`` was rewritten after the
    clock read ``t``. ``pending`` keeps the writes the episode index has not read yet. Slots
    filled before any write was recorded (a storage handed over already filled) count as
    written before everything else, in the storage's time order. The log also compares
    what it was told with the write counts of TorchRL's writers (:meth:`check_seen`).
    """

    def __init__(self, clock: int = 0):
        self.stamps = torch.full((0,), _UNSET, dtype=torch.long)
        # stamp of the next written step; a log that replaces an emptied one goes on from its
        # clock, so a stream state taken before the emptying reads every slot as rewritten
        self.clock = self.start = clock
        self.origin = clock  # stamp of the oldest step ever written
        self.pending = []  # (slots, stamps) of writes not yet taken, in write order
        self.known = 0  # number of slots holding a stamp
        self.last_slot = None  # slot of the last recorded step (None: none since built)
        # write counts that need no hook call: of the own buffer's writer (its count minus
        # the clock) and of other buffers' writers on the storage; None: taken at next check
        self.base = {"own": None, "others": None}

    # ------------------------------------------------------------------------- writing
    def record(self, index: torch.Tensor) -> None:
        """Stamps the slots of one ``extend``/``add`` call, in write order."""
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

    def rewritten_since(self, slots: torch.Tensor, clock: int) -> torch.Tensor:
        """Bool mask of ``slots`` written again once the clock had read ``clock``: all of them
        when ``clock`` is older than the log (the storage was emptied since)."""
        if clock < self.start:
            return torch.ones_like(slots, dtype=torch.bool)
        return self.stamps[slots] >= clock

    # ------------------------------------------------------------------------- reading
    def put_back(self, slots: torch.Tensor, stamps: torch.Tensor, writes: torch.Tensor) -> None:
        """Returns what :meth:`take_pending` gave (a read that failed), write by write."""
        cuts = (writes[1:] != writes[:-1]).nonzero().squeeze(-1) + 1
        self.pending[:0] = list(zip(slots.tensor_split(cuts), stamps.tensor_split(cuts)))

    def take_pending(self, size: int, newest: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Slots ``[0, size)`` written since the last call, in write order, with their stamps
        and the index of the write (``extend`` / ``add`` call) each came in, counted from 0.

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
            return (torch.zeros(0, dtype=torch.long),) * 3
        slots, stamps = (torch.cat(parts) for parts in zip(*self.pending))
        writes = torch.cat([torch.full((part.numel(),), i) for i, (part, _) in enumerate(self.pending)])
        self.pending = []
        return slots, stamps, writes

    # ------------------------------------------------------------ writes the log missed
    def check_seen(self, storage: Storage, owner) -> None:
        """Raises when steps were written into ``storage`` without the hooks of ``owner``.

        The steps counted by the :class:`~torchrl.data.RoundRobinWriter` of the buffers
        sampling through ``owner`` (TorchRL keeps the count in shared memory, so a worker
        process's writes count too) must equal the clock, other buffers' writers on the
        storage must not write after the first check, and the storage's last written slot
        must be the last slot recorded.
        """
        writers = {}  # id -> (writer, written through a buffer sampling with owner)
        for buffer in getattr(storage, "_attached_entities", ()):
            writer = getattr(buffer, "_writer", None)
            if isinstance(writer, RoundRobinWriter):
                own = getattr(buffer, "_sampler", None) is owner
                writers[id(writer)] = (writer, own or writers.get(id(writer), (0, False))[1])
        own = sum(writer._write_count for writer, mine in writers.values() if mine)
        others = sum(writer._write_count for writer, mine in writers.values() if not mine)
        if self.base["own"] is None:
            self.base["own"] = own - self.clock
        if self.base["others"] is None:
            self.base["others"] = others
        unseen = own - self.base["own"] - self.clock + others - self.base["others"]
        newest = storage._last_cursor_index
        if unseen > 0:
            what = (f"the writers count {unseen} more step(s) written than the {self.clock - self.start} "
                    "the sampler was told of")
        elif self.last_slot is not None and newest is not None and int(newest) != self.last_slot:
            what = (f"the storage's last written slot is {int(newest)}, the last slot written "
                    f"through the buffer is {self.last_slot}")
        else:
            return
        raise ValueError(
            f"StreamChunkSampler did not see every write into its storage: {what}. The "
            "writes bypassed rb.extend / rb.add of the buffer that samples through this "
            "sampler (a multi-process collector given replay_buffer=, whose workers write "
            "into the shared storage; another buffer sharing the storage; rb.storage.set or "
            "rb.writer.extend called directly), so the sampler cannot tell which episodes "
            "they belong to nor which queued steps they overwrote. Supported layout: the "
            "process that owns the buffer and its sampler calls rb.extend with everything "
            "written, e.g. an ingest thread running `for batch in collector: "
            "rb.extend(batch.reshape(-1))` with a collector built without replay_buffer=. "
            "rb.empty() starts over."
        )

    def newest_unrecorded(self, storage: Storage) -> int | None:
        """The slot written last into a storage whose ring wrapped before the log saw it
        (its time order starts after that slot, and its oldest step followed lost ones);
        ``None`` when every slot's write was recorded or the ring never wrapped."""
        if self.known >= len(storage) or len(storage) < storage.max_size:
            return None
        newest = storage._last_cursor_index  # TorchRL storages keep their last written slot
        if self.clock != self.start or newest is None:
            raise ValueError(
                f"StreamChunkSampler cannot tell the time order of the "
                f"{len(storage) - self.known} step(s) a full storage held before the sampler "
                "first saw it: "
                + ("the buffer wrote into it since, so its cursor no longer marks where those "
                   "steps end" if self.clock != self.start else "the storage keeps no cursor")
                + " (a wrapped ring is not in slot order). Sample once before writing through "
                "the buffer (rb.sampler.can_sample(rb.storage, batch_size) is enough), or "
                "start from an empty storage."
            )
        written = self.base["own"] + self.base["others"]
        if int(newest) == len(storage) - 1 and written <= len(storage):
            return None  # filled once, in slot order (as far as its writers counted)
        return int(newest)

    # --------------------------------------------------------------------------- state
    def state(self) -> dict:
        """The stamps and the writes not yet taken, each write's bounds kept (``pending_writes``:
        the index of each pending slot's write): a trajectory's first step in a write is where
        its start flag is read, so merging writes would hide a restart."""
        parts = self.pending or [(torch.zeros(0, dtype=torch.long),) * 2]
        slots, stamps = (torch.cat(tensors) for tensors in zip(*parts))
        writes = torch.cat([torch.full((part.numel(),), i) for i, (part, _) in enumerate(parts)])
        return {"stamps": self.stamps.clone(), "clock": self.clock, "start": self.start, "origin": self.origin,
                "known": self.known, "pending_slots": slots, "pending_stamps": stamps, "pending_writes": writes}

    def load(self, state: dict) -> None:
        self.stamps, self.clock = state["stamps"].clone(), state["clock"]
        self.start = state.get("start", 0)
        self.origin, self.known = state["origin"], state["known"]
        slots = state["pending_slots"]
        # a state saved before writes were kept apart holds them as one
        writes = state.get("pending_writes", torch.zeros(slots.numel(), dtype=torch.long))
        self.pending = []
        if slots.numel():
            self.put_back(slots.clone(), state["pending_stamps"].clone(), writes)
