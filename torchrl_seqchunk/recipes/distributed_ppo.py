"""Recurrent PPO on stream chunks with several learner processes and env workers.

The main job (`seqchunk ppo --batching streams`) past one process:
`--learners W` learner processes (torch.distributed gloo ranks bound to 127.0.0.1, or NCCL
with a CUDA `--device`), each a DistributedDataParallel replica, and `--workers N` env
workers (TorchRL collectors of `--num-envs` envs each) assigned to the learners round robin.
`--engine` says where the workers step their envs:
  local  each rank's collectors run in its own process (threads); nothing to install;
  ray    each worker is a TorchRL RayCollector actor. Without `--address`, rank 0 starts a
         local Ray cluster bound to 127.0.0.1, without dashboard, and stops it at the end;
         with `--address` (e.g. "auto", "head-node:6379") every rank joins that cluster,
         which outlives the run. Needs the `distributed` extra (pip install "torchrl-seqchunk[distributed]").

    seqchunk distributed-ppo                          # 2 learners, 2 workers
    seqchunk distributed-ppo --learners 2 --workers 4
    seqchunk distributed-ppo --engine ray             # workers as Ray actors
    seqchunk distributed-ppo --engine ray --address auto
    torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint head-node:29400 \
        --no-python seqchunk distributed-ppo --engine ray --address head-node:6379   # on every node

Started by torchrun, the command runs one learner rank in its own process and joins torchrun's
group (env://: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT): the learners are
torchrun's ranks on every node (`--learners`, if given, must equal its world size), and a CUDA
`--device` means the GPU of LOCAL_RANK. torchrun's rendezvous store and gloo's sockets use the
nodes' network interfaces (GLOO_SOCKET_IFNAME picks one); without torchrun everything binds
127.0.0.1. Under torchrun, `--engine ray` needs `--address` (a Ray cluster over the nodes);
`--engine local` has each node's learners step their own workers.

Each learner rank owns a buffer, a StreamChunkSampler seeded by (seed, rank), a
ChunkPrefetcher and the ResetRNN carries of its streams. Per iteration, on every rank:
  1. each of its workers' IngestThreads is asked for one rollout [num_envs, T]; the thread
     steps the collector, adds the advantages (boundary_gae, standardized per rollout) and
     writes the steps into the rank's buffer (trajectory ids tagged per worker);
  2. `--epochs` epochs of [B, T] chunks, cut by EvenEpochs to the count every rank has, so
     that every rank runs as many DDP steps (gradients averaged over the ranks);
  3. the workers get the new weights; rank 0 gathers the ranks' finished episodes and
     losses and writes the report.
Writes runs/<name>/metrics.csv and runs/<name>/learning_curve.png (frames: all workers').
With `--engine ray` the workers' own output stays in Ray's session logs
(/tmp/ray/session_latest/logs); their errors are raised in the learners.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
import warnings
from datetime import timedelta
from typing import ClassVar, Literal

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import tyro
from tensordict import TensorDict
from tensordict.nn import TensorDictSequential
from torch import nn
from torchrl.collectors import Collector

from torchrl_seqchunk import EvenEpochs, IngestThread, TagTrajectories, assign_workers, rank_seed

from .common.agent import make_agent
from .common.batching import StreamBatching
from .common.config import RENAMED
from .common.config import Config as MainConfig
from .common.envs import check_keep, make_acting_env, make_env, seeded
from .common.loopback import join_loopback_group, loopback_store
from .common.ppo import LOGGED, add_advantages, anneal, update
from .common.report import Report, Run, check_run_folder, finished_returns

__all__ = ["RENAMED", "Config", "Run", "check_command", "train"]



@dataclasses.dataclass
class Config(MainConfig):
    """The main job's options (stream chunks only) past one process: learners, env workers and
    where they step; ``check()`` raises a ValueError that names the field (as its flag) and the fix."""
    batching: Literal["streams"] = "streams"
    """stream chunks with a carried state (the only batching here)"""
    # the main job's windows batching: no flags here
    boundary_mode: tyro.conf.Suppress[str] = "reset_continue"
    window: tyro.conf.Suppress[int] = 32
    stride: tyro.conf.Suppress[int] = 32
    minibatches: tyro.conf.Suppress[int] = 1
    # each worker's env keeps observation statistics of its own, not frozen by the learners
    obs_norm_until: tyro.conf.Suppress[float] = 1.0
    workers: int = 2
    """env workers, TorchRL collectors of num_envs envs each, assigned to learners round robin; a multiple of
    --learners, or the ranks with fewer workers set the chunks per epoch"""
    learners: int = 2
    """learner processes (torch.distributed ranks on 127.0.0.1, one DDP replica each); under torchrun, its world size"""
    engine: Literal["local", "ray"] = "local"
    """where the env workers step: in their learner's process (local), or as Ray actors (ray: TorchRL's
    RayCollector; the distributed extra)"""
    address: str = ""
    """ray only: the Ray cluster to join ("auto", "host:port"); "" starts a local cluster on 127.0.0.1, without
    dashboard, for the run"""
    APPLIES: ClassVar[dict[str, tuple[str | None, tuple | range, str]]] = {
        **MainConfig.APPLIES, "address": ("engine", ("ray",), " (it names the Ray cluster to join)"),
        # no flags here; a Config built in code that sets them is refused (they would be ignored)
        **{name: (None, (), " (distributed_ppo batches stream chunks only)")
           for name in ("boundary_mode", "window", "stride", "minibatches")},
        "obs_norm_until": (None, (), " (each worker's env keeps observation statistics of its own, never frozen)")}

    def default_name(self) -> str:
        return f"{self.env_name()}_streams_{self.engine}_{self.learners}learners_{self.workers}workers_seed{self.seed}"

    def check(self) -> None:
        world = torchrun_world_size()
        if world is not None:
            if self.learners not in (world, Config.learners):
                raise ValueError(f"--learners {self.learners}, but torchrun started {world} ranks (WORLD_SIZE); "
                                 "under torchrun the learners are its ranks: leave --learners out")
            if self.engine == "ray" and not self.address:
                raise ValueError("under torchrun, --engine ray joins a running Ray cluster: give --address (for "
                                 "example 'auto' after `ray start --head` on this node); the recipe starts a "
                                 "cluster of its own only when it starts its own learners")
        super().check()
        learners = world or self.learners
        if learners < 1 or self.workers < learners:
            raise ValueError(f"--workers ({self.workers}) must be at least --learners ({learners}) >= 1: "
                             "every learner needs an env worker")
        if self.engine == "ray" and importlib.util.find_spec("ray") is None:
            raise ValueError('--engine ray needs Ray: pip install -e ".[distributed]" (or use --engine local)')
        if self.engine == "ray" and torch.device(self.device).type != "cpu":
            raise ValueError(f"--engine ray runs the policy on the Ray workers' CPUs, so the learners must be on "
                             f"the CPU too; got --device {self.device} (use --engine local on GPUs)")


def check_command(cfg: Config) -> Config:
    """The Config a command line runs: under torchrun, its world size as ``--learners`` (and the
    default name that follows); ``--keep`` checked against one env of the run, and the run
    folder (a finished run is kept unless ``--overwrite``). A ValueError names the flag and the fix."""
    world = torchrun_world_size()
    if world is not None:  # under torchrun, the learners are its ranks
        cfg = dataclasses.replace(cfg, learners=world, name="" if cfg.name == cfg.default_name() else cfg.name)
    check_keep(cfg)
    check_run_folder(cfg.runs_dir, cfg.name, cfg.overwrite)
    return cfg


def torchrun_world_size() -> int | None:
    """The world size torchrun (torch.distributed.run) started this process in, or None when
    it was not started by torchrun (then train() spawns its own learner ranks)."""
    if "TORCHELASTIC_RUN_ID" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    return int(os.environ["WORLD_SIZE"])


def make_collector(cfg: Config, worker: int, policy, rnns, frames_per_batch: int, total_frames: int):
    """Env worker `worker`: a TorchRL collector of one acting env (num_envs envs) whose trajectory
    ids carry the worker's tag; in this process (local) or a Ray actor (ray)."""
    # the main job's Config for the env factory: what the acting env reads, nothing of the learners
    job = MainConfig(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(MainConfig)})
    env_factory = functools.partial(make_acting_env, job, rnns, cfg.seed + 1000 * worker)
    collector_options = {"postproc": TagTrajectories(worker, cfg.workers)}
    if cfg.engine == "local":  # its actions come from the rank's generator (seeded in learner)
        return Collector(env_factory(), policy, frames_per_batch=frames_per_batch, total_frames=total_frames,
                         device=cfg.device, **collector_options)
    # a Ray worker draws its actions from its own process's generator: seeded per worker
    env_factory = functools.partial(seeded, rank_seed(cfg.seed, worker, stream=2), env_factory)
    from torchrl.collectors.distributed import RayCollector

    # the worker starts from the weights pickled with the policy, then gets them from send_weights
    warnings.filterwarnings("ignore", "RayCollector iteration started before weight synchronization")
    return RayCollector(
        [env_factory], policy, frames_per_batch=frames_per_batch, total_frames=total_frames,
        sync=True,  # a batch is collected when asked for, under the weights sent last: on-policy
        collector_kwargs=[collector_options], remote_configs=[{"num_cpus": 1}],
        weight_sync_schemes={},  # weights travel through Ray's object store (send_weights)
    )


