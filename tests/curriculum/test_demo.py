"""Demo loading, saving, validation and recording."""
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from torchrl_seqchunk import Demo, recipes, record_demo

DEMO_PATH = Path(recipes.__file__).parent / "data" / "montezuma_revenge_demo.npz"  # shipped with the package
FROZEN_LAKE_WIN = [2, 2, 1, 1, 1, 2]  # right, right, down, down, down, right on the 4x4 map
LAKE_4X4 = {"id": "FrozenLake-v1", "kwargs": {"map_name": "4x4", "is_slippery": False}}


def test_load_montezuma_demo():
    demo = Demo.load(DEMO_PATH)
    raw = np.load(DEMO_PATH)
    assert len(demo) == 53_057 and demo.total == 71_500.0
    assert demo.actions.dtype == np.int64 and np.array_equal(demo.actions, raw["actions"])
    assert demo.returns.shape == (53_058,)
    for k in (0, 357, 10_000, 50_000, 53_057):
        assert demo.returns[k] == raw["rewards"][:k].sum()
    assert demo.seed == 0 and demo.meta["frameskip"] == 1
    assert demo.lives.shape == (53_058,)


def test_save_load_round_trip(tmp_path):
    demo = Demo([3, 1, 2], [0.1, 1.5, -1.0], snapshots={0: b"ab", 2: b"xyz"}, lives=[3, 3, 2, 2], meta={"a": 1})
    demo.save(tmp_path / "d.npz")
    back = Demo.load(tmp_path / "d.npz")
    assert back.actions.tolist() == [3, 1, 2]
    assert back.rewards.tolist() == [0.1, 1.5, -1.0]  # exactly, no float32 rounding
    assert np.allclose(back.returns, [0.0, 0.1, 1.6, 0.6])
    assert back.snapshots == {0: b"ab", 2: b"xyz"}
    assert back.lives.tolist() == [3, 3, 2, 2] and back.meta == {"a": 1}


def test_record_demo_stores_the_env_and_save_load_keeps_it(tmp_path):
    # gymnasium.make fills in the registered map_name; render_mode does not change the dynamics
    demo = record_demo(gym.make("FrozenLake-v1", is_slippery=False, render_mode="ansi"), FROZEN_LAKE_WIN)
    assert demo.meta["env_spec"] == LAKE_4X4
    demo.save(tmp_path / "d.npz")
    assert Demo.load(tmp_path / "d.npz").meta["env_spec"] == LAKE_4X4
    # the shipped demo names its env: ALE Montezuma, one emulator frame per action, no sticky actions
    shipped = Demo.load(DEMO_PATH).meta["env_spec"]
    assert shipped["id"] == "ALE/MontezumaRevenge-v5"
    assert shipped["kwargs"]["frameskip"] == 1 and shipped["kwargs"]["repeat_action_probability"] == 0.0


def _write(path, **arrays):
    np.savez(path, **arrays)
    return path


@pytest.mark.parametrize(
    "arrays, match",
    [
        ({"actions": np.zeros(3, np.uint8), "rewards": np.zeros(3)}, "lacks arrays \\['meta'\\]"),
        ({"actions": np.zeros(3, np.uint8), "rewards": np.zeros(4), "meta": np.array("{}")}, "equal length"),
        ({"actions": np.zeros(3), "rewards": np.zeros(3), "meta": np.array("{}")}, "integers"),
        ({"actions": np.zeros(3, np.uint8), "rewards": np.zeros(3), "meta": np.array("{oops")}, "JSON"),
        (
            {"actions": np.zeros(3, np.uint8), "rewards": np.zeros(3), "meta": np.array("{}"), "lives": np.zeros(3, np.uint8)},
            "lives",
        ),
        ({"actions": np.zeros(3, np.uint8), "rewards": np.array([None] * 3), "meta": np.array("{}")}, "pickle"),
    ],
)
def test_load_rejects_corrupt_files(tmp_path, arrays, match):
    path = _write(tmp_path / "bad.npz", **arrays)
    with pytest.raises(ValueError, match=match) as info:
        Demo.load(path)
    assert "bad.npz" in str(info.value)


def _snapshot_arrays(steps, offsets, blob):
    return {
        "actions": np.zeros(3, np.uint8), "rewards": np.zeros(3), "meta": np.array("{}"),
        "snapshot_steps": np.asarray(steps), "snapshot_offsets": np.asarray(offsets),
        "snapshot_bytes": np.asarray(blob),
    }


