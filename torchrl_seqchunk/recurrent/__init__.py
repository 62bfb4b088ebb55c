"""Recurrent state with vectorized resets, carried across chunks.

- :class:`~torchrl_seqchunk.ResetRNN`: a TensorDict module that resets rows where ``is_first`` and carries the state.
- :func:`~torchrl_seqchunk.rnn_with_resets`: the functional core, ``(rnn, x, is_first, h0, reset_state) -> (y, h_last)``.
- :class:`~torchrl_seqchunk.MinGRUCell`: a GRU linear in ``h`` that the ``scan`` backend runs in parallel.
"""
