"""The state of every random generator a process uses (torch CPU and CUDA, NumPy, Python), as tensors and ints."""
from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def _rng_state() -> dict[str, Any]:
    """torch (CPU and every CUDA device), NumPy and Python generators, loadable with
    ``torch.load(weights_only=True)``."""
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
