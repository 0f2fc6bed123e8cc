"""Golden-packet tests of the flow datapath (tc/flow.o, flow_ingress), run in the kernel by
BPF_PROG_TEST_RUN inside a private namespace that routes like a graph's namespace, with the
interfaces of two graph slots (ifindexes are those pepctl gives, tc/pep_flow.h):

    clients 198.18.0.10, .11                [ private netns pfl-<runid>-<n>, forwarding on ]
    2001:2:0:1::10        pflc0p(21) ── pflc0 0x100000  slot 0 c_in   198.18.0.1/24  2001:2:0:1::1/64
    server 198.19.0.10    pfls0p(22) ── pfls0 0x100001  slot 0 s_in   198.19.0.1/24  2001:2:0:2::1/64
    2001:2:0:2::10                                                    (+ 198.19.0.5/32: local, not the graph's)
    client 198.18.1.10    pflc1p(23) ── pflc1 0x100002  slot 1 c_in   198.18.1.1/24
    server 198.19.1.10    pfls1p(24) ── pfls1 0x100003  slot 1 s_in   198.19.1.1/24
                          pflhi 0x101000 ── pflu2 0x100004  slot 2 (never enabled); pflhi and 21 are
                                                            out of the slot range
    neighbours (permanent): clients on c_in, servers on s_in of their slot, with the MACs below
    routes: 198.19.8.0/24 and 2001:2:0:3::/64 via a gateway with no neighbour entry (NO_NEIGH),
            198.19.9.0/24 blackhole (a FIB miss); fwmark 1 -> table 100: local 0.0.0.0/0 dev lo
    slot 0: ENABLED, listen_port 50080, intercepts 80, 443, 4011, 8000-8081; its 4 addresses
    slot 1: ENABLED | ASSIGN | ALL_PORTS | ORIGIN_SYNS, listen_port 50081; its 2 addresses
    listeners (real sockets in the namespace): [::]:50080 (dual stack), 0.0.0.0:50081 (transparent)
    a real established connection 198.18.1.1:40900 <-> 198.19.1.1:7000

How right is told from wrong: each case is a list of packets made by scapy, sent on one interface
(ctx.ifindex and ingress_ifindex name it), and for each the test checks the verdict (TC_ACT_*),
the exact bytes the program leaves, the skb mark it leaves (set only on a segment of an existing
socket's flow: a hand-over by bpf_sk_assign is refused in a test run, see below),
and the exact change of every counter of slots 0, 1 and 2 (one that should not move must not).
A bypassed packet is routed for real by bpf_fib_lookup in that namespace, so its expected bytes are
those the stack's forwarding would make: MACs of the egress device and of the neighbour, TTL / hop
limit minus one, a valid IPv4 header checksum. test_run does not carry out a redirect: where the
packet would go shows in its MACs. Cases then check the entries left in flows_new and flows.

Listener lookups (bpf_skc_lookup_tcp) search the namespace of the thread running the test, which
holds the real listeners: closing one is how a case makes the proxy "die". bpf_sk_assign always
fails in BPF_PROG_TEST_RUN (-EOPNOTSUPP: not at tc ingress), so on the ASSIGN graph (slot 1) a
first SYN that finds the listener shows assign_failed and fails open, and a segment whose socket
exists shows assign_failed: that is the proof the lookup found it. test_syncookie_live attaches the
program to slot 1's c_in for real and carries one handshake answered by a SYN cookie.
"""

from __future__ import annotations

import select
import socket
import struct
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from scapy.layers.inet import ICMP, IP, TCP, UDP, IPOption_NOP
from scapy.layers.inet6 import ICMPv6EchoRequest, IPv6, IPv6ExtHdrHopByHop
from scapy.layers.l2 import ARP, Ether
from scapy.packet import Packet, Raw

from pepctl import bpfsys, experiment
from pepctl import flow_maps as fm

NAME_PREFIX = "pfl"   # names of the pins and namespace (tests/bpf/conftest.py)
REPO = Path(__file__).resolve().parents[2]
OBJECT = REPO / "tc" / "flow.o"

TC_ACT_OK, TC_ACT_SHOT, TC_ACT_REDIRECT = 0, 2, 7
VERDICTS = {TC_ACT_OK: "TC_ACT_OK", TC_ACT_SHOT: "TC_ACT_SHOT", TC_ACT_REDIRECT: "TC_ACT_REDIRECT"}
IP_TRANSPARENT = 19   # <linux/in.h>

C_IN0, S_IN0 = fm.ifindexes(0)
C_IN1, S_IN1 = fm.ifindexes(1)
UNUSED_SLOT = fm.ifindexes(2)[0]                 # in the range, slot 2 never enabled
ABOVE_RANGE = fm.IFINDEX_BASE + 2 * fm.GRAPHS_MAX  # the first ifindex past the last slot
BELOW_RANGE = 21
SLOTS = (0, 1, 2)                                # whose counters every step watches
# side name -> (ifindex, graph slot whose counters move; None: none may)
SIDES = {"access": (C_IN0, 0), "origin": (S_IN0, 0), "access1": (C_IN1, 1), "origin1": (S_IN1, 1),
         "unused-slot": (UNUSED_SLOT, None), "below-range": (BELOW_RANGE, None),
         "above-range": (ABOVE_RANGE, None),
         # flow_egress: the proxy's own segments leaving c_in (to the subscriber) or s_in (to the origin);
         # fwd-to-origin: a segment forwarded from c_in leaving s_in (ingress_ifindex c_in's)
         "to-access": (C_IN0, 0), "to-origin": (S_IN0, 0), "fwd-to-origin": (S_IN0, 0)}

CLIENT, CLIENT2, SERVER = "198.18.0.10", "198.18.0.11", "198.19.0.10"
CLIENT6, SERVER6 = "2001:2:0:1::10", "2001:2:0:2::10"
CLIENT1, SERVER1 = "198.18.1.10", "198.19.1.10"
G0_ADDRS = ("198.18.0.1", "198.19.0.1", "2001:2:0:1::1", "2001:2:0:2::1")
G1_ADDRS = ("198.18.1.1", "198.19.1.1")
OTHER_LOCAL = "198.19.0.5"           # an address of the namespace that is not one of the graph's
FAR_SERVER, HOLE_SERVER, FAR_SERVER6 = "198.19.8.10", "198.19.9.10", "2001:2:0:3::10"
# 198.18.0.0/24 with its bytes reversed. Only ever inside BPF_PROG_TEST_RUN, never on a link.
DECOY = "0.0.18.198"

C_IN_MAC = {0: "02:00:00:00:01:01", 1: "02:00:00:01:01:01"}
S_IN_MAC = {0: "02:00:00:00:02:01", 1: "02:00:00:01:02:01"}
HOST_MAC = {CLIENT: "02:00:00:00:01:0a", CLIENT2: "02:00:00:00:01:0b", CLIENT6: "02:00:00:00:01:0a",
            DECOY: "02:00:00:00:01:0a", SERVER: "02:00:00:00:02:0a", SERVER6: "02:00:00:00:02:0a",
            CLIENT1: "02:00:00:01:01:0a", SERVER1: "02:00:00:01:02:0a"}
# destination -> (MAC of the egress device, MAC of the neighbour) as the FIB answers
NEXT_HOP = {CLIENT: (C_IN_MAC[0], HOST_MAC[CLIENT]), CLIENT2: (C_IN_MAC[0], HOST_MAC[CLIENT2]),
            CLIENT6: (C_IN_MAC[0], HOST_MAC[CLIENT6]), SERVER: (S_IN_MAC[0], HOST_MAC[SERVER]),
            SERVER6: (S_IN_MAC[0], HOST_MAC[SERVER6]), CLIENT1: (C_IN_MAC[1], HOST_MAC[CLIENT1]),
            SERVER1: (S_IN_MAC[1], HOST_MAC[SERVER1])}

LPORT0, LPORT1 = 50080, 50081
G0 = {"flags": fm.GRAPH_F_ENABLED, "listen_port": LPORT0, "addresses": G0_ADDRS,
      "intercept": [(80, 80), (443, 443), (4011, 4011), (8000, 8081)]}
G1 = {"flags": fm.GRAPH_F_ENABLED | fm.GRAPH_F_ASSIGN | fm.GRAPH_F_ALL_PORTS | fm.GRAPH_F_ORIGIN_SYNS,
      "listen_port": LPORT1, "addresses": G1_ADDRS, "intercept": []}
EST_CLIENT, EST_SERVER = ("198.18.1.1", 40900), ("198.19.1.1", 7000)   # the real established pair
# Local addresses of slot 1's sides that are not the graph's own: the ends of the connections whose
# TIME_WAIT sockets the cases make (a SYN to the graph's own addresses is dropped before anything).
TW_CLIENT, TW_SERVER = "198.18.1.5", "198.19.1.5"

NETNS_SETUP = [
    ["link", "add", "pflc0", "index", str(C_IN0), "type", "veth", "peer", "name", "pflc0p", "index", "21"],
    ["link", "add", "pfls0", "index", str(S_IN0), "type", "veth", "peer", "name", "pfls0p", "index", "22"],
    ["link", "add", "pflc1", "index", str(C_IN1), "type", "veth", "peer", "name", "pflc1p", "index", "23"],
    ["link", "add", "pfls1", "index", str(S_IN1), "type", "veth", "peer", "name", "pfls1p", "index", "24"],
    ["link", "add", "pflu2", "index", str(UNUSED_SLOT), "type", "veth", "peer", "name", "pflhi", "index",
     str(ABOVE_RANGE)],
    ["link", "set", "pflc0", "address", C_IN_MAC[0]],
    ["link", "set", "pfls0", "address", S_IN_MAC[0]],
    ["link", "set", "pflc1", "address", C_IN_MAC[1]],
    ["link", "set", "pfls1", "address", S_IN_MAC[1]],
    ["addr", "add", "198.18.0.1/24", "dev", "pflc0"],
    ["addr", "add", "2001:2:0:1::1/64", "dev", "pflc0", "nodad"],
    ["addr", "add", "198.19.0.1/24", "dev", "pfls0"],
    ["addr", "add", f"{OTHER_LOCAL}/32", "dev", "pfls0"],
    ["addr", "add", f"{TW_CLIENT}/32", "dev", "pflc1"],
    ["addr", "add", f"{TW_SERVER}/32", "dev", "pfls1"],
    ["addr", "add", "2001:2:0:2::1/64", "dev", "pfls0", "nodad"],
    ["addr", "add", "198.18.1.1/24", "dev", "pflc1"],
    ["addr", "add", "198.19.1.1/24", "dev", "pfls1"],
    *(["link", "set", dev, "up"] for dev in ("lo", "pflc0", "pflc0p", "pfls0", "pfls0p", "pflc1", "pflc1p",
                                             "pfls1", "pfls1p", "pflu2", "pflhi")),
    *(["neigh", "add", host, "lladdr", HOST_MAC[host], "dev", dev, "nud", "permanent"]
      for host, dev in ((CLIENT, "pflc0"), (CLIENT2, "pflc0"), (CLIENT6, "pflc0"), (SERVER, "pfls0"),
                        (SERVER6, "pfls0"), (CLIENT1, "pflc1"), (SERVER1, "pfls1"))),
    ["route", "add", "198.19.8.0/24", "via", "198.19.0.254", "dev", "pfls0"],
    ["route", "add", "2001:2:0:3::/64", "via", "2001:2:0:2::fe", "dev", "pfls0"],
    ["route", "add", "blackhole", "198.19.9.0/24"],
    # How a packet handed to a socket (PEP_LOCAL_MARK) is delivered: test_syncookie_live.
    ["rule", "add", "fwmark", str(fm.LOCAL_MARK), "lookup", "100"],
    ["route", "add", "local", "0.0.0.0/0", "dev", "lo", "table", "100"],
    # Route mode's interception of port 80 on slot 0 (pepctl/plan.py interception_lines): what the
    # datapath forwards must be routed past it, as the main table routes it (tc/flow_fwd.h route_of).
    ["rule", "add", "iif", "pflc0", "ipproto", "tcp", "dport", "80", "lookup", "100"],
    ["rule", "add", "iif", "pfls0", "ipproto", "tcp", "sport", "80", "lookup", "100"],
]
# The peers only ever carry test_syncookie_live's frames: no IPv6 chatter on them. Syncookies
# always (2), so that a real SYN is answered by one.
SYSCTLS = ["net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1", "net.ipv4.tcp_syncookies=2",
           *(f"net.ipv6.conf.{dev}.disable_ipv6=1" for dev in ("pflc0p", "pfls0p", "pflc1p", "pfls1p", "pflhi"))]


# -- packets ------------------------------------------------------------------------------------
def on_access(l3: Packet, slot: int = 0) -> Packet:
    return Ether(src=HOST_MAC.get(l3.src, HOST_MAC[CLIENT]), dst=C_IN_MAC[slot]) / l3


def on_origin(l3: Packet, slot: int = 0) -> Packet:
    return Ether(src=HOST_MAC.get(l3.src, HOST_MAC[SERVER]), dst=S_IN_MAC[slot]) / l3


def tcp(src: str, sport: int, dst: str, dport: int, flags: str, seq: int, ack: int, ttl: int = 64,
        opts: tuple = (), **ip) -> Packet:
    seg = TCP(sport=sport, dport=dport, flags=flags, seq=seq, ack=ack, options=list(opts))
    if ":" in src:
        return IPv6(src=src, dst=dst, hlim=ttl, **ip) / seg
    return IP(src=src, dst=dst, ttl=ttl, **ip) / seg


def syn(sport: int, dport: int = 80, src: str = CLIENT, dst: str = SERVER, flags: str = "S", seq: int = 1000,
        ack: int = 0, slot: int = 0, **kw) -> Packet:
    """A segment from the access side; by default the first SYN of a flow (ISN 1000)."""
    return on_access(tcp(src, sport, dst, dport, flags, seq, ack, **kw), slot)


def ack(sport: int, dport: int = 80, src: str = CLIENT, dst: str = SERVER, flags: str = "A", seq: int = 1001,
        ack: int = 5001, **kw) -> Packet:
    """The opener's ACK of the SYN-ACK (ISN 5000), or another access-side segment of the flow."""
    return syn(sport, dport, src, dst, flags=flags, seq=seq, ack=ack, **kw)


def reply(sport: int, dport: int, src: str = SERVER, dst: str = CLIENT, flags: str = "SA", ack: int = 1001,
          seq: int = 5000, slot: int = 0, **kw) -> Packet:
    """A segment from the origin side; by default the SYN-ACK (ISN 5000) of the SYN of ISN 1000."""
    return on_origin(tcp(src, sport, dst, dport, flags, seq, ack, **kw), slot)


def syn1(sport: int, dport: int = 80, src: str = CLIENT1, dst: str = SERVER1, **kw) -> Packet:
    """syn() on slot 1's c_in, between its client and server."""
    return syn(sport, dport, src, dst, slot=1, **kw)


def ack1(sport: int, dport: int = 80, **kw) -> Packet:
    return ack(sport, dport, src=CLIENT1, dst=SERVER1, slot=1, **kw)


def reply1(sport: int, dport: int, **kw) -> Packet:
    return reply(sport, dport, src=SERVER1, dst=CLIENT1, slot=1, **kw)


def with_src_mac(frame: Packet, mac: str) -> Packet:
    """frame as if another host on the segment had sent it."""
    out = frame.copy()
    out[Ether].src = mac
    return out


def routed(frame: Packet, macs: tuple[str, str] | None) -> Packet:
    """frame as forwarding leaves it: TTL / hop limit - 1 (checksum recomputed by scapy) and, when
    given, the MACs of the egress device and the next hop."""
    out = frame.copy()
    if macs:
        out[Ether].src, out[Ether].dst = macs
    if IP in out:
        out[IP].ttl -= 1
        out[IP].chksum = None
    else:
        out[IPv6].hlim -= 1
    return out


def fwd(frame: Packet) -> Packet:
    """Forwarded to its destination's neighbour."""
    return routed(frame, NEXT_HOP[(frame[IP] if IP in frame else frame[IPv6]).dst])


def ttl_only(frame: Packet) -> Packet:
    """Sent by bpf_redirect_neigh: the kernel writes the MACs after test_run has returned."""
    return routed(frame, None)


def cnt(**moves: int) -> dict[str, int]:
    unknown = set(moves) - set(fm.COUNTERS)
    assert not unknown, f"no such counters: {unknown}"
    return moves


