"""torch.distributed on the loopback interface: a rendezvous store and a process group bound to 127.0.0.1."""
from __future__ import annotations

import os
import socket
import sys
from datetime import timedelta

import torch.distributed as dist


def loopback_store() -> dist.TCPStore:
    """The ranks' rendezvous: a torch.distributed store served from this process on a socket bound
    to 127.0.0.1 (a TCPStore binding its own socket listens on every interface). Ranks join it
    with join_loopback_group(..., store.port)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    return dist.TCPStore("127.0.0.1", listener.getsockname()[1], is_master=True,
                         master_listen_fd=listener.detach(), wait_for_workers=False)


def join_loopback_group(backend: str, rank: int, world_size: int, port: int) -> None:
    """torch.distributed's default group through the loopback_store on `port`; gloo's own
    sockets on the loopback interface too (unless GLOO_SOCKET_IFNAME says otherwise)."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo0" if sys.platform == "darwin" else "lo")
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(minutes=5))
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timedelta(minutes=5))
