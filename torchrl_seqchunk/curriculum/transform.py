""":class:`ReverseCurriculum`: the TorchRL env transform that starts episodes along a demo.

Salimans & Chen (2018); reference implementation: openai/atari-reset
(``ReplayResetEnv`` in ``atari_reset/wrappers.py``). How its two roles split across
``SerialEnv``/``ParallelEnv`` workers: ``docs/howto/curriculum.md``.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch
from tensordict import NestedKey, TensorDict, TensorDictBase
from torchrl.data import Bounded, Categorical, Composite, Unbounded
from torchrl.envs import GymLikeEnv
from torchrl.envs.transforms import Transform

from .._checks import check_int, check_real
from .demo import Demo
from .manager import ResetManager
from .restore import _ALERestore, _ReplayRestore

__all__ = ["ReverseCurriculum"]



class ReverseCurriculum(Transform):
    """Starts episodes at demo states chosen by a :class:`ResetManager` (TorchRL env transform).

    Two roles, chosen by the arguments: the *assigning* role (``manager``) picks
    the starting points on reset, judges success when an episode ends and feeds
    the manager; the *restoring* role (``restore``) brings its unbatched
    gymnasium-backed env to the demo state at its starting point. A single env
    holds both; a batched env holds the assigning role on top and a restoring one
    in every worker (see ``docs/howto/curriculum.md``).

    On reset an env gets ``starting_point`` ``k`` (int64 ``[*B, 1]``), is
    restored to the state after the demo's first ``k`` actions (the reset
    observation is the one there), and its ``score`` (float64 ``[*B, 1]``, game
    points) starts at ``demo.returns[k]`` and ``demo_index`` (int64 ``[*B, 1]``)
    at ``k``. Each step adds the reward to ``score`` and ``frames_per_step`` to
    ``demo_index``. When an episode ends, ``("next", success_key)`` (bool
    ``[*B, 1]``) says whether it succeeded, the manager records it and updates
    whenever it is :attr:`ResetManager.due`.

    Success (``success="score"``, the reference's ``score >= returns[-1]``):
    ``score >= demo.total - margin`` and ``demo_index >= F``, ``F`` the step
    after the demo's last nonzero reward (0 if none). With ``end_on_success``
    such an episode is truncated there; with ``max_lag`` one is truncated when
    ``score < demo.returns[demo_index - max_lag]``.

    .. note::
        The restoring role must come first in its env's transforms (right after
        the gymnasium-backed env), so the score sums raw rewards and the restored
        observation goes through the other transforms. A restoring-only transform
        reset without a starting point (``env.reset()``) restores to 0.

    .. note::
        The assigning role judges episodes by the done flags where it sits: a truncation a
        later transform adds (a ``StepCounter``, the one TorchRL's ``Collector`` appends for
        ``max_frames_per_traj``) ends episodes it never records; bound episodes before it
        (gymnasium's ``max_episode_steps``). The reset keeps only the restored observation:
        other reset-time entries (an info dict reader's, e.g. ALE's ``lives``) are the env's
        own reset's. ``"replay"`` leaves the env's random generator where the seeded replay
        left it, so a stochastic env continues alike from every restore (it is for
        deterministic envs).

    .. note::
        ``success="score"`` compares scores only: where every reward is a cost
        per step (MountainCar), an episode that lasts to ``F`` succeeds, goal or
        not, and one that reaches the goal sooner than the demo fails the index
        rule. Use ``success="goal"`` there: it needs the env's own termination
        and no index; it fits tasks whose only termination is the goal.

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
            raise ``ValueError`` on divergence, and reject sticky actions; at
            their first restore they compare the demo's ``meta["env_spec"]``
            with the env (``"ale"`` ignores ``frameskip``; a demo without it
            gets a warning) and check its actions against the env's action space.
            ``"replay"`` steps the env itself, so a gymnasium ``TimeLimit`` counts the
            replayed steps (an episode from point ``k`` has ``max_episode_steps - k`` left, as
            in the demo's own episode); ``"ale"`` sets the emulator's state, which no wrapper
            counts (the full limit from every point).
            Defaults to ``None`` (no restoring role).
        seed (int, optional): reset seed of the replays. Defaults to ``demo.seed``.
        snapshot_every (int): ``"ale"`` cache stride in frames. Defaults to ``100``.
        frames_per_step (int): demo steps per env step (4 for an ALE env with
            frame skip 4 and a frame-level demo). Defaults to ``1``.
        max_lag (int, optional): see above; for demos whose score only adds up
            (a ValueError where it falls over ``max_lag`` steps). Defaults to
            ``None`` (no lag rule).
        end_on_success (bool): truncate once the episode succeeds (see above).
            Defaults to ``True``.
        success (str): ``"score"`` (the rule above) or ``"goal"``: the env
            terminates (a time limit or the lag rule does not count) with
            ``score >= demo.total``, for tasks whose reward is a cost per step
            or shrinks with time (MountainCar, MiniGrid), where reaching the
            goal sooner than the demo scores higher. Defaults to ``"score"``.
        margin (float): score (game points) an episode may trail the demo's
            total and still succeed, under either rule: ``score >= demo.total -
            margin``. Defaults to ``0.0`` (at least as good as the demo).
        env_reset_at_zero (bool): starting point 0 is the env's own reset (its
            initial-state distribution, seeded from the env's generator at the
            first reset; a later ``set_seed`` does not seed it again) instead of the demo's seeded start, so once the
            maximum reaches 0 the agent trains on the task itself. Defaults to
            ``False``.
        starting_point_key, score_key, demo_index_key, success_key, reward_key,
        done_key, truncated_key, terminated_key (NestedKey): entry names. Defaults to
            ``"starting_point"``, ``"score"``, ``"demo_index"``, ``"success"``,
            ``"reward"``, ``"done"``, ``"truncated"``, ``"terminated"``.

    Raises:
        ValueError: neither role is requested, ``restore`` is an unknown string,
            a count is not positive, the manager's size does not match the env,
            an assigning-only transform sits on an env whose state spec lacks
            ``starting_point_key`` (its workers need the restoring role), a
            starting point is outside the demo, or (first restore) the demo was
            recorded in another env or holds an action outside the env's
            action space (the messages name both envs, or the step and the space),
            a ``max_lag`` over which the demo's own score falls somewhere (negative
            rewards), or ``success="score"`` read (a manager, or ``end_on_success``)
            with a demo whose every reward is 0; ``"replay"`` with no seed (none given, none in
            the demo); ``seed``, ``snapshot_every``, ``frames_per_step``, ``max_lag``,
            ``end_on_success=False`` or ``env_reset_at_zero`` given to the assigning role only
            (the restoring role reads them); at a step of the restoring role, a NaN reward (no
            rule could judge the episode's score).
        TypeError: the restoring role sits on a batched or non-gymnasium env; ``manager`` not a
            ``ResetManager``, ``seed`` not an int; ``"ale"`` on an env wrapped to change its
            observations (the restore returns the emulator's own).

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
        success: str = "score",
        margin: float = 0.0,
        env_reset_at_zero: bool = False,
        starting_point_key: NestedKey = "starting_point",
        score_key: NestedKey = "score",
        demo_index_key: NestedKey = "demo_index",
        success_key: NestedKey = "success",
        reward_key: NestedKey = "reward",
        done_key: NestedKey = "done",
        truncated_key: NestedKey = "truncated",
        terminated_key: NestedKey = "terminated",
    ) -> None:
        super().__init__()
        if not isinstance(demo, Demo):
            raise TypeError(f"demo must be a Demo, got {type(demo).__name__}; use Demo.load(path).")
        if manager is None and restore is None:
            raise ValueError(
                "pass manager= (assign starting points), restore= (restore them), or both."
            )
        if manager is not None and not isinstance(manager, ResetManager):
            raise TypeError(f"manager must be a ResetManager, got {type(manager).__name__}.")
        if restore is None:  # the assigning role only: what the restoring role reads would be ignored
            ignored = {"seed": seed is not None, "snapshot_every": snapshot_every != 100,
                       "frames_per_step": frames_per_step != 1, "max_lag": max_lag is not None,
                       "end_on_success": not end_on_success, "env_reset_at_zero": bool(env_reset_at_zero)}
            if any(ignored.values()):
                raise ValueError(
                    f"{', '.join(name for name, set_ in ignored.items() if set_)} act where episodes are "
                    "restored and tracked: give them to the restoring ReverseCurriculum(demo, restore=...) "
                    "in every worker, not to the assigning one (give both roles the same success and margin).")
        if manager is not None and manager.demo_length != len(demo):
            raise ValueError(
                f"manager.demo_length={manager.demo_length} but the demo has {len(demo)} steps; "
                "build the manager with ResetManager(len(demo), num_envs)."
            )
        snapshot_every = check_int("snapshot_every", snapshot_every, low=1)
        frames_per_step = check_int("frames_per_step", frames_per_step, low=1)
        max_lag = None if max_lag is None else check_int("max_lag", max_lag, low=0)
        returns = np.asarray(demo.returns)
        if max_lag and np.any(returns[:-max_lag] > returns[max_lag:]):
            raise ValueError(
                f"max_lag={max_lag} compares the score with the demo's score max_lag steps earlier, which "
                "assumes rewards that add up (game points); this demo's score falls over max_lag steps "
                "somewhere (negative rewards, a cost per step), where an episode on the demo's own pace "
                "would be cut. Leave max_lag=None (a time limit bounds such episodes)."
            )
        seed = demo.seed if seed is None else check_int("seed", seed, low=0)
        if restore == "replay" and seed is None:
            raise ValueError("restore='replay' resets the env with the demo's seed, and this demo holds none "
                             "(recorded with seed=None): a replay would start from another state at every "
                             "reset. Pass seed= (the reset seed the demo was recorded from), or record it with one.")
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
        self.terminated_key = terminated_key
        if success not in ("score", "goal"):
            raise ValueError(f"success must be 'score' or 'goal', got {success!r}.")
        if success == "score" and not np.any(demo.rewards) and (manager is not None or end_on_success):
            raise ValueError(
                "success='score' with a demo that scores nothing (every reward 0) counts every episode a "
                "success at its first step; pass success='goal' (the env's own termination), or a demo whose "
                "score tells success apart."
            )
        self.success, self.env_reset_at_zero = success, bool(env_reset_at_zero)
        self.margin = check_real("margin", margin, low=0.0)
        self._zero_rng: np.random.Generator | None = None
        self._returns = torch.as_tensor(demo.returns, dtype=torch.float64)
        self._tolerance = 1e-5 * max(1.0, abs(demo.total))  # float32 rewards' rounding, in game points
        scored = np.flatnonzero(demo.rewards)
        self._final_index = int(scored[-1]) + 1 if len(scored) else 0

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
            if point is not None and (point.is_floating_point() or point.dtype == torch.bool):
                raise TypeError(f"{self.starting_point_key!r} must hold an integer demo step, got dtype "
                                f"{point.dtype} (a float would be truncated to another step).")
            k = 0 if point is None else int(point.reshape(-1)[0])
            if not 0 <= k < len(self.demo):
                raise ValueError(
                    f"{self.starting_point_key!r}={k} is outside the demo [0, {len(self.demo) - 1}]; "
                    "the assigning transform's ResetManager must be built for this demo's length."
                )
            restored = self._restore_to(base._env, k)
            if restored is None or isinstance(restored, tuple):
                raise TypeError(f"restore(gym_env, k) must return the observation there, got "
                                f"{type(restored).__name__} (env.reset returns (obs, info): return obs).")
            obs = TensorDict(base.read_obs(restored), batch_size=[])
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

    def _restore_to(self, gym_env, k: int):
        if not self.env_reset_at_zero:
            return self.restore(gym_env, k)
        if self._zero_rng is None:  # drawn before any replay reseeds the env's generator
            self._zero_rng = np.random.default_rng(int(gym_env.unwrapped.np_random.integers(2**63)))
        if k > 0:
            return self.restore(gym_env, k)
        return gym_env.reset(seed=int(self._zero_rng.integers(2**63)))[0]

    # step --------------------------------------------------------------------------------
    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        if self.restore is not None:
            self._track(tensordict, next_tensordict)
        if self.manager is not None:
            self._judge(tensordict, next_tensordict)
        return next_tensordict

    def _track(self, tensordict, next_tensordict) -> None:
        returns = self._returns.to(next_tensordict.device)
        reward = next_tensordict.get(self.reward_key)
        if reward.isnan().any():  # a NaN score passes no rule: the episode would never be cut nor succeed
            raise ValueError(f"the env returned a NaN reward ({self.reward_key!r}) at the step from demo index "
                             f"{tensordict.get(self.demo_index_key)[reward.isnan()].tolist()}: the score it records "
                             "(read by the lag and success rules here and by a manager's) would be NaN; mend "
                             "the env (or a transform before this one).")
        score = tensordict.get(self.score_key) + reward.double()
        index = tensordict.get(self.demo_index_key) + self.frames_per_step
        end = torch.zeros_like(score, dtype=torch.bool)
        if self.end_on_success and self.success == "score":  # "goal": termination ends it
            end |= self._succeeded(score, index)
        if self.max_lag is not None:  # with the rounding _as_good allows: the demo's own pace is not behind
            behind = (index - self.max_lag).clamp(0, len(self.demo))
            end |= score < returns[behind] - self._tolerance
        next_tensordict.set(self.starting_point_key, tensordict.get(self.starting_point_key))
        next_tensordict.set(self.score_key, score)
        next_tensordict.set(self.demo_index_key, index)
        truncated = next_tensordict.get(self.truncated_key, torch.zeros_like(end))
        next_tensordict.set(self.truncated_key, truncated | end)
        next_tensordict.set(self.done_key, next_tensordict.get(self.done_key) | end)

    def _succeeded(self, score: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        return self._as_good(score) & (index >= self._final_index)

    def _as_good(self, score: torch.Tensor) -> torch.Tensor:
        # rewards reach the score as float32 (TorchRL's reward spec): allow their rounding
        return score >= self.demo.total - self.margin - self._tolerance

    def _judge(self, tensordict, next_tensordict) -> None:
        done = next_tensordict.get(self.done_key)
        score = next_tensordict.get(self.score_key)
        if self.success == "goal":
            success = next_tensordict.get(self.terminated_key) & self._as_good(score)
        else:
            success = done & self._succeeded(score, next_tensordict.get(self.demo_index_key))
        next_tensordict.set(self.success_key, success)
        stepped = tensordict.get("_step", None)  # TorchRL's partial steps: an env not stepped ended before
        if stepped is not None:
            done = done & stepped.reshape(done.shape)
        if done.any():
            ended = done.reshape(-1)
            points = tensordict.get(self.starting_point_key).reshape(-1)[ended]
            self.manager.record(points.cpu(), success.reshape(-1)[ended].cpu())
            if self.manager.due:
                self.manager.update()
