"""The recurrent DQN recipe (seqchunk dqn): a tiny run of every replay, and the reset at a window's first step."""
import pytest
import torch
from tensordict import TensorDict
from torch import nn

from torchrl_seqchunk.recipes import cli, dqn, dqn_replay
from torchrl_seqchunk.recipes.common import envs

RECIPES = [("streams", "stored"), ("sequence", "stored"), ("slice", "stored"), ("slice", "zero")]
TINY = dict(total_frames=256, learning_starts=96, num_envs=2, collect_len=8, batch_rows=2, seq_len=4,
            hidden=8, buffer_size=512, replay_ratio=2.0, progress=False)


@pytest.mark.parametrize("replay,initial_state,overlap", [(*recipe, 0) for recipe in RECIPES] + [("streams", "stored", 2)])
def test_tiny_run_of_every_recipe(replay, initial_state, overlap, tmp_path):
    cfg = dqn.Config(replay=replay, initial_state=initial_state, overlap=overlap, runs_dir=str(tmp_path),
                     **TINY)
    rows = dqn.train(cfg).rows
    assert rows[-1]["frames"] == 256 and rows[-1]["grad_steps"] == 44  # ratio 2 x 176 frames from the batch reaching 96, / (2 x 4)
    window = 4 + (10 if replay == "sequence" else overlap)
    # both networks unroll every row's steps, plus the chunk-end step (and, overlapping, the steps
    # before the overlap again), at least
    assert rows[-1]["recurrent_steps_per_grad_step"] >= 2 * 2 * (window + 1 + (4 - overlap if overlap else 0))
    out = tmp_path / cfg.name
    assert (out / "metrics.csv").exists() and (out / "learning_curve.png").exists()


@pytest.mark.parametrize("replay_ratio, frames", [(0.25, 1280), (0.1, 3200), (0.3, 2560)])
def test_a_run_takes_the_gradient_steps_it_plans(replay_ratio, frames, tmp_path):
    # 0.1 added ten times is 0.9999999999999999: a running credit took no step where one was due
    cfg = dqn.Config(**{**TINY, "total_frames": frames, "learning_starts": 0, "replay_ratio": replay_ratio,
                        "num_envs": 4, "collect_len": 8, "batch_rows": 4, "seq_len": 8}, runs_dir=str(tmp_path))
    assert cfg.planned_grad_steps == int(replay_ratio * frames / 32) >= 1
    assert dqn.train(cfg).rows[-1]["grad_steps"] == cfg.planned_grad_steps


def test_options_that_do_not_apply_are_refused():
    with pytest.raises(ValueError, match="--initial-state"):
        dqn.Config(replay="streams", initial_state="zero")
    with pytest.raises(ValueError, match="--burn-in"):
        dqn.Config(replay="slice", burn_in=3)
    with pytest.raises(ValueError, match="--stream-groups"):
        dqn.Config(replay="sequence", stream_groups=2)
    with pytest.raises(ValueError, match="--buffer-size"):
        dqn.Config(buffer_size=1001, num_envs=8)


@pytest.mark.parametrize("options, match", [
    # inputs a run would accept and lose: no gradient step in the whole run (44 with TINY's settings)
    (dict(total_frames=80), "no gradient step"),  # the batch reaching 96 frames never comes
    (dict(replay_ratio=0.04), "no gradient step"),  # 0.04 x 176 frames / 8 steps < 1
    (dict(buffer_size=8), "hold a collector batch"),  # 2 envs x 8 steps
    (dict(buffer_size=16, replay="sequence"), "fewer than a window of 14"),  # 8 steps per env
])
def test_settings_that_lose_the_run_are_refused(options, match):
    assert dqn.Config(**TINY).planned_grad_steps == 44  # the count the tiny run makes
    with pytest.raises(ValueError, match=match):
        dqn.Config(**{**TINY, **options})


