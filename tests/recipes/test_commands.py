"""The recipes run end to end as a user runs them, ``seqchunk <recipe> ...``: a subprocess per
command line (``python -m torchrl_seqchunk.recipes``, the console script's module; a refused
command line is parsed in this process: the refusal comes before any work)."""
import csv
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch

from refusals import refused  # tests/refusals.py

from torchrl_seqchunk.recipes import cli

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
       "COLUMNS": "200"}  # tyro's help and errors wrap at the terminal's width


def command(recipe: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "torchrl_seqchunk.recipes", recipe, *args],
                          capture_output=True, text=True, timeout=timeout, env=ENV, cwd=ROOT)


def run_recipe(recipe: str, *args: str, timeout: float = 300) -> str:
    result = command(recipe, *args, timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def refusal(recipe: str, *args: str) -> str:
    """The error of a refused command line (status 2), its words joined by single spaces: the
    command's parse (every check it makes before any work) in this process, as wide as a
    subprocess's ``COLUMNS``."""
    with mock.patch.dict(os.environ, {"COLUMNS": ENV["COLUMNS"]}):
        stderr = refused(lambda: cli.parse([recipe, *args]))
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", stderr).split())


def flags(help_text: str) -> list[str]:
    """The flags a --help lists (the first spelling of each, -h left out)."""
    return re.findall(r"^│ (--[a-z0-9-]+)", help_text, flags=re.M)


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize(
    "options",
    [["--batching", "windows", "--boundary-mode", "reset_continue"], ["--batching", "streams"]],
    ids=["windows-reset_continue", "streams"],
)
def test_recurrent_ppo_writes_finite_metrics_and_curve(tmp_path, options):
    out = run_recipe("ppo", "--total-frames", "512", "--num-envs", "4",
                      "--runs-dir", str(tmp_path), "--name", "run", *options)
    rows = read_csv(tmp_path / "run" / "metrics.csv")
    # 4 envs x 32 steps = 128 frames per iteration -> 4 iterations
    assert [int(r["frames"]) for r in rows] == [128, 256, 384, 512]
    for row in rows:
        for key in ("loss_objective", "loss_critic", "return_mean"):
            assert math.isfinite(float(row[key])), (key, row)
    # CartPole pays 1 per step: a mean return is at least 1 and at most 500.
    assert all(1 <= float(r["return_mean"]) <= 500 for r in rows)
    # the policy's entropy over CartPole's 2 actions lies in (0, ln 2]
    assert all(0 < float(r["entropy"]) <= math.log(2) + 1e-6 for r in rows)
    assert (tmp_path / "run" / "learning_curve.png").stat().st_size > 1000
    assert "frames_to_450" in out


def test_recurrent_ppo_truncates_episodes_at_max_episode_steps(tmp_path):
    run_recipe("ppo", "--max-episode-steps", "5", "--total-frames", "128", "--num-envs", "2",
                "--rollout-len", "64", "--window", "64", "--stride", "64", "--runs-dir", str(tmp_path),
                "--name", "run")
    (row,) = read_csv(tmp_path / "run" / "metrics.csv")
    # CartPole pays 1 per step, so no episode returns more than 5; each env ends at least 12 in 64 steps
    assert float(row["return_mean"]) <= 5 and int(row["episodes"]) >= 2 * (64 // 5)
    assert "--max-episode-steps must be >= 0" in refusal("ppo", "--max-episode-steps", "-1")


def test_recurrent_ppo_keeps_a_finished_run_unless_asked(tmp_path):
    args = ("--total-frames", "128", "--num-envs", "2", "--rollout-len", "64", "--window", "64",
            "--stride", "64", "--runs-dir", str(tmp_path), "--name", "run")
    run_recipe("ppo", *args)
    first = (tmp_path / "run" / "metrics.csv").read_text()
    assert "--overwrite" in refusal("ppo", *args)
    assert (tmp_path / "run" / "metrics.csv").read_text() == first
    run_recipe("ppo", *args, "--overwrite", "--seed", "1")
    assert (tmp_path / "run" / "metrics.csv").read_text() != first


def test_recurrent_ppo_on_another_task_has_no_cartpole_target(tmp_path):
    out = run_recipe("ppo", "--env", "Pendulum-v1", "--total-frames", "128", "--num-envs", "2",
                      "--rollout-len", "64", "--window", "64", "--stride", "64",
                      "--runs-dir", str(tmp_path), "--name", "pendulum")
    assert "frames_to_" not in out and "final_return" in out


def test_recurrent_ppo_on_multi_discrete_actions_has_a_deterministic_action(tmp_path, monkeypatch):
    # BattleshipEasy acts with MultiDiscrete([8, 8]): k = 2 one-hot categoricals. The
    # collector queries the policy once in TorchRL's deterministic mode when it starts;
    # tensordict warns if the distribution has no deterministic_sample.
    monkeypatch.setenv("PYTHONWARNINGS", "error:deterministic_sample")
    run_recipe("ppo", "--env", "popgym:popgym-BattleshipEasy-v0", "--total-frames", "64",
                "--num-envs", "2", "--keep", "all", "--runs-dir", str(tmp_path), "--name", "battleship")
    from torchrl_seqchunk.recipes.common.agent import IndependentOneHotCategorical

    logits = torch.tensor([[[2.0, 0.5, 1.0], [0.0, 0.0, 3.0]]])  # [1, k=2, n=3]
    expected = torch.tensor([[[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]])  # the argmax of each row, by hand
    assert torch.equal(IndependentOneHotCategorical(logits).deterministic_sample, expected)


def test_recurrent_ppo_help_gives_every_default_and_refuses_a_mode_it_would_ignore():
    out = run_recipe("ppo", "--help")
    assert "(default: 100000)" in out and "(default: reset_continue)" in out
    assert out.count("(default:") == len(flags(out))  # every flag says its default
    assert "windows only" in refusal("ppo", "--batching", "streams", "--boundary-mode", "mask")


def test_stream_world_model_writes_finite_losses_and_plot(tmp_path):
    out = run_recipe("world-model", "--total-frames", "600", "--train-steps", "3",
                      "--num-streams", "4", "--seq-len", "16", "--hidden", "32",
                      "--runs-dir", str(tmp_path), "--name", "wm")
    rows = read_csv(tmp_path / "wm" / "metrics.csv")
    assert [int(r["step"]) for r in rows] == [0, 1, 2]
    for row in rows:
        for key in ("loss_carry", "loss_reset_at_chunk_start"):
            # pixel BCE of a fresh model starts near ln 2 and stays positive
            assert 0 < float(row[key]) < 5, (key, row)
    by_position = read_csv(tmp_path / "wm" / "loss_by_position.csv")
    assert [int(r["t"]) for r in by_position] == list(range(16))
    assert all(math.isfinite(float(v)) for r in by_position for v in r.values())
    assert (tmp_path / "wm" / "loss_by_position.png").stat().st_size > 1000
    assert "trainer waited" in out


def test_stream_world_model_refuses_what_it_cannot_run():
    pytest.importorskip("ale_py")
    assert "--env must be an Atari game (ALE/..." in refusal("world-model", "--env", "CartPole-v1")
    assert "--env ALE/NoSuchGame-v5" in refusal("world-model", "--env", "ALE/NoSuchGame-v5")
    assert "--seed must be" in refusal("world-model", "--seed", str(2**64))
    from torchrl_seqchunk.recipes import world_model

    cfg = world_model.Config(total_frames=5, runs_dir="/nonexistent-never-written")
    assert "no episode of ALE/Breakout-v5 ended within --total-frames 5" in " ".join(refused(
        lambda: world_model.train(cfg)).split())


@pytest.mark.distributed
def test_distributed_ppo_on_two_learners_and_three_workers(tmp_path):
    out = run_recipe("distributed-ppo", "--learners", "2", "--workers", "3", "--total-frames", "768",
                      "--num-envs", "2", "--epochs", "2", "--no-progress",
                      "--runs-dir", str(tmp_path), "--name", "run")
    rows = read_csv(tmp_path / "run" / "metrics.csv")
    # 3 workers x 2 envs x 32 steps = 192 frames per iteration, all ranks together -> 4 iterations
    assert [int(r["frames"]) for r in rows] == [192, 384, 576, 768]
    for row in rows:
        for key in ("loss_objective", "loss_critic", "return_mean"):
            assert math.isfinite(float(row[key])), (key, row)
    assert all(1 <= float(r["return_mean"]) <= 500 for r in rows)
    assert (tmp_path / "run" / "learning_curve.png").stat().st_size > 1000
    assert "frames_to_450" in out
    assert "every learner needs an env worker" in refusal("distributed-ppo", "--learners", "2", "--workers", "1")


def test_a_seeded_env_factory_seeds_the_worker_generator_the_actions_come_from():
    from torchrl_seqchunk.recipes.common.envs import seeded

    torch.manual_seed(0)
    drawn = seeded(5, lambda: torch.rand(3))  # a Ray worker's env factory, then its first draw
    torch.manual_seed(5)
    assert drawn.equal(torch.rand(3)) and not seeded(6, lambda: torch.rand(3)).equal(drawn)


def test_distributed_ppo_refuses_a_ray_address_without_the_ray_engine():
    for address in ("auto", ""):  # "" is the default, given: still an option the run would ignore
        message = refusal("distributed-ppo", "--address", address)
        assert "--address applies to --engine ray only (it names the Ray cluster to join)" in message


def test_distributed_ppo_config_built_in_code_refuses_what_it_would_ignore():
    from torchrl_seqchunk.recipes import distributed_ppo

    for field, value, flag in (("window", 64, "--window"), ("boundary_mode", "mask", "--boundary-mode"),
                               ("obs_norm_until", 0.4, "--obs-norm-until")):
        with pytest.raises(ValueError, match=f"^{flag} does not apply here"):
            distributed_ppo.Config(**{field: value}).check()
    distributed_ppo.Config().check()


def test_reverse_curriculum_refuses_the_curriculums_options_without_it():
    for name, value in (("--spread", "8"), ("--nudge", "4"), ("--move-threshold", "0.1"), ("--margin", "3")):
        message = refusal("curriculum", "--no-curriculum", name, value)
        assert f"{name} applies to --curriculum only (the curriculum's ResetManager" in message


def test_reverse_curriculum_refuses_the_main_jobs_env_options_even_at_their_defaults():
    for name, value in (("--keep", "auto"), ("--keep", "0"), ("--max-episode-steps", "0"), ("--target-return", "-100")):
        message = refusal("curriculum", name, value)
        assert f"{name} does not apply here (the demo is replayed in the env as registered" in message


def test_distributed_ppo_help_offers_no_windows_only_flag():
    out = run_recipe("distributed-ppo", "--help")
    assert {"--learners", "--seq-len", "--num-streams"} <= set(flags(out))
    assert not {"--boundary-mode", "--window", "--stride", "--minibatches"} & set(flags(out))
    assert out.count("(default:") == len(flags(out))  # every flag says its default


@pytest.mark.slow
def test_recurrent_ppo_reaches_the_learning_goal_and_stays(tmp_path):
    """Default task and options, seed 0: mean return >= 450 within the default 100k frames,
    and still >= 450 over the last 20 episodes when the run ends."""
    out = run_recipe("ppo", "--seed", "0", "--runs-dir", str(tmp_path), "--name", "goal",
                      timeout=30 * 60)
    rows = read_csv(tmp_path / "goal" / "metrics.csv")
    reached = [int(r["frames"]) for r in rows if float(r["return_mean"]) >= 450]
    assert reached and reached[0] <= 100_000, out[-2000:]
    assert float(rows[-1]["return_mean"]) >= 450, out[-2000:]


def finished_run(folder: Path) -> dict[str, bytes]:
    """A run folder as a finished run leaves it: metrics.csv with a row, and the curve."""
    folder.mkdir(parents=True)
    (folder / "metrics.csv").write_text("frames,wall_s,episodes,return_mean\n128,1.0,5,19.2\n")
    (folder / "learning_curve.png").write_bytes(b"\x89PNG curve")
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def test_a_refused_overwrite_leaves_the_finished_run_as_it_was(tmp_path):
    kept = finished_run(tmp_path / "run")
    message = refusal("ppo", "--overwrite", "--window", "64", "--rollout-len", "16",
                      "--runs-dir", str(tmp_path), "--name", "run")
    assert "--window 64 is longer than --rollout-len 16" in message
    assert {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir()} == kept


@pytest.mark.parametrize("bad, message", [
    (["--env", "NoSuchEnv-v0"], "--env NoSuchEnv-v0: Environment `NoSuchEnv` doesn't exist"),
    (["--keep", "0,9"], "--keep 0,9: keep=[0, 9] is out of range for an observation of size 4"),
    (["--total-frames", "0"], "--total-frames must be >= 1"),
])
def test_a_failed_start_writes_nothing(tmp_path, bad, message):
    assert message in refusal("ppo", *bad, "--runs-dir", str(tmp_path), "--name", "run")
    assert not (tmp_path / "run").exists()


def test_a_run_that_produced_nothing_does_not_block_the_corrected_rerun(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.csv").write_text("")  # what a failed start used to leave
    run_recipe("ppo", "--total-frames", "64", "--num-envs", "2", "--runs-dir", str(tmp_path),
                "--name", "run", "--no-progress")
    assert [int(r["frames"]) for r in read_csv(tmp_path / "run" / "metrics.csv")] == [64]


def test_the_example_scripts_are_the_commands():
    """``python examples/<script>.py`` (the README's and the guides' spelling) runs ``seqchunk <recipe>``."""
    scripts = {"recurrent_ppo.py": "ppo", "recurrent_dqn.py": "dqn", "reverse_curriculum.py": "curriculum",
               "stream_world_model.py": "world-model", "distributed_ppo.py": "distributed-ppo"}
    probe = ("import runpy, sys\n"
             "for script in sys.argv[1:]:\n"
             "    sys.argv = [script, '--help']\n"
             "    try:\n"
             "        runpy.run_path(script, run_name='__main__')\n"
             "    except SystemExit as exit_:\n"
             "        assert exit_.code == 0, (script, exit_.code)\n")
    result = subprocess.run([sys.executable, "-c", probe, *(str(ROOT / "examples" / s) for s in scripts)],
                            capture_output=True, text=True, timeout=300, env=ENV, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert [line.split()[1:3] for line in result.stdout.splitlines() if line.startswith("usage:")] == [
        ["seqchunk", recipe] for recipe in scripts.values()]
