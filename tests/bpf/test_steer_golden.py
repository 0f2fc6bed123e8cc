"""Golden-packet tests of the VLAN steering datapath (tc/steer.o), run in the kernel by
BPF_PROG_TEST_RUN.

    trunk frame --[trunk_ingress]--> verdict, bytes left, counters
    port frame  --[port_ingress]---> (ctx.ifindex = the port it arrived on)

    vlan_ports: VID 100 -> ifindex 7, VID 200 -> 9, VID 4011 (0xFAB) -> 11, others 0
    port_vlans: ifindex 7 -> VID 100, 9 -> 200, 11 -> 4011 (all trunk 3); 13 and 1 (lo): none

How right is told from wrong: each case runs one scapy-made frame and checks the verdict
(TC_ACT_*), the bytes the program leaves, and the exact change of every watched counter
(all of reason_stats, vlan_stats of the VIDs in play): a counter that should not move must
not. test_run does not carry out a redirect, so its target shows as which VID's vlan_stats
moved; each VID belongs to a distinct port. The kernel resolves ctx.ifindex in the caller's
namespace, so ifindexes 7, 9, 11, 13 are veths in a private namespace, where the runs happen.

test_run hands a tc program the 802.1Q tag in-band (its ctx may not set vlan_* fields); the
metadata form that live veths give is left to the namespace tests.
"""

from __future__ import annotations

import re
import struct
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.inet6 import ICMPv6ND_NS, ICMPv6NDOptSrcLLAddr, IPv6
from scapy.layers.l2 import ARP, Dot1AD, Dot1Q, Ether
from scapy.packet import Packet

from pepctl import bpfsys

REPO = Path(__file__).resolve().parents[2]
HEADER = REPO / "tc" / "pep_steer.h"
OBJECT = REPO / "tc" / "steer.o"

# enum steer_reason of tc/pep_steer.h, in order (test_reasons_match_header keeps them equal)
REASONS = ["PASS_UNTAGGED", "PASS_UNKNOWN_VLAN", "PASS_OTHER_TPID", "DROP_RUNT", "DROP_NESTED_TAG",
           "DROP_POP_FAILED", "DROP_PUSH_FAILED", "DROP_UNKNOWN_PORT"]
STATS_FIELDS = ("in_packets", "in_bytes", "out_packets", "out_bytes")  # struct vlan_stats

TC_ACT_OK, TC_ACT_SHOT, TC_ACT_REDIRECT = 0, 2, 7
VERDICTS = {TC_ACT_OK: "TC_ACT_OK", TC_ACT_SHOT: "TC_ACT_SHOT", TC_ACT_REDIRECT: "TC_ACT_REDIRECT"}

TRUNK = 3
VLAN_PORTS = {100: 7, 200: 9, 4011: 11}     # VID -> port ifindex
PORT_VLANS = {7: 100, 9: 200, 11: 4011}     # port ifindex -> VID
UNKNOWN_PORT = 13
# Byte-order decoys for 4011 = 0x0FAB. A TCI read without ntohs turns the bytes AB 0F
# (PCP 5, VID 0xB0F) into 0x0FAB; 0xBAF is 0xFAB with its nibbles reversed.
DECOY_SWAPPED, DECOY_REVERSED = 0xB0F, 0xBAF
WATCHED_VIDS = (0, 100, 200, 300, 4011, DECOY_SWAPPED, DECOY_REVERSED)
SKB_IFINDEX_OFF = 40  # offsetof(struct __sk_buff, ifindex); the ctx we pass ends there

# Lab addresses (design.md): access 198.18.0.0/24, origin 198.19.0.0/24
MACS = {"src": "02:00:00:00:01:0a", "dst": "02:00:00:00:01:01"}
V4_TCP = IP(src="198.18.0.10", dst="198.19.0.10") / TCP(sport=40000, dport=80, flags="S")
V6_UDP = IPv6(src="2001:2:0:2::10", dst="2001:2:0:1::10") / UDP(sport=443, dport=50000) / b"quic"
V4_ARP = ARP(hwsrc=MACS["src"], psrc="198.18.0.10", pdst="198.18.0.1")
V6_NS = (IPv6(src="2001:2:0:2::10", dst="ff02::1:ff00:1", hlim=255)
         / ICMPv6ND_NS(tgt="2001:2:0:2::1") / ICMPv6NDOptSrcLLAddr(lladdr=MACS["src"]))
BCAST = {"src": MACS["src"], "dst": "ff:ff:ff:ff:ff:ff"}
MCAST6 = {"src": MACS["src"], "dst": "33:33:ff:00:00:01"}