BYPASSED = cnt(pkts_bypassed=1)
NEW_BYPASS = cnt(flows_bypass_rule=1, pkts_bypassed=1)
NEW_PROXY = cnt(flows_proxied=1)
NEW_MPTCP = cnt(flows_bypass_mptcp=1, pkts_bypassed=1)
# The honest handshake: a probe forwarded; an answer made the opener's SYN, which the listener refuses in
# a test run (bpf_sk_assign), so it is put in at the opener's interface (TC_ACT_REDIRECT).
PROBED = cnt(syns_probed=1, pkts_bypassed=1)
ACCEPTED = cnt(origin_accepted=1, assign_failed=1)
# TCP options of a Linux SYN, and RFC 8684's MPTCP options: MP_CAPABLE (subtype 0, version 1, flag
# A: checksums; v1 SYNs carry no key) and MP_JOIN (subtype 1, the receiver's token, a nonce).
LINUX_OPTS = (("MSS", 1460), ("SAckOK", b""), ("Timestamp", (123456, 0)), ("NOP", None), ("WScale", 7))
MP_CAPABLE = (30, bytes([0x01, 0x81]))
MP_JOIN = (30, bytes([0x10, 0x00]) + b"\x0b\xad\xca\xfe" + b"\x12\x34\x56\x78")
FAILOPEN = cnt(flows_bypass_failopen=1, pkts_bypassed=1)
ASSIGN_REFUSED = cnt(assign_failed=1, flows_bypass_failopen=1, pkts_bypassed=1)   # slot 1, listener up
NO_FLOW = cnt(pkts_no_flow=1)
PROMOTED = cnt(flows_promoted=1, pkts_bypassed=1)
STALE = cnt(flows_stale=1, pkts_no_flow=1)


# -- cases --------------------------------------------------------------------------------------
@dataclass
class Send:
    side: str                       # a key of SIDES
    frame: Packet | bytes | Callable    # a callable makes it from the datapath (dp.seen: what a Do saw)
    verdict: int
    out: Packet | bytes | Callable | None = None   # None: must come out unchanged
    counters: dict[str, int] = field(default_factory=dict)   # of the side's slot; all others stay
    mark: int = 0                   # the skb mark left: PEP_LOCAL_MARK on a segment of a socket's flow
    mark_in: int = 0                # the skb mark it comes with


@dataclass
class Do:
    what: str
    fn: Callable[[FlowDatapath], object]


@dataclass
class Flow:
    sub: str
    sub_port: int
    org: str
    org_port: int
    table: str | None               # flows_new | flows | None: in neither
    verdict: str = "bypass_rule"
    syn_seq: int = 1000
    state: str | None = None        # checked when given: syn_seen, synack_seen, established, closing
    graph: int = 0
    fins: int | None = None


@dataclass
class Check:
    """The flow tables in the middle of a case."""
    flows: list[Flow]


@dataclass
class Case:
    id: str
    desc: str
    steps: list[Send | Do | Check]
    rules: dict[int, dict] = field(default_factory=dict)   # slot -> add_rules() arguments
    flows: list[Flow] = field(default_factory=list)       # checked after the last step


def add_rules(slot: int, **rules) -> Do:
    return Do(f"add rules {rules} to slot {slot}", lambda dp: fm.add_rules(dp.pins, slot, **rules))


def del_rules(slot: int, **rules) -> Do:
    return Do(f"remove rules {rules} of slot {slot}", lambda dp: fm.del_rules(dp.pins, slot, **rules))


def listener(port: int, up: bool) -> Do:
    return Do(f"listener on port {port} {'opened' if up else 'closed'}",
              lambda dp: dp.listen(port) if up else dp.unlisten(port))


def time_wait(cport: int, sport: int, at_client: bool = False) -> Do:
    def make(dp):
        dp.seen["rcv_nxt"] = dp.run_in_ns(_time_wait, cport, sport, at_client)
    if at_client:
        return Do(f"a TIME_WAIT socket {TW_CLIENT}:{cport} -> {TW_SERVER}:{sport}", make)
    return Do(f"a TIME_WAIT socket {TW_SERVER}:{sport} <- {TW_CLIENT}:{cport}", make)


def honest() -> Do:
    return graph_flags(1, G1["flags"] | fm.GRAPH_F_HONEST, LPORT1)


# What Linux's SYN and a SYN-ACK offer, as marks flags.
SUB_OFFERS = fm.MARK_F_SUB_SACK | fm.MARK_F_SUB_TS | fm.MARK_F_SUB_OPTS
ORG_OFFERS = fm.MARK_F_ORG_SACK | fm.MARK_F_ORG_TS | fm.MARK_F_ORG_OPTS
ORIGIN_OPTS = (("MSS", 1400), ("SAckOK", b""), ("Timestamp", (777, 123456)), ("NOP", None), ("WScale", 9))
# The SYNs the honest handshake must give back byte for byte: IP fields and options of their own.
H_SYN = syn1(40170, opts=LINUX_OPTS, tos=0x88, id=4011, ttl=61)
H_SYN6 = on_access(IPv6(src=CLIENT6, dst=SERVER6, tc=0x20, fl=0xFAB12, hlim=63)
                   / TCP(sport=40174, dport=80, flags="S", seq=1000, window=4011, options=list(LINUX_OPTS)))


def expect_marks(flow: tuple, want: tuple | None) -> Do:
    def check(dp):
        got = dp.marks(*flow)
        assert got == want, f"marks of {flow}: expected {want}, got {got}"
    return Do(f"marks of {flow} are {want}", check)


def conns(slot: int, n: int) -> Do:
    """flow_conns' count of slot (GRAPHS_MAX: all graphs) set to n, as if it had counted them."""
    def write(dp):
        with fm.open_map(dp.pins, "conns") as m:
            m.update(fm.U32.pack(slot), fm.U64.pack(n))
    return Do(f"conns[{slot}] = {n}", write)


def limits(slot: int, maxconn: int, host_maxconn: int) -> Do:
    g = {0: G0, 1: G1}[slot]
    return Do(f"slot {slot}: maxconn {maxconn}, host_maxconn {host_maxconn}",
              lambda dp: fm.set_flags(dp.pins, slot, g["flags"], g["listen_port"], limits=(maxconn, host_maxconn)))


def _full_queue(port: int) -> list[socket.socket]:
    """A listener on port with backlog 0 and a connection waiting in its accept queue: full (the
    kernel would drop the next handshake's last ACK). Returns the sockets."""
    lis = socket.socket(socket.AF_INET6)
    lis.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    lis.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lis.bind(("::", port))
    lis.listen(0)
    cli = socket.socket()
    cli.settimeout(5)
    cli.connect(("198.18.0.1", port))
    return [lis, cli]


def full_queue(port: int) -> Do:
    def make(dp):
        dp.unlisten(port)
        dp.owned.extend(dp.run_in_ns(_full_queue, port))
    return Do(f"listener {port} with a full accept queue", make)


def expect_syn(flow: tuple, want: str | None) -> Do:
    def check(dp):
        got = dp.syn_state(*flow)
        assert got == want, f"honest-handshake record of {flow}: expected {want}, got {got}"
    return Do(f"the record of {flow} is {want}", check)


def marks(flow: tuple, sub_dscp: int, org_dscp: int, flags: int, sub_mss: int = 0, org_mss: int = 0,
          seen: int = 0) -> Do:
    return Do(f"marks of {flow} set to {sub_dscp:#x}, {org_dscp:#x}, {flags:#x}, seen {seen:#x}, MSS {sub_mss}, "
              f"{org_mss}", lambda dp: dp.set_marks(flow, sub_dscp, org_dscp, flags, sub_mss, org_mss, seen))


def tw_syn(cport: int, sport: int, seq: int) -> Packet:
    return on_access(IP(src=TW_CLIENT, dst=TW_SERVER) / TCP(sport=cport, dport=sport, flags="S",
                                                             seq=seq & 0xFFFFFFFF), 1)


def _put_flow_new(dp, flow: tuple, value: bytes) -> None:
    with fm.open_map(dp.pins, "flows_new") as m:
        m.update(fm.flow_key(*flow), value)


def graph_flags(slot: int, flags: int, listen_port: int) -> Do:
    return Do(f"slot {slot}: flags {flags:#x}, listen_port {listen_port}",
              lambda dp: fm.set_flags(dp.pins, slot, flags, listen_port))


C32 = {0: {"clients": [f"{CLIENT}/32"]}}
C32_1 = {1: {"clients": [f"{CLIENT1}/32"]}}


def handshake(sport: int, **kw) -> list[Send]:
    """SYN, SYN-ACK and ACK of a flow of slot 0 bypassed by a rule: ends in flows."""
    return [Send("access", syn(sport, **kw), TC_ACT_REDIRECT, fwd(syn(sport, **kw)), NEW_BYPASS),
            Send("origin", reply(80, sport), TC_ACT_REDIRECT, fwd(reply(80, sport)), BYPASSED),
            Send("access", ack(sport), TC_ACT_REDIRECT, fwd(ack(sport)), PROMOTED)]


def established(sport: int, **kw) -> Flow:
    return Flow(CLIENT, sport, SERVER, 80, "flows", state="established", **kw)


