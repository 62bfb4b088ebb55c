"""The recipes' toolkit (torchrl_seqchunk/recipes/common): option checks, the run folder and the report, by hand."""
import dataclasses
import importlib.util
import math
import os

import pytest
import torch

from torchrl_seqchunk.recipes.common import options
from torchrl_seqchunk.recipes.common.config import RENAMED, Config, uncovered_steps
from torchrl_seqchunk.recipes.common.ppo import standardized
from torchrl_seqchunk.recipes.common.report import Report, check_run_folder, finished

NO_CUDA = not torch.cuda.is_available()


@pytest.mark.parametrize("rollout_len, window, stride, lost", [
    (32, 32, 32, 0),  # the defaults: one window per row
    (40, 32, 32, 8),  # one window at 0: steps 32..39 in none
    (40, 32, 8, 0),   # windows at 0 and 8 end at the rollout's end
    (32, 8, 24, 16),  # windows at 0 and 24: steps 8..23 in none
    (10, 4, 3, 0),    # windows at 0, 3, 6 cover 0..9
    (10, 4, 4, 2),    # windows at 0, 4: steps 8, 9 in none
])
def test_uncovered_steps_by_hand(rollout_len, window, stride, lost):
    assert uncovered_steps(rollout_len, window, stride) == lost


@pytest.mark.parametrize("options_, message", [
    ({"max_grad_norm": -1.0}, "--max-grad-norm must be > 0.0"),
    ({"clip_epsilon": -0.2}, "--clip-epsilon must be in (0.0, 1.0]"),
    ({"return_window": 0}, "--return-window must be >= 1"),
    ({"total_frames": 0}, "--total-frames must be >= 1"),
    ({"total_frames": -5}, "--total-frames must be >= 1"),
    ({"epochs": 0}, "--epochs must be >= 1"),
    ({"num_envs": 0}, "--num-envs must be >= 1"),
    ({"rollout_len": 0}, "--rollout-len must be >= 1"),
    ({"gamma": 1.5}, "--gamma must be in [0.0, 1.0]"),
    ({"lr": 0.0}, "--lr must be > 0.0"),
    ({"advantage_std_floor": -0.1}, "--advantage-std-floor must be >= 0.0"),
    ({"obs_norm_until": 0.0}, "--obs-norm-until must be in (0.0, 1.0]"),
    ({"obs_norm_until": 1.5}, "--obs-norm-until must be in (0.0, 1.0]"),
    ({"obs_norm_until": 0.5, "obs_norm": False}, "--obs-norm-until applies to --obs-norm only"),
    ({"batching": "streams", "boundary_mode": "mask"}, "--boundary-mode applies to --batching windows only"),
    ({"batching": "streams", "window": 16}, "--window applies to --batching windows only"),
    ({"batching": "streams", "minibatches": 2}, "--minibatches applies to --batching windows only"),
    ({"seq_len": 16}, "--seq-len applies to --batching streams only: drop --seq-len or change --batching."),
    ({"num_streams": 4}, "--num-streams applies to --batching streams only"),
    ({"window": 64, "rollout_len": 16}, "--window 64 is longer than --rollout-len 16"),
    ({"rollout_len": 40}, "leave 8 of every 40 steps per env in no window"),
    ({"minibatches": 9}, "--minibatches 9 is more than the 8 windows per rollout"),
    ({"keep": "0,x"}, "--keep must be comma-separated integers"),
    ({"target_return": "high"}, "--target-return must be a number or 'auto'"),
    ({"env": "Acrobot-v1", "stop_at_target": True}, "--stop-at-target: --env Acrobot-v1 has no target to stop at"),
    ({"env": "NoSuchEnv-v0"}, "--env NoSuchEnv-v0: Environment `NoSuchEnv` doesn't exist"),
    ({"batching": "streams", "seq_len": 0}, "--seq-len must be >= 1"),
    ({"batching": "streams", "num_streams": 0}, "--num-streams must be >= 1"),
    ({"seed": 2**64}, "--seed must be in [0, 18446744073709551615]"),  # torch.manual_seed overflowed
    ({"threads": 10**5}, "--threads must be in [1, "),  # torch segfaulted
    ({"num_envs": 1, "rollout_len": 1, "window": 1, "stride": 1}, "is one step per rollout"),  # a NaN std
    pytest.param({"device": "cuda"}, "this machine has no CUDA device", marks=pytest.mark.skipif(
        not NO_CUDA, reason="CUDA is there")),
    pytest.param({"env": "LunarLander-v3"}, "--env LunarLander-v3: Box2D is not installed",  # at parse, not at make
                 marks=pytest.mark.skipif(importlib.util.find_spec("Box2D") is not None, reason="Box2D is there")),
])
def test_every_option_is_checked_with_a_message_naming_it(options_, message):
    with pytest.raises(ValueError) as err:
        Config(**options_).check()
    assert message in str(err.value)


