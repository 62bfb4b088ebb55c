"""Forward + backward time of ResetRNN against its anchors, measured side by side.

Every candidate runs once per round, in turn, on the same input and reset flags
(about one reset per ``--reset-every`` steps per row, at random positions); the
script prints the median of the per-round ratios as ``RATIO <name> <value>``
(lower is better for ResetRNN), and the median times in milliseconds.

Candidates: ``ResetRNN`` over ``nn.GRU`` and ``nn.LSTM`` on every backend that runs
them (``auto``, ``loop``, ``packed``, ``fused``), a ``MinGRUCell`` on ``scan``; anchors:
``nn.GRU`` / ``nn.LSTM`` without resets (cuDNN on CUDA: the speed of light), TorchRL's
``GRUModule`` in recurrent mode with ``is_init`` at the same steps (alone, and inside
``ResetRNN``: its own backend with our resets), and a plain
``nn.GRUCell`` loop with ``torch.where``. ``gru_gemm_floor`` / ``lstm_gemm_floor`` run only
the matrix products of the ``fused`` layer's forward and backward (the same shapes, one
per step each way, the input's product and the weight gradients), no other op: no layer that
steps the recurrence with these products runs faster on this BLAS, so ``*_gemm_floor_vs_*``
says how close to the native module any such layer could come, and
``resetrnn_*_fused_vs_gemm_floor`` what the rest of the layer (gates, resets, calls) adds.

    python benchmarks/bench_recurrent.py                        # CPU, B=32, T=64, H=256
    python benchmarks/bench_recurrent.py --preset gpu --device cuda   # B=64, T=64, H=512
    python benchmarks/bench_recurrent.py --quick                # same code paths, seconds on CPU
"""
import argparse
import statistics
import time

import torch
from tensordict import TensorDict
from torch import nn
from torchrl.modules import GRUModule

from timing import paired_ratio, print_ratios  # benchmarks/timing.py
from toolkit import options  # benchmarks/toolkit.py: the recipes' option checks

from torchrl_seqchunk import MinGRUCell, ResetRNN