CASES = [
    # -- not TCP, or no TCP header we read: the stack's, counted not_tcp in the slot's counters
    Case("udp4", "UDP goes to the stack", [
        Send("access", on_access(IP(src=CLIENT, dst=SERVER) / UDP(sport=5353, dport=53) / b"q"),
             TC_ACT_OK, counters=cnt(pkts_not_tcp=1))]),
    Case("icmp4", "ICMP from the origin side goes to the stack, even for a bypassed client", [
        Send("origin", on_origin(IP(src=SERVER, dst=CLIENT) / ICMP()), TC_ACT_OK,
             counters=cnt(pkts_not_tcp=1))], rules=C32),
    Case("icmp6", "ICMPv6 goes to the stack", [
        Send("access", on_access(IPv6(src=CLIENT6, dst=SERVER6) / ICMPv6EchoRequest()), TC_ACT_OK,
             counters=cnt(pkts_not_tcp=1))]),
    Case("arp", "ARP goes to the stack", [
        Send("access", Ether(src=HOST_MAC[CLIENT], dst="ff:ff:ff:ff:ff:ff") / ARP(psrc=CLIENT, pdst="198.18.0.1"),
             TC_ACT_OK, counters=cnt(pkts_not_tcp=1))]),
    Case("fragments", "IPv4 fragments (first and later) are never bypassed: one path for all pieces", [
        Send("access", on_access(IP(src=CLIENT, dst=SERVER, flags="MF") / TCP(sport=40030, dport=80, flags="S")),
             TC_ACT_OK, counters=cnt(pkts_not_tcp=1)),
        Send("access", on_access(IP(src=CLIENT, dst=SERVER, proto=6, frag=3) / Raw(b"x" * 24)), TC_ACT_OK,
             counters=cnt(pkts_not_tcp=1))],
        rules=C32, flows=[Flow(CLIENT, 40030, SERVER, 80, None)]),
    Case("v6-ext-header", "IPv6 with a hop-by-hop header before TCP is passed, not parsed", [
        Send("access", on_access(IPv6(src=CLIENT6, dst=SERVER6) / IPv6ExtHdrHopByHop()
                                 / TCP(sport=40031, dport=80, flags="S", seq=1000)),
             TC_ACT_OK, counters=cnt(pkts_not_tcp=1))],
        rules={0: {"clients": ["2001:2:0:1::/64"]}}, flows=[Flow(CLIENT6, 40031, SERVER6, 80, None)]),
    Case("tcp-truncated", "a TCP header cut short is left to the stack", [
        Send("access", bytes(syn(40032, ttl=5))[:14 + 20 + 10], TC_ACT_OK, counters=cnt(pkts_not_tcp=1))],
        rules=C32),
    Case("not-tcp-slot1", "slot 1's packets count in slot 1's counters only", [
        Send("access1", on_access(IP(src=CLIENT1, dst=SERVER1) / UDP(sport=5353, dport=53), 1), TC_ACT_OK,
             counters=cnt(pkts_not_tcp=1))]),
    # -- interfaces of no enabled slot: untouched, uncounted, unremembered
    Case("unused-slot", "an ifindex of slot 2 (in the range, never enabled)", [
        Send("unused-slot", syn(40034), TC_ACT_OK)],
        rules=C32, flows=[Flow(CLIENT, 40034, SERVER, 80, None), Flow(CLIENT, 40034, SERVER, 80, None, graph=2)]),
    Case("below-range", "an ifindex below PEP_IFINDEX_BASE", [
        Send("below-range", syn(40035), TC_ACT_OK)], rules=C32),
    Case("above-range", "the first ifindex past the last slot", [
        Send("above-range", syn(40036), TC_ACT_OK)], rules=C32),
    Case("disabled-slot", "slot 0 configured but without GRAPH_F_ENABLED: untouched, uncounted", [
        graph_flags(0, fm.GRAPH_F_ALL_PORTS | fm.GRAPH_F_ORIGIN_SYNS | fm.GRAPH_F_ASSIGN, LPORT0),
        Send("access", syn(40037), TC_ACT_OK),
        Send("origin", reply(80, 40037, flags="S"), TC_ACT_OK)],
        rules=C32, flows=[Flow(CLIENT, 40037, SERVER, 80, None)]),
    # -- 1. SYNs to the graph's own addresses: dropped, before any other step
    Case("self-v4", "SYNs to c_in's and s_in's IPv4 addresses are dropped, a client rule notwithstanding", [
        Send("access", syn(40100, 22, dst="198.18.0.1"), TC_ACT_SHOT, counters=cnt(syn_to_self=1)),
        Send("access", syn(40101, 80, dst="198.19.0.1"), TC_ACT_SHOT, counters=cnt(syn_to_self=1))],
        rules=C32, flows=[Flow(CLIENT, 40100, "198.18.0.1", 22, None), Flow(CLIENT, 40101, "198.19.0.1", 80, None)]),
    Case("self-v6", "SYNs to c_in's and s_in's IPv6 addresses are dropped", [
        Send("access", syn(40102, 22, src=CLIENT6, dst="2001:2:0:1::1"), TC_ACT_SHOT, counters=cnt(syn_to_self=1)),
        Send("access", syn(40103, 80, src=CLIENT6, dst="2001:2:0:2::1"), TC_ACT_SHOT,
             counters=cnt(syn_to_self=1))]),
    Case("self-from-origin", "origin-side SYNs to the graph's addresses are dropped (before the side check)", [
        Send("origin", reply(40104, 22, dst="198.19.0.1", flags="S", ack=0), TC_ACT_SHOT,
             counters=cnt(syn_to_self=1)),
        Send("origin", reply(40105, 80, src=SERVER6, dst="2001:2:0:1::1", flags="S", ack=0), TC_ACT_SHOT,
             counters=cnt(syn_to_self=1))]),
    Case("self-per-graph", "slot 1's addresses are not slot 0's, and the reverse", [
        Send("access", syn(40106, 80, dst="198.18.1.1"), TC_ACT_OK, counters=NEW_PROXY),
        Send("access1", syn1(40107, 80, dst="198.18.1.1"), TC_ACT_SHOT, counters=cnt(syn_to_self=1)),
        Send("access1", syn1(40108, 80, dst="198.19.0.1"), TC_ACT_OK, counters=cnt(assign_failed=1,
                                                                                     flows_bypass_failopen=1))]),
    # -- 2. ports and directions a graph does not intercept: the stack's, not remembered
    Case("port-not-intercepted", "a SYN to port 22 (not in intercept_ports): to the stack, a rule notwithstanding",
         [Send("access", syn(40110, 22), TC_ACT_OK, counters=cnt(flows_not_intercepted=1)),
          Send("origin", reply(22, 40110), TC_ACT_OK, counters=NO_FLOW)],
         rules=C32, flows=[Flow(CLIENT, 40110, SERVER, 22, None)]),
    Case("intercept-byte-order", "intercept port 4011 (0x0FAB) is intercepted, 43791 (0xAB0F) is not", [
        Send("access", syn(40111, 4011), TC_ACT_OK, counters=NEW_PROXY),
        Send("access", syn(40112, 43791), TC_ACT_OK, counters=cnt(flows_not_intercepted=1))]),
    Case("origin-syn-not-intercepted", "slot 0 intercepts no origin-side SYN, to an intercepted port and a "
         "client rule notwithstanding", [
        Send("origin", reply(40113, 80, flags="S", ack=0), TC_ACT_OK, counters=cnt(flows_not_intercepted=1))],
        rules=C32, flows=[Flow(CLIENT, 80, SERVER, 40113, None, syn_seq=5000)]),
    Case("origin-syn-slot1", "slot 1 (ORIGIN_SYNS) decides origin-side SYNs: the port rule is the SYN's "
         "destination port, the subscriber its destination", [
        Send("origin1", reply1(80, 4011, flags="S", ack=0), TC_ACT_REDIRECT,
             fwd(reply1(80, 4011, flags="S", ack=0)), NEW_BYPASS),
        Send("access1", syn1(4011, 80, flags="SA", seq=1000, ack=5001), TC_ACT_REDIRECT,
             fwd(syn1(4011, 80, flags="SA", seq=1000, ack=5001)), BYPASSED),
        Send("origin1", reply1(80, 4011, flags="A", seq=5001, ack=1001), TC_ACT_REDIRECT,
             fwd(reply1(80, 4011, flags="A", seq=5001, ack=1001)), PROMOTED)],
        rules={1: {"ports": [(4011, 4011)]}},
        flows=[Flow(CLIENT1, 4011, SERVER1, 80, "flows", syn_seq=5000, state="established", graph=1)]),
    Case("all-ports-slot1", "slot 1 (ALL_PORTS) intercepts port 22: to the listener (assign refused here)", [
        Send("access1", syn1(40114, 22), TC_ACT_REDIRECT, fwd(syn1(40114, 22)), ASSIGN_REFUSED)],
        flows=[Flow(CLIENT1, 40114, SERVER1, 22, "flows_new", "bypass_failopen", graph=1)]),
    # -- 3. rules
    Case("client32", "client /32 rule: that client is bypassed and routed, the next one proxied", [
        Send("access", syn(40003, src=CLIENT2), TC_ACT_REDIRECT, fwd(syn(40003, src=CLIENT2)), NEW_BYPASS),
        Send("access", syn(40004), TC_ACT_OK, counters=NEW_PROXY)],
        rules={0: {"clients": [f"{CLIENT2}/32"]}},
        flows=[Flow(CLIENT2, 40003, SERVER, 80, "flows_new", state="syn_seen"), Flow(CLIENT, 40004, SERVER, 80, None)]),
    Case("client24", "client /24 rule", [
        Send("access", syn(40005), TC_ACT_REDIRECT, fwd(syn(40005)), NEW_BYPASS)],
        rules={0: {"clients": ["198.18.0.0/24"]}}, flows=[Flow(CLIENT, 40005, SERVER, 80, "flows_new")]),
    Case("client-exception", "a /32 stored with 0 inside a /24 rule carves an exception", [
        Do("store 198.18.0.10/32 with 0 in bypass_client4",
           lambda dp: dp.write_lpm("bypass_client4", 0, f"{CLIENT}/32", fm.ABSENT)),
        Send("access", syn(40009), TC_ACT_OK, counters=NEW_PROXY),
        Send("access", syn(40010, src=CLIENT2), TC_ACT_REDIRECT, fwd(syn(40010, src=CLIENT2)), NEW_BYPASS)],
        rules={0: {"clients": ["198.18.0.0/24"]}}),
    Case("server-prefix", "server prefix rule", [
        Send("access", syn(40006), TC_ACT_REDIRECT, fwd(syn(40006)), NEW_BYPASS)],
        rules={0: {"servers": ["198.19.0.0/24"]}}, flows=[Flow(CLIENT, 40006, SERVER, 80, "flows_new")]),
    Case("prefix-byte-order", "198.18.0.0/24 does not match 0.0.18.198 (its bytes reversed)", [
        Send("access", syn(40007, src=DECOY), TC_ACT_OK, counters=NEW_PROXY)],
        rules={0: {"clients": ["198.18.0.0/24"], "servers": ["198.19.0.0/32"]}},
        flows=[Flow(DECOY, 40007, SERVER, 80, None)]),
    Case("port-range", "a port range covers its ends and not its neighbours", [
        Send("access", syn(40040, 8000), TC_ACT_REDIRECT, fwd(syn(40040, 8000)), NEW_BYPASS),
        Send("access", syn(40041, 8080), TC_ACT_REDIRECT, fwd(syn(40041, 8080)), NEW_BYPASS),
        Send("access", syn(40042, 8081), TC_ACT_OK, counters=NEW_PROXY)],
        rules={0: {"ports": [(8000, 8080)]}}),
    Case("port-4011", "port rule 4011 (0x0FAB) on slot 1: 4011 bypassed, 43791 (0xAB0F) not", [
        Send("access1", syn1(40008, 4011), TC_ACT_REDIRECT, fwd(syn1(40008, 4011)), NEW_BYPASS),
        Send("access1", syn1(40009, 43791), TC_ACT_REDIRECT, fwd(syn1(40009, 43791)), ASSIGN_REFUSED)],
        rules={1: {"ports": [(4011, 4011)]}},
        flows=[Flow(CLIENT1, 40008, SERVER1, 4011, "flows_new", graph=1),
               Flow(CLIENT1, 40009, SERVER1, 43791, "flows_new", "bypass_failopen", graph=1)]),
    Case("port-43791", "port rule 43791 (0xAB0F) on slot 1: 43791 bypassed, 4011 not", [
        Send("access1", syn1(40010, 4011), TC_ACT_REDIRECT, fwd(syn1(40010, 4011)), ASSIGN_REFUSED),
        Send("access1", syn1(40011, 43791), TC_ACT_REDIRECT, fwd(syn1(40011, 43791)), NEW_BYPASS)],
        rules={1: {"ports": [(43791, 43791)]}}),
    Case("v6-client64", "IPv6 client /64: SYN routed (hop limit - 1), SYN-ACK routed back", [
        Send("access", syn(40013, src=CLIENT6, dst=SERVER6), TC_ACT_REDIRECT,
             fwd(syn(40013, src=CLIENT6, dst=SERVER6)), NEW_BYPASS),
        Send("origin", reply(80, 40013, src=SERVER6, dst=CLIENT6), TC_ACT_REDIRECT,
             fwd(reply(80, 40013, src=SERVER6, dst=CLIENT6)), BYPASSED)],
        rules={0: {"clients": ["2001:2:0:1::/64"]}},
        flows=[Flow(CLIENT6, 40013, SERVER6, 80, "flows_new", state="synack_seen")]),
    Case("v6-server", "IPv6 server rule", [
        Send("access", syn(40043, src=CLIENT6, dst=SERVER6), TC_ACT_REDIRECT,
             fwd(syn(40043, src=CLIENT6, dst=SERVER6)), NEW_BYPASS)],
        rules={0: {"servers": [f"{SERVER6}/128"]}}),
    Case("v4-rule-not-v6", "an IPv4 client rule says nothing about the client's IPv6 flows", [
        Send("access", syn(40044, src=CLIENT6, dst=SERVER6), TC_ACT_OK, counters=NEW_PROXY)],
        rules={0: {"clients": ["198.18.0.0/24"]}}),
    Case("ip-options", "IPv4 header with options (IHL 6): ports read after them, TTL patched", [
        Send("access", syn(40023, options=[IPOption_NOP()] * 4), TC_ACT_REDIRECT,
             fwd(syn(40023, options=[IPOption_NOP()] * 4)), NEW_BYPASS)],
        rules=C32, flows=[Flow(CLIENT, 40023, SERVER, 80, "flows_new")]),
    Case("before-the-answer", "a bypassed flow whose SYN the origin has not answered yet: an earlier "
         "connection's segment on its 4-tuple from the origin (a late ACK) is dropped, not forwarded (the client "
         "would reset the new flow); the answer is forwarded, and so is a RST that refuses the SYN", [
        Send("access", syn(40024), TC_ACT_REDIRECT, fwd(syn(40024)), NEW_BYPASS),
        Send("origin", reply(80, 40024, flags="A", ack=777), TC_ACT_SHOT, counters=cnt(pkts_old_connection=1)),
        Send("origin", reply(80, 40024, flags="R", ack=0, seq=777), TC_ACT_SHOT,
             counters=cnt(pkts_old_connection=1)),
        Check([Flow(CLIENT, 40024, SERVER, 80, "flows_new", state="syn_seen")]),
        Send("origin", reply(80, 40024), TC_ACT_REDIRECT, fwd(reply(80, 40024)), BYPASSED),
        Send("access", syn(40025), TC_ACT_REDIRECT, fwd(syn(40025)), NEW_BYPASS),
        Send("origin", reply(80, 40025, flags="RA", seq=0), TC_ACT_REDIRECT, fwd(reply(80, 40025, flags="RA", seq=0)),
             BYPASSED)],
        rules=C32, flows=[Flow(CLIENT, 40024, SERVER, 80, "flows_new", state="synack_seen"),
                          Flow(CLIENT, 40025, SERVER, 80, None)]),
    Case("promotion-put-off", "a flow whose promotion was put off (FLOW_PROVEN: flows full, or no memory for "
         "its timer) is promoted by its next segment, from either end and whatever it acknowledges", [
        Do("a proven flow in flows_new (verdict bypass_rule, opener the access side)", lambda dp: _put_flow_new(
            dp, (CLIENT, 40027, SERVER, 80), fm.FLOW_NEW.pack(2, 1000, 5000, fm.SIDE_ACCESS, 3, 1))),
        Check([Flow(CLIENT, 40027, SERVER, 80, "flows_new", state="proven")]),
        Send("origin", reply(80, 40027, flags="PA", seq=9001, ack=1777), TC_ACT_REDIRECT,
             fwd(reply(80, 40027, flags="PA", seq=9001, ack=1777)), PROMOTED)],
        rules=C32, flows=[Flow(CLIENT, 40027, SERVER, 80, "flows", state="established")]),
    Case("rules-of-slot1", "slot 1's rules (clients, servers, port 80) never match slot 0's SYNs", [
        Send("access", syn(40046), TC_ACT_OK, counters=NEW_PROXY),
        Send("access1", syn1(40046), TC_ACT_REDIRECT, fwd(syn1(40046)), NEW_BYPASS)],
        rules={1: {"clients": ["198.18.0.0/15"], "servers": ["198.18.0.0/15"], "ports": [(80, 80)]}},
        flows=[Flow(CLIENT, 40046, SERVER, 80, None), Flow(CLIENT1, 40046, SERVER1, 80, "flows_new", graph=1)]),
    Case("rules-of-slot0", "slot 0's rules never match slot 1's SYNs", [
        Send("access1", syn1(40047), TC_ACT_REDIRECT, fwd(syn1(40047)), ASSIGN_REFUSED),
        Send("access", syn(40047), TC_ACT_REDIRECT, fwd(syn(40047)), NEW_BYPASS)],
        rules={0: {"clients": ["198.18.0.0/15"], "servers": ["198.18.0.0/15"], "ports": [(80, 80)]}},
        flows=[Flow(CLIENT1, 40047, SERVER1, 80, "flows_new", "bypass_failopen", graph=1),
               Flow(CLIENT, 40047, SERVER, 80, "flows_new")]),
    # -- 4, 5. the listener: PROXY, or fail open
    Case("proxy", "a listener on listen_port: PROXY, not remembered; its later segments, which its socket "
         "owns, are no_flow", [
        Send("access", syn(40001), TC_ACT_OK, counters=NEW_PROXY),
        Send("origin", reply(80, 40001), TC_ACT_OK, counters=NO_FLOW),
        Do("the listener's socket of the flow", lambda dp: dp.own(SERVER, 80, CLIENT, 40001)),
        Send("access", ack(40001), TC_ACT_OK, counters=NO_FLOW)],
        flows=[Flow(CLIENT, 40001, SERVER, 80, None)]),
    Case("unowned", "modes nft and route (slot 0): a segment of no flow and no socket to or from an "
         "intercepted port is nobody's here (a bypassed flow the tables lost): forwarded, never to the "
         "listener, which would reset it, nor to no socket (route mode takes the origin's by their source "
         "port); not remembered. To a port not intercepted: the stack's", [
        Send("access", ack(40190), TC_ACT_REDIRECT, fwd(ack(40190)), cnt(pkts_unowned=1, pkts_bypassed=1)),
        Send("access", ack(40190, flags="PA") / b"more", TC_ACT_REDIRECT, fwd(ack(40190, flags="PA") / b"more"),
             cnt(pkts_unowned=1, pkts_bypassed=1)),
        Send("access", ack(40190, flags="FA"), TC_ACT_REDIRECT, fwd(ack(40190, flags="FA")),
             cnt(pkts_unowned=1, pkts_bypassed=1)),
        Send("access", ack(40191, src=CLIENT6, dst=SERVER6, flags="R", ack=0), TC_ACT_REDIRECT,
             fwd(ack(40191, src=CLIENT6, dst=SERVER6, flags="R", ack=0)), cnt(pkts_unowned=1, pkts_bypassed=1)),
        Send("origin", reply(80, 40190, flags="PA") / b"answer", TC_ACT_REDIRECT,
             fwd(reply(80, 40190, flags="PA") / b"answer"), cnt(pkts_unowned=1, pkts_bypassed=1)),
        Send("access", ack(40190, dport=9999), TC_ACT_OK, counters=NO_FLOW),
        Send("origin", reply(9999, 40190, flags="A"), TC_ACT_OK, counters=NO_FLOW)],
        flows=[Flow(CLIENT, 40190, SERVER, 80, None), Flow(CLIENT6, 40191, SERVER6, 80, None)]),
    Case("proxy-v6", "the dual-stack listener takes IPv6 SYNs too", [
        Send("access", syn(40002, src=CLIENT6, dst=SERVER6), TC_ACT_OK, counters=NEW_PROXY)],
        flows=[Flow(CLIENT6, 40002, SERVER6, 80, None)]),
    Case("syn-retransmit-proxy", "a proxied flow is not remembered: its retransmitted SYN is decided again", [
        Send("access", syn(40018), TC_ACT_OK, counters=NEW_PROXY),
        Send("access", syn(40018), TC_ACT_OK, counters=NEW_PROXY)]),
    Case("failopen", "no listener: new SYNs fail open; the flow stays bypassed when the listener is back", [
        listener(LPORT0, False),
        Send("access", syn(40021), TC_ACT_REDIRECT, fwd(syn(40021)), FAILOPEN),
        Send("origin", reply(80, 40021), TC_ACT_REDIRECT, fwd(reply(80, 40021)), BYPASSED),
        listener(LPORT0, True),
        Send("access", ack(40021), TC_ACT_REDIRECT, fwd(ack(40021)), PROMOTED),
        Send("access", syn(40022), TC_ACT_OK, counters=NEW_PROXY)],
        flows=[Flow(CLIENT, 40021, SERVER, 80, "flows", "bypass_failopen"), Flow(CLIENT, 40022, SERVER, 80, None)]),
    # -- 4b. the proxy cannot take the flow now: end to end from its first SYN
    Case("overload-maxconn", "slot 0 at its maxconn (conns counted by flow_conns): BYPASS_OVERLOAD, forwarded "
         "and remembered; one connection fewer: proxied", [
        limits(0, 3, 0),
        conns(0, 3),
        Send("access", syn(40180), TC_ACT_REDIRECT, fwd(syn(40180)), cnt(flows_bypass_overload=1, pkts_bypassed=1)),
        Send("origin", reply(80, 40180), TC_ACT_REDIRECT, fwd(reply(80, 40180)), BYPASSED),
        conns(0, 2),
        Send("access", syn(40181), TC_ACT_OK, counters=NEW_PROXY),
        Send("access", ack(40180), TC_ACT_REDIRECT, fwd(ack(40180)), PROMOTED)],
        flows=[Flow(CLIENT, 40180, SERVER, 80, "flows", "bypass_overload", state="established")]),
    Case("overload-host", "all graphs together at the instance's maxconn: BYPASS_OVERLOAD; no limit (0): "
         "proxied", [
        limits(0, 0, 10),
        conns(fm.GRAPHS_MAX, 10),
        Send("access", syn(40182), TC_ACT_REDIRECT, fwd(syn(40182)), cnt(flows_bypass_overload=1, pkts_bypassed=1)),
        limits(0, 0, 0),
        Send("access", syn(40183), TC_ACT_OK, counters=NEW_PROXY)]),
    Case("overload-accept-queue", "a listener whose accept queue is full (read through CO-RE): BYPASS_OVERLOAD", [
        full_queue(LPORT0),
        Send("access", syn(40184), TC_ACT_REDIRECT, fwd(syn(40184)), cnt(flows_bypass_overload=1, pkts_bypassed=1))],
        flows=[Flow(CLIENT, 40184, SERVER, 80, "flows_new", "bypass_overload")]),
    Case("listen-port-0", "listen_port 0: the listener looked for is on the SYN's own port", [
        graph_flags(0, fm.GRAPH_F_ENABLED, 0),
        Send("access", syn(40024), TC_ACT_REDIRECT, fwd(syn(40024)), FAILOPEN),
        listener(443, True),
        Send("access", syn(40024, 443), TC_ACT_OK, counters=NEW_PROXY)],
        flows=[Flow(CLIENT, 40024, SERVER, 80, "flows_new", "bypass_failopen"),
               Flow(CLIENT, 40024, SERVER, 443, None)]),
    Case("assign-refused", "ASSIGN (slot 1), listener up: bpf_sk_assign refuses in a test run: assign_failed, "
         "fail open, forwarded", [
        Send("access1", syn1(40120), TC_ACT_REDIRECT, fwd(syn1(40120)), ASSIGN_REFUSED),
        Send("origin1", reply1(80, 40120), TC_ACT_REDIRECT, fwd(reply1(80, 40120)), BYPASSED)],
        flows=[Flow(CLIENT1, 40120, SERVER1, 80, "flows_new", "bypass_failopen", state="synack_seen", graph=1)]),
    Case("assign-no-listener", "ASSIGN (slot 1), no listener: fail open, no assign tried", [
        listener(LPORT1, False),
        Send("access1", syn1(40121), TC_ACT_REDIRECT, fwd(syn1(40121)), FAILOPEN)],
        flows=[Flow(CLIENT1, 40121, SERVER1, 80, "flows_new", "bypass_failopen", graph=1)]),
    Case("assign-own-socket", "ASSIGN (slot 1): segments of a tuple whose socket exists are marked for local "
         "delivery (the kernel's early demux finds the socket), both ways, before any flow table is looked "
         "up; a tuple with no socket is no_flow, unmarked", [
        Send("access1", on_access(tcp(*EST_CLIENT, *EST_SERVER, "A", 1, 1), 1), TC_ACT_OK,
             counters=cnt(pkts_assigned=1), mark=fm.LOCAL_MARK),
        Send("origin1", on_origin(tcp(*EST_SERVER, *EST_CLIENT, "PA", 1, 1) / b"x", 1), TC_ACT_OK,
             counters=cnt(pkts_assigned=1), mark=fm.LOCAL_MARK),
        Send("access1", on_access(tcp(EST_CLIENT[0], EST_CLIENT[1] + 1, *EST_SERVER, "A", 1, 1), 1), TC_ACT_OK,
             counters=NO_FLOW),
        Send("access1", on_access(tcp(EST_CLIENT[0], EST_CLIENT[1] + 1, *EST_SERVER, "R", 1, 0), 1), TC_ACT_OK,
             counters=NO_FLOW)]),
    Case("listener-port-not-a-flow", "ASSIGN (slot 1): segments to or from the listener's port (50081) of a "
         "4-tuple with no socket of its own are not the listener's: no_flow, unmarked (a bypassed flow on that "
         "port was handed to the listener and reset)", [
        Send("access1", ack1(40123, dport=LPORT1, ack=777), TC_ACT_OK, counters=NO_FLOW),
        Send("access1", ack1(LPORT1, dport=80, ack=777), TC_ACT_OK, counters=NO_FLOW),
        Send("origin1", reply1(LPORT1, 40124, flags="A", ack=1001), TC_ACT_OK, counters=NO_FLOW)]),
    Case("syncookie-invalid", "ASSIGN (slot 1): an ACK of no socket with no valid SYN cookie is no_flow", [
        Send("access1", ack1(40122, ack=123457), TC_ACT_OK, counters=NO_FLOW),
        Send("origin1", reply1(80, 40122, flags="A", ack=1001), TC_ACT_OK, counters=NO_FLOW)]),
    # -- the flow tables: handshake, promotion, retransmissions, reuse, end
    # -- 3c. source_port = "kept": the proxy's previous connection from the client's port is ended first
    Case("keep-port-connecting", "KEEP_PORT (slot 1): the origin side's 4-tuple is held by the proxy's own "
         "socket, still connecting (SYN_SENT): the SYN is dropped until it comes again (port_held), nothing "
         "remembered; another port is proxied", [
        graph_flags(1, G1["flags"] | fm.GRAPH_F_KEEP_PORT, LPORT1),
        Do("the proxy's socket CLIENT1:40150 -> SERVER1:80", lambda dp: dp.own(CLIENT1, 40150, SERVER1, 80)),
        Send("access1", syn1(40150), TC_ACT_SHOT, counters=cnt(port_held=1)),
        Send("access1", syn1(40151), TC_ACT_REDIRECT, fwd(syn1(40151)), ASSIGN_REFUSED)],
        flows=[Flow(CLIENT1, 40150, SERVER1, 80, None)]),
    Case("keep-port-freed", "KEEP_PORT (slot 1): the proxy's previous origin-side socket of the client's port "
         "in TIME_WAIT (its origin done with it): ended by a RST as from the origin (seq = its rcv_nxt), marked "
         "for local delivery; the SYN goes round again", [
        graph_flags(1, G1["flags"] | fm.GRAPH_F_KEEP_PORT, LPORT1),
        time_wait(40153, 7104, at_client=True),
        Send("access1", tw_syn(40153, 7104, 1000), TC_ACT_OK,
             lambda dp: Ether(src=C_IN_MAC[1], dst=HOST_MAC[CLIENT]) / IP(src=TW_SERVER, dst=TW_CLIENT)
             / TCP(sport=7104, dport=40153, flags="R", seq=dp.seen["rcv_nxt"], window=0),
             cnt(port_freed=1), mark=fm.LOCAL_MARK),
        # Back from its round, the socket still there (its process in close()): no second round; the
        # flow goes end to end (here to an address of this namespace: the stack's), not dropped.
        Send("access1", tw_syn(40153, 7104, 1000), TC_ACT_OK, counters=cnt(flows_bypass_busy=1),
             mark_in=fm.PORT_RETRY_MARK)],
        flows=[Flow(TW_CLIENT, 40153, TW_SERVER, 7104, "flows_new", "bypass_busy", graph=1)]),
    Case("keep-port-origin-open", "KEEP_PORT (slot 1): the proxy's previous connection from the client's port "
         "still open at the origin (ESTABLISHED here; CLOSE_WAIT, FIN_WAIT1, FIN_WAIT2 alike): a RST to the "
         "origin at the socket's snd_nxt goes out s_in first, then the SYN becomes the RST as from the origin "
         "(seq = its rcv_nxt), marked for local delivery, and goes round again. Back with that socket still "
         "there (its process in close()), the flow goes end to end (bypass_busy); the origin's late ACK of the "
         "old connection goes to that socket, and its SYN-ACK to the new flow's client", [
        graph_flags(1, G1["flags"] | fm.GRAPH_F_KEEP_PORT, LPORT1),
        Do("the proxy's connection CLIENT1:40155 -> SERVER1:80, snd_nxt 70000, rcv_nxt 90000 (repair mode)",
           lambda dp: dp.owned.append(dp.run_in_ns(_repaired, 40155, 70000, 90000))),
        Do("a packet socket on pfls1p, the origin's end of slot 1's s_in", lambda dp: dp.watch("pfls1p")),
        Send("access1", syn1(40155), TC_ACT_OK,
             Ether(src=HOST_MAC[SERVER1], dst=S_IN_MAC[1]) / IP(src=SERVER1, dst=CLIENT1)
             / TCP(sport=80, dport=40155, flags="R", seq=90000, window=0),
             cnt(port_freed=1), mark=fm.LOCAL_MARK),
        Do("the origin got a RST at 70000 from CLIENT1:40155", lambda dp: dp.expect_seen(
            Ether(src=S_IN_MAC[1], dst=HOST_MAC[SERVER1]) / IP(src=CLIENT1, dst=SERVER1)
            / TCP(sport=40155, dport=80, flags="R", seq=70000, window=0))),
        Send("access1", syn1(40155), TC_ACT_REDIRECT, fwd(syn1(40155)), cnt(flows_bypass_busy=1, pkts_bypassed=1),
             mark_in=fm.PORT_RETRY_MARK),
        Send("origin1", reply1(80, 40155, flags="A", ack=70001), TC_ACT_OK, counters=cnt(pkts_assigned=1),
             mark=fm.LOCAL_MARK),
        Send("origin1", reply1(80, 40155), TC_ACT_REDIRECT, fwd(reply1(80, 40155)), BYPASSED)],
        flows=[Flow(CLIENT1, 40155, SERVER1, 80, "flows_new", "bypass_busy", state="synack_seen", graph=1)]),
    Case("keep-port-ending-honest", "KEEP_PORT and HONEST (slot 1): the SYN back from its round finds the "
         "proxy's previous connection from the client's port still there (HAProxy in close() held its lock: "
         "the RST waits in its backlog): probed all the same; that socket still there when the origin "
         "answers, the flow goes end to end (bypass_busy), its answers passed on; once it is gone, another "
         "flow's answer is taken", [
        graph_flags(1, G1["flags"] | fm.GRAPH_F_KEEP_PORT | fm.GRAPH_F_HONEST, LPORT1),
        Do("the proxy's connection CLIENT1:40158 -> SERVER1:80 (repair mode)",
           lambda dp: dp.owned.append(dp.run_in_ns(_repaired, 40158, 70000, 90000))),
        Send("access1", syn1(40158), TC_ACT_REDIRECT, fwd(syn1(40158)), PROBED, mark_in=fm.PORT_RETRY_MARK),
        Send("origin1", reply1(80, 40158), TC_ACT_REDIRECT, fwd(reply1(80, 40158)),
             cnt(flows_bypass_busy=1, pkts_bypassed=1)),
        Send("origin1", reply1(80, 40158), TC_ACT_REDIRECT, fwd(reply1(80, 40158)), BYPASSED),
        Do("that connection closed", lambda dp: dp.owned.pop().close()),
        Send("access1", syn1(40159), TC_ACT_REDIRECT, fwd(syn1(40159)), PROBED),
        Send("origin1", reply1(80, 40159), TC_ACT_REDIRECT, syn1(40159), ACCEPTED)],
        flows=[Flow(CLIENT1, 40158, SERVER1, 80, "flows_new", "bypass_busy", state="synack_seen", graph=1)]),
    Case("keep-port-still-sending", "KEEP_PORT (slot 1): the proxy's previous connection from the client's "
         "port still has data to send to the origin (write_seq past snd_nxt: a zero window): the SYN is "
         "dropped (port_held), the connection left to finish", [
        graph_flags(1, G1["flags"] | fm.GRAPH_F_KEEP_PORT, LPORT1),
        Do("the proxy's connection CLIENT1:40156 -> SERVER1:80, one byte waiting for the origin's window",
           lambda dp: dp.owned.append(dp.run_in_ns(_repaired, 40156, 70000, 90000, True))),
        Send("access1", syn1(40156), TC_ACT_SHOT, counters=cnt(port_held=1))]),
    Case("keep-port-fin-wait2", "KEEP_PORT (slot 1): the proxy's previous connection from the client's port "
         "closed first by the proxy, its origin still open (an orphan FIN_WAIT2, kept as a time-wait socket): "
         "the origin must be told, and here it is an address of this namespace, where no RST can be sent: "
         "held (a TIME_WAIT one is freed: keep-port-freed)", [
        graph_flags(1, G1["flags"] | fm.GRAPH_F_KEEP_PORT, LPORT1),
        Do(f"an orphan FIN_WAIT2 socket {TW_CLIENT}:40157 -> {TW_SERVER}:7107",
           lambda dp: dp.owned.append(dp.run_in_ns(_fin_wait2, 40157, 7107))),
        Send("access1", tw_syn(40157, 7107, 1000), TC_ACT_SHOT, counters=cnt(port_held=1))]),
    Case("fin-deferred", "KEEP_PORT, ASSIGN (slot 1): the subscriber's bare FIN to the proxy's open socket "
         "before the proxy's connection to the origin exists is dropped (it comes again); with data, or "
         "without KEEP_PORT, it goes", [
        Do("an accepted connection with no origin side", lambda dp: dp.owned.append(dp.run_in_ns(
            _half_gone, 40191, 7105))),
        Send("access1", on_access(IP(src=TW_CLIENT, dst=TW_SERVER) / TCP(sport=40191, dport=7105, flags="FA"), 1),
             TC_ACT_OK, counters=cnt(pkts_assigned=1), mark=fm.LOCAL_MARK),
        graph_flags(1, G1["flags"] | fm.GRAPH_F_KEEP_PORT, LPORT1),
        marks((TW_CLIENT, 40191, TW_SERVER, 7105, 1), 0, 0, fm.MARK_F_SUB_OPTS, seen=fm.MARK_S_KEPT),
        Send("access1", on_access(IP(src=TW_CLIENT, dst=TW_SERVER) / TCP(sport=40191, dport=7105, flags="FA"), 1),
             TC_ACT_SHOT, counters=cnt(pkts_assigned=1, fin_deferred=1), mark=fm.LOCAL_MARK),
        Send("access1", on_access(IP(src=TW_CLIENT, dst=TW_SERVER) / TCP(sport=40191, dport=7105, flags="FPA")
                                  / b"last", 1),
             TC_ACT_OK, counters=cnt(pkts_assigned=1), mark=fm.LOCAL_MARK)]),
    Case("fin-kept-port-earlier-flow", "KEEP_PORT, ASSIGN (slot 1), a flow proxied before the flag was set (a "
         "reload to source_port kept, or an upgrade from a datapath without marks): its proxy connected from a "
         "spare port, so no socket holds its 4-tuple on the origin side; its bare FIN goes (held, it would be "
         "held for ever), and one of a flow decided with the flag unset is held once, as from a spare port", [
        Do("an accepted connection with no origin side", lambda dp: dp.owned.append(dp.run_in_ns(
            _half_gone, 40193, 7108))),
        graph_flags(1, G1["flags"] | fm.GRAPH_F_KEEP_PORT, LPORT1),
        Send("access1", on_access(IP(src=TW_CLIENT, dst=TW_SERVER) / TCP(sport=40193, dport=7108, flags="FA"), 1),
             TC_ACT_OK, counters=cnt(pkts_assigned=1), mark=fm.LOCAL_MARK),
        marks((TW_CLIENT, 40193, TW_SERVER, 7108, 1), 0, 0, fm.MARK_F_SUB_OPTS),
        Send("access1", on_access(IP(src=TW_CLIENT, dst=TW_SERVER) / TCP(sport=40193, dport=7108, flags="FA"), 1),
             TC_ACT_SHOT, counters=cnt(pkts_assigned=1, fin_deferred=1), mark=fm.LOCAL_MARK),
        Send("access1", on_access(IP(src=TW_CLIENT, dst=TW_SERVER) / TCP(sport=40193, dport=7108, flags="FA"), 1),
             TC_ACT_OK, counters=cnt(pkts_assigned=1), mark=fm.LOCAL_MARK)]),
    Case("fin-deferred-once", "ASSIGN (slot 1), a spare source port: a proxied flow's first bare FIN while "
         "its subscriber has sent nothing is held back once; the next goes; a subscriber that sent data has "
         "its FIN go at once", [
        Do("an accepted connection with no origin side", lambda dp: dp.owned.append(dp.run_in_ns(
            _half_gone, 40192, 7106))),
        marks((TW_CLIENT, 40192, TW_SERVER, 7106, 1), 0, 0, fm.MARK_F_SUB_OPTS),
        Send("access1", on_access(IP(src=TW_CLIENT, dst=TW_SERVER) / TCP(sport=40192, dport=7106, flags="FA"), 1),
             TC_ACT_SHOT, counters=cnt(pkts_assigned=1, fin_deferred=1), mark=fm.LOCAL_MARK),
        Send("access1", on_access(IP(src=TW_CLIENT, dst=TW_SERVER) / TCP(sport=40192, dport=7106, flags="FA"), 1),
             TC_ACT_OK, counters=cnt(pkts_assigned=1), mark=fm.LOCAL_MARK),
        marks((TW_CLIENT, 40192, TW_SERVER, 7106, 1), 0, 0, fm.MARK_F_SUB_OPTS),
        Send("access1", on_access(IP(src=TW_CLIENT, dst=TW_SERVER) / TCP(sport=40192, dport=7106, flags="PA")
                                  / b"GET", 1), TC_ACT_OK, counters=cnt(pkts_assigned=1), mark=fm.LOCAL_MARK),
        Send("access1", on_access(IP(src=TW_CLIENT, dst=TW_SERVER) / TCP(sport=40192, dport=7106, flags="FA"), 1),
             TC_ACT_OK, counters=cnt(pkts_assigned=1), mark=fm.LOCAL_MARK)]),
    Case("keep-port-listener", "KEEP_PORT (slot 0): a client port the proxy listens on (50080) is busy: "
         "bind() would fail; without KEEP_PORT it is proxied", [
        Send("access", syn(LPORT0), TC_ACT_OK, counters=NEW_PROXY),
        graph_flags(0, G0["flags"] | fm.GRAPH_F_KEEP_PORT, LPORT0),
        Send("access", syn(LPORT0, seq=2000), TC_ACT_REDIRECT, fwd(syn(LPORT0, seq=2000)),
             cnt(flows_bypass_busy=1, pkts_bypassed=1)),
        Send("access", syn(40152), TC_ACT_OK, counters=NEW_PROXY)],
        flows=[Flow(CLIENT, LPORT0, SERVER, 80, "flows_new", "bypass_busy", syn_seq=2000)]),
    # -- the honest handshake (GRAPH_F_HONEST, slot 1): the origin answers the SYN first
    Case("honest-accepted", "a SYN goes on to the origin (recorded, forwarded), its retransmission too; the "
         "origin's SYN-ACK becomes that very SYN again (MACs, IP fields, options), handed to the listener there "
         "(refused in a test run, so put in at the opener's interface); there it goes to the listener (refused "
         "again: fail open)", [
        honest(),
        Send("access1", H_SYN, TC_ACT_REDIRECT, fwd(H_SYN), PROBED),
        expect_syn((CLIENT1, 40170, SERVER1, 80, 1), "probing"),
        Send("access1", H_SYN, TC_ACT_REDIRECT, fwd(H_SYN), BYPASSED),
        Send("origin1", reply1(80, 40170, opts=ORIGIN_OPTS, tos=0x48), TC_ACT_REDIRECT, H_SYN, ACCEPTED),
        expect_syn((CLIENT1, 40170, SERVER1, 80, 1), "accepted"),
        expect_marks((CLIENT1, 40170, SERVER1, 80, 1), (0x88, 0x48, SUB_OFFERS | ORG_OFFERS, 0, 1460, 1400)),
        # The origin's SYN-ACK again (it had the SYN twice): the RST again (the opener's DSCP), back out,
        # never to the opener.
        Send("origin1", reply1(80, 40170, opts=(("MSS", 1400),)), TC_ACT_REDIRECT,
             Ether(src=S_IN_MAC[1], dst=HOST_MAC[SERVER1]) / IP(src=CLIENT1, dst=SERVER1, tos=0x88)
             / TCP(sport=40170, dport=80, flags="R", seq=1001, window=0)),
        # Once more, forwarded by another proxy host (a draining one: its MAC, not the origin's): the RST
        # goes to the origin by the route all the same, not back to that host.
        Send("origin1", with_src_mac(reply1(80, 40170, opts=(("MSS", 1400),)), "02:00:00:0f:0f:0f"),
             TC_ACT_REDIRECT,
             Ether(src=S_IN_MAC[1], dst=HOST_MAC[SERVER1]) / IP(src=CLIENT1, dst=SERVER1, tos=0x88)
             / TCP(sport=40170, dport=80, flags="R", seq=1001, window=0)),
        Send("access1", H_SYN, TC_ACT_REDIRECT, fwd(H_SYN), ASSIGN_REFUSED),
        expect_syn((CLIENT1, 40170, SERVER1, 80, 1), None)]),
    Case("honest-refused", "the origin's RST answering the probe goes on to the opener (forwarded); the record "
         "goes", [
        honest(),
        Send("access1", syn1(40171), TC_ACT_REDIRECT, fwd(syn1(40171)), PROBED),
        Send("origin1", reply1(80, 40171, flags="RA", seq=0), TC_ACT_REDIRECT,
             fwd(reply1(80, 40171, flags="RA", seq=0)), cnt(origin_refused=1, pkts_bypassed=1)),
        expect_syn((CLIENT1, 40171, SERVER1, 80, 1), None)]),
    Case("honest-ecn", "ECE and CWR of the rebuilt SYN: kept when the origin agreed to ECN (ECE without "
         "CWR), dropped when it did not", [
        honest(),
        Send("access1", syn1(40172, flags="SEC"), TC_ACT_REDIRECT, fwd(syn1(40172, flags="SEC")), PROBED),
        Send("origin1", reply1(80, 40172, flags="SAE"), TC_ACT_REDIRECT, syn1(40172, flags="SEC"),
             ACCEPTED),
        Send("access1", syn1(40173, flags="SEC"), TC_ACT_REDIRECT, fwd(syn1(40173, flags="SEC")), PROBED),
        Send("origin1", reply1(80, 40173, flags="SA"), TC_ACT_REDIRECT, syn1(40173, flags="S"),
             ACCEPTED),
        expect_marks((CLIENT1, 40173, SERVER1, 80, 1),
                     (0, 0, fm.MARK_F_SUB_ECN | fm.MARK_F_SUB_OPTS | fm.MARK_F_ORG_OPTS, 0, 0, 0))]),
    Case("honest-offer", "an origin that offers no SACK and no timestamps: the rebuilt SYN offers neither "
         "(made NOPs), so the proxy's SYN-ACK will not", [
        honest(),
        Send("access1", syn1(40178, opts=LINUX_OPTS), TC_ACT_REDIRECT, fwd(syn1(40178, opts=LINUX_OPTS)), PROBED),
        Send("origin1", reply1(80, 40178, opts=(("MSS", 1200),)), TC_ACT_REDIRECT,
             syn1(40178, opts=(("MSS", 1460), *[("NOP", None)] * 13, ("WScale", 7))), ACCEPTED)]),
    Case("honest-v6", "IPv6 (slot 0 made ASSIGN and HONEST): the rebuilt SYN has the opener's traffic class, "
         "flow label and hop limit", [
        graph_flags(0, G0["flags"] | fm.GRAPH_F_ASSIGN | fm.GRAPH_F_HONEST, LPORT0),
        Send("access", H_SYN6, TC_ACT_REDIRECT, fwd(H_SYN6), PROBED),
        Send("origin", reply(80, 40174, src=SERVER6, dst=CLIENT6, ttl=57, opts=ORIGIN_OPTS), TC_ACT_REDIRECT, H_SYN6,
             ACCEPTED)]),
    Case("honest-not-probed", "a SYN with data (Fast Open) is not probed: to the listener at once", [
        honest(),
        Send("access1", syn1(40175) / b"GET /", TC_ACT_REDIRECT, fwd(syn1(40175) / b"GET /"), ASSIGN_REFUSED)]),
    Case("honest-probe-failed", "an answer that cannot be rewritten (a SYN-ACK with data) makes the flow end "
         "to end: bypass_failopen, the answer forwarded", [
        honest(),
        Send("access1", syn1(40176), TC_ACT_REDIRECT, fwd(syn1(40176)), PROBED),
        Send("origin1", reply1(80, 40176) / b"x", TC_ACT_REDIRECT, fwd(reply1(80, 40176) / b"x"),
             cnt(probe_failed=1, flows_bypass_failopen=1, pkts_bypassed=1))],
        flows=[Flow(CLIENT1, 40176, SERVER1, 80, "flows_new", "bypass_failopen", state="synack_seen", graph=1)]),
    Case("honest-other-ack", "a SYN-ACK acking another ISN is not the probe's answer", [
        honest(),
        Send("access1", syn1(40177), TC_ACT_REDIRECT, fwd(syn1(40177)), PROBED),
        Send("origin1", reply1(80, 40177, ack=4242), TC_ACT_OK, counters=NO_FLOW),
        expect_syn((CLIENT1, 40177, SERVER1, 80, 1), "probing")]),
    # -- marks carried across the split (flow_marks.h): made at the SYN, kept from each end, applied out
    Case("marks-syn", "a proxied SYN with DSCP AF41 (TOS 0x88) that asks ECN (ECE, CWR) and offers Linux's "
         "options leaves its marks; a plain SYN on the same 4-tuple later replaces them", [
        Send("access", syn(40160, flags="SEC", tos=0x88, opts=LINUX_OPTS), TC_ACT_OK, counters=NEW_PROXY),
        expect_marks((CLIENT, 40160, SERVER, 80), (0x88, 0, fm.MARK_F_SUB_ECN | SUB_OFFERS, 0, 1460, 0)),
        Send("access", syn(40160, seq=9000), TC_ACT_OK, counters=NEW_PROXY),
        expect_marks((CLIENT, 40160, SERVER, 80), (0, 0, fm.MARK_F_SUB_OPTS, 0, 0, 0))]),
    Case("marks-syn-v6", "IPv6: the DSCP of the traffic class (0xb8: EF), ECN bits aside", [
        Send("access", syn(40161, src=CLIENT6, dst=SERVER6, tc=0xba), TC_ACT_OK, counters=NEW_PROXY),
        expect_marks((CLIENT6, 40161, SERVER6, 80), (0xb8, 0, fm.MARK_F_SUB_OPTS, 0, 0, 0))]),
    Case("marks-in", "ASSIGN (slot 1): segments of a proxied flow update each end's DSCP; the origin's RST "
         "sets ORG_RESET", [
        Send("access1", on_access(tcp(*EST_CLIENT, *EST_SERVER, "A", 1, 1, tos=0x28), 1), TC_ACT_OK,
             counters=cnt(pkts_assigned=1), mark=fm.LOCAL_MARK),
        Send("origin1", on_origin(tcp(*EST_SERVER, *EST_CLIENT, "A", 1, 1, tos=0x48), 1), TC_ACT_OK,
             counters=cnt(pkts_assigned=1), mark=fm.LOCAL_MARK),
        expect_marks((*EST_CLIENT, *EST_SERVER, 1), (0x28, 0x48, 0, 0, 0, 0)),
        Send("origin1", on_origin(tcp(*EST_SERVER, *EST_CLIENT, "RA", 1, 1, tos=0x48), 1), TC_ACT_OK,
             counters=cnt(pkts_assigned=1), mark=fm.LOCAL_MARK),
        expect_marks((*EST_CLIENT, *EST_SERVER, 1), (0x28, 0x48, fm.MARK_F_ORG_RESET, 0, 0, 0))]),
    Case("egress-ecn", "the proxy's SYN to the origin keeps ECE and CWR only when its subscriber asked; a "
         "forwarded SYN (a bypassed flow's: it came in on c_in) is not the proxy's and keeps them", [
        Send("to-origin", syn(40162, flags="SEC"), TC_ACT_OK, syn(40162, flags="S")),
        marks((CLIENT, 40163, SERVER, 80), 0, 0, fm.MARK_F_SUB_ECN),
        Send("to-origin", syn(40163, flags="SEC"), TC_ACT_OK),
        Send("fwd-to-origin", syn(40162, flags="SEC"), TC_ACT_OK)]),
    Case("egress-offer", "the proxy's SYN offers no more than its subscriber did (MSS 1300, no SACK, no "
         "timestamps: NOPs), its SYN-ACK an MSS no larger than the origin's", [
        marks((CLIENT, 40169, SERVER, 80), 0, 0, fm.MARK_F_SUB_OPTS | fm.MARK_F_ORG_OPTS, 1300, 1200),
        Send("to-origin", syn(40169, opts=LINUX_OPTS), TC_ACT_OK,
             syn(40169, opts=(("MSS", 1300), *[("NOP", None)] * 13, ("WScale", 7)))),
        Send("to-access", reply(80, 40169, opts=LINUX_OPTS), TC_ACT_OK,
             reply(80, 40169, opts=(("MSS", 1200), *LINUX_OPTS[1:]))),
        marks((CLIENT, 40179, SERVER, 80), 0, 0, SUB_OFFERS, 1500, 0),
        Send("to-origin", syn(40179, opts=LINUX_OPTS), TC_ACT_OK)]),
    Case("egress-dscp", "the proxy's segments carry the other end's DSCP, their own ECN bits kept, both "
         "families; forwarded packets (no socket) and flows without marks pass untouched", [
        marks((CLIENT, 40164, SERVER, 80), 0x88, 0x20, 0),
        Send("to-origin", ack(40164, flags="PA", tos=0x02), TC_ACT_OK, ack(40164, flags="PA", tos=0x8a)),
        Send("to-access", reply(80, 40164, flags="A", tos=0x01), TC_ACT_OK, reply(80, 40164, flags="A", tos=0x21)),
        Send("to-access", reply(80, 40165, flags="A", tos=0x01), TC_ACT_OK),
        marks((CLIENT6, 40166, SERVER6, 80), 0xb8, 0, 0),
        Send("to-origin", ack(40166, src=CLIENT6, dst=SERVER6, tc=0x01), TC_ACT_OK,
             ack(40166, src=CLIENT6, dst=SERVER6, tc=0xb9))]),
    Case("egress-reset", "after the origin's reset the proxy's FIN to the subscriber goes as a RST at its "
         "sequence number (counted; the socket's own RST goes round through c_in); a FIN with data loses its "
         "FIN only", [
        marks((CLIENT, 40167, SERVER, 80), 0, 0, fm.MARK_F_ORG_RESET),
        Send("to-access", reply(80, 40167, flags="FA"), TC_ACT_OK,
             on_origin(IP(src=SERVER, dst=CLIENT) / TCP(sport=80, dport=40167, flags="R", seq=5000, window=0)),
             cnt(resets_to_sub=1)),
        Send("to-access", reply(80, 40167, flags="FPA") / b"tail", TC_ACT_OK, reply(80, 40167, flags="PA") / b"tail"),
        Send("to-access", reply(80, 40168, flags="FA"), TC_ACT_OK)]),
    # -- mode bpf, a TIME_WAIT socket of the proxy on the SYN's 4-tuple
    Case("time-wait-reset", "ASSIGN (slot 1): a SYN the kernel would let past a TIME_WAIT socket of its 4-tuple "
         "is made the RST that ends it (seq = its rcv_nxt, same direction, no options), marked for local "
         "delivery; a copy goes round again", [
        time_wait(40140, 7100),
        Send("access1", lambda dp: tw_syn(40140, 7100, dp.seen["rcv_nxt"] + 5000), TC_ACT_OK,
             lambda dp: on_access(IP(src=TW_CLIENT, dst=TW_SERVER)
                                  / TCP(sport=40140, dport=7100, flags="R", seq=dp.seen["rcv_nxt"], window=0), 1),
             cnt(tw_reset=1), mark=fm.LOCAL_MARK)]),
    Case("time-wait-old-syn", "ASSIGN (slot 1): a SYN not past the TIME_WAIT socket's rcv_nxt (no timestamp) "
         "goes to that socket unchanged, which answers as the kernel does", [
        time_wait(40141, 7101),
        Send("access1", lambda dp: tw_syn(40141, 7101, dp.seen["rcv_nxt"] - 5000), TC_ACT_OK,
             counters=cnt(tw_old_syn=1), mark=fm.LOCAL_MARK)]),
    Case("time-wait-retry", "ASSIGN (slot 1): the copy sent round (PEP_RETRY_MARK) that finds the TIME_WAIT "
         "socket still there goes to it: no second round", [
        time_wait(40142, 7102),
        Send("access1", lambda dp: tw_syn(40142, 7102, dp.seen["rcv_nxt"] + 5000), TC_ACT_OK,
             counters=cnt(tw_old_syn=1), mark=fm.LOCAL_MARK, mark_in=fm.RETRY_MARK)]),
    Case("time-wait-late-segment", "ASSIGN (slot 1): a late FIN of the proxy's closed connection goes to its "
         "TIME_WAIT socket", [
        time_wait(40143, 7103),
        Send("access1", lambda dp: on_access(IP(src=TW_CLIENT, dst=TW_SERVER) / TCP(
            sport=40143, dport=7103, flags="FA", seq=dp.seen["rcv_nxt"] - 1, ack=1), 1), TC_ACT_OK,
             counters=cnt(pkts_assigned=1), mark=fm.LOCAL_MARK)]),
    # -- 3a. MPTCP: bypassed by default, end to end
    Case("mptcp-capable", "a SYN with MP_CAPABLE among Linux's options is bypassed (BYPASS_MPTCP), its "
         "SYN-ACK forwarded; a plain SYN from the same client is proxied", [
        Send("access", syn(40130, opts=(*LINUX_OPTS, MP_CAPABLE)), TC_ACT_REDIRECT,
             fwd(syn(40130, opts=(*LINUX_OPTS, MP_CAPABLE))), NEW_MPTCP),
        Send("origin", reply(80, 40130, opts=(MP_CAPABLE,)), TC_ACT_REDIRECT,
             fwd(reply(80, 40130, opts=(MP_CAPABLE,))), BYPASSED),
        Send("access", syn(40131, opts=LINUX_OPTS), TC_ACT_OK, counters=NEW_PROXY)],
        flows=[Flow(CLIENT, 40130, SERVER, 80, "flows_new", "bypass_mptcp", state="synack_seen"),
               Flow(CLIENT, 40131, SERVER, 80, None)]),
    Case("mptcp-join-v6", "an IPv6 SYN with MP_JOIN (a subflow) is bypassed too", [
        Send("access", syn(40132, src=CLIENT6, dst=SERVER6, opts=(MP_JOIN, ("NOP", None), ("NOP", None))),
             TC_ACT_REDIRECT, fwd(syn(40132, src=CLIENT6, dst=SERVER6, opts=(MP_JOIN, ("NOP", None), ("NOP", None)))),
             NEW_MPTCP)],
        flows=[Flow(CLIENT6, 40132, SERVER6, 80, "flows_new", "bypass_mptcp")]),
    Case("mptcp-after-eol", "an MPTCP option after End of Options is no option: proxied", [
        Send("access", syn(40133, opts=(("MSS", 1460), ("EOL", None), MP_CAPABLE)), TC_ACT_OK, counters=NEW_PROXY)]),
    Case("mptcp-rule-first", "a bypass rule comes before MPTCP: counted as bypass_rule", [
        Send("access", syn(40134, opts=(MP_CAPABLE,)), TC_ACT_REDIRECT, fwd(syn(40134, opts=(MP_CAPABLE,))),
             NEW_BYPASS)], rules=C32, flows=[Flow(CLIENT, 40134, SERVER, 80, "flows_new", "bypass_rule")]),
    Case("mptcp-proxy", "mptcp = \"proxy\" (GRAPH_F_PROXY_MPTCP): an MP_CAPABLE SYN is proxied as plain TCP", [
        graph_flags(0, fm.GRAPH_F_ENABLED | fm.GRAPH_F_PROXY_MPTCP, LPORT0),
        Send("access", syn(40135, opts=(*LINUX_OPTS, MP_CAPABLE)), TC_ACT_OK, counters=NEW_PROXY)]),
    Case("bad-data-offset", "a SYN whose data offset points past its end is left to the stack", [
        Send("access", on_access(IP(src=CLIENT, dst=SERVER) / TCP(sport=40136, dport=80, flags="S", dataofs=15)),
             TC_ACT_OK, counters=cnt(pkts_not_tcp=1))]),
    Case("syn-retransmit", "a retransmitted SYN keeps the verdict and is counted once", [
        Send("access", syn(40017), TC_ACT_REDIRECT, fwd(syn(40017)), NEW_BYPASS),
        Send("access", syn(40017), TC_ACT_REDIRECT, fwd(syn(40017)), BYPASSED)],
        rules=C32, flows=[Flow(CLIENT, 40017, SERVER, 80, "flows_new", state="syn_seen")]),
    Case("handshake", "SYN, SYN-ACK, ACK: the entry moves from flows_new to flows; data both ways", [
        Send("access", syn(40014), TC_ACT_REDIRECT, fwd(syn(40014)), NEW_BYPASS),
        Check([Flow(CLIENT, 40014, SERVER, 80, "flows_new", state="syn_seen")]),
        Send("origin", reply(80, 40014), TC_ACT_REDIRECT, fwd(reply(80, 40014)), BYPASSED),
        Check([Flow(CLIENT, 40014, SERVER, 80, "flows_new", state="synack_seen")]),
        Send("access", ack(40014), TC_ACT_REDIRECT, fwd(ack(40014)), PROMOTED),
        Send("access", ack(40014, flags="PA") / b"GET", TC_ACT_REDIRECT, fwd(ack(40014, flags="PA") / b"GET"),
             BYPASSED),
        Send("origin", reply(80, 40014, flags="PA", seq=5001, ack=1004) / b"OK", TC_ACT_REDIRECT,
             fwd(reply(80, 40014, flags="PA", seq=5001, ack=1004) / b"OK"), BYPASSED)],
        rules=C32, flows=[established(40014, fins=0)]),
    Case("handshake-slot1", "a handshake on slot 1 (ASSIGN) promotes the flow under slot 1's key", [
        Send("access1", syn1(40015), TC_ACT_REDIRECT, fwd(syn1(40015)), NEW_BYPASS),
        Send("origin1", reply1(80, 40015), TC_ACT_REDIRECT, fwd(reply1(80, 40015)), BYPASSED),
        Send("access1", ack1(40015), TC_ACT_REDIRECT, fwd(ack1(40015)), PROMOTED)],
        rules=C32_1, flows=[Flow(CLIENT1, 40015, SERVER1, 80, "flows", state="established", graph=1),
                            Flow(CLIENT1, 40015, SERVER1, 80, None, graph=0)]),
    Case("syn-retransmit-established", "a retransmitted SYN of a promoted flow is forwarded, the entry kept", [
        *handshake(40016),
        Send("access", syn(40016), TC_ACT_REDIRECT, fwd(syn(40016)), BYPASSED)],
        rules=C32, flows=[established(40016)]),
    Case("wrong-ack", "an ACK not acking the SYN-ACK does not promote; the right one does", [
        Send("access", syn(40050), TC_ACT_REDIRECT, fwd(syn(40050)), NEW_BYPASS),
        Send("origin", reply(80, 40050), TC_ACT_REDIRECT, fwd(reply(80, 40050)), BYPASSED),
        Send("access", ack(40050, ack=5002), TC_ACT_REDIRECT, fwd(ack(40050, ack=5002)), BYPASSED),
        Send("access", ack(40050, ack=5000), TC_ACT_REDIRECT, fwd(ack(40050, ack=5000)), BYPASSED),
        Check([Flow(CLIENT, 40050, SERVER, 80, "flows_new", state="synack_seen")]),
        Send("access", ack(40050), TC_ACT_REDIRECT, fwd(ack(40050)), PROMOTED)],
        rules=C32, flows=[established(40050)]),
    Case("ack-before-synack", "an ACK from the opener before any SYN-ACK does not promote", [
        Send("access", syn(40051), TC_ACT_REDIRECT, fwd(syn(40051)), NEW_BYPASS),
        Send("access", ack(40051), TC_ACT_REDIRECT, fwd(ack(40051)), BYPASSED)],
        rules=C32, flows=[Flow(CLIENT, 40051, SERVER, 80, "flows_new", state="syn_seen")]),
    Case("ack-from-answerer", "an ACK acking the SYN-ACK but sent by its own side does not promote", [
        Send("access", syn(40052), TC_ACT_REDIRECT, fwd(syn(40052)), NEW_BYPASS),
        Send("origin", reply(80, 40052), TC_ACT_REDIRECT, fwd(reply(80, 40052)), BYPASSED),
        Send("origin", reply(80, 40052, flags="A", ack=5001), TC_ACT_REDIRECT,
             fwd(reply(80, 40052, flags="A", ack=5001)), BYPASSED)],
        rules=C32, flows=[Flow(CLIENT, 40052, SERVER, 80, "flows_new", state="synack_seen")]),
    Case("stale-synack", "a SYN-ACK answering another SYN on a bypassed flow's 4-tuple (HAProxy reusing its port "
         "toward the origin) forgets the flow and is of no flow, but this host's: to the stack", [
        Send("access", syn(40053), TC_ACT_REDIRECT, fwd(syn(40053)), NEW_BYPASS),
        Send("origin", reply(80, 40053, ack=777001), TC_ACT_OK, counters=STALE),
        Do("HAProxy's socket of its connection", lambda dp: dp.own(CLIENT, 40053, SERVER, 80)),
        Send("origin", reply(80, 40053, flags="A", ack=777001), TC_ACT_OK, counters=NO_FLOW)],
        rules=C32, flows=[Flow(CLIENT, 40053, SERVER, 80, None)]),
    Case("another-hosts-segment", "a segment of no flow and no socket here, to a subscriber a rule bypasses (the "
         "origin answering another proxy host, which a draining host hands new flows to): forwarded, never to the "
         "stack's interception", [
        Send("origin", reply(80, 40059, ack=777001), TC_ACT_REDIRECT, fwd(reply(80, 40059, ack=777001)), BYPASSED),
        Send("origin", reply(80, 40059, flags="A", ack=777001), TC_ACT_REDIRECT,
             fwd(reply(80, 40059, flags="A", ack=777001)), BYPASSED)],
        rules=C32, flows=[Flow(CLIENT, 40059, SERVER, 80, None)]),
    Case("synack-from-opener", "a SYN-ACK from the opener's own side is another connection: stale", [
        Send("access", syn(40054), TC_ACT_REDIRECT, fwd(syn(40054)), NEW_BYPASS),
        Send("access", syn(40054, flags="SA", seq=9000, ack=1001), TC_ACT_OK, counters=STALE)],
        rules=C32, flows=[Flow(CLIENT, 40054, SERVER, 80, None)]),
    Case("stale-synack-established", "a SYN-ACK of another connection forgets a promoted flow too", [
        *handshake(40055),
        Send("origin", reply(80, 40055, ack=777001), TC_ACT_OK, counters=STALE)],
        rules=C32, flows=[Flow(CLIENT, 40055, SERVER, 80, None)]),
    Case("synack-retransmit-established", "a retransmitted SYN-ACK of a promoted flow is forwarded", [
        *handshake(40056),
        Send("origin", reply(80, 40056), TC_ACT_REDIRECT, fwd(reply(80, 40056)), BYPASSED)],
        rules=C32, flows=[established(40056)]),
    Case("new-isn", "after a rule change, the same SYN keeps its verdict; a new ISN is decided anew", [
        Send("access", syn(40019), TC_ACT_REDIRECT, fwd(syn(40019)), NEW_BYPASS),
        del_rules(0, clients=[f"{CLIENT}/32"]),
        Send("access", syn(40019), TC_ACT_REDIRECT, fwd(syn(40019)), BYPASSED),
        Send("access", syn(40019, seq=7777), TC_ACT_OK, counters=NEW_PROXY)],
        rules=C32, flows=[Flow(CLIENT, 40019, SERVER, 80, None)]),
    Case("new-isn-established", "a SYN of a new ISN on a promoted flow's 4-tuple: the entry goes, decided anew", [
        *handshake(40057),
        Send("access", syn(40057, seq=7777), TC_ACT_REDIRECT, fwd(syn(40057, seq=7777)), NEW_BYPASS)],
        rules=C32, flows=[Flow(CLIENT, 40057, SERVER, 80, "flows_new", syn_seq=7777, state="syn_seen")]),
    Case("rule-removed-mid-flow", "removing the rule does not break a bypassed flow", [
        Send("access", syn(40020), TC_ACT_REDIRECT, fwd(syn(40020)), NEW_BYPASS),
        del_rules(0, clients=[f"{CLIENT}/32"]),
        Send("origin", reply(80, 40020), TC_ACT_REDIRECT, fwd(reply(80, 40020)), BYPASSED),
        Send("access", ack(40020), TC_ACT_REDIRECT, fwd(ack(40020)), PROMOTED)],
        rules=C32, flows=[established(40020)]),
    Case("rule-added-mid-flow", "adding a rule does not move a proxied flow: its socket here owns it", [
        Send("access", syn(40045), TC_ACT_OK, counters=NEW_PROXY),
        Do("HAProxy's socket of the flow", lambda dp: dp.own(SERVER, 80, CLIENT, 40045)),
        add_rules(0, clients=[f"{CLIENT}/32"]),
        Send("access", ack(40045), TC_ACT_OK, counters=NO_FLOW)],
        flows=[Flow(CLIENT, 40045, SERVER, 80, None)]),
    Case("rst-new", "a RST in flows_new (port closed at the origin) deletes the entry and is forwarded", [
        Send("access", syn(40058), TC_ACT_REDIRECT, fwd(syn(40058)), NEW_BYPASS),
        Send("origin", reply(80, 40058, flags="RA", seq=0), TC_ACT_REDIRECT, fwd(reply(80, 40058, flags="RA", seq=0)),
             BYPASSED),
        # Forgotten, and the rule still names it: forwarded as a segment of no flow a rule bypasses.
        Send("access", ack(40058), TC_ACT_REDIRECT, fwd(ack(40058)), BYPASSED)],
        rules=C32, flows=[Flow(CLIENT, 40058, SERVER, 80, None)]),
    Case("fin-fin", "a FIN from each side makes a promoted flow closing (its linger timer set)", [
        *handshake(40059),
        Send("access", ack(40059, flags="FA"), TC_ACT_REDIRECT, fwd(ack(40059, flags="FA")), BYPASSED),
        Check([established(40059, fins=1)]),
        Send("origin", reply(80, 40059, flags="FA", seq=5001, ack=1002), TC_ACT_REDIRECT,
             fwd(reply(80, 40059, flags="FA", seq=5001, ack=1002)), BYPASSED),
        Send("access", ack(40059, ack=5002), TC_ACT_REDIRECT, fwd(ack(40059, ack=5002)), BYPASSED)],
        rules=C32, flows=[Flow(CLIENT, 40059, SERVER, 80, "flows", state="closing", fins=3)]),
    Case("fin-one-side", "FINs from one side only (retransmitted) do not close", [
        *handshake(40060),
        Send("origin", reply(80, 40060, flags="FA", seq=5001, ack=1001), TC_ACT_REDIRECT,
             fwd(reply(80, 40060, flags="FA", seq=5001, ack=1001)), BYPASSED),
        Send("origin", reply(80, 40060, flags="FA", seq=5001, ack=1001), TC_ACT_REDIRECT,
             fwd(reply(80, 40060, flags="FA", seq=5001, ack=1001)), BYPASSED)],
        rules=C32, flows=[established(40060, fins=2)]),
    Case("rst-established", "a RST makes a promoted flow closing; late segments are still forwarded", [
        *handshake(40061),
        Send("access", ack(40061, flags="R", ack=0), TC_ACT_REDIRECT, fwd(ack(40061, flags="R", ack=0)), BYPASSED),
        Send("origin", reply(80, 40061, flags="PA", seq=5001) / b"late", TC_ACT_REDIRECT,
             fwd(reply(80, 40061, flags="PA", seq=5001) / b"late"), BYPASSED)],
        rules=C32, flows=[Flow(CLIENT, 40061, SERVER, 80, "flows", state="closing", fins=0)]),
    Case("closing-reused", "a SYN of a new ISN on a closing flow's 4-tuple is a new flow", [
        *handshake(40062),
        Send("origin", reply(80, 40062, flags="R", seq=5001, ack=0), TC_ACT_REDIRECT,
             fwd(reply(80, 40062, flags="R", seq=5001, ack=0)), BYPASSED),
        Check([Flow(CLIENT, 40062, SERVER, 80, "flows", state="closing")]),
        del_rules(0, clients=[f"{CLIENT}/32"]),
        Send("access", syn(40062, seq=9999), TC_ACT_OK, counters=NEW_PROXY)],
        rules=C32, flows=[Flow(CLIENT, 40062, SERVER, 80, None)]),
    # -- TTL
    Case("ttl1", "TTL 1 on a bypassed flow: dropped, ttl_expired; a later TTL 2 is routed", [
        Send("access", syn(40025, ttl=1), TC_ACT_SHOT, counters=cnt(flows_bypass_rule=1, pkts_ttl_expired=1)),
        Send("access", syn(40025, ttl=2), TC_ACT_REDIRECT, fwd(syn(40025, ttl=2)), BYPASSED)],
        rules=C32),
    Case("ttl0", "TTL 0 is expired too", [
        Send("access", syn(40026, ttl=0), TC_ACT_SHOT, counters=cnt(flows_bypass_rule=1, pkts_ttl_expired=1))],
        rules=C32),
    Case("hlim1", "hop limit 1 on a bypassed IPv6 flow: dropped, ttl_expired", [
        Send("access", syn(40027, src=CLIENT6, dst=SERVER6, ttl=1), TC_ACT_SHOT,
             counters=cnt(flows_bypass_rule=1, pkts_ttl_expired=1))],
        rules={0: {"clients": ["2001:2:0:1::/64"]}}),
    Case("ttl1-proxied", "TTL 1 on a proxied flow is the stack's business", [
        Send("access", syn(40028, ttl=1), TC_ACT_OK, counters=NEW_PROXY)]),
    # -- what the FIB says
    Case("no-neigh", "next hop without a neighbour entry: bpf_redirect_neigh, TTL - 1, MACs by the kernel", [
        Send("access", syn(40029, dst=FAR_SERVER), TC_ACT_REDIRECT, ttl_only(syn(40029, dst=FAR_SERVER)),
             NEW_BYPASS)],
        rules={0: {"servers": ["198.19.8.0/24"]}}),
    Case("no-neigh-v6", "IPv6 next hop without a neighbour entry: bpf_redirect_neigh", [
        Send("access", syn(40030, src=CLIENT6, dst=FAR_SERVER6), TC_ACT_REDIRECT,
             ttl_only(syn(40030, src=CLIENT6, dst=FAR_SERVER6)), NEW_BYPASS)],
        rules={0: {"servers": ["2001:2:0:3::/64"]}}),
    Case("blackhole", "no usable route: dropped, fib_miss", [
        Send("access", syn(40031, dst=HOLE_SERVER), TC_ACT_SHOT, counters=cnt(flows_bypass_rule=1, pkts_fib_miss=1))],
        rules={0: {"servers": ["198.19.9.0/24"]}}),
    Case("local-destination", "a bypassed flow to an address of the namespace that is not the graph's: the "
         "stack delivers it", [
        Send("access", syn(40033, 80, dst=OTHER_LOCAL), TC_ACT_OK, counters=cnt(flows_bypass_rule=1))],
        rules=C32),
]