def test_standardized_advantages_by_hand():
    advantage = torch.tensor([1.0, 3.0])  # mean 2, std sqrt(2) (Bessel's correction)
    torch.testing.assert_close(standardized(advantage), torch.tensor([-1.0, 1.0]) / math.sqrt(2))
    torch.testing.assert_close(standardized(advantage, floor=1.0), torch.tensor([-1.0, 1.0]) / math.sqrt(2))
    # a std below the floor: divided by the floor, so near-zero advantages stay small
    torch.testing.assert_close(standardized(advantage, floor=2.0), torch.tensor([-0.5, 0.5]))


def test_the_defaults_and_the_documented_variants_pass():
    for cfg in (Config(), Config(batching="streams"), Config(rollout_len=40, stride=8), Config(env="Pendulum-v1"),
                Config(stop_at_target=True), Config(env="Acrobot-v1", target_return="-100", stop_at_target=True),
                Config(env="gymnasium:CartPole-v1", stop_at_target=True)):  # a module-qualified id keeps its target
        cfg.check()


@pytest.mark.parametrize("argv, refused", [
    (["--batching", "streams", "--window", "32"], "--window"),  # the default value, given: the run would ignore it
    (["--batching", "streams", "--boundary-mode=reset_continue"], "--boundary-mode"),
    (["--seq_len", "32"], "--seq-len"),  # windows batching: the stream options do not apply
    (["--no-obs-norm", "--obs-norm-until", "0.4"], "--obs-norm-until"),
])
def test_an_option_the_run_would_ignore_is_refused_even_at_its_default(argv, refused, capsys):
    with pytest.raises(SystemExit) as err:
        options.cli(Config, "", argv)
    assert err.value.code == 2 and f"{refused} applies to" in capsys.readouterr().err
    # the same values left out run
    options.cli(Config, "", [arg for arg in argv if arg.startswith(("--batching", "streams", "--no-obs-norm"))])


def test_given_fields_reads_every_spelling_of_a_flag():
    argv = ["--seq-len", "16", "--num_streams=4", "--no-obs-norm", "--anneal-lr", "streams", "--nope", "-h"]
    assert options.given_fields(Config, argv) == {"seq_len", "num_streams", "obs_norm", "anneal_lr"}


def test_the_old_chunk_len_flag_still_works_with_a_warning():
    with pytest.warns(FutureWarning, match="--chunk-len is deprecated; use --seq-len"):
        cfg = options.cli(Config, "", ["--batching", "streams", "--chunk-len", "16"], RENAMED)
    assert cfg.seq_len == 16
    with pytest.warns(FutureWarning):
        assert options.cli(Config, "", ["--batching", "streams", "--chunk-len=8"], RENAMED).seq_len == 8


def test_a_refused_command_line_exits_with_status_2(capsys):
    with pytest.raises(SystemExit) as exit_:
        options.cli(Config, "", ["--epochs", "0"])
    assert exit_.value.code == 2 and "error: --epochs must be >= 1" in capsys.readouterr().err


def test_list_and_name_options():
    assert options.int_list("seeds", "0,1,2", low=0) == [0, 1, 2]
    with pytest.raises(ValueError, match="--seeds lists a value twice"):
        options.int_list("seeds", "1,1")
    with pytest.raises(ValueError, match="--seeds must be >= 0"):
        options.int_list("seeds", "0,-1", low=0)
    with pytest.raises(ValueError, match=r"--modes: unknown \['lstm'\]"):
        options.names("modes", "mask,lstm", ("mask", "streams"))