PRESETS = {
    # B, T, input, hidden, mean steps between resets, rounds, warmup
    "cpu": dict(batch=32, time=64, input=64, hidden=256, reset_every=20.0, rounds=30, warmup=3),
    "gpu": dict(batch=64, time=64, input=512, hidden=512, reset_every=200.0, rounds=30, warmup=5),
    "quick": dict(batch=4, time=16, input=8, hidden=16, reset_every=5.0, rounds=2, warmup=1),
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="Sizes default to the preset; any size flag given overrides it.",
    )
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                        help="where everything runs (default cpu; cuda: cuDNN anchors, auto picks packed)")
    parser.add_argument("--preset", default="cpu", choices=sorted(PRESETS),
                        help="cpu: B=32 T=64 H=256, resets every 20 steps; gpu: B=64 T=64 H=512, "
                             "resets every 200 steps (an episode of a few hundred steps); quick: "
                             "tiny sizes, 2 rounds")
    parser.add_argument("--quick", action="store_true",
                        help="the quick preset: every code path in seconds on CPU (for CI)")
    for flag, kind, text in [
        ("--batch", int, "rows B"), ("--time", int, "steps T"), ("--input", int, "input features"),
        ("--hidden", int, "hidden units H"), ("--reset-every", float, "mean steps between resets"),
        ("--rounds", int, "timed rounds"), ("--warmup", int, "untimed rounds first"),
    ]:
        parser.add_argument(flag, type=kind, default=None, help=f"{text} (default: the preset's)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (1 by default: stable figures on a shared machine)")
    parser.add_argument("--seed", type=int, default=0)
    chosen = parser.parse_known_args(argv)[0]  # the preset gives the sizes not given
    parser.set_defaults(**PRESETS["quick" if chosen.quick else chosen.preset])
    return options.parse(parser, argv, ints={"batch": 1, "time": 1, "input": 1, "hidden": 1, "rounds": 1,
                                             "warmup": 0, "threads": 1, "seed": 0},
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


def gemm_floor(args, gates: int, device):
    """The fused layer's matrix products alone, on random values of its shapes (``gates`` = 3 for
    a GRU, 4 for an LSTM); the call returns an empty scalar, its backward free."""
    b, t, size = args.batch, args.time, args.hidden
    width = gates * size
    x, w_ih, bias = (torch.randn(*shape, device=device) for shape in ((t * b, args.input), (width, args.input), (width,)))
    w_hh, states, grads = (torch.randn(*shape, device=device) for shape in ((width, size), (t, b, size), (t, b, width)))
    w_hh_t, out = w_hh.t().contiguous(), torch.empty(t, b, width, device=device)
    done = torch.zeros((), device=device, requires_grad=True)

    def products():
        torch.addmm(bias, x, w_ih.t(), out=out.view(t * b, width))  # every step's input product
        for step in range(t):  # forward: W_hh h per step
            out[step].addmm_(states[step], w_hh_t)
        for step in range(t):  # backward: the state gradient per step
            torch.mm(grads[step], w_hh)
        flat = grads.view(t * b, width)
        flat @ w_ih, flat.t() @ x, flat.t() @ states.view(t * b, size)  # dx, dW_ih, dW_hh
        return done

    return products


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

    def reset_rnn(rnn, backend):
        module = ResetRNN(rnn, carry=False, default_recurrent_mode=True, backend=backend)
        return lambda: module(chunk.copy())["features"]

    torchrl_gru = GRUModule(
        gru=gru, in_keys=["embed", "rs", "is_init"], out_keys=["features", ("next", "rs")],
        default_recurrent_mode=True,
    )
    torchrl_chunk = TensorDict(
        {"embed": x, "is_init": is_first, "rs": torch.zeros(b, t, 1, args.hidden, device=device)},
        [b, t],
    )
    candidates = {"gru_noreset": lambda: gru(x)[0], "lstm_noreset": lambda: lstm(x)[0]}
    for backend in ("auto", "loop", "packed", "fused"):
        candidates[f"gru_{backend}"] = reset_rnn(gru, backend)
        candidates[f"lstm_{backend}"] = reset_rnn(lstm, backend)
    candidates["mingru_scan"] = reset_rnn(MinGRUCell(args.input, args.hidden).to(device), "scan")
    candidates["torchrl_grumodule"] = lambda: torchrl_gru(torchrl_chunk.copy())["features"]
    wrapped = {backend: ResetRNN(torchrl_gru, carry=False, default_recurrent_mode=True, backend=backend)
               for backend in ("auto", "torchrl")}  # auto: ours on its nn.GRU; torchrl: its own backend
    for backend, module in wrapped.items():
        candidates[f"grumodule_{backend}"] = lambda module=module: module(chunk.copy())["features"]
    candidates["cell_loop"] = lambda: cell_loop(cell, x, is_first)
    candidates["gru_gemm_floor"] = gemm_floor(args, 3, device)
    candidates["lstm_gemm_floor"] = gemm_floor(args, 4, device)
    return candidates


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is visible; run with --device cpu.")
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

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(
        f"# device={device} ({name}) B={args.batch} T={args.time} input={args.input} "
        f"hidden={args.hidden} reset_every={args.reset_every} threads={torch.get_num_threads()} "
        f"rounds={args.rounds}"
    )
    for key, values in times.items():
        print(f"# {key:20s} {1e3 * statistics.median(values):8.2f} ms")

    pairs = {  # RATIO name: (candidate, reference), each a time ratio (lower is better)
        "resetrnn_vs_gru_noreset": ("gru_auto", "gru_noreset"),
        "resetrnn_vs_torchrl_grumodule": ("gru_auto", "torchrl_grumodule"),
        # TorchRL's GRUModule inside ResetRNN (our resets and carry) against ResetRNN on the same
        # nn.GRU: by default (our kernel on its nn.GRU), and on TorchRL's own backend
        "resetrnn_of_grumodule_vs_resetrnn": ("grumodule_auto", "gru_auto"),
        "resetrnn_of_grumodule_torchrl_backend_vs_torchrl_grumodule": ("grumodule_torchrl", "torchrl_grumodule"),
        "resetrnn_vs_cell_loop": ("gru_auto", "cell_loop"),
        "resetrnn_lstm_vs_lstm_noreset": ("lstm_auto", "lstm_noreset"),
        "resetrnn_packed_vs_gru_noreset": ("gru_packed", "gru_noreset"),
    }
    for backend in ("loop", "packed", "fused"):
        pairs[f"resetrnn_gru_{backend}_vs_gru_noreset"] = (f"gru_{backend}", "gru_noreset")
        pairs[f"resetrnn_lstm_{backend}_vs_lstm_noreset"] = (f"lstm_{backend}", "lstm_noreset")
    pairs["resetrnn_mingru_scan_vs_gru_noreset"] = ("mingru_scan", "gru_noreset")
    for rnn in ("gru", "lstm"):
        pairs[f"{rnn}_gemm_floor_vs_{rnn}_noreset"] = (f"{rnn}_gemm_floor", f"{rnn}_noreset")
        pairs[f"resetrnn_{rnn}_fused_vs_gemm_floor"] = (f"{rnn}_fused", f"{rnn}_gemm_floor")
    print_ratios({name: paired_ratio(times, *pair) for name, pair in pairs.items()})

if __name__ == "__main__":
    main()