def send_weights(cfg: Config, collector, policy) -> None:
    """The policy's current weights to a worker, before it collects again.

    A local collector steps the learner's own policy module. A Ray worker gets them through
    Ray's object store, applied by its collector's update_policy_weights_ (RayCollector.map_fn
    waits until it is done), rather than by TorchRL's default RayWeightSyncScheme, whose
    torch.distributed store would listen on every network interface of the learner."""
    if cfg.engine == "local":
        collector.update_policy_weights_()
    else:
        weights = TensorDict.from_module(policy).data
        collector.map_fn("update_policy_weights_", list_of_kwargs=[{"policy_or_weights": weights}])


def join_ray(cfg: Config, rank: int) -> None:
    """Connects this rank to Ray: to --address, or to a local cluster that rank 0 starts on
    127.0.0.1 (no dashboard; one CPU per worker at least) and whose address it broadcasts."""
    import ray

    import torchrl_seqchunk

    # the package travels to the workers, so that they run the learners' code (its toolkit too)
    ray_options = {"runtime_env": {"py_modules": [torchrl_seqchunk]},
                   "log_to_driver": False, "logging_level": "warning"}
    address = [cfg.address]
    if not cfg.address:
        if rank == 0:
            ray.init(include_dashboard=False, _node_ip_address="127.0.0.1",
                     num_cpus=max(cfg.workers, os.cpu_count() or 1), **ray_options)
            address = [ray.get_runtime_context().gcs_address]
        dist.broadcast_object_list(address, src=0)
    if not ray.is_initialized():
        ray.init(address=address[0], **ray_options)


