"""A TensorDict policy run on plain tensors: the acting step without TensorDict operations.

:func:`tensor_policy` walks a policy made of ``TensorDictSequential``, ``TensorDictModule``,
:class:`~torchrl_seqchunk.ResetRNN` (step mode) and a probabilistic module (TorchRL's
``ProbabilisticActor``) once, and returns a function that calls the same modules, in the same
order, on a ``dict`` of tensors keyed as the TensorDict would be. The values are those of the
TensorDict call, draw for draw (the same modules, the same distribution, TorchRL's own
``sample_and_log_prob``; a ``Categorical`` or TorchRL ``OneHotCategorical`` on logits drawn
with the distribution's own ops, op for op, without building it); only the per-step
TensorDict work is gone. Any other TensorDict
module (TorchRL's ``QValueModule`` and ``EGreedyModule``, a module with hooks or a spec
projection, ...) is itself called on a TensorDict of the step's entries, as TorchRL's
``Collector`` calls it: the same values, at the cost of that TensorDict.

The same walk in sequence mode (:func:`plain_steps`) runs a network over windows ``[N, W]`` for
the losses: its ``TensorDictModule`` s and its :class:`~torchrl_seqchunk.ResetRNN` s without a
carry, on the windows' entries.
"""
from __future__ import annotations

from collections.abc import Callable

from tensordict import TensorDict, TensorDictBase, unravel_key
from tensordict.nn import (InteractionType, ProbabilisticTensorDictModule, ProbabilisticTensorDictSequential,
                           TensorDictModule, TensorDictModuleBase, TensorDictSequential, set_interaction_type)
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributions import Categorical, Distribution
from torchrl.modules import OneHotCategorical, SafeProbabilisticModule, set_recurrent_mode
from torchrl.modules.distributions.utils import sample_and_log_prob

from ..recurrent.module import ResetRNN

__all__ = ["tensor_policy"]

Step = Callable[[dict], None]


def tensor_policy(policy: nn.Module) -> Callable[[dict], dict]:
    """The acting step of ``policy`` on plain tensors.

    Args:
        policy (nn.Module): a TensorDict module, e.g. a ``TensorDictSequential``
            (``ProbabilisticActor``, actor and critic in sequence, a Q-network then TorchRL's
            ``QValueModule`` and ``EGreedyModule``, ...). On plain tensors run its
            ``TensorDictModule`` s (any ``nn.Module`` between keys),
            :class:`~torchrl_seqchunk.ResetRNN` s (step mode) and TorchRL's probabilistic modules
            (``ProbabilisticActor``'s) that draw one sample and return its log-probability (drawn
            as it draws them in its random interaction mode); every other module,
            and one of these with forward hooks, ``safe=True``, an overridden ``forward``,
            ``partial_tolerant=True``, ``get_kwargs`` or a generator of its own, is called on a
            TensorDict ``[N]`` of the step's entries, in step mode (``set_recurrent_mode(False)``)
            and TorchRL's random interaction mode, as TorchRL's ``Collector`` calls it.

    Returns:
        A function ``step(data) -> data``: ``data`` a ``dict`` from keys (strings or tuples, as
        ``unravel_key`` gives them) to tensors ``[N, ...]`` holding the policy's inputs (the
        observation, ``"is_init"`` ``[N, 1]``, each ResetRNN's state from the previous step, or
        nothing at a step where every row resets); every module writes its outputs into it, as
        into a TensorDict: a ResetRNN the state it used at its state keys and the new one under
        ``("next", *state_key)``.

    Raises:
        TypeError: if a module of ``policy`` is not a TensorDict module, or a
            ``TensorDictSequential`` with ``selected_out_keys`` (the message names it); the fix
            is TorchRL's ``Collector``.

    Examples:
        >>> import torch
        >>> from tensordict.nn import TensorDictModule, TensorDictSequential
        >>> from torch import nn
        >>> from torchrl_seqchunk import ResetRNN
        >>> policy = TensorDictSequential(
        ...     TensorDictModule(nn.Linear(3, 8), ["observation"], ["embed"]),
        ...     ResetRNN(nn.GRU(8, 8, batch_first=True), default_recurrent_mode=False))
        >>> step = tensor_policy(policy)
        >>> out = step({"observation": torch.randn(4, 3), "is_init": torch.ones(4, 1, dtype=torch.bool)})
        >>> out["features"].shape, out["next", "recurrent_state"].shape
        (torch.Size([4, 8]), torch.Size([4, 1, 8]))
    """
    steps = _steps(policy)

    def step(data: dict) -> dict:
        for run in steps:
            run(data)
        return data

    return step