@pytest.mark.parametrize("argv, match", [
    (["--env", "Pendulum-v1", "--keep", "all"], "one of n actions"),  # Box actions
    (["--env", "popgym:popgym-BattleshipEasy-v0"], "one of n actions"),  # MultiDiscrete actions
    (["--keep", "0,7"], "--keep 0,7"),  # CartPole has 4 entries
    # options the recipe would ignore, refused even at their default values
    (["--replay", "slice", "--burn-in", "10"], "--burn-in applies to --replay sequence only"),
    (["--stream-groups", "1", "--replay", "sequence"], "--stream-groups applies to --replay streams only"),
    (["--initial-state", "stored"], "--initial-state applies to --replay sequence / slice only"),
    (["--hard-update", "100", "--tau", "0.01"], "--tau applies to --hard-update 0 only"),
    (["--num-envs", "1", "--buffer-size", "1000", "--eps-alpha", "7"], "--eps-alpha applies to --num-envs >= 2 only"),
])
def test_command_lines_refused_before_a_run(argv, match, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.parse(["dqn", *argv, "--runs-dir", str(tmp_path)])
    assert exit_.value.code == 2 and match in capsys.readouterr().err


class Handed:
    """A buffer whose sample() hands back a fixed batch (what the recipe's sampler returns)."""

    def __init__(self, batch):
        self.batch = batch

    def sample(self):
        return self.batch.clone()


def raw_sample(replay, rows, steps, start, generator):
    """What the recipe's buffer returns: steps of two episodes per row, the second starting
    at `start`; stored memories (and flags) as the sampler hands them over."""
    is_first = torch.zeros(rows, steps, 1, dtype=torch.bool)
    is_first[:, start] = True
    done = torch.zeros_like(is_first)
    done[:, start - 1] = start > 0
    obs = torch.randn(rows, steps, 2, generator=generator)
    next_obs = torch.cat([obs[:, 1:], torch.randn(rows, 1, 2, generator=generator)], 1)
    next_obs[:, start - 1] = torch.randn(rows, 2, generator=generator) if start > 0 else next_obs[:, start - 1]
    batch = TensorDict({
        "observation": obs, ("next", "observation"): next_obs,
        ("next", "done"): done, ("next", "terminated"): done.clone(), ("next", "truncated"): done & False,
        ("next", "reward"): torch.randn(rows, steps, 1, generator=generator),
        "action": nn.functional.one_hot(torch.randint(2, (rows, steps), generator=generator), 2),
        "q_state": torch.randn(rows, steps, 1, 8, generator=generator),  # e.g. a burnt-in state
    }, batch_size=[rows, steps])
    # stream chunks carry the sampler's is_first; TorchRL's samplers hand over the env's is_init
    batch["is_first" if replay == "streams" else "is_init"] = is_first
    if replay == "sequence":
        batch["learning_mask"] = torch.arange(steps).expand(rows, steps) >= start
        batch["validity_mask"] = torch.ones(rows, steps, dtype=torch.bool)
    if replay == "slice":
        batch["collector", "mask"] = torch.ones(rows, steps, dtype=torch.bool)
    return batch if replay == "streams" else batch.reshape(-1)


@pytest.mark.parametrize("replay,initial_state", RECIPES)
def test_the_window_first_step_resets_at_an_episode_start(replay, initial_state):
    """The first step that counts (t = 0; after the burn-in for sequence) starts an episode:
    its memory must be zeros, whatever the carry, the stored state there or the burn-in
    steps of the previous episode hold (TorchRL's BurnInTransform copies the burnt-in
    state into that step)."""
    burn_in = 3 if replay == "sequence" else dqn.Config.burn_in
    cfg = dqn.Config(replay=replay, initial_state=initial_state, batch_rows=2, seq_len=5,
                     burn_in=burn_in, hidden=8, num_envs=2, n_steps=2)
    qnet, rnn, _ = dqn.make_qnet(cfg, envs.make_env(cfg))
    loss, _ = dqn.make_loss(cfg, qnet, rnn)
    start = burn_in if replay == "sequence" else 0
    g = torch.Generator().manual_seed(0)
    batch = raw_sample(replay, 2, cfg.window, start, g)
    other = batch.clone()  # the previous episode's steps and every memory changed
    other["q_state"] = torch.randn(other["q_state"].shape, generator=g) * 3
    if replay == "sequence":
        before = other.reshape(2, cfg.window)[:, :start]
        other.reshape(2, cfg.window)[:, :start] = before.apply(lambda x: torch.randn(x.shape, generator=g)
                                                               if x.is_floating_point() else x)
        other = other.reshape(2, cfg.window).reshape(-1)
    carries = [None, (torch.randn(2, 1, 8, generator=g) * 3,)]
    values = []
    for data, carry in ((batch, carries[0]), (other, carries[1])):
        loss._carries = {"online": carry, "target": carry}
        values.append(loss(dqn_replay.sample(cfg, Handed(data)))["loss"])
    torch.testing.assert_close(values[0], values[1])


def test_an_overlapping_chunk_that_starts_an_episode_resets_whatever_its_burn_in_and_carry_hold():
    """--overlap K: the chunk's first learned step (after the K steps of the previous chunk)
    starts an episode, so its memory is zeros whatever the previous episode's steps burnt in
    and the carry hold."""
    cfg = dqn.Config(batch_rows=2, seq_len=5, overlap=2, hidden=8, num_envs=2, n_steps=2)
    qnet, rnn, _ = dqn.make_qnet(cfg, envs.make_env(cfg))
    loss, _ = dqn.make_loss(cfg, qnet, rnn)
    g = torch.Generator().manual_seed(0)
    chunk = raw_sample("streams", 2, 5, 0, g)  # an episode starts at its first step
    values = []
    for previous, carry in ((raw_sample("streams", 2, 5, 2, g), None),
                            (raw_sample("streams", 2, 5, 1, g), (torch.randn(2, 1, 8, generator=g) * 3,))):
        handed = Handed(previous)
        training = dqn_replay.batches(cfg, handed)
        next(training)
        handed.batch = chunk
        batch = next(training)
        assert torch.equal(batch["observation"][:, :2], previous["observation"][:, 3:])
        loss._carries = {"online": carry, "target": carry}
        values.append(loss(batch)["loss"])
    torch.testing.assert_close(values[0], values[1])


def test_stream_chunks_are_trained_b_rows_at_a_time_in_turn_with_their_stream_ids():
    cfg = dqn.Config(batch_rows=2, stream_groups=3, seq_len=4, num_envs=2)
    chunks = [raw_sample("streams", 6, 4, 0, torch.Generator().manual_seed(k)) for k in range(2)]
    handed = Handed(chunks[0])
    training = dqn_replay.batches(cfg, handed)
    for chunk in chunks:
        handed.batch = chunk
        for group in range(3):
            batch = next(training)
            assert batch.shape == (2, 4)
            assert torch.equal(batch["stream"], torch.tensor([[2 * group] * 4, [2 * group + 1] * 4]))
            assert torch.equal(batch["observation"], chunk["observation"][2 * group: 2 * group + 2])
    loss, _ = dqn.make_loss(cfg, *dqn.make_qnet(cfg, envs.make_env(cfg))[:2])
    assert loss.stream_key == "stream"
    assert cfg.name == "CartPole-v1_dqn_streams_carry_stream-groups3_batch-rows2_seq-len4_seed0"


def test_overlapping_stream_chunks_start_with_their_streams_previous_last_steps():
    """--overlap K: each [P, T] chunk goes out as [P, K + T] (in groups of B rows), after the
    last K steps of the same streams' previous chunk; before the first chunk, K one-step
    episodes of its first step (ended, so the chunk's first step starts from zeros)."""
    cfg = dqn.Config(batch_rows=2, stream_groups=2, seq_len=4, overlap=3, num_envs=2)
    chunks = [raw_sample("streams", 4, 4, k, torch.Generator().manual_seed(k)) for k in range(3)]
    handed = Handed(chunks[0])
    training = dqn_replay.batches(cfg, handed)
    for k, chunk in enumerate(chunks):
        handed.batch = chunk
        for group in range(2):
            rows = slice(2 * group, 2 * group + 2)
            batch = next(training)
            assert batch.shape == (2, 7) and torch.equal(batch["stream"], torch.tensor([[2 * group] * 7, [2 * group + 1] * 7]))
            assert torch.equal(batch["observation"][:, 3:], chunk["observation"][rows])
            if k:
                assert torch.equal(batch["observation"][:, :3], chunks[k - 1]["observation"][rows, 1:])
                assert torch.equal(batch["is_first"][:, :3], chunks[k - 1]["is_first"][rows, 1:])
            else:
                assert torch.equal(batch["observation"][:, :3], chunk["observation"][rows, :1].expand(2, 3, 2))
                assert batch["is_first"][:, :3].all() and batch["next", "done"][:, :3].all()
                assert not batch["next", "truncated"][:, :3].any()
    loss, _ = dqn.make_loss(cfg, *dqn.make_qnet(cfg, envs.make_env(cfg))[:2])
    assert loss.burn_in == 3 and loss.overlap and loss.stream_key == "stream"
    assert cfg.name == "CartPole-v1_dqn_streams_carry_stream-groups2_overlap3_batch-rows2_seq-len4_seed0"
    with pytest.raises(ValueError, match="--overlap .3. must be below --seq-len .3."):
        dqn.Config(seq_len=3, overlap=3)
    with pytest.raises(ValueError, match="--overlap applies to --replay streams only"):
        dqn.Config(replay="slice", overlap=2)


def test_runs_of_other_sequence_shapes_get_folders_of_their_own():
    assert dqn.Config().name == "CartPole-v1_dqn_streams_carry_seed0"
    assert dqn.Config(replay="sequence").name == "CartPole-v1_dqn_sequence_stored_seed0"
    assert (dqn.Config(replay="sequence", burn_in=0).name
            == "CartPole-v1_dqn_sequence_stored_burn-in0_seed0")
    assert dqn.Config(seq_len=30, name="mine").name == "mine"


def test_command_line_help_shows_the_recipes_and_the_main_jobs_flags():
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-m", "torchrl_seqchunk.recipes", "dqn", "--help"], capture_output=True,
                            text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("usage: seqchunk dqn")
    for flag in ("--env", "--keep", "--total-frames", "--seed", "--runs-dir", "--name", "--no-progress",
                 "--replay", "--initial-state", "--burn-in", "--replay-ratio", "--threads"):
        assert flag in result.stdout, flag
    assert "streams,sequence,slice" in result.stdout.replace(" ", "")


def test_sequence_windows_start_at_the_oldest_record_after_the_ring_wraps():
    """TorchRL's Sequence repeats the oldest stored record where a burn-in reaches before it;
    the RNN must not unroll the repeats as steps of the episode."""
    cfg = dqn.Config(replay="sequence", num_envs=1, collect_len=4, buffer_size=8, seq_len=3, burn_in=4,
                     batch_rows=64, hidden=8)
    buffer = dqn_replay.make_buffer(cfg)
    for k in range(3):  # 12 steps of one episode into 8 slots: the oldest kept is step 4
        t = torch.arange(4 * k, 4 * k + 4, dtype=torch.float32).view(1, 4, 1)
        flags = torch.zeros(1, 4, 1, dtype=torch.bool)
        dqn_replay.write(cfg, buffer, TensorDict({
            "observation": t, "action": torch.ones(1, 4, 2), "is_init": t == 0,
            ("collector", "traj_ids"): torch.zeros(1, 4, dtype=torch.long),
            "q_state": t.view(1, 4, 1, 1).expand(1, 4, 1, 8),  # the memory stored with each step
            ("next", "observation"): t + 1, ("next", "reward"): torch.ones(1, 4, 1),
            ("next", "done"): flags, ("next", "terminated"): flags, ("next", "truncated"): flags,
        }, batch_size=[1, 4]))
    out = dqn_replay.sample(cfg, buffer)
    obs, valid, first = out["observation"][..., 0], out["validity_mask"], out["is_first"][..., 0]
    past = ~valid & valid.long().cummax(1).values.bool()
    carried = ~first[:, 1:] & ~past[:, 1:]  # the RNN goes on from step t to t + 1 in the same episode
    assert (obs[:, 1:] - obs[:, :-1] == 1)[carried].all()  # ... only between consecutive records
    assert valid[:, 0].all() and (out["q_state"][:, 0, 0, 0] == obs[:, 0]).all()  # each from its own memory
    assert ((obs[:, 0] == 4) & ~valid[:, -1]).any()  # a window moved to start at the oldest record
