"""Step-aligned checkpoints of a run over several learner ranks.

Layout under ``path`` (the story is in the how-to page "Distributed")::

    manifest.json                  world size, step, worker -> rank map, data folder, versions
    data<n>/rank<r>/buffer/        rank r's replay buffer (TorchRL ``rb.dumps``)
    data<n>/rank<r>/state.pt       rank r's model, optimizer, sampler state, RNG states, step, extra
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torchrl.data import ReplayBuffer

from .._checks import check_int
from ..streams.prefetch import ChunkPrefetcher
from ..streams.sampler import StreamChunkSampler
from .fits import _check_agreement, _check_extra, _check_fits, _check_parts, _class_name, _storage_of, _unwrap
from .manifest import _check_workers, _read_manifest, _write_manifest
from .ranks import _on_every_rank, _world
from .rng import _rng_state, _set_rng_state

__all__ = ["load_checkpoint", "save_checkpoint"]


def _next_folder(path: Path) -> tuple[str, str | None]:
    """A fresh data folder name, and the one the manifest at ``path`` names (or None)."""
    try:
        live = _read_manifest(path)["folder"]
    except (FileNotFoundError, ValueError):
        return "data1", None
    number = live[4:] if live.startswith("data") else ""
    return f"data{int(number) + 1 if number.isdigit() else 1}", live


def save_checkpoint(
    path,
    *,
    step: int,
    buffer: ReplayBuffer,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    workers: list[int] | None = None,
    extra: dict[str, Any] | None = None,
    prefetcher: ChunkPrefetcher | None = None,
) -> Path:
    """Saves this rank's state at training step ``step``; call it on every rank at once.

    Rank ``r`` writes its buffer (``buffer.dumps``), its model's ``state_dict`` (with each
    :class:`~torchrl_seqchunk.ResetRNN`'s carry), its optimizer's, its sampler's state, the
    torch / NumPy / Python random states, ``step`` and ``extra`` into a fresh data folder;
    then rank 0 replaces ``manifest.json`` at once to point at it and removes the old one.
    The ranks agree after each stage that every one got through it, so a failure on one
    rank raises on all of them, and a process that crashes at any point leaves the old
    checkpoint whole (the files are not synced to disk: after an OS crash or a power loss
    the newest may be incomplete). Every rank must see the same ``path`` (one filesystem).
    Without an initialized process group it is a one-rank checkpoint.

    .. note:: Save with no :class:`~torchrl_seqchunk.IngestThread` writing and no
        :class:`~torchrl_seqchunk.EvenEpochs` iteration open. While a
        :class:`~torchrl_seqchunk.ChunkPrefetcher` draws from the buffer, pass it as
        ``prefetcher``, so the streams are saved as of the last chunk it delivered. Env
        trajectories in flight and collectors are not saved (see the how-to page).

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
        prefetcher (ChunkPrefetcher, optional): the prefetcher drawing from ``buffer``;
            its :meth:`~torchrl_seqchunk.ChunkPrefetcher.state_dict` is saved as the
            sampler's state. Defaults to ``None``.

    Returns:
        Path: ``path``.

    Raises:
        TypeError: ``buffer``, ``model`` or ``optimizer`` of the wrong kind (``None``);
            ``step`` not an int; ``workers`` not a list of ints; ``extra`` that
            ``torch.load(weights_only=True)`` cannot read back (checked on every rank
            before anything is written, so a checkpoint already at ``path`` stays whole).
        ValueError: ``workers`` naming a rank outside ``[0, world_size)``; a ``buffer``
            never written to (TorchRL cannot save its storage yet); a ``prefetcher`` of
            another sampler; ranks that pass different ``step`` or ``workers``, or whose
            manifests at ``path`` name different data folders (raised on every rank).
        RuntimeError: on the other ranks when some rank failed (any of the errors above,
            or an ``OSError`` writing its files): it names the ranks that failed; the
            checkpoint at ``path`` is as it was.

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
        _check_parts(buffer, model, optimizer)
        step = check_int("step", step)
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
        if prefetcher is not None and prefetcher.sampler is not buffer.sampler:
            raise ValueError(
                "prefetcher does not draw from buffer's sampler; pass the ChunkPrefetcher "
                "built on this buffer (or none)."
            )
        folder, live = _next_folder(path)
    with _on_every_rank("comparing the ranks' calls", untouched):
        _check_agreement(step, workers, folder)
    kept = f"the checkpoint at {path} is as it was (the new files are under no manifest)."
    with _on_every_rank("writing its files", kept):
        own = path / folder / f"rank{rank}"
        if own.is_dir():  # left by a save that crashed: under no manifest
            shutil.rmtree(own)
        own.mkdir(parents=True)
        buffer.dumps(own / "buffer")
        if prefetcher is not None:
            sampler = prefetcher.state_dict()
        else:
            sampler = buffer.sampler.state_dict() if isinstance(buffer.sampler, StreamChunkSampler) else None
        torch.save(
            {
                "step": step,
                "model": _unwrap(model).state_dict(),
                "optimizer": optimizer.state_dict(),
                "optimizer_class": _class_name(optimizer),
                "sampler": sampler,
                "storage": _storage_of(buffer),
                "rng": _rng_state(),
                "extra": extra,
            },
            own / "state.pt",
        )
    with _on_every_rank("writing the manifest", kept):
        if rank == 0:
            _write_manifest(path, world_size=world_size, step=step, workers=workers, folder=folder)
            if live is not None and live != ".":
                shutil.rmtree(path / live, ignore_errors=True)
    return path


