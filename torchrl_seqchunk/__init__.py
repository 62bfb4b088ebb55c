"""torchrl_seqchunk: recurrent reinforcement learning on time-continuous data for TorchRL.

Public names are imported lazily (PEP 562), so ``import torchrl_seqchunk`` stays cheap
and optional dependencies (ale-py, for instance) are only needed by what uses them.
"""
import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "StreamChunkSampler": "sampler",
    "ChunkPrefetcher": "prefetch",
    "ResetRNN": "recurrent",
    "rnn_with_resets": "recurrent",
    "MinGRUCell": "recurrent",
    "make_windows": "windows",
    "RecurrentPPOLoss": "ppo",
    "boundary_gae": "advantages",
    "Demo": "demo",
    "record_demo": "demo",
    "ResetManager": "curriculum",
    "ReverseCurriculum": "curriculum",
    "MaskObservation": "envs",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return __all__ + ["__version__"]
