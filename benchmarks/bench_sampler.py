"""Side-by-side throughput of stream chunks against a raw gather and TorchRL's own samplers.

The same episodes of uint8 image steps ([3, 64, 64] by default) of random length fill two
storages: TorchRL's ``LazyTensorStorage`` and our ``IndexSelectStorage`` (the same storage,
gathering with ``index_select``; their memory-mapped forms with ``--memmap``). Then, in
interleaved rounds so that machine load hits every side alike, on TorchRL's storage:

- ``stream``: ``rb.sample()`` with ``StreamChunkSampler(B, T)`` ([B, T] chunks);
- ``raw_gather``: ``storage[index]`` of B contiguous runs of T steps (the bytes alone);
- ``slice``: ``rb.sample()`` with TorchRL's ``SliceSampler(slice_len=T)`` (defaults);
- ``sequence``: ``rb.sample()`` of B anchors with TorchRL's ``Sequence(T,
  episode_boundary="include_reset")`` sample unit (uniform anchors), viewed as ``[B, T]``;

and on ``IndexSelectStorage`` the same ``stream``, ``raw_gather`` and ``sequence`` sides
(``*_index_select``); and a consumer that simulates a training step as long as one raw
gather (sleeping, as when the accelerator works) while a ``ChunkPrefetcher`` prepares the
next chunks; the wait is measured once the queue has filled (steady state).

Prints ``RATIO stream_vs_raw_gather`` (goal >= 0.8), ``RATIO stream_vs_slicesampler``
(goal >= 1.0), ``RATIO stream_vs_sequence_unit`` (goal >= 1.0; on each storage, the
second as ``stream_vs_sequence_unit_index_select``), ``RATIO
index_select_storage_vs_lazy_tensor_storage`` (stream chunks, our storage over TorchRL's)
and ``RATIO prefetch_wait_fraction`` (goal <= 0.05), plus the median timings. Each
throughput ratio is the median over rounds of the two sides' time ratio in that round.

    python benchmarks/bench_sampler.py                       # 100k steps, B=16, T=64
    python benchmarks/bench_sampler.py --steps 5000 --rounds 3 --iters 5   # smoke run
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from tensordict import TensorDict
from timing import paired_ratio, print_ratios, seconds_per_call  # benchmarks/timing.py
from toolkit import options  # benchmarks/toolkit.py: the recipes' option checks
from torchrl.data import LazyMemmapStorage, LazyTensorStorage, Sequence, TensorDictReplayBuffer
from torchrl.data.replay_buffers.samplers import SliceSampler
from tqdm import tqdm

from torchrl_seqchunk import (ChunkPrefetcher, IndexSelectMemmapStorage, IndexSelectStorage,
                              StreamChunkSampler)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100_000, help="storage capacity, filled")
    parser.add_argument("--num-streams", type=int, default=16, help="B")
    parser.add_argument("--seq-len", type=int, default=64, help="T")
    parser.add_argument("--min-episode", type=int, default=100, help="shortest episode")
    parser.add_argument("--max-episode", type=int, default=1000, help="longest episode")
    parser.add_argument("--obs-shape", type=int, nargs="+", default=[3, 64, 64])
    parser.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds")
    parser.add_argument("--iters", type=int, default=20, help="calls per side per round")
    parser.add_argument("--memmap", action="store_true",
                        help="LazyMemmapStorage and IndexSelectMemmapStorage instead")
    parser.add_argument("--seed", type=int, default=0)
    return options.parse(parser, ints={"steps": 1, "num_streams": 1, "seq_len": 1, "min_episode": 1,
                                       "max_episode": 1, "obs_shape": 1, "rounds": 1, "iters": 1, "seed": 0},
                         check=lambda a: options.ordered("min_episode", a.min_episode,
                                                         "max_episode", a.max_episode))


def fill(buffers, args, generator):
    """Writes the same whole episodes (TorchRL layout) into each buffer of the list ``buffers``
    until its storage is full."""
    if not isinstance(buffers, (list, tuple)):  # a buffer is iterable too, and would fill nothing
        raise TypeError(f"buffers must be a list of replay buffers, got {type(buffers).__name__}; "
                        "pass [rb].")
    written = 0
    with tqdm(total=args.steps, desc="filling storage", unit="step") as bar:
        while written < args.steps:
            n = torch.randint(args.min_episode, args.max_episode + 1, (1,), generator=generator)
            n = min(int(n), args.steps - written)
            done = torch.zeros(n, 1, dtype=torch.bool)
            done[-1] = True
            episode = TensorDict(
                {
                    "observation": torch.randint(
                        0, 256, (n, *args.obs_shape), dtype=torch.uint8, generator=generator
                    ),
                    "action": torch.randint(0, 6, (n, 1), generator=generator),
                    ("next", "reward"): torch.randn(n, 1, generator=generator),
                    ("next", "done"): done,
                    ("next", "terminated"): done.clone(),
                    ("next", "truncated"): torch.zeros(n, 1, dtype=torch.bool),
                },
                [n],
            )
            for rb in buffers:
                rb.extend(episode)
            written += n
            bar.update(n)


def main():
    args = parse_args()
    B, T = args.num_streams, args.seq_len
    generator = torch.Generator().manual_seed(args.seed)
    storage = (LazyMemmapStorage if args.memmap else LazyTensorStorage)(args.steps)
    fast_storage = (IndexSelectMemmapStorage if args.memmap else IndexSelectStorage)(args.steps)

    def stream_buffer(store):  # the same seed on both storages: the same chunks
        sampler = StreamChunkSampler(B, T, generator=torch.Generator().manual_seed(args.seed))
        return TensorDictReplayBuffer(storage=store, sampler=sampler, batch_size=B * T)

    def sequence_side(store):
        rb = TensorDictReplayBuffer(storage=store, batch_size=B,
                                    sample_unit=Sequence(T, episode_boundary="include_reset"))
        return lambda: rb.sample().reshape(B, T)

    def raw_gather_side(store):
        def raw_gather():
            starts = torch.randint(0, len(store) - T + 1, (B, 1), generator=generator)
            return store[starts + torch.arange(T)]
        return raw_gather

    stream_rb, fast_stream_rb = stream_buffer(storage), stream_buffer(fast_storage)
    fill([stream_rb, fast_stream_rb], args, generator)
    slice_rb = TensorDictReplayBuffer(
        storage=storage, sampler=SliceSampler(slice_len=T), batch_size=B * T
    )
    sides = {"stream": stream_rb.sample, "raw_gather": raw_gather_side(storage), "slice": slice_rb.sample,
             "sequence": sequence_side(storage), "stream_index_select": fast_stream_rb.sample,
             "raw_gather_index_select": raw_gather_side(fast_storage),
             "sequence_index_select": sequence_side(fast_storage)}
    for fn in sides.values():  # warm up: first boundary scans, allocator
        fn()
    times = {name: [] for name in sides}
    for _ in tqdm(range(args.rounds), desc="timing rounds"):
        for name, fn in sides.items():
            times[name].append(seconds_per_call(fn, args.iters))
    median = {name: statistics.median(values) for name, values in times.items()}
    steps_per_call = B * T
    for name, value in median.items():
        print(f"{name:>23}: {value * 1e3:8.2f} ms/call  {steps_per_call / value:12,.0f} steps/s")

    # Consumer: a training step as long as one raw gather; the worker prepares chunks.
    step_time = median["raw_gather"]
    waited, calls = 0.0, args.rounds * args.iters
    with ChunkPrefetcher(stream_rb.sample, depth=2) as chunks:
        next(chunks)
        time.sleep(4 * median["stream"])  # let the queue fill
        start = time.perf_counter()
        for _ in range(calls):
            before = time.perf_counter()
            next(chunks)
            waited += time.perf_counter() - before
            time.sleep(step_time)
        wall = time.perf_counter() - start
    print(f"prefetch: waited {waited:.3f} s of {wall:.3f} s over {calls} steps "
          f"of {step_time * 1e3:.2f} ms")

    throughput = {  # RATIO name: (ours, theirs), each the inverse time ratio
        "stream_vs_raw_gather": ("stream", "raw_gather"),
        "stream_vs_slicesampler": ("stream", "slice"),
        "stream_vs_sequence_unit": ("stream", "sequence"),
        "stream_vs_sequence_unit_index_select": ("stream_index_select", "sequence_index_select"),
        "stream_vs_raw_gather_index_select": ("stream_index_select", "raw_gather_index_select"),
        "index_select_storage_vs_lazy_tensor_storage": ("stream_index_select", "stream"),
    }
    print_ratios({name: paired_ratio(times, theirs, ours) for name, (ours, theirs) in throughput.items()})
    print(f"RATIO prefetch_wait_fraction {waited / wall:.4f}")


if __name__ == "__main__":
    main()
