"""Gymnasium tasks as flat float observations, and partially observable variants, for recurrent agents.

:class:`EncodeObservation` turns any observation built from ``Box``, ``Discrete``,
``MultiDiscrete``, ``MultiBinary``, ``Tuple`` and ``Dict`` spaces into one flat float32
vector (one-hots for the discrete parts), so that the first linear layer of a policy can read
it. :class:`MaskObservation` keeps a subset of a flat ``Box`` observation, e.g. CartPole-v1
without its two velocity components, so that a policy must infer them from memory.
:class:`PreviousReward` appends the previous step's reward to it, an input recurrent agents
commonly read. :func:`make_masked_env` builds an env encoded, optionally masked, and wrapped for TorchRL;
it is a module-level function, so ``functools.partial(make_masked_env, ...)`` pickles into
``ParallelEnv`` workers. :func:`make_vector_env` builds a batch of them stepped in this process
by one gymnasium ``SyncVectorEnv``, several times faster than a ``SerialEnv`` of cheap envs and
seeded alike (:class:`SyncVectorGymWrapper`).
"""
from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

import gymnasium as gym
import numpy as np
from torchrl._utils import seed_generator
from torchrl.envs import GymWrapper
from torchrl.envs.libs.gym import _gym_to_torchrl_spec_transform

from ._checks import check_int

__all__ = ["EncodeObservation", "MaskObservation", "PreviousReward", "SyncVectorGymWrapper", "make_masked_env", "make_vector_env",
           "DEFAULT_KEEP"]

#: Observation indices kept by default for well-known tasks (positions without velocities).
#: CartPole-v1 observes [cart position, cart velocity, pole angle, pole angular velocity];
#: keeping (0, 2) is the classic "CartPole without velocities" POMDP.
DEFAULT_KEEP = {"CartPole-v1": (0, 2)}


_LEAF_SPACES = (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)


def _leaves(space: gym.Space, where: str, value=None, check=False):
    """Yields ``(part, where, value of the part)`` for every part of ``space`` that is not a
    ``Tuple`` or ``Dict``, ``where`` naming it (``obs['key'][0]``). ``check``: refuse a
    ``value`` whose ``Tuple`` / ``Dict`` parts are not exactly those of ``space``."""
    if isinstance(space, (gym.spaces.Tuple, gym.spaces.Dict)):
        dict_space = isinstance(space, gym.spaces.Dict)
        if check and not (
            isinstance(value, Mapping) and set(value) == set(space.spaces) if dict_space
            else isinstance(value, (tuple, list)) and len(value) == len(space.spaces)
        ):
            _refuse(where, value, space)
        for key, sub in space.spaces.items() if dict_space else enumerate(space.spaces):
            yield from _leaves(sub, f"{where}[{key!r}]", None if value is None else value[key],
                               check)
    else:
        yield space, where, value


def _refuse(where: str, value, part: gym.Space):
    raise ValueError(
        f"{where}={value!r} is outside its space {part}, which EncodeObservation would "
        "encode wrongly or not at all: the env returned an observation its "
        "observation_space does not hold. Fix the env, or declare a space that holds it."
    )


def _check_encodable(space: gym.Space) -> None:
    for part, where, _ in _leaves(space, "env.observation_space"):
        if not isinstance(part, _LEAF_SPACES):
            raise TypeError(
                f"{where}={part} ({type(part).__name__}) cannot be encoded as a flat float "
                "vector; only Box, Discrete, MultiDiscrete, MultiBinary and Tuple/Dict of them "
                "can. Wrap the env in a gymnasium.ObservationWrapper that maps it to one of "
                "these spaces first."
            )