@pytest.mark.parametrize(
    "arrays, match",
    [
        # offsets missing: the snapshots cannot be cut apart
        ({k: v for k, v in _snapshot_arrays([0], [0, 2], np.zeros(2, np.uint8)).items() if k != "snapshot_offsets"}, "snapshot_offsets"),
        # float offsets, decreasing offsets, 2-D steps, float bytes
        (_snapshot_arrays([0], [0.0, 2.0], np.zeros(2, np.uint8)), "snapshot_offsets"),
        (_snapshot_arrays([0, 1], [0, 3, 2], np.zeros(2, np.uint8)), "snapshot_offsets"),
        (_snapshot_arrays([[0]], [0, 2], np.zeros(2, np.uint8)), "snapshot_steps"),
        (_snapshot_arrays([0], [0, 2], np.zeros(2, np.float32)), "snapshot_bytes"),
        # actions must index an action set: a negative one would wrap around
        ({"actions": np.array([0, -1, 2]), "rewards": np.zeros(3), "meta": np.array("{}")}, "negative"),
        # meta must be a JSON object, not any JSON value
        ({"actions": np.zeros(3, np.uint8), "rewards": np.zeros(3), "meta": np.array("[1, 2]")}, "JSON object"),
        # a NaN reward makes the demo's total unreachable
        ({"actions": np.zeros(3, np.uint8), "rewards": np.array([0.0, np.nan, 1.0]), "meta": np.array("{}")}, "finite"),
    ],
)
def test_load_rejects_corrupt_snapshots_and_values(tmp_path, arrays, match):
    path = _write(tmp_path / "bad.npz", **arrays)
    with pytest.raises(ValueError, match=match) as info:
        Demo.load(path)
    assert "bad.npz" in str(info.value)


def test_load_rejects_non_npz(tmp_path):
    path = tmp_path / "demo.npz"
    path.write_bytes(b"not a zip file")
    with pytest.raises(ValueError, match="cannot read demo file"):
        Demo.load(path)


@pytest.mark.parametrize("kind", ["npy", "truncated"])
def test_load_names_the_file_and_the_fix_for_npy_and_truncated_files(tmp_path, kind):
    # a .npy file is read as one array (TypeError before), a cut .npz has no zip directory
    # (zipfile.BadZipFile before)
    path = tmp_path / f"demo.{kind}"
    if kind == "npy":
        np.save(path, np.zeros(3, np.int64))
    else:
        Demo([1, 0], [0.0, 1.0], meta={}).save(tmp_path / "whole.npz")
        whole = (tmp_path / "whole.npz").read_bytes()
        path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ValueError, match="cannot read demo file .*Demo.save") as info:
        Demo.load(path)
    assert path.name in str(info.value)
    assert ("single ndarray" in str(info.value)) == (kind == "npy")


def test_constructor_validation():
    with pytest.raises(ValueError, match="empty"):
        Demo([], [])
    with pytest.raises(ValueError, match=r"a snapshots key must be in \[0, 2\], got 3"):
        Demo([1, 2], [0.0, 0.0], snapshots={3: b""})
    with pytest.raises(TypeError, match="numeric"):
        Demo([1], ["a"])
    # what save could not write: refused when built, naming it
    with pytest.raises(TypeError, match=r"snapshots\[1\] must be bytes .*got str"):
        Demo([1, 2], [0.0, 0.0], snapshots={1: "state"})
    with pytest.raises(TypeError, match="meta must hold JSON values .*int64"):
        Demo([1], [0.0], meta={"reset_seed": np.int64(3)})
    with pytest.raises(TypeError, match="meta must be a dict, got list"):
        Demo([1], [0.0], meta=[1, 2])


