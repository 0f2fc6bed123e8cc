"""Golden-packet tests of the per-flow bypass datapath (tc/bypass.o, flow_ingress), run in the
kernel by BPF_PROG_TEST_RUN inside a private namespace that routes like a graph's namespace:

    client 198.18.0.10, .11    [ private netns pby-<runid>-<n>, forwarding on ]    server 198.19.0.10
    2001:2:0:1::10     pbycp(23) ── pbyc(21) "c_in"     pbys(22) "s_in" ── pbysp(24)    2001:2:0:2::10
                    unregistered   198.18.0.1/24      198.19.0.1/24
                                   2001:2:0:1::1/64   2001:2:0:2::1/64
    neighbours (permanent): clients on pbyc, server on pbys, with the MACs below
    routes: 198.19.1.0/24 and 2001:2:0:3::/64 via a gateway with no neighbour entry (NO_NEIGH),
            198.19.9.0/24 blackhole (a FIB miss)

side_config: 21 (pbyc) is the access side, 22 (pbys) the origin side; 23 has no entry.

How right is told from wrong: each case is a list of packets made by scapy, sent on one side
(ctx.ifindex and ingress_ifindex name the veth), and for each the test checks the verdict
(TC_ACT_*), the exact bytes the program leaves and the exact change of every counter of
bypass_stats (one that should not move must not). A bypassed packet is routed for real by
bpf_fib_lookup in that namespace, so its expected bytes are those the stack's forwarding would
make: MACs of the egress device and of the neighbour, TTL / hop limit minus one, a valid IPv4
header checksum (scapy recomputes it from scratch; the program patches it). test_run does not
carry out a redirect: where the packet would go shows in its MACs. Cases then check the
flow_table entries they made. Cases use distinct 4-tuples: the flow table is shared.
"""

from __future__ import annotations

import re
import struct
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from scapy.layers.inet import ICMP, IP, TCP, UDP, IPOption_NOP
from scapy.layers.inet6 import ICMPv6EchoRequest, IPv6, IPv6ExtHdrHopByHop
from scapy.layers.l2 import ARP, Ether
from scapy.packet import Packet, Raw

from pepctl import bpfsys
from pepctl import bypass_maps as bm

NAME_PREFIX = "pby"   # names of the pins and namespace (tests/bpf/conftest.py)
REPO = Path(__file__).resolve().parents[2]
OBJECT = REPO / "tc" / "bypass.o"
HEADER = REPO / "tc" / "pep_bypass.h"

TC_ACT_OK, TC_ACT_SHOT, TC_ACT_REDIRECT = 0, 2, 7
VERDICTS = {TC_ACT_OK: "TC_ACT_OK", TC_ACT_SHOT: "TC_ACT_SHOT", TC_ACT_REDIRECT: "TC_ACT_REDIRECT"}

C_IN, S_IN, UNREGISTERED, S_PEER = 21, 22, 23, 24
IFINDEX = {"access": C_IN, "origin": S_IN, "unregistered": UNREGISTERED}
C_IN_MAC, S_IN_MAC = "02:00:00:00:01:01", "02:00:00:00:02:01"
CLIENT_MAC, CLIENT2_MAC, SERVER_MAC = "02:00:00:00:01:0a", "02:00:00:00:01:0b", "02:00:00:00:02:0a"

CLIENT, CLIENT2, SERVER = "198.18.0.10", "198.18.0.11", "198.19.0.10"
S_IN4 = "198.19.0.1"
FAR_SERVER, HOLE_SERVER = "198.19.1.10", "198.19.9.10"       # via a gateway with no neighbour; blackhole
CLIENT6, SERVER6, FAR_SERVER6 = "2001:2:0:1::10", "2001:2:0:2::10", "2001:2:0:3::10"
# 198.18.0.0/24 with its bytes reversed. Only ever inside BPF_PROG_TEST_RUN, never on a link.
DECOY = "0.0.18.198"
MAC_OF = {CLIENT: CLIENT_MAC, CLIENT2: CLIENT2_MAC, CLIENT6: CLIENT_MAC, DECOY: CLIENT_MAC}

