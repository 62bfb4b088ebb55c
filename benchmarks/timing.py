"""Timing and reporting helpers shared by the benchmark scripts."""
import csv
import statistics
import time
from pathlib import Path


def seconds_per_call(fn, repeat=1):
    """Mean wall-clock seconds per call of ``fn`` over ``repeat`` back-to-back calls."""
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat


def paired_ratio(times: dict[str, list[float]], numerator: str, denominator: str) -> float:
    """The median over interleaved rounds of ``times[numerator][i] / times[denominator][i]``
    (each round's pair under the same machine load)."""
    return statistics.median(x / y for x, y in zip(times[numerator], times[denominator]))


def print_ratios(ratios: dict[str, float]) -> None:
    """Prints ``RATIO <name> <value>`` per ratio, in order."""
    for name, value in ratios.items():
        print(f"RATIO {name} {value:.3f}")


def write_figures(rows: list[dict], ratios: dict[str, float], path: Path) -> None:
    """Prints ``RATIO <name> <value>`` per ratio and writes ``rows`` (name, value, unit, note) as the CSV ``path``."""
    print_ratios(ratios)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["name", "value", "unit", "note"])
        writer.writeheader()
        writer.writerows(rows)


def rank_zero_result(rank_fn, world_size: int, args, teardown_s: float = 30.0):
    """Spawns ``rank_fn(rank, world_size, port, args, results)`` for every rank, the ranks
    meeting at a loopback store on ``port``; returns what rank 0 puts in ``results``.

    A rank that raises fails the call (torch's ``ProcessRaisedException``). Ranks still
    running ``teardown_s`` seconds after rank 0's result came are terminated, with a warning:
    gloo's process group can deadlock in its destructor (the main thread holding the GIL while
    it joins gloo's work thread, which waits for the GIL), and the figure is in by then."""
    import warnings

    import torch.multiprocessing as mp
    from torchrl_seqchunk.recipes.common.loopback import loopback_store

    results = mp.get_context("spawn").SimpleQueue()
    store = loopback_store()  # the ranks' rendezvous, on 127.0.0.1
    context = mp.start_processes(rank_fn, args=(world_size, store.port, args, results), nprocs=world_size,
                                 join=False, start_method="spawn")
    deadline = None  # set when rank 0's result is in
    while not context.join(timeout=0.5):
        if deadline is None and not results.empty():
            result, deadline = results.get(), time.monotonic() + teardown_s
        if deadline is not None and time.monotonic() > deadline:
            stuck = [p.pid for p in context.processes if p.is_alive()]
            warnings.warn(f"ranks {stuck} were still tearing down {teardown_s:g} s after rank 0's result; "
                          "terminated them.", RuntimeWarning, stacklevel=2)
            for process in context.processes:
                process.terminate()
                process.join()
            break
    if deadline is None:  # every rank ended before the result was read
        if results.empty():
            raise RuntimeError(f"{rank_fn.__name__}: every rank exited and rank 0 put no result.")
        result = results.get()
    return result
