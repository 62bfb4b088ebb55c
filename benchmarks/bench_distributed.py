"""What the distributed layout buys on this machine: collection, buffer and DDP ratios beside a CPU calibration.

Every figure comes from one run, sides interleaved where they can be, so that the load
of the machine weighs on both sides alike:

0. Calibration, ``RATIO cpu_parallelism_2v1``: the work two busy processes get done per
   second over what one gets done alone (``--calibration-s`` seconds of pure-Python
   arithmetic each, ``--rounds`` rounds, median). 2.0 on two free cores; less when other
   jobs share them. It bounds every 2-versus-1 ratio below.
1. Collection, ``RATIO collect_fps_2v1``: env frames per second of a TorchRL
   ``RayCollector`` (what ``seqchunk distributed-ppo --engine ray`` runs) with 2 worker
   processes over 1, on a CPU-heavy env (CartPole whose every step first runs
   ``--busy-loops`` iterations of the calibration's arithmetic), random actions,
   ``--collect-frames`` frames after a warm-up batch.
2. Buffer, ``RATIO learner_chunks_ray_vs_local``: ``[B, T]`` chunks per second a learner
   draws from a ``TensorDictReplayBuffer`` with a ``StreamChunkSampler`` in its own
   process over the same buffer owned by a Ray actor (TorchRL's ``RayReplayBuffer``),
   both filled with the same episodes.
3. Trainer, ``RATIO trainer_wait_fraction_ray`` and ``_local``: the share of a training
   loop's wall time spent waiting for the next chunk from a ``ChunkPrefetcher`` over each
   buffer, the step being a ``ResetRNN`` GRU forward and backward on the chunk.
4. DDP, ``RATIO ddp_steps_2v1``: chunks trained per second by 2 gloo ranks (one chunk
   per rank per step, gradients averaged by ``DistributedDataParallel``) over 1 rank,
   ``--ddp-steps`` steps after a warm-up.

The 2-versus-1 ratios are also printed divided by the calibration (``_normalised``): 1.0
means scaling as well as this machine's free cores allow. Ray runs as a local cluster on
127.0.0.1 without dashboard, started and stopped by the script. Writes
``--out``/distributed.csv (name, value, unit, note).

    python benchmarks/bench_distributed.py                 # a few minutes on a 2-core CPU
"""
from __future__ import annotations

import os

# Ray's switch to keep a local cluster on the loopback (its default on macOS and Windows), and
# token authentication; read when Ray is imported, which importing TorchRL's collectors does
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_AUTH_MODE", "token")

import argparse
import functools
import math
import statistics
import time
import warnings
from pathlib import Path

import gymnasium as gym
import ray
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from bench_sampler import fill  # benchmarks/bench_sampler.py
from tensordict import TensorDict
from timing import rank_zero_result, seconds_per_call, write_figures  # benchmarks/timing.py
from torch import nn
from torchrl.collectors.distributed import RayCollector
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.data.replay_buffers.ray_buffer import RayReplayBuffer
from torchrl.envs import GymWrapper
from tqdm import tqdm

from torchrl_seqchunk import ChunkPrefetcher, ResetRNN, StreamChunkSampler

from toolkit import options  # noqa: E402  benchmarks/toolkit.py: the recipes' option checks

from torchrl_seqchunk.recipes.common.loopback import join_loopback_group  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="calibration rounds (median)")
    parser.add_argument("--calibration-s", type=float, default=1.0, help="seconds of work per process and round")
    parser.add_argument("--busy-loops", type=int, default=20_000, help="arithmetic iterations per env step")
    parser.add_argument("--collect-frames", type=int, default=2048, help="frames timed per collector")
    parser.add_argument("--frames-per-batch", type=int, default=256, help="frames per collector batch")
    parser.add_argument("--steps", type=int, default=20_000, help="steps in each buffer (bench_sampler's fill)")
    parser.add_argument("--min-episode", type=int, default=100, help="shortest episode")
    parser.add_argument("--max-episode", type=int, default=1000, help="longest episode")
    parser.add_argument("--obs-shape", type=int, nargs="+", default=[64], help="uint8 observation shape")
    parser.add_argument("--num-streams", type=int, default=16, help="B")
    parser.add_argument("--seq-len", type=int, default=64, help="T")
    parser.add_argument("--samples", type=int, default=20, help="chunks timed per buffer and round")
    parser.add_argument("--train-steps", type=int, default=100, help="training steps timed per buffer")
    parser.add_argument("--hidden", type=int, default=128, help="GRU units of the trainer and DDP model")
    parser.add_argument("--ddp-steps", type=int, default=50, help="DDP steps timed per world size")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/bench_distributed", help="output folder")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True, help="progress bar")
    return options.parse(parser, argv, ints={
        "rounds": 1, "busy_loops": 0, "collect_frames": 1, "frames_per_batch": 1, "steps": 1, "min_episode": 1,
        "max_episode": 1, "obs_shape": 1, "num_streams": 1, "seq_len": 1, "samples": 1, "train_steps": 1,
        "hidden": 1, "ddp_steps": 1, "seed": 0}, reals={"calibration_s": (0.0, None, True)},
        check=lambda a: options.ordered("min_episode", a.min_episode, "max_episode", a.max_episode))



