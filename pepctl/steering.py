"""The control plane's side of tc/pep_steer.h: map names and reason codes.

Keep REASONS in the order of `enum steer_reason`; tests/unit/test_steering_contract.py
checks it against the header. Every map read and write goes through bpf(2) (pepctl/bpfsys.py).
"""

from __future__ import annotations

import os
import struct

from . import bpfsys

MAPS = ("vlan_ports", "port_vlans", "vlan_stats", "reason_stats")

REASONS = (
    "pass_untagged",
    "pass_unknown_vlan",
    "pass_other_tpid",
    "drop_runt",
    "drop_nested_tag",
    "drop_pop_failed",
    "drop_push_failed",
    "drop_unknown_port",
)

# Layouts (native byte order, as the kernel stores them).
VLAN_PORT = struct.Struct("=II")        # ifindex, flags
PORT_VLAN = struct.Struct("=II")        # vid, trunk_ifindex
VLAN_STATS = struct.Struct("=QQQQ")     # in_packets, in_bytes, out_packets, out_bytes
U32 = struct.Struct("=I")
U64 = struct.Struct("=Q")


def open_map(pins: str, name: str) -> bpfsys.Map:
    if name not in MAPS:
        raise ValueError(f"{name!r} is no steering map; the maps are {', '.join(MAPS)}")
    return bpfsys.Map(os.path.join(pins, "maps", name))


def set_port(pins: str, vid: int, port_ifindex: int, trunk_ifindex: int) -> None:
    """VLAN vid <-> port: the trunk's frames of vid leave by the port, the port's frames get tag vid."""
    with open_map(pins, "port_vlans") as m:
        m.update(U32.pack(port_ifindex), PORT_VLAN.pack(vid, trunk_ifindex))
    with open_map(pins, "vlan_ports") as m:
        m.update(U32.pack(vid), VLAN_PORT.pack(port_ifindex, 0))


def vlan_counters(pins: str, vid: int) -> dict[str, int]:
    """vlan_stats of vid, summed over CPUs."""
    names = ("in_packets", "in_bytes", "out_packets", "out_bytes")
    totals = [0, 0, 0, 0]
    with open_map(pins, "vlan_stats") as m:
        for raw in m.lookup_percpu(U32.pack(vid)):
            totals = [a + b for a, b in zip(totals, VLAN_STATS.unpack(raw), strict=True)]
    return dict(zip(names, totals, strict=True))


def reason_counters(pins: str) -> dict[str, int]:
    """reason_stats (enum steer_reason), summed over CPUs."""
    with open_map(pins, "reason_stats") as m:
        return {name: sum(U64.unpack(v)[0] for v in m.lookup_percpu(U32.pack(i))) for i, name in enumerate(REASONS)}
