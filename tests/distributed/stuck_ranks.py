"""Ranks for benchmarks/timing.rank_zero_result that end in the ways it must handle."""
import time


def puts_then_hangs(rank: int, world_size: int, port: int, args, results) -> None:
    """Rank 0 reports, then never ends (as a rank stuck in its process group's teardown)."""
    if rank == 0:
        results.put(42.0)
        time.sleep(600)


def rank_one_raises(rank: int, world_size: int, port: int, args, results) -> None:
    if rank == 1:
        raise ValueError("rank 1 failed")
    time.sleep(600)  # rank 0 waits, as in a collective, until it is terminated


def puts_nothing(rank: int, world_size: int, port: int, args, results) -> None:
    pass