class Watch:
    """A module's structure when a walk of it was built, compared cheaply at each call: its
    TensorDict modules' submodules (by identity; the walk calls those), their hook counts (the
    walk leaves out theirs) and each ResetRNN's carry."""

    def __init__(self, module: nn.Module):
        self.modules = [m for m in module.modules() if isinstance(m, TensorDictModuleBase)]
        self.seen = self.now()

    def now(self) -> tuple:
        return ([tuple(m._modules.values()) for m in self.modules],
                [len(m._forward_hooks) + len(m._forward_pre_hooks) for m in self.modules],
                [m.carry for m in self.modules if isinstance(m, ResetRNN)])

    def changed(self) -> bool:
        return self.now() != self.seen


def _refuse(module: nn.Module, why: str):
    raise TypeError(f"tensor_policy cannot run this {type(module).__name__}: {why}. Step the env with TorchRL's "
                    "Collector instead (it runs any TensorDict module).")


def plain_steps(module: nn.Module) -> list[Step] | None:
    """The sequence-mode steps of ``module`` on a ``dict`` of ``[N, W, ...]`` tensors, in the order
    its ``forward`` runs them; ``None`` where one of its modules does not run on plain tensors (a
    probabilistic module, a carrying ResetRNN, hooks, ...: call the module itself there)."""
    return _steps(module, sequence=True)


def _steps(module: nn.Module, *, sequence: bool = False) -> list[Step] | None:
    """Step mode: every module's step, those that do not run plain called on a TensorDict; sequence
    mode: ``None`` unless every module runs plain."""
    if not isinstance(module, TensorDictModuleBase):
        if sequence:
            return None
        _refuse(module, "it is not a TensorDict module (no in_keys and out_keys to read and write)")
    if isinstance(module, TensorDictSequential) and module._select_before_return:
        if sequence:
            return None
        _refuse(module, "selected_out_keys drops outputs, which a plain-tensor step keeps")
    if sequence and (isinstance(module, ProbabilisticTensorDictModule) or (isinstance(module, ResetRNN) and module.carry)):
        return None  # a draw, or a carry that marks the chunk (a TensorDict)
    if not _runs_plain(module):
        return None if sequence else [_tensordict_step(module)]
    if isinstance(module, ResetRNN):
        return [_rnn_sequence(module) if sequence else _rnn_step(module)]
    if isinstance(module, ProbabilisticTensorDictModule):
        return [_sample_step(module)]
    if isinstance(module, TensorDictSequential):  # named modules too
        children = [_steps(child, sequence=sequence) for child in module._module_iter()]
        return None if None in children else [run for steps in children for run in steps]
    return [_module_step(module)]


def _runs_plain(module: TensorDictModuleBase) -> bool:
    """Whether the plain-tensor step of ``module`` does all that calling it on a TensorDict does."""
    if getattr(module, "safe", False) or module._forward_hooks or module._forward_pre_hooks:
        return False  # a projection into a spec (TorchRL's Safe* modules), hooks
    if isinstance(module, ResetRNN):
        return True
    if isinstance(module, TensorDictSequential):  # walked: its forward must be one that only runs its modules,
        # each of which reads every key it names (partial_tolerant skips one whose keys are absent)
        return (type(module).forward in (TensorDictSequential.forward, ProbabilisticTensorDictSequential.forward)
                and not module.partial_tolerant)
    if isinstance(module, ProbabilisticTensorDictModule):
        # TorchRL's own forward (sample_and_log_prob; tensordict's computes the log-probability
        # otherwise), one draw and its log-probability, torch's own RNG
        return (type(module).forward is SafeProbabilisticModule.forward and module.return_log_prob
                and len(module.dist_sample_keys) == 1 and module.num_samples is None
                and module._generator is None and module._generator_key is None)
    return (isinstance(module, TensorDictModule) and type(module).forward is TensorDictModule.forward
            and not module._get_kwargs)


