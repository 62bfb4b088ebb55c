"""Recurrent PPO on stream chunks with several learner processes and env workers.

The main job (examples/recurrent_ppo.py, `--batching streams`) past one process, on one
machine: `--learners W` learner processes (torch.distributed gloo ranks bound to
127.0.0.1, or NCCL with a CUDA `--device`), each a DistributedDataParallel replica, and
`--workers N` env workers (TorchRL collectors of `--num-envs` envs each) assigned to the
learners round robin.

    python examples/distributed_ppo.py                          # 2 learners, 2 workers
    python examples/distributed_ppo.py --learners 2 --workers 4

Each learner rank owns a buffer, a StreamChunkSampler seeded by (seed, rank), a
ChunkPrefetcher and the ResetRNN carries of its streams. Per iteration, on every rank:
  1. each of its workers' IngestThreads is asked for one rollout [num_envs, T]; the thread
     steps the collector, adds the advantages (boundary_gae, standardized per rollout) and
     writes the steps into the rank's buffer (trajectory ids tagged per worker);
  2. `--epochs` epochs of [B, L] chunks, cut by EvenEpochs to the count every rank has, so
     that every rank runs as many DDP steps (gradients averaged over the ranks);
  3. rank 0 gathers the ranks' finished episodes and losses and writes the report.
Writes runs/<name>/metrics.csv and runs/<name>/learning_curve.png (frames: all workers').
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import os
import re
import socket
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from tensordict.nn import TensorDictSequential
from torch import nn
from torchrl.collectors import Collector
from torchrl.envs import Compose

from torchrl_seqchunk import (
    ChunkPrefetcher,
    EvenEpochs,
    IngestThread,
    TagTrajectories,
    assign_workers,
    rank_seed,
)

from cli import config_parser, opt  # examples/cli.py
from recurrent_ppo import (
    CHOICES,
    LOGGED,
    Config,
    Report,
    add_advantages,
    anneal,
    finished_returns,
    make_agent,
    make_env,
    make_loss,
    make_stream_buffer,
    run_dir,
    update,
)


@dataclasses.dataclass
class DistConfig(Config):
    batching: str = opt("streams", "stream chunks with a carried state (the only batching here)")
    workers: int = opt(2, "env workers, TorchRL collectors of num_envs envs each, assigned to learners round "
                          "robin; a multiple of --learners, or the ranks with fewer workers set the chunks per epoch")
    learners: int = opt(2, "learner processes (torch.distributed ranks on 127.0.0.1, one DDP replica each)")


def parse_args(argv=None) -> DistConfig:
    parser = config_parser(DistConfig, __doc__, {**CHOICES, "batching": ("streams",)})
    cfg = DistConfig(**vars(parser.parse_args(argv)))
    if cfg.learners < 1 or cfg.workers < cfg.learners:
        parser.error(f"--workers ({cfg.workers}) must be at least --learners ({cfg.learners}) >= 1: "
                     "every learner needs an env worker")
    if cfg.target_return != "auto":
        try:
            cfg.target
        except ValueError:
            parser.error(f"--target-return must be a number or 'auto', got {cfg.target_return!r}")
    if not cfg.name:
        env = re.sub(r"[^A-Za-z0-9_.-]", "_", cfg.env)
        cfg.name = f"{env}_streams_{cfg.learners}learners_{cfg.workers}workers_seed{cfg.seed}"
    return cfg


def learner(rank: int, cfg: DistConfig, port: int) -> None:
    """One learner rank: its workers' collectors, buffer, streams and DDP replica."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    device = torch.device(cfg.device)
    if device.type == "cuda" and device.index is None:  # one GPU per rank
        device = torch.device("cuda", rank % torch.cuda.device_count())
    cfg = dataclasses.replace(cfg, device=str(device))
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, rank=rank, world_size=cfg.learners, timeout=timedelta(minutes=5))
    torch.manual_seed(cfg.seed)  # the same initial weights on every rank
    torch.set_num_threads(cfg.threads)

    workers = [w for w, r in enumerate(assign_workers(cfg.workers, cfg.learners)) if r == rank]
    frames_per_batch = cfg.num_envs * cfg.rollout_len
    iterations = -(-cfg.total_frames // (frames_per_batch * cfg.workers))  # whole rollouts
    envs = [make_env(cfg) for _ in workers]
    actor, critic, rnns = make_agent(cfg, envs[0])
    actor, critic = actor.to(device), critic.to(device)
    collectors = []
    for w, env in zip(workers, envs):
        env.append_transform(Compose(*[rnn.make_tensordict_primer() for rnn in rnns]))
        env.set_seed(cfg.seed + 1000 * w)
        collectors.append(Collector(
            env, TensorDictSequential(actor, critic), frames_per_batch=frames_per_batch,
            total_frames=iterations * frames_per_batch, device=device,
            auto_register_policy_transforms=False, postproc=TagTrajectories(w, cfg.workers),
        ))
    loss_module = make_loss(cfg, actor, critic)
    ddp = nn.parallel.DistributedDataParallel(loss_module)  # averages gradients over the ranks
    optim = torch.optim.Adam(loss_module.parameters(), lr=cfg.lr, eps=1e-5)
    # every rollout of this rank's workers, read as B streams whose draws are seeded by (seed, rank)
    generator = torch.Generator().manual_seed(rank_seed(cfg.seed, rank))
    buffer = make_stream_buffer(cfg, len(workers) * frames_per_batch, generator)
    even = EvenEpochs(buffer)
    ingests = [IngestThread(c, buffer, transform=functools.partial(add_advantages, cfg, critic), on_demand=True)
               for c in collectors]
    report = Report(cfg, iterations * frames_per_batch * cfg.workers) if rank == 0 else None
    try:
        for iteration in range(iterations):
            buffer.empty()  # on-policy: this iteration's rollouts only
            for ingest in ingests:
                ingest.request()
            for ingest in ingests:
                ingest.wait(iteration + 1)
            torch.set_num_threads(cfg.threads)
            steps = buffer.storage[: len(buffer)]  # this iteration's rollouts
            epochs = itertools.chain.from_iterable(itertools.repeat(even, cfg.epochs))
            with ChunkPrefetcher(epochs, device=device) as chunks:
                losses = update(cfg, ddp, optim, chunks)
            for collector in collectors:
                collector.update_policy_weights_()
            anneal(cfg, optim, loss_module, max(0.0, 1 - (iteration + 1) / iterations))
            # rank 0 reports every rank's finished episodes and the ranks' mean losses
            gathered = [None] * cfg.learners
            dist.all_gather_object(gathered, (steps.numel(), finished_returns(steps),
                                              {k: losses[k].item() for k in LOGGED}))
            stop = [False]
            if report is not None:
                mean_losses = {k: torch.tensor(sum(g[2][k] for g in gathered) / cfg.learners) for k in LOGGED}
                report.add(sum(g[0] for g in gathered), [r for g in gathered for r in g[1]], mean_losses)
                stop = [report.reached]
            dist.broadcast_object_list(stop, src=0)  # --stop-at-target: every rank stops together
            if stop[0]:
                break
    finally:
        for ingest in ingests:
            ingest.close()
        for collector in collectors:
            collector.shutdown()
    if report is not None:
        report.close()
    dist.destroy_process_group()


def main(cfg: DistConfig) -> None:
    run_dir(cfg)  # refuse to replace a finished run before starting anything
    with socket.socket() as s:  # a free port for the rendezvous, on the loopback only
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(learner, args=(cfg, port), nprocs=cfg.learners, start_method="spawn")


if __name__ == "__main__":
    main(parse_args())
