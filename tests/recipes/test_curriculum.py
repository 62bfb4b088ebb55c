"""The curriculum recipe (seqchunk curriculum): every option is checked before any output; a short
run moves the maximum back."""
import csv
from pathlib import Path

import pytest

from torchrl_seqchunk.recipes import cli
from torchrl_seqchunk.recipes import curriculum as job

DATA = Path(job.__file__).parent / "data"  # the demos shipped with the package
pytest.importorskip("minigrid")


def parse_args(argv: list[str]) -> job.Config:
    """The command line ``seqchunk curriculum <argv>``, checked."""
    return cli.parse(["curriculum", *argv])


@pytest.mark.parametrize("argv, message", [
    (["--max-grad-norm", "-1"], "--max-grad-norm must be > 0.0"),
    (["--clip-epsilon", "-0.2"], "--clip-epsilon must be in (0.0, 1.0]"),
    (["--gamma", "1.5"], "--gamma must be in [0.0, 1.0]"),
    (["--total-frames", "0"], "--total-frames must be >= 1"),
    (["--num-envs", "0"], "--num-envs must be >= 1"),
    (["--epochs", "0"], "--epochs must be >= 1"),
    (["--eval-episodes", "0"], "--eval-episodes must be >= 1"),
    (["--move-threshold", "1.5"], "--move-threshold must be in (0.0, 1.0]"),
    (["--margin", "-3"], "--margin must be >= 0.0"),
    (["--spread", "-1"], "--spread must be >= 0"),
    (["--spread", "100000"], "--spread 100000 (the window), --move-threshold 0.1, --num-envs 16: move_threshold"),
    (["--keep", "0"], "--keep does not apply here"),
    (["--env", "NoSuchEnv-v0"], "--env NoSuchEnv-v0: "),
    (["--env", "CartPole-v1"], "--env CartPole-v1 ships no demo"),
    (["--env", "CartPole-v1", "--demo", str(DATA / "mountain_car_demo.npz")], "recorded in MountainCar-v0"),
    (["--demo", "/no/such/demo.npz"], "--demo: cannot read demo file"),
    (["--no-curriculum", "--demo", str(DATA / "mountain_car_demo.npz")], "--demo applies to --curriculum only"),
    (["--env", "Acrobot-v1", "--stop-at-target"], "has no target to stop at; this recipe's targets are its tasks'"),
])
def test_bad_options_are_refused_by_name_before_any_output(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        parse_args([*argv, "--runs-dir", str(tmp_path / "runs")])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_defaults_resolve_per_task():
    cfg = parse_args(["--env", "MiniGrid-DoorKey-5x5-v0"])
    assert cfg.demo_path.endswith("minigrid_doorkey_demo.npz") and cfg.success_margin == pytest.approx(0.9 * 20 / 250)
    assert cfg.name == "MiniGrid-DoorKey-5x5-v0_curriculum_seed0"
    cfg = parse_args(["--env", "MiniGrid-DoorKey-8x8-v0"])
    assert cfg.demo_path.endswith("minigrid_doorkey8_demo.npz") and cfg.success_margin == pytest.approx(0.9 * 20 / 640)
    assert parse_args(["--no-curriculum"]).name == "MountainCar-v0_scratch_seed0"
    assert parse_args(["--no-curriculum", "--env", "Acrobot-v1"]).target is None  # PPO from the reset needs no demo
    assert parse_args(["--env", "MiniGrid-DoorKey-5x5-v0", "--stop-at-target"]).target == 0.9  # a goal rate


@pytest.mark.slow
def test_mountain_car_run_moves_the_maximum_back(tmp_path):
    rows = job.train(parse_args(["--total-frames", "2048", "--eval-every", "2", "--eval-episodes", "2",
                                 "--runs-dir", str(tmp_path), "--no-progress"])).rows
    written = list(csv.DictReader(open(tmp_path / "MountainCar-v0_curriculum_seed0" / "metrics.csv")))
    assert len(rows) == len(written) == 4
    # from the demo's last steps the car reaches the flag at once: the maximum leaves 121
    assert float(written[-1]["max_starting_point"]) < 121  # the report writes its columns as floats
    assert all(-200 <= float(r["eval_return"]) <= -1 for r in written[1::2])


@pytest.mark.parametrize("flags", [["--obs-norm", "--reward-norm"], ["--no-obs-norm", "--no-reward-norm"]])
def test_norm_flags_and_the_evaluation_reads_a_frozen_clipped_copy(tmp_path, monkeypatch, flags):
    seen, built = [], []
    real_evaluate, real_make_env = job.evaluate, job.make_env

    def spy_evaluate(cfg, actor, rnns, obs_norm, index):
        seen.append(obs_norm)
        return real_evaluate(cfg, actor, rnns, obs_norm, index)

    def spy_make_env(*args, transforms=()):
        built.append([type(t).__name__ for t in transforms])
        return real_make_env(*args, transforms=transforms)

    monkeypatch.setattr(job, "evaluate", spy_evaluate)
    monkeypatch.setattr(job, "make_env", spy_make_env)
    rows = job.train(parse_args(["--env", "MiniGrid-DoorKey-5x5-v0", "--total-frames", "128", "--num-envs", "4",
                                 "--eval-every", "1", "--eval-episodes", "1", "--eval-sample", *flags,
                                 "--runs-dir", str(tmp_path), "--no-progress"])).rows
    assert len(seen) == len(rows) == 1 and 0.0 <= rows[0]["eval_success"] <= 1.0
    if flags[0] == "--no-obs-norm":
        assert seen[0] is None and built[0] == []  # the training env: neither transform
    else:  # statistics of the 128 training frames (one rollout of 4 x 32) and the first reset, clipped, frozen
        assert built[0] == ["RunningObservationNorm", "ReturnScaledReward"]
        assert seen[0].frozen and seen[0].clip == 10.0 and seen[0].count.item() >= 128 + 4
