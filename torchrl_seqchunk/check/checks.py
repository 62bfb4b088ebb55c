"""The named checks: each compares a training pass (:class:`~.passes.Slots`) with the acting side
(:class:`~.reference.Reference`) and returns a :class:`~.report.CheckResult`.

Two values are *close* when every element differs by at most ``atol + rtol * |reference|``
(a slot's distance is the largest ratio of difference to that bound: close means at most 1).
A slot *resets* in training when its output is close to the output from the initial memory
(``Reference.fresh``) and not to the acting one, and these two differ clearly (distance above
:data:`MARGIN`): a slot whose memory is near the initial one tells nothing.
"""
from __future__ import annotations

import torch

from .report import FAIL, PASS, SKIP, CheckResult

MARGIN = 10.0
"""How far (in tolerances) the acting output must be from the reset one for a reset to be read."""


class Tolerance:
    """``atol`` and ``rtol`` of every comparison."""

    def __init__(self, atol: float, rtol: float):
        self.atol, self.rtol = atol, rtol

    def distance(self, values: dict, reference: dict, keys) -> tuple[torch.Tensor, torch.Tensor]:
        """Per slot ``[S]``: the distance (see the module docstring; inf where a value is NaN) and
        the largest absolute difference, over ``keys`` of the two dicts of ``[S, ...]`` tensors."""
        distance = absolute = None
        for key in keys:
            a, b = values[key].double(), reference[key].double()
            a, b = a.reshape(a.shape[0], -1), b.reshape(b.shape[0], -1)
            diff = (a - b).abs()
            scaled = (diff / (self.atol + self.rtol * b.abs())).nan_to_num(nan=float("inf")).amax(1)
            diff = diff.nan_to_num(nan=float("inf")).amax(1)
            distance = scaled if distance is None else torch.maximum(distance, scaled)
            absolute = diff if absolute is None else torch.maximum(absolute, diff)
        return distance, absolute


def first_of(fail: torch.Tensor, env: torch.Tensor, t: torch.Tensor) -> tuple | None:
    """The first ``(env, t)`` (by row, then time) where ``fail``; None if nowhere."""
    if not bool(fail.any()):
        return None
    e, s = env[fail], t[fail]
    i = int(torch.argmin(e * (int(t.max()) + 1) + s))
    return int(e[i]), int(s[i])


def _worst(fail: torch.Tensor, absolute: torch.Tensor, checked: torch.Tensor) -> float | None:
    pool = absolute[fail] if bool(fail.any()) else absolute[checked]
    return float(pool.max()) if pool.numel() else None


def at(values: dict, env: torch.Tensor, t: torch.Tensor, keys) -> dict:
    """``{key: values[key][env, t]}``: ``[E, T, ...]`` entries read at the slots."""
    return {k: values[k][env, t] for k in keys}


def _keys(names) -> str:
    return ", ".join("log_prob" if k == ("_check", "log_prob") else (k if isinstance(k, str) else ".".join(k))
                     for k in names)


def step_vs_sequence(slots, ref, tol: Tolerance) -> CheckResult:
    """The training pass's outputs equal the acting pass's at every trained slot."""
    keys = [k for k in slots.outputs if k in ref.outputs]
    name = "step_vs_sequence"
    if not keys:
        return CheckResult(name, SKIP, note="the training pass wrote none of the outputs a step writes")
    distance, absolute = tol.distance(slots.outputs, at(ref.outputs, slots.env, slots.t, keys), keys)
    fail = slots.trained & (distance > 1)
    if not bool(fail.any()):
        return CheckResult(name, PASS, int(slots.trained.sum()), None, _worst(fail, absolute, slots.trained),
                           f"compared {_keys(keys)}")
    bad = [k for k in keys if bool((tol.distance(slots.outputs, at(ref.outputs, slots.env, slots.t, [k]), [k])[0][
        slots.trained] > 1).any())]
    return CheckResult(name, FAIL, int(slots.trained.sum()), first_of(fail, slots.env, slots.t),
                       _worst(fail, absolute, slots.trained),
                       f"{int(fail.sum())} trained slots differ from acting ({_keys(bad)})")


