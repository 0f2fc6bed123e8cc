"""The control group: which subscribers the PEP leaves alone, and what a measured flow's record says.

`[graph.experiment] control_fraction = F` makes the datapath bypass every new flow of a stable,
hash-chosen share F of subscribers (tc/pep_flow.h, verdict BYPASS_CONTROL). The choice is
keyed by the client address alone, so a subscriber stays in one group whatever port or server
it uses, across reloads and restarts; `seed` draws another share.

While a graph's experiment is on, the datapath measures every flow opened from the access side
in both groups (proxied: "treated", bypassed by the control: "control") as the subscriber sees
it, at c_in's ingress: from the first SYN to the last ACK that acknowledged new data, the bytes
acknowledged (download) and sent (upload). When the client ends the flow (FIN or RST) it pushes
a record on the instance's `flow_records` queue; the exporter (pepctl/exporter.py) pops them,
counts them in pep_experiment_* and appends them as JSON lines to the instance's
experiment log, which `pepctl report` reads (pepctl/report.py). Only flows the subscriber ends
are recorded: one reset by the other end, or abandoned, is forgotten (the datapath sees only
the subscriber's segments), so the report compares completed flows.

This module follows tc/pep_flow.h (client_hash, struct flow_record); tests/unit/test_flow_contract.py
compares them.
"""

from __future__ import annotations

import ipaddress
import struct
import time

from .flow_maps import decode_key

GROUPS = {1: "treated", 2: "control"}            # enum flow_group
CLOSED_BY = {1: "fin", 2: "rst"}                 # enum flow_end
HASH_SPACE = 1 << 32

# struct flow_record: key (a FLOW_KEY of pepctl/flow_maps.py), start_ns, last_ack_ns, bytes_down,
# bytes_up, group, closed_by, pad.
FLOW_RECORD = struct.Struct("=40sQQQQBB6x")

# Flow size classes (bytes downloaded), for the report and the exporter's labels: decimal
# units, so a 10 MiB object (10.5 MB) is "10M+".
SIZE_CLASSES = ((0, "0-10k"), (10_000, "10k-100k"), (100_000, "100k-1M"), (1_000_000, "1M-10M"),
                (10_000_000, "10M+"))


def size_class(nbytes: int) -> str:
    label = SIZE_CLASSES[0][1]
    for low, name in SIZE_CLASSES:
        if nbytes >= low:
            label = name
    return label


def _fmix32(h: int) -> int:
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    h ^= h >> 16
    return h


def client_hash(address: str, seed: int = 0) -> int:
    """client_hash() of tc/pep_flow.h: the address as the datapath keys it (IPv4 as
    ::ffff:a.b.c.d), four 32-bit words as they lie in memory (little-endian), folded with
    murmur3's finaliser."""
    ip = ipaddress.ip_address(address)
    packed = (ipaddress.IPv6Address(f"::ffff:{ip}") if ip.version == 4 else ip).packed
    h = (seed ^ 0x9E3779B9) & 0xFFFFFFFF
    for (word,) in struct.iter_unpack("<I", packed):
        h = _fmix32(h ^ word)
    return h


def control_below(fraction: float) -> int:
    """The hash threshold of a control fraction: clients whose hash is below it are the control."""
    return min(HASH_SPACE - 1, round(fraction * HASH_SPACE))


def group_of(address: str, fraction: float, seed: int = 0) -> str:
    """The group the datapath puts a client in."""
    return "control" if client_hash(address, seed) < control_below(fraction) else "treated"


def decode_record(raw: bytes, boot_offset: float, graph_names: dict[int, str]) -> dict:
    """A struct flow_record as the experiment log's line. boot_offset: the wall clock minus the
    monotonic clock (bpf_ktime_get_ns), to date the flow's end."""
    key, start, last_ack, down, up, group, closed_by = FLOW_RECORD.unpack(raw)
    k = decode_key(key)
    return {"end": round(last_ack / 1e9 + boot_offset, 6), "graph": graph_names.get(k["graph"], str(k["graph"])),
            "group": GROUPS.get(group, f"unknown({group})"), "client": k["subscriber"], "server": k["origin"],
            "server_port": k["org_port"], "bytes_down": down, "bytes_up": up,
            "seconds": round((last_ack - start) / 1e9, 6), "closed_by": CLOSED_BY.get(closed_by, "?")}


def boot_offset() -> float:
    """time.time() - CLOCK_MONOTONIC: bpf_ktime_get_ns() counts on the monotonic clock."""
    return time.time() - time.clock_gettime(time.CLOCK_MONOTONIC)
