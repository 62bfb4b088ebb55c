"""The plain-PyTorch reference of benchmarks/plain_reference.py is the main job's recipe: the same
defaults, networks, advantages and loss as seqchunk ppo's pieces, and it learns."""
import dataclasses
import sys
from pathlib import Path

import torch
from tensordict.nn import TensorDictSequential

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from plain_reference import PlainConfig, PlainDQN, PlainPPO, chunk_from_tensordict, rollout_from_tensordict  # noqa: E402
from torchrl_seqchunk.recipes import ppo as main_job  # noqa: E402

from torchrl_seqchunk.recipes.common.agent import make_agent  # noqa: E402
from torchrl_seqchunk.recipes.common.batching import make_batching  # noqa: E402
from torchrl_seqchunk.recipes.common.envs import make_acting_env, make_collector, make_env  # noqa: E402
from torchrl_seqchunk.recipes.common.ppo import add_advantages  # noqa: E402

from torchrl_seqchunk import VectorEnvCollector  # noqa: E402


def job_config(**options):
    return main_job.Config(progress=False, **options)


def test_its_settings_are_the_main_jobs_defaults():
    job = job_config()
    for field in dataclasses.fields(PlainConfig):
        assert getattr(PlainConfig(), field.name) == getattr(job, field.name), field.name
    # what the reference runs without an option: windows over whole rows, reset_continue, a GRU, no entropy
    assert (job.batching, job.boundary_mode, job.window, job.stride, job.minibatches) == (
        "windows", "reset_continue", job.rollout_len, job.rollout_len, 1)
    assert (job.cell, job.encoder, job.activation, job.entropy_coeff) == ("gru", True, "tanh", 0.0)
    assert job.anneal_lr and job.anneal_clip and job.obs_norm and job.reward_norm and job.env_batching == "vector"


def job_pieces(seed=0):
    cfg = job_config(seed=seed)
    torch.manual_seed(seed)
    actor, critic, rnns = make_agent(cfg, make_env(cfg), carry=False)
    plain = PlainPPO(PlainConfig(seed=seed))  # seeds torch as the job did: the same initial weights
    return cfg, actor, critic, rnns, plain


def test_its_networks_advantages_and_loss_are_the_main_jobs():
    cfg, actor, critic, rnns, plain = job_pieces()
    for mine, theirs in ((plain.actor, actor), (plain.critic, critic)):  # encoder, GRU, head
        ordered = [p for part in (mine.encoder, mine.gru, mine.head) for p in part.parameters()]
        assert all(torch.equal(a, b) for a, b in zip(ordered, theirs.parameters(), strict=True))
    per_batch = cfg.num_envs * cfg.rollout_len
    collector = make_collector(cfg, make_acting_env(cfg, rnns, 0), TensorDictSequential(actor, critic), per_batch, -1)
    assert isinstance(collector, VectorEnvCollector)
    rollout = next(iter(collector))
    collector.shutdown()
    torch.set_num_threads(1)
    assert rollout["next", "done"].any()  # episode ends inside the rollout: resets to the stored memory
    ours = plain.add_advantages(rollout_from_tensordict(rollout))
    add_advantages(cfg, critic, rollout)
    torch.testing.assert_close(ours.advantage, rollout["advantage"])
    torch.testing.assert_close(ours.value_target, rollout["value_target"])

    batching = make_batching(cfg, rnns, per_batch)
    loss = batching.make_loss(actor, critic)
    torch.manual_seed(1)
    windows = batching.batches(rollout)[0]  # the rows, shuffled
    torch.manual_seed(1)
    batch = plain.batches(ours)[0]  # the same shuffle
    out = loss(windows)
    theirs = out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]
    mine = plain.loss(batch)
    torch.testing.assert_close(mine, theirs)
    plain_params = [p for net in (plain.actor, plain.critic) for part in (net.encoder, net.gru, net.head)
                    for p in part.parameters()]
    for a, b in zip(torch.autograd.grad(mine, plain_params), torch.autograd.grad(theirs, list(loss.parameters())),
                    strict=True):
        torch.testing.assert_close(a, b)


def test_it_learns():
    rows = PlainPPO(PlainConfig(total_frames=12_288)).run()
    first, last = rows[0][1], rows[-1][1]
    assert first < 30 and last > 3 * first  # CartPole's masked returns: ~20 at random


def test_its_dqn_step_reads_the_recipes_chunks_and_learns_on_one():
    from torchrl_seqchunk.recipes import dqn as recurrent_dqn, dqn_replay

    cfg = recurrent_dqn.Config(progress=False, learning_starts=512)
    qnet, rnn, policy = recurrent_dqn.make_qnet(cfg, recurrent_dqn.envs.make_env(cfg))
    collector = recurrent_dqn.envs.make_collector(cfg, recurrent_dqn.envs.make_acting_env(cfg, [rnn], 0), policy,
                                                  cfg.frames_per_batch, cfg.learning_starts)
    buffer = dqn_replay.make_buffer(cfg)
    for batch in collector:
        dqn_replay.write(cfg, buffer, batch)
    collector.shutdown()
    torch.set_num_threads(1)
    chunk = chunk_from_tensordict(next(dqn_replay.batches(cfg, buffer)))
    assert chunk["obs"].shape[:2] == chunk["action"].shape == (cfg.batch_rows, cfg.seq_len)
    dqn = PlainDQN(chunk["obs"].shape[-1], 2, lr=1e-2)
    losses = [dqn.step(chunk).item() for _ in range(30)]
    assert losses[-1] < losses[0]
    assert dqn.carries["online"].shape == (cfg.batch_rows, cfg.hidden)