def test_numpy_integers_float_or_repeated_snapshot_steps_and_huge_actions(tmp_path):
    # NumPy integers are ints: snapshot keys become Python ints, a NumPy stride works
    demo = Demo(np.array([1, 0], np.uint8), [0.0, 1.0], snapshots={np.int64(2): b"s"})
    assert demo.snapshots == {2: b"s"} and type(next(iter(demo.snapshots))) is int
    # (FrozenLake cannot clone its state: the NumPy stride passes the int check and gets that far)
    with pytest.raises(ValueError, match="snapshot_every=2 needs env.unwrapped.clone_state"):
        record_demo(gym.make("FrozenLake-v1", is_slippery=False), FROZEN_LAKE_WIN, snapshot_every=np.int64(2))
    # a float step would be saved as int64 step 1, silently another state
    with pytest.raises(TypeError, match=r"a snapshots key must be an int .*got 1.5"):
        Demo([1, 0], [0.0, 1.0], snapshots={1.5: b"s"})
    # a file with step 1 twice: the second snapshot would silently replace the first
    path = _write(tmp_path / "bad.npz", **_snapshot_arrays([1, 1], [0, 1, 2], np.zeros(2, np.uint8)))
    with pytest.raises(ValueError, match=r"bad.npz.*repeats steps \[1\]"):
        Demo.load(path)
    # 2**63 + 5 as uint64 would wrap to -2**63 + 5 in int64
    with pytest.raises(ValueError, match=f"too large value \\({2**63 + 5} at step 1\\)"):
        Demo(np.array([0, 2**63 + 5], np.uint64), [0.0, 0.0])
    assert Demo(np.array([2**63 - 1], np.uint64), [0.0]).actions.tolist() == [2**63 - 1]


def test_record_demo_on_a_gymnasium_env():
    demo = record_demo(gym.make("FrozenLake-v1", is_slippery=False), FROZEN_LAKE_WIN, seed=3, meta={"env": "lake"})
    assert demo.rewards.tolist() == [0, 0, 0, 0, 0, 1] and demo.total == 1.0
    assert demo.meta == {"env": "lake", "reset_seed": 3, "env_spec": LAKE_4X4}
    assert demo.snapshots == {} and demo.lives is None
    with pytest.raises(ValueError, match="ended at step 5"):
        record_demo(gym.make("FrozenLake-v1", is_slippery=False), FROZEN_LAKE_WIN + [0])
    with pytest.raises(ValueError, match="clone_state"):
        record_demo(gym.make("FrozenLake-v1", is_slippery=False), FROZEN_LAKE_WIN, snapshot_every=2)
    # a fractional stride would snapshot at steps 0, 5, 10, ... of snapshot_every=2.5
    with pytest.raises(TypeError, match="snapshot_every must be an int >= 1, got 2.5"):
        record_demo(gym.make("FrozenLake-v1", is_slippery=False), FROZEN_LAKE_WIN, snapshot_every=2.5)


def test_record_demo_snapshots_restore_on_ale():
    import ale_py

    gym.register_envs(ale_py)
    make = lambda: gym.make(  # noqa: E731
        "ALE/MontezumaRevenge-v5", frameskip=1, repeat_action_probability=0.0, obs_type="grayscale"
    )
    reference = Demo.load(DEMO_PATH)
    demo = record_demo(make(), reference.actions[:400], seed=0, snapshot_every=100)
    assert sorted(demo.snapshots) == [0, 100, 200, 300, 400]
    assert np.array_equal(demo.rewards, reference.rewards[:400])
    assert np.array_equal(demo.lives, reference.lives[:401])
    # the snapshot at 300 holds the state after 300 actions (a restore leaves the screen stale
    # until the next frame, so compare RAM, then the screens one frame later)
    env = make()
    env.reset(seed=0)
    env.unwrapped.restore_state(ale_py.ALEState(demo.snapshots[300]))
    replay = make()
    replay.reset(seed=0)
    for a in reference.actions[:300]:
        replay.step(int(a))
    assert np.array_equal(env.unwrapped.ale.getRAM(), replay.unwrapped.ale.getRAM())
    assert np.array_equal(env.step(3)[0], replay.step(3)[0])



def test_save_writes_exactly_the_path_it_is_given(tmp_path):
    Demo([0, 1], [0.0, 1.0]).save(tmp_path / "demo.npz")
    Demo([3, 3, 3], [5.0, 5.0, 5.0], meta={5: "x", "t": (1, 2)}).save(tmp_path / "demo")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo", "demo.npz"]
    assert len(Demo.load(tmp_path / "demo.npz")) == 2  # not overwritten by the second save
    loaded = Demo.load(tmp_path / "demo")
    assert len(loaded) == 3 and loaded.meta == {"5": "x", "t": [1, 2]}  # JSON, as documented
