"""Recurrent state with vectorized resets, carried across chunks.

- ``module.py``: :class:`~torchrl_seqchunk.ResetRNN`, the TensorDict module (sequence and step mode, the carry).
- ``functional.py``: :func:`~torchrl_seqchunk.rnn_with_resets`, the same without TensorDict.
- ``backends.py``: the unrolls over ``[B, T]`` with resets (``loop``, ``packed``, ``scan``).
- ``state.py``: what one row's state looks like (tensor, tuple, TensorDict) and the reset flags.
- ``carry.py``: the carried state and the marks that let a loss run the network more than once per chunk.
- ``step.py``: step mode's flags and stored state, checked.
- ``cells.py``: :class:`~torchrl_seqchunk.MinGRUCell`, a GRU linear in ``h`` that ``scan`` runs in parallel.
"""
