"""Recurrent PPO on a partially observable task, composed from TorchRL and torchrl_seqchunk (the main job).

Default task: CartPole-v1 without its velocity components (the agent sees cart position
and pole angle only), so it must infer velocities from memory.

    seqchunk ppo                               # windows, reset_continue
    seqchunk ppo --boundary-mode mask          # the usual masked baseline
    seqchunk ppo --batching streams            # stream chunks + carry
    seqchunk ppo --env Pendulum-v1 --keep 0,1  # any gymnasium id ("module:Id" too)

In Python: ``run = ppo.train(ppo.Config(env="Pendulum-v1", keep="0,1"))``; ``run.rows`` are
metrics.csv's rows, ``run.out_dir`` the run's folder.

Pipeline per iteration:
  1. a collector steps `num_envs` envs (observations normalized by VecNormV2's rule, its
     statistics frozen after `--obs-norm-until` of the run; rewards scaled by
     ReturnScaledReward); the actor and critic run ResetRNN in step mode, so the rollout
     stores the memory each of them had at every step. On the default
     `--env-batching vector` that is VectorEnvCollector (the rollouts of TorchRL's Collector,
     stepped on plain tensors), on `serial` / `parallel` TorchRL's Collector;
  2. boundary_gae computes advantages on the rollout [num_envs, T];
  3. the batching turns the rollout into batches: `--batching windows` cuts windows [N, W]
     that RecurrentPPOLoss unrolls with `--boundary-mode`; `--batching streams` reads the
     rollout as StreamChunkSampler chunks [B, T] (through a ChunkPrefetcher) and the ResetRNN
     modules carry their state from one chunk to the next (truncated BPTT).

Writes runs/<name>/metrics.csv and, beside it, runs/<name>/learning_curve.png.
"""
from __future__ import annotations

import torch
from tensordict.nn import TensorDictSequential

from .common.agent import make_agent
from .common.batching import make_batching
from .common.config import RENAMED, Config
from .common.envs import check_keep, make_acting_env, make_collector, make_env, obs_norm_of
from .common.ppo import LOGGED, learn
from .common.report import Report, Run, check_run_folder, finished_returns

__all__ = ["RENAMED", "Config", "Run", "check_command", "train"]


def check_command(cfg: Config) -> Config:
    """The checks of a command line beyond ``cfg.check()``: ``--keep`` against one env of the
    run, and the run folder (a finished run is kept unless ``--overwrite``). Returns ``cfg``;
    a ValueError names the flag and the fix."""
    check_keep(cfg)
    check_run_folder(cfg.runs_dir, cfg.name, cfg.overwrite)
    return cfg


def train(cfg: Config) -> Run:
    """Trains recurrent PPO as ``cfg`` says, writing ``<runs_dir>/<name>/``; returns the Run
    (metrics rows: frames, wall_s, episodes, return_mean and the mean losses of each
    iteration). A ValueError names the option and the fix (nothing is written then).

    Examples:
        >>> from torchrl_seqchunk.recipes import ppo
        >>> ppo.Config(env="Pendulum-v1", keep="0,1").name  # the run's folder under runs/
        'Pendulum-v1_keep0,1_reset_continue_seed0'
    """
    cfg.check()  # a Config built in code is checked as a command line is
    out_dir = check_run_folder(cfg.runs_dir, cfg.name, cfg.overwrite)
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    frames_per_batch = cfg.num_envs * cfg.rollout_len
    planned_frames = -(-cfg.total_frames // frames_per_batch) * frames_per_batch  # whole rollouts

    actor, critic, rnns = make_agent(cfg, make_env(cfg, warn=True), carry=cfg.batching == "streams")
    env = make_acting_env(cfg, rnns, cfg.seed)
    actor, critic = actor.to(cfg.device), critic.to(cfg.device)
    collector = make_collector(cfg, env, TensorDictSequential(actor, critic), frames_per_batch, planned_frames)
    batching = make_batching(cfg, rnns, frames_per_batch)
    loss_module = batching.make_loss(actor, critic)
    optim = torch.optim.Adam(loss_module.parameters(), lr=cfg.lr, eps=1e-5)
    obs_norm = obs_norm_of(env)  # frozen by anneal once --obs-norm-until of the run is collected
    report = Report(out_dir, planned_frames=planned_frames, target=cfg.target, return_window=cfg.return_window,
                    stop_at_target=cfg.stop_at_target, progress=cfg.progress)

    for rollout in collector:  # [num_envs, T]
        # TorchRL's batched env raises the thread count when it closes, before the last batch
        torch.set_num_threads(cfg.threads)
        returns = finished_returns(rollout)
        remaining = max(0.0, 1 - (report.frames + rollout.numel()) / planned_frames)  # of the lr and clip schedules
        losses = learn(cfg, rollout, critic, batching, loss_module, optim, remaining=remaining, obs_norm=obs_norm)
        collector.update_policy_weights_()
        report.add(rollout.numel(), returns, {k: losses[k] for k in LOGGED})
        if report.reached:
            break
    collector.shutdown()
    return report.close(cfg.name)
