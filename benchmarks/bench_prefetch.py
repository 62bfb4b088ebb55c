"""ChunkPrefetcher feeding a device: uint8 Atari-sized chunks pinned and copied while the trainer trains.

One ``StreamChunkSampler`` buffer of uint8 frames (``[1, 64, 64]`` by default) is filled with
episodes of random length (``bench_sampler.fill``); its ``[B, T]`` chunks (``[16, 64, 1, 64,
64]``, 4 MiB) train a learner on ``--device``: frames flattened and scaled to ``[0, 1]``, a
``Linear + Tanh`` encoder, a ``ResetRNN`` GRU resetting at ``is_first``, Adam. In interleaved
rounds, so that machine load weighs on both sides alike:

- ``prefetched``: ``ChunkPrefetcher(rb.sample, device=device)`` (pinned memory on CUDA, a
  ``non_blocking`` copy) prepares the next chunks in its thread while the learner trains;
- ``inline``: ``rb.sample()`` then ``.to(device)`` in the training loop, nothing ahead.

Prints ``RATIO trainer_wait_fraction`` (the share of the prefetched loop's wall time spent in
``next()``, goal <= 0.05), ``RATIO prefetch_speedup`` (training steps per second, prefetched
over inline) and the chunk copy's bandwidth; with ``--ddp-ranks N`` (N > 1: one rank per CUDA
device and NCCL on CUDA, gloo ranks on CPU), ``RATIO ddp_chunks_{N}v1``: chunks trained per
second by N ``DistributedDataParallel`` learners, each fed by its own prefetcher, over one.
Writes ``--out``/prefetch.csv (name, value, unit, note).

    python benchmarks/bench_prefetch.py --device cuda           # one GPU
    python benchmarks/bench_prefetch.py --device cuda --ddp-ranks 2
    python benchmarks/bench_prefetch.py --quick                 # seconds, on CPU
"""
from __future__ import annotations

import argparse
import math
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
from bench_sampler import fill  # benchmarks/bench_sampler.py
from timing import rank_zero_result, write_figures  # benchmarks/timing.py
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

from torchrl_seqchunk import ChunkPrefetcher, ResetRNN, StreamChunkSampler
from torchrl_seqchunk.recipes.common.loopback import join_loopback_group


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="the learner's device (cpu, cuda, cuda:1, ...)")
    parser.add_argument("--quick", action="store_true", help="a small buffer and few steps: seconds on CPU")
    parser.add_argument("--steps", type=int, default=20_000, help="steps in the buffer")
    parser.add_argument("--min-episode", type=int, default=100, help="shortest episode")
    parser.add_argument("--max-episode", type=int, default=1000, help="longest episode")
    parser.add_argument("--obs-shape", type=int, nargs="+", default=[1, 64, 64], help="uint8 frame shape")
    parser.add_argument("--num-streams", type=int, default=16, help="B")
    parser.add_argument("--seq-len", type=int, default=64, help="T")
    parser.add_argument("--hidden", type=int, default=512, help="units of the encoder and the GRU")
    parser.add_argument("--train-steps", type=int, default=50, help="training steps per side and round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median)")
    parser.add_argument("--ddp-ranks", type=int, default=0, help="DDP learners compared with one (0: none)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/bench_prefetch", help="output folder")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.train_steps, args.rounds, args.hidden = 2_048, 3, 1, 64
        args.min_episode, args.max_episode = 50, 300
    return args


def make_buffer(args, seed: int) -> TensorDictReplayBuffer:
    B, T = args.num_streams, args.seq_len
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(args.steps), batch_size=B * T,
                                sampler=StreamChunkSampler(B, T, seed=seed))
    fill([rb], args, torch.Generator().manual_seed(seed))
    return rb


def make_learner(args, device: torch.device) -> tuple[TensorDictSequential, torch.optim.Optimizer]:
    """uint8 frames -> [0, 1] -> Linear + Tanh -> ResetRNN GRU (resets at is_first), on `device`."""
    frame = math.prod(args.obs_shape)
    encoder = TensorDictModule(nn.Sequential(nn.Flatten(2), nn.Linear(frame, args.hidden), nn.Tanh()),
                               in_keys=["frame"], out_keys=["embed"])
    rnn = ResetRNN(nn.GRU(args.hidden, args.hidden, batch_first=True), in_key="embed",
                   default_recurrent_mode=True)
    learner = TensorDictSequential(encoder, rnn).to(device)
    return learner, torch.optim.Adam(learner.parameters(), lr=1e-4)


def train_step(learner, optim, chunk, device: torch.device) -> None:
    """One forward and backward on a [B, T] chunk already on `device`."""
    chunk = chunk.set("frame", chunk["observation"].float().div(255))
    loss = learner(chunk)["features"].pow(2).mean()
    optim.zero_grad()
    loss.backward()
    optim.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # the step is over when the device is done


