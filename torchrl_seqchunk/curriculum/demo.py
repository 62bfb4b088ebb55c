"""A single demonstration: actions, rewards, optional env snapshots and metadata.

A :class:`Demo` is what a reverse curriculum (Salimans & Chen 2018, "Learning
Montezuma's Revenge from a Single Demonstration") starts episodes from: the
state after the first ``k`` demo actions is the *starting point* ``k``, and
``demo.returns[k]`` is the score the demonstrator had there.

File format (``.npz``, no pickles, written by :meth:`Demo.save`):

- ``actions``: integer ``[N]``, one action per env step (for Atari: index into
  the minimal action set, one per emulator frame);
- ``rewards``: float ``[N]``, the reward of each action;
- ``meta``: JSON string (``env_spec``: the env's id and make() arguments, reset
  seed, frame skip, source, ...);
- optional ``lives``: integer ``[N + 1]``, lives counter before each action and
  after the last one;
- optional snapshots: ``snapshot_steps`` int64 ``[S]``, distinct (state after that many
  actions), ``snapshot_offsets`` int64 ``[S + 1]`` and ``snapshot_bytes`` uint8
  (the serialized states, concatenated).
"""
from __future__ import annotations

import json
import os
import zipfile
import zlib
from typing import Any, Sequence

import numpy as np

from .._checks import check_int

__all__ = ["Demo", "record_demo"]


