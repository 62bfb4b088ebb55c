"""What a checkpoint must match: the checks :func:`save_checkpoint` and :func:`load_checkpoint`
run on every rank before anything is written or loaded."""
from __future__ import annotations

import copy
import io
import json
import zlib
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torchrl.data import ReplayBuffer

from ..streams.sampler import StreamChunkSampler
from .ranks import _all_reduce


def _unwrap(model: nn.Module) -> nn.Module:
    """The module inside ``DistributedDataParallel`` (its state dict has no ``module.``)."""
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


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


def _class_name(obj) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return torch.equal(torch.as_tensor(a), torch.as_tensor(b))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b


# what a scheduler moves, restored from the checkpoint rather than compared: the learning rate
_SCHEDULED = {"params", "lr", "initial_lr"}


def _hyperparameter_differences(saved: list[dict], here: list[dict]) -> list[str]:
    """The hyperparameters that differ, by group (not those a scheduler moves: the learning rate,
    and in a group whose scheduler cycles the momentum (OneCycleLR, CyclicLR: ``base_momentum``)
    ``momentum`` and the first of ``betas``)."""
    differences = []
    for i, (old, new) in enumerate(zip(saved, here)):
        cycled = "base_momentum" in old and "base_momentum" in new
        for key in sorted((old.keys() | new.keys()) - _SCHEDULED - ({"momentum"} if cycled else set())):
            a, b = old.get(key, "<absent>"), new.get(key, "<absent>")
            if cycled and key == "betas" and isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
                a, b = a[1:], b[1:]  # the cycled beta1 is restored, beta2 compared
            if not _equal(a, b):
                differences.append(f"group {i} {key}: saved {a!r}, here {b!r}")
    return differences


def _check_optimizer(rank: int, state: dict[str, Any], optimizer: torch.optim.Optimizer) -> None:
    saved_class = state["optimizer_class"]
    if saved_class != _class_name(optimizer):
        raise ValueError(
            f"optimizer is a {_class_name(optimizer)}, rank {rank} saved a {saved_class}; "
            "build it as for the saved run."
        )
    try:  # on a shallow copy, load_state_dict replaces the copy's state and param_groups
        copy.copy(optimizer).load_state_dict(state["optimizer"])
    except Exception as error:
        raise ValueError(
            f"optimizer does not fit rank {rank}'s saved optimizer ({type(error).__name__}: "
            f"{error}); build it as for the saved run (the same parameter groups)."
        ) from error
    differences = _hyperparameter_differences(state["optimizer"]["param_groups"], optimizer.param_groups)
    if differences:
        raise ValueError(
            f"optimizer's hyperparameters differ from rank {rank}'s saved ones "
            f"({'; '.join(differences)}); build it with the saved hyperparameters."
        )


def _check_parts(buffer, model, optimizer) -> None:
    """TypeError for a part that is not what it must be (checked before anything is written or loaded)."""
    for name, value, kind, what in (("buffer", buffer, ReplayBuffer, "a TorchRL ReplayBuffer"),
                                    ("model", model, nn.Module, "an nn.Module"),
                                    ("optimizer", optimizer, torch.optim.Optimizer, "a torch.optim.Optimizer")):
        if not isinstance(value, kind):
            raise TypeError(f"{name} must be {what}, got {type(value).__name__}; pass this rank's {name}.")


def _storage_of(buffer: ReplayBuffer) -> dict[str, Any]:
    """What a saved storage must equal to load: its class and capacity."""
    return {"class": _class_name(buffer.storage), "max_size": getattr(buffer.storage, "max_size", None)}


def _check_agreement(step: int, workers, folder: str) -> None:
    """Raises on every rank when the ranks' ``step``, ``workers`` or data folder differ (a
    folder differs where ranks on separate filesystems read different manifests; ranks whose
    manifests agree, as on a first save, pass)."""
    if not dist.is_initialized():
        return
    mine = [step, zlib.crc32(json.dumps(workers).encode()), zlib.crc32(folder.encode())]
    highest = _all_reduce(mine + [-value for value in mine], dist.ReduceOp.MAX)  # max, then -min
    if highest[:3] != [-value for value in highest[3:]]:
        raise ValueError(
            f"the ranks called save_checkpoint with different step or workers, or see different "
            f"checkpoints at the path (rank {dist.get_rank()}: step {step}, workers {workers}, data "
            f"folder {folder}); call it on every rank at once with the same step and workers, on a "
            "path every rank shares (one filesystem)."
        )


def _check_fits(
    rank: int, state: dict[str, Any], buffer: ReplayBuffer, model: nn.Module,
    optimizer: torch.optim.Optimizer,
) -> None:
    """Raises where loading rank ``rank``'s saved ``state`` would fail midway, leaving some
    parts loaded: checked before anything is loaded."""
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
    _check_optimizer(rank, state, optimizer)
    saved_storage = state.get("storage")  # a checkpoint saved before storages were kept: not compared
    if saved_storage is not None and saved_storage != _storage_of(buffer):
        raise ValueError(
            f"buffer's storage is {_storage_of(buffer)}, rank {rank} saved {saved_storage}; build the "
            "buffer's storage as for the saved run (the same class and capacity)."
        )
    if state["sampler"] is not None:
        if not isinstance(buffer.sampler, StreamChunkSampler):
            raise ValueError(
                f"rank {rank} saved a StreamChunkSampler's state, this buffer samples with a "
                f"{type(buffer.sampler).__name__}; build the buffer as for the saved run."
            )
        buffer.sampler.check_state_dict(state["sampler"])
    devices = len(state["rng"]["cuda"])
    if devices > torch.cuda.device_count():
        raise ValueError(
            f"rank {rank} saved the random generators of {devices} CUDA device(s), this process "
            f"sees {torch.cuda.device_count()}; resume with as many GPUs per rank."
        )
