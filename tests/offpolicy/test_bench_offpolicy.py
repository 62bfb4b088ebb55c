"""benchmarks/bench_offpolicy.py: its per-run metrics by hand, its option checks, a tiny speed run and the pooling of earlier grids."""
import os
import re
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_offpolicy  # noqa: E402
from refusals import refused  # noqa: E402  tests/refusals.py
from toolkit import checked_config  # noqa: E402

from torchrl_seqchunk.recipes import dqn  # noqa: E402


def command(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_offpolicy.py"), *args],
                          capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)


def refusal(*args: str) -> str:
    """The error of a refused command line (argparse's status 2), run in this process: a refusal
    comes before any work."""
    with mock.patch.object(sys, "argv", ["bench_offpolicy.py", *args]):
        return refused(bench_offpolicy.main)


def test_run_metrics_by_hand():
    rows = [{"frames": 128, "return_mean": float("nan"), "grad_steps": 0, "learn_s": 0.0,
             "recurrent_steps_per_grad_step": 0.0},
            {"frames": 256, "return_mean": 20.0, "grad_steps": 4, "learn_s": 2.0,
             "recurrent_steps_per_grad_step": 700.0},
            {"frames": 384, "return_mean": 12.0, "grad_steps": 10, "learn_s": 4.0,
             "recurrent_steps_per_grad_step": 704.0}]
    assert bench_offpolicy.summarize(rows, 15.0, 1000) == {
        "mmer": 20.0, "frames_to_threshold": 256, "final_return": 12.0, "grad_steps_per_s": 2.5,
        "recurrent_steps_per_grad_step": 704.0}
    assert bench_offpolicy.summarize(rows, 30.0, 1000)["frames_to_threshold"] == 1000  # a miss is the cap


def test_mmer_ratio_only_between_positive_medians():
    assert bench_offpolicy.mmer_ratio_line("m", 0.9, 0.6) == "RATIO m 1.500"
    # POPGym returns below zero: -0.6 is ahead of -0.75, which a quotient (0.8) would hide
    line = bench_offpolicy.mmer_ratio_line("m", -0.6, -0.75)
    assert not line.startswith("RATIO") and line.endswith("difference of medians, streams - recipe +0.150")


def test_frames_ratio_only_where_a_median_reaches_the_threshold():
    assert bench_offpolicy.frames_ratio_line("f", 500, 1000, 1000) == "RATIO f 0.500"
    assert bench_offpolicy.frames_ratio_line("f", 1000, 800, 1000) == "RATIO f 1.250"  # a miss is the cap
    line = bench_offpolicy.frames_ratio_line("f", 1000, 1000, 1000)  # neither reached: not a tie
    assert not line.startswith("RATIO") and "neither median reaches the threshold" in line


def test_options_are_checked_before_anything_runs(tmp_path):
    message = refusal("--recipes", "sequence,streams", "--out", str(tmp_path / "x"))
    assert "--recipes must start with streams" in message
    message = refusal("--frames", "640", "--no-speed", "--out", str(tmp_path / "x"))  # no gradient step
    assert "total_frames=640, replay=streams: --learning-starts 2000" in message
    message = refusal("--speed-only", "--no-speed", "--out", str(tmp_path / "x"))
    assert "--speed-only and --no-speed leave nothing to run" in message
    message = refusal("--options", "replay=slice", "--out", str(tmp_path / "x"))  # the recipes set it
    assert "'replay=slice': give name=value" in message
    message = refusal("--options", "replay_ratio=0", "--out", str(tmp_path / "x"))
    assert "--replay-ratio must be > 0.0" in message
    for given, expected in [("stop_at_target=true", "'stop_at_target=true': give name=value"),  # set here
                            ("burn_in=5", "'burn_in=5': give name=value"),
                            ("tau=0.01,hard_update=5", "--tau applies to --hard-update 0 only"),  # tau at its default
                            ("lr=0.001,lr=0.002", "lr is given twice")]:
        message = refusal("--options", given, "--no-speed", "--out", str(tmp_path / "x"))
        assert expected in message, (given, message[-2000:])
    # each run checked as the DQN recipe's command line is: the env's 4 observations have no index 7
    message = refusal("--options", "keep=7", "--tasks", "repeat_first", "--no-speed", "--out", str(tmp_path / "x"))
    assert "a run of env=popgym:popgym-RepeatFirstEasy-v0" in message
    assert "--keep 7: keep=[7] is out of range" in message
    assert not (tmp_path / "x").exists()


def test_options_are_checked_against_the_runs_of_the_grid():
    """Against --frames and each task and recipe, not the DQN recipe's own defaults (60,000 frames)."""
    chosen = {"learning_starts": 70_000}
    with pytest.raises(ValueError, match="leave no gradient step"):
        checked_config(dqn.Config, chosen)
    assert checked_config(dqn.Config, chosen, total_frames=100_000, replay="slice").learning_starts == 70_000
    # the speed comparisons' Configs too, on the grid's budget (they were rebuilt on 4,096 and 60,000 frames)
    configs = bench_offpolicy.speed_configs(chosen, 100_000)
    assert set(configs) == {"streams", "collect", "sequence_burnin0", f"sequence_burnin{dqn.Config.burn_in}"}
    assert all(cfg.learning_starts == 70_000 for cfg in configs.values())
    assert configs["sequence_burnin0"].replay == "sequence" and configs["sequence_burnin0"].burn_in == 0
    with pytest.raises(ValueError, match="replay=sequence, burn_in=0 and --options 'stream_groups=4'"):
        bench_offpolicy.speed_configs({"stream_groups": 4}, 100_000)  # the sequence recipe would ignore it
    assert bench_offpolicy.options_text({"replay_ratio": 16.0, "lr": 1e-3}) == "lr=0.001"  # the default left out
    assert bench_offpolicy.options_text({"replay_ratio": float(dqn.Config.replay_ratio)}) == ""


