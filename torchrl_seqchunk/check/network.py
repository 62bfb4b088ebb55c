"""What the checker reads of a network: its stored memory, its outputs, one pass in either mode.

A pass walks the network as TorchRL's losses run it: a probabilistic actor builds its
distribution (``get_dist``, no sample drawn), every other module runs, exploration modules
(which change actions, not values) are skipped. The log-probability of the stored action
under that distribution is written under :data:`LOG_PROB` (not for a composite distribution,
whose heads the outputs they are built from are compared by).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDictBase, unravel_key
from tensordict.nn import (CompositeDistribution, ProbabilisticTensorDictModule, ProbabilisticTensorDictSequential, TensorDictModuleBase,
                           TensorDictSequential)
from torch import nn
from torchrl.modules import (AdditiveGaussianModule, EGreedyModule, GRUModule, LSTMModule,
                             OrnsteinUhlenbeckProcessModule, set_recurrent_mode)

from ..recurrent.module import ResetRNN

LOG_PROB = ("_check", "log_prob")
"""Where a pass writes the log-probability of the stored action, ``[*batch]`` (float)."""

_EXPLORATION = (EGreedyModule, AdditiveGaussianModule, OrnsteinUhlenbeckProcessModule)


@dataclass
class Memory:
    """One recurrent module's stored memory: its root ``keys`` (``("next", key)`` after a step)
    and whether a step writes the state it used at the root (``ResetRNN``) or leaves the input
    there and zeroes it internally at a reset (TorchRL's ``LSTMModule`` / ``GRUModule``, custom)."""

    keys: list
    writes_used: bool
    module: nn.Module | None = None


def find_memory(network: nn.Module, state_keys=None) -> list[Memory]:
    """The memories of ``network``: each ``ResetRNN``, ``LSTMModule`` and ``GRUModule`` in it, or
    one memory under ``state_keys`` (a custom recurrent module). A ValueError without either."""
    if state_keys is not None:
        keys = [state_keys] if isinstance(state_keys, str) or (
            isinstance(state_keys, tuple) and all(isinstance(k, str) for k in state_keys)) else list(state_keys)
        if not keys:
            raise ValueError("state_keys is empty; name the root keys where the policy stores its memory.")
        return [Memory([unravel_key(k) for k in keys], False)]
    found = []
    wrapped = {id(m.rnn) for m in network.modules() if isinstance(m, ResetRNN)}  # ResetRNN(lstm_module)
    for module in network.modules():
        if isinstance(module, ResetRNN):
            found.append(Memory(list(module.state_keys), True, module))
        elif id(module) in wrapped:
            continue
        elif isinstance(module, LSTMModule):
            found.append(Memory([unravel_key(k) for k in module.in_keys[1:3]], False, module))
        elif isinstance(module, GRUModule):
            found.append(Memory([unravel_key(module.in_keys[1])], False, module))
    if not found:
        raise ValueError(
            "the network holds no ResetRNN, LSTMModule or GRUModule; for a custom recurrent module pass "
            "state_keys= naming the root keys where it stores the memory it acted with (its step writes "
            "the memory after the step under ('next', key))."
        )
    return found


def _dist_module(network: nn.Module) -> ProbabilisticTensorDictModule | None:
    return next((m for m in network.modules() if isinstance(m, ProbabilisticTensorDictModule)), None)


class Network:
    """A network the checker runs: ``run(td, sequence)`` is one pass (see the module docstring).

    Args:
        network (TensorDictModuleBase): the policy, or the part of it that trains.
        memories (list of Memory): from :func:`find_memory`.
    """

    def __init__(self, network: TensorDictModuleBase, memories: list[Memory]):
        if not isinstance(network, TensorDictModuleBase):
            raise TypeError(f"network must be a TensorDict module (TensorDictModuleBase), got "
                            f"{type(network).__name__}; wrap it in tensordict.nn.TensorDictModule.")
        self.module, self.memories = network, memories
        self.memory_keys = [k for m in memories for k in m.keys]
        dist = _dist_module(network)
        self.dist = dist
        if dist is None:
            self.action_key = self.log_prob_key = None
        else:
            samples = getattr(dist, "dist_sample_keys", None) or dist.out_keys[:1]
            self.action_key = unravel_key(samples[0])
            self.log_prob_key = unravel_key(getattr(dist, "log_prob_key", "sample_log_prob"))
        self.in_keys = [unravel_key(k) for k in network.in_keys]
        marks = [k for m in memories if isinstance(m.module, ResetRNN) for k in m.module.chunk_mark_keys]
        self.excluded = {*self.memory_keys, *map(unravel_key, marks)}

    def observation_keys(self, flags) -> list:
        """The network's inputs other than flags, memory and the action (what the reset check perturbs)."""
        own = {*self.memory_keys, *map(unravel_key, flags), self.action_key}
        for memory in self.memories:
            if isinstance(memory.module, ResetRNN):
                own.update(memory.module.reset_state_keys or ())
                own.update((memory.module.is_first_key, memory.module.init_key))
        return [k for k in self.in_keys if k not in own]

    def run(self, td: TensorDictBase, sequence: bool) -> TensorDictBase:
        """One pass over ``td`` (in place): step mode (``sequence=False``, one step of every row) or
        sequence mode (time the last batch dim); :data:`LOG_PROB` where the network holds a
        distribution and ``td`` the stored action."""
        action = td.get(self.action_key, None) if self.action_key is not None else None
        dists = []
        with torch.no_grad(), set_recurrent_mode(sequence):
            _walk(self.module, td, dists)
        if dists and action is not None and not isinstance(dists[0], CompositeDistribution):
            log_prob = dists[0].log_prob(action)
            td.set(LOG_PROB, log_prob.reshape(td.shape) if log_prob.numel() == td.numel() else log_prob)
        return td


def written_keys(before: set, after: TensorDictBase, excluded: set) -> list:
    """Float leaves of ``after`` not in ``before`` nor ``excluded``, none under ``"next"``."""
    keys = []
    for key in after.keys(True, True):
        key = unravel_key(key)
        if key in before or key in excluded or (isinstance(key, tuple) and key[0] == "next"):
            continue
        value = after.get(key)
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            keys.append(key)
    return keys


def _walk(module: nn.Module, td: TensorDictBase, dists: list) -> None:
    if isinstance(module, _EXPLORATION):
        return
    if isinstance(module, (ProbabilisticTensorDictSequential, ProbabilisticTensorDictModule)):
        dists.append(module.get_dist(td))
        return
    if type(module) in (TensorDictSequential,) or (
            isinstance(module, TensorDictSequential) and type(module).forward is TensorDictSequential.forward):
        for sub in module.module:
            _walk(sub, td, dists)
        return
    module(td)
