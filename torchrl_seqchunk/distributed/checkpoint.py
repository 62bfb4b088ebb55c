"""Step-aligned checkpoints of a run over several learner ranks.

Every rank saves what only it holds (its buffer with its sampler's streams, its model with
the :class:`~torchrl_seqchunk.ResetRNN` carry, its optimizer and random generators), all
at the same training step, and rank 0 writes a manifest last: a checkpoint without the
manifest is incomplete. No rank writes before rank 0 has removed the old manifest, and
the ranks agree after each stage that every one of them got through it, so a failure on
one rank raises on all of them. A run loaded from one continues exactly as it would have.

Layout under ``path``::

    manifest.json          world size, step, worker -> rank map, versions (rank 0)
    rank<r>/buffer/        rank r's replay buffer (TorchRL ``rb.dumps``: storage,
                           sampler state with its generator, writer)
    rank<r>/state.pt       rank r's model, optimizer, RNG states, step, extra
"""
from __future__ import annotations

import copy
import io
import json
import platform
import random
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import tensordict
import torch
import torch.distributed as dist
import torchrl
from torch import nn
from torchrl.data import ReplayBuffer

from ..streams.sampler import StreamChunkSampler
from .ranks import _all_reduce

__all__ = ["load_checkpoint", "save_checkpoint"]

MANIFEST = "manifest.json"


def _world() -> tuple[int, int]:
    """(rank, world size); (0, 1) without an initialized process group."""
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


@contextmanager
def _on_every_rank(stage: str, consequence: str) -> Iterator[None]:
    """Runs the block, then every rank learns whether it failed on some rank (an
    ``all_reduce`` of failure flags, which is also a barrier): a rank that failed raises its
    own error, the others a ``RuntimeError`` naming the ranks that failed, so none is left
    waiting in a later collective. Without a process group it only runs the block."""
    error = None
    try:
        yield
    except Exception as caught:  # raised below, once every rank knows
        error = caught
    if dist.is_initialized():
        rank, world_size = _world()
        flags = [int(r == rank and error is not None) for r in range(world_size)]
        failed = [r for r, flag in enumerate(_all_reduce(flags, dist.ReduceOp.SUM)) if flag]
    else:
        failed = []
    if error is not None:
        raise error
    if failed:
        raise RuntimeError(
            f"rank(s) {failed} failed while {stage} (their own errors say why and how to fix "
            f"it); {consequence}"
        )