def steered_in(vid: int, out: Packet) -> dict[str, int]:
    """Counters of a frame popped and sent to VID's port: bytes are counted untagged."""
    return {f"vlan{vid}.in_packets": 1, f"vlan{vid}.in_bytes": len(out)}


def steered_out(vid: int, frame: Packet) -> dict[str, int]:
    return {f"vlan{vid}.out_packets": 1, f"vlan{vid}.out_bytes": len(frame)}


def reason(name: str) -> dict[str, int]:
    return {f"reason.{name}": 1}


@dataclass
class Case:
    id: str
    desc: str
    prog: str                  # trunk_ingress | port_ingress
    frame: Packet | bytes
    verdict: int
    out: Packet | bytes | None  # None: the frame must come out unchanged
    counters: dict[str, int] = field(default_factory=dict)
    ifindex: int | None = None  # ctx ifindex for port_ingress (None: no ctx, i.e. lo)


def tagged(vid: int, payload: Packet, l2=MACS, **tag) -> Packet:
    return Ether(**l2) / Dot1Q(vlan=vid, **tag) / payload


CASES = [
    Case("untagged-v4", "untagged IPv4 TCP goes to the host stack untouched",
         "trunk_ingress", Ether(**MACS) / V4_TCP, TC_ACT_OK, None, reason("PASS_UNTAGGED")),
    Case("vid100-v4", "VID 100 IPv4 TCP: tag popped, steered to VID 100's port",
         "trunk_ingress", tagged(100, V4_TCP), TC_ACT_REDIRECT, Ether(**MACS) / V4_TCP,
         steered_in(100, Ether(**MACS) / V4_TCP)),
    Case("vid200-v6", "VID 200 IPv6 UDP: tag popped, steered to VID 200's port",
         "trunk_ingress", tagged(200, V6_UDP), TC_ACT_REDIRECT, Ether(**MACS) / V6_UDP,
         steered_in(200, Ether(**MACS) / V6_UDP)),
    Case("vid4011", "VID 4011 (0xFAB): byte-order sensitive VID still steered",
         "trunk_ingress", tagged(4011, V4_TCP), TC_ACT_REDIRECT, Ether(**MACS) / V4_TCP,
         steered_in(4011, Ether(**MACS) / V4_TCP)),
    Case("decoy-swapped", "PCP 5 + VID 0xB0F (bytes AB 0F) must not match 4011's entry",
         "trunk_ingress", tagged(DECOY_SWAPPED, V4_TCP, prio=5), TC_ACT_OK, None,
         reason("PASS_UNKNOWN_VLAN")),
    Case("decoy-reversed", "VID 0xBAF must not match 4011's entry",
         "trunk_ingress", tagged(DECOY_REVERSED, V4_TCP), TC_ACT_OK, None, reason("PASS_UNKNOWN_VLAN")),
    Case("qinq", "802.1ad outer tag (QinQ) is not ours: host stack, untouched",
         "trunk_ingress", Ether(**MACS) / Dot1AD(vlan=100) / Dot1Q(vlan=200) / V4_TCP, TC_ACT_OK, None,
         reason("PASS_OTHER_TPID")),
    Case("nested-8021q", "VID 100 carrying another 802.1Q tag is dropped",
         "trunk_ingress", Ether(**MACS) / Dot1Q(vlan=100) / Dot1Q(vlan=200) / V4_TCP, TC_ACT_SHOT, None,
         reason("DROP_NESTED_TAG")),
    Case("nested-8021ad", "VID 100 carrying an 802.1ad tag is dropped",
         "trunk_ingress", Ether(**MACS) / Dot1Q(vlan=100) / Dot1AD(vlan=200) / V4_TCP, TC_ACT_SHOT, None,
         reason("DROP_NESTED_TAG")),
    Case("nested-unknown", "an unknown VID is the host's business, nested or not",
         "trunk_ingress", Ether(**MACS) / Dot1Q(vlan=300) / Dot1Q(vlan=100) / V4_TCP, TC_ACT_OK, None,
         reason("PASS_UNKNOWN_VLAN")),
    Case("vid300", "VID 300 has no graph: host stack, untouched",
         "trunk_ingress", tagged(300, V4_TCP), TC_ACT_OK, None, reason("PASS_UNKNOWN_VLAN")),
    Case("vid0-priority", "priority-tagged frame (VID 0, PCP 3) has no graph",
         "trunk_ingress", tagged(0, V4_TCP, prio=3), TC_ACT_OK, None, reason("PASS_UNKNOWN_VLAN")),
    Case("arp-vid100", "ARP request on VID 100 is steered like IP",
         "trunk_ingress", tagged(100, V4_ARP, l2=BCAST), TC_ACT_REDIRECT, Ether(**BCAST) / V4_ARP,
         steered_in(100, Ether(**BCAST) / V4_ARP)),
    Case("nd-vid200", "IPv6 neighbour solicitation on VID 200 is steered",
         "trunk_ingress", tagged(200, V6_NS, l2=MCAST6), TC_ACT_REDIRECT, Ether(**MCAST6) / V6_NS,
         steered_in(200, Ether(**MCAST6) / V6_NS)),
    Case("pcp5-vid100", "PCP 5 and DEI set in the TCI: VID 100 still matches",
         "trunk_ingress", tagged(100, V4_TCP, prio=5, dei=1), TC_ACT_REDIRECT, Ether(**MACS) / V4_TCP,
         steered_in(100, Ether(**MACS) / V4_TCP)),
    Case("runt-15", "ethertype 802.1Q and 1 byte of tag: dropped",
         "trunk_ingress", bytes(tagged(100, V4_TCP))[:15], TC_ACT_SHOT, None, reason("DROP_RUNT")),
    Case("runt-16", "ethertype 802.1Q and a TCI but no inner ethertype: dropped",
         "trunk_ingress", bytes(tagged(100, V4_TCP))[:16], TC_ACT_SHOT, None, reason("DROP_RUNT")),
    Case("runt-17", "ethertype 802.1Q, 3 bytes of the 4-byte tag: dropped",
         "trunk_ingress", bytes(tagged(100, V4_TCP))[:17], TC_ACT_SHOT, None, reason("DROP_RUNT")),
    Case("tag-only", "exactly a tag and nothing after it is steered (the stack judges it)",
         "trunk_ingress", Ether(**MACS) / Dot1Q(vlan=100, type=0x0800), TC_ACT_REDIRECT,
         Ether(**MACS, type=0x0800), steered_in(100, Ether(**MACS, type=0x0800))),
    # The pushed tag lives in skb metadata (vlan_tci), not in the bytes, and test_run does not
    # report it: the frame comes out unchanged. The VID shows in which out counter moved.
    Case("port7-v4", "port 7 (VID 100) to the trunk: tag pushed, out counter of VID 100",
         "port_ingress", Ether(**MACS) / V4_TCP, TC_ACT_REDIRECT, None,
         steered_out(100, Ether(**MACS) / V4_TCP), ifindex=7),
    Case("port9-v6", "port 9 (VID 200) to the trunk: the ifindex selects the VID",
         "port_ingress", Ether(**MACS) / V6_UDP, TC_ACT_REDIRECT, None,
         steered_out(200, Ether(**MACS) / V6_UDP), ifindex=9),
    Case("port11-v4", "port 11 (VID 4011) to the trunk",
         "port_ingress", Ether(**MACS) / V4_TCP, TC_ACT_REDIRECT, None,
         steered_out(4011, Ether(**MACS) / V4_TCP), ifindex=11),
    Case("port-unknown", "a port with no port_vlans entry drops",
         "port_ingress", Ether(**MACS) / V4_TCP, TC_ACT_SHOT, None, reason("DROP_UNKNOWN_PORT"),
         ifindex=UNKNOWN_PORT),
    Case("port-lo", "no ctx: the kernel uses lo, which is no port",
         "port_ingress", Ether(**MACS) / V4_TCP, TC_ACT_SHOT, None, reason("DROP_UNKNOWN_PORT")),
]


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def load_object(obj: Path, pin: Path) -> None:
    """Loads every program of obj (as tc classifiers) under pin/prog, its maps under pin/maps."""
    r = _run(["bpftool", "prog", "loadall", str(obj), str(pin / "prog"), "type", "classifier",
              "pinmaps", str(pin / "maps")])
    assert r.returncode == 0, f"bpftool prog loadall {obj} {pin}: exit {r.returncode}\n{r.stderr}"