NETNS_SETUP = [
    ["link", "add", "pbyc", "index", str(C_IN), "type", "veth", "peer", "name", "pbycp", "index",
     str(UNREGISTERED)],
    ["link", "add", "pbys", "index", str(S_IN), "type", "veth", "peer", "name", "pbysp", "index",
     str(S_PEER)],
    ["link", "set", "pbyc", "address", C_IN_MAC],
    ["link", "set", "pbys", "address", S_IN_MAC],
    ["addr", "add", "198.18.0.1/24", "dev", "pbyc"],
    ["addr", "add", "2001:2:0:1::1/64", "dev", "pbyc", "nodad"],
    ["addr", "add", "198.19.0.1/24", "dev", "pbys"],
    ["addr", "add", "2001:2:0:2::1/64", "dev", "pbys", "nodad"],
    *(["link", "set", dev, "up"] for dev in ("pbyc", "pbycp", "pbys", "pbysp")),
    ["neigh", "add", CLIENT, "lladdr", CLIENT_MAC, "dev", "pbyc", "nud", "permanent"],
    ["neigh", "add", CLIENT2, "lladdr", CLIENT2_MAC, "dev", "pbyc", "nud", "permanent"],
    ["neigh", "add", CLIENT6, "lladdr", CLIENT_MAC, "dev", "pbyc", "nud", "permanent"],
    ["neigh", "add", SERVER, "lladdr", SERVER_MAC, "dev", "pbys", "nud", "permanent"],
    ["neigh", "add", SERVER6, "lladdr", SERVER_MAC, "dev", "pbys", "nud", "permanent"],
    ["route", "add", "198.19.1.0/24", "via", "198.19.0.254", "dev", "pbys"],
    ["route", "add", "2001:2:0:3::/64", "via", "2001:2:0:2::fe", "dev", "pbys"],
    ["route", "add", "blackhole", "198.19.9.0/24"],
]


# -- packets ------------------------------------------------------------------------------------
def from_access(l3: Packet) -> Packet:
    src = l3.src if l3.src in MAC_OF else CLIENT
    return Ether(src=MAC_OF[src], dst=C_IN_MAC) / l3


def from_origin(l3: Packet) -> Packet:
    return Ether(src=SERVER_MAC, dst=S_IN_MAC) / l3


def tcp4(src: str, sport: int, dst: str, dport: int, flags: str = "S", seq: int = 1000, ttl: int = 64,
         ack: int = 0, **ip) -> Packet:
    return IP(src=src, dst=dst, ttl=ttl, **ip) / TCP(sport=sport, dport=dport, flags=flags, seq=seq, ack=ack)


def tcp6(src: str, sport: int, dst: str, dport: int, flags: str = "S", seq: int = 1000,
         hlim: int = 64, ack: int = 0) -> Packet:
    return IPv6(src=src, dst=dst, hlim=hlim) / TCP(sport=sport, dport=dport, flags=flags, seq=seq, ack=ack)


def syn(sport: int, dport: int = 80, src: str = CLIENT, dst: str = SERVER, **kw) -> Packet:
    """A first SYN from the access side."""
    make = tcp6 if ":" in src else tcp4
    return from_access(make(src, sport, dst, dport, **kw))


def ack(sport: int, dport: int = 80, src: str = CLIENT, dst: str = SERVER, **kw) -> Packet:
    return syn(sport, dport, src, dst, flags="A", seq=1001, **kw)


def reply(sport: int, dport: int, src: str = SERVER, dst: str = CLIENT, flags: str = "SA", ack: int = 1001,
          **kw) -> Packet:
    """A segment from the origin side (default: the SYN-ACK of the access side's SYN, ISN 1000)."""
    make = tcp6 if ":" in src else tcp4
    return from_origin(make(src, sport, dst, dport, flags=flags, seq=5000, ack=ack, **kw))


def routed(frame: Packet, src_mac: str | None, dst_mac: str | None) -> Packet:
    """frame as forwarding leaves it: TTL / hop limit - 1 (checksum recomputed by scapy) and, when
    given, the MACs of the egress device and the next hop."""
    out = frame.copy()
    if src_mac:
        out[Ether].src, out[Ether].dst = src_mac, dst_mac
    if IP in out:
        out[IP].ttl -= 1
        out[IP].chksum = None
    else:
        out[IPv6].hlim -= 1
    return out


def to_origin(frame: Packet) -> Packet:
    return routed(frame, S_IN_MAC, SERVER_MAC)


def to_access(frame: Packet) -> Packet:
    l3 = frame[IP] if IP in frame else frame[IPv6]
    return routed(frame, C_IN_MAC, MAC_OF[l3.dst])


def ttl_only(frame: Packet) -> Packet:
    """Sent by bpf_redirect_neigh: the kernel writes the MACs after test_run has returned."""
    return routed(frame, None, None)