def slot_kinds(slots, episodes, truncated: torch.Tensor | None, where: torch.Tensor) -> str:
    """How many of the slots ``where`` are episode starts, row starts, truncations and row ends."""
    kinds = {"episode starts": episodes.init[slots.env, slots.t], "row starts": slots.first,
             "row ends": slots.last}
    if truncated is not None:
        kinds["truncations"] = truncated[slots.env, slots.t]
    return ", ".join(f"{int((mask & where).sum())} {name}" for name, mask in kinds.items())


def ppo_ratio(slots, episodes, truncated, tol: Tolerance) -> CheckResult:
    """``exp(log pi_train(a) - stored log-prob) == 1`` at every trained slot (before any update)."""
    name = "ppo_ratio"
    if slots.log_ratio is None:
        return CheckResult(name, SKIP, note="no distribution in the network, or no stored log-probability "
                                            "(pass ppo_loss=)")
    error = slots.log_ratio.double().expm1().abs().nan_to_num(nan=float("inf"))
    fail = slots.trained & (error > tol.atol + tol.rtol)
    worst = _worst(fail, error, slots.trained)
    if not bool(fail.any()):
        return CheckResult(name, PASS, int(slots.trained.sum()), None, worst,
                           "|ratio - 1| over " + slot_kinds(slots, episodes, truncated, slots.trained))
    return CheckResult(name, FAIL, int(slots.trained.sum()), first_of(fail, slots.env, slots.t), worst,
                       f"ratio != 1 at {int(fail.sum())} slots: " + slot_kinds(slots, episodes, truncated, fail))


def stored_memory(rollout, episodes, ref, keys, tol: Tolerance) -> CheckResult:
    """The memory stored at every step is the memory the policy started that step from."""
    name = "stored_memory"
    rows, steps = episodes.init.shape
    env = torch.arange(rows).unsqueeze(1).expand(rows, steps).reshape(-1)
    t = torch.arange(steps).expand(rows, steps).reshape(-1)
    checked = ~(episodes.start & ~episodes.init).reshape(-1)  # a row's first step continuing an episode: taken as is
    flat = lambda d: {k: d[k].reshape(rows * steps, *d[k].shape[2:]) for k in keys}  # noqa: E731
    stored = flat({k: rollout.get(k) for k in keys})
    distance, absolute = tol.distance(stored, flat(ref.used), keys)
    fail = checked & (distance > 1)
    if not bool(fail.any()):
        return CheckResult(name, PASS, int(checked.sum()), None, _worst(fail, absolute, checked),
                           f"{_keys(keys)} against the memory each step started from")
    after = tol.distance(stored, flat(ref.after), keys)[0] <= 1
    note = f"{int(fail.sum())} steps store another memory than the one the step started from"
    if int((after & fail).sum()) * 2 >= int(fail.sum()):
        note += f" ({int((after & fail).sum())} store the memory after the step)"
    return CheckResult(name, FAIL, int(checked.sum()), first_of(fail, env, t), _worst(fail, absolute, checked), note)


def reset_reading(slots, ref, tol: Tolerance) -> dict:
    """Per slot ``[S]``: ``off`` (training differs from acting), ``resets`` (training reads as a reset
    here, see the module docstring)."""
    keys = [k for k in slots.outputs if k in ref.outputs and k in ref.fresh]
    acting = at(ref.outputs, slots.env, slots.t, keys)
    fresh = at(ref.fresh, slots.env, slots.t, keys)
    off, absolute = tol.distance(slots.outputs, acting, keys)
    near_fresh = tol.distance(slots.outputs, fresh, keys)[0] <= 1
    distinct = tol.distance(acting, fresh, keys)[0] > MARGIN
    return {"off": off > 1, "resets": (off > 1) & near_fresh & distinct, "absolute": absolute}


