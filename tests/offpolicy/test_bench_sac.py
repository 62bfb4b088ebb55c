"""benchmarks/bench_sac.py: its metrics by hand, its option checks and a tiny grid end to end."""
import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import gymnasium as gym
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_sac  # noqa: E402
from refusals import refused  # noqa: E402  tests/refusals.py

from torchrl_seqchunk.recipes.common.report import evaluation_points, final_evaluation  # noqa: E402

TINY = ["--tasks", "pendulum_p", "--seeds", "1", "--other-seeds", "1", "--frames", "512", "--eval-every", "256",
        "--eval-episodes", "2", "--options", "learning_starts=128,num_envs=4,batch_rows=4,seq_len=8,hidden=8,cells=8,"
        "replay_ratio=4"]


def test_final_return_is_the_mean_of_the_last_fifth_of_the_evaluations():
    rows = [{"eval_frames": 0, "eval_return": float("nan")}, {"eval_frames": 1000, "eval_return": -900.0},
            {"eval_frames": 1000, "eval_return": -900.0}, {"eval_frames": 2000, "eval_return": -500.0}]
    assert evaluation_points(rows) == [{"frames": 1000, "return_mean": -900.0}, {"frames": 2000, "return_mean": -500.0}]
    assert evaluation_points([{"frames": 128, "return_mean": 3.0}]) == []  # a run without evaluations
    evals = [{"frames": 1000 * i, "return_mean": float(-100 * i)} for i in range(1, 11)]
    assert final_evaluation(evals) == -950.0  # the last 2 of 10
    assert final_evaluation(evals[:3]) == -300.0  # at least one point
    assert math.isnan(final_evaluation([]))
    assert bench_sac.recipe_options("sequence", {"seq_len": 20}) == {"replay": "sequence", "burn_in": 10}


