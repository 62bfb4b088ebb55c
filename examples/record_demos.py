"""Records the shipped demonstrations of the sparse-reward tasks (torchrl_seqchunk/recipes/data/, see its README.md).

    python examples/record_demos.py            # writes the .npz files into torchrl_seqchunk/recipes/data/
    python examples/record_demos.py --check    # re-records and compares with the shipped files

- ``mountain_car_demo.npz``: ``MountainCar-v0`` from ``reset(seed=0)``, a hand policy that
  pushes in the direction of the velocity (right when it is 0).
- ``minigrid_doorkey_demo.npz`` and ``minigrid_doorkey8_demo.npz``: ``MiniGrid-DoorKey-5x5-v0``
  and ``MiniGrid-DoorKey-8x8-v0`` from ``reset(seed=0)``, a breadth-first planner on the full
  grid: to the key, pick it up, to the door, open it, to the goal.
"""
from __future__ import annotations

import argparse
from collections import deque
from pathlib import Path

import gymnasium as gym
import numpy as np

from torchrl_seqchunk import Demo, record_demo, recipes

DATA = Path(recipes.__file__).resolve().parent / "data"  # the demos ship with the package
MOUNTAIN_CAR = DATA / "mountain_car_demo.npz"
DOORKEYS = {"MiniGrid-DoorKey-5x5-v0": DATA / "minigrid_doorkey_demo.npz",
            "MiniGrid-DoorKey-8x8-v0": DATA / "minigrid_doorkey8_demo.npz"}
SEED = 0


def mountain_car_actions(seed: int = SEED) -> list[int]:
    """Push right (2) while the velocity is >= 0, else left (0), until the goal."""
    env = gym.make("MountainCar-v0")
    obs, _ = env.reset(seed=seed)
    actions, done = [], False
    while not done:
        actions.append(2 if obs[1] >= 0 else 0)
        obs, _, terminated, truncated, _ = env.step(actions[-1])
        done = terminated or truncated
    if not terminated:
        raise RuntimeError("the hand policy did not reach the goal within the time limit")
    return actions


LEFT, RIGHT, FORWARD, PICKUP, TOGGLE = 0, 1, 2, 3, 5
STEP = {0: (1, 0), 1: (0, 1), 2: (-1, 0), 3: (0, -1)}  # minigrid's direction -> (dx, dy)


def _plan(grid, start: tuple[int, int, int], goal) -> tuple[list[int], tuple[int, int, int]]:
    """Shortest turn/forward path from ``start`` (x, y, direction) to a state where
    ``goal(state)`` holds; the agent only enters cells that are empty or can be overlapped."""
    parents = {start: None}
    queue = deque([start])
    while queue:
        state = queue.popleft()
        if goal(state):
            path, node = [], state
            while parents[node] is not None:
                node, action = parents[node]
                path.append(action)
            return path[::-1], state
        x, y, d = state
        dx, dy = STEP[d]
        front = grid.get(x + dx, y + dy)
        moves = [(LEFT, (x, y, (d - 1) % 4)), (RIGHT, (x, y, (d + 1) % 4))]
        if front is None or front.can_overlap():
            moves.append((FORWARD, (x + dx, y + dy, d)))
        for action, nxt in moves:
            if nxt not in parents:
                parents[nxt] = (state, action)
                queue.append(nxt)
    raise RuntimeError("the planner found no path")


def doorkey_actions(env_id: str, seed: int = SEED) -> list[int]:
    """Key, door, goal: the shortest path to each, planned on the env's full grid."""
    env = gym.make(env_id)
    env.reset(seed=seed)
    grid = env.unwrapped.grid

    def facing(kind):
        def goal(state):
            x, y, d = state
            cell = grid.get(x + STEP[d][0], y + STEP[d][1])
            return cell is not None and cell.type == kind
        return goal

    def on_goal(state):
        cell = grid.get(state[0], state[1])
        return cell is not None and cell.type == "goal"

    state = (*env.unwrapped.agent_pos, env.unwrapped.agent_dir)
    actions = []
    for goal, last in ((facing("key"), PICKUP), (facing("door"), TOGGLE)):
        path, state = _plan(grid, state, goal)
        actions += path + [last]
        for action in path + [last]:  # the grid changes: the key leaves it, the door opens
            env.step(action)
    path, _ = _plan(grid, state, on_goal)
    return actions + path


def record_all() -> dict[Path, Demo]:
    import minigrid  # noqa: F401  (registers the MiniGrid ids)

    source = "examples/record_demos.py"
    demos = {
        MOUNTAIN_CAR: record_demo(
            gym.make("MountainCar-v0"), mountain_car_actions(), seed=SEED,
            meta={"source": f"{source}: push in the direction of the velocity"},
        ),
    }
    for env_id, path in DOORKEYS.items():
        demos[path] = record_demo(gym.make(env_id), doorkey_actions(env_id), seed=SEED,
                                  meta={"source": f"{source}: breadth-first planner, key -> door -> goal"})
    return demos


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare with the shipped files instead of writing")
    args = parser.parse_args()
    for path, demo in record_all().items():
        if args.check:
            shipped = Demo.load(path)
            same = np.array_equal(shipped.actions, demo.actions) and np.array_equal(shipped.rewards, demo.rewards)
            print(f"{path.name}: {'matches' if same else 'DIFFERS'} ({len(demo)} steps, return {demo.total:g})")
        else:
            demo.save(path)
            print(f"wrote {path.name}: {len(demo)} steps, return {demo.total:g}")


if __name__ == "__main__":
    main()