def _check_in_space(space: gym.Space, observation) -> None:
    """Refuses an observation that gymnasium's flatten would encode wrongly or not at all:
    ``Tuple`` / ``Dict`` parts missing or extra, any part of another shape, a discrete part
    out of range or not an integer (an int64-castable dtype where flatten indexes with it),
    a non-float ``Box`` part its dtype cannot hold (NaN, ``2.7`` or ``300`` for ``uint8``:
    the cast would change it). Other ``Box`` values are encoded as they are, inside their
    bounds or not."""
    for part, where, value in _leaves(space, "observation", observation, check=True):
        number = np.asarray(value)
        if isinstance(part, gym.spaces.Box):
            if number.shape != part.shape or not (part.dtype.kind == "f" or _held(number, part)):
                _refuse(where, value, part)
            continue
        if isinstance(part, gym.spaces.Discrete):
            low, high, shape_ok = part.start, part.start + part.n, number.size == 1
        elif isinstance(part, gym.spaces.MultiDiscrete):
            low, high, shape_ok = part.start, part.start + part.nvec, number.shape == part.shape
        else:  # MultiBinary
            low, high, shape_ok = 0, 2, number.shape == part.shape
        if isinstance(part, gym.spaces.MultiBinary):  # flatten casts its bits to int8
            dtype_ok = number.dtype.kind in "iubf"
        else:  # flatten indexes with value - start: an index if the value casts to int64
            dtype_ok = np.can_cast(number.dtype, np.int64)
        if not (shape_ok and dtype_ok
                and np.all((low <= number) & (number < high) & (number % 1 == 0))):
            _refuse(where, value, part)


def _held(number: np.ndarray, part: gym.spaces.Box) -> bool:
    """Whether ``number`` casts to the dtype of ``part`` unchanged."""
    if number.dtype.kind not in "iubf":
        return False
    with np.errstate(invalid="ignore", over="ignore"):
        return bool(np.array_equal(number.astype(part.dtype), number))


class EncodeObservation(gym.ObservationWrapper):
    """Encode an observation as one flat float32 vector, one-hot for its discrete parts.

    The encoding is gymnasium's :func:`~gymnasium.spaces.utils.flatten`, cast to float32:

    - ``Discrete(n, start)``: a one-hot of size ``n``, with a 1 at ``obs - start``;
    - ``MultiDiscrete(nvec, start)``: the one-hots of every entry (``nvec`` of any shape, read
      in C order) concatenated, size ``nvec.sum()``;
    - ``Box`` of any shape and dtype (float64, int, uint8, bool, ...): its values flattened in C
      order, not rescaled (a uint8 image stays in ``[0, 255]``);
    - ``MultiBinary``: its bits flattened, as 0.0 and 1.0;
    - ``Tuple`` and ``Dict``: the encodings of their parts concatenated, a ``Dict`` in its own
      key order (sorted, for a ``Dict`` built from a plain ``dict``).

    The wrapped observation space is ``Box(low, high, shape=(D,), dtype=float32)``, with ``D``
    gymnasium's ``flatdim`` and the bounds of the parts (0 and 1 for one-hots). Rewards,
    termination, truncation and actions are unchanged.

    Args:
        env (gymnasium.Env): an env whose observation space is built from the spaces above.

    Raises:
        TypeError: if the observation space, or any part of it, is another space (``Text``,
            ``Graph``, ``Sequence``, ``OneOf``, ...); the message names the part.
        ValueError: at a step, if the observation is outside its space in a way the
            encoding would corrupt: a ``Tuple`` / ``Dict`` part missing or extra, any part of
            another shape, a ``Discrete`` / ``MultiDiscrete`` / ``MultiBinary`` value out of
            range or not an integer (for ``Discrete`` / ``MultiDiscrete``, of a dtype that
            casts to int64: not float nor uint64), or a ``Box`` value of an integer or bool
            dtype that the dtype cannot hold (NaN, ``2.7``, ``300`` for ``uint8``); the
            message names the part (``observation['key'][0]``), its value and its space.
            Other ``Box`` values are encoded as they are, even outside their bounds.

    Examples:
        >>> import gymnasium as gym
        >>> env = EncodeObservation(gym.make("FrozenLake-v1"))
        >>> env.observation_space
        Box(0.0, 1.0, (16,), float32)
        >>> env.observation(5).nonzero()  # state 5 of 16: a one-hot at 5
        (array([5]),)
    """

    def __init__(self, env: gym.Env):
        super().__init__(env)
        _check_encodable(env.observation_space)
        flat = gym.spaces.utils.flatten_space(env.observation_space)
        self.observation_space = gym.spaces.Box(
            low=flat.low.astype(np.float32), high=flat.high.astype(np.float32), dtype=np.float32
        )

    def observation(self, observation):
        _check_in_space(self.env.observation_space, observation)
        flat = gym.spaces.utils.flatten(self.env.observation_space, observation)
        return np.asarray(flat, dtype=np.float32)