def prefetched(rb, learner, optim, args, device) -> tuple[float, float]:
    """Seconds per step and the share of wall time in next(), ChunkPrefetcher feeding the loop."""
    waited = 0.0
    with ChunkPrefetcher(rb.sample, device=device) as chunks:
        train_step(learner, optim, next(chunks), device)  # the queue fills meanwhile
        start = time.perf_counter()
        for _ in range(args.train_steps):
            before = time.perf_counter()
            chunk = next(chunks)
            waited += time.perf_counter() - before
            train_step(learner, optim, chunk, device)
        wall = time.perf_counter() - start
    return wall / args.train_steps, waited / wall


def inline(rb, learner, optim, args, device) -> float:
    """Seconds per step when the loop samples and copies each chunk itself."""
    start = time.perf_counter()
    for _ in range(args.train_steps):
        train_step(learner, optim, rb.sample().to(device), device)
    return (time.perf_counter() - start) / args.train_steps


def copy_bandwidth(rb, device: torch.device) -> float:
    """GB/s of one chunk's copy to `device` (pinned on CUDA), median of 5."""
    chunk = rb.sample()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        moved = (chunk.pin_memory() if device.type == "cuda" else chunk).to(device, non_blocking=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    del moved
    return chunk.bytes() / statistics.median(times) / 1e9


def ddp_rank(rank: int, world_size: int, port: int, args, results) -> None:
    """One learner of `world_size`: its own buffer and prefetcher; rank 0 reports chunks/s."""
    torch.set_num_threads(args.threads)
    cuda = torch.device(args.device).type == "cuda"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    join_loopback_group("nccl" if cuda else "gloo", rank, world_size, port)
    torch.manual_seed(args.seed)  # equal initial weights
    learner, _ = make_learner(args, device)
    model = nn.parallel.DistributedDataParallel(learner, device_ids=[rank] if cuda else None)
    optim = torch.optim.Adam(model.parameters(), lr=1e-4)
    step, _ = prefetched(make_buffer(args, args.seed + rank), model, optim, args, device)
    dist.barrier()
    if rank == 0:
        results.put(world_size / step)
    dist.destroy_process_group()


def main(argv=None) -> dict[str, float]:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    rows = []

    def record(name: str, value: float, unit: str, note: str = "") -> float:
        rows.append({"name": name, "value": value, "unit": unit, "note": note})
        return value

    rb = make_buffer(args, args.seed)
    learner, optim = make_learner(args, device)
    train_step(learner, optim, rb.sample().to(device), device)  # warm-up: allocator, kernels
    times = {"prefetched": [], "inline": []}
    waits = []
    for _ in range(args.rounds):
        step, wait = prefetched(rb, learner, optim, args, device)
        times["prefetched"].append(step)
        waits.append(wait)
        times["inline"].append(inline(rb, learner, optim, args, device))
    B, T = args.num_streams, args.seq_len
    chunk = f"[{B}, {T}, {', '.join(map(str, args.obs_shape))}] uint8"
    for name, values in times.items():
        record(f"step_ms_{name}", 1e3 * statistics.median(values), "ms", f"{chunk} on {device}")
    ratios = {"trainer_wait_fraction": record("trainer_wait_fraction", statistics.median(waits), "fraction",
                                              "share of the prefetched loop's wall time in next()"),
              "prefetch_speedup": record("prefetch_speedup", statistics.median(
                  i / p for i, p in zip(times["inline"], times["prefetched"])), "ratio", "steps/s, prefetched / inline")}
    record("copy_GBps", copy_bandwidth(rb, device), "GB/s", f"one chunk {'pinned ' if device.type == 'cuda' else ''}to {device}")
    if args.ddp_ranks > 1:
        one, many = rank_zero_result(ddp_rank, 1, args), rank_zero_result(ddp_rank, args.ddp_ranks, args)
        backend = "nccl" if device.type == "cuda" else "gloo"
        record("ddp_chunks_per_s_1", one, "chunks/s", f"1 {backend} rank")
        record(f"ddp_chunks_per_s_{args.ddp_ranks}", many, "chunks/s", f"{args.ddp_ranks} {backend} ranks")
        ratios[f"ddp_chunks_{args.ddp_ranks}v1"] = record(f"ddp_chunks_{args.ddp_ranks}v1", many / one, "ratio")
    for row in rows:
        if row["unit"] != "ratio" and row["name"] not in ratios:
            print(f"{row['name']:>20}: {row['value']:10.3f} {row['unit']}  {row['note']}")
    write_figures(rows, ratios, Path(args.out) / "prefetch.csv")
    return ratios


if __name__ == "__main__":
    main()
