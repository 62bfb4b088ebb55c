"""benchmarks/bench_sac.py: its metrics by hand, its option checks and a tiny grid end to end."""
import csv
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_sac  # noqa: E402
from refusals import refused  # noqa: E402  tests/refusals.py

TINY = ["--tasks", "pendulum_p", "--seeds", "1", "--other-seeds", "1", "--frames", "512", "--eval-every", "256",
        "--eval-episodes", "2", "--options", "learning_starts=128,num_envs=4,batch_rows=4,seq_len=8,hidden=8,cells=8,"
        "replay_ratio=4"]


def test_final_return_is_the_mean_of_the_last_fifth_of_the_evaluations():
    rows = [{"eval_frames": 0, "eval_return": float("nan")}, {"eval_frames": 1000, "eval_return": -900.0},
            {"eval_frames": 1000, "eval_return": -900.0}, {"eval_frames": 2000, "eval_return": -500.0}]
    assert bench_sac.evaluations(rows) == [{"frames": 1000, "return_mean": -900.0},
                                           {"frames": 2000, "return_mean": -500.0}]
    evals = [{"frames": 1000 * i, "return_mean": float(-100 * i)} for i in range(1, 11)]
    assert bench_sac.final_return(evals) == -950.0  # the last 2 of 10
    assert bench_sac.final_return(evals[:3]) == -300.0  # at least one point
    assert bench_sac.recipe_options("sequence", {"seq_len": 20}) == {"replay": "sequence", "burn_in": 10}


@pytest.mark.parametrize("args, says", [
    (["--recipes", "ff,streams"], "--recipes must start with streams"),
    (["--speed-only", "--no-speed"], "leave nothing to run"),
    (["--options", "replay=slice"], "--options"),  # set by the benchmark
    (["--tasks", "pendulum_x"], "--tasks"),
])
def test_options_are_checked_before_anything_runs(args, says):
    with mock.patch.object(sys, "argv", ["bench_sac.py", *args]):
        assert says in refused(bench_sac.main)


def test_tiny_grid_writes_its_tables_and_ratios(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_sac.py"), *TINY, "--recipes",
                             "streams,sequence", "--speed-rounds", "1", "--speed-steps", "1", "--speed-frames", "256",
                             "--out", str(tmp_path)], capture_output=True, text=True, timeout=900, cwd=ROOT, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    for line in ("RATIO grad_steps_per_s_streams_vs_sequence_burnin4 ", "RATIO cost_sequence_vs_streams_pendulum_p ",
                 "GOAL streams_median_final_pendulum_p ", "| pendulum_p | streams | 1 |"):
        assert line in result.stdout, line
    summary = list(csv.DictReader(open(tmp_path / "sac_summary.csv")))
    assert [(r["recipe"], r["seed"]) for r in summary] == [("streams", "1"), ("sequence", "1")]
    evals = [r for r in csv.DictReader(open(tmp_path / "sac.csv")) if r["recipe"] == "streams"]
    assert [int(r["frames"]) for r in evals] == [256, 512]
    assert float(summary[0]["final_return"]) == float(evals[-1]["return_mean"])  # the last fifth of 2 points: 1
    assert (tmp_path / "sac.png").stat().st_size > 5000


def test_sb3_arm_evaluates_like_the_recipes_when_the_bench_extra_is_installed():
    pytest.importorskip("sb3_contrib")
    args = mock.Mock(frames=4096, eval_every=1024, eval_episodes=2)  # one rollout of 4 envs x 1024 steps
    evals, summary = bench_sac.run_sb3("pendulum_p", 1, args)
    assert [e["frames"] for e in evals] == [1024, 2048, 3072, 4096]
    assert all(-16.3 * 200 <= e["return_mean"] <= 0 for e in evals)
    assert summary["final_return"] == evals[-1]["return_mean"]  # the last fifth of 4 points: 1