def _tensordict_step(module: TensorDictModuleBase) -> Step:
    """Calls ``module`` itself on a TensorDict ``[N]`` of the step's entries (step mode, random
    interaction mode, as the Collector calls it) and writes back every entry it returns."""

    def run(data: dict) -> None:
        rows = next(iter(data.values())).shape[0]
        with set_recurrent_mode(False), set_interaction_type(InteractionType.RANDOM):
            out = module(TensorDict(data, batch_size=[rows]))
        data.update(out.items(True, True))

    return run


def _read(data: dict, key, module: nn.Module):
    value = data.get(key)
    if value is None:
        raise ValueError(f"tensor_policy: {type(module).__name__} reads {key!r}, absent from the step's data "
                         f"(its keys: {sorted(map(str, data))}).")
    return value


def _module_step(module: TensorDictModule) -> Step:
    inner = module.module if module.method is None else getattr(module.module, module.method)
    extra, names = dict(module.method_kwargs), module._kwargs  # names: a dict of in_keys, by argument
    in_keys = [unravel_key(k) for k in module.in_keys]
    out_keys = [unravel_key(k) for k in module.out_keys]

    def run(data: dict) -> None:
        args = [_read(data, k, module) for k in in_keys]
        out = inner(**dict(zip(names, args)), **extra) if names else inner(*args, **extra)
        data.update(zip(out_keys, out if isinstance(out, tuple) else (out,)))

    return run


def _rnn_step(rnn: ResetRNN) -> Step:
    next_keys = [unravel_key(("next", k)) for k in rnn.state_keys]

    def run(data: dict) -> None:
        reset = data.get(rnn.init_key)
        if reset is None:
            reset = data.get(rnn.is_first_key)
        if reset is None:
            raise ValueError(f"tensor_policy: the step's data holds neither {rnn.init_key!r} nor "
                             f"{rnn.is_first_key!r}, the episode-start flags ResetRNN resets on.")
        stored = [data.get(k) for k in rnn.state_keys]
        y, used, new = rnn.step(_read(data, rnn.in_key, rnn), None if all(s is None for s in stored) else stored,
                                reset)
        if isinstance(y, TensorDictBase):  # a TensorDict state: its entries under out_key
            data.update((unravel_key((rnn.out_key, k)), v) for k, v in y.items(True, True))
        else:
            data[rnn.out_key] = y
        data.update(zip(rnn.state_keys, used))
        data.update(zip(next_keys, new))

    return run


def _rnn_sequence(rnn: ResetRNN) -> Step:
    def run(data: dict) -> None:
        x = _read(data, rnn.in_key, rnn)
        rnn._ran_sequence = True  # as its forward records the mode it ran in
        data[rnn.out_key] = rnn._unroll_rows(data, x.shape[:2])

    return run


def _sample_step(module: ProbabilisticTensorDictModule) -> Step:
    sample_key, log_prob_key = unravel_key(module.dist_sample_keys[0]), unravel_key(module.log_prob_key)
    categorical = (module.distribution_class in (Categorical, OneHotCategorical) and not module.distribution_kwargs
                   and [unravel_key(k) for k in module.dist_keys] == ["logits"])
    logits_key = unravel_key(module.in_keys[0])

    def run(data: dict) -> None:
        logits = data.get(logits_key) if categorical else None
        if logits is not None and logits.shape[-1] > 1 and not Distribution._validate_args:
            sample, log_prob = _categorical_draw(logits, module.distribution_class is OneHotCategorical)
        else:
            dist = module.get_dist(data)  # reads the parameters with .get, as from a TensorDict
            sample, log_prob = sample_and_log_prob(dist, (), reparameterize=dist.has_rsample)
        data[sample_key], data[log_prob_key] = sample, log_prob

    return run


def _categorical_draw(logits: torch.Tensor, one_hot: bool) -> tuple:
    """torch's ``Categorical(logits=logits)`` sample and its log-probability (TorchRL's
    ``OneHotCategorical``: the sample one-hot), op for op as they compute them (the same draw,
    the same bits), without building the distribution: a sixth of an acting step of a small
    policy. Only where the distribution would not validate its arguments (TorchRL turns
    validation off at import) and has more than one category."""
    normalized = logits - logits.logsumexp(dim=-1, keepdim=True)
    count = normalized.shape[-1]
    probs = F.softmax(normalized, dim=-1).reshape(-1, count)
    index = torch.multinomial(probs, 1, True).T.reshape(normalized.shape[:-1])
    log_prob = normalized.gather(-1, index.unsqueeze(-1)).squeeze(-1)
    return (F.one_hot(index, count) if one_hot else index), log_prob