# -- the datapath under test --------------------------------------------------------------------
def _run(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def _syn_sent(local: str, lport: int, remote: str, rport: int) -> socket.socket:
    """A socket as HAProxy holds a proxied flow's client side: transparent, of the origin's address
    and port, toward the client; here it stays SYN_SENT (no one answers), which is enough for the
    program's socket lookup to find the 4-tuple owned."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_IP, IP_TRANSPARENT, 1)
    s.setblocking(False)
    s.bind((local, lport))
    try:
        s.connect((remote, rport))
    except BlockingIOError:
        pass
    return s


def _listen(port: int) -> socket.socket:
    """A listener as HAProxy opens it: the graph's listen_port dual stack; slot 1's transparent (it
    answers for the addresses it intercepts)."""
    if port == LPORT1:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_IP, IP_TRANSPARENT, 1)
        addr: tuple = ("0.0.0.0", port)
    else:
        s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        addr = ("::", port)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(addr)
    s.listen(16)
    return s


def _established_pair() -> tuple[socket.socket, socket.socket]:
    """A real connection EST_CLIENT -> EST_SERVER (over lo: both are addresses of the namespace)."""
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(EST_SERVER)
    srv.listen(1)
    cli = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        cli.bind(EST_CLIENT)
        cli.settimeout(5)
        cli.connect(EST_SERVER)
        srv.settimeout(5)
        conn, _ = srv.accept()
    finally:
        srv.close()
    return cli, conn


TCP_REPAIR, TCP_REPAIR_QUEUE, TCP_QUEUE_SEQ, TCP_SEND_QUEUE = 19, 20, 21, 2   # <linux/tcp.h>


def _fin_seq(s: socket.socket) -> int:
    """The sequence number s's FIN will have: its send queue's end, read in repair mode."""
    s.setsockopt(socket.IPPROTO_TCP, TCP_REPAIR, 1)
    s.setsockopt(socket.IPPROTO_TCP, TCP_REPAIR_QUEUE, TCP_SEND_QUEUE)
    seq = s.getsockopt(socket.IPPROTO_TCP, TCP_QUEUE_SEQ)
    s.setsockopt(socket.IPPROTO_TCP, TCP_REPAIR, 0)
    return seq


def _pair(cport: int, sport: int) -> tuple[socket.socket, socket.socket]:
    """A connection over lo, TW_CLIENT:cport -> TW_SERVER:sport: (client end, server end)."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((TW_SERVER, sport))
    srv.listen(1)
    cli = socket.socket()
    try:
        cli.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        cli.bind((TW_CLIENT, cport))
        cli.settimeout(5)
        cli.connect((TW_SERVER, sport))
        conn, _ = srv.accept()
    finally:
        srv.close()
    return cli, conn


def _time_wait(cport: int, sport: int, at_client: bool = False) -> int:
    """A TIME_WAIT socket, its end of a _pair closed first: the server's end (local TW_SERVER:sport),
    as HAProxy's accepted socket is left when the proxy closed first, or (at_client) the client's end,
    as its connection to the origin is. Returns its rcv_nxt: the other end's FIN's sequence number + 1,
    read in repair mode before that FIN."""
    cli, conn = _pair(cport, sport)
    first, second = (cli, conn) if at_client else (conn, cli)
    try:
        first.close()
        second.settimeout(5)
        assert second.recv(1) == b"", "the second end saw data, not the first's FIN"
        fin_seq = _fin_seq(second)
    finally:
        second.close()
    local = f"{TW_CLIENT}:{cport}" if at_client else f"{TW_SERVER}:{sport}"
    deadline = time.monotonic() + 5
    while subprocess.run(["ss", "-Htn", "state", "time-wait", "src", local], capture_output=True,
                         text=True).stdout.strip() == "":
        assert time.monotonic() < deadline, f"no TIME_WAIT socket {local} after 5 s"
        time.sleep(0.01)
    return (fin_seq + 1) & 0xFFFFFFFF


TCP_RECV_QUEUE, TCP_REPAIR_WINDOW = 1, 29   # <linux/tcp.h>


def _repaired(lport: int, snd: int, rcv: int, unsent: bool = False) -> socket.socket:
    """The proxy's connection to the origin as a socket made in repair mode, with no peer:
    CLIENT1:lport -> SERVER1:80, ESTABLISHED at once, its next sequence numbers snd and rcv, left in
    repair mode (it sends nothing). unsent: the origin's window 0 and one byte written, not sent."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_IP, IP_TRANSPARENT, 1)
    s.setsockopt(socket.IPPROTO_TCP, TCP_REPAIR, 1)
    s.bind((CLIENT1, lport))
    for queue, seq in ((TCP_SEND_QUEUE, snd), (TCP_RECV_QUEUE, rcv)):
        s.setsockopt(socket.IPPROTO_TCP, TCP_REPAIR_QUEUE, queue)
        s.setsockopt(socket.IPPROTO_TCP, TCP_QUEUE_SEQ, seq)
    s.connect((SERVER1, 80))
    if unsent:
        # snd_wl1, snd_wnd, max_window, rcv_wnd, rcv_wup
        s.setsockopt(socket.IPPROTO_TCP, TCP_REPAIR_WINDOW, struct.pack("=5I", rcv, 0, 65535, 65535, rcv))
        s.setsockopt(socket.IPPROTO_TCP, TCP_REPAIR, 0)
        s.send(b"x")
    return s


def _fin_wait2(cport: int, sport: int) -> socket.socket:
    """A _pair whose client end is closed first, its FIN acknowledged, the server end left open: the
    client end an orphan in FIN_WAIT2, which Linux keeps as a time-wait socket of that substate. Returns
    the server end."""
    cli, conn = _pair(cport, sport)
    cli.close()
    conn.settimeout(5)
    assert conn.recv(1) == b"", "the server end saw data, not the client's FIN"
    local = f"{TW_CLIENT}:{cport}"
    deadline = time.monotonic() + 5
    while subprocess.run(["ss", "-Htn", "state", "fin-wait-2", "src", local], capture_output=True,
                         text=True).stdout.strip() == "":
        assert time.monotonic() < deadline, f"no FIN_WAIT2 socket {local} after 5 s"
        time.sleep(0.01)
    return conn


def _half_gone(cport: int, sport: int) -> socket.socket:
    """A _pair whose client end is gone without a word (closed in repair mode: no FIN, no RST): as
    HAProxy's accepted socket is before it has made its connection to the origin, no socket has the
    origin side's 4-tuple. Returns the server end."""
    cli, conn = _pair(cport, sport)
    cli.setsockopt(socket.IPPROTO_TCP, TCP_REPAIR, 1)
    cli.close()
    return conn


def _rst_close(s: socket.socket) -> None:
    """Closes with a RST: no FIN_WAIT orphan left retransmitting."""
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()


@dataclass
class FlowDatapath:
    pins: str
    prog: bpfsys.Prog
    egress: bpfsys.Prog
    run_in_ns: object               # NetnsRunner
    ns: str
    listeners: dict[int, socket.socket] = field(default_factory=dict)
    sockets: list[socket.socket] = field(default_factory=list)
    owned: list[socket.socket] = field(default_factory=list)      # a case's, closed at the next reset
    seen: dict = field(default_factory=dict)    # what a case's Do steps found, for its later frames

    def watch(self, dev: str) -> None:
        """A packet socket on dev (a peer: what leaves the interface at its other end), for expect_seen."""
        self.seen["watch"] = self.run_in_ns(_packet_socket, dev)

    def expect_seen(self, want: Packet, deadline_s: float = 2.0) -> None:
        """want's bytes among the frames the watched device received (polled with a deadline)."""
        ps, want_b, got = self.seen.pop("watch"), bytes(want), []
        try:
            end = time.monotonic() + deadline_s
            while (left := end - time.monotonic()) > 0 and select.select([ps], [], [], left)[0]:
                frame = ps.recv(65535)
                if frame == want_b:
                    return
                got.append(frame)
        finally:
            ps.close()
        raise AssertionError(f"not seen within {deadline_s} s: {want!r}; seen: {[Ether(f) for f in got]}")

    def own(self, local: str, lport: int, remote: str, rport: int) -> None:
        self.owned.append(self.run_in_ns(_syn_sent, local, lport, remote, rport))

    def run(self, side: str, frame: bytes, mark: int = 0) -> bpfsys.TestRun:
        if side.startswith("to-"):
            return self.run_in_ns(self.egress.test_run, frame, bpfsys.skb_ctx(SIDES[side][0], mark, 0))
        if side.startswith("fwd-"):
            return self.run_in_ns(self.egress.test_run, frame, bpfsys.skb_ctx(SIDES[side][0], mark, C_IN0))
        return self.run_in_ns(self.prog.test_run, frame, bpfsys.skb_ctx(SIDES[side][0], mark))

    def marks(self, *flow) -> tuple | None:
        """(sub_dscp, org_dscp, flags, seen, sub_mss, org_mss) of flow's marks entry (flow_key's
        arguments), or None."""
        with fm.open_map(self.pins, "marks") as m:
            raw = m.lookup(fm.flow_key(*flow))
        return fm.FLOW_MARKS.unpack(raw) if raw is not None else None

    def syn_state(self, *flow) -> str | None:
        """The state of flow's honest-handshake record (flow_key's arguments), or None."""
        with fm.open_map(self.pins, "syns") as m:
            raw = m.lookup(fm.flow_key(*flow))
        return fm.SYN_STATES[fm.FLOW_SYN.unpack(raw)[1]] if raw is not None else None

    def set_marks(self, flow: tuple, sub_dscp: int, org_dscp: int, flags: int, sub_mss: int = 0,
                  org_mss: int = 0, seen: int = 0) -> None:
        with fm.open_map(self.pins, "marks") as m:
            m.update(fm.flow_key(*flow), fm.FLOW_MARKS.pack(sub_dscp, org_dscp, flags, seen, sub_mss, org_mss))

    def counters(self) -> dict[int, dict[str, int]]:
        return {slot: fm.read_counters(self.pins, slot) for slot in SLOTS}

    def listen(self, port: int) -> None:
        if port not in self.listeners:
            self.listeners[port] = self.run_in_ns(_listen, port)

    def unlisten(self, port: int) -> None:
        s = self.listeners.pop(port, None)
        if s is not None:
            s.close()

    def write_lpm(self, name: str, slot: int, net: str, value: bytes) -> None:
        with fm.open_map(self.pins, name) as m:
            fm.write_keys(m, [fm.lpm_key(net, slot)], value)

    def reset(self) -> None:
        """What every case starts from: no rule, no flow, slots 0 and 1 as G0 and G1, slot 2 unset,
        the two graph listeners open and no other."""
        for name in ("bypass_client4", "bypass_server4", "bypass_client6", "bypass_server6", "bypass_ports",
                     "intercept_ports", "graph_addrs", "flows_new", "flows", "syns", "marks", "measured",
                     "netns_slots"):
            with fm.open_map(self.pins, name) as m:
                for key in list(m.keys()):
                    m.delete(key, missing_ok=True)
        self.records()
        self.seen.clear()
        with fm.open_map(self.pins, "conns") as m:
            for slot in (0, 1, fm.GRAPHS_MAX):
                m.update(fm.U32.pack(slot), fm.U64.pack(0))
        fm.set_graph(self.pins, 0, **G0)
        fm.set_graph(self.pins, 1, **G1)
        fm.set_flags(self.pins, 2, 0, 0)
        for port in set(self.listeners) - {LPORT0, LPORT1}:
            self.unlisten(port)
        for sock in self.owned:
            _rst_close(sock)
        self.owned.clear()
        self.listen(LPORT0)
        self.listen(LPORT1)

    def records(self) -> list[dict]:
        """The experiment's flow records waiting on flow_records, taken off it."""
        out = []
        with fm.open_map(self.pins, "flow_records") as q:
            while (raw := q.pop()) is not None:
                out.append(experiment.decode_record(raw, 0.0, {0: "g0", 1: "g1"}))
        return out

    def flow(self, f: Flow) -> dict | None:
        """f's entry as decode_flow gives it (from flows_new or flows); None when in neither. An
        entry in both tables is an error."""
        key = fm.flow_key(f.sub, f.sub_port, f.org, f.org_port, f.graph)
        found = []
        for name in ("flows_new", "flows"):
            with fm.open_map(self.pins, name) as m:
                value = m.lookup(key)
            if value is not None:
                found.append(fm.decode_flow(key, value))
        assert len(found) < 2, f"{f} is in both flows_new and flows: {found}"
        return found[0] if found else None

    def close(self) -> None:
        for port in list(self.listeners):
            self.unlisten(port)
        for s in self.sockets:
            _rst_close(s)
        self.sockets.clear()


@pytest.fixture(scope="module")
def flowdp(pin_dir, netns, bpf_loadall):
    ns, run_in_ns = netns
    for argv in NETNS_SETUP:
        r = _run(["ip", "-n", ns, *argv])
        if r.returncode != 0:
            pytest.skip(f"ip -n {ns} {' '.join(argv)}: {r.stderr.strip()}")
    r = _run(["ip", "netns", "exec", ns, "sysctl", "-qw", *SYSCTLS])
    assert r.returncode == 0, f"sysctl {SYSCTLS} in {ns}: {r.stderr}"

    bpf_loadall(OBJECT, pin_dir)
    prog = bpfsys.Prog(str(pin_dir / "prog" / fm.PROGRAM))
    egress = bpfsys.Prog(str(pin_dir / "prog" / fm.EGRESS_PROGRAM))
    dp = FlowDatapath(str(pin_dir), prog, egress, run_in_ns, ns)
    try:
        dp.sockets.extend(run_in_ns(_established_pair))
        dp.reset()
        yield dp
    finally:
        dp.close()
        prog.close()
        egress.close()


def _show(frame: Packet | bytes) -> str:
    return repr(frame) if isinstance(frame, Packet) else f"{len(frame)} bytes {bytes(frame).hex()}"


def _ip4_header_sum_ok(frame: bytes) -> bool:
    ihl = (frame[14] & 0x0F) * 4
    words = struct.unpack(f"!{ihl // 2}H", frame[14:14 + ihl])
    total = sum(words)
    while total > 0xFFFF:
        total = (total & 0xFFFF) + (total >> 16)
    return total == 0xFFFF


def _moved(before: dict[int, dict[str, int]], after: dict[int, dict[str, int]]) -> dict[str, int]:
    return {f"slot{slot}.{k}": after[slot][k] - before[slot][k]
            for slot in SLOTS for k in after[slot] if after[slot][k] != before[slot][k]}


def _made(what, dp: FlowDatapath):
    return what(dp) if callable(what) else what


def _send(dp: FlowDatapath, step: Send, where: str) -> None:
    frame = bytes(_made(step.frame, dp))
    before = dp.counters()
    res = dp.run(step.side, frame, step.mark_in)
    after = dp.counters()

    assert res.retval == step.verdict, (
        f"{where}: verdict expected {VERDICTS[step.verdict]}, got {VERDICTS.get(res.retval, res.retval)}")
    want = bytes(_made(step.out, dp)) if step.out is not None else frame
    assert res.data == want, (
        f"{where}: output bytes\n expected {want.hex()}\n got      {res.data.hex()}\n"
        f" got as scapy: {Ether(res.data)!r}")
    if res.retval == TC_ACT_REDIRECT and IP in Ether(res.data):
        assert _ip4_header_sum_ok(res.data), f"{where}: IPv4 header checksum of the output is wrong"
    mark = struct.unpack_from("=I", res.ctx, bpfsys.SKB_MARK_OFF)[0]
    assert mark == step.mark, f"{where}: skb mark expected {step.mark:#x}, got {mark:#x}"
    slot = SIDES[step.side][1]
    want_moves = {f"slot{slot}.{k}": v for k, v in step.counters.items()}
    assert not (step.counters and slot is None), f"{where}: counters given for a side of no slot"
    got_moves = _moved(before, after)
    assert got_moves == want_moves, f"{where}: counter changes expected {want_moves}, got {got_moves}"


def _check_flows(dp: FlowDatapath, flows: list[Flow], where: str) -> None:
    for f in flows:
        got = dp.flow(f)
        if f.table is None:
            assert got is None, f"{where}: no entry expected for {f}, found {got}"
            continue
        assert got is not None, f"{where}: no entry for {f} in flows_new or flows"
        want = {"table": f.table, "verdict": f.verdict, "syn_seq": f.syn_seq, "graph": f.graph}
        if f.state is not None:
            want["state"] = f.state
        if f.fins is not None:
            want["fins"] = f.fins
        assert {k: got.get(k) for k in want} == want, f"{where}: entry {got}, expected {want}"
        assert got["first_seen_ns"] > 0, f"{where}: first_seen_ns not set in {got}"
        if got["table"] == "flows":
            assert got["last_seen_ns"] >= got["first_seen_ns"], f"{where}: last_seen_ns not set in {got}"


# Kernel 6.18 allocates a `flows` entry's timer with kmalloc_nolock, which may refuse (flows_no_timer:
# the promotion is put off, tc/flow_table.h promote). Seen in CI on a fresh machine, twice in one run.
# That is the kernel's memory, not the logic under test: a case it hit is played again, this often.
TIMER_TRIES = 3


def timer_refused(dp: FlowDatapath, before: dict[int, dict[str, int]]) -> bool:
    return any(k.endswith(".flows_no_timer") for k in _moved(before, dp.counters()))


def _play(flowdp, case: Case) -> None:
    for slot, rules in case.rules.items():
        fm.add_rules(flowdp.pins, slot, **rules)
    for n, step in enumerate(case.steps, 1):
        where = f"{case.id} ({case.desc}) step {n}"
        if isinstance(step, Do):
            step.fn(flowdp)
        elif isinstance(step, Check):
            _check_flows(flowdp, step.flows, where)
        else:
            _send(flowdp, step, f"{where}, {step.side} side: {_show(_made(step.frame, flowdp))}")
    _check_flows(flowdp, case.flows, f"{case.id} ({case.desc}) after the last step")


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_golden(flowdp, case: Case):
    for attempt in range(1, TIMER_TRIES + 1):
        before = flowdp.counters()
        try:
            _play(flowdp, case)
            return
        except AssertionError:
            if attempt == TIMER_TRIES or not timer_refused(flowdp, before):
                raise
        finally:
            flowdp.reset()


def test_case_ids_unique():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)), f"duplicate case ids: {sorted(i for i in ids if ids.count(i) > 1)}"