class MaskObservation(gym.ObservationWrapper):
    """Keep only the given indices of a flat ``Box`` observation.

    The wrapped observation space is ``Box(low[keep], high[keep])`` with the original dtype;
    every observation ``obs`` of shape ``[D]`` becomes ``obs[keep]`` of shape ``[len(keep)]``.
    Rewards, termination and truncation are unchanged.

    Args:
        env (gymnasium.Env): an env whose observation space is a 1-D ``gymnasium.spaces.Box``.
        keep (sequence of int): the observation indices to keep, in the order given; each in
            ``[-D, D)``, no duplicates, at least one.

    Raises:
        TypeError: if the observation space is not a 1-D ``Box``, or ``keep`` holds a non-integer.
        ValueError: if ``keep`` is empty, out of range or has duplicates.

    Examples:
        >>> import gymnasium as gym
        >>> env = MaskObservation(gym.make("CartPole-v1"), keep=[0, 2])
        >>> env.observation_space.shape
        (2,)
        >>> full, _ = gym.make("CartPole-v1").reset(seed=0)
        >>> obs, _ = env.reset(seed=0)
        >>> bool((obs == full[[0, 2]]).all())
        True
    """

    def __init__(self, env: gym.Env, keep: Sequence[int]):
        super().__init__(env)
        space = env.observation_space
        if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
            raise TypeError(
                f"MaskObservation needs a 1-D Box observation space, got env.observation_space="
                f"{space}; flatten the observation first (gymnasium.wrappers.FlattenObservation)."
            )
        dim = space.shape[0]
        keep = list(keep)
        if not keep:
            raise ValueError("keep=[] keeps nothing; pass at least one observation index.")
        if not all(isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in keep):
            raise TypeError(f"keep must hold integers, got keep={keep}.")
        if any(not -dim <= i < dim for i in keep):
            raise ValueError(f"keep={keep} is out of range for an observation of size {dim}; "
                             f"use indices in [{-dim}, {dim}).")
        normalized = [int(i) % dim for i in keep]
        if len(set(normalized)) != len(normalized):
            raise ValueError(f"keep={keep} repeats an index; list each index once.")
        self.keep = np.asarray(normalized, dtype=np.int64)
        self.observation_space = gym.spaces.Box(
            low=space.low[self.keep], high=space.high[self.keep], dtype=space.dtype
        )

    def observation(self, observation):
        return observation[self.keep]


