"""The learning benchmarks run end to end at a tiny budget, and their metrics are right by hand."""
import csv
import importlib
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_boundary  # noqa: E402
import bench_learning  # noqa: E402
import bench_memory  # noqa: E402
from refusals import refused  # noqa: E402  tests/refusals.py

WRITERS = {"bench_memory.py", "bench_boundary.py", "bench_learning.py", "ablation_learning.py", "bench_distributed.py"}


def command(script: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args],
                          capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)


def run_bench(script: str, *args: str) -> str:
    result = command(script, *args)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def refusal(script: str, *args: str) -> str:
    """The error of a refused command line (argparse's status 2), its words joined by single spaces.

    Run in this process: the script's ``main`` reading ``sys.argv``."""
    module = importlib.import_module(script.removesuffix(".py"))
    with mock.patch.object(sys, "argv", [script, *args]):
        return " ".join(refused(module.main).split())



def test_metrics_by_hand():
    rows = [{"frames": 64, "wall_s": 1.0, "return_mean": float("nan")},
            {"frames": 128, "wall_s": 2.0, "return_mean": -0.5},
            {"frames": 192, "wall_s": 3.0, "return_mean": 0.25},
            {"frames": 256, "wall_s": 4.0, "return_mean": 0.1}]
    every = {64, 128, 192, 256}
    assert bench_memory.cell_summary(rows, 0.0, 1000, every) == {"mmer": 0.25, "frames_to_threshold": 192}
    assert bench_memory.cell_summary(rows, 0.5, 1000, every)["frames_to_threshold"] == 1000  # a miss is the cap
    # read only where every run reports: the 0.25 at frame 192 is not among them
    assert bench_memory.cell_summary(rows, 0.0, 1000, {128, 256}) == {"mmer": 0.1, "frames_to_threshold": 256}
    cartpole = [{"frames": 256, "wall_s": 1.0, "return_mean": 30.0}, {"frames": 512, "wall_s": 2.5, "return_mean": 451.0},
                {"frames": 768, "wall_s": 4.0, "return_mean": 440.0}]
    assert bench_learning.summary(cartpole, cap=10_000) == {
        "frames_to_450": 512, "wall_to_450": 2.5, "reached": True, "final_return": 440.0}
    assert bench_learning.summary(cartpole[:1], cap=10_000)["frames_to_450"] == 10_000


def test_memory_suite_runs_every_mode(tmp_path):
    # every other mode of ours on one env (every env: the slow test below)
    out = run_bench("bench_memory.py", "--envs", "RepeatFirstEasy", "--frames", "128", "--num-envs", "2",
                    "--seeds", "0", "--modes", "mask,inverse_count,streams", "--out", str(tmp_path / "modes"))
    assert "| RepeatFirstEasy |" in out and "streams" in out
    assert (tmp_path / "modes" / "memory_curves.png").stat().st_size > 1000


@pytest.mark.slow
def test_memory_suite_runs_every_env(tmp_path):
    # every suite env once (reset_continue)
    run_bench("bench_memory.py", "--frames", "128", "--num-envs", "2", "--seeds", "0", "--modes", "reset_continue",
              "--no-sb3", "--out", str(tmp_path / "suite"))
    rows = list(csv.DictReader(open(tmp_path / "suite" / "memory.csv")))
    assert {r["env"] for r in rows} == set(bench_memory.SUITE)
    assert all(int(r["frames"]) in (64, 128) for r in rows)  # 2 envs x 32 steps per rollout
    # POPGym returns lie in [-1, 1] (NaN until an episode ends)
    assert all(math.isnan(float(r["return_mean"])) or -1 <= float(r["return_mean"]) <= 1 for r in rows)
    table = (tmp_path / "suite" / "memory_table.md").read_text()
    assert all(f"| {name} |" in table for name in bench_memory.SUITE)


def write_kept_runs(path, frames=1024, num_envs=8):
    """Runs an earlier call wrote: ours report every 256 frames, sb3 every 1,024."""
    path.write_text(
        "env,mode,seed,total_frames,num_envs,frames,wall_s,return_mean\n"
        + "".join(f"RepeatFirstEasy,reset_continue,{seed},{frames},{num_envs},{f},1.0,{v}\n"
                  for seed, values in ((0, (-0.5, 0.3, -0.4, -0.2)), (1, (-0.5, -0.5, -0.5, -0.4)))
                  for f, v in zip((256, 512, 768, 1024), values))
        + f"RepeatFirstEasy,sb3,0,{frames},{num_envs},1024,9.0,-0.25\n"
        + f"RepeatFirstEasy,sb3,1,{frames},{num_envs},1024,9.0,-0.45\n")


