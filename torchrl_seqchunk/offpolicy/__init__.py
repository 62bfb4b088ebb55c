"""Recurrent off-policy learning (R2D2-style Q-learning, soft actor-critic) on stream chunks and replay windows.

- :func:`~torchrl_seqchunk.boundary_nstep_targets`: n-step Q targets that stop at termination, bootstrap at truncation and chunk ends, never cross an ``is_first``.
- :func:`~torchrl_seqchunk.unroll_with_next`: one unroll of a recurrent value network giving its values at every step and at every step's next observation, each under its memory.
- :class:`~torchrl_seqchunk.RecurrentDQNLoss`: (double) n-step DQN on ``[B, T]`` chunks or windows, each network carrying its own state per stream (or starting from a stored or zero state).
- :class:`~torchrl_seqchunk.RecurrentSACLoss`: soft actor-critic with a recurrent actor and critic (twin Q heads on one critic trunk, a target critic, automatic entropy), each carrying its own state per stream.
"""
