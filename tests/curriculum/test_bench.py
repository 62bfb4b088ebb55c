"""benchmarks/bench_curriculum.py runs end to end at a tiny budget; its options are checked first."""
import csv
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
pytest.importorskip("minigrid")

import bench_curriculum  # noqa: E402

from torchrl_seqchunk.recipes.common.report import Run  # noqa: E402


def test_first_counts_a_miss_as_the_budget():
    rows = [{"frames": 512, "eval_return": -200.0}, {"frames": 1024, "eval_return": -105.0},
            {"frames": 1536, "eval_return": -100.0}]
    assert bench_curriculum.first(rows, lambda r: r["eval_return"] >= -110, 2048) == (1024, True)
    assert bench_curriculum.first(rows, lambda r: r["eval_return"] >= -90, 2048) == (2048, False)


@pytest.mark.parametrize("argv, option", [
    (["--frames", "0"], "--frames"), (["--eval-every", "0"], "--eval-every"), (["--seeds", "1,x"], "--seeds"),
    (["--seeds", "1,1"], "--seeds"), (["--envs", "CartPole-v1"], "--envs"), (["--eval-episodes", "-2"], "--eval-episodes"),
    (["--options", "seed=3"], "--options 'seed=3'"), (["--options", "entropy_coeff=x"], "entropy_coeff takes a float"),
    (["--options", "entropy_coeff=-1"], "--entropy-coeff"),
    (["--options", "num_envs=8"], "--options 'num_envs=8'"),  # the evaluation interval assumes 512-frame rollouts
])
def test_bad_options_are_refused_before_any_output(tmp_path, capsys, argv, option):
    with pytest.raises(SystemExit) as exit_info:
        bench_curriculum.parse_args([*argv, "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2 and option in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_options_reach_both_arms_of_ours(monkeypatch, tmp_path):
    args = bench_curriculum.parse_args(["--options", "entropy_coeff=0.05,nudge=7", "--out", str(tmp_path)])
    seen = []
    monkeypatch.setattr(bench_curriculum.recipe, "train", lambda cfg: seen.append(cfg) or Run(tmp_path, [], ()))
    for curriculum in (True, False):
        bench_curriculum.run_ours("MountainCar-v0", curriculum, 3, args)
    assert [(c.entropy_coeff, c.nudge, c.curriculum, c.seed) for c in seen] == [(0.05, 7, True, 3), (0.05, 7, False, 3)]


def test_runs_at_a_tiny_budget(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_curriculum.py"), "--frames", "512", "--seeds", "0",
         "--eval-every", "1", "--eval-episodes", "2", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    ratios = dict(re.findall(r"^RATIO (\S+) (\S+)$", result.stdout, re.M))
    assert set(ratios) >= {"frames_to_target_curriculum_vs_scratch_MountainCar-v0"}
    with open(tmp_path / "curriculum.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    arms = {r["arm"] for r in rows}
    assert arms >= {"curriculum", "scratch"} and all(r["frames"] == "512" for r in rows)
    assert all(-200 <= float(r["eval_return"]) <= -1 for r in rows)  # MountainCar: -1 per step, 200 at most
    assert (tmp_path / "curriculum.png").stat().st_size > 0 and (tmp_path / "curriculum_table.md").exists()


@pytest.mark.parametrize("stop", [False, True])
def test_sb3_arm_stops_at_its_first_evaluation_meeting_the_target(monkeypatch, stop):
    pytest.importorskip("stable_baselines3")
    seen = []

    def evaluate(model, env, seed, index, episodes, frames, wall_s, sample=False):  # meets -110 from the second on
        seen.append(frames)
        return {"frames": frames, "max_starting_point": 0, "eval_return": -150.0 if index == 0 else -105.0}

    monkeypatch.setattr(bench_curriculum, "evaluate_sb3", evaluate)
    args = bench_curriculum.parse_args(["--frames", "3072", "--eval-every", "1", "--eval-episodes", "1",
                                        *(["--stop-at-target"] if stop else [])])
    rows = bench_curriculum.run_sb3(0, args)
    # sb3 collects 256 frames per rollout (16 envs x 16 steps): one evaluation per 512
    assert [r["frames"] for r in rows] == seen == ([512, 1024] if stop else [512, 1024, 1536, 2048, 2560, 3072])
