"""TorchRL storages whose gather of a step index is one ``index_select`` per stored entry.

A replay buffer's ``rb.sample()`` reads the sampled steps with ``storage[index]``, which
TorchRL and tensordict run as PyTorch advanced indexing, ``tensor[index]``, on every stored
entry. On CPU that copies large rows element by element: 1,024 uint8 ``[3, 64, 64]`` rows
(one ``[16, 64]`` chunk of 64x64 images) took 7.7 to 27 ms by ``tensor[index]`` and about
1 ms by ``tensor.index_select(0, index)`` on one thread (``benchmarks/bench_sampler.py``
measures it). The storages below give the same result through ``index_select`` where the
stored data is a plain tensor or a TensorDict of tensors (nested TensorDicts of the same batch
dims, no dim names); every other layout (non-tensor data, nested batch dims, names, a
tensorclass), every other index (an int, a slice, a list, a boolean mask, a tuple) and every
other behaviour are TorchRL's.
"""
from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase, is_non_tensor, is_tensor_collection
from torchrl.data import LazyMemmapStorage, LazyTensorStorage

__all__ = ["IndexSelectMemmapStorage", "IndexSelectStorage"]


def _plain(data: TensorDictBase) -> bool:
    """Every entry a tensor, every nested TensorDict of the root's batch dims, no dim names:
    the layouts whose gather is one ``index_select`` per entry."""
    if any(name is not None for name in data.names):
        return False
    for value in data.values():
        if is_tensor_collection(value):
            if is_non_tensor(value) or not isinstance(value, TensorDictBase) \
                    or value.batch_dims != data.batch_dims or not _plain(value):
                return False
        elif not isinstance(value, torch.Tensor):
            return False
    return True


class _IndexSelectGather:
    """``get(index)`` for an integer index tensor: ``index_select`` along the first dim."""

    def get(self, index):
        if not (isinstance(index, torch.Tensor) and index.ndim
                and index.dtype in (torch.int64, torch.int32) and self.initialized):
            return super().get(index)
        stored = self._storage if self._is_full else self._storage[: self._len_along_dim0]
        tensor = isinstance(stored, torch.Tensor)
        if not (tensor or type(stored) is TensorDict and _plain(stored)) or not stored.shape[0]:
            return super().get(index)  # other layouts, and the errors of an empty storage: TorchRL's
        flat = index.reshape(-1)
        flat = torch.where(flat < 0, flat + stored.shape[0], flat)  # from the end, as tensor[index]

        def gather(value: torch.Tensor) -> torch.Tensor:  # each entry on its own device
            return value.index_select(0, flat.to(value.device)).unflatten(0, index.shape)

        try:
            if tensor:
                return gather(stored)
            return stored.apply(gather, batch_size=[*index.shape, *stored.batch_size[1:]])
        except IndexError:  # a step out of range: TorchRL's gather raises its own IndexError, naming the step
            return super().get(index)


class IndexSelectStorage(_IndexSelectGather, LazyTensorStorage):
    """TorchRL's :class:`~torchrl.data.LazyTensorStorage` gathering sampled steps with
    ``index_select`` (several times faster for large rows such as images on CPU).

    Same arguments, layout, checkpoints and results as ``LazyTensorStorage``; only how
    ``storage.get(index)`` (what ``rb.sample()`` calls) reads differs, for an integer (int64 or
    int32) index tensor of any shape ``S`` into the first storage dim over a plain tensor or a
    TensorDict of tensors (nested TensorDicts with the root's batch dims, no dim names): it
    returns a TensorDict (or tensor) of batch size ``[*S, *storage_batch[1:]]``, each entry read
    by ``index_select`` (negative steps count from the end, as in ``tensor[index]``). Other
    indexes and layouts (non-tensor data, nested batch dims, dim names, a tensorclass) are read
    by TorchRL's ``get``.

    Raises:
        IndexError: a step at or beyond the number of stored steps (TorchRL's error).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import TensorDictReplayBuffer
        >>> from torchrl_seqchunk import IndexSelectStorage, StreamChunkSampler
        >>> rb = TensorDictReplayBuffer(storage=IndexSelectStorage(100),
        ...                             sampler=StreamChunkSampler(2, 3), batch_size=6)
        >>> done = torch.zeros(10, 1, dtype=torch.bool); done[-1] = True
        >>> index = rb.extend(TensorDict({"observation": torch.zeros(10, 3, 8, 8, dtype=torch.uint8),
        ...                               ("next", "done"): done}, [10]))
        >>> rb.sample()["observation"].shape
        torch.Size([2, 3, 3, 8, 8])
    """


class IndexSelectMemmapStorage(_IndexSelectGather, LazyMemmapStorage):
    """TorchRL's :class:`~torchrl.data.LazyMemmapStorage` (memory-mapped files) gathering
    sampled steps with ``index_select``; otherwise as :class:`IndexSelectStorage`."""