def test_flows_lists_entries(flowdp):
    """flows() decodes both tables and filters by graph: a bypassed flow of slot 1 from the origin side
    shows as subscriber -> origin, with its opener's ISN."""
    fm.add_rules(flowdp.pins, 1, ports=[(4011, 4011)])
    try:
        flowdp.run("origin1", bytes(reply1(80, 4011, flags="S", ack=0)))
        flowdp.run("access", bytes(syn(40063)))   # proxied: not remembered
        got = fm.flows(flowdp.pins, graph=1)
        assert fm.flows(flowdp.pins, graph=0) == [], "slot 0 has no remembered flow"
    finally:
        flowdp.reset()
    assert len(got) == 1, f"flows(graph=1): {got}"
    f = got[0]
    assert {k: f[k] for k in ("table", "graph", "family", "subscriber", "sub_port", "origin", "org_port",
                              "verdict", "syn_seq", "state", "opener")} == {
        "table": "flows_new", "graph": 1, "family": 4, "subscriber": CLIENT1, "sub_port": 4011, "origin": SERVER1,
        "org_port": 80, "verdict": "bypass_rule", "syn_seq": 5000, "state": "syn_seen", "opener": fm.SIDE_ORIGIN}


def test_last_seen_refresh(flowdp):
    """last_seen_ns of a promoted flow is written at most once per FLOW_TOUCH_NS (1 s): not by a
    segment right after the promotion, but by one 1.1 s later. (The timers' expiry, 60 s and 6 h,
    is left to the namespace tests; that they were armed shows only as the closing state.)"""
    flow = established(40065)
    for attempt in range(1, TIMER_TRIES + 1):   # the kernel may refuse the timer (TIMER_TRIES)
        fm.add_rules(flowdp.pins, 0, clients=[f"{CLIENT}/32"])
        before = flowdp.counters()
        for step in handshake(40065):
            assert flowdp.run(step.side, bytes(step.frame)).retval == TC_ACT_REDIRECT
        if attempt == TIMER_TRIES or not timer_refused(flowdp, before):
            break
        flowdp.reset()
    try:
        promoted_at = time.monotonic()
        seen = flowdp.flow(flow)["last_seen_ns"]
        flowdp.run("access", bytes(ack(40065, flags="PA") / b"x"))
        if time.monotonic() - promoted_at < 0.5:   # else this machine was too busy to tell
            assert flowdp.flow(flow)["last_seen_ns"] == seen, "last_seen_ns rewritten within FLOW_TOUCH_NS"
        time.sleep(1.1)
        flowdp.run("origin", bytes(reply(80, 40065, flags="A", seq=5001, ack=1002)))
        later = flowdp.flow(flow)["last_seen_ns"]
    finally:
        flowdp.reset()
    assert later > seen + 1_000_000_000, f"last_seen_ns {seen} -> {later} after 1.1 s"


