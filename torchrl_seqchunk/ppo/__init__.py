"""Recurrent PPO on windows that cross episode boundaries.

- ``windows.py``: :func:`~torchrl_seqchunk.make_windows`, windows of rollouts with reset flags and the stored memory.
- ``advantages.py``: :func:`~torchrl_seqchunk.boundary_gae`, GAE that stops at every boundary.
- ``slots.py``: which window slots train under each boundary mode, :func:`~torchrl_seqchunk.slot_weights`, and the one reduction of the loss's per-slot terms.
- ``loss.py``: :class:`~torchrl_seqchunk.RecurrentPPOLoss` (``ClipPPOLoss`` on windows, by boundary mode).
"""
