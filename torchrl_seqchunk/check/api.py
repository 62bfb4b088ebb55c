""":func:`check_recurrence`: the named checks of a recurrent pipeline, acting against training."""
from __future__ import annotations

import torch
from tensordict import TensorDictBase, unravel_key
from torchrl.envs import EnvBase

from .._checks import check_int, check_real
from ..recurrent.module import ResetRNN
from . import checks as C
from .layouts import TrainingLayout
from .leaks import boundaries, colourings, perturbed
from .network import LOG_PROB, Network, find_memory
from .passes import make_runner, original_batches, run_pass
from .reference import collect, prepare, step_reference
from .report import SKIP, CheckResult, RecurrenceReport

__all__ = ["check_recurrence", "CHECKS"]

CHECKS = ("step_vs_sequence", "ppo_ratio", "stored_memory", "resets", "done_alignment", "carry")
"""The names of the checks, in the report's order."""


def check_recurrence(policy, data, layout: TrainingLayout, *, network=None, steps: int | None = None,
                     state_keys=None, init_key="is_init", ppo_loss=None, checks=None, atol: float = 1e-5,
                     rtol: float = 1e-4, seed: int = 0, threads: int | None = 1) -> RecurrenceReport:
    """Checks that a recurrent policy trains on the memory it acted with: acting step by step
    against re-running the stored rollout in the training ``layout``.

    ``data`` is an env (``steps`` steps of each of its envs are collected with ``policy`` in
    step mode, actions sampled as a collector does) or a rollout already collected, ``[E, T]``
    (or ``[T]``), holding the reset flags ``init_key`` and the memory the policy stored. The
    policy is stepped again over the rollout (the reference: its outputs, the memory each step
    started from and the outputs from a reset memory); then the layout's training pass runs, and
    every trained slot is held to the reference. The checks (``checks`` selects some):

    * ``step_vs_sequence``: every output the network writes in a step (logits, values,
      Q-values, features, the log-probability of the stored action) is the same in training;
    * ``ppo_ratio``: ``exp(log pi(a) - stored log-prob)`` is 1 at every trained slot (episode
      starts, row starts and ends, truncations included), through ``ppo_loss``'s actor and keys
      when given, else the network's distribution and its ``log_prob_key``;
    * ``stored_memory``: the memory stored at each step is the one the step started from
      (not the one after it);
    * ``resets``: no memory crosses an episode start (outputs do not move when other episodes'
      inputs do, a burn-in or a carry included) and nothing resets where an episode goes on
      (a slice's first step that is not an episode start);
    * ``done_alignment``: training resets where acting did, not one step early (the post-step
      ``done`` read as the reset flag) or late;
    * ``carry`` (carrying layouts): consecutive chunks with the carry give one long unroll,
      the layout's second pass (a loss's target or next-value pass) included.

    Args:
        policy (TensorDictModuleBase): the acting policy (``ResetRNN``, TorchRL's
            ``LSTMModule`` / ``GRUModule`` or a custom recurrent module inside).
        data (EnvBase or TensorDictBase): an env with TorchRL's ``InitTracker`` and the
            module's primer (as a collector needs), or a collected rollout ``[E, T]``.
        layout (TrainingLayout): how the pipeline trains (:class:`WindowLayout`, :class:`SliceLayout`,
            :class:`StreamLayout`, :class:`DQNStreamLayout` or a subclass of :class:`TrainingLayout`).

    Keyword Args:
        network (TensorDictModuleBase, optional): what trains, if not ``policy`` as a whole;
            exploration modules (``EGreedyModule``, ...) are skipped anyway. Default ``policy``.
        steps (int, optional): steps per env collected from an env (>= 1); required then.
        state_keys (NestedKey or list, optional): the root keys of a custom module's stored
            memory; default: those of every ``ResetRNN``, ``LSTMModule``, ``GRUModule``.
        init_key (NestedKey): the reset flags the acting pass read, bool ``[E, T, 1]``.
            Default ``"is_init"``.
        ppo_loss (ClipPPOLoss, optional): the PPO loss whose ratio ``ppo_ratio`` checks.
        checks (list of str, optional): a subset of :data:`CHECKS`. Default: all.
        atol, rtol (float): the tolerance of every comparison (``|a - b| <= atol + rtol * |b|``;
            the ratio's ``|ratio - 1| <= atol + rtol``). Defaults ``1e-5``, ``1e-4``.
        seed (int): seeds the perturbations of the ``resets`` check. Default ``0``.
        threads (int, optional): torch's intra-op threads during the check, restored after (its
            many small steps run fastest on one); ``None`` leaves them. Default ``1``.

    Returns:
        RecurrenceReport: one :class:`CheckResult` per check (``str`` is a table; ``assert_ok()``
        raises an AssertionError listing the failures).

    Raises:
        TypeError / ValueError: a policy without a recognized recurrent module and no
            ``state_keys``; an env without ``steps``, or whose rollout lacks the flags or memory;
            a rollout without ``init_key`` or the memory keys; an unknown check; a layout that
            gives no batch, loses the ``"_check"`` entries or draws other batches each time.

    Examples:
        >>> import torch
        >>> from torch import nn
        >>> from tensordict.nn import TensorDictModule as Mod, TensorDictSequential as Seq
        >>> from torchrl.envs import Compose, InitTracker, TransformedEnv
        >>> from torchrl.modules import OneHotCategorical, ProbabilisticActor
        >>> from torchrl_seqchunk import ResetRNN
        >>> from torchrl_seqchunk.check import WindowLayout
        >>> from torchrl_seqchunk.envs import make_vector_env
        >>> rnn = ResetRNN(nn.GRU(2, 8, batch_first=True), in_key="observation", state_key="h",
        ...                reset_state_key="h", carry=False)  # windows start from the stored memory
        >>> actor = ProbabilisticActor(Seq(rnn, Mod(nn.Linear(8, 2), ["features"], ["logits"])),
        ...     in_keys=["logits"], distribution_class=OneHotCategorical, return_log_prob=True)
        >>> env = TransformedEnv(make_vector_env("CartPole-v1", 2, keep=(0, 2)),
        ...                      Compose(InitTracker(), rnn.make_tensordict_primer()))
        >>> report = check_recurrence(actor, env, WindowLayout(8), steps=40)
        >>> report.ok, report["ppo_ratio"].status, report["carry"].status
        (True, 'pass', 'skip')
    """
    selected = _selected(checks)
    atol = check_real("atol", atol, low=0.0)
    rtol = check_real("rtol", rtol, low=0.0)
    if atol == 0 and rtol == 0:
        raise ValueError("atol and rtol are both 0: give the comparisons a tolerance (float32 sums differ by order).")
    if not isinstance(layout, TrainingLayout):
        raise TypeError(f"layout must be a TrainingLayout (WindowLayout, SliceLayout, StreamLayout, DQNStreamLayout "
                        f"or a subclass of TrainingLayout), got {type(layout).__name__}.")
    seed = check_int("seed", seed, low=0)
    threads = None if threads is None else check_int("threads", threads, low=1)
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _checked(policy, data, layout, network, steps, state_keys, unravel_key(init_key), ppo_loss, selected,
                        C.Tolerance(atol, rtol), seed)
    finally:
        torch.set_num_threads(previous_threads)