class PreviousReward(gym.Wrapper):
    """Append the previous step's reward to a flat ``Box`` observation (0 after a reset).

    Every observation ``obs`` ``[D]`` becomes ``[*obs, r]`` ``[D + 1]`` in the observation
    space's dtype: ``r`` the reward of the step that led to it, 0 for the first observation of
    an episode (its bounds are infinite). Recurrent agents from replay read it beside the
    previous action (Ni, Eysenbach and Salakhutdinov 2022, "Recurrent Model-Free RL Can Be a
    Strong Baseline for Many POMDPs", feed both to their encoders); where the reward is a function of hidden state (Pendulum's cost of
    the angle) it observes that function. Rewards, termination and truncation are unchanged.

    Args:
        env (gymnasium.Env): an env whose observation space is a 1-D float ``gymnasium.spaces.Box``.

    Raises:
        TypeError: if the observation space is not a 1-D float ``Box``.

    Examples:
        >>> import gymnasium as gym
        >>> env = PreviousReward(gym.make("CartPole-v1"))
        >>> env.observation_space.shape, float(env.reset(seed=0)[0][-1])
        ((5,), 0.0)
        >>> float(env.step(0)[0][-1])  # CartPole's reward of the step
        1.0
    """

    def __init__(self, env: gym.Env):
        super().__init__(env)
        space = env.observation_space
        if (not isinstance(space, gym.spaces.Box) or len(space.shape) != 1
                or not np.issubdtype(space.dtype, np.floating)):
            raise TypeError(f"PreviousReward needs a 1-D float Box observation space, got env.observation_space="
                            f"{space}; encode it first (EncodeObservation).")
        self.observation_space = gym.spaces.Box(low=np.append(space.low, -np.inf).astype(space.dtype),
                                                high=np.append(space.high, np.inf).astype(space.dtype),
                                                dtype=space.dtype)

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        return self._with(obs, 0.0), info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return self._with(obs, reward), reward, terminated, truncated, info

    def _with(self, obs, reward) -> np.ndarray:
        return np.append(obs, reward).astype(self.observation_space.dtype, copy=False)


def make_masked_env(env_id: str, keep: Sequence[int] | None = None, *, device="cpu", prev_reward: bool = False,
                    **make_kwargs):
    """Build ``env_id`` as a TorchRL env with a flat float32 observation, keeping the indices ``keep``.

    The gymnasium env is wrapped in :class:`EncodeObservation` (any supported observation space
    becomes one flat float32 vector), then, if ``keep`` is given, in :class:`MaskObservation`,
    which indexes that *encoded* vector: for a ``Discrete`` part, ``keep`` picks entries of its
    one-hot. Actions are ``GymWrapper``'s mapping of the action space: ``Discrete(n)`` a one-hot
    ``[n]``, ``Box`` as is, ``MultiDiscrete(nvec)`` (1-D ``nvec``) one-hots ``[len(nvec), n]`` if
    every entry of ``nvec`` is ``n``, else ``[nvec.sum()]``.

    Args:
        env_id (str): a registered gymnasium id, e.g. ``"CartPole-v1"``, or ``"module:id"`` to
            import ``module`` first so that it registers ``id`` (gymnasium's own syntax). POPGym
            registers ``popgym-<EnvClass>-v0`` on import, so ``"popgym:popgym-RepeatFirstEasy-v0"``
            builds ``popgym.envs.repeat_first.RepeatFirstEasy``; popgym is imported only then.
        keep (sequence of int, optional): indices of the encoded observation kept by
            :class:`MaskObservation`; ``None`` keeps the full observation.

    Keyword Args:
        device (torch.device or str): device of the TorchRL env's tensors. Defaults to ``"cpu"``.
        prev_reward (bool): append the previous step's reward after the kept entries
            (:class:`PreviousReward`). Defaults to ``False``.
        **make_kwargs: passed to ``gymnasium.make``.

    Returns:
        torchrl.envs.GymWrapper: float32 observation under ``"observation"`` with shape ``[D]``,
        ``D`` the encoded size (:class:`EncodeObservation`), or ``[len(keep)]`` (one more with
        ``prev_reward``).

    Raises:
        TypeError: if the observation space cannot be encoded (:class:`EncodeObservation`), or
            ``keep`` holds a non-integer.
        ValueError: if ``keep`` is empty, out of range or has duplicates.

    Examples:
        >>> env = make_masked_env("CartPole-v1", keep=(0, 2))
        >>> env.reset()["observation"].shape
        torch.Size([2])
        >>> make_masked_env("FrozenLake-v1").reset()["observation"]  # Discrete(16) start state 0
        tensor([1., 0., 0., 0., 0., 0., 0., 0., 0., 0., 0., 0., 0., 0., 0., 0.])
        >>> # picklable factory for workers:
        >>> import functools
        >>> from torchrl.envs import SerialEnv
        >>> SerialEnv(2, functools.partial(make_masked_env, "CartPole-v1", (0, 2))).reset()["observation"].shape
        torch.Size([2, 2])
    """
    return GymWrapper(_encoded(env_id, keep, make_kwargs, prev_reward), device=device)


