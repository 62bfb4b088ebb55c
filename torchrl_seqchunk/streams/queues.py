"""The stream queues of :class:`~torchrl_seqchunk.StreamChunkSampler`: segments of episodes, O(1) push and take."""
from __future__ import annotations

import collections
import heapq
import itertools

import torch

from .writes import _as_long

_STATE_KEYS = (
    "segment_stream", "segment_length", "segment_episode", "segment_offset",
    "segment_queued_at", "segment_slots", "ran_out", "remaining_batches",
)


class _Segment:
    """An episode in a stream queue, or what is left of it.

    ``slots``: storage slots of the unread steps; ``offset``: step-in-episode of
    ``slots[0]``; ``queued_at``: write clock when queued (a slot stamped later was rewritten).
    """

    __slots__ = ("slots", "episode", "offset", "queued_at")

    def __init__(self, slots, episode, offset, queued_at):
        self.slots, self.episode, self.offset, self.queued_at = slots, episode, offset, queued_at


class _Stream:
    """A queue of segments: ``push`` appends, ``take(n)`` removes the first ``n`` unread steps."""

    def __init__(self):
        self.segments = collections.deque()
        self.unread = 0

    def push(self, segment: _Segment) -> None:
        self.segments.append(segment)
        self.unread += segment.slots.numel()

    def take(self, n: int) -> list[tuple[torch.Tensor, int, int]]:
        pieces = []  # (slots, episode, offset) of each piece, in order
        self.unread -= n
        while n:
            head = self.segments[0]
            slots = head.slots
            size = slots.shape[0]
            if n >= size:
                pieces.append((slots, head.episode, head.offset))
                self.segments.popleft()
                n -= size
            else:
                pieces.append((slots[:n], head.episode, head.offset))
                head.slots, head.offset = slots[n:], head.offset + n
                n = 0
        return pieces

    def drop_stale(self, log) -> None:
        """Cuts every segment at its first step rewritten since it was queued."""
        kept = collections.deque()
        for seg in self.segments:
            stale = log.rewritten_since(seg.slots, seg.queued_at).nonzero()
            if stale.numel():
                seg.slots = seg.slots[: int(stale[0])]
            if seg.slots.numel():
                kept.append(seg)
        self.segments = kept
        self.unread = sum(seg.slots.numel() for seg in kept)