def _seed_parting(a: str, b: str, fraction: float) -> int:
    """A seed that puts a in the control group and b in the treated one."""
    return next(seed for seed in range(10000) if experiment.group_of(a, fraction, seed) == "control"
                and experiment.group_of(b, fraction, seed) == "treated")


def test_control_group_and_measurement(flowdp):
    """With the experiment on, a control-group subscriber's SYN is bypassed (bypass_control) and a
    treated one's proxied; both flows are measured from the subscriber's segments, and each leaves a
    record when the subscriber ends it: bytes it acknowledged (down) and sent (up), its group, how
    it ended."""
    seed = _seed_parting(CLIENT, CLIENT2, 0.5)
    fm.set_graph(flowdp.pins, 0, **{**G0, "flags": G0["flags"] | fm.GRAPH_F_MEASURE},
                 control=(experiment.control_below(0.5), seed))
    before = flowdp.counters()[0]
    try:
        assert flowdp.run("access", bytes(syn(40070))).retval == TC_ACT_REDIRECT, "control: forwarded here"
        assert flowdp.flow(Flow(CLIENT, 40070, SERVER, 80, "flows_new"))["verdict"] == "bypass_control"
        assert flowdp.run("access", bytes(syn(40071, src=CLIENT2))).retval == TC_ACT_OK, "treated: to the proxy"
        # treated: handshake ACK, a 100-byte request, 3000 bytes acknowledged, FIN
        for seg in (ack(40071, src=CLIENT2), ack(40071, src=CLIENT2, flags="PA") / (b"r" * 100),
                    ack(40071, src=CLIENT2, seq=1101, ack=8001), ack(40071, src=CLIENT2, flags="FA", seq=1101,
                                                                     ack=8001)):
            flowdp.run("access", bytes(seg))
        # control: the origin answers, the subscriber acknowledges, then resets
        flowdp.run("origin", bytes(reply(80, 40070)))
        flowdp.run("access", bytes(ack(40070)))
        flowdp.run("access", bytes(ack(40070, flags="R", seq=1001, ack=0)))
        got = sorted(flowdp.records(), key=lambda r: r["group"])
        after = flowdp.counters()[0]
    finally:
        flowdp.reset()
    picked = [{k: r[k] for k in ("group", "client", "server_port", "bytes_down", "bytes_up", "closed_by")}
              for r in got]
    assert picked == [
        {"group": "control", "client": CLIENT, "server_port": 80, "bytes_down": 0, "bytes_up": 0, "closed_by": "rst"},
        {"group": "treated", "client": CLIENT2, "server_port": 80, "bytes_down": 3000, "bytes_up": 100,
         "closed_by": "fin"}], f"flow records: {got}"
    assert all(r["seconds"] >= 0 for r in got), got
    moved = {k: after[k] - before[k] for k in ("flows_bypass_control", "flows_measured", "records_dropped")}
    assert moved == {"flows_bypass_control": 1, "flows_measured": 2, "records_dropped": 0}, moved