def _unwrap(model: nn.Module) -> nn.Module:
    """The module inside ``DistributedDataParallel`` (its state dict has no ``module.``)."""
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def _rng_state() -> dict[str, Any]:
    """torch (CPU and every CUDA device), NumPy and Python generators, as tensors and ints
    (loadable with ``torch.load(weights_only=True)``)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, words, gauss_next = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": pos,
                  "has_gauss": has_gauss, "gauss": gauss},
        "python": {"version": version, "words": list(words), "gauss_next": gauss_next},
    }


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"]:
        torch.cuda.set_rng_state_all(state["cuda"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"],
                         n["has_gauss"], n["gauss"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["words"]), p["gauss_next"]))


def _check_workers(workers) -> list[int] | None:
    if workers is None:
        return None
    ranks = list(workers) if isinstance(workers, Iterable) else [None]
    if not all(isinstance(r, int) and not isinstance(r, bool) for r in ranks):
        raise TypeError(
            f"workers must be a list of ranks (ints), got {workers!r}; pass "
            "assign_workers(num_workers, world_size)."
        )
    return ranks


def _check_extra(extra) -> None:
    """Refuses an ``extra`` that :func:`load_checkpoint`'s ``torch.load(weights_only=True)``
    could not read back, before anything is written."""
    saved = io.BytesIO()
    try:
        torch.save(extra, saved)
        saved.seek(0)
        torch.load(saved, weights_only=True)
    except Exception as error:
        raise TypeError(
            f"extra={extra!r:.200} cannot be saved and loaded back with "
            f"torch.load(weights_only=True) ({type(error).__name__}); "
            "pass tensors, numbers, strings, and dicts, lists or tuples of them (NumPy "
            "arrays as torch.from_numpy(a), a TensorDict as td.to_dict())."
        ) from error


def _check_fits(
    rank: int, state: dict[str, Any], own: Path, buffer: ReplayBuffer, model: nn.Module,
    optimizer: torch.optim.Optimizer,
) -> None:
    """Raises where loading rank ``rank``'s saved ``state`` and buffer folder ``own / "buffer"``
    would fail midway, leaving some parts loaded: checked before anything is loaded."""
    saved, here = state["model"], _unwrap(model).state_dict()
    missing, unexpected = sorted(here.keys() - saved.keys()), sorted(saved.keys() - here.keys())
    resized = [
        f"{key}: saved {list(saved[key].shape)}, here {list(value.shape)}"
        for key, value in here.items()
        if isinstance(value, torch.Tensor) and isinstance(saved.get(key), torch.Tensor)
        and saved[key].shape != value.shape
    ]
    differences = [f"{what} {keys}" for what, keys in [
        ("keys the save lacks", missing), ("keys the model lacks", unexpected),
        ("other shapes", resized)] if keys]
    if differences:
        raise ValueError(
            f"model does not fit rank {rank}'s saved model ({'; '.join(differences)}); build "
            "the model as for the saved run."
        )
    try:  # on a shallow copy, load_state_dict replaces the copy's state and param_groups
        copy.copy(optimizer).load_state_dict(state["optimizer"])
    except Exception as error:
        raise ValueError(
            f"optimizer does not fit rank {rank}'s saved optimizer ({type(error).__name__}: "
            f"{error}); build it as for the saved run (the same parameter groups)."
        ) from error
    if isinstance(buffer.sampler, StreamChunkSampler):  # TorchRL loads the storage before it
        buffer.sampler._check_sizes(StreamChunkSampler._read(own / "buffer" / "sampler"))
    devices = len(state["rng"]["cuda"])
    if devices > torch.cuda.device_count():
        raise ValueError(
            f"rank {rank} saved the random generators of {devices} CUDA device(s), this process "
            f"sees {torch.cuda.device_count()}; resume with as many GPUs per rank."
        )


def save_checkpoint(
    path,
    *,
    step: int,
    buffer: ReplayBuffer,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    workers: list[int] | None = None,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Saves this rank's state at training step ``step``; call it on every rank at once.

    In stages, each ended by an agreement of all ranks that every one got through it (an
    ``all_reduce`` of failure flags, also a barrier): every rank checks its arguments;
    rank 0 removes the old ``manifest.json``; rank ``r`` writes ``path/rank<r>/``: its
    buffer (``buffer.dumps``: storage, the :class:`~torchrl_seqchunk.StreamChunkSampler`'s
    streams and generator, the writer), the model's ``state_dict`` (with each
    :class:`~torchrl_seqchunk.ResetRNN`'s carry, its extra state), the optimizer's, the
    torch (CPU and CUDA), NumPy and Python random states, ``step`` and ``extra``; rank 0
    writes ``manifest.json`` (``world_size``, ``step``, ``workers``, library versions).
    So a checkpoint holding a manifest is complete on every rank, a crash at any point
    leaves either the old checkpoint whole or no manifest, and a failure on one rank
    raises on every rank instead of leaving the others waiting. Without an initialized
    process group it is a one-rank checkpoint.

    Save between epochs, with no :class:`~torchrl_seqchunk.ChunkPrefetcher` or
    :class:`~torchrl_seqchunk.EvenEpochs` iteration open (a running prefetcher's chunks
    are saved as not drawn, but an epoch's agreed count is not saved), and with no
    :class:`~torchrl_seqchunk.IngestThread` writing (one on demand between its batches).
    What is not saved, so not resumed: env trajectories in flight and the collectors'
    state (a resumed run restarts its collectors, whose envs start new episodes: the steps
    already in the buffer are kept, the unfinished trajectories of the envs are not
    continued); env transforms' statistics unless passed in ``extra``.

    Args:
        path (str or Path): the checkpoint folder (created; files in it are replaced).

    Keyword Args:
        step (int): the training step, saved and checked at load.
        buffer (ReplayBuffer): this rank's buffer.
        model (nn.Module): this rank's model, plain or ``DistributedDataParallel``
            (the inner module is saved).
        optimizer (torch.optim.Optimizer): this rank's optimizer.
        workers (list[int], optional): the rank of each env worker
            (:func:`~torchrl_seqchunk.assign_workers`), kept in the manifest and checked
            at load. Defaults to ``None``.
        extra (dict, optional): anything else of this rank to save (``torch.save``-able
            tensors, numbers, strings, containers of them), e.g. env transform state
            dicts. Defaults to ``None``.

    Returns:
        Path: ``path``.

    Raises:
        TypeError: ``step`` not an int; ``workers`` not a list of ints; ``extra`` that
            ``torch.load(weights_only=True)`` cannot read back (checked on every rank
            before anything is written, so a checkpoint already at ``path`` stays whole).
        ValueError: ``workers`` naming a rank outside ``[0, world_size)``; a ``buffer``
            never written to (TorchRL cannot save its storage yet).
        RuntimeError: on the other ranks when some rank failed (any of the errors above,
            or an ``OSError`` writing its files): it names the ranks that failed and whether
            the checkpoint at ``path`` is as it was or incomplete (no manifest).

    Examples:
        >>> import tempfile, torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
        >>> from torchrl_seqchunk import StreamChunkSampler, load_checkpoint, save_checkpoint
        >>> def make():
        ...     return TensorDictReplayBuffer(storage=LazyTensorStorage(10),
        ...                                   sampler=StreamChunkSampler(1, 2, seed=0), batch_size=2)
        >>> rb, model = make(), torch.nn.Linear(2, 1)
        >>> optim = torch.optim.Adam(model.parameters())
        >>> done = torch.tensor([0, 0, 1], dtype=torch.bool).unsqueeze(-1)
        >>> _ = rb.extend(TensorDict({"obs": torch.arange(3), ("next", "done"): done}, [3]))
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     _ = save_checkpoint(folder, step=5, buffer=rb, model=model, optimizer=optim)
        ...     rb2, model2 = make(), torch.nn.Linear(2, 1)
        ...     optim2 = torch.optim.Adam(model2.parameters())
        ...     loaded = load_checkpoint(folder, buffer=rb2, model=model2, optimizer=optim2)
        >>> loaded["step"], len(rb2), torch.equal(model2.weight, model.weight)
        (5, 3, True)
    """
    rank, world_size = _world()
    path = Path(path)
    untouched = f"nothing was written: a checkpoint at {path} is as it was."
    with _on_every_rank("checking the arguments of save_checkpoint", untouched):
        if isinstance(step, bool) or not isinstance(step, int):
            raise TypeError(f"step must be an int, got {step!r} ({type(step).__name__}).")
        workers = _check_workers(workers)
        _check_extra(extra)
        if not getattr(buffer.storage, "initialized", True):  # TorchRL refuses to dump it
            raise ValueError(
                f"rank {rank}'s buffer was never written to: TorchRL cannot save its "
                f"{type(buffer.storage).__name__} before it holds data. Save after the first "
                "rb.extend of every rank."
            )
        if workers is not None and not all(0 <= r < world_size for r in workers):
            raise ValueError(
                f"workers={workers} names ranks outside [0, world_size) = [0, {world_size}); "
                "pass assign_workers(num_workers, world_size)."
            )
    # no rank writes before the old manifest is gone: files of two steps under a manifest
    # would pass load_checkpoint's step check when the buffer is new and state.pt old
    with _on_every_rank("removing the old manifest", untouched):
        if rank == 0:
            (path / MANIFEST).unlink(missing_ok=True)
    incomplete = f"{path} holds no manifest (an incomplete checkpoint): save again."
    with _on_every_rank("writing its files", incomplete):
        own = path / f"rank{rank}"
        own.mkdir(parents=True, exist_ok=True)
        buffer.dumps(own / "buffer")
        torch.save(
            {
                "step": step,
                "model": _unwrap(model).state_dict(),
                "optimizer": optimizer.state_dict(),
                "rng": _rng_state(),
                "extra": extra,
            },
            own / "state.pt",
        )
    with _on_every_rank("writing the manifest", incomplete):
        if rank == 0:
            from .. import __version__

            manifest = {
                "world_size": world_size,
                "step": step,
                "workers": workers,
                "versions": {
                    "torchrl_seqchunk": __version__, "torch": torch.__version__,
                    "torchrl": torchrl.__version__, "tensordict": tensordict.__version__,
                    "python": platform.python_version(),
                },
            }
            written = path / f"{MANIFEST}.tmp"  # replaced at once: never half a manifest
            written.write_text(json.dumps(manifest, indent=2))
            written.replace(path / MANIFEST)
    return path