def test_a_run_counts_as_finished_once_its_metrics_hold_a_row(tmp_path):
    run = tmp_path / "run"
    assert not finished(run)
    run.mkdir()
    (run / "metrics.csv").write_text("")  # what a failed start used to leave
    assert not finished(run) and check_run_folder(tmp_path, "run", overwrite=False) == run
    (run / "metrics.csv").write_text("frames,return_mean\n")
    assert not finished(run)
    (run / "metrics.csv").write_text("frames,return_mean\n128,9.5\n")
    assert finished(run)
    with pytest.raises(ValueError, match="--overwrite"):
        check_run_folder(tmp_path, "run", overwrite=False)
    assert check_run_folder(tmp_path, "run", overwrite=True) == run
    (tmp_path / "file").write_text("")
    for runs_dir, name in ((tmp_path / "file", "run"), (tmp_path, "file"), (tmp_path / "file" / "sub", "run")):
        with pytest.raises(ValueError, match="is a file"):  # mkdir would fail mid-start
            check_run_folder(runs_dir, name, overwrite=True)
    with pytest.raises(ValueError, match="File name too long: .*; pass another --name"):
        check_run_folder(tmp_path, "x" * 300, overwrite=False)
    (tmp_path / "binary").mkdir()
    (tmp_path / "binary" / "metrics.csv").write_bytes(b"\xff\xfe\n\xff")
    with pytest.raises(ValueError, match="binary/metrics.csv: 'utf-8' codec can't decode"):
        check_run_folder(tmp_path, "binary", overwrite=False)


def test_the_report_writes_nothing_before_its_first_row(tmp_path, capsys):
    old = tmp_path / "run"
    old.mkdir()
    (old / "metrics.csv").write_text("frames,return_mean\n128,9.5\n")
    (old / "learning_curve.png").write_bytes(b"old")
    report = Report(old, planned_frames=256, target=10.0, return_window=2, progress=False)
    assert (old / "metrics.csv").read_text() == "frames,return_mean\n128,9.5\n"  # untouched so far
    report.add(128, [], {"loss": torch.tensor(0.5)})
    row = report.add(128, [9.0, 12.0], {"loss": 0.25})
    report.close("run")
    lines = (old / "metrics.csv").read_text().splitlines()
    assert lines[0] == "frames,wall_s,episodes,return_mean,loss" and len(lines) == 3
    assert math.isnan(report.rows[0]["return_mean"]) and row["return_mean"] == 10.5 and row["episodes"] == 2
    assert report.frames_to_target == 256  # two episodes (the window) with a mean of 10.5 >= 10
    assert (old / "learning_curve.png").read_bytes()[:4] == b"\x89PNG"
    printed = capsys.readouterr().out
    assert "frames_to_10: 256 best_return: 10.5 final_return: 10.5 wall_s" in printed  # no evaluation columns
    evaluated = Report(tmp_path / "evaluated", planned_frames=768, progress=False)
    for frames, (eval_frames, eval_return) in zip((256, 512, 768), ((256, -900.0), (256, -900.0), (768, -300.0))):
        evaluated.add(frames, [-1000.0], {"eval_frames": eval_frames, "eval_return": eval_return})
    evaluated.close()
    assert "final_return: -1000.0 final_eval_return: -300.0 " in capsys.readouterr().out  # the last of 2 points
    empty = Report(tmp_path / "never", planned_frames=1, progress=False)
    empty.close()
    assert not (tmp_path / "never").exists()


def test_a_run_folder_another_live_run_writes_is_refused_and_a_dead_runs_claim_taken_over(tmp_path, capsys):
    import subprocess
    import sys

    run = tmp_path / "run"
    run.mkdir()
    (run / "curriculum.png").write_bytes(b"old")
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (run / ".running").write_text(str(other.pid))
        with pytest.raises(SystemExit) as refused:
            Report(run, planned_frames=1, progress=False)
        assert refused.value.code == 2
        assert f"is being written by another run (process {other.pid})" in capsys.readouterr().err
    finally:
        other.kill()
        other.wait()
    report = Report(run, planned_frames=1, progress=False, outputs=("curriculum.png",))  # that process ended
    assert (run / ".running").read_text() == str(os.getpid())
    report.add(1, [], {})
    assert not (run / "curriculum.png").exists()  # an earlier run's outputs go with its metrics.csv
    report.close()
    assert not (run / ".running").exists() and (run / "metrics.csv").exists()


