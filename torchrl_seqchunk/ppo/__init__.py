"""Recurrent PPO on windows that cross episode boundaries.

- :func:`~torchrl_seqchunk.make_windows`: cuts ``[num_envs, T]`` rollouts into windows with reset flags and the stored memory.
- :func:`~torchrl_seqchunk.boundary_gae`: GAE that stops at every boundary (termination, truncation, chunk ends).
- :class:`~torchrl_seqchunk.RecurrentPPOLoss`: ``ClipPPOLoss`` on windows (``reset_continue``, ``mask``, ``inverse_count``).
- :func:`~torchrl_seqchunk.slot_weights`: how much each window slot weighs in that loss, per boundary mode.
"""