def _checked(policy, data, layout, network, steps, state_keys, init_key, ppo_loss, selected, tol, seed):
    trained_net = policy if network is None else network
    net = Network(trained_net, find_memory(trained_net, state_keys))
    if isinstance(data, EnvBase):
        if steps is None:
            raise ValueError("data is an env: pass steps= (steps collected per env, e.g. 128).")
        rollout = collect(policy, data, check_int("steps", steps, low=1), net.memory_keys, init_key)
    elif isinstance(data, TensorDictBase):
        rollout = data
    else:
        raise TypeError(f"data must be a TorchRL env or a collected rollout (TensorDict [num_envs, T]), got "
                        f"{type(data).__name__}.")
    td, episodes = prepare(rollout, init_key)
    missing = [k for k in net.memory_keys if td.get(k, None) is None]
    if missing:
        raise ValueError(f"the rollout holds no stored memory {missing}: act with a step mode that stores it (a "
                         "ResetRNN does; TorchRL's modules through their primer) or pass state_keys= naming it.")
    saved_carries = {m: m.carried_state for m in trained_net.modules() if isinstance(m, ResetRNN)}
    saved_layout = layout.save()
    try:
        return _run(net, td, episodes, layout, tol, init_key, ppo_loss, selected, seed)
    finally:
        for module, carry in saved_carries.items():
            module.carried_state = carry
        layout.restore(saved_layout)