class Demo:
    """One demonstration of an episode.

    Args:
        actions: integer array-like ``[N]`` (numpy, torch or list), the demo's
            actions in order; stored as ``np.int64``.
        rewards: float array-like ``[N]``, the reward each action earned;
            stored as ``np.float64`` so cumulative sums are exact.

    Keyword Args:
        snapshots (dict[int, bytes], optional): serialized env states keyed by
            step index ``k`` (the state after the first ``k`` actions,
            ``0 <= k <= N``), e.g. ``ale.cloneState().serialize()``.
        lives (array-like, optional): integer ``[N + 1]`` lives counter.
        meta (dict, optional): JSON-serializable metadata (saved as JSON: string keys,
            lists for tuples, after a round trip). ``meta["reset_seed"]``
            is the seed the demo was recorded from (see :attr:`seed`);
            ``meta["env_spec"]`` the env it was recorded in, ``{"id": env.spec.id,
            "kwargs": env.spec.kwargs}`` (for ALE: game, mode, difficulty,
            frameskip, repeat_action_probability, full_action_space, ... as
            given to ``gymnasium.make`` or registered) without ``render_mode``
            and ``obs_type``, JSON-safe (other objects as their ``repr``); an
            env without a spec gives its class path and no kwargs. The
            built-in restores compare it with their env; demos without it
            (older files) still load, and their restores warn and skip the check.

    Attributes:
        returns (np.ndarray): float64 ``[N + 1]``; ``returns[k]`` is the sum of
            the first ``k`` rewards, the demo's score at starting point ``k``.
        total (float): ``returns[-1]``, the demo's final score.

    Raises:
        TypeError: ``actions`` is not integer, ``rewards`` not numeric, a
            snapshot key is not an int (Python or NumPy, not bool) or its value not
            bytes, or ``meta`` not a dict of JSON values.
        ValueError: arrays are not 1-D, lengths disagree, the demo is empty, an
            action is negative or above ``2**63 - 1`` (it would not fit int64),
            a reward is not finite, or a snapshot index is outside ``[0, N]``.

    Examples:
        >>> demo = Demo([1, 0, 1], [0.0, 1.0, 2.0], meta={"reset_seed": 0})
        >>> len(demo), demo.total, demo.returns.tolist()
        (3, 3.0, [0.0, 0.0, 1.0, 3.0])
    """

    def __init__(
        self,
        actions: Sequence[int] | np.ndarray,
        rewards: Sequence[float] | np.ndarray,
        *,
        snapshots: dict[int, bytes] | None = None,
        lives: Sequence[int] | np.ndarray | None = None,
        meta: dict[str, Any] | None = None,
    ) -> None:
        actions, rewards = np.asarray(actions), np.asarray(rewards)
        if actions.size == 0:
            raise ValueError("actions is empty; a demo needs at least one action.")
        if actions.dtype.kind not in "iu":
            raise TypeError(
                f"actions must be integers, got dtype {actions.dtype}; pass discrete action indices."
            )
        if rewards.dtype.kind not in "iuf":
            raise TypeError(f"rewards must be numeric, got dtype {rewards.dtype}.")
        if actions.ndim != 1 or rewards.ndim != 1 or len(actions) != len(rewards):
            raise ValueError(
                f"actions and rewards must be 1-D of equal length, got shapes "
                f"{actions.shape} and {rewards.shape}; pass one reward per action."
            )
        outside = (actions < 0) | (actions > np.iinfo(np.int64).max)
        if outside.any():
            step = int(np.argmax(outside))
            raise ValueError(
                f"actions holds a negative or too large value ({actions[step]} at step {step}); "
                "pass action indices in [0, 2**63 - 1]."
            )
        if not np.isfinite(rewards).all():
            raise ValueError(
                f"rewards must be finite, got {rewards[~np.isfinite(rewards)][0]} at step "
                f"{int(np.argmax(~np.isfinite(rewards)))}; the demo's score would be undefined."
            )
        self.actions = actions.astype(np.int64)
        self.rewards = rewards.astype(np.float64)
        self.returns = np.concatenate([[0.0], np.cumsum(self.rewards)])
        # each key: the number of actions taken before the snapshot
        self.snapshots = {
            check_int("a snapshots key", k, low=0, high=len(self)): blob for k, blob in (snapshots or {}).items()
        }
        for step, blob in self.snapshots.items():
            if not isinstance(blob, bytes):  # what save writes
                raise TypeError(f"snapshots[{step}] must be bytes (a serialized emulator state), got "
                                f"{type(blob).__name__}.")
        if lives is not None:
            lives = np.asarray(lives)
            if lives.shape != (len(self) + 1,) or lives.dtype.kind not in "iu":
                raise ValueError(
                    f"lives must be an integer array of shape ({len(self) + 1},), got "
                    f"{lives.dtype} {lives.shape}; record lives before each action and after the last."
                )
            lives = lives.astype(np.int64)
        self.lives = lives
        if not isinstance(meta, (dict, type(None))):
            raise TypeError(f"meta must be a dict, got {type(meta).__name__}.")
        self.meta = dict(meta or {})
        try:  # save writes it as JSON: refused now, not when saving
            json.dumps(self.meta)
        except (TypeError, ValueError) as err:
            raise TypeError(f"meta must hold JSON values (str, int, float, bool, None, lists and dicts of "
                            f"them; a NumPy scalar: call .item()): {err}") from None

    def __len__(self) -> int:
        return len(self.actions)

    @property
    def total(self) -> float:
        return float(self.returns[-1])

    @property
    def seed(self) -> int | None:
        """The seed of the reset the demo starts from (``meta["reset_seed"]``), or None."""
        return self.meta.get("reset_seed")

    def __repr__(self) -> str:
        return (
            f"Demo(length={len(self)}, total={self.total}, "
            f"snapshots={len(self.snapshots)}, meta={self.meta})"
        )

    def save(self, path: str | os.PathLike) -> None:
        """Writes the demo to ``path`` exactly (no ``.npz`` suffix added), an ``.npz`` archive
        (format in the module docstring). ``meta`` goes as JSON: it loads back with string
        keys and lists for tuples."""
        arrays = {
            "actions": self.actions,
            "rewards": self.rewards,  # float64: lossless
            "meta": np.array(json.dumps(self.meta)),
        }
        if self.lives is not None:
            arrays["lives"] = self.lives
        if self.snapshots:
            steps = sorted(self.snapshots)
            blobs = [np.frombuffer(self.snapshots[k], dtype=np.uint8) for k in steps]
            arrays["snapshot_steps"] = np.array(steps, dtype=np.int64)
            arrays["snapshot_offsets"] = np.cumsum([0] + [len(b) for b in blobs])
            arrays["snapshot_bytes"] = np.concatenate(blobs)
        with open(path, "wb") as file:  # numpy appends ".npz" to a path without it, not to a file
            np.savez_compressed(file, **arrays)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Demo":
        """Reads a demo written by :meth:`save` (or ``torchrl_seqchunk/recipes/data/README.md``'s format).

        Raises:
            ValueError: the file is not a readable ``.npz`` (a ``.npy`` file, a
                truncated or damaged archive), misses ``actions``,
                ``rewards`` or ``meta``, holds pickled objects, or its arrays
                have wrong shapes, dtypes or lengths (the message names the file).
        """
        try:
            loaded = np.load(path, allow_pickle=False)
            if not isinstance(loaded, np.lib.npyio.NpzFile):
                raise ValueError(f"it holds a single {type(loaded).__name__}, not an .npz archive")
            with loaded as z:
                arrays = {k: z[k] for k in z.files}
        except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as err:
            raise ValueError(
                f"cannot read demo file {path!r} as a pickle-free .npz ({err}); pass a complete file "
                "written by Demo.save (format: torchrl_seqchunk/recipes/data/README.md), copying or "
                "re-recording it if it was cut short."
            ) from err
        missing = {"actions", "rewards", "meta"} - set(arrays)
        if missing:
            raise ValueError(
                f"demo file {path!r} lacks arrays {sorted(missing)}; it has {sorted(arrays)}."
            )
        try:
            meta = json.loads(str(arrays["meta"]))
        except json.JSONDecodeError as err:
            raise ValueError(f"demo file {path!r}: 'meta' is not a JSON string ({err}).") from err
        if not isinstance(meta, dict):
            raise ValueError(
                f"demo file {path!r}: 'meta' must be a JSON object (a dict), got {type(meta).__name__}."
            )
        snapshots = {}
        snapshot_keys = {"snapshot_steps", "snapshot_offsets", "snapshot_bytes"}
        if snapshot_keys & set(arrays):
            if not snapshot_keys <= set(arrays):
                raise ValueError(
                    f"demo file {path!r} has {sorted(snapshot_keys & set(arrays))} but lacks "
                    f"{sorted(snapshot_keys - set(arrays))}; snapshots need all three arrays."
                )
            steps, offsets = arrays["snapshot_steps"], arrays["snapshot_offsets"]
            blob = arrays["snapshot_bytes"]
            if steps.ndim != 1 or steps.dtype.kind not in "iu":
                raise ValueError(
                    f"demo file {path!r}: snapshot_steps must be a 1-D integer array, got "
                    f"{steps.dtype} {steps.shape}."
                )
            repeated = np.unique(steps, return_counts=True)
            if (repeated[1] > 1).any():
                raise ValueError(
                    f"demo file {path!r}: snapshot_steps repeats steps "
                    f"{repeated[0][repeated[1] > 1][:5].tolist()}; each step may hold one snapshot."
                )
            if blob.ndim != 1 or blob.dtype != np.uint8:
                raise ValueError(
                    f"demo file {path!r}: snapshot_bytes must be 1-D uint8, got {blob.dtype} {blob.shape}."
                )
            if (
                offsets.dtype.kind not in "iu"
                or offsets.shape != (len(steps) + 1,)
                or offsets[0] != 0
                or offsets[-1] != len(blob)
                or (np.diff(offsets) < 0).any()
            ):
                raise ValueError(
                    f"demo file {path!r}: snapshot_offsets ({offsets.dtype} {offsets.shape}) must be "
                    f"non-decreasing integers from 0 to {len(blob)} (the snapshot_bytes length), "
                    f"one more than the {len(steps)} snapshot_steps."
                )
            snapshots = {
                int(k): blob[offsets[i] : offsets[i + 1]].tobytes() for i, k in enumerate(steps)
            }
        try:
            return cls(
                arrays["actions"],
                arrays["rewards"],
                snapshots=snapshots,
                lives=arrays.get("lives"),
                meta=meta,
            )
        except (TypeError, ValueError) as err:
            raise ValueError(f"demo file {path!r} is inconsistent: {err}") from err