def cnt(**moves: int) -> dict[str, int]:
    unknown = set(moves) - set(bm.COUNTERS)
    assert not unknown, f"no such counters: {unknown}"
    return moves


BYPASSED = cnt(pkts_bypassed=1)
NEW_BYPASS = cnt(flows_bypass_rule=1, pkts_bypassed=1)
NEW_PROXY = cnt(flows_proxied=1)


# -- cases --------------------------------------------------------------------------------------
@dataclass
class Send:
    side: str                       # access | origin | unregistered
    frame: Packet | bytes
    verdict: int
    out: Packet | bytes | None = None   # None: must come out unchanged
    counters: dict[str, int] = field(default_factory=dict)


@dataclass
class Do:
    what: str
    fn: Callable[[str], object]     # called with the pin folder


@dataclass
class Flow:
    sub: str
    sub_port: int
    org: str
    org_port: int
    verdict: str | None             # None: no entry
    syn_seq: int = 1000


@dataclass
class Case:
    id: str
    desc: str
    steps: list[Send | Do]
    rules: dict = field(default_factory=dict)     # add_rules() arguments for the case
    flows: list[Flow] = field(default_factory=list)


def del_rules(**rules) -> Do:
    return Do(f"remove rules {rules}", lambda pins: bm.del_rules(pins, **rules))


def proxy(up: bool) -> Do:
    return Do(f"proxy_state.up = {int(up)}", lambda pins: bm.set_proxy_up(pins, up))


C32 = {"clients": [f"{CLIENT}/32"]}