def _read_checkpoint(
    path: Path, rank: int, world_size: int, workers
) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    """Rank ``rank``'s folder, its ``state.pt`` and the manifest, checked against the run."""
    manifest = _read_manifest(path)
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
    own = path / manifest["folder"] / f"rank{rank}"
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

    Loads the buffer, the sampler's streams, the model (with the carry), the optimizer and
    the random states saved by this rank, so the run continues bit for bit. Build
    ``buffer``, ``model`` and ``optimizer`` as for the saved run first, on as many ranks.
    Every rank first checks the checkpoint against its run (files, step, model keys and
    shapes, optimizer class, parameter groups and hyperparameters, sampler sizes, CUDA
    devices) and the ranks agree that all passed before anything loads.

    .. note:: ``lr`` may differ from the saved one (a scheduler's): it is restored, as
        are ``betas`` / ``momentum`` in a group whose scheduler cycles them (``OneCycleLR``,
        ``CyclicLR``: the group holds ``base_momentum``). Errors
        of TorchRL's ``buffer.loads`` past these checks can leave the buffer partly loaded.

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
        ValueError: a ``manifest.json`` that is not valid JSON, lacks a field or holds a
            field of the wrong type (``world_size: true``, ``step: 5.0``); a world
            size other than the saved one; a worker -> rank map other
            than the saved one; this rank's step differs from the manifest's (files of
            two checkpoints mixed); a ``model`` whose keys or shapes differ from the saved
            model's; an ``optimizer`` of another class, or whose parameter groups or their
            hyperparameters (but those a scheduler moves, see the note) differ from the saved one's; a
            buffer of another storage class or capacity, or whose
            :class:`~torchrl_seqchunk.StreamChunkSampler` has other ``(num_streams,
            seq_len)`` or settings; generators saved for more CUDA devices than this
            process sees.
        TypeError: ``buffer``, ``model`` or ``optimizer`` of the wrong kind; ``workers``
            not a list of ints.
        RuntimeError: on the other ranks when some rank failed a check; it names them.
    """
    path = Path(path)
    rank, world_size = _world()
    untouched = ("nothing was loaded: the buffer, model, optimizer and random generators of "
                 "every rank are as they were.")
    with _on_every_rank(f"checking the checkpoint at {path}", untouched):
        _check_parts(buffer, model, optimizer)
        own, state, manifest = _read_checkpoint(path, rank, world_size, workers)
        _check_fits(rank, state, buffer, model, optimizer)
    buffer.loads(own / "buffer")
    if state["sampler"] is not None:  # the streams as saved (a prefetcher's delivered ones)
        buffer.sampler.load_state_dict(state["sampler"])
    _unwrap(model).load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    _set_rng_state(state["rng"])
    return {"step": state["step"], "extra": state["extra"], "manifest": manifest}