def _u32(n: int) -> bytes:
    return struct.pack("=I", n)


@dataclass
class Steer:
    progs: dict[str, bpfsys.Prog]
    maps: dict[str, bpfsys.Map]
    run_in_ns: object  # NetnsRunner

    def counters(self) -> dict[str, int]:
        c = {}
        for i, name in enumerate(REASONS):
            c[f"reason.{name}"] = sum(struct.unpack("=Q", v)[0]
                                      for v in self.maps["reason_stats"].lookup_percpu(_u32(i)))
        for vid in WATCHED_VIDS:
            per_cpu = [struct.unpack("=4Q", v) for v in self.maps["vlan_stats"].lookup_percpu(_u32(vid))]
            for name, values in zip(STATS_FIELDS, zip(*per_cpu, strict=True), strict=True):
                c[f"vlan{vid}.{name}"] = sum(values)
        return c

    def run(self, prog: str, frame: bytes, ifindex: int | None) -> bpfsys.TestRun:
        ctx = None
        if ifindex is not None:
            ctx = bytearray(SKB_IFINDEX_OFF + 4)
            struct.pack_into("=I", ctx, SKB_IFINDEX_OFF, ifindex)
            ctx = bytes(ctx)
        return self.run_in_ns(self.progs[prog].test_run, frame, ctx)


