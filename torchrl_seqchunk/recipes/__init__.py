"""Trainers installed with the package: a Config dataclass and ``train(cfg) -> Run`` each.

What the recipes share (envs, agent, batching, PPO steps, run folder and report, option
checks) is the toolkit in ``common/``; the demos the curriculum recipe starts from ship
in ``data/``.
"""