def _read_checkpoint(
    path: Path, rank: int, world_size: int, workers
) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    """Rank ``rank``'s folder, its ``state.pt`` and the manifest, checked against the run."""
    if not (path / MANIFEST).is_file():
        raise FileNotFoundError(
            f"{path / MANIFEST} not found: {path} is not a checkpoint, or an incomplete one "
            "(rank 0 writes the manifest after every rank saved); load a complete checkpoint."
        )
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        manifest = {key: manifest[key] for key in ("world_size", "step", "workers", "versions")}
    except (ValueError, KeyError, TypeError) as error:  # not JSON, or not a manifest's fields
        raise ValueError(
            f"{path / MANIFEST} is not a checkpoint manifest ({type(error).__name__}: "
            f"{error}); it was damaged or written by something else: load another checkpoint."
        ) from error
    if manifest["world_size"] != world_size:
        raise ValueError(
            f"world size changed: the checkpoint at {path} was saved by "
            f"{manifest['world_size']} ranks, this run has world_size={world_size}. Each "
            "rank's buffer, streams and ResetRNN carry belong to that rank and are not "
            f"split or merged; resume with {manifest['world_size']} learner ranks."
        )
    workers = _check_workers(workers)
    if workers is not None and manifest["workers"] is not None and workers != manifest["workers"]:
        raise ValueError(
            f"workers={workers} differs from the saved worker -> rank map "
            f"{manifest['workers']}; resume with the saved map (each rank's buffer holds "
            "its own workers' trajectories)."
        )
    own = path / f"rank{rank}"
    for needed in (own / "state.pt", own / "buffer"):
        if not needed.exists():
            raise FileNotFoundError(f"{needed} not found: rank {rank}'s files are missing.")
    state = torch.load(own / "state.pt", weights_only=True)
    if state["step"] != manifest["step"]:
        raise ValueError(
            f"rank {rank}'s files are of step {state['step']}, the manifest of step "
            f"{manifest['step']}: {path} mixes two checkpoints; save it again."
        )
    return own, state, manifest


