"""The manifest of a checkpoint: what it holds and where, written last and replaced at once."""
from __future__ import annotations

import json
from collections.abc import Iterable
import platform
from pathlib import Path
from typing import Any

import tensordict
import torch
import torchrl

from .._checks import check_int

MANIFEST = "manifest.json"


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


def _read_manifest(path: Path) -> dict[str, Any]:
    """The manifest at ``path``, every field checked; raises for anything else."""
    if not (path / MANIFEST).is_file():
        raise FileNotFoundError(
            f"{path / MANIFEST} not found: {path} is not a checkpoint, or an incomplete one "
            "(rank 0 writes the manifest after every rank saved); load a complete checkpoint."
        )
    try:
        saved = json.loads((path / MANIFEST).read_text())
        manifest = {key: saved[key] for key in ("world_size", "step", "workers", "versions")}
        check_int("world_size", manifest["world_size"], low=1)
        check_int("step", manifest["step"])
        _check_workers(manifest["workers"])
        manifest["folder"] = saved.get("folder", ".")  # ".": rank folders beside the manifest
        folder = manifest["folder"]
        if not isinstance(folder, str) or folder in ("", "..") or "/" in folder or "\\" in folder:
            raise TypeError(f"folder must name a folder inside the checkpoint, got {folder!r}")
    except (ValueError, KeyError, TypeError) as error:  # not JSON, or not a manifest's fields
        raise ValueError(
            f"{path / MANIFEST} is not a checkpoint manifest ({type(error).__name__}: "
            f"{error}); it was damaged or written by something else: load another checkpoint."
        ) from error
    return manifest


def _write_manifest(path: Path, *, world_size: int, step: int, workers, folder: str) -> None:
    """Writes the manifest in one step (a reader sees the old one or the new one whole)."""
    from .. import __version__

    manifest = {
        "world_size": world_size,
        "step": step,
        "workers": workers,
        "folder": folder,
        "versions": {
            "torchrl_seqchunk": __version__, "torch": torch.__version__,
            "torchrl": torchrl.__version__, "tensordict": tensordict.__version__,
            "python": platform.python_version(),
        },
    }
    written = path / f"{MANIFEST}.tmp"
    written.write_text(json.dumps(manifest, indent=2))
    written.replace(path / MANIFEST)
