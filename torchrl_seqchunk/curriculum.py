"""Reverse curriculum from a single demonstration (Salimans & Chen 2018).

Episodes start from states along one demonstration, first near its end; the
*starting point* moves backward as the agent learns to finish as well as the
demo from there. Reference implementation: openai/atari-reset
(``ReplayResetEnv`` and ``ResetManager`` in ``atari_reset/wrappers.py``).

Two pieces:

- :class:`ResetManager` is pure logic (no env objects): it hands out starting
  points, collects (starting point, success) pairs of finished episodes and
  moves the maximum starting point.
- :class:`ReverseCurriculum` is a TorchRL env transform with two roles, chosen
  by its arguments. The *assigning* role (``manager`` given) picks starting
  points on every reset, writes them into the reset TensorDict, marks success
  when an episode ends and feeds the manager. The *restoring* role
  (``restore`` given) reads the starting point from the reset TensorDict,
  brings its (unbatched, gymnasium-backed) env to that demo state, replaces the
  reset observation and keeps the episode score.

Where things live with N envs. The manager must see every finished episode
of all envs, so it lives in one place: the process that steps the batched env
(the collector's process). The restore must happen where the emulator is, in
each worker. Hence a batched env gets *one* assigning transform on top and a
restoring transform inside every worker::

    def make_worker():                   # picklable factory, runs in the worker
        return TransformedEnv(GymEnv(...), ReverseCurriculum(demo, restore="ale"))

    env = TransformedEnv(ParallelEnv(N, make_worker), ReverseCurriculum(demo, manager))

The starting point travels parent -> worker inside the reset TensorDict. A
batched env only forwards reset entries that its workers declare, so the
restoring role declares ``starting_point_key`` in its state spec (and in its
observation spec, so every step reports it back); the values come back through
the observation spec (``starting_point_key``, ``score_key``,
``demo_index_key``). The assigning role on top only reads them. Worker caches
(ALE snapshots) stay in the worker; nothing but integers and the observation
crosses processes. A single env holds both roles in one transform
(``ReverseCurriculum(demo, manager, restore=...)``), and ``SerialEnv`` is
composed exactly like ``ParallelEnv``.
"""
from __future__ import annotations

import bisect
from typing import Callable

import numpy as np
import torch
from tensordict import NestedKey, TensorDict, TensorDictBase
from torchrl.data import Bounded, Categorical, Composite, Unbounded
from torchrl.envs import GymLikeEnv
from torchrl.envs.transforms import Transform

from .demo import Demo

__all__ = ["ResetManager", "ReverseCurriculum"]