def done_alignment(slots, episodes, reading) -> tuple[CheckResult, torch.Tensor, torch.Tensor]:
    """The training pass resets where the acting pass did, not one step before (at the step that
    ends an episode: the post-step ``done`` read as the reset flag) nor one step after.

    Returns the result, the early slots (bool ``[S]``: a reset at the done step) and the late ones
    (the episode start that did not reset, and the slot after it, which did)."""
    name = "done_alignment"
    start, last = episodes.start[slots.env, slots.t], episodes.last[slots.env, slots.t]
    early = slots.trained & last & ~start & reading["resets"]
    nxt = slots.successor()
    has = nxt >= 0
    follows = torch.zeros_like(has)
    follows[has] = (slots.env[nxt[has]] == slots.env[has]) & (slots.t[nxt[has]] == slots.t[has] + 1)
    late_start = slots.trained & episodes.init[slots.env, slots.t] & follows & reading["off"]
    after = nxt[late_start]  # a reset there that is not an early one (a two-step episode's last step)
    late_start[late_start.clone()] = reading["resets"][after] & slots.trained[after] & ~last[after]
    late = late_start.clone()
    late[nxt[late_start]] = True
    checked = int((slots.trained & ((last & ~start) | episodes.init[slots.env, slots.t])).sum())
    fail = early | late_start
    if not bool(fail.any()):
        note = "resets at the acting pass's episode starts (last steps and first steps compared)"
        return CheckResult(name, PASS, checked, None, None, note), early, late
    parts = []
    if bool(early.any()):
        parts.append(f"{int(early.sum())} episode ends reset at their own step, one step early (a post-step "
                     "done read as the reset flag)")
    if bool(late_start.any()):
        parts.append(f"{int(late_start.sum())} episode starts reset one step late")
    worst = float(reading["absolute"][fail].max())
    return CheckResult(name, FAIL, checked, first_of(fail, slots.env, slots.t), worst, "; ".join(parts)), early, late


def resets(slots, episodes, reading, early, late, leak, probed: str) -> CheckResult:
    """No memory crosses an episode start (``leak``: bool ``[S]`` and its sizes, from passes over the
    rollout with other episodes' inputs perturbed) and no slot resets where its episode goes on;
    the one-step shifts ``done_alignment`` names are left to it."""
    name = "resets"
    leaked, leak_size = leak
    start = episodes.start[slots.env, slots.t]
    spurious = slots.trained & ~start & reading["resets"] & ~early & ~late
    fail = leaked | spurious
    sizes = torch.where(leaked, leak_size, reading["absolute"].to(leak_size.dtype))
    checked = int(slots.trained.sum())
    if not bool(fail.any()):
        return CheckResult(name, PASS, checked, None, None, probed)
    parts = []
    if bool(leaked.any()):
        parts.append(f"memory crosses an episode start into {int(leaked.sum())} slots (they move when other "
                     "episodes' inputs do)")
    if bool(spurious.any()):
        parts.append(f"{int(spurious.sum())} slots reset where their episode goes on ("
                     f"{int((spurious & slots.first).sum())} at a row's first step)")
    return CheckResult(name, FAIL, checked, first_of(fail, slots.env, slots.t), float(sizes[fail].max()),
                       "; ".join(parts))


def carry(chunked, long, episodes, seq_len: int, tol: Tolerance) -> CheckResult:
    """Consecutive chunks with the carry give what one long unroll of each stream gives."""
    name = "carry"
    keys = [k for k in chunked.outputs if k in long.outputs]
    span = int(max(chunked.pos.max(), long.pos.max())) + 1
    a, b = torch.argsort(chunked.row * span + chunked.pos), torch.argsort(long.row * span + long.pos)
    if not (bool((chunked.env[a] == long.env[b]).all()) and bool((chunked.t[a] == long.t[b]).all())):
        raise ValueError("the long unroll holds other steps than the chunks: the layout's batches must be the "
                         "consecutive chunks of the same rows.")
    distance, absolute = tol.distance({k: chunked.outputs[k][a] for k in keys}, {k: long.outputs[k][b] for k in keys},
                                      keys)
    trained = chunked.trained[a]
    fail = trained & (distance > 1)
    env, t, pos = chunked.env[a], chunked.t[a], chunked.pos[a]
    checked = int(trained.sum())
    if not bool(fail.any()):
        return CheckResult(name, PASS, checked, None, _worst(fail, absolute, trained),
                           "chunks with the carry against one long unroll per stream")
    first = first_of(fail, env, t)
    firsts = fail & (pos % seq_len == 0)
    note = f"{int(fail.sum())} slots differ from one long unroll"
    at_starts = firsts & episodes.init[env, t]
    if bool(at_starts.any()):
        note += f"; {int(at_starts.sum())} chunks start an episode from the carry (not reset at is_first)"
    elif bool(firsts.any()):
        note += f"; {int(firsts.sum())} chunks start from another state than the previous chunk's end (moved by a " \
                "second pass?)"
    return CheckResult(name, FAIL, checked, first, _worst(fail, absolute, trained), note)
