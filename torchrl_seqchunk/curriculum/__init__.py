"""Reverse curriculum from a single demonstration (Salimans & Chen 2018).

- :class:`~torchrl_seqchunk.Demo`: one demonstration (actions, rewards, snapshots, metadata), loaded from ``.npz``.
- :func:`~torchrl_seqchunk.record_demo`: records a demo by stepping an env through given actions.
- :class:`~torchrl_seqchunk.ResetManager`: the starting-point schedule (pure logic, shared by N envs).
- :class:`~torchrl_seqchunk.ReverseCurriculum`: the TorchRL env transform that assigns and restores starting points.
"""