# 0. calibration ----------------------------------------------------------------------------

def busy(loops: int) -> int:
    """Pure-Python arithmetic: CPU time that no library runs on other threads."""
    total = 0
    for i in range(loops):
        total += i * i
    return total


def timed_busy(loops: int) -> tuple[float, float]:
    """(start, end) on the system-wide monotonic clock of one busy(loops) call."""
    start = time.monotonic()
    busy(loops)
    return start, time.monotonic()


def calibrate(args) -> list[float]:
    """Per round, the throughput of 2 busy processes over that of 1 (same work per process)."""
    probe = 200_000
    loops = int(probe * args.calibration_s / seconds_per_call(lambda: busy(probe), 3))
    ratios = []
    with mp.get_context("spawn").Pool(2) as pool:
        pool.map(busy, [1, 1])  # both workers up before timing
        for _ in range(args.rounds):
            start, end = pool.apply(timed_busy, (loops,))
            alone = end - start
            spans = pool.map(timed_busy, [loops, loops], chunksize=1)
            together = max(e for _, e in spans) - min(s for s, _ in spans)
            ratios.append(2 * alone / together)  # (2 loops / together) / (loops / alone)
    return ratios


# 1. collection -----------------------------------------------------------------------------

class BusyStep(gym.Wrapper):
    """A gymnasium env whose every step first runs ``busy(loops)``: CPU-heavy, like a simulator."""

    def __init__(self, env: gym.Env, loops: int):
        super().__init__(env)
        self.loops = loops

    def step(self, action):
        busy(self.loops)
        return self.env.step(action)


def make_busy_env(loops: int) -> GymWrapper:
    return GymWrapper(BusyStep(gym.make("CartPole-v1"), loops))