class ResetManager:
    """Shared starting-point schedule of a reverse curriculum (pure logic).

    Algorithm (Salimans & Chen 2018; openai/atari-reset ``ResetManager``):

    - :meth:`assign`: env ``i`` of ``num_envs`` starts at
      ``max(maximum - (i * window) // num_envs, 0)``, i.e. the envs are
      staggered evenly over ``window`` demo steps below the current maximum.
    - :meth:`record`: collects finished episodes as (starting point, success).
    - :meth:`update`: the success rate of each starting point is the fraction
      of the recorded batch's episodes from that point that succeeded; it
      overwrites the stored rate of that point (stored rates of other points
      are multiplied by ``decay`` first). The new maximum is the first index
      where the cumulative sum of stored rates from index 0 reaches
      ``move_threshold * window``, but never above the current maximum (the
      rule only moves backward). If the mass is never reached, the maximum is
      nudged forward by ``nudge``, capped at ``demo_length - 1``.

    Choices the reference leaves implicit: rates never expire there (our
    ``decay=1.0``); it updates every 1024 vectorized steps, we update every
    ``update_every`` finished episodes (:attr:`due`); its window is the spread
    of the worker's starting points.

    Only successes from points strictly below the maximum can move it back (a
    mass first reached at the maximum itself leaves it there), so the schedule
    moves backward by itself only when at least two distinct starting points are
    in play (``num_envs >= 2`` and ``window >= 2``); a single env keeps its
    starting point unless the maximum is set by hand.

    Args:
        demo_length (int): number of demo steps ``N``; starting points are
            ``0 .. N - 1``.
        num_envs (int): envs sharing the schedule.

    Keyword Args:
        move_threshold (float): success mass per window step needed to move
            back. Defaults to ``0.1``.
        nudge (int): demo steps to move forward when success collapses.
            Defaults to ``100``.
        window (int, optional): span of starting points below the maximum.
            Defaults to ``num_envs``.
        update_every (int, optional): finished episodes per update. Defaults to
            ``num_envs``.
        decay (float): factor in ``(0, 1]`` applied to stored rates at each
            update. Defaults to ``1.0`` (rates are kept until overwritten).
        maximum (int, optional): initial maximum. Defaults to ``N - 1``.

    Raises:
        ValueError: a count is not positive, ``decay`` is outside ``(0, 1]``,
            ``move_threshold`` is not positive, ``move_threshold * window``
            exceeds ``min(num_envs, window)`` (the most success mass the
            current window's points can hold, so it could never move back by
            itself), or ``maximum`` is outside ``[0, N - 1]``.

    Examples:
        >>> manager = ResetManager(1000, 8, window=32)
        >>> manager.maximum = 900
        >>> manager.assign().tolist()
        [900, 896, 892, 888, 884, 880, 876, 872]
        >>> manager.record(torch.tensor([500, 501, 502, 503]), torch.ones(4, dtype=torch.bool))
        >>> manager.update()
        503
    """

    def __init__(
        self,
        demo_length: int,
        num_envs: int,
        *,
        move_threshold: float = 0.1,
        nudge: int = 100,
        window: int | None = None,
        update_every: int | None = None,
        decay: float = 1.0,
        maximum: int | None = None,
    ) -> None:
        window = num_envs if window is None else window
        update_every = num_envs if update_every is None else update_every
        for name, value in [
            ("demo_length", demo_length),
            ("num_envs", num_envs),
            ("window", window),
            ("update_every", update_every),
            ("nudge", nudge),
        ]:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}.")
        if not move_threshold > 0:
            raise ValueError(f"move_threshold must be > 0, got {move_threshold}.")
        if move_threshold * window > min(num_envs, window):
            raise ValueError(
                f"move_threshold * window = {move_threshold * window:g} exceeds the success mass the "
                f"{min(num_envs, window)} distinct starting points of one window can reach; lower "
                "move_threshold or window, or add envs."
            )
        if not 0 < decay <= 1:
            raise ValueError(f"decay must be in (0, 1], got {decay}; use 1.0 to keep rates.")
        self.demo_length, self.num_envs = demo_length, num_envs
        self.move_threshold, self.nudge, self.window = move_threshold, nudge, window
        self.update_every, self.decay = update_every, decay
        self.maximum = demo_length - 1 if maximum is None else maximum
        if isinstance(self.maximum, bool) or not isinstance(self.maximum, int):
            raise ValueError(f"maximum must be an int in [0, {demo_length - 1}], got {maximum!r}.")
        if not 0 <= self.maximum < demo_length:
            raise ValueError(f"maximum must be in [0, {demo_length - 1}], got {maximum}.")
        self.rates = torch.zeros(demo_length, dtype=torch.float64)
        self.last_success_rate = float("nan")
        self._points: list[torch.Tensor] = []
        self._successes: list[torch.Tensor] = []

    def assign(self) -> torch.Tensor:
        """Starting points for all envs: int64 ``[num_envs]``."""
        offsets = torch.arange(self.num_envs) * self.window // self.num_envs
        return (self.maximum - offsets).clamp_min(0)

    def record(self, starting_points, successes) -> None:
        """Adds finished episodes.

        Args:
            starting_points: integer tensor/array ``[M]`` in ``[0, demo_length)``.
            successes: bool tensor/array ``[M]``, True where the episode ended
                at least as well as the demo.

        Raises:
            TypeError: ``starting_points`` is not integer or ``successes`` not bool.
            ValueError: shapes differ or a starting point is out of range.
        """
        points, successes = torch.as_tensor(starting_points), torch.as_tensor(successes)
        if points.is_floating_point() or points.is_complex() or points.dtype == torch.bool:
            raise TypeError(
                f"starting_points must be integers, got dtype {points.dtype}; pass the int64 "
                "points the episodes started from."
            )
        if successes.dtype != torch.bool:
            raise TypeError(
                f"successes must be bool, got dtype {successes.dtype}; pass one True/False per "
                "episode (e.g. score >= demo.total), not a rate."
            )
        points, successes = points.reshape(-1).long(), successes.reshape(-1)
        if points.shape != successes.shape:
            raise ValueError(
                f"starting_points and successes must have the same number of elements, got "
                f"{points.numel()} and {successes.numel()}."
            )
        if points.numel() and (points.min() < 0 or points.max() >= self.demo_length):
            raise ValueError(
                f"starting_points must lie in [0, {self.demo_length - 1}], got range "
                f"[{points.min().item()}, {points.max().item()}]; record the points this "
                "manager assigned."
            )
        self._points.append(points)
        self._successes.append(successes)

    @property
    def num_pending(self) -> int:
        """Finished episodes recorded since the last :meth:`update`."""
        return sum(p.numel() for p in self._points)

    @property
    def due(self) -> bool:
        """True once ``update_every`` episodes are pending."""
        return self.num_pending >= self.update_every

    def update(self) -> int:
        """Folds the pending episodes into the rates and moves the maximum; returns it."""
        if self._points:
            points, successes = torch.cat(self._points), torch.cat(self._successes).double()
            counts = torch.bincount(points, minlength=self.demo_length).double()
            wins = torch.bincount(points, weights=successes, minlength=self.demo_length)
            seen = counts > 0
            self.rates *= self.decay
            self.rates[seen] = wins[seen] / counts[seen]
            self.last_success_rate = successes.mean().item()
            self._points, self._successes = [], []
        mass = self.move_threshold * self.window
        reached = (self.rates.cumsum(0) >= mass - 1e-9).nonzero()
        if len(reached):
            self.maximum = min(self.maximum, int(reached[0]))
        else:
            self.maximum = min(self.maximum + self.nudge, self.demo_length - 1)
        return self.maximum

    def state_dict(self) -> dict:
        """Maximum, stored rates (float64 ``[demo_length]``), last batch success rate and pending episodes."""
        return {
            "maximum": self.maximum,
            "rates": self.rates.clone(),
            "last_success_rate": self.last_success_rate,
            "pending_points": torch.cat(self._points) if self._points else torch.zeros(0, dtype=torch.long),
            "pending_successes": torch.cat(self._successes) if self._successes else torch.zeros(0, dtype=torch.bool),
        }

    def load_state_dict(self, state_dict: dict) -> None:
        """Restores :meth:`state_dict`; raises ValueError if it was saved for another demo length."""
        rates = torch.as_tensor(state_dict["rates"], dtype=torch.float64)
        if rates.shape != (self.demo_length,):
            raise ValueError(
                f"state_dict['rates'] has shape {tuple(rates.shape)}, expected ({self.demo_length},); "
                "it was saved for a demo of another length."
            )
        self.rates = rates.clone()
        self.maximum = int(state_dict["maximum"])
        self.last_success_rate = float(state_dict["last_success_rate"])
        self._points, self._successes = [], []
        self.record(state_dict["pending_points"], state_dict["pending_successes"])