def test_memory_table_from_finished_runs_reads_every_side_at_common_frames(tmp_path):
    write_kept_runs(tmp_path / "memory.csv")  # --resume runs nothing
    out = run_bench("bench_memory.py", "--envs", "RepeatFirstEasy", "--modes", "reset_continue,sb3", "--seeds",
                    "0,1", "--frames", "1024", "--threshold", "-0.3", "--resume", "--out", str(tmp_path))
    # at frame 1,024: ours -0.2 and -0.4 (median -0.3; the 0.3 at frame 512 is not read), sb3 -0.25 and -0.45
    assert ("| RepeatFirstEasy | -0.300 (-0.400 to -0.200), 1,024 | -0.350 (-0.450 to -0.250), 1,024 | "
            "reset_continue: +0.050 |") in out
    assert "RATIO mmer_best_ours_minus_sb3_RepeatFirstEasy +0.050" in out


@pytest.mark.parametrize("kept, flag", [({"frames": 256}, "--frames 256"), ({"num_envs": 2}, "--num-envs 2")])
def test_memory_resume_refuses_kept_runs_of_other_settings_by_name(tmp_path, kept, flag):
    # kept runs of 256 frames (or 2 envs) must not pass for the cells of a 1,024-frame, 8-env grid
    write_kept_runs(tmp_path / "memory.csv", **kept)
    before = (tmp_path / "memory.csv").read_text()
    message = refusal("bench_memory.py", "--envs", "RepeatFirstEasy", "--modes", "reset_continue,sb3", "--seeds",
                      "0,1", "--frames", "1024", "--num-envs", "8", "--resume", "--out", str(tmp_path))
    assert f"holds runs made with {flag}" in message
    assert (tmp_path / "memory.csv").read_text() == before and not (tmp_path / "memory_table.md").exists()


def test_memory_resume_refuses_runs_that_do_not_record_their_settings(tmp_path):
    (tmp_path / "memory.csv").write_text("env,mode,seed,frames,wall_s,return_mean\n"
                                        "RepeatFirstEasy,reset_continue,0,256,1.0,-0.5\n")
    message = refusal("bench_memory.py", "--envs", "RepeatFirstEasy", "--modes", "reset_continue", "--seeds", "0",
                      "--resume", "--out", str(tmp_path))
    assert "does not record the --frames, --num-envs of its runs" in message


def test_options_values_may_hold_commas():
    import toolkit
    from torchrl_seqchunk.recipes.ppo import Config as config  # the main job's

    assert toolkit.config_options(config, "keep=0,2,gamma=0.98", ()) == {"keep": "0,2", "gamma": 0.98}
    assert toolkit.config_options(config, "gamma=0.98,keep=all", ()) == {"gamma": 0.98, "keep": "all"}
    with pytest.raises(ValueError, match="'lr=0.001,5': lr takes a float"):
        toolkit.config_options(config, "lr=0.001,5", ())
    assert toolkit.config_options(config, ",gamma=0.98,,lr=0.001,", ()) == {"gamma": 0.98, "lr": 0.001}


def test_throughput_rounds_default_to_three_and_one_when_quick_unless_given():
    import bench_throughput
    assert [bench_throughput.parse_args(argv).rounds for argv in ([], ["--quick"], ["--quick", "--rounds", "5"])] \
        == [3, 1, 5]


