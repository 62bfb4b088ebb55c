"""Stream queues of :class:`~torchrl_seqchunk.StreamChunkSampler`: segments of episodes, O(1) push and take."""
from __future__ import annotations

import collections

import torch


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

    def take(self, n: int) -> list[_Segment]:
        pieces = []
        while n:
            head = self.segments[0]
            k = min(n, head.slots.numel())
            pieces.append(_Segment(head.slots[:k], head.episode, head.offset, head.queued_at))
            if k == head.slots.numel():
                self.segments.popleft()
            else:
                head.slots, head.offset = head.slots[k:], head.offset + k
            self.unread -= k
            n -= k
        return pieces

    def drop_stale(self, stamps: torch.Tensor) -> None:
        """Cuts every segment at its first step rewritten since it was queued."""
        kept = collections.deque()
        for seg in self.segments:
            stale = (stamps[seg.slots] >= seg.queued_at).nonzero()
            if stale.numel():
                seg.slots = seg.slots[: int(stale[0])]
            if seg.slots.numel():
                kept.append(seg)
        self.segments = kept
        self.unread = sum(seg.slots.numel() for seg in kept)