# make() arguments that change what an env shows, not its actions, rewards or transitions
_PRESENTATION_KWARGS = ("render_mode", "obs_type")


def _env_spec(env) -> dict[str, Any]:
    """``Demo.meta["env_spec"]`` of a gymnasium env (format in :class:`Demo`)."""
    spec = env.spec
    if spec is None:
        cls = type(env.unwrapped)
        return {"id": f"{cls.__module__}.{cls.__qualname__}", "kwargs": {}}
    kwargs = {k: v for k, v in spec.kwargs.items() if k not in _PRESENTATION_KWARGS}
    return json.loads(json.dumps({"id": spec.id, "kwargs": kwargs}, default=repr))


def record_demo(
    env,
    actions: Sequence[int] | np.ndarray,
    *,
    seed: int | None = 0,
    snapshot_every: int | None = None,
    meta: dict[str, Any] | None = None,
) -> Demo:
    """Plays ``actions`` in a gymnasium env from ``env.reset(seed=seed)`` and records a :class:`Demo`.

    Rewards (and lives, when ``info["lives"]`` exists) are read from the env;
    ``meta["env_spec"]`` records which env it was (see :class:`Demo`), so a
    :class:`~torchrl_seqchunk.ReverseCurriculum` refuses to replay the demo in
    another one.
    When ``snapshot_every`` is set and the env can clone its state
    (``env.unwrapped.clone_state()``, as ALE envs do), the serialized state
    after every ``snapshot_every``-th action (and at step 0) is stored, so a
    :class:`~torchrl_seqchunk.ReverseCurriculum` can restore starting points
    without replaying from the start.

    Args:
        env: a ``gymnasium.Env`` with a discrete action space; it is reset.
        actions: integer array-like ``[N]``, one action per ``env.step``.

    Keyword Args:
        seed (int, optional): reset seed, stored as ``meta["reset_seed"]``.
            Defaults to ``0``.
        snapshot_every (int, optional): snapshot stride in steps. Defaults to
            ``None`` (no snapshots).
        meta (dict, optional): extra metadata to store.

    Returns:
        Demo: with ``len(actions)`` steps.

    Raises:
        TypeError: ``snapshot_every`` is not an int.
        ValueError: ``snapshot_every`` is not positive, the env cannot clone its
            state while snapshots were asked for, or the episode ends before
            the last action (the message gives the step).

    Examples:
        >>> import gymnasium as gym
        >>> env = gym.make("FrozenLake-v1", is_slippery=False)
        >>> demo = record_demo(env, [2, 2, 1, 1, 1, 2], seed=0)
        >>> demo.total, demo.meta["reset_seed"], demo.meta["env_spec"]
        (1.0, 0, {'id': 'FrozenLake-v1', 'kwargs': {'map_name': '4x4', 'is_slippery': False}})
    """
    if snapshot_every is not None:
        check_int("snapshot_every", snapshot_every, low=1)
    clone = getattr(env.unwrapped, "clone_state", None)
    if snapshot_every is not None and clone is None:
        raise ValueError(
            f"snapshot_every={snapshot_every} needs env.unwrapped.clone_state(), which "
            f"{type(env.unwrapped).__name__} lacks; pass snapshot_every=None."
        )
    actions = np.asarray(actions)
    _, info = env.reset(seed=seed)
    rewards, lives, snapshots = [], [info.get("lives")], {}
    for step, action in enumerate(actions):
        if snapshot_every is not None and step % snapshot_every == 0:
            snapshots[step] = clone().serialize()
        _, reward, terminated, truncated, info = env.step(int(action))
        rewards.append(float(reward))
        lives.append(info.get("lives"))
        if (terminated or truncated) and step < len(actions) - 1:
            raise ValueError(
                f"the episode ended at step {step} of {len(actions)} actions; pass only the "
                "actions of one episode."
            )
    if snapshot_every is not None and len(actions) % snapshot_every == 0:
        snapshots[len(actions)] = clone().serialize()
    return Demo(
        actions,
        rewards,
        snapshots=snapshots,
        lives=None if None in lives else lives,
        meta={**(meta or {}), "reset_seed": seed, "env_spec": _env_spec(env)},
    )
