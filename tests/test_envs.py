import functools

import gymnasium as gym
import numpy as np
import pytest
import torch
from torchrl.envs import SerialEnv

from torchrl_seqchunk import MaskObservation
from torchrl_seqchunk.envs import make_masked_env


def test_mask_keeps_positions_and_leaves_dynamics_alone():
    full = gym.make("CartPole-v1")
    masked = MaskObservation(gym.make("CartPole-v1"), keep=[0, 2])
    assert masked.observation_space.shape == (2,)
    # CartPole's bounds: cart position +-4.8, pole angle +-0.418879 rad (24 degrees * 2).
    np.testing.assert_allclose(masked.observation_space.high, [4.8, 0.41887903], rtol=1e-6)
    assert masked.observation_space.dtype == np.float32

    obs_full, _ = full.reset(seed=3)
    obs, _ = masked.reset(seed=3)
    np.testing.assert_array_equal(obs, obs_full[[0, 2]])
    for action in [1, 1, 0, 1, 0, 0, 1]:
        obs_full, r_full, term_full, trunc_full, _ = full.step(action)
        obs, r, term, trunc, _ = masked.step(action)
        np.testing.assert_array_equal(obs, obs_full[[0, 2]])
        assert (r, term, trunc) == (r_full, term_full, trunc_full)


def test_mask_order_and_negative_indices():
    env = MaskObservation(gym.make("CartPole-v1"), keep=[-1, 0])
    obs, _ = env.reset(seed=0)
    full, _ = gym.make("CartPole-v1").reset(seed=0)
    np.testing.assert_array_equal(obs, [full[3], full[0]])
    np.testing.assert_array_equal(env.keep, [3, 0])


@pytest.mark.parametrize(
    "keep, error, match",
    [([], ValueError, "keeps nothing"),
     ([0, 4], ValueError, "out of range"),
     ([1, -3], ValueError, "repeats"),
     ([0.5], TypeError, "integers"),
     ([True], TypeError, "integers")],
)
def test_mask_rejects_bad_keep(keep, error, match):
    with pytest.raises(error, match=match):
        MaskObservation(gym.make("CartPole-v1"), keep=keep)


def test_mask_rejects_non_flat_space():
    with pytest.raises(TypeError, match="1-D Box"):
        MaskObservation(gym.make("FrozenLake-v1"), keep=[0])


def test_factory_in_serial_env_matches_gymnasium():
    env = SerialEnv(2, functools.partial(make_masked_env, "CartPole-v1", (0, 2)))
    env.set_seed(7)
    td = env.reset()
    assert td["observation"].shape == (2, 2)
    assert td["observation"].dtype == torch.float32
    # Each worker is an unmodified CartPole: its masked reset observation lies in the
    # uniform(-0.05, 0.05) initial range, and every step pays reward 1.
    assert td["observation"].abs().max() <= 0.05
    rollout = env.rollout(20, break_when_any_done=False)
    assert rollout["next", "reward"].eq(1).all()
    assert rollout["observation"].shape == (2, 20, 2)
    env.close()