def _encoded(env_id: str, keep: Sequence[int] | None, make_kwargs: dict, prev_reward: bool = False) -> gym.Env:
    env = EncodeObservation(gym.make(env_id, **make_kwargs))
    env = env if keep is None else MaskObservation(env, keep)
    return PreviousReward(env) if prev_reward else env


class SyncVectorGymWrapper(GymWrapper):
    """TorchRL's ``GymWrapper`` over a gymnasium ``SyncVectorEnv`` without autoreset, seeded as ``SerialEnv`` is.

    With ``autoreset_mode=AutoresetMode.DISABLED`` a gymnasium vector env behaves as a TorchRL
    batched env: the step that ends an episode returns that episode's last observation (the one
    a truncated episode bootstraps from), and the envs that ended are reset on the collector's
    ``"_reset"`` mask only. :meth:`set_seed` seeds env ``i`` with the ``i``-th seed of TorchRL's
    chain (``seed``, ``seed_generator(seed)``, ...), as ``SerialEnv`` and ``ParallelEnv`` seed
    their workers, instead of gymnasium's ``seed + i``: the same seed gives the same episodes
    on either path. The action spec is that of one env, batched (gymnasium's batched
    ``MultiDiscrete`` action space is an integer ``Box``). Everything else is ``GymWrapper``'s.

    Args:
        env (gymnasium.vector.SyncVectorEnv): built with
            ``autoreset_mode=gymnasium.vector.AutoresetMode.DISABLED``.

    Keyword Args:
        **kwargs: passed to ``GymWrapper`` (``device``, ...).

    Raises:
        TypeError: if ``env`` is not a ``SyncVectorEnv``.
        ValueError: if its ``autoreset_mode`` is not ``DISABLED``.

    Examples:
        >>> import functools, gymnasium as gym
        >>> from torchrl.envs import GymEnv, SerialEnv
        >>> vector = SyncVectorGymWrapper(gym.vector.SyncVectorEnv(
        ...     [lambda: gym.make("CartPole-v1")] * 2, autoreset_mode=gym.vector.AutoresetMode.DISABLED))
        >>> serial = SerialEnv(2, functools.partial(GymEnv, "CartPole-v1"))
        >>> _ = vector.set_seed(0), serial.set_seed(0)
        >>> bool((vector.reset()["observation"] == serial.reset()["observation"]).all())
        True
    """

    def __init__(self, env=None, **kwargs):
        if env is not None:  # None: TorchRL rebuilding the wrapper from its own kwargs
            if not isinstance(env, gym.vector.SyncVectorEnv):
                raise TypeError(f"env must be a gymnasium.vector.SyncVectorEnv, got {type(env).__name__}; "
                                "build one with make_vector_env or wrap others in GymWrapper.")
            if env.autoreset_mode != gym.vector.AutoresetMode.DISABLED:
                raise ValueError(
                    f"env.autoreset_mode={env.autoreset_mode}: build the SyncVectorEnv with "
                    "autoreset_mode=gymnasium.vector.AutoresetMode.DISABLED, so that the envs that "
                    "end reset on TorchRL's '_reset' mask and keep their last observation.")
        super().__init__(env, **kwargs)

    def _make_specs(self, env, batch_size=None) -> None:
        super()._make_specs(env, batch_size)
        # the action spec of one env, batched: gymnasium batches a MultiDiscrete action space
        # into an integer Box, which TorchRL would read as one bounded integer per entry
        single = _gym_to_torchrl_spec_transform(env.single_action_space, device=self.device,
                                                categorical_action_encoding=self._categorical_action_encoding)
        self.action_spec = single.expand(*self.batch_size, *single.shape)

    def set_seed(self, seed: int | None = None, static_seed: bool = False) -> int | None:
        """Seeds env ``i`` with the ``i``-th seed of TorchRL's chain (all with ``seed`` if
        ``static_seed``) and resets every env; returns the next seed, as ``SerialEnv`` does."""
        if seed is None:
            return super().set_seed(None, static_seed)
        seeds = []
        for _ in range(self.batch_size[0]):
            seeds.append(seed)
            seed = seed if static_seed else seed_generator(seed)
        self._set_seed(seeds)  # gymnasium's reset(seed=[...]): one seed per env
        return seed