@pytest.mark.parametrize("args, says", [
    (["--recipes", "ff,streams"], "--recipes must start with streams"),
    (["--speed-only", "--no-speed"], "leave nothing to run"),
    (["--options", "replay=slice"], "--options"),  # set by the benchmark
    (["--options", "eval_every=500"], "eval_every"),  # --eval-every's: sb3 reads it too
    (["--recipes", "streams,sb3", "--options", "max_episode_steps=100"], "drop max_episode_steps"),
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
    settings = json.loads((tmp_path / bench_sac.SETTINGS).read_text())
    assert settings["frames"] == 512 and settings["seq_len"] == 8 and settings["eval_episodes"] == 2
    assert settings["gamma"] == 0.9 and "seed" not in settings  # defaults resolved, per-run fields left out
    args = mock.Mock(frames=512, options={"gamma": 0.9})  # naming a default is running with it
    assert bench_sac.settings(args) == bench_sac.settings(mock.Mock(frames=512, options={}))


def test_sb3_arm_evaluates_each_update_with_the_training_statistics_when_the_bench_extra_is_installed():
    pytest.importorskip("sb3_contrib")
    from stable_baselines3.common import evaluation
    from stable_baselines3.common.vec_env import VecNormalize

    def fake_evaluation(model, env, n_eval_episodes, deterministic):  # what each evaluation sees
        train = model.get_env()
        assert isinstance(train, VecNormalize) and train.training and train.norm_reward  # rl-zoo's normalize: True
        assert not env.training and not env.norm_reward  # the raw rewards, the statistics frozen...
        np.testing.assert_array_equal(env.obs_rms.mean, train.obs_rms.mean)  # ...and synced from training
        assert n_eval_episodes == 2 and deterministic
        return float(model._n_updates), 0.0  # PPO's count of epochs trained so far

    args = mock.Mock(frames=8192, eval_every=1024, eval_episodes=2, options={})  # two rollouts of 4 envs x 1024 steps
    with mock.patch.object(evaluation, "evaluate_policy", fake_evaluation):
        evals, summary = bench_sac.run_sb3("pendulum_p", 1, args)
    assert [e["frames"] for e in evals] == [1024, 2048, 3072, 4096, 5120, 6144, 7168, 8192]
    assert [e["return_mean"] for e in evals] == [0, 0, 0, 10, 10, 10, 10, 20]  # 10 epochs per rollout's update
    assert summary["final_return"] == 15  # the last fifth of 8 points, rounded up: 10 and 20


@pytest.mark.parametrize("task, kept", [("pendulum_p", [0, 1]), ("pendulum_v", [2])])
def test_sb3_env_keeps_the_tasks_entries_and_appends_the_previous_reward_when_asked(task, kept):
    plain, env = gym.make("Pendulum-v1"), bench_sac.sb3_env(task, prev_reward=True)
    assert bench_sac.sb3_env(task).observation_space.shape == (len(kept),)
    assert env.observation_space.shape == (len(kept) + 1,)
    full, _ = plain.reset(seed=3)
    obs, _ = env.reset(seed=3)
    np.testing.assert_allclose(obs, [*full[kept], 0.0], rtol=1e-6)
    for action in ([1.5], [-2.0]):
        full, reward, *_ = plain.step(np.array(action, dtype=np.float32))
        obs, same_reward, *_ = env.step(np.array(action, dtype=np.float32))
        assert same_reward == reward
        np.testing.assert_allclose(obs, [*full[kept], reward], rtol=1e-6)


def _write_run(folder: Path, task: str, recipe: str, seed: int, returns: list[float], frames: int = 2000) -> None:
    folder.mkdir(exist_ok=True)
    (folder / bench_sac.SETTINGS).write_text(json.dumps({"frames": frames, "eval_every": 1000}))
    new = not (folder / "sac.csv").exists()
    with open(folder / "sac.csv", "a", newline="") as f, open(folder / "sac_summary.csv", "a", newline="") as g:
        rows = csv.DictWriter(f, fieldnames=["task", "recipe", "seed", "frames", "return_mean"])
        summary = csv.DictWriter(g, fieldnames=["task", "recipe", "seed", "final_return", "grad_steps",
                                                "grad_steps_per_s", "wall_s"])
        if new:
            rows.writeheader()
            summary.writeheader()
        rows.writerows({"task": task, "recipe": recipe, "seed": seed, "frames": 1000 * (i + 1), "return_mean": r}
                       for i, r in enumerate(returns))
        summary.writerow({"task": task, "recipe": recipe, "seed": seed, "final_return": returns[-1],
                          "grad_steps": 10, "grad_steps_per_s": 5.0, "wall_s": 2.0})


def test_merge_joins_pieces_of_a_grid_and_reports_them_as_one(tmp_path, capsys):
    """Two folders (a grid split over processes): one table over both, medians by hand, and a run
    given twice refused."""
    _write_run(tmp_path / "a", "pendulum_p", "streams", 1, [-900.0, -200.0])
    _write_run(tmp_path / "a", "pendulum_p", "streams", 2, [-900.0, -300.0])
    _write_run(tmp_path / "b", "pendulum_p", "streams", 3, [-900.0, -100.0])
    _write_run(tmp_path / "b", "pendulum_p", "ff", 1, [-900.0, -800.0])
    out = tmp_path / "merged"
    with mock.patch.object(sys, "argv", ["bench_sac.py", "--merge", f"{tmp_path / 'a'},{tmp_path / 'b'}",
                                         "--out", str(out)]):
        bench_sac.main()
    printed = capsys.readouterr().out
    assert "| pendulum_p | streams | 3 | -200.0 |" in printed  # median of -200, -300, -100
    assert "RATIO cost_ff_vs_streams_pendulum_p 4.000" in printed  # 800 / 200
    assert "GOAL streams_median_final_pendulum_p -200.0 (>= -180: not reached)" in printed
    assert "PAIRED streams_vs_ff_pendulum_p streams ahead on 1 of 1 seeds, mean difference +600.0" in printed
    summary = list(csv.DictReader(open(out / "sac_summary.csv")))
    assert sorted((r["recipe"], r["seed"]) for r in summary) == [("ff", "1"), ("streams", "1"), ("streams", "2"),
                                                                 ("streams", "3")]
    assert len(list(csv.DictReader(open(out / "sac.csv")))) == 8 and (out / "sac.png").exists()
    with mock.patch.object(sys, "argv", ["bench_sac.py", "--merge", f"{tmp_path / 'a'},{tmp_path / 'a'}",
                                         "--out", str(out)]):
        assert "is in two folders" in refused(bench_sac.main)
    assert json.loads((out / bench_sac.SETTINGS).read_text()) == {"frames": 2000, "eval_every": 1000}
    _write_run(tmp_path / "c", "pendulum_p", "ff", 2, [-900.0, -800.0], frames=4000)  # another budget
    with mock.patch.object(sys, "argv", ["bench_sac.py", "--merge", f"{tmp_path / 'a'},{tmp_path / 'c'}",
                                         "--out", str(out)]):
        assert "ran with other settings than" in refused(bench_sac.main)


def test_merge_refuses_folders_without_runs_and_leaves_nan_runs_out(tmp_path, capsys):
    """A header-only folder or one without sac.csv is refused by name before anything is written; a
    run without an evaluation (NaN final return) stays out of the median and the PAIRED line."""
    _write_run(tmp_path / "a", "pendulum_p", "streams", 1, [-900.0, -200.0])
    (tmp_path / "a" / "sac.csv").rename(tmp_path / "a_sac.csv")
    for args, says in (([str(tmp_path / "a")], "no sac.csv there"),):
        with mock.patch.object(sys, "argv", ["bench_sac.py", "--merge", *args, "--out", str(tmp_path / "x")]):
            assert says in refused(bench_sac.main)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / bench_sac.SETTINGS).write_text("{}")
    for name, header in (("sac.csv", "task,recipe,seed,frames,return_mean"),
                         ("sac_summary.csv", "task,recipe,seed,final_return,grad_steps,grad_steps_per_s,wall_s")):
        (tmp_path / "empty" / name).write_text(header + "\n")
    with mock.patch.object(sys, "argv", ["bench_sac.py", "--merge", str(tmp_path / "empty"), "--out", str(tmp_path / "x")]):
        assert "no run in" in refused(bench_sac.main)
    assert not (tmp_path / "x" / "sac.csv").exists()
    _write_run(tmp_path / "b", "pendulum_p", "streams", 1, [-900.0, -200.0])
    _write_run(tmp_path / "b", "pendulum_p", "streams", 2, [-900.0, float("nan")])
    _write_run(tmp_path / "b", "pendulum_p", "ff", 1, [-900.0, -600.0])
    _write_run(tmp_path / "b", "pendulum_p", "ff", 2, [-900.0, -700.0])
    with mock.patch.object(sys, "argv", ["bench_sac.py", "--merge", str(tmp_path / "b"), "--out", str(tmp_path / "y")]):
        bench_sac.main()
    printed = capsys.readouterr().out
    assert "pendulum_p streams: 1 run(s) without an evaluation, left out of the median" in printed
    assert "| pendulum_p | streams | 1 | -200.0 |" in printed
    assert "PAIRED streams_vs_ff_pendulum_p streams ahead on 1 of 1 seeds, mean difference +400.0" in printed