@pytest.mark.parametrize("rnn_class", [torch.nn.GRU, torch.nn.LSTM])
def test_throughput_floor_steps_the_rnn_as_the_rnn_steps_itself(rnn_class):
    import bench_throughput
    torch.manual_seed(0)
    rnn = rnn_class(3, 5, num_layers=2)  # time-major: a step is [1, N, F]
    x = torch.randn(4, 3)
    state = bench_throughput._zero_state(rnn, 4, torch.empty(0))
    state = tuple(s + torch.randn_like(s) for s in state) if rnn_class is torch.nn.LSTM else state + torch.randn_like(state)
    with torch.no_grad():
        y, new = bench_throughput._cell_steps(rnn, x, state)
        expected_y, expected_new = rnn(x[None], state)
    torch.testing.assert_close(y, expected_y[0])
    for got, want in zip(new if rnn_class is torch.nn.LSTM else (new,),
                         expected_new if rnn_class is torch.nn.LSTM else (expected_new,)):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("script, args, message", [
    ("bench_memory.py", ["--frames", "0"], "--frames must be >= 1"),
    ("bench_memory.py", ["--seeds", "0,0"], "--seeds lists a value twice"),
    ("bench_memory.py", ["--modes", "sb3", "--no-sb3"], "nothing left to run"),
    ("bench_memory.py", ["--jobs", "0"], "--jobs must be >= 1"),
    ("bench_boundary.py", ["--windows", "0,4"], "--windows must be in [1, 32]"),
    ("bench_boundary.py", ["--modes", "mask"], "reset_continue first"),
    ("bench_learning.py", ["--seeds", "-1"], "--seeds must be >= 0"),
    ("bench_learning.py", ["--sides", "defaults,ours"], "give ours first"),
    ("bench_learning.py", ["--options", "gama=0.99"], "'gama=0.99': give name=value"),
    ("bench_learning.py", ["--options", "env_batching=vec"], "env_batching is one of ('vector', 'serial', 'parallel')"),
    ("bench_learning.py", ["--options", "gamma=2"], "--gamma must be in [0.0, 1.0]"),
    ("bench_learning.py", ["--options", "gamma=0.9,gamma=0.95"], "gamma is given twice"),
    ("bench_learning.py", ["--options", "batching=streams,window=32"], "--window applies to --batching windows only"),
    ("bench_learning.py", ["--options", "obs_norm=false,obs_norm_until=0.4"], "--obs-norm-until applies to --obs-norm"),
    ("bench_learning.py", ["--options", "max_episode_steps=200"], "'max_episode_steps=200': give name=value"),
    ("bench_learning.py", ["--options", "target_return=20"], "'target_return=20': give name=value"),
    ("bench_learning.py", ["--stop-at-target", "sb3"], "sb3's runs go to --frames"),
    ("ablation_learning.py", ["--jobs", "0"], "--jobs must be >= 1"),
    ("bench_sampler.py", ["--min-episode", "50", "--max-episode", "10"],
     "--min-episode 50 must be <= --max-episode 10"),
    ("bench_sampler.py", ["--obs-shape", "3", "0"], "--obs-shape must be >= 1"),
    ("bench_recurrent.py", ["--reset-every", "0"], "--reset-every must be >= 1.0"),
    ("bench_ppo.py", ["--window", "300"], "--window 300 is longer than --steps 256"),
    ("bench_distributed.py", ["--calibration-s", "0"], "--calibration-s must be > 0.0"),
])
def test_every_benchmark_checks_its_options_before_it_writes(tmp_path, script, args, message):
    out = ["--out", str(tmp_path / "out")] if script in WRITERS else []
    assert message in refusal(script, *args, *out)
    assert not (tmp_path / "out").exists()


def test_memory_suite_refuses_an_unknown_mode(tmp_path):
    assert "unknown ['lstm']" in refusal("bench_memory.py", "--modes", "lstm", "--out", str(tmp_path))


def test_sb3_side_runs_when_the_bench_extra_is_installed(tmp_path):
    pytest.importorskip("sb3_contrib")
    rows = bench_memory.run_sb3("RepeatFirstEasy", seed=0, frames=256, num_envs=2)
    assert [r["frames"] for r in rows] == [256]  # RecurrentPPO's default n_steps=128 per env


def test_boundary_statistics_by_hand():
    rows = [{"return_mean": float("nan")}, {"return_mean": 0.1}, {"return_mean": 0.2}]
    assert bench_boundary.auc(rows, best=0.5) == pytest.approx((0.15 + 0.5) / 1.0)  # [-0.5, 0.5] -> [0, 1]
    # diffs 1, 2, 3: of the 8 sign flips only +++ and --- reach |sum| = 6
    mean, low, high, p = bench_boundary.paired_stats([1.0, 2.0, 3.0], np.random.default_rng(0))
    assert (mean, p) == (2.0, 0.25) and 1.0 <= low <= mean <= high <= 3.0


