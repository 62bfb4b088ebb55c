"""Whether memory crosses an episode start: training passes over the rollout with some episodes'
inputs perturbed, where the other episodes' outputs must not move.

Episodes are coloured in two so that the episodes on either side of every boundary a training
row crosses (and of every boundary inside an env's row, where a burn-in or a transform may read
across unseen) get different colours; one pass perturbs the first colour, one the second. An
output that moves while its own episode is untouched read memory from another episode. Where the
boundaries make an odd cycle, a second colouring (two more passes) takes the ones the first left.
"""
from __future__ import annotations

from collections import deque

import torch
from tensordict import TensorDictBase, unravel_key

from .passes import Slots


def boundaries(slots: Slots, episode: torch.Tensor) -> set:
    """Pairs of episodes next to each other: in an env's row (``episode`` ``[E, T]``), or in a
    training row (consecutive slots of ``slots``)."""
    pairs = set()
    a, b = episode[:, :-1].reshape(-1), episode[:, 1:].reshape(-1)
    changes = a != b
    pairs.update(zip(a[changes].tolist(), b[changes].tolist()))
    nxt = slots.successor()
    has = nxt >= 0
    a, b = slots.episode[has], slots.episode[nxt[has]]
    changes = a != b
    pairs.update(zip(a[changes].tolist(), b[changes].tolist()))
    return pairs


def two_colours(count: int, pairs: set) -> torch.Tensor:
    """A colour (0 or 1) per episode, breadth first over ``pairs`` (two episodes of a pair differ
    unless the pairs make an odd cycle)."""
    links = [[] for _ in range(count)]
    for a, b in pairs:
        links[a].append(b)
        links[b].append(a)
    colour = [-1] * count
    for root in range(count):
        if colour[root] >= 0:
            continue
        colour[root] = 0
        queue = deque([root])
        while queue:
            node = queue.popleft()
            for other in links[node]:
                if colour[other] < 0:
                    colour[other] = 1 - colour[node]
                    queue.append(other)
    return torch.tensor(colour)


def colourings(count: int, pairs: set, most: int = 3) -> tuple[list, int]:
    """Colourings (at most ``most``) that together split every pair, each the next for the pairs the
    ones before left; and how many pairs none split."""
    found, left = [], set(pairs)
    while left and len(found) < most:
        colour = two_colours(count, left)
        found.append(colour)
        left = {(a, b) for a, b in left if colour[a] == colour[b]}
    return found or [torch.zeros(count, dtype=torch.long)], len(left)


def perturbed(rollout: TensorDictBase, where: torch.Tensor, keys: list, generator: torch.Generator) -> TensorDictBase:
    """``rollout`` with the float entries ``keys`` (and their ``("next", key)``) moved at the steps
    ``where`` (bool ``[E, T]``) by ``1 + N(0, 1)`` per element; other steps untouched."""
    out = rollout.clone(False)
    for key in keys:
        for k in (key, unravel_key(("next", *((key,) if isinstance(key, str) else key)))):
            value = rollout.get(k, None)
            if value is None or not value.is_floating_point():
                continue
            noise = 1.0 + torch.randn(value.shape, generator=generator, dtype=value.dtype)
            mask = where.reshape(*where.shape, *[1] * (value.dim() - 2))
            out.set(k, torch.where(mask, value + noise, value))
    return out
