"""The kernel's own time for flow_ingress (tc/flow.c) with few and with many bypass rules.

Wall-clock rates on a shared 2-core machine drift by a quarter from one minute to the next,
more than the 5% a rule count could cost. BPF_PROG_TEST_RUN times the program itself: each
pin folder holds a private load of tc/flow.o with its own maps and rules (graph slot 0), run
here on the packets of bypassed flows from 198.18.0.10 to 198.19.0.10:80 inside a namespace that
has c_in and s_in (the lab's pep namespace: the forward path's FIB lookups see its real routes).

  first SYN     a new source port each run, so each is a new flow: the graph's entry, its own
                addresses, the client and server LPM lookups, the port rules, a flows_new
                insert, the forward
  established   an ACK of a flow whose handshake went through (in `flows`): one miss in
                nothing, one lookup, the forward
Each run is its own call (a repeated run would see the TTL it decremented the time before); the
round's figure is the median of its calls.

Run by bench/bypass.py as `nsenter --net=NETNS python -m bench.bypass_ktime PINS...`
(nsenter, not `ip netns exec`, which would hide /sys/fs/bpf); prints one JSON object:
{"syn_ns": {PINS: [median ns of each round]}, "est_ns": {PINS: [median ns of each round]}}.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import struct

from netns.addresses import CLIENT4, ORIGIN4
from pepctl import bpfsys
from pepctl import flow_maps as fm

SPORT_OFF = 14 + 20               # Ethernet, IPv4 without options, then the TCP source port
SYN, ACK, SYNACK = 0x02, 0x10, 0x12


def frame(flags: int, seq: int, ack: int = 0, sport: int = 40000, reply: bool = False) -> bytearray:
    """An Ethernet/IPv4/TCP segment between the lab's client and its origin, port 80 (reply: from the origin)."""
    client, origin = socket.inet_aton(CLIENT4), socket.inet_aton(ORIGIN4)
    src, dst, ports = (origin, client, (80, sport)) if reply else (client, origin, (sport, 80))
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 40, 1, 0, 64, socket.IPPROTO_TCP, 0, src, dst)
    tcp = struct.pack("!HHIIBBHHH", *ports, seq, ack, 5 << 4, flags, 65535, 0, 0)
    return bytearray(bytes(6) + bytes.fromhex("020000000a0a") + b"\x08\x00" + ip + tcp)


def median_time(prog: bpfsys.Prog, packet: bytearray, ctx: bytes, runs: int, what: str, new_port=None) -> float:
    times = []
    for i in range(runs):
        if new_port is not None:
            struct.pack_into("!H", packet, SPORT_OFF, new_port + i)   # a new flow each time
        res = prog.test_run(bytes(packet), ctx)
        if res.retval != 7:    # TC_ACT_REDIRECT: bypassed and forwarded
            raise SystemExit(f"bypass_ktime: {prog.path}: {what}: verdict {res.retval}, expected a redirect "
                             "(the lab's clients must be bypassed by a rule)")
        times.append(res.duration_ns)
    return statistics.median(times)


def measure(pins: list[str], rounds: int, runs: int) -> dict:
    c_in, s_in = fm.ifindexes(0)     # the lab's graph is slot 0: c_in and s_in have these ifindexes
    if (socket.if_nametoindex("c_in"), socket.if_nametoindex("s_in")) != (c_in, s_in):
        raise SystemExit("bypass_ktime: run me in a graph's namespace of slot 0 (c_in, s_in)")
    access, origin = bpfsys.skb_ctx(c_in), bpfsys.skb_ctx(s_in)
    progs = {}
    for p in pins:
        fm.set_graph(p, 0, fm.GRAPH_F_ENABLED | fm.GRAPH_F_ALL_PORTS, 50080)
        progs[p] = bpfsys.Prog(f"{p}/prog/{fm.PROGRAM}")
        # One flow through its handshake, into `flows`: the established packets are its ACKs.
        for packet, ctx in ((frame(SYN, 1), access), (frame(SYNACK, 7000, 2, reply=True), origin),
                            (frame(ACK, 2, 7001), access)):
            if progs[p].test_run(bytes(packet), ctx).retval != 7:
                raise SystemExit(f"bypass_ktime: {p}: the handshake was not bypassed (the lab's clients must be)")
    ack = frame(ACK, 2, 7001)
    out = {"syn_ns": {p: [] for p in pins}, "est_ns": {p: [] for p in pins}}
    try:
        for r in range(rounds):
            for p in pins if r % 2 == 0 else pins[::-1]:
                out["syn_ns"][p].append(median_time(progs[p], frame(SYN, 1), access, runs, "first SYN",
                                                    new_port=1024 + (r * runs) % 60000))
                out["est_ns"][p].append(median_time(progs[p], ack, access, runs, "established packet"))
    finally:
        for prog in progs.values():
            prog.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(prog="bypass_ktime", description=__doc__.splitlines()[0])
    ap.add_argument("pins", nargs="+", help="pin folders of private loads of tc/flow.o")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--runs", type=int, default=2000, help="runs of each packet per round and pin folder")
    args = ap.parse_args()
    print(json.dumps(measure(args.pins, args.rounds, args.runs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