@pytest.mark.parametrize("window", [4, 16])
def test_boundary_loss_shares_match_a_per_step_count(window):
    # episodes of 8 steps tile each 32-step rollout row: starts at 0, 8, 16, 24
    T, L = 32, 8
    starts = range(T - window + 1)  # stride 1
    counts = {"reset_continue": [0] * T, "mask": [0] * T}
    for t in range(T):
        for s in starts:
            if s <= t < s + window:
                counts["reset_continue"][t] += 1
                counts["mask"][t] += t // L == s // L  # no episode start in (s, t]
    shares = bench_boundary.loss_shares(window, L)
    for mode, per_step in counts.items():
        scale = T / (len(starts) * window)  # weight 1 / (N W) per slot, times the steps of a row
        expected = [sum(per_step[k::L]) * scale / (T // L) for k in range(L)]
        assert shares[mode] == pytest.approx(expected, abs=1e-5)
    assert shares["inverse_count"] == pytest.approx([1.0] * L, abs=1e-5)


def test_boundary_benchmark_runs(tmp_path):
    out = run_bench("bench_boundary.py", "--windows", "4", "--seeds", "0,1", "--modes", "reset_continue,mask",
                    "--frames", "256", "--out", str(tmp_path))
    assert "RATIO auc_reset_continue_vs_mask_W4 " in out
    rows = list(csv.DictReader(open(tmp_path / "boundary.csv")))
    assert {(r["mode"], r["seed"]) for r in rows} == {(m, s) for m in ("reset_continue", "mask") for s in "01"}
    table = (tmp_path / "boundary_table.md").read_text()
    assert "| 4 |" in table
    assert (tmp_path / "boundary.png").stat().st_size > 1000
    # --resume keeps the finished runs and runs none again: same rows, same table
    csv_text = (tmp_path / "boundary.csv").read_text()
    run_bench("bench_boundary.py", "--windows", "4", "--seeds", "0,1", "--modes", "reset_continue,mask",
              "--frames", "256", "--out", str(tmp_path), "--resume")
    assert (tmp_path / "boundary.csv").read_text() == csv_text
    assert (tmp_path / "boundary_table.md").read_text() == table


@pytest.mark.distributed
def test_distributed_benchmark_ratios_follow_from_its_measurements(tmp_path):
    out = run_bench("bench_distributed.py", "--rounds", "1", "--calibration-s", "0.2", "--collect-frames", "128",
                    "--frames-per-batch", "64", "--steps", "2000", "--samples", "3", "--train-steps", "5",
                    "--ddp-steps", "3", "--no-progress", "--out", str(tmp_path))
    printed = {name: float(value) for name, value in re.findall(r"^RATIO (\S+) (\S+)$", out, flags=re.M)}
    assert set(printed) == {"cpu_parallelism_2v1", "collect_fps_2v1", "collect_fps_2v1_normalised",
                            "learner_chunks_ray_vs_local", "trainer_wait_fraction_local",
                            "trainer_wait_fraction_ray", "ddp_steps_2v1", "ddp_steps_2v1_normalised"}
    with open(tmp_path / "distributed.csv", newline="") as f:
        m = {row["name"]: float(row["value"]) for row in csv.DictReader(f)}
    cpu = m["cpu_parallelism_2v1"]
    # every ratio from the raw measurements in the CSV (printed to 3 decimals)
    expected = {
        "cpu_parallelism_2v1": cpu,
        "collect_fps_2v1": m["collect_fps_2"] / m["collect_fps_1"],
        "collect_fps_2v1_normalised": m["collect_fps_2"] / m["collect_fps_1"] / cpu,
        "learner_chunks_ray_vs_local": m["chunks_per_s_ray"] / m["chunks_per_s_local"],
        "trainer_wait_fraction_local": m["wait_fraction_local"],
        "trainer_wait_fraction_ray": m["wait_fraction_ray"],
        "ddp_steps_2v1": 2 * m["ddp_steps_per_s_2"] / m["ddp_steps_per_s_1"],  # one chunk per rank and step
        "ddp_steps_2v1_normalised": 2 * m["ddp_steps_per_s_2"] / m["ddp_steps_per_s_1"] / cpu,
    }
    assert printed == pytest.approx(expected, abs=6e-4)
    assert all(value > 0 for value in m.values())
    assert 0 <= m["wait_fraction_local"] <= 1 and 0 <= m["wait_fraction_ray"] <= 1


@pytest.mark.slow
def test_throughput_ratios_follow_from_its_measurements(tmp_path):
    out = run_bench("bench_throughput.py", "--quick", "--out", str(tmp_path))
    figures = {row["name"]: float(row["value"]) for row in csv.DictReader(open(tmp_path / "throughput.csv"))}
    printed = {name: float(value) for name, value in re.findall(r"^RATIO (\S+) (\S+)$", out, flags=re.M)}
    for ratio, (top, bottom) in {"collect_vs_env_limit": ("collect_fps", "env_fps_raw"),
                                 "update_vs_compute_limit": ("update_s", "compute_s"),
                                 "fast_vs_serial": ("main_job_fps_fast", "main_job_fps_serial"),
                                 "vector_env_vs_serial_env": ("env_fps_vector", "env_fps_serial"),
                                 "acting_floor_vs_env_limit": ("acting_floor_fps", "env_fps_raw"),
                                 "collect_vs_acting_floor": ("collect_fps", "acting_floor_fps")}.items():
        assert figures[ratio] == pytest.approx(figures[top] / figures[bottom], rel=1e-6), ratio
        assert printed[ratio] == pytest.approx(figures[ratio], abs=1e-3), ratio  # printed to 3 decimals
    assert figures["frame_us_env"] > 0 and figures["frame_us_update"] > 0
    assert (tmp_path / "breakdown.png").stat().st_size > 1000


def test_torchrl_modules_bench_runs_both_recipes_and_prints_its_ratios(tmp_path):
    out = run_bench("bench_torchrl_modules.py", "--quick", "--out", str(tmp_path))
    names = [line.split()[1] for line in out.splitlines() if line.startswith("RATIO")]
    assert names == ["torchrl_module_vs_resetrnn_main_job", "torchrl_module_vs_resetrnn_dqn"]
    assert (tmp_path / "torchrl_modules.csv").exists()
