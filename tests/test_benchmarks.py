"""The learning benchmarks run end to end at a tiny budget, and their metrics are right by hand."""
import csv
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_learning  # noqa: E402
import bench_memory  # noqa: E402


def run_bench(script: str, *args: str) -> str:
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args],
                            capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_metrics_by_hand():
    rows = [{"frames": 64, "wall_s": 1.0, "return_mean": float("nan")},
            {"frames": 128, "wall_s": 2.0, "return_mean": -0.5},
            {"frames": 192, "wall_s": 3.0, "return_mean": 0.25},
            {"frames": 256, "wall_s": 4.0, "return_mean": 0.1}]
    assert bench_memory.cell_summary(rows, 0.0, cap=1000) == {"mmer": 0.25, "frames_to_threshold": 192}
    assert bench_memory.cell_summary(rows, 0.5, cap=1000)["frames_to_threshold"] == 1000  # a miss is the cap
    cartpole = [{"frames": 256, "wall_s": 1.0, "return_mean": 30.0}, {"frames": 512, "wall_s": 2.5, "return_mean": 451.0},
                {"frames": 768, "wall_s": 4.0, "return_mean": 440.0}]
    assert bench_learning.summary(cartpole, cap=10_000) == {
        "frames_to_450": 512, "wall_to_450": 2.5, "reached": True, "final_return": 440.0}
    assert bench_learning.summary(cartpole[:1], cap=10_000)["frames_to_450"] == 10_000


def test_memory_suite_runs_every_env_and_mode(tmp_path):
    # every suite env once (reset_continue), and every other mode of ours on one env
    run_bench("bench_memory.py", "--frames", "128", "--num-envs", "2", "--seeds", "0", "--modes", "reset_continue",
              "--no-sb3", "--out", str(tmp_path / "suite"))
    out = run_bench("bench_memory.py", "--envs", "RepeatFirstEasy", "--frames", "128", "--num-envs", "2",
                    "--seeds", "0", "--modes", "mask,inverse_count,streams", "--out", str(tmp_path / "modes"))
    rows = list(csv.DictReader(open(tmp_path / "suite" / "memory.csv")))
    assert {r["env"] for r in rows} == set(bench_memory.SUITE)
    assert all(int(r["frames"]) in (64, 128) for r in rows)  # 2 envs x 32 steps per rollout
    # POPGym returns lie in [-1, 1] (NaN until an episode ends)
    assert all(math.isnan(float(r["return_mean"])) or -1 <= float(r["return_mean"]) <= 1 for r in rows)
    table = (tmp_path / "suite" / "memory_table.md").read_text()
    assert all(f"| {name} |" in table for name in bench_memory.SUITE)
    assert "| RepeatFirstEasy |" in out and "streams" in out
    assert (tmp_path / "modes" / "memory_curves.png").stat().st_size > 1000


def test_memory_suite_refuses_an_unknown_mode(tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_memory.py"), "--modes", "lstm",
                             "--out", str(tmp_path)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 2 and "unknown ['lstm']" in result.stderr


def test_sb3_side_runs_when_the_bench_extra_is_installed(tmp_path):
    pytest.importorskip("sb3_contrib")
    rows = bench_memory.run_sb3("RepeatFirstEasy", seed=0, frames=256, num_envs=2)
    assert [r["frames"] for r in rows] == [256]  # RecurrentPPO's default n_steps=128 per env
