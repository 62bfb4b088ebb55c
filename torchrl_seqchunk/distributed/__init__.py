"""Past one process: what scaling the streams over several writers and learners needs.

- :class:`~torchrl_seqchunk.TagTrajectories`: makes trajectory ids unique across env workers writing into one buffer (a collector ``postproc``).
"""