def _map_flags(m: bpfsys.Map) -> int:
    with open(f"/proc/self/fdinfo/{m.fd}") as f:
        return int(dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)["map_flags"], 16)


def test_maps_match_contract(flowdp):
    """Shapes pepctl relies on: type, key and value size, max entries, flags of every pinned map."""
    hash_, array, percpu_array, lru, lpm, queue, no_prealloc = 1, 2, 6, 9, 11, 22, 1
    want = {  # map: (type, key size, value size, max entries, flags)
        "graphs": (array, 4, fm.GRAPH_CONFIG.size, fm.GRAPHS_MAX, 0),
        "graph_addrs": (hash_, fm.ADDR_KEY.size, 4, 65536, no_prealloc),
        "bypass_ports": (hash_, fm.PORT_KEY.size, 4, 1048576, no_prealloc),
        "intercept_ports": (hash_, fm.PORT_KEY.size, 4, 1048576, no_prealloc),
        "bypass_client4": (lpm, fm.LPM4_KEY.size, 4, 1048576, no_prealloc),
        "bypass_server4": (lpm, fm.LPM4_KEY.size, 4, 1048576, no_prealloc),
        "bypass_client6": (lpm, fm.LPM6_KEY.size, 4, 1048576, no_prealloc),
        "bypass_server6": (lpm, fm.LPM6_KEY.size, 4, 1048576, no_prealloc),
        "flows_new": (lru, fm.FLOW_KEY.size, fm.FLOW_NEW.size, 262144, 0),
        "flows": (hash_, fm.FLOW_KEY.size, fm.FLOW_EST.size, 1048576, no_prealloc),
        "syns": (lru, fm.FLOW_KEY.size, fm.FLOW_SYN.size, 262144, 0),
        "marks": (lru, fm.FLOW_KEY.size, fm.FLOW_MARKS.size, 262144, 0),
        "measured": (lru, fm.FLOW_KEY.size, 40, 65536, 0),
        "flow_records": (queue, 0, experiment.FLOW_RECORD.size, 65536, 0),
        "flow_stats": (percpu_array, 4, 8, fm.GRAPHS_MAX * len(fm.COUNTERS), 0),
        "netns_slots": (hash_, 8, 4, fm.GRAPHS_MAX, 0),
        "conns": (array, 4, 8, fm.GRAPHS_MAX + 1, 0),
    }
    got = {}
    for name in fm.MAPS:
        with fm.open_map(flowdp.pins, name) as m:
            got[name] = (m.type, m.key_size, m.value_size, m.max_entries, _map_flags(m))
    assert got == want