@pytest.fixture(scope="module")
def steer(pin_dir, netns):
    ns, run_in_ns = netns
    # ifindexes the ctx can name: veth pairs 7-9 and 11-13 in our namespace
    for a, b in ((7, 9), (11, UNKNOWN_PORT)):
        r = _run(["ip", "-n", ns, "link", "add", f"pst{a}", "index", str(a), "type", "veth",
                  "peer", "name", f"pst{b}", "index", str(b)])
        if r.returncode != 0:
            pytest.skip(f"veth with a chosen ifindex unavailable in {ns}: {r.stderr.strip()}")

    subprocess.run(["make", "-s", "-C", str(REPO / "tc")], check=True, timeout=120)
    load_object(OBJECT, pin_dir)
    progs = {p: bpfsys.Prog(str(pin_dir / "prog" / p)) for p in ("trunk_ingress", "port_ingress")}
    maps = {m: bpfsys.Map(str(pin_dir / "maps" / m))
            for m in ("vlan_ports", "port_vlans", "vlan_stats", "reason_stats")}
    try:
        for vid, ifindex in VLAN_PORTS.items():
            maps["vlan_ports"].update(_u32(vid), struct.pack("=II", ifindex, 0))
        for ifindex, vid in PORT_VLANS.items():
            maps["port_vlans"].update(_u32(ifindex), struct.pack("=II", vid, TRUNK))
        yield Steer(progs, maps, run_in_ns)
    finally:
        for obj in (*progs.values(), *maps.values()):
            obj.close()


def _show(frame: Packet | bytes) -> str:
    return repr(frame) if isinstance(frame, Packet) else f"{len(frame)} bytes {bytes(frame).hex()}"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_golden(steer, case: Case):
    frame = bytes(case.frame)
    before = steer.counters()
    res = steer.run(case.prog, frame, case.ifindex)
    after = steer.counters()

    where = f"{case.prog} on {case.id} ({case.desc}); frame {_show(case.frame)}"
    assert res.retval == case.verdict, (
        f"{where}: verdict expected {VERDICTS[case.verdict]}, got "
        f"{VERDICTS.get(res.retval, res.retval)}")
    want = bytes(case.out) if case.out is not None else frame
    assert res.data == want, (
        f"{where}: output bytes\n expected {want.hex()}\n got      {res.data.hex()}\n"
        f" got as scapy: {Ether(res.data)!r}")
    moved = {k: after[k] - before[k] for k in after if after[k] != before[k]}
    assert moved == case.counters, f"{where}: counter changes expected {case.counters}, got {moved}"


def test_reasons_match_header():
    """The reason list above is the order of enum steer_reason in the contract header."""
    body = re.search(r"enum steer_reason \{(.*?)\};", HEADER.read_text(), re.S).group(1)
    names = re.findall(r"REASON_(\w+)", re.sub(r"/\*.*?\*/", "", body, flags=re.S))
    assert names == [*REASONS, "MAX"], f"{HEADER}: enum steer_reason is {names}, test has {REASONS}"


def test_maps_match_contract(steer):
    """Shapes pepctl relies on: key/value sizes and sizes of the pinned maps."""
    want = {  # map: (type, key size, value size, max entries)
        "vlan_ports": (2, 4, 8, 4096),        # ARRAY of struct vlan_port
        "port_vlans": (1, 4, 8, 8192),        # HASH of struct port_vlan
        "vlan_stats": (6, 4, 32, 4096),       # PERCPU_ARRAY of struct vlan_stats
        "reason_stats": (6, 4, 8, len(REASONS)),  # PERCPU_ARRAY of __u64
    }
    got = {n: (m.type, m.key_size, m.value_size, m.max_entries) for n, m in steer.maps.items()}
    assert got == want


def test_removed_vlan_passes(steer):
    """Clearing a VID's entry hands its frames back to the host stack: no stale steering."""
    vid, frame = 200, bytes(tagged(200, V6_UDP))
    entry = steer.maps["vlan_ports"].lookup(_u32(vid))
    steer.maps["vlan_ports"].update(_u32(vid), struct.pack("=II", 0, 0))
    try:
        res = steer.run("trunk_ingress", frame, None)
        assert (res.retval, res.data) == (TC_ACT_OK, frame), "VID 200 with ifindex 0 must pass untouched"
    finally:
        steer.maps["vlan_ports"].update(_u32(vid), entry)

