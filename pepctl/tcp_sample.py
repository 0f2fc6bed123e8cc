"""TCP health of the proxy's own sockets: a bounded sample of tcp_info, per graph and side.

Why inet_diag and not a BPF program: a program on every ACK (sockops, fentry on tcp_ack) costs
every packet of every connection, at 100k connections and all the time. A sock_diag dump costs
only when it runs, and is bounded here: every SAMPLE_INTERVAL seconds the exporter reads at most
SAMPLE_CAP established sockets of each graph, then closes the netlink socket, and the kernel
stops the dump there (it fills one reply buffer at a time, as the reader asks). So the cost per
round is flat whatever the number of connections: it grows with the number of graphs only.
Which sockets a round sees is the kernel's hash-table order, not chosen by age or size.

Every established TCP socket in a graph's namespace is the proxy's: HAProxy accepts there
(`bind ... namespace`) and connects from there (`server ... namespace`); bypassed flows have no
socket. A socket whose remote end is in the graph's access networks faces the subscribers
("access"); any other faces the origin.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from dataclasses import dataclass

from .nsutil import TCP_ESTABLISHED, in_netns, sock_diag

SAMPLE_INTERVAL = 5.0     # seconds between rounds
SAMPLE_CAP = 256          # sockets per graph per round
INET_DIAG_INFO = 2
# struct tcp_info (linux/tcp.h): the fields read here, at their offsets.
_TCPI = {"rtt_us": (68, "I"), "total_retrans": (100, "I"), "bytes_acked": (120, "Q"),
         "bytes_received": (128, "Q"), "min_rtt_us": (148, "I"), "data_segs_out": (156, "I"),
         "delivery_rate": (160, "Q")}
_TCPI_MIN = 168                      # a tcp_info this long holds every field above


@dataclass(frozen=True)
class Sample:
    remote: str
    rtt: float              # seconds
    min_rtt: float          # seconds
    delivery_rate: float    # bytes per second
    retransmit_ratio: float
    bytes: int              # acknowledged + received


def _parse_info(raw: bytes) -> dict[str, int]:
    return {k: struct.unpack_from("=" + code, raw, off)[0] for k, (off, code) in _TCPI.items()}


def _sample_of(family: int, sockid: tuple, info: bytes) -> Sample:
    dst = sockid[3][:4] if family == socket.AF_INET else sockid[3]
    t = _parse_info(info)
    return Sample(remote=socket.inet_ntop(family, dst), rtt=t["rtt_us"] / 1e6, min_rtt=t["min_rtt_us"] / 1e6,
                  delivery_rate=float(t["delivery_rate"]),
                  retransmit_ratio=t["total_retrans"] / t["data_segs_out"] if t["data_segs_out"] else 0.0,
                  bytes=t["bytes_acked"] + t["bytes_received"])


def _dump(family: int, cap: int) -> tuple[list[Sample], bool]:
    """Up to cap established sockets of family with their tcp_info; True if the cap cut it short."""
    out: list[Sample] = []
    dump = sock_diag(family, 1 << TCP_ESTABLISHED, 1 << (INET_DIAG_INFO - 1))
    try:
        for sockid, attrs in dump:
            info = attrs.get(INET_DIAG_INFO, b"")
            if len(info) >= _TCPI_MIN:
                out.append(_sample_of(family, sockid, info))
            if len(out) >= cap:
                return out, True
    finally:
        dump.close()   # a dump left unread stops here
    return out, False


def sample(ns: str, cap: int = SAMPLE_CAP) -> tuple[list[Sample], bool]:
    """Up to cap established TCP sockets of namespace ns (IPv4 first, then IPv6)."""
    def both():
        v4, capped = _dump(socket.AF_INET, cap)
        if capped:
            return v4, True
        v6, capped = _dump(socket.AF_INET6, cap - len(v4))
        return v4 + v6, capped
    return in_netns(ns, both)


def side_of(remote: str, access_networks) -> str:
    ip = ipaddress.ip_address(remote)
    return "access" if any(ip.version == n.version and ip in n for n in access_networks) else "origin"
