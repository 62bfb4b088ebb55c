"""Stream chunks: episodes drawn in proportion to their length, cut into ``[B, T]`` chunks.

- :class:`~torchrl_seqchunk.StreamChunkSampler`: a TorchRL sampler of ``[B, T]`` chunks of B persistent streams, with ``is_first``.
- :class:`~torchrl_seqchunk.ChunkPrefetcher`: prepares chunks in a background thread, in order.
"""