CASES = [
    # -- not TCP, or no TCP header we read: the stack's, counted not_tcp
    Case("udp4", "UDP goes to the stack", [
        Send("access", from_access(IP(src=CLIENT, dst=SERVER) / UDP(sport=5353, dport=53) / b"q"),
             TC_ACT_OK, counters=cnt(pkts_not_tcp=1))]),
    Case("icmp4", "ICMP from the origin side goes to the stack, even for a bypassed client", [
        Send("origin", from_origin(IP(src=SERVER, dst=CLIENT) / ICMP()), TC_ACT_OK,
             counters=cnt(pkts_not_tcp=1))], rules=C32),
    Case("icmp6", "ICMPv6 goes to the stack", [
        Send("access", from_access(IPv6(src=CLIENT6, dst=SERVER6) / ICMPv6EchoRequest()), TC_ACT_OK,
             counters=cnt(pkts_not_tcp=1))]),
    Case("arp", "ARP goes to the stack", [
        Send("access", Ether(src=CLIENT_MAC, dst="ff:ff:ff:ff:ff:ff") / ARP(psrc=CLIENT, pdst="198.18.0.1"),
             TC_ACT_OK, counters=cnt(pkts_not_tcp=1))]),
    Case("fragments", "IPv4 fragments (first and later) are never bypassed: one path for all pieces", [
        Send("access", from_access(IP(src=CLIENT, dst=SERVER, flags="MF")
                                   / TCP(sport=40030, dport=80, flags="S")),
             TC_ACT_OK, counters=cnt(pkts_not_tcp=1)),
        Send("access", from_access(IP(src=CLIENT, dst=SERVER, proto=6, frag=3) / Raw(b"x" * 24)), TC_ACT_OK,
             counters=cnt(pkts_not_tcp=1))],
        rules=C32, flows=[Flow(CLIENT, 40030, SERVER, 80, None)]),
    Case("v6-ext-header", "IPv6 with a hop-by-hop header before TCP is passed, not parsed", [
        Send("access", from_access(IPv6(src=CLIENT6, dst=SERVER6) / IPv6ExtHdrHopByHop()
                                   / TCP(sport=40031, dport=80, flags="S", seq=1000)),
             TC_ACT_OK, counters=cnt(pkts_not_tcp=1))],
        rules={"clients": ["2001:2:0:1::/64"]}, flows=[Flow(CLIENT6, 40031, SERVER6, 80, None)]),
    Case("tcp-truncated", "a TCP header cut short is left to the stack", [
        Send("access", bytes(syn(40032, ttl=5))[:14 + 20 + 10], TC_ACT_OK, counters=cnt(pkts_not_tcp=1))],
        rules=C32),
    # -- first SYN, no rule: PROXY, from both sides
    Case("syn-proxy-access", "first SYN from a client, no rules: PROXY, remembered", [
        Send("access", syn(40001), TC_ACT_OK, counters=NEW_PROXY)],
        flows=[Flow(CLIENT, 40001, SERVER, 80, "proxy")]),
    Case("syn-proxy-origin", "first SYN from the origin side: the subscriber is its destination", [
        Send("origin", reply(80, 40002, flags="S"), TC_ACT_OK, counters=NEW_PROXY)],
        flows=[Flow(CLIENT, 40002, SERVER, 80, "proxy", 5000)]),
    Case("synack-unknown", "SYN-ACK and ACK of flows never seen: no_flow, to the stack", [
        Send("origin", reply(80, 40015), TC_ACT_OK, counters=cnt(pkts_no_flow=1)),
        Send("access", ack(40015), TC_ACT_OK, counters=cnt(pkts_no_flow=1))],
        flows=[Flow(CLIENT, 40015, SERVER, 80, None)]),
    # -- rules
    Case("client32", "client /32 rule: that client is bypassed and routed, the next one proxied", [
        Send("access", syn(40003, src=CLIENT2), TC_ACT_REDIRECT, to_origin(syn(40003, src=CLIENT2)),
             NEW_BYPASS),
        Send("access", syn(40004), TC_ACT_OK, counters=NEW_PROXY)],
        rules={"clients": [f"{CLIENT2}/32"]},
        flows=[Flow(CLIENT2, 40003, SERVER, 80, "bypass_rule"), Flow(CLIENT, 40004, SERVER, 80, "proxy")]),
    Case("client24", "client /24 rule", [
        Send("access", syn(40005), TC_ACT_REDIRECT, to_origin(syn(40005)), NEW_BYPASS)],
        rules={"clients": ["198.18.0.0/24"]}, flows=[Flow(CLIENT, 40005, SERVER, 80, "bypass_rule")]),
    Case("server-prefix", "server prefix rule", [
        Send("access", syn(40006), TC_ACT_REDIRECT, to_origin(syn(40006)), NEW_BYPASS)],
        rules={"servers": ["198.19.0.0/24"]}, flows=[Flow(CLIENT, 40006, SERVER, 80, "bypass_rule")]),
    Case("prefix-byte-order", "198.18.0.0/24 does not match 0.0.18.198 (its bytes reversed)", [
        Send("access", syn(40007, src=DECOY), TC_ACT_OK, counters=NEW_PROXY)],
        rules={"clients": ["198.18.0.0/24"], "servers": ["198.19.0.0/32"]},
        flows=[Flow(DECOY, 40007, SERVER, 80, "proxy")]),
    Case("port-4011", "port rule 4011 (0x0FAB): 4011 bypassed, 43791 (0xAB0F) not", [
        Send("access", syn(40008, 4011), TC_ACT_REDIRECT, to_origin(syn(40008, 4011)), NEW_BYPASS),
        Send("access", syn(40009, 43791), TC_ACT_OK, counters=NEW_PROXY)],
        rules={"ports": [(4011, 4011)]},
        flows=[Flow(CLIENT, 40008, SERVER, 4011, "bypass_rule"),
               Flow(CLIENT, 40009, SERVER, 43791, "proxy")]),
    Case("port-43791", "port rule 43791 (0xAB0F): 43791 bypassed, 4011 not", [
        Send("access", syn(40010, 4011), TC_ACT_OK, counters=NEW_PROXY),
        Send("access", syn(40011, 43791), TC_ACT_REDIRECT, to_origin(syn(40011, 43791)), NEW_BYPASS)],
        rules={"ports": [(43791, 43791)]}),
    Case("port-range", "a port range covers its ends and not its neighbours", [
        Send("access", syn(40040, 8000), TC_ACT_REDIRECT, to_origin(syn(40040, 8000)), NEW_BYPASS),
        Send("access", syn(40041, 8080), TC_ACT_REDIRECT, to_origin(syn(40041, 8080)), NEW_BYPASS),
        Send("access", syn(40042, 8081), TC_ACT_OK, counters=NEW_PROXY)],
        rules={"ports": [(8000, 8080)]}),
    Case("port-from-origin", "a SYN from the origin side is matched on the port it is addressed to", [
        Send("origin", reply(80, 4011, flags="S"), TC_ACT_REDIRECT, to_access(reply(80, 4011, flags="S")),
             NEW_BYPASS)],
        rules={"ports": [(4011, 4011)]}, flows=[Flow(CLIENT, 4011, SERVER, 80, "bypass_rule", 5000)]),
    Case("v6-client64", "IPv6 client /64: SYN routed (hop limit - 1), SYN-ACK routed back", [
        Send("access", syn(40013, src=CLIENT6, dst=SERVER6), TC_ACT_REDIRECT,
             to_origin(syn(40013, src=CLIENT6, dst=SERVER6)), NEW_BYPASS),
        Send("origin", reply(80, 40013, src=SERVER6, dst=CLIENT6), TC_ACT_REDIRECT,
             to_access(reply(80, 40013, src=SERVER6, dst=CLIENT6)), BYPASSED)],
        rules={"clients": ["2001:2:0:1::/64"]}, flows=[Flow(CLIENT6, 40013, SERVER6, 80, "bypass_rule")]),
    Case("v6-server", "IPv6 server rule", [
        Send("access", syn(40043, src=CLIENT6, dst=SERVER6), TC_ACT_REDIRECT,
             to_origin(syn(40043, src=CLIENT6, dst=SERVER6)), NEW_BYPASS)],
        rules={"servers": [f"{SERVER6}/128"]}),
    Case("v4-rule-not-v6", "an IPv4 client rule says nothing about the client's IPv6 flows", [
        Send("access", syn(40044, src=CLIENT6, dst=SERVER6), TC_ACT_OK, counters=NEW_PROXY)],
        rules={"clients": ["198.18.0.0/24"]}),
    Case("ip-options", "IPv4 header with options (IHL 6): ports read after them, TTL patched", [
        Send("access", syn(40023, options=[IPOption_NOP()] * 4), TC_ACT_REDIRECT,
             to_origin(syn(40023, options=[IPOption_NOP()] * 4)), NEW_BYPASS)],
        rules=C32, flows=[Flow(CLIENT, 40023, SERVER, 80, "bypass_rule")]),
    # -- both directions of a decided flow
    Case("bypass-both-ways", "SYN-ACK and ACK of a bypassed flow keep its verdict", [
        Send("access", syn(40014), TC_ACT_REDIRECT, to_origin(syn(40014)), NEW_BYPASS),
        Send("origin", reply(80, 40014), TC_ACT_REDIRECT, to_access(reply(80, 40014)), BYPASSED),
        Send("access", ack(40014), TC_ACT_REDIRECT, to_origin(ack(40014)), BYPASSED)],
        rules=C32),
    Case("stale-entry", "a SYN-ACK answering another SYN on a bypassed flow's 4-tuple (HAProxy reusing "
         "its port toward the origin) forgets the old flow and goes to the stack", [
        Send("access", syn(40040), TC_ACT_REDIRECT, to_origin(syn(40040)), NEW_BYPASS),
        Send("origin", reply(80, 40040, ack=777001), TC_ACT_OK, counters=cnt(flows_stale=1)),
        Send("origin", reply(80, 40040, flags="A", ack=777001), TC_ACT_OK, counters=cnt(pkts_no_flow=1))],
        rules=C32, flows=[Flow(CLIENT, 40040, SERVER, 80, None)]),
    Case("proxy-both-ways", "later segments of a proxied flow go to the stack, uncounted", [
        Send("access", syn(40016), TC_ACT_OK, counters=NEW_PROXY),
        Send("access", ack(40016), TC_ACT_OK),
        Send("origin", reply(80, 40016, flags="A"), TC_ACT_OK)]),
    # -- SYN retransmissions and reuse
    Case("syn-retransmit", "a retransmitted SYN keeps the verdict and is counted once", [
        Send("access", syn(40017), TC_ACT_REDIRECT, to_origin(syn(40017)), NEW_BYPASS),
        Send("access", syn(40017), TC_ACT_REDIRECT, to_origin(syn(40017)), BYPASSED)],
        rules=C32),
    Case("syn-retransmit-proxy", "a retransmitted SYN of a proxied flow is counted once", [
        Send("access", syn(40018), TC_ACT_OK, counters=NEW_PROXY),
        Send("access", syn(40018), TC_ACT_OK)]),
    Case("new-isn", "after a rule change, the same SYN keeps its verdict; a new ISN is decided anew", [
        Send("access", syn(40019), TC_ACT_REDIRECT, to_origin(syn(40019)), NEW_BYPASS),
        del_rules(**C32),
        Send("access", syn(40019), TC_ACT_REDIRECT, to_origin(syn(40019)), BYPASSED),
        Send("access", syn(40019, seq=7777), TC_ACT_OK, counters=NEW_PROXY)],
        rules=C32, flows=[Flow(CLIENT, 40019, SERVER, 80, "proxy", 7777)]),
    Case("rule-removed-mid-flow", "removing the rule does not break a bypassed flow", [
        Send("access", syn(40020), TC_ACT_REDIRECT, to_origin(syn(40020)), NEW_BYPASS),
        del_rules(**C32),
        Send("origin", reply(80, 40020), TC_ACT_REDIRECT, to_access(reply(80, 40020)), BYPASSED),
        Send("access", ack(40020), TC_ACT_REDIRECT, to_origin(ack(40020)), BYPASSED)],
        rules=C32, flows=[Flow(CLIENT, 40020, SERVER, 80, "bypass_rule")]),
    Case("rule-added-mid-flow", "adding a rule does not move a proxied flow", [
        Send("access", syn(40045), TC_ACT_OK, counters=NEW_PROXY),
        Do("add the client's /32", lambda pins: bm.add_rules(pins, **C32)),
        Send("access", ack(40045), TC_ACT_OK)],
        flows=[Flow(CLIENT, 40045, SERVER, 80, "proxy")]),
    # -- fail-open
    Case("failopen", "proxy down: new SYNs fail open (bypass), an old PROXY flow stays PROXY", [
        Send("access", syn(40021), TC_ACT_OK, counters=NEW_PROXY),
        proxy(False),
        Send("access", syn(40022), TC_ACT_REDIRECT, to_origin(syn(40022)),
             cnt(flows_bypass_failopen=1, pkts_bypassed=1)),
        Send("access", ack(40021), TC_ACT_OK),
        Send("origin", reply(80, 40022), TC_ACT_REDIRECT, to_access(reply(80, 40022)), BYPASSED),
        proxy(True),
        Send("access", ack(40022), TC_ACT_REDIRECT, to_origin(ack(40022)), BYPASSED)],
        flows=[Flow(CLIENT, 40021, SERVER, 80, "proxy"), Flow(CLIENT, 40022, SERVER, 80, "bypass_failopen")]),
    # -- TTL
    Case("ttl1", "TTL 1 on a bypassed flow: dropped, ttl_expired; a later TTL 2 is routed", [
        Send("access", syn(40024, ttl=1), TC_ACT_SHOT, counters=cnt(flows_bypass_rule=1, pkts_ttl_expired=1)),
        Send("access", syn(40024, ttl=2), TC_ACT_REDIRECT, to_origin(syn(40024, ttl=2)), BYPASSED)],
        rules=C32),
    Case("ttl0", "TTL 0 is expired too", [
        Send("access", syn(40046, ttl=0), TC_ACT_SHOT,
             counters=cnt(flows_bypass_rule=1, pkts_ttl_expired=1))],
        rules=C32),
    Case("hlim1", "hop limit 1 on a bypassed IPv6 flow: dropped, ttl_expired", [
        Send("access", syn(40025, src=CLIENT6, dst=SERVER6, hlim=1), TC_ACT_SHOT,
             counters=cnt(flows_bypass_rule=1, pkts_ttl_expired=1))],
        rules={"clients": ["2001:2:0:1::/64"]}),
    Case("ttl1-proxied", "TTL 1 on a proxied flow is the stack's business", [
        Send("access", syn(40026, ttl=1), TC_ACT_OK, counters=NEW_PROXY)]),
    # -- what the FIB says
    Case("no-neigh", "next hop without a neighbour entry: bpf_redirect_neigh, TTL - 1, MACs by the kernel", [
        Send("access", syn(40027, dst=FAR_SERVER), TC_ACT_REDIRECT, ttl_only(syn(40027, dst=FAR_SERVER)),
             NEW_BYPASS)],
        rules={"servers": ["198.19.1.0/24"]}),
    Case("no-neigh-v6", "IPv6 next hop without a neighbour entry: bpf_redirect_neigh", [
        Send("access", syn(40028, src=CLIENT6, dst=FAR_SERVER6), TC_ACT_REDIRECT,
             ttl_only(syn(40028, src=CLIENT6, dst=FAR_SERVER6)), NEW_BYPASS)],
        rules={"servers": ["2001:2:0:3::/64"]}),
    Case("blackhole", "no usable route: dropped, fib_miss", [
        Send("access", syn(40029, dst=HOLE_SERVER), TC_ACT_SHOT,
             counters=cnt(flows_bypass_rule=1, pkts_fib_miss=1))],
        rules={"servers": ["198.19.9.0/24"]}),
    Case("local-destination", "a bypassed flow to the namespace's own address is delivered by the stack", [
        Send("access", syn(40033, 22, dst=S_IN4), TC_ACT_OK, counters=cnt(flows_bypass_rule=1))],
        rules=C32),
    # -- not one of our interfaces
    Case("unregistered-if", "an interface with no side_config entry: untouched, uncounted, unremembered", [
        Send("unregistered", syn(40034), TC_ACT_OK)],
        rules=C32, flows=[Flow(CLIENT, 40034, SERVER, 80, None)]),
]