def test_a_run_holds_its_claim_until_its_files_are_written_and_releases_it_if_drawing_fails(tmp_path, monkeypatch):
    from torchrl_seqchunk.recipes.common import report as report_module

    def draw(rows, path, **kwargs):  # the claim is still held while the curve is drawn
        assert (path.parent / ".running").read_text() == str(os.getpid())
        raise RuntimeError("no display")

    monkeypatch.setattr(report_module, "plot_curve", draw)
    run = Report(tmp_path / "run", planned_frames=1, progress=False)
    run.add(1, [], {})
    with pytest.raises(RuntimeError, match="no display"):
        run.close()
    assert not (tmp_path / "run" / ".running").exists() and (tmp_path / "run" / "metrics.csv").exists()


@pytest.mark.parametrize("batching, floor, loss_standardizes", [
    ("windows", 0.2, False),  # the default: add_advantages standardizes each rollout by max(std, 0.2)
    ("windows", 0.0, True),   # no floor: the loss standardizes each batch, as ClipPPOLoss does
    ("streams", 0.2, False),  # streams always standardize per rollout (padded slots stay out of the loss)
    ("streams", 0.0, False),
])
def test_advantages_are_standardized_once(batching, floor, loss_standardizes):
    from torchrl_seqchunk.recipes.common.agent import make_agent
    from torchrl_seqchunk.recipes.common.batching import make_batching
    from torchrl_seqchunk.recipes.common.envs import make_env

    cfg = Config(batching=batching, advantage_std_floor=floor)
    env = make_env(cfg)
    actor, critic, rnns = make_agent(cfg, env, carry=batching == "streams")
    made = make_batching(cfg, rnns, cfg.num_envs * cfg.rollout_len)
    assert made.make_loss(actor, critic).normalize_advantage is loss_standardizes
    env.close()


@pytest.mark.parametrize("env_batching", ["vector", "serial"])
def test_the_observation_statistics_freeze_at_obs_norm_until(env_batching):
    from tensordict.nn import TensorDictSequential

    from torchrl_seqchunk.recipes.common.agent import make_agent
    from torchrl_seqchunk.recipes.common.envs import make_acting_env, make_collector, make_env, obs_norm_of
    from torchrl_seqchunk.recipes.common.ppo import anneal

    cfg = Config(obs_norm_until=0.5, env_batching=env_batching, num_envs=2, rollout_len=4)
    actor, critic, rnns = make_agent(cfg, make_env(cfg), carry=False)
    env = make_acting_env(cfg, rnns, 0)
    stats = obs_norm_of(env)
    collector = make_collector(cfg, env, TensorDictSequential(actor, critic), 8, 32)
    loss = torch.nn.Module()  # anneal_clip off: the loss module is not read
    optim = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=cfg.lr)
    counts = []
    for done, _ in enumerate(collector, 1):
        counts.append(float(stats.count))
        anneal(dataclasses.replace(cfg, anneal_clip=False), optim, loss, 1 - done * 8 / 32, stats)
        assert stats.frozen is (done * 8 / 32 >= 0.5)
    # merged while the run's first half was collected, nothing after
    assert counts[0] < counts[1] == counts[2] == counts[3]
    assert optim.param_groups[0]["lr"] == 0.0
    collector.shutdown()
    never = obs_norm_of(make_env(cfg))
    anneal(dataclasses.replace(cfg, anneal_clip=False, obs_norm_until=1.0), optim, loss, 0.0, never)
    assert not never.frozen  # 1: never frozen, the run's end too


