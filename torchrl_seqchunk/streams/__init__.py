"""Stream chunks: episodes drawn in proportion to their length, cut into ``[B, T]`` chunks.

- :mod:`~torchrl_seqchunk.streams.sampler`: :class:`~torchrl_seqchunk.StreamChunkSampler`, a TorchRL sampler of ``[B, T]`` chunks of B persistent streams, with ``is_first``.
- :mod:`~torchrl_seqchunk.streams.prefetch`: :class:`~torchrl_seqchunk.ChunkPrefetcher`, chunks prepared in a background thread, in order, each with the sampler's state after it.
- :mod:`~torchrl_seqchunk.streams.storage`: :class:`~torchrl_seqchunk.IndexSelectStorage` and :class:`~torchrl_seqchunk.IndexSelectMemmapStorage`, TorchRL's lazy storages gathering sampled steps with ``index_select``.
- :mod:`~torchrl_seqchunk.streams.writes`: the write log (what was written when, what was lost, writes that bypassed the buffer).
- :mod:`~torchrl_seqchunk.streams.episodes`: the episode index (episodes found in new steps, drawn in proportion to length).
- :mod:`~torchrl_seqchunk.streams.queues`: the stream queues (segments of episodes, epochs dealt without replacement).
"""