class _Streams:
    """The ``B`` stream queues and the epoch they play (``replacement=False``)."""

    def __init__(self, num_streams: int, replacement: bool):
        self.queues = [_Stream() for _ in range(num_streams)]
        self.replacement = replacement
        self.ran_out = False
        self.remaining_batches = torch.iinfo(torch.int64).max if replacement else 0

    def fill(self, seq_len: int, draw, clock: int) -> None:
        """Appends episodes to every stream short of ``seq_len`` steps, one to each such
        stream per round, from ``draw(n)`` (``n`` episodes at once), until none is short."""
        short = [stream for stream in self.queues if stream.unread < seq_len]
        while short:
            for stream, (episode, slots) in zip(short, draw(len(short))):
                stream.push(_Segment(slots, episode, 0, clock))
            short = [stream for stream in short if stream.unread < seq_len]

    def empty(self) -> bool:
        return not any(stream.unread for stream in self.queues)

    def deal(self, episodes, seq_len: int, generator: torch.Generator, clock: int) -> None:
        """Deals every ``(id, slots)`` once: longest first to the least-filled stream
        (Graham's LPT rule, ties in random order), then each stream's in random order."""
        shuffled = [episodes[e] for e in torch.randperm(len(episodes), generator=generator)]
        dealt = [[] for _ in self.queues]
        loads = [(0, b) for b in range(len(self.queues))]
        for episode in sorted(shuffled, key=lambda e: -e[1].numel()):
            load, b = heapq.heappop(loads)
            dealt[b].append(episode)
            heapq.heappush(loads, (load + episode[1].numel(), b))
        for stream, own in zip(self.queues, dealt):
            for e in torch.randperm(len(own), generator=generator).tolist():
                stream.push(_Segment(own[e][1], own[e][0], 0, clock))
        longest = max(stream.unread for stream in self.queues)
        self.remaining_batches = -(-longest // seq_len)
        self.ran_out = False

    def take(self, seq_len: int) -> list[list[tuple[torch.Tensor, int, int]]]:
        """The next ``seq_len`` steps of every stream (fewer where an epoch's stream ran out)."""
        rows = [stream.take(min(seq_len, stream.unread)) for stream in self.queues]
        if not self.replacement:
            self.remaining_batches -= 1
            self.ran_out = self.empty()
        return rows

    @staticmethod
    def layout(rows: list[list[tuple[torch.Tensor, int, int]]], seq_len: int):
        """Slots, step-in-episode (-1 on padding) and episode id (-1 on padding) of
        ``rows``, long ``[B, T]``; a row short of ``seq_len`` (an epoch's stream that ran
        out) is padded."""
        pad_slot = next(slots[:1] for row in rows for slots, _, _ in row)
        slots, lengths, offsets, episodes = [], [], [], []
        for row in rows:
            filled = 0
            for piece, episode, offset in row:
                slots.append(piece)
                lengths.append(piece.numel())
                offsets.append(offset)
                episodes.append(episode)
                filled += lengths[-1]
            if filled < seq_len:  # padding: a piece of episode -1 whose steps are all -1
                slots.append(pad_slot.expand(seq_len - filled))
                lengths.append(seq_len - filled)
                offsets.append(-1)
                episodes.append(-1)
        shape = (len(rows), seq_len)
        starts = list(itertools.accumulate(lengths, initial=0))[:-1]  # each piece's flat start
        offsets, episodes, starts = torch.tensor([offsets, episodes, starts]).repeat_interleave(
            torch.tensor(lengths), dim=1, output_size=shape[0] * seq_len)
        steps = torch.where(offsets < 0, offsets, offsets + torch.arange(offsets.numel()) - starts)
        return torch.cat(slots).view(shape), steps.view(shape), episodes.view(shape)

    def drop_stale(self, log) -> None:
        """Drops every queued step rewritten since it was queued; an epoch left with
        nothing to read ends."""
        had_steps = not self.empty()
        for stream in self.queues:
            stream.drop_stale(log)
        if not self.replacement and had_steps and self.empty():
            self.ran_out, self.remaining_batches = True, 0

    def state(self) -> dict:
        segments = [(b, seg) for b, s in enumerate(self.queues) for seg in s.segments]
        return {
            "segment_stream": _as_long([b for b, _ in segments]),
            "segment_length": _as_long([seg.slots.numel() for _, seg in segments]),
            "segment_episode": _as_long([seg.episode for _, seg in segments]),
            "segment_offset": _as_long([seg.offset for _, seg in segments]),
            "segment_queued_at": _as_long([seg.queued_at for _, seg in segments]),
            "segment_slots": torch.cat([seg.slots for _, seg in segments] or [_as_long([])]),
            "ran_out": self.ran_out,
            "remaining_batches": self.remaining_batches,
            "replacement": self.replacement,
        }

    def check_state(self, state: dict) -> None:
        """Raises ``ValueError`` unless ``state`` is a :meth:`state` of as many streams."""
        missing = [key for key in _STATE_KEYS if key not in state]
        if missing:
            raise ValueError(
                f"not a StreamChunkSampler stream state: it lacks {missing}; pass what "
                "stream_state() (or state_dict()['streams']) returned."
            )
        # a state saved before it said so: with replacement its epoch never ends
        replacement = state.get("replacement", state["remaining_batches"] == torch.iinfo(torch.int64).max)
        if bool(replacement) != self.replacement:
            raise ValueError(
                f"the stream state was taken with replacement={bool(replacement)}, this sampler has "
                f"replacement={self.replacement}: its queues {'never end' if replacement else 'hold an epoch'}; "
                "build the sampler with the saved replacement."
            )
        streams = state["segment_stream"]
        if streams.numel() and not 0 <= int(streams.min()) <= int(streams.max()) < len(self.queues):
            raise ValueError(
                f"the stream state holds streams up to {int(streams.max())}, this sampler has "
                f"num_streams={len(self.queues)}; build the sampler with the saved sizes."
            )

    def load(self, state: dict) -> None:
        self.queues = [_Stream() for _ in self.queues]
        slots = state["segment_slots"].split(state["segment_length"].tolist())
        fields = zip(
            state["segment_stream"].tolist(), slots, state["segment_episode"].tolist(),
            state["segment_offset"].tolist(), state["segment_queued_at"].tolist(),
        )
        for b, seg_slots, episode, offset, queued_at in fields:
            self.queues[b].push(_Segment(seg_slots.clone(), episode, offset, queued_at))
        self.ran_out = state["ran_out"]
        self.remaining_batches = state["remaining_batches"]