def _selected(checks) -> tuple:
    if checks is None:
        return CHECKS
    checks = (checks,) if isinstance(checks, str) else tuple(checks)
    unknown = [c for c in checks if c not in CHECKS]
    if unknown or not checks:
        raise ValueError(f"checks must name some of {CHECKS}, got {list(checks)}.")
    return checks


def _run(net, td, episodes, layout, tol, init_key, ppo_loss, selected, seed) -> RecurrenceReport:
    ref = step_reference(net, td, episodes, init_key)
    out_keys = [k for k in ref.outputs if k != LOG_PROB]
    run = make_runner(net, ppo_loss)
    batches = original_batches(layout, net.module, td, net.memory_keys)
    base = run_pass(layout, net, batches, run, out_keys)
    truncated = td.get(("next", "truncated"), None)
    truncated = None if truncated is None else truncated.reshape(episodes.init.shape).bool()
    results = {}
    if "step_vs_sequence" in selected:
        results["step_vs_sequence"] = C.step_vs_sequence(base, ref, tol)
    if "ppo_ratio" in selected:
        results["ppo_ratio"] = C.ppo_ratio(base, episodes, truncated, tol)
    if "stored_memory" in selected:
        results["stored_memory"] = C.stored_memory(td, episodes, ref, net.memory_keys, tol)
    reading = C.reset_reading(base, ref, tol)
    alignment, early, late = C.done_alignment(base, episodes, reading)
    if "done_alignment" in selected:
        results["done_alignment"] = alignment
    if "resets" in selected:
        leak, probed = _leaks(net, td, episodes, layout, base, run, out_keys, early, late, init_key, tol, seed)
        results["resets"] = C.resets(base, episodes, reading, early, late, leak, probed)
    if "carry" in selected:
        results["carry"] = _carry(net, layout, batches, base, run, out_keys, episodes, tol)
    rows, steps = td.shape
    envs = f"{rows} env{'s' if rows != 1 else ''}"
    summary = (f"{envs} x {steps} steps, {layout.describe()}: {int(base.trained.sum())} slots trained "
               f"in {len(batches)} batches")
    return RecurrenceReport([results[name] for name in CHECKS if name in results], summary)


def _leaks(net, td, episodes, layout, base, run, out_keys, early, late, init_key, tol, seed):
    """Leaking slots (bool ``[S]``) and how far they moved, and a note on what was probed."""
    count = int(episodes.episode.max()) + 1
    pairs = boundaries(base, episodes.episode)
    found, unsplit = colourings(count, pairs)
    keys = [*net.observation_keys([init_key]), *net.memory_keys]
    keep = torch.zeros_like(episodes.init)  # the last step before an early reset: done_alignment's crossing
    keep[base.env[early], base.t[early]] = True
    generator = torch.Generator().manual_seed(seed)
    leaked = torch.zeros_like(base.trained)
    size = torch.zeros(base.trained.shape, dtype=torch.float64)
    common = list(base.outputs)
    for colour in found:
        for side in (0, 1):
            where = (colour[episodes.episode] == side) & ~keep
            moved = perturbed(td, where, keys, generator)
            other = run_pass(layout, net, original_batches(layout, net.module, moved, net.memory_keys), run, out_keys)
            if not base.same_slots(other):
                raise ValueError(f"the layout {layout.describe()} drew other batches from a rollout of the same "
                                 "steps: seed its sampler so that every pass draws the same batches.")
            distance, absolute = tol.distance(other.outputs, base.outputs, [k for k in common if k in other.outputs])
            hit = base.trained & (colour[base.episode] != side) & ~late & (distance > 1)
            leaked |= hit
            size = torch.where(hit, torch.maximum(size, absolute), size)
    note = (f"{len(pairs) - unsplit} of {len(pairs)} episode boundaries probed ({count} episodes, "
            f"{2 * len(found)} perturbed passes), no crossing; no reset where an episode goes on")
    return (leaked, size), note


def _carry(net, layout, batches, base, run, out_keys, episodes, tol) -> CheckResult:
    if not layout.carries:
        return CheckResult("carry", SKIP, note="the layout carries no state")
    long = torch.cat(batches, 1)
    whole = run_pass(layout, net, [long], run, out_keys)
    seq_len = batches[0].shape[1]
    return C.carry(base, whole, episodes, seq_len, tol)
