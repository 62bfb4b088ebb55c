"""Past one process: writer tags, per-rank streams, ingest and step-aligned checkpoints.

- :mod:`~torchrl_seqchunk.distributed.writers`: :class:`~torchrl_seqchunk.TagTrajectories`, trajectory ids unique across env workers (a collector ``postproc``).
- :mod:`~torchrl_seqchunk.distributed.ranks`: :func:`~torchrl_seqchunk.assign_workers` (the rank each env worker feeds), :func:`~torchrl_seqchunk.rank_seed` (a rank's sampler seed), and how ranks agree.
- :mod:`~torchrl_seqchunk.distributed.ingest`: :class:`~torchrl_seqchunk.IngestThread`, a collector's batches written into the learner's buffer from a thread of its process.
- :mod:`~torchrl_seqchunk.distributed.epochs`: :class:`~torchrl_seqchunk.EvenEpochs`, epochs cut to the chunk count every rank has, so DDP's collectives stay in step.
- :mod:`~torchrl_seqchunk.distributed.checkpoint`: :func:`~torchrl_seqchunk.save_checkpoint` / :func:`~torchrl_seqchunk.load_checkpoint`, step-aligned checkpoints resumed bit for bit.
- :mod:`~torchrl_seqchunk.distributed.manifest`: a checkpoint's manifest, checked field by field, replaced at once.
- :mod:`~torchrl_seqchunk.distributed.rng`: the state of every random generator of a process.
"""