def leave_ray(cfg: Config, rank: int) -> None:
    """Disconnects every rank; the owner of a local cluster (rank 0) stops it once the others left."""
    import ray

    owner = rank == 0 and not cfg.address
    if not owner:
        ray.shutdown()
    dist.barrier()
    if owner:
        ray.shutdown()


def rank_device(cfg: Config, local_rank: int) -> torch.device:
    """The learner's device: one GPU per rank on its node for a CUDA --device without index."""
    device = torch.device(cfg.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
    return device


def spawned_learner(rank: int, cfg: Config, port: int) -> None:
    """One learner rank started by train(): joins the other ranks through the loopback_store."""
    device = rank_device(cfg, rank)
    join_loopback_group("nccl" if device.type == "cuda" else "gloo", rank, cfg.learners, port)
    learner(rank, dataclasses.replace(cfg, device=str(device)))


def torchrun_learner(cfg: Config) -> Run | None:
    """This process as the learner rank torchrun started: joins torchrun's group (env://).
    Returns rank 0's Run (None on the other ranks)."""
    rank = int(os.environ["RANK"])
    if rank == 0:
        check_run_folder(cfg.runs_dir, cfg.name, cfg.overwrite)  # refuse to replace a finished run before starting
    device = rank_device(cfg, int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=timedelta(minutes=5))
    return learner(rank, dataclasses.replace(cfg, device=str(device)))


def learner(rank: int, cfg: Config) -> Run | None:
    """One learner rank, in the default process group: its workers' collectors, buffer, streams
    and DDP replica. Returns the Run on rank 0 (which writes the report), None on the others."""
    device = torch.device(cfg.device)
    torch.manual_seed(cfg.seed)  # the same initial weights on every rank
    torch.set_num_threads(cfg.threads)
    if cfg.engine == "ray":
        join_ray(cfg, rank)

    workers = [w for w, r in enumerate(assign_workers(cfg.workers, cfg.learners)) if r == rank]
    frames_per_batch = cfg.num_envs * cfg.rollout_len
    iterations = -(-cfg.total_frames // (frames_per_batch * cfg.workers))  # whole rollouts
    actor, critic, rnns = make_agent(cfg, make_env(cfg, warn=True), carry=True)  # shaped by the env's specs
    actor, critic = actor.to(device), critic.to(device)
    policy = TensorDictSequential(actor, critic)  # the critic also runs, storing its memory
    collectors = [make_collector(cfg, w, policy, rnns, frames_per_batch, iterations * frames_per_batch)
                  for w in workers]
    # the actions of this rank's local collectors: a stream of its own, not the same draws on every rank
    torch.manual_seed(rank_seed(cfg.seed, rank, stream=1))
    # every rollout of this rank's workers, read as B streams whose draws are seeded by (seed, rank)
    generator = torch.Generator().manual_seed(rank_seed(cfg.seed, rank))
    buffer = StreamBatching.make_buffer(cfg, len(workers) * frames_per_batch, generator)
    batching = StreamBatching(cfg, buffer, epoch=EvenEpochs(buffer))  # as many chunks on every rank
    loss_module = batching.make_loss(actor, critic)
    ddp = nn.parallel.DistributedDataParallel(loss_module)  # averages gradients over the ranks
    optim = torch.optim.Adam(loss_module.parameters(), lr=cfg.lr, eps=1e-5)

    def advantages(rollout):  # [num_envs, T]; a RayCollector stacks its one worker's: [1, num_envs, T]
        return add_advantages(cfg, critic, rollout.reshape(-1, rollout.shape[-1]).to(device), standardize=True)

    ingests = [IngestThread(c, buffer, transform=advantages, on_demand=True) for c in collectors]
    report = Report(check_run_folder(cfg.runs_dir, cfg.name, cfg.overwrite),
                    planned_frames=iterations * frames_per_batch * cfg.workers, target=cfg.target,
                    return_window=cfg.return_window, stop_at_target=cfg.stop_at_target,
                    progress=cfg.progress) if rank == 0 else None
    try:
        for iteration in range(iterations):
            buffer.empty()  # on-policy: this iteration's rollouts only
            for ingest in ingests:
                ingest.request()
            for ingest in ingests:
                ingest.wait(iteration + 1)
            torch.set_num_threads(cfg.threads)
            steps = buffer.storage[: len(buffer)]  # this iteration's rollouts
            losses = update(ddp, optim, batching.batches(), weight=batching.weight, max_grad_norm=cfg.max_grad_norm)
            for collector in collectors:
                send_weights(cfg, collector, policy)
            anneal(cfg, optim, loss_module, max(0.0, 1 - (iteration + 1) / iterations))
            # rank 0 reports every rank's finished episodes and the ranks' mean losses
            gathered = [None] * cfg.learners
            dist.all_gather_object(gathered, (steps.numel(), finished_returns(steps),
                                              {k: losses[k] for k in LOGGED}))
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
    run = report.close(cfg.name) if report is not None else None
    if cfg.engine == "ray":
        leave_ray(cfg, rank)
    dist.destroy_process_group()
    return run


def train(cfg: Config) -> Run | None:
    """Trains recurrent PPO on stream chunks with ``cfg.learners`` learner processes (spawned
    here, or this process as one rank under torchrun) and ``cfg.workers`` env workers,
    writing ``<runs_dir>/<name>/`` from rank 0; returns the Run (metrics rows as the main
    job's, frames of all workers), read back from metrics.csv. Under torchrun: rank 0's Run,
    None on the other ranks. A ValueError names the option and the fix.

    Examples:
        >>> from torchrl_seqchunk.recipes import distributed_ppo
        >>> distributed_ppo.Config(workers=4).name  # the run's folder under runs/
        'CartPole-v1_streams_local_2learners_4workers_seed0'
    """
    cfg.check()
    if torchrun_world_size() is not None:
        return torchrun_learner(cfg)
    if cfg.engine == "ray" and not cfg.address:
        # Read by the ranks when they import Ray: the switch that keeps a cluster on the loopback
        # (Ray's default on macOS and Windows), so that every Ray process binds 127.0.0.1 only,
        # and token authentication on every rank (~/.ray/auth_token, made by the first ray.init)
        os.environ.update(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_AUTH_MODE="token")
    out_dir = check_run_folder(cfg.runs_dir, cfg.name, cfg.overwrite)  # refuse to replace a finished run first
    store = loopback_store()  # serves the learners' rendezvous while they run
    mp.start_processes(spawned_learner, args=(cfg, store.port), nprocs=cfg.learners, start_method="spawn")
    return Run.read(out_dir)  # what rank 0 wrote
