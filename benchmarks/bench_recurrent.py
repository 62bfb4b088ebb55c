"""Forward + backward time of ResetRNN against its anchors, measured side by side.

Every candidate runs once per round, in turn, on the same input and reset flags
(about one reset per ``--reset-every`` steps per row, at random positions); the
script prints the median of the per-round ratios as ``RATIO <name> <value>``
(lower is better for ResetRNN), and the median times in milliseconds.

    python benchmarks/bench_recurrent.py                       # CPU, B=32, T=64
    python benchmarks/bench_recurrent.py --device cuda --batch 256

Anchors: ``nn.GRU`` / ``nn.LSTM`` without resets (the speed of light), TorchRL's
``GRUModule`` in recurrent mode with ``is_init`` at the same steps, and a plain
``nn.GRUCell`` loop with ``torch.where``.
"""
import argparse
import statistics
import time

import torch
from tensordict import TensorDict
from torch import nn
from torchrl.modules import GRUModule

from torchrl_seqchunk import ResetRNN

from toolkit import options  # benchmarks/toolkit.py: the option checks of examples/common


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--time", type=int, default=64)
    parser.add_argument("--input", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--reset-every", type=float, default=20.0, help="mean steps between resets")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--threads", type=int, default=1,
        help="torch CPU threads (1 by default: stable figures on a shared machine)",
    )
    parser.add_argument("--seed", type=int, default=0)
    return options.parse(parser, ints={"batch": 1, "time": 1, "input": 1, "hidden": 1, "rounds": 1, "warmup": 0,
                                       "threads": 1, "seed": 0},
                         reals={"reset_every": (1.0, None)}, devices=["device"])


def cell_loop(cell, x, is_first):
    """The usual hand-written baseline: nn.GRUCell over time, torch.where at resets."""
    h = x.new_zeros(x.shape[0], cell.hidden_size)
    outputs = []
    for t in range(x.shape[1]):
        h = torch.where(is_first[:, t], torch.zeros_like(h), h)
        h = cell(x[:, t], h)
        outputs.append(h)
    return torch.stack(outputs, 1)


def build(args, device):
    generator = torch.Generator().manual_seed(args.seed)
    b, t = args.batch, args.time
    x = torch.randn(b, t, args.input, generator=generator).to(device).requires_grad_()
    is_first = (torch.rand(b, t, 1, generator=generator) < 1 / args.reset_every).to(device)
    gru = nn.GRU(args.input, args.hidden, batch_first=True).to(device)
    lstm = nn.LSTM(args.input, args.hidden, batch_first=True).to(device)
    cell = nn.GRUCell(args.input, args.hidden).to(device)
    cell.load_state_dict({k[: -len("_l0")]: v for k, v in gru.state_dict().items()})
    chunk = TensorDict({"embed": x, "is_first": is_first}, [b, t])
    reset_gru = ResetRNN(gru, carry=False, default_recurrent_mode=True)  # backend "auto": loop on CPU, packed on CUDA
    packed_gru = ResetRNN(gru, carry=False, default_recurrent_mode=True, backend="packed")
    reset_lstm = ResetRNN(lstm, carry=False, default_recurrent_mode=True)
    torchrl_gru = GRUModule(
        gru=gru, in_keys=["embed", "rs", "is_init"], out_keys=["features", ("next", "rs")],
        default_recurrent_mode=True,
    )
    torchrl_chunk = TensorDict(
        {"embed": x, "is_init": is_first, "rs": torch.zeros(b, t, 1, args.hidden, device=device)},
        [b, t],
    )
    return {
        "gru_noreset": lambda: gru(x)[0],
        "lstm_noreset": lambda: lstm(x)[0],
        "resetrnn": lambda: reset_gru(chunk.copy())["features"],
        "resetrnn_packed": lambda: packed_gru(chunk.copy())["features"],
        "resetrnn_lstm": lambda: reset_lstm(chunk.copy())["features"],
        "torchrl_grumodule": lambda: torchrl_gru(torchrl_chunk.copy())["features"],
        "cell_loop": lambda: cell_loop(cell, x, is_first),
    }


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    candidates = build(args, device)

    def run(forward):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        forward().sum().backward()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    for _ in range(args.warmup):
        for forward in candidates.values():
            run(forward)
    times = {name: [] for name in candidates}
    for _ in range(args.rounds):
        for name, forward in candidates.items():
            times[name].append(run(forward))

    print(
        f"# device={device} B={args.batch} T={args.time} input={args.input} "
        f"hidden={args.hidden} reset_every={args.reset_every} threads={torch.get_num_threads()} "
        f"rounds={args.rounds}"
    )
    for name, values in times.items():
        print(f"# {name:20s} {1e3 * statistics.median(values):8.2f} ms")

    def ratio(name, a, b):
        value = statistics.median(x / y for x, y in zip(times[a], times[b]))
        print(f"RATIO {name} {value:.3f}")

    ratio("resetrnn_vs_gru_noreset", "resetrnn", "gru_noreset")
    ratio("resetrnn_vs_torchrl_grumodule", "resetrnn", "torchrl_grumodule")
    ratio("resetrnn_vs_cell_loop", "resetrnn", "cell_loop")
    ratio("resetrnn_lstm_vs_lstm_noreset", "resetrnn_lstm", "lstm_noreset")
    ratio("resetrnn_packed_vs_gru_noreset", "resetrnn_packed", "gru_noreset")


if __name__ == "__main__":
    main()