# -- the datapath under test --------------------------------------------------------------------
def _run(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


@dataclass
class Bypass:
    pins: str
    prog: bpfsys.Prog
    run_in_ns: object               # NetnsRunner

    def run(self, side: str, frame: bytes) -> bpfsys.TestRun:
        return self.run_in_ns(self.prog.test_run, frame, bpfsys.skb_ctx(IFINDEX[side]))

    def counters(self) -> dict[str, int]:
        return bm.read_counters(self.pins)

    def reset(self) -> None:
        """No rule at all and the proxy up: what every case starts from."""
        for name in ("bypass_client4", "bypass_server4", "bypass_client6", "bypass_server6"):
            with bm.open_map(self.pins, name) as m:
                for key in list(m.keys()):
                    m.delete(key)
        bm.del_rules(self.pins, ports=[(0, bm.BYPASS_PORTS_MAX - 1)])
        bm.set_proxy_up(self.pins, True)

    def flow(self, f: Flow) -> dict | None:
        key = bm.flow_key(f.sub, f.sub_port, f.org, f.org_port)
        with bm.open_map(self.pins, "flow_table") as m:
            value = m.lookup(key)
        return None if value is None else bm.decode_flow(key, value)


@pytest.fixture(scope="module")
def bypass(pin_dir, netns, bpf_loadall):
    ns, run_in_ns = netns
    for argv in NETNS_SETUP:
        r = _run(["ip", "-n", ns, *argv])
        if r.returncode != 0:
            pytest.skip(f"ip -n {ns} {' '.join(argv)}: {r.stderr.strip()}")
    r = _run(["ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.ip_forward=1",
              "net.ipv6.conf.all.forwarding=1"])
    assert r.returncode == 0, f"forwarding on in {ns}: {r.stderr}"

    bpf_loadall(OBJECT, pin_dir)
    pins = str(pin_dir)
    bm.set_side(pins, C_IN, bm.SIDE_ACCESS, S_IN)
    bm.set_side(pins, S_IN, bm.SIDE_ORIGIN, C_IN)
    prog = bpfsys.Prog(str(pin_dir / "prog" / bm.PROGRAM))
    try:
        b = Bypass(pins, prog, run_in_ns)
        b.reset()
        yield b
    finally:
        prog.close()


def _show(frame: Packet | bytes) -> str:
    return repr(frame) if isinstance(frame, Packet) else f"{len(frame)} bytes {bytes(frame).hex()}"


def _ip4_header_sum_ok(frame: bytes) -> bool:
    ihl = (frame[14] & 0x0F) * 4
    words = struct.unpack(f"!{ihl // 2}H", frame[14:14 + ihl])
    total = sum(words)
    while total > 0xFFFF:
        total = (total & 0xFFFF) + (total >> 16)
    return total == 0xFFFF


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_golden(bypass, case: Case):
    if case.rules:
        bm.add_rules(bypass.pins, **case.rules)
    try:
        for n, step in enumerate(case.steps, 1):
            if isinstance(step, Do):
                step.fn(bypass.pins)
                continue
            frame = bytes(step.frame)
            before = bypass.counters()
            res = bypass.run(step.side, frame)
            after = bypass.counters()

            where = f"{case.id} ({case.desc}) step {n}, {step.side} side: {_show(step.frame)}"
            assert res.retval == step.verdict, (
                f"{where}: verdict expected {VERDICTS[step.verdict]}, "
                f"got {VERDICTS.get(res.retval, res.retval)}")
            want = bytes(step.out) if step.out is not None else frame
            assert res.data == want, (
                f"{where}: output bytes\n expected {want.hex()}\n got      {res.data.hex()}\n"
                f" got as scapy: {Ether(res.data)!r}")
            if res.retval == TC_ACT_REDIRECT and IP in Ether(res.data):
                assert _ip4_header_sum_ok(res.data), f"{where}: IPv4 header checksum of the output is wrong"
            moved = {k: after[k] - before[k] for k in after if after[k] != before[k]}
            assert moved == step.counters, f"{where}: counter changes expected {step.counters}, got {moved}"
    finally:
        bypass.reset()

    for f in case.flows:
        got = bypass.flow(f)
        if f.verdict is None:
            assert got is None, f"{case.id}: flow_table must have no entry for {f}, has {got}"
            continue
        assert got is not None, f"{case.id}: flow_table has no entry for {f}"
        assert (got["verdict"], got["syn_seq"]) == (f.verdict, f.syn_seq), \
            f"{case.id}: entry {got}, expected {f}"
        assert got["first_seen_ns"] > 0, f"{case.id}: first_seen_ns not set in {got}"


def test_flows_lists_entries(bypass):
    """flows() decodes the table: the access-side SYN of a fresh flow shows as subscriber -> origin."""
    bypass.run("access", bytes(syn(40050, 443)))
    got = [f for f in bm.flows(bypass.pins) if f["sub_port"] == 40050]
    assert len(got) == 1, f"flows() entries for port 40050: {got}"
    f = got[0]
    assert (f["family"], f["subscriber"], f["origin"], f["org_port"], f["verdict"], f["syn_seq"]) == \
        (4, CLIENT, SERVER, 443, "proxy", 1000), f"flows() entry {f}"


def test_counters_match_header():
    """COUNTERS of pepctl/bypass_maps.py is the order of enum bypass_counter."""
    body = re.search(r"enum bypass_counter \{(.*?)\};", HEADER.read_text(), re.S).group(1)
    names = re.findall(r"CNT_(\w+)", re.sub(r"/\*.*?\*/", "", body, flags=re.S))
    assert names == [*(c.upper() for c in bm.COUNTERS), "MAX"], f"{HEADER}: {names}, pepctl: {bm.COUNTERS}"


def _map_flags(m: bpfsys.Map) -> int:
    with open(f"/proc/self/fdinfo/{m.fd}") as f:
        return int(dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)["map_flags"], 16)


