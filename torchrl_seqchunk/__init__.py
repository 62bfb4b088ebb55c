"""torchrl_seqchunk: recurrent reinforcement learning on time-continuous data for TorchRL.

Public names are imported lazily (PEP 562), so ``import torchrl_seqchunk`` stays cheap
and optional dependencies (ale-py, for instance) are only needed by what uses them.
"""
import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "StreamChunkSampler": "streams.sampler",
    "ChunkPrefetcher": "streams.prefetch",
    "IndexSelectStorage": "streams.storage",
    "IndexSelectMemmapStorage": "streams.storage",
    "ResetRNN": "recurrent.module",
    "rnn_with_resets": "recurrent.functional",
    "MinGRUCell": "recurrent.cells",
    "make_windows": "ppo.windows",
    "RecurrentPPOLoss": "ppo.loss",
    "slot_weights": "ppo.slots",
    "boundary_gae": "ppo.advantages",
    "boundary_nstep_targets": "offpolicy.targets",
    "unroll_with_next": "offpolicy.unroll",
    "RecurrentDQNLoss": "offpolicy.loss",
    "RecurrentSACLoss": "offpolicy.sac",
    "Demo": "curriculum.demo",
    "record_demo": "curriculum.demo",
    "ResetManager": "curriculum.manager",
    "ReverseCurriculum": "curriculum.transform",
    "VectorEnvCollector": "collect.collector",
    "tensor_policy": "collect.policy",
    "EncodeObservation": "envs",
    "MaskObservation": "envs",
    "PreviousReward": "envs",
    "ReturnScaledReward": "reward_norm",
    "RunningObservationNorm": "reward_norm",
    "TagTrajectories": "distributed.writers",
    "assign_workers": "distributed.ranks",
    "rank_seed": "distributed.ranks",
    "IngestThread": "distributed.ingest",
    "EvenEpochs": "distributed.epochs",
    "save_checkpoint": "distributed.checkpoint",
    "load_checkpoint": "distributed.checkpoint",
    "check_recurrence": "check.api",
    "RecurrenceReport": "check.report",
    "CheckResult": "check.report",
    "TrainingLayout": "check.layouts",
    "WindowLayout": "check.layouts",
    "SliceLayout": "check.layouts",
    "StreamLayout": "check.layouts",
    "DQNStreamLayout": "check.dqn",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return __all__ + ["__version__"]
