"""Which TCP ports a process tree listens on, read from /proc (Linux): the check behind "a local Ray listens on
127.0.0.1 only"."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

LISTEN_STATE = "0A"  # TCP_LISTEN in /proc/net/tcp{,6}


@dataclass(frozen=True)
class Listener:
    """One listening socket: its address, port, and the process that holds it."""

    address: str
    port: int
    pid: int
    process: str

    @property
    def loopback(self) -> bool:
        """True for 127.0.0.0/8, ::1 and IPv4-mapped loopback (``::ffff:127.0.0.1``)."""
        ip = ipaddress.ip_address(self.address)
        mapped = getattr(ip, "ipv4_mapped", None)
        return (mapped or ip).is_loopback


def process_tree(root: int) -> set[int]:
    """``root`` and every process descended from it (children found through /proc/<pid>/stat)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    tree, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent and pid not in tree]
        tree.update(children)
        frontier.extend(children)
    return tree


def listeners(pids: set[int]) -> list[Listener]:
    """Every TCP socket in LISTEN state held by one of ``pids`` (IPv4 and IPv6)."""
    owners: dict[str, int] = {}
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    owners[target[8:-1]] = pid
        except OSError:
            continue
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != LISTEN_STATE or inode not in owners:
                continue
            hex_ip, hex_port = local.split(":")
            pid = owners[inode]
            found.append(Listener(_decode_ip(hex_ip), int(hex_port, 16), pid, _process_name(pid)))
    return found


def _decode_ip(hex_ip: str) -> str:
    """/proc/net/tcp stores addresses as 32-bit words in host byte order (little-endian here)."""
    raw = bytes.fromhex(hex_ip)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words))


def _process_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"