def test_maps_match_contract(bypass):
    """Shapes pepctl relies on: type, key and value size, max entries, flags of every pinned map."""
    want = {  # map: (type, key size, value size, max entries, flags)
        "side_config": (1, 4, 8, 64, 0),                  # HASH ifindex -> struct side_config
        "flow_table": (9, 40, 16, 262144, 0),             # LRU_HASH flow_key -> flow_value
        "bypass_client4": (11, 8, 4, 1048576, 1),         # LPM_TRIE, BPF_F_NO_PREALLOC
        "bypass_server4": (11, 8, 4, 1048576, 1),
        "bypass_client6": (11, 20, 4, 1048576, 1),
        "bypass_server6": (11, 20, 4, 1048576, 1),
        "bypass_ports": (2, 4, 4, 65536, 0),              # ARRAY
        "proxy_state": (2, 4, 8, 1, 0),
        "bypass_stats": (6, 4, 8, len(bm.COUNTERS), 0),   # PERCPU_ARRAY of __u64
    }
    got = {}
    for name in bm.MAPS:
        with bm.open_map(bypass.pins, name) as m:
            got[name] = (m.type, m.key_size, m.value_size, m.max_entries, _map_flags(m))
    assert got == want


def test_bulk_rules_install(bypass):
    """10,000 client /32s and /24s go in and out; a SYN from one of them is then bypassed."""
    nets = [f"198.18.{i >> 8}.{i & 255}/32" for i in range(10000)] + [f"10.{i >> 8}.{i & 255}.0/24"
                                                                         for i in range(10000)]
    done = bm.add_rules(bypass.pins, clients=nets)
    try:
        assert done["bypass_client4"] == 20000 and done["method"] in ("batch", "per-element"), done
        res = bypass.run("access", bytes(syn(40060, src=CLIENT2)))
        assert res.retval == TC_ACT_REDIRECT, "198.18.0.11 is among the rules: SYN must be bypassed"
    finally:
        removed = bm.del_rules(bypass.pins, clients=nets)
    assert removed == {"bypass_client4": 20000}
    dump = _run(["bpftool", "-j", "map", "dump", "pinned", bm.map_path(bypass.pins, "bypass_client4")])
    assert dump.stdout.strip() in ("[]", ""), f"bypass_client4 not empty after del_rules: {dump.stdout[:200]}"