def _check_not_sticky(env) -> None:
    ale = getattr(env.unwrapped, "ale", None)
    if ale is not None and ale.getFloat("repeat_action_probability") > 0:
        raise ValueError(
            "the env uses sticky actions (repeat_action_probability="
            f"{ale.getFloat('repeat_action_probability')}), so demo replays are random; "
            "make it with repeat_action_probability=0.0."
        )


def _diverged(demo: Demo, step: int, reward: float) -> ValueError:
    return ValueError(
        f"demo replay diverged at step {step}: the env gave reward {reward}, the demo recorded "
        f"{demo.rewards[step]}; check the env id, frame skip, sticky actions and reset seed "
        f"(demo meta: {demo.meta})."
    )


class _ReplayRestore:
    """Any deterministic gymnasium env: seeded reset, then ``env.step`` through the demo."""

    def __init__(self, demo: Demo, seed: int | None) -> None:
        self.demo, self.seed = demo, seed

    def __call__(self, env, k: int):
        _check_not_sticky(env)
        obs, _ = env.reset(seed=self.seed)
        for step in range(k):
            obs, reward, terminated, truncated, _ = env.step(int(self.demo.actions[step]))
            if not np.isclose(reward, self.demo.rewards[step]):
                raise _diverged(self.demo, step, reward)
            if terminated or truncated:
                raise ValueError(
                    f"demo replay to starting point {k}: the episode ended (terminated={terminated}, "
                    f"truncated={truncated}) at step {step}; raise the env's time limit "
                    "(max_episode_steps) above the demo length or check the demo's env and seed."
                )
        return obs


