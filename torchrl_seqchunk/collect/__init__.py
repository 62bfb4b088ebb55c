"""The acting path on plain tensors: rollouts of in-process vector envs in TorchRL's layout.

- ``collector.py``: :class:`~torchrl_seqchunk.VectorEnvCollector`, TorchRL's ``Collector`` on a
  gymnasium vector env and its transforms, without per-step TensorDict work.
- ``policy.py``: :func:`~torchrl_seqchunk.tensor_policy`, a TensorDict policy's step on a dict of tensors.
"""