def test_bulk_rules_install(flowdp):
    """10,000 client /32s and /24s go in and out of slot 1; a SYN from one of them is then bypassed."""
    nets = [f"198.18.{i >> 8}.{i & 255}/32" for i in range(10000)] + [f"10.{i >> 8}.{i & 255}.0/24"
                                                                         for i in range(10000)]
    done = fm.add_rules(flowdp.pins, 1, clients=nets)
    try:
        assert done["bypass_client4"] == 20000 and done["method"] in ("batch", "per-element"), done
        res = flowdp.run("access1", bytes(syn1(40064)))
        assert res.retval == TC_ACT_REDIRECT, f"{CLIENT1} is among slot 1's rules: SYN must be bypassed"
        assert flowdp.flow(Flow(CLIENT1, 40064, SERVER1, 80, "flows_new", graph=1))["verdict"] == "bypass_rule"
    finally:
        removed = fm.del_rules(flowdp.pins, 1, clients=nets)
        flowdp.reset()
    assert removed == {"bypass_client4": 20000}
    with fm.open_map(flowdp.pins, "bypass_client4") as m:
        left = list(m.keys())
    assert left == [], f"bypass_client4 not empty after del_rules: {len(left)} keys"


# -- one handshake for real: the SYN cookie path -----------------------------------------------
def _packet_socket(dev: str) -> socket.socket:
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))   # ETH_P_ALL
    s.bind((dev, 0))
    return s


def _wait_synack(ps: socket.socket, sport: int, deadline_s: float = 5.0) -> Packet:
    """The SYN-ACK to CLIENT1:sport that the peer receives, polled with a deadline."""
    end = time.monotonic() + deadline_s
    while (left := end - time.monotonic()) > 0:
        if not select.select([ps], [], [], left)[0]:
            break
        pkt = Ether(ps.recv(65535))
        if TCP in pkt and IP in pkt and pkt[IP].dst == CLIENT1 and pkt[TCP].dport == sport \
                and pkt[TCP].flags == "SA":
            return pkt
    raise AssertionError(f"no SYN-ACK to {CLIENT1}:{sport} on pflc1p within {deadline_s} s")


def test_syncookie_live(flowdp):
    """flow_ingress attached for real to slot 1's c_in (pflc1, ASSIGN, listen_port 50081); the peer
    pflc1p sends a SYN to 198.19.1.10:80 and, later, the ACK. Under tcp_syncookies=2 the transparent
    listener answers the SYN (handed to it by bpf_sk_assign, PEP_LOCAL_MARK, fwmark rule) with a
    cookie and keeps no state; the ACK then finds no socket of its own and reaches the listener only
    through the cookie path. Right is told from wrong by the counters (flows_proxied for the SYN,
    pkts_syncookie for the ACK), by test runs of the same ACK (a valid cookie makes it reach
    bpf_sk_assign: assign_failed; a forged one: no_flow), and by accept() giving a socket whose local
    address is the origin's 198.19.1.10:80."""
    ns, sport = flowdp.ns, 40777
    tc = ["nsenter", f"--net=/run/netns/{ns}", "tc"]
    prog_pin = str(Path(flowdp.pins) / "prog" / fm.PROGRAM)
    r = _run([*tc, "qdisc", "add", "dev", "pflc1", "clsact"])
    assert r.returncode == 0, f"tc qdisc add dev pflc1 clsact in {ns}: {r.stderr}"
    ps = conn = None
    try:
        r = _run([*tc, "filter", "add", "dev", "pflc1", "ingress", "bpf", "direct-action", "object-pinned",
                  prog_pin])
        assert r.returncode == 0, f"tc filter add dev pflc1 ingress bpf object-pinned {prog_pin}: {r.stderr}"
        ps = flowdp.run_in_ns(_packet_socket, "pflc1p")
        first = syn1(sport, seq=1000)

        before = flowdp.counters()
        ps.send(bytes(first))
        synack = _wait_synack(ps, sport)
        moved = _moved(before, flowdp.counters())
        assert moved == {"slot1.flows_proxied": 1}, f"live SYN on pflc1: counter changes {moved}"
        assert (synack[IP].src, synack[TCP].sport, synack[TCP].ack) == (SERVER1, 80, 1001), \
            f"the listener's SYN-ACK: {synack!r}"
        cookie = synack[TCP].seq

        final = ack1(sport, seq=1001, ack=cookie + 1)
        # Not cookie + 1: the cookie's low bits carry the MSS index (0-3), so a neighbour may be
        # valid too. Bit 16 flipped moves that field out of range.
        forged = (cookie ^ 0x10000) + 1
        for acked, counters in ((forged, {"slot1.pkts_no_flow": 1}), (cookie + 1, {"slot1.assign_failed": 1})):
            before = flowdp.counters()
            res = flowdp.run("access1", bytes(ack1(sport, seq=1001, ack=acked)))
            moved = _moved(before, flowdp.counters())
            assert (res.retval, moved) == (TC_ACT_OK, counters), \
                f"test run of the ACK acking {acked} (cookie {cookie}): verdict {res.retval}, counters {moved}"
        # The valid cookie of a port slot 1 would not intercept (ALL_PORTS off, intercept_ports empty)
        # is never checked: no_flow.
        fm.set_flags(flowdp.pins, 1, G1["flags"] & ~fm.GRAPH_F_ALL_PORTS, LPORT1)
        before = flowdp.counters()
        flowdp.run("access1", bytes(final))
        fm.set_flags(flowdp.pins, 1, G1["flags"], LPORT1)
        moved = _moved(before, flowdp.counters())
        assert moved == {"slot1.pkts_no_flow": 1}, f"valid cookie, port 80 not intercepted: counters {moved}"
        # As in modes nft and route (no ASSIGN): the stack's interception hands what it is given to the
        # listener. The valid cookie goes there (no_flow); the forged one, which the listener would
        # reset, is nobody's here and goes end to end (unowned).
        fm.set_flags(flowdp.pins, 1, G1["flags"] & ~fm.GRAPH_F_ASSIGN, LPORT1)
        try:
            for acked, want in ((forged, (TC_ACT_REDIRECT, {"slot1.pkts_unowned": 1, "slot1.pkts_bypassed": 1})),
                                (cookie + 1, (TC_ACT_OK, {"slot1.pkts_no_flow": 1}))):
                before = flowdp.counters()
                res = flowdp.run("access1", bytes(ack1(sport, seq=1001, ack=acked)))
                got = (res.retval, _moved(before, flowdp.counters()))
                assert got == want, f"slot 1 without ASSIGN: test run of the ACK acking {acked} (cookie {cookie}): " \
                                    f"expected verdict and counters {want}, got {got}"
        finally:
            fm.set_flags(flowdp.pins, 1, G1["flags"], LPORT1)

        listener = flowdp.listeners[LPORT1]
        before = flowdp.counters()
        ps.send(bytes(final))
        listener.settimeout(5)
        conn, peer = listener.accept()
        moved = _moved(before, flowdp.counters())
        assert moved == {"slot1.pkts_syncookie": 1}, f"live ACK on pflc1: counter changes {moved}"
        assert (conn.getsockname(), peer) == ((SERVER1, 80), (CLIENT1, sport)), \
            f"accepted: local {conn.getsockname()}, peer {peer}"
    finally:
        if conn is not None:
            _rst_close(conn)
        if ps is not None:
            ps.close()
        flowdp.listeners[LPORT1].settimeout(None)
        r = _run([*tc, "qdisc", "del", "dev", "pflc1", "clsact"])
        flowdp.reset()
    assert r.returncode == 0, f"tc qdisc del dev pflc1 clsact in {ns}: {r.stderr}"
