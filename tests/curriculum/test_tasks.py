"""The shipped sparse-reward demos (MountainCar, MiniGrid DoorKey) restore exactly; the goal
success rule; starting point 0 as the env's own reset."""
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict import TensorDict
from torchrl.envs import GymWrapper, TransformedEnv

from torchrl_seqchunk import Demo, EncodeObservation, ResetManager, ReverseCurriculum, recipes, record_demo

DATA = Path(recipes.__file__).parent / "data"  # the demos shipped with the package
minigrid = pytest.importorskip("minigrid")
from minigrid.wrappers import ImgObsWrapper  # noqa: E402

TASKS = {  # env id -> (demo file, gymnasium env as the example builds it)
    "MountainCar-v0": ("mountain_car_demo.npz", lambda: gym.make("MountainCar-v0")),
    "MiniGrid-DoorKey-5x5-v0": (
        "minigrid_doorkey_demo.npz", lambda: EncodeObservation(ImgObsWrapper(gym.make("MiniGrid-DoorKey-5x5-v0")))),
    "MiniGrid-DoorKey-8x8-v0": (
        "minigrid_doorkey8_demo.npz", lambda: EncodeObservation(ImgObsWrapper(gym.make("MiniGrid-DoorKey-8x8-v0")))),
}


def load(env_id):
    name, make = TASKS[env_id]
    return Demo.load(DATA / name), make


def reset_at(env, k):
    return env.reset(TensorDict({"starting_point": torch.tensor([k])}, []))


@pytest.mark.parametrize("env_id", TASKS)
def test_shipped_demo_replays_to_the_goal(env_id):
    demo, make = load(env_id)
    assert demo.meta["env_spec"]["id"] == env_id and demo.seed == 0
    env = make()
    env.reset(seed=demo.seed)
    rewards, ends = [], []
    for a in demo.actions:
        _, r, terminated, truncated, _ = env.step(int(a))
        rewards.append(r)
        ends.append((terminated, truncated))
    assert np.array_equal(rewards, demo.rewards)
    assert ends[-1] == (True, False) and not any(t or tr for t, tr in ends[:-1])  # the goal, last step only


def test_shipped_demo_returns():
    mountain_car, _ = load("MountainCar-v0")
    assert len(mountain_car) == 122 and mountain_car.total == -122.0  # -1 per step
    doorkey, _ = load("MiniGrid-DoorKey-5x5-v0")
    # MiniGrid pays 1 - 0.9 * steps / max_steps at the goal, max_steps = 250 on 5x5
    assert len(doorkey) == 11 and doorkey.total == pytest.approx(1 - 0.9 * 11 / 250)
    doorkey8, _ = load("MiniGrid-DoorKey-8x8-v0")  # max_steps = 640 on 8x8
    assert len(doorkey8) == 17 and doorkey8.total == pytest.approx(1 - 0.9 * 17 / 640)


@pytest.mark.parametrize("env_id", TASKS)
@pytest.mark.parametrize("fraction", [0.0, 0.5, 1.0])
def test_restore_reaches_the_demo_state_and_the_demo_finishes_as_a_success(env_id, fraction):
    demo, make = load(env_id)
    k = min(int(fraction * len(demo)), len(demo) - 1)
    manager = ResetManager(len(demo), 1, window=1, maximum=k)
    env = TransformedEnv(GymWrapper(make()), ReverseCurriculum(demo, manager, restore="replay", success="goal"))
    reference = make()
    obs, _ = reference.reset(seed=demo.seed)
    for a in demo.actions[:k]:
        obs, *_ = reference.step(int(a))
    td = env.reset()
    assert td["starting_point"].item() == k and td["score"].item() == demo.returns[k]
    assert np.allclose(td["observation"].numpy(), obs)
    for a in demo.actions[k:]:
        td = env.step(td.set("action", env.action_spec.encode(int(a))))
        obs, *_ = reference.step(int(a))
        assert np.allclose(td["next", "observation"].numpy(), obs)
        td = td["next"]
    assert td["terminated"].item() and td["success"].item()
    assert td["score"].item() == pytest.approx(demo.total)


class Walk(gym.Env):
    """Position 0..4: action 1 moves right, 0 waits; -1 per step; the goal p = 4 ends it, 8 steps truncate."""

    def __init__(self):
        self.observation_space = gym.spaces.Box(0, 8, shape=(2,), dtype=np.int64)
        self.action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.p = self.t = 0
        return np.array([self.p, self.t]), {}

    def step(self, action):
        self.p, self.t = self.p + int(action), self.t + 1
        return np.array([self.p, self.t]), -1.0, self.p == 4, self.t == 8 and self.p < 4, {}


@pytest.mark.parametrize(
    "actions, score_rule, goal_rule",
    [
        ([1, 1, 1, 1], False, True),  # faster than the demo (-4 > -5): the score rule needs its final step
        ([0, 1, 1, 1, 1], True, True),  # the demo itself
        ([0, 0, 1, 1, 1, 1], False, False),  # slower than the demo
        ([0] * 5, True, None),  # no goal: the score rule ends it as a success at the demo's length
        ([0] * 8, None, False),  # the goal rule plays on to the time limit
    ],
)
def test_goal_rule_judges_by_the_goal(actions, score_rule, goal_rule):
    demo = record_demo(Walk(), [0, 1, 1, 1, 1])  # total -5
    for rule, expected in (("score", score_rule), ("goal", goal_rule)):
        if expected is None:
            continue
        manager = ResetManager(5, 1, window=1, maximum=0)
        env = TransformedEnv(GymWrapper(Walk()), ReverseCurriculum(demo, manager, restore="replay", success=rule))
        td = env.reset()
        for a in actions:
            td = env.step(td.set("action", env.action_spec.encode(a)))["next"]
        assert td["done"].item(), (rule, actions)
        assert td["success"].item() is expected, (rule, actions)


def test_goal_rule_is_checked():
    demo = Demo([0, 1], [-1.0, -1.0])
    with pytest.raises(ValueError, match="success must be 'score' or 'goal'"):
        ReverseCurriculum(demo, restore="replay", seed=0, success="reward")


def test_starting_point_zero_is_the_envs_own_reset():
    demo, make = load("MountainCar-v0")

    def starts(seed, own):
        env = TransformedEnv(GymWrapper(make()), ReverseCurriculum(demo, restore="replay", env_reset_at_zero=own))
        env.set_seed(seed)
        out = []
        for k in (0, 50, 0, 0, 50, 0):
            td = reset_at(env, k)
            out.append(td["observation"].tolist())
            assert td["score"].item() == demo.returns[k]
        return out

    demo_start = gym.make("MountainCar-v0").reset(seed=demo.seed)[0].tolist()
    plain = starts(1, own=False)
    assert all(np.allclose(plain[i], demo_start) for i in (0, 2, 3, 5))
    own = starts(1, own=True)
    zeros = [own[i] for i in (0, 2, 3, 5)]
    assert len({round(o[0], 6) for o in zeros}) == 4  # four draws of the env's start distribution
    assert all(-0.6 <= o[0] <= -0.4 and o[1] == 0.0 for o in zeros)
    assert np.allclose(own[1], plain[1]) and np.allclose(own[4], plain[1])  # k > 0: the demo state still
    assert own == starts(1, own=True) and own != starts(2, own=True)  # seeded by the env's seed