class _ALERestore:
    """ALE emulator frames: nearest earlier state, then ``ale.act`` per demo action.

    Earlier states: the demo's snapshots, the states this process cached every
    ``snapshot_every`` frames while replaying, and the state one frame before the
    last restored point (envs keep their starting point until the maximum moves).
    A restored ALE state shows its screen only after the next frame, so replays
    always start strictly below ``k``.
    """

    def __init__(self, demo: Demo, seed: int | None, snapshot_every: int) -> None:
        if demo.meta.get("frameskip", 1) != 1:
            raise ValueError(
                f"restore='ale' replays one emulator frame per demo action, but the demo has "
                f"frameskip={demo.meta['frameskip']}; use restore='replay' with the same frame skip."
            )
        self.demo, self.seed, self.snapshot_every = demo, seed, snapshot_every
        self.steps = sorted(demo.snapshots)  # steps with a stored or cached state
        self.cache: dict[int, object] = {}  # step -> ALEState
        self.last: tuple[int, object] | None = None

    def _nearest_below(self, k: int):
        i = bisect.bisect_left(self.steps, k)
        if self.last is not None and self.last[0] < k and (i == 0 or self.last[0] > self.steps[i - 1]):
            return self.last
        if i == 0:
            return 0, None
        step = self.steps[i - 1]
        if step not in self.cache:
            import ale_py

            self.cache[step] = ale_py.ALEState(self.demo.snapshots[step])
        return step, self.cache[step]

    def _store(self, step: int, state) -> None:
        if step not in self.cache:
            self.cache[step] = state
            bisect.insort(self.steps, step)

    def __call__(self, env, k: int):
        unwrapped = env.unwrapped
        if not hasattr(unwrapped, "ale"):
            raise TypeError(
                f"restore='ale' needs an ALE env, got {type(unwrapped).__name__}; "
                "use restore='replay' or a callable."
            )
        _check_not_sticky(env)
        ale, action_set = unwrapped.ale, unwrapped._action_set
        start, state = self._nearest_below(k)
        if state is None:
            env.reset(seed=self.seed)
            self._store(0, ale.cloneState())
        else:
            ale.restoreState(state)
        for step in range(start, k):
            if step == k - 1:
                self.last = (step, ale.cloneState())
            reward = ale.act(action_set[self.demo.actions[step]])
            if not np.isclose(reward, self.demo.rewards[step]):
                raise _diverged(self.demo, step, reward)
            if (step + 1) % self.snapshot_every == 0:
                self._store(step + 1, ale.cloneState())
        return unwrapped._get_obs()


