"""Bringing one env to the demo state at a starting point: seeded replay, ALE states.

A restore is a callable ``restore(env, k) -> observation`` on an unbatched
gymnasium env; :class:`~torchrl_seqchunk.ReverseCurriculum` also takes a user callable.
"""
from __future__ import annotations

import bisect
import math
import warnings

import gymnasium as gym
import numpy as np

from .demo import Demo, _env_spec


def _check_not_sticky(env) -> None:
    ale = getattr(env.unwrapped, "ale", None)
    if ale is not None and ale.getFloat("repeat_action_probability") > 0:
        raise ValueError(
            "the env uses sticky actions (repeat_action_probability="
            f"{ale.getFloat('repeat_action_probability')}), so demo replays are random; "
            "make it with repeat_action_probability=0.0."
        )


class _Restore:
    """Checks the env against the demo at the first call, then restores (``_restore``)."""

    ignored_kwargs: tuple[str, ...] = ()  # env kwargs this restore does not depend on

    def __init__(self, demo: Demo, seed: int | None) -> None:
        self.demo, self.seed, self.checked = demo, seed, False

    def __call__(self, env, k: int):
        if not self.checked:
            self._check_env(env)
            self.checked = True
        return self._restore(env, k)

    def _check_env(self, env) -> None:
        _check_not_sticky(env)
        recorded = self.demo.meta.get("env_spec")
        if recorded is None:
            warnings.warn(
                "the demo's meta has no 'env_spec' (it predates it), so nothing checks that it is "
                "replayed in the env it was recorded in; record it again with record_demo, or set "
                "demo.meta['env_spec'].",
                stacklevel=2,
            )
        else:
            current = _env_spec(env)
            if self._relevant(recorded) != self._relevant(current):
                raise ValueError(
                    f"the demo was recorded in env {recorded} but is replayed in env {current}; "
                    "make the env with the demo's id and arguments, or record a demo in this env."
                )
        space = env.action_space
        if not isinstance(space, gym.spaces.Discrete):
            raise ValueError(f"the demo's actions are discrete indices, but the env's action space is {space}.")
        outside = (self.demo.actions < space.start) | (self.demo.actions >= space.start + space.n)
        if outside.any():
            step = int(np.argmax(outside))
            raise ValueError(
                f"demo action {self.demo.actions[step]} at step {step} is outside the env's action "
                f"space {space}; the demo was recorded with another action set."
            )

    def _relevant(self, spec: dict) -> dict:
        kwargs = {k: v for k, v in spec["kwargs"].items() if k not in self.ignored_kwargs}
        return {"id": spec["id"], "kwargs": kwargs}


def _diverged(demo: Demo, step: int, reward: float) -> ValueError:
    return ValueError(
        f"demo replay diverged at step {step}: the env gave reward {reward}, the demo recorded "
        f"{demo.rewards[step]}; check the env id, frame skip, sticky actions and reset seed "
        f"(demo meta: {demo.meta})."
    )


class _ReplayRestore(_Restore):
    """Any deterministic gymnasium env: seeded reset, then ``env.step`` through the demo."""

    def _restore(self, env, k: int):
        obs, _ = env.reset(seed=self.seed)
        for step in range(k):
            obs, reward, terminated, truncated, _ = env.step(int(self.demo.actions[step]))
            if not math.isclose(reward, self.demo.rewards[step], rel_tol=1e-5, abs_tol=1e-8):
                raise _diverged(self.demo, step, reward)
            if terminated or truncated:
                raise ValueError(
                    f"demo replay to starting point {k}: the episode ended (terminated={terminated}, "
                    f"truncated={truncated}) at step {step}; raise the env's time limit "
                    "(max_episode_steps) above the demo length or check the demo's env and seed."
                )
        return obs


class _ALERestore(_Restore):
    """ALE emulator frames: nearest earlier state, then ``ale.act`` per demo action.

    Earlier states: the demo's snapshots, the states this process cached every
    ``snapshot_every`` frames while replaying, and the state one frame before the
    last restored point (envs keep their starting point until the maximum moves).
    A restored ALE state shows its screen only after the next frame, so replays
    always start strictly below ``k``. The env's frameskip does not matter here.
    """

    ignored_kwargs = ("frameskip",)

    def __init__(self, demo: Demo, seed: int | None, snapshot_every: int) -> None:
        # the frame skip the demo was recorded with: its meta's, else its env's (record_demo keeps the
        # env's arguments; ALE's v5 ids register frameskip=4)
        recorded = (demo.meta.get("env_spec") or {}).get("kwargs", {}).get("frameskip", 1)
        frameskip = demo.meta.get("frameskip", recorded)
        if frameskip != 1:
            raise ValueError(
                f"restore='ale' replays one emulator frame per demo action, but the demo was recorded "
                f"with frameskip={frameskip}; use restore='replay' with the same frame skip, or record "
                "the demo in an env made with frameskip=1."
            )
        super().__init__(demo, seed)
        self.snapshot_every = snapshot_every
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

    def _check_env(self, env) -> None:
        if not hasattr(env.unwrapped, "ale"):
            raise TypeError(
                f"restore='ale' needs an ALE env, got {type(env.unwrapped).__name__}; "
                "use restore='replay' or a callable."
            )
        layer = env
        while isinstance(layer, gym.Wrapper):  # the restored observation is the emulator's own
            if isinstance(layer, gym.ObservationWrapper) or layer.observation_space != env.unwrapped.observation_space:
                raise TypeError(
                    f"restore='ale' returns the emulator's own observation, past the env's {type(layer).__name__}; "
                    "use restore='replay' (it steps through the wrappers) or make that change with a TorchRL "
                    "transform after the ReverseCurriculum."
                )
            layer = layer.env
        super()._check_env(env)

    def _restore(self, env, k: int):
        unwrapped = env.unwrapped
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
            if not math.isclose(reward, self.demo.rewards[step], rel_tol=1e-5, abs_tol=1e-8):
                raise _diverged(self.demo, step, reward)
            if (step + 1) % self.snapshot_every == 0:
                self._store(step + 1, ale.cloneState())
        return unwrapped._get_obs()