def load_checkpoint(
    path,
    *,
    buffer: ReplayBuffer,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    workers: list[int] | None = None,
) -> dict[str, Any]:
    """Restores this rank's state from :func:`save_checkpoint`; call it on every rank.

    Loads the buffer (storage, sampler streams and generator, writer), the model (with
    the carry), the optimizer and the random states saved by this rank, so the run
    continues bit for bit as it would have from that step (with the same code and data
    source; see :func:`save_checkpoint` for what is not saved). Build ``buffer``,
    ``model`` and ``optimizer`` as for the saved run first.

    The world size must equal the saved one: a rank's buffer, streams and carry belong
    to that rank, and spreading them over another number of ranks is not defined.

    Every rank first checks the checkpoint against its run (the files, the step, the
    model's keys and shapes, the optimizer's parameter groups, a
    :class:`~torchrl_seqchunk.StreamChunkSampler`'s sizes, the CUDA devices) and the ranks
    agree that all of them passed (an ``all_reduce``) before any loads: a failed check
    leaves the buffer, model, optimizer and random generators of every rank as they were.
    Errors of TorchRL's ``buffer.loads`` past these checks (a buffer of another capacity or
    storage kind) can leave the buffer partly loaded: build it as for the saved run.

    Args:
        path (str or Path): the checkpoint folder.

    Keyword Args:
        buffer (ReplayBuffer): this rank's buffer, built as in the saved run.
        model (nn.Module): this rank's model, plain or ``DistributedDataParallel``.
        optimizer (torch.optim.Optimizer): its optimizer.
        workers (list[int], optional): this run's worker -> rank map, which must equal the
            saved one when both are given. Defaults to ``None``.

    Returns:
        dict: ``{"step": int, "extra": ..., "manifest": dict}``.

    Raises:
        FileNotFoundError: no ``manifest.json`` (not a checkpoint, or an incomplete one),
            or no files of this rank.
        ValueError: a ``manifest.json`` that is not valid JSON or lacks a field; a world
            size other than the saved one; a worker -> rank map other
            than the saved one; this rank's step differs from the manifest's (files of
            two checkpoints mixed); a ``model`` whose keys or shapes differ from the saved
            model's; an ``optimizer`` whose parameter groups differ from the saved one's; a
            buffer whose :class:`~torchrl_seqchunk.StreamChunkSampler` has other
            ``(num_streams, seq_len)``; generators saved for more CUDA devices than this
            process sees.
        TypeError: ``workers`` not a list of ints.
        RuntimeError: on the other ranks when some rank failed a check; it names them.
    """
    path = Path(path)
    rank, world_size = _world()
    untouched = ("nothing was loaded: the buffer, model, optimizer and random generators of "
                 "every rank are as they were.")
    with _on_every_rank(f"checking the checkpoint at {path}", untouched):
        own, state, manifest = _read_checkpoint(path, rank, world_size, workers)
        _check_fits(rank, state, own, buffer, model, optimizer)
    buffer.loads(own / "buffer")
    _unwrap(model).load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    _set_rng_state(state["rng"])
    return {"step": state["step"], "extra": state["extra"], "manifest": manifest}

