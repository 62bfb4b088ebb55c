"""A recurrence checker to run on one's own pipeline: acting step by step against training.

:func:`check_recurrence` re-runs a rollout (collected from an env, or given) in the layout a
pipeline trains in and reports, per named check, pass or fail with the first offending
``(env, t)`` and the size of the difference; ``python -m torchrl_seqchunk.check`` runs it on a
gymnasium id with the library's own pipelines. See ``docs/howto/check.md``.
"""
from .api import CHECKS, check_recurrence
from .dqn import DQNStreamLayout
from .layouts import TRAINED, SliceLayout, StreamLayout, TrainingLayout, WindowLayout
from .report import CheckResult, RecurrenceReport

__all__ = ["CHECKS", "CheckResult", "DQNStreamLayout", "RecurrenceReport", "SliceLayout", "StreamLayout", "TRAINED",
           "TrainingLayout", "WindowLayout", "check_recurrence"]
