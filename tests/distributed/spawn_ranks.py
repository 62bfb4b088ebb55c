"""Runs a function on several gloo ranks in fresh processes bound to 127.0.0.1."""
from __future__ import annotations

import os
import socket
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, fn, port: int, world_size: int, args: tuple) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=60))
    try:
        fn(rank, world_size, *args)
    finally:
        dist.destroy_process_group()


def spawn(fn, *args, nprocs: int = 2, timeout: float = 120.0) -> None:
    """Runs ``fn(rank, world_size, *args)`` on ``nprocs`` ranks and joins them all.

    A rank's exception is raised here (``ProcessRaisedException``, the others are
    terminated); ranks still running after ``timeout`` seconds are killed and the call
    fails, so a desynchronised collective cannot hang the tests.
    """
    context = mp.start_processes(
        _entry, args=(fn, free_port(), nprocs, args), nprocs=nprocs, join=False,
        start_method="spawn",
    )
    deadline = time.monotonic() + timeout
    while not context.join(timeout=0.5):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
                process.join()
            raise AssertionError(f"the {nprocs} ranks were still running after {timeout} s")
    assert all(process.exitcode == 0 for process in context.processes)