class ReverseCurriculum(Transform):
    """Starts episodes at demo states chosen by a :class:`ResetManager` (TorchRL env transform).

    See the module docstring for the two roles and how to compose them with
    ``SerialEnv``/``ParallelEnv``. The restoring role must come first in its
    env's transforms (right after the gymnasium-backed base env), so the
    restored observation goes through the remaining transforms and the score
    sums raw game rewards.

    On reset, each resetting env gets ``starting_point`` ``k`` (int64
    ``[*B, 1]``), is restored to the state after the demo's first ``k`` actions
    (the reset observation is replaced by the observation there), its
    ``score`` (float64 ``[*B, 1]``, game points) starts at
    ``demo.returns[k]`` and its ``demo_index`` (int64 ``[*B, 1]``) at ``k``.
    Each step adds the reward to ``score`` and ``frames_per_step`` to
    ``demo_index``; the episode is truncated when ``score >= demo.total``
    (``end_on_success``) or when it lags the demo, i.e.
    ``score < demo.returns[demo_index - max_lag]`` (``max_lag``, as in the
    reference). When an episode ends, ``("next", success_key)`` (bool
    ``[*B, 1]``) is ``score >= demo.total``, and the manager records it; the
    manager updates whenever it is :attr:`ResetManager.due`. A restoring-only
    transform reset without a starting point (``env.reset()``) restores to 0.

    Args:
        demo (Demo): the demonstration.
        manager (ResetManager, optional): the schedule (assigning role). Its
            ``num_envs`` must equal the env's batch numel (1 for an unbatched env).

    Keyword Args:
        restore (str or callable, optional): the restoring role. ``"replay"``:
            ``env.reset(seed=seed)`` then ``env.step`` through the demo actions
            (any deterministic gymnasium env; one demo action per env step).
            ``"ale"``: ALE emulator, one demo action per emulator frame,
            restarting from the nearest earlier state (the demo's snapshots,
            states cached in this process every ``snapshot_every`` frames, and
            the state one frame before the last restored point). A callable
            ``restore(gym_env, k) -> observation`` does it the user's way.
            Both built-ins compare every replayed reward with the demo's and
            raise ``ValueError`` on divergence, and reject sticky actions.
            Defaults to ``None`` (no restoring role).
        seed (int, optional): reset seed of the replays. Defaults to ``demo.seed``.
        snapshot_every (int): ``"ale"`` cache stride in frames. Defaults to ``100``.
        frames_per_step (int): demo steps per env step (4 for an ALE env with
            frame skip 4 and a frame-level demo). Defaults to ``1``.
        max_lag (int, optional): see above. Defaults to ``None`` (no lag rule).
        end_on_success (bool): truncate once the demo's total is reached.
            Defaults to ``True``.
        starting_point_key, score_key, demo_index_key, success_key, reward_key,
        done_key, truncated_key (NestedKey): entry names. Defaults to
            ``"starting_point"``, ``"score"``, ``"demo_index"``, ``"success"``,
            ``"reward"``, ``"done"``, ``"truncated"``.

    Raises:
        ValueError: neither role is requested, ``restore`` is an unknown string,
            a count is not positive, the manager's size does not match the env,
            an assigning-only transform sits on an env whose state spec lacks
            ``starting_point_key`` (its workers need the restoring role), or a
            starting point is outside the demo.
        TypeError: the restoring role sits on a batched or non-gymnasium env.

    Examples:
        >>> import gymnasium as gym
        >>> from torchrl.envs import GymEnv, TransformedEnv
        >>> from torchrl_seqchunk import record_demo
        >>> demo = record_demo(gym.make("FrozenLake-v1", is_slippery=False), [2, 2, 1, 1, 1, 2])
        >>> manager = ResetManager(len(demo), 1, window=1)
        >>> env = TransformedEnv(
        ...     GymEnv("FrozenLake-v1", is_slippery=False),
        ...     ReverseCurriculum(demo, manager, restore="replay"),
        ... )
        >>> td = env.reset()
        >>> td["starting_point"].item(), td["score"].item(), td["observation"].argmax().item()
        (5, 0.0, 14)
        >>> td = env.step(td.set("action", env.action_spec.encode(2)))
        >>> td["next", "success"].item(), td["next", "done"].item()
        (True, True)
    """

    def __init__(
        self,
        demo: Demo,
        manager: ResetManager | None = None,
        *,
        restore: str | Callable | None = None,
        seed: int | None = None,
        snapshot_every: int = 100,
        frames_per_step: int = 1,
        max_lag: int | None = None,
        end_on_success: bool = True,
        starting_point_key: NestedKey = "starting_point",
        score_key: NestedKey = "score",
        demo_index_key: NestedKey = "demo_index",
        success_key: NestedKey = "success",
        reward_key: NestedKey = "reward",
        done_key: NestedKey = "done",
        truncated_key: NestedKey = "truncated",
    ) -> None:
        super().__init__()
        if not isinstance(demo, Demo):
            raise TypeError(f"demo must be a Demo, got {type(demo).__name__}; use Demo.load(path).")
        if manager is None and restore is None:
            raise ValueError(
                "pass manager= (assign starting points), restore= (restore them), or both."
            )
        if manager is not None and manager.demo_length != len(demo):
            raise ValueError(
                f"manager.demo_length={manager.demo_length} but the demo has {len(demo)} steps; "
                "build the manager with ResetManager(len(demo), num_envs)."
            )
        for name, value in [("snapshot_every", snapshot_every), ("frames_per_step", frames_per_step)]:
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}.")
        if max_lag is not None and max_lag < 0:
            raise ValueError(f"max_lag must be >= 0 or None, got {max_lag}.")
        seed = demo.seed if seed is None else seed
        if restore == "replay":
            restore = _ReplayRestore(demo, seed)
        elif restore == "ale":
            restore = _ALERestore(demo, seed, snapshot_every)
        elif isinstance(restore, str) or not (restore is None or callable(restore)):
            raise ValueError(
                f"restore must be 'replay', 'ale', a callable (gym_env, k) -> obs or None, got {restore!r}."
            )
        self.demo, self.manager, self.restore = demo, manager, restore
        self.frames_per_step, self.max_lag, self.end_on_success = frames_per_step, max_lag, end_on_success
        self.starting_point_key, self.score_key = starting_point_key, score_key
        self.demo_index_key, self.success_key = demo_index_key, success_key
        self.reward_key, self.done_key, self.truncated_key = reward_key, done_key, truncated_key
        self._returns = torch.as_tensor(demo.returns, dtype=torch.float64)

    # specs -------------------------------------------------------------------------------
    def _point_spec(self, shape, device):
        return Bounded(0, len(self.demo) - 1, shape=shape, dtype=torch.int64, device=device)

    def transform_observation_spec(self, observation_spec: Composite) -> Composite:
        shape, device = observation_spec.shape + (1,), observation_spec.device
        if self.restore is not None:
            observation_spec[self.starting_point_key] = self._point_spec(shape, device)
            observation_spec[self.score_key] = Unbounded(shape=shape, dtype=torch.float64, device=device)
            observation_spec[self.demo_index_key] = Unbounded(shape=shape, dtype=torch.int64, device=device)
        if self.manager is not None:
            if self.score_key not in observation_spec.keys(True):
                raise ValueError(
                    f"the env reports no {self.score_key!r}: a ReverseCurriculum(demo, manager) on a "
                    "batched env needs ReverseCurriculum(demo, restore=...) inside every worker."
                )
            observation_spec[self.success_key] = Categorical(2, shape=shape, dtype=torch.bool, device=device)
        return observation_spec

    def transform_state_spec(self, state_spec: Composite) -> Composite:
        if self.restore is not None:
            state_spec[self.starting_point_key] = self._point_spec(state_spec.shape + (1,), state_spec.device)
        elif self.starting_point_key not in state_spec.keys(True):
            raise ValueError(
                f"the env's state spec lacks {self.starting_point_key!r}, so reset values would be "
                "dropped before reaching the envs; put ReverseCurriculum(demo, restore=...) inside "
                "every worker of the batched env."
            )
        return state_spec

    # reset -------------------------------------------------------------------------------
    def _reset_env_preprocess(self, tensordict: TensorDictBase | None) -> TensorDictBase | None:
        if self.manager is None:
            return tensordict
        batch_size = self.parent.batch_size
        if self.manager.num_envs != batch_size.numel():
            raise ValueError(
                f"manager.num_envs={self.manager.num_envs} but the env has batch size "
                f"{tuple(batch_size)}; build ResetManager(len(demo), {batch_size.numel()})."
            )
        if tensordict is None:
            tensordict = TensorDict(batch_size=batch_size, device=self.parent.device)
        points = self.manager.assign().reshape(*batch_size, 1).to(tensordict.device)
        reset = tensordict.get(self.parent.reset_keys[0], None)
        previous = tensordict.get(self.starting_point_key, None)
        if reset is not None and previous is not None:
            points = torch.where(reset.reshape(points.shape), points, previous)
        tensordict.set(self.starting_point_key, points)
        return tensordict

    def _restoring_env(self):
        base = self.parent.base_env
        if not isinstance(base, GymLikeEnv) or base.batch_size != torch.Size([]):
            raise TypeError(
                f"the restoring ReverseCurriculum needs an unbatched gymnasium-backed env (GymEnv), "
                f"got {type(base).__name__} with batch size {tuple(base.batch_size)}; put it inside "
                "each worker and a ReverseCurriculum(demo, manager) on the batched env."
            )
        return base

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        if self.restore is not None:
            base = self._restoring_env()
            point = tensordict.get(self.starting_point_key, None)
            k = 0 if point is None else int(point.reshape(-1)[0])
            if not 0 <= k < len(self.demo):
                raise ValueError(
                    f"{self.starting_point_key!r}={k} is outside the demo [0, {len(self.demo) - 1}]; "
                    "the assigning transform's ResetManager must be built for this demo's length."
                )
            obs = TensorDict(base.read_obs(self.restore(base._env, k)), batch_size=[])
            tensordict_reset.update(obs.to(tensordict_reset.device))
            device = tensordict_reset.device
            tensordict_reset.set(self.starting_point_key, torch.tensor([k], device=device))
            tensordict_reset.set(self.demo_index_key, torch.tensor([k], device=device))
            tensordict_reset.set(self.score_key, self._returns[k : k + 1].to(device))
        if self.manager is not None:
            shape = tensordict_reset.batch_size + (1,)
            tensordict_reset.set(
                self.success_key, torch.zeros(shape, dtype=torch.bool, device=tensordict_reset.device)
            )
        return tensordict_reset

    # step --------------------------------------------------------------------------------
    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        if self.restore is not None:
            self._track(tensordict, next_tensordict)
        if self.manager is not None:
            self._judge(tensordict, next_tensordict)
        return next_tensordict

    def _track(self, tensordict, next_tensordict) -> None:
        returns = self._returns.to(next_tensordict.device)
        score = tensordict.get(self.score_key) + next_tensordict.get(self.reward_key).double()
        index = tensordict.get(self.demo_index_key) + self.frames_per_step
        end = torch.zeros_like(score, dtype=torch.bool)
        if self.end_on_success:
            end |= score >= self.demo.total
        if self.max_lag is not None:
            behind = (index - self.max_lag).clamp(0, len(self.demo))
            end |= score < returns[behind]
        next_tensordict.set(self.starting_point_key, tensordict.get(self.starting_point_key))
        next_tensordict.set(self.score_key, score)
        next_tensordict.set(self.demo_index_key, index)
        truncated = next_tensordict.get(self.truncated_key, torch.zeros_like(end))
        next_tensordict.set(self.truncated_key, truncated | end)
        next_tensordict.set(self.done_key, next_tensordict.get(self.done_key) | end)

    def _judge(self, tensordict, next_tensordict) -> None:
        done = next_tensordict.get(self.done_key)
        success = done & (next_tensordict.get(self.score_key) >= self.demo.total)
        next_tensordict.set(self.success_key, success)
        if done.any():
            ended = done.reshape(-1)
            points = tensordict.get(self.starting_point_key).reshape(-1)[ended]
            self.manager.record(points.cpu(), success.reshape(-1)[ended].cpu())
            if self.manager.due:
                self.manager.update()
