"""Past one process: what scaling the streams over several writers and learners needs.

Each learner rank owns its buffer, its :class:`~torchrl_seqchunk.StreamChunkSampler`
(seeded by the run's seed and its rank), its :class:`~torchrl_seqchunk.ChunkPrefetcher`
and its :class:`~torchrl_seqchunk.ResetRNN` carry; env workers feed the ranks they are
assigned to; learners train with ``torch.distributed`` (``DistributedDataParallel``).

DDP and the carry: a :class:`~torchrl_seqchunk.ResetRNN` keeps its carried state in a
plain attribute, saved in ``state_dict`` as the module's extra state, not as a registered
buffer, so ``DistributedDataParallel`` neither broadcasts it at construction nor before
each forward (``broadcast_buffers`` covers buffers only): every rank keeps the state of
its own streams, while the parameters (a learned initial state too) stay equal.

- :class:`~torchrl_seqchunk.TagTrajectories`: makes trajectory ids unique across env workers writing into one buffer (a collector ``postproc``).
- :func:`~torchrl_seqchunk.assign_workers`: the rank each env worker feeds (round robin).
- :func:`~torchrl_seqchunk.rank_seed`: a rank's sampler seed from the run's seed and the rank.
- :class:`~torchrl_seqchunk.IngestThread`: writes a collector's batches into the learner's buffer from a thread of the learner process.
- :class:`~torchrl_seqchunk.EvenEpochs`: epochs without replacement cut to the chunk count every rank has, so DDP's collectives stay in step.
- :func:`~torchrl_seqchunk.save_checkpoint` / :func:`~torchrl_seqchunk.load_checkpoint`: step-aligned checkpoints (per-rank buffer, sampler, model with carry, optimizer, RNG; a manifest), resumed bit for bit.
"""