def test_tiny_speed_run_prints_its_ratios(tmp_path):
    result = command("--speed-only", "--speed-frames", "128", "--speed-rounds", "1", "--speed-steps", "1",
                     "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    ratios = [line for line in result.stdout.splitlines() if line.startswith("RATIO")]
    assert [line.split()[1] for line in ratios] == ["grad_steps_per_s_streams_vs_sequence_burnin0",
                                                     "grad_steps_per_s_streams_vs_sequence_burnin10",
                                                     "collect_fps_vector_vs_collector"]
    assert all(float(line.split()[2]) > 0 for line in ratios)


def write_runs(folder: Path, mmers: dict, options: str | None = None) -> None:
    """An offpolicy.csv as a grid writes it: two rows per run, its MMER first, half of it last;
    ``options``: its column ``options`` (None: a file of a grid from before the column)."""
    folder.mkdir()
    column, value = ("", "") if options is None else (",options", f',"{options}"')
    lines = ["task,recipe,seed,frames,wall_s,return_mean,grad_steps,learn_s,recurrent_steps_per_grad_step" + column]
    for (recipe, seed), mmer in mmers.items():
        lines += [f"cartpole,{recipe},{seed},128,1.0,{mmer},10,1.0,673{value}",
                  f"cartpole,{recipe},{seed},256,2.0,{mmer / 2},20,2.0,673{value}"]
    (folder / "offpolicy.csv").write_text("\n".join(lines) + "\n")


def test_from_runs_pools_earlier_grids_over_the_seeds_every_recipe_ran(tmp_path):
    write_runs(tmp_path / "a", {("streams", 1): 100.0, ("sequence", 1): 50.0, ("streams", 2): 200.0,
                                ("sequence", 2): 250.0})
    write_runs(tmp_path / "b", {("streams", 3): 300.0, ("sequence", 3): 150.0, ("streams", 4): 90.0})  # 4: no pair
    base = ["--tasks", "cartpole", "--recipes", "streams,sequence", "--frames", "256"]
    result = command("--from-runs", f"{tmp_path / 'a'},{tmp_path / 'b'}", *base, "--out", str(tmp_path / "pooled"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "seeds [1, 2, 3]" in result.stdout
    assert "RATIO mmer_streams_vs_sequence_cartpole 1.333" in result.stdout  # medians 200 / 150
    # paired differences +50, -50, +150: mean +50; medians of the final returns 100 and 75
    assert "| cartpole | sequence | 150.00 | never | 75.00 | 10.0 | 673 | +50.00 [" in result.stdout
    assert (tmp_path / "pooled" / "offpolicy.png").exists()
    summary = (tmp_path / "pooled" / "offpolicy_summary.csv").read_text().splitlines()
    assert len(summary) == 1 + 6 and summary[1].startswith("cartpole,streams,1,100,256,50,10,673")

    assert "seeds left out, a task or recipe missing: [4]" in result.stdout

    (tmp_path / "twice").mkdir()  # one run written twice into one file: its frames restart
    (tmp_path / "twice" / "offpolicy.csv").write_text((tmp_path / "a" / "offpolicy.csv").read_text() + "\n".join(
        (tmp_path / "a" / "offpolicy.csv").read_text().splitlines()[1:3]) + "\n")
    write_runs(tmp_path / "rr4", {("streams", 1): 1.0}, options="lr=0.001,replay_ratio=4.0")
    assert bench_offpolicy.read_runs([str(tmp_path / "rr4")], ["cartpole"], ["streams"], 256,
                                     {"replay_ratio": 4.0, "lr": 1e-3})[1] == [1]
    (tmp_path / "nocolumn").mkdir()
    (tmp_path / "nocolumn" / "offpolicy.csv").write_text("task,recipe,seed,frames\ncartpole,streams,1,128\n")
    for folders, recipes, frames, match in [
            (["a", "a"], ["streams", "sequence"], 256, "in more than one folder"),
            (["none"], ["streams", "sequence"], 256, "no offpolicy.csv there"),
            (["a"], ["streams", "slice"], 256, "no seed has a run of every task"),
            (["twice"], ["streams", "sequence"], 256, "restarts at 128 frames: two runs under one key"),
            (["nocolumn"], ["streams"], 256, "has no column ['return_mean', 'grad_steps'"),
            (["a"], ["streams", "sequence"], 100_000, "ends at 256 frames, a grid of --frames 100000 at 100096"),
            (["a", "rr4"], ["streams"], 256, "made with --options 'lr=0.001,replay_ratio=4.0', not ''")]:
        with pytest.raises(ValueError, match=re.escape(match)):
            bench_offpolicy.read_runs([str(tmp_path / f) for f in folders], ["cartpole"], recipes, frames, {})
    with pytest.raises(ValueError, match=re.escape("made with --options '', not 'replay_ratio=4.0'")):
        bench_offpolicy.read_runs([str(tmp_path / "a")], ["cartpole"], ["streams"], 256, {"replay_ratio": 4.0})
    for flag in (("--seeds", "1,2,3,4,5"), ("--speed-only",)):  # refused even at its default
        assert "not with --speed-only or --seeds" in refusal("--from-runs", str(tmp_path / "a"), *flag, *base,
                                                             "--out", str(tmp_path / "x"))
    assert not (tmp_path / "x").exists()