def collect_fps(workers: int, args) -> float:
    """Frames per second of a RayCollector of `workers` actors, each stepping its share of
    every batch (sync), random actions."""
    factory = functools.partial(make_busy_env, args.busy_loops)
    batches = -(-args.collect_frames // args.frames_per_batch)
    for message in ("The policy is not an nn.Module", "RayCollector iteration started before weight"):
        warnings.filterwarnings("ignore", message)  # random actions: no weights to send
    collector = RayCollector([factory] * workers, None, frames_per_batch=args.frames_per_batch,
                             total_frames=(batches + 1) * args.frames_per_batch, sync=True,
                             remote_configs={"num_cpus": 1}, weight_sync_schemes={})
    try:
        collector.set_seed(args.seed)
        frames, iterator = 0, iter(collector)
        next(iterator)  # warm-up: the actors started and stepped once
        start = time.perf_counter()
        for batch in iterator:
            frames += batch.numel()
        return frames / (time.perf_counter() - start)
    finally:
        collector.shutdown()


# 2. and 3. buffers and trainer --------------------------------------------------------------

def make_trainer(args) -> tuple[ResetRNN, torch.optim.Optimizer]:
    rnn = ResetRNN(nn.GRU(math.prod(args.obs_shape), args.hidden, batch_first=True), in_key="observation",
                   default_recurrent_mode=True)
    return rnn, torch.optim.Adam(rnn.parameters(), lr=1e-4)


def train_step(rnn: ResetRNN, optim: torch.optim.Optimizer, chunk: TensorDict) -> None:
    """ResetRNN forward and backward on a [B, T] chunk (observations as floats in [0, 1])."""
    chunk = chunk.set("observation", chunk["observation"].float().div(255).flatten(2))  # [B, T, F]
    loss = rnn(chunk)["features"].pow(2).mean()
    optim.zero_grad()
    loss.backward()
    optim.step()


def wait_fraction(sample, args) -> float:
    """The share of a training loop's wall time spent waiting for ChunkPrefetcher(sample)."""
    rnn, optim = make_trainer(args)
    waited = 0.0
    with ChunkPrefetcher(sample, depth=2) as chunks:
        train_step(rnn, optim, next(chunks))  # warm-up
        start = time.perf_counter()
        for _ in range(args.train_steps):
            before = time.perf_counter()
            chunk = next(chunks)
            waited += time.perf_counter() - before
            train_step(rnn, optim, chunk)
        return waited / (time.perf_counter() - start)


def buffers(args) -> dict[str, float]:
    """Chunks/s from a local and a Ray-owned stream buffer holding the same episodes, and the
    trainer's wait fraction over each."""
    B, T = args.num_streams, args.seq_len
    local = TensorDictReplayBuffer(storage=LazyTensorStorage(args.steps), sampler=StreamChunkSampler(B, T, seed=0),
                                   batch_size=B * T)
    remote = RayReplayBuffer(replay_buffer_cls=TensorDictReplayBuffer,
                             storage=functools.partial(LazyTensorStorage, args.steps),
                             sampler=functools.partial(StreamChunkSampler, B, T, seed=0),
                             batch_size=B * T, remote_config={"num_cpus": 1})
    try:
        for rb in (local, remote):
            fill([rb], args, torch.Generator().manual_seed(args.seed))  # the same episodes
        sides = {"local": local.sample, "ray": remote.sample}
        for sample in sides.values():
            sample()  # warm-up
        times = {name: [] for name in sides}
        for _ in range(args.rounds):
            for name, sample in sides.items():
                times[name].append(seconds_per_call(sample, args.samples))
        result = {f"chunks_per_s_{name}": 1 / statistics.median(t) for name, t in times.items()}
        for name, sample in sides.items():
            result[f"wait_fraction_{name}"] = wait_fraction(sample, args)
        return result
    finally:
        remote.close()


# 4. DDP ------------------------------------------------------------------------------------

def ddp_rank(rank: int, world_size: int, port: int, args, results) -> None:
    """One DDP rank: --ddp-steps steps on random [B, T] chunks of its own; rank 0 reports steps/s."""
    torch.set_num_threads(1)
    join_loopback_group("gloo", rank, world_size, port)
    torch.manual_seed(args.seed)  # equal initial weights
    rnn, _ = make_trainer(args)
    model = nn.parallel.DistributedDataParallel(rnn)
    optim = torch.optim.Adam(model.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(args.seed + rank)
    B, T = args.num_streams, args.seq_len
    chunk = TensorDict({"observation": torch.randint(0, 256, (B, T, *args.obs_shape), dtype=torch.uint8,
                                                     generator=generator),
                        "is_first": torch.rand(B, T, 1, generator=generator) < 0.01}, [B, T])
    train_step(model, optim, chunk.clone())  # warm-up: DDP's buckets
    dist.barrier()
    start = time.perf_counter()
    for _ in range(args.ddp_steps):
        train_step(model, optim, chunk.clone())
    dist.barrier()
    if rank == 0:
        results.put(args.ddp_steps / (time.perf_counter() - start))
    dist.destroy_process_group()


def ddp_steps_per_s(world_size: int, args) -> float:
    return rank_zero_result(ddp_rank, world_size, args)


# -------------------------------------------------------------------------------------------

def main(argv=None) -> dict[str, float]:
    args = parse_args(argv)
    torch.set_num_threads(1)
    rows = []

    def record(name: str, value: float, unit: str, note: str = "") -> float:
        rows.append({"name": name, "value": value, "unit": unit, "note": note})
        return value

    with tqdm(total=5, desc="bench_distributed", disable=not args.progress) as bar:
        rounds = calibrate(args)
        cpu = record("cpu_parallelism_2v1", statistics.median(rounds), "ratio",
                     "2 busy processes / 1, median of " + ", ".join(f"{r:.3f}" for r in rounds))
        bar.update()
        ray.init(include_dashboard=False, _node_ip_address="127.0.0.1", num_cpus=max(2, os.cpu_count() or 1),
                 log_to_driver=False, logging_level="warning")
        try:
            fps = {k: record(f"collect_fps_{k}", collect_fps(k, args), "frames/s", f"RayCollector, {k} workers")
                   for k in (1, 2)}
            bar.update()
            measured = buffers(args)
        finally:
            ray.shutdown()
        for name, value in measured.items():
            record(name, value, "chunks/s" if name.startswith("chunks") else "fraction")
        bar.update(2)
        ddp = {k: record(f"ddp_steps_per_s_{k}", ddp_steps_per_s(k, args), "steps/s", f"{k} gloo ranks")
               for k in (1, 2)}
        bar.update()

    collect = fps[2] / fps[1]
    ddp_2v1 = 2 * ddp[2] / ddp[1]  # chunks trained per second: one per rank per step
    ratios = {
        "cpu_parallelism_2v1": cpu,
        "collect_fps_2v1": collect,
        "collect_fps_2v1_normalised": collect / cpu,
        "learner_chunks_ray_vs_local": measured["chunks_per_s_ray"] / measured["chunks_per_s_local"],
        "trainer_wait_fraction_local": measured["wait_fraction_local"],
        "trainer_wait_fraction_ray": measured["wait_fraction_ray"],
        "ddp_steps_2v1": ddp_2v1,
        "ddp_steps_2v1_normalised": ddp_2v1 / cpu,
    }
    for name in ("collect_fps_2v1", "collect_fps_2v1_normalised", "learner_chunks_ray_vs_local",
                 "ddp_steps_2v1", "ddp_steps_2v1_normalised"):
        record(name, ratios[name], "ratio")
    print(f"calibration: 2 busy processes get {cpu:.3f}x the work of 1 done (rounds: "
          + ", ".join(f"{r:.3f}" for r in rounds) + ")")
    for row in rows:
        if row["unit"] in ("frames/s", "chunks/s", "steps/s"):
            print(f"{row['name']:>24}: {row['value']:10.1f} {row['unit']}")
    write_figures(rows, ratios, Path(args.out) / "distributed.csv")
    return ratios


if __name__ == "__main__":
    main()
