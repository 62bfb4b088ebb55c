"""What a storage holds that :class:`~torchrl_seqchunk.StreamChunkSampler`'s hooks did not report.

The sampler learns of writes through the replay buffer's ``extend`` / ``add`` calls. These
checks compare that record with what TorchRL's storages and writers say was written (their
write counts and last written slot), refuse buffers that would sample out of order, and find
where the time order of a storage filled before the sampler saw it begins.
"""
from __future__ import annotations

import warnings

from torchrl.data import TensorDictReplayBuffer
from torchrl.data.replay_buffers.storages import Storage
from torchrl.data.replay_buffers.writers import RoundRobinWriter


def check_buffers(sampler, storage: Storage) -> None:
    """Refuses a buffer with ``prefetch > 1`` and warns when a buffer that drops the
    sampler's info samples through this sampler (TorchRL storages list the buffers
    attached to them)."""
    for buffer in getattr(storage, "_attached_entities", ()):
        if getattr(buffer, "_sampler", None) is not sampler:
            continue
        prefetch = getattr(buffer, "_prefetch_cap", 0)
        if prefetch > 1:
            raise ValueError(
                f"StreamChunkSampler is sampled by a buffer with prefetch={prefetch}, whose "
                f"{prefetch} worker threads may run two samples out of order and break the "
                "streams (chunk k + 1 must continue chunk k). Build the buffer with "
                "prefetch=None or 1, and prefetch with ChunkPrefetcher(rb.sample), which "
                "keeps the order."
            )
        if not isinstance(buffer, TensorDictReplayBuffer):
            warnings.warn(
                f"StreamChunkSampler is sampled by a {type(buffer).__name__}, which returns "
                "the data without the sampler's info: the chunks carry no "
                f"{sampler.is_first_key!r} flags. Use TensorDictReplayBuffer, or read them "
                "from rb.sample(return_info=True)[1].",
                stacklevel=2,
            )


def check_writes_seen(sampler, storage: Storage) -> None:
    """Raises when steps were written into the storage without this sampler's hooks.

    Two checks. The steps counted by the :class:`~torchrl.data.RoundRobinWriter` of the
    buffer sampling through this sampler (TorchRL keeps the count in shared memory, so
    a worker process's writes count too) must equal the sampler's clock, and the
    writers of other buffers on the same storage must not write after the first sync
    (before it, theirs is a storage filled before the sampler saw it). The storage's
    last written slot must be the last slot the hooks reported.
    """
    writers = {}  # id -> (writer, written through a buffer sampling with sampler)
    for buffer in getattr(storage, "_attached_entities", ()):
        writer = getattr(buffer, "_writer", None)
        if isinstance(writer, RoundRobinWriter):
            own = getattr(buffer, "_sampler", None) is sampler
            writers[id(writer)] = (writer, own or writers.get(id(writer), (0, False))[1])
    own = sum(writer._write_count for writer, mine in writers.values() if mine)
    others = sum(writer._write_count for writer, mine in writers.values() if not mine)
    base = sampler._writes_base
    if base["own"] is None:
        base["own"] = own - sampler._log.clock
    if base["others"] is None:
        base["others"] = others
    unseen = own - base["own"] - sampler._log.clock + others - base["others"]
    newest, last = storage._last_cursor_index, sampler._log.last_slot
    if unseen > 0:
        what = (
            f"the writers count {unseen} more step(s) written than the "
            f"{sampler._log.clock} the sampler was told of"
        )
    elif last is not None and newest is not None and int(newest) != last:
        what = (
            f"the storage's last written slot is {int(newest)}, the last slot written "
            f"through the buffer is {last}"
        )
    else:
        return
    raise ValueError(
        f"StreamChunkSampler did not see every write into its storage: {what}. The "
        "writes bypassed rb.extend / rb.add of the buffer that samples through this "
        "sampler (a multi-process collector given replay_buffer=, whose workers write into "
        "the shared storage; another buffer sharing the storage; rb.storage.set or "
        "rb.writer.extend called directly), so the sampler cannot tell which episodes they "
        "belong to nor which queued steps they overwrote. Supported layout: the process "
        "that owns the buffer and its sampler calls rb.extend with everything written, "
        "e.g. an ingest thread running `for batch in collector: "
        "rb.extend(batch.reshape(-1))` with a collector built without replay_buffer=. "
        "rb.empty() starts over."
    )


def newest_unrecorded(sampler, storage: Storage) -> int | None:
    """The slot written last into a storage whose ring wrapped before the sampler saw it
    (time order starts after that slot, and the oldest stored step followed steps that were
    overwritten); ``None`` when every slot's write was recorded or the ring never wrapped
    (slot order is time order)."""
    if sampler._log.known >= len(storage) or len(storage) < storage.max_size:
        return None  # every slot's write was recorded, or the storage is not full
    newest = storage._last_cursor_index  # TorchRL storages keep their last written slot
    if sampler._log.clock or newest is None:
        raise ValueError(
            f"StreamChunkSampler cannot tell the time order of the "
            f"{len(storage) - sampler._log.known} step(s) a full storage held before the "
            "sampler first saw it: "
            + ("the buffer wrote into it since, so its cursor no longer marks where those "
               "steps end" if sampler._log.clock else "the storage keeps no cursor")
            + " (a wrapped ring is not in slot order). Sample once before writing through "
            "the buffer (rb.sampler.can_sample(rb.storage, batch_size) is enough), or start "
            "from an empty storage."
        )
    written = sampler._writes_base["own"] + sampler._writes_base["others"]
    if int(newest) == len(storage) - 1 and written <= len(storage):
        return None  # filled once, in slot order (as far as its writers counted)
    return int(newest)
