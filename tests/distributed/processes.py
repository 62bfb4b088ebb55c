"""What a test's child processes run and where they listen, read from Linux's /proc."""
import ipaddress
import os
from pathlib import Path


def marked_processes(marker: str) -> dict[int, str]:
    """pid -> name of every process whose environment holds ``marker`` ("NAME=value")."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "environ").read_bytes().split(b"\0"):
                    found[int(entry.name)] = (entry / "comm").read_text().strip()
            except OSError:  # ended meanwhile, or another user's
                pass
    return found


def _address(hex_ip: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An address of /proc/net/tcp{,6}: 32-bit words in host (little-endian) byte order."""
    raw = bytes.fromhex(hex_ip)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(words)


def listening_addresses(pids) -> set:
    """The local addresses on which the processes ``pids`` have TCP sockets listening."""
    inodes = set()
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[len("socket:["):-1])
        except OSError:
            pass
    addresses = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # state LISTEN
                addresses.add(_address(fields[1].split(":")[0]))
    return addresses


def is_loopback(address) -> bool:
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1
    return address.is_loopback or (mapped is not None and mapped.is_loopback)