def make_vector_env(env_id: str, num_envs: int, keep: Sequence[int] | None = None, *, device="cpu",
                    prev_reward: bool = False, **make_kwargs) -> SyncVectorGymWrapper:
    """Build ``num_envs`` copies of :func:`make_masked_env`'s env, stepped in this process as one batch.

    Each copy is the gymnasium env :func:`make_masked_env` wraps (encoded by
    :class:`EncodeObservation`, masked by :class:`MaskObservation` if ``keep`` is given); a
    gymnasium ``SyncVectorEnv`` with autoreset disabled steps them in turn, and
    :class:`SyncVectorGymWrapper` gives them to TorchRL. Specs, observations, actions and
    done flags are those of ``SerialEnv(num_envs, partial(make_masked_env, env_id, keep))``,
    and so are the episodes for the same ``set_seed``; the per-step cost of ``SerialEnv``'s
    worker loop and TensorDict plumbing is gone (several times the frames per second on
    cheap envs such as CartPole). For envs whose step is expensive, ``ParallelEnv`` of
    :func:`make_masked_env` spreads the work over processes instead.

    .. note:: TorchRL's ``VecNormV2`` updates its statistics with every row of a reset, the
        envs not reset too. ``SerialEnv`` gives those rows the observation of their own last
        reset, this env their current observation; so with ``VecNormV2`` the statistics of the
        two paths part at the first partial reset. :class:`~torchrl_seqchunk.RunningObservationNorm`
        (the same rule, counting only the envs reset) keeps them equal step for step.

    Args:
        env_id (str): a registered gymnasium id, or ``"module:id"`` (see :func:`make_masked_env`).
        num_envs (int): envs in the batch, >= 1.
        keep (sequence of int, optional): indices of the encoded observation kept.

    Keyword Args:
        device (torch.device or str): device of the TorchRL env's tensors. Defaults to ``"cpu"``.
        prev_reward (bool): append the previous step's reward (:class:`PreviousReward`).
        **make_kwargs: passed to ``gymnasium.make`` for every env (``max_episode_steps=...``).

    Returns:
        SyncVectorGymWrapper: batch size ``[num_envs]``; float32 ``"observation"`` ``[num_envs, D]``.

    Raises:
        TypeError: if ``num_envs`` is not an int; those of :func:`make_masked_env`.
        ValueError: if ``num_envs < 1``; those of :func:`make_masked_env`.

    Examples:
        >>> env = make_vector_env("CartPole-v1", 4, keep=(0, 2))
        >>> env.batch_size, env.reset()["observation"].shape
        (torch.Size([4]), torch.Size([4, 2]))
    """
    check_int("num_envs", num_envs, low=1)
    factory = functools.partial(_encoded, env_id, None if keep is None else tuple(keep), make_kwargs, prev_reward)
    vector = gym.vector.SyncVectorEnv([factory] * num_envs, autoreset_mode=gym.vector.AutoresetMode.DISABLED)
    return SyncVectorGymWrapper(vector, device=device)