@pytest.mark.parametrize("batching", ["windows", "streams"])
def test_update_logs_mean_losses_and_the_last_steps_diagnostics(batching):
    """update's LOGGED against the same steps taken one by one with diagnostics on throughout: the
    losses' means over the steps, entropy / clip_fraction / kl_approx of the last step; the
    windows' RecurrentPPOLoss computes diagnostics for that step only."""
    import copy

    from tensordict.nn import TensorDictSequential

    from torchrl_seqchunk.recipes.common.agent import make_agent
    from torchrl_seqchunk.recipes.common.batching import make_batching
    from torchrl_seqchunk.recipes.common.envs import make_acting_env, make_collector, make_env
    from torchrl_seqchunk.recipes.common.ppo import LOGGED, add_advantages, update

    torch.manual_seed(0)
    cfg = Config(batching=batching, num_envs=4, rollout_len=32, epochs=2, minibatches=2, entropy_coeff=0.01)
    actor, critic, rnns = make_agent(cfg, make_env(cfg), carry=batching == "streams")
    collector = make_collector(cfg, make_acting_env(cfg, rnns, 0), TensorDictSequential(actor, critic), 128, 128)
    rollout = add_advantages(cfg, critic, next(iter(collector)), standardize=True)
    collector.shutdown()
    batching_ = make_batching(cfg, rnns, 128)
    loss = batching_.make_loss(actor, critic)
    reference = copy.deepcopy(loss)
    optim = torch.optim.Adam(loss.parameters(), lr=1e-3)
    ref_optim = torch.optim.Adam(reference.parameters(), lr=1e-3)
    batches = [b.clone() for b in batching_.batches(rollout)]
    seen = []
    if batching == "windows":
        loss.forward = (lambda forward: lambda td: seen.append(loss.diagnostics) or forward(td))(loss.forward)
    logged = update(loss, optim, batches, weight=batching_.weight, max_grad_norm=cfg.max_grad_norm)
    rows = []
    for batch in batches:  # the reference: diagnostics on at every step
        out = reference(batch)
        total = (out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]) * batching_.weight(batch)
        ref_optim.zero_grad()
        total.backward()
        torch.nn.utils.clip_grad_norm_(reference.parameters(), cfg.max_grad_norm)
        ref_optim.step()
        rows.append({k: out[k].item() for k in LOGGED})
    assert len(rows) == (4 if batching == "windows" else len(rows)) and len(rows) > 1
    for name in ("loss_objective", "loss_critic"):
        assert logged[name] == pytest.approx(sum(r[name] for r in rows) / len(rows), rel=1e-5, abs=1e-7)
    for name in ("entropy", "clip_fraction", "kl_approx"):
        assert logged[name] == pytest.approx(rows[-1][name], rel=1e-5, abs=1e-7)
    assert rows[-1]["kl_approx"] != pytest.approx(rows[0]["kl_approx"])  # the last step, not the first
    if batching == "windows":
        assert seen == [False] * (len(rows) - 1) + [True]


def test_update_leaves_the_losss_diagnostics_switch_as_it_was_and_refuses_no_batch():
    """The switch restored after the update, also when a step fails; no batch: a ValueError."""
    import types

    from torchrl_seqchunk.recipes.common.ppo import update

    class Failing(torch.nn.Module):
        diagnostics = False

        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(()))
            self.calls = []

        def forward(self, batch):
            self.calls.append(self.diagnostics)
            if batch == "bad":
                raise RuntimeError("a step failed")
            zero = self.w * 0
            return {"loss_objective": zero, "loss_critic": zero, "loss_entropy": zero, "entropy": zero,
                    "clip_fraction": zero, "kl_approx": zero}

    loss = Failing()
    optim = torch.optim.SGD(loss.parameters(), lr=0.1)
    step = types.SimpleNamespace(weight=lambda batch: 1.0)
    logged = update(loss, optim, ["ok", "ok"], weight=step.weight, max_grad_norm=1.0)
    assert loss.calls == [False, True] and loss.diagnostics is False and logged["clip_fraction"] == 0.0
    with pytest.raises(RuntimeError, match="a step failed"):
        update(loss, optim, ["bad", "ok"], weight=step.weight, max_grad_norm=1.0)
    assert loss.diagnostics is False
    with pytest.raises(ValueError, match="update got no batch"):
        update(loss, optim, [], weight=step.weight, max_grad_norm=1.0)
