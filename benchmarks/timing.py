"""Timing helper shared by the benchmark scripts."""
import time


def seconds_per_call(fn, repeat=1):
    """Mean wall-clock seconds per call of ``fn`` over ``repeat`` back-to-back calls."""
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat
