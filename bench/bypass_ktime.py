"""The kernel's own time for flow_ingress (tc/bypass.c) with few and with many bypass rules.

Wall-clock rates on a shared 2-core machine drift by a quarter from one minute to the next,
more than the 5% a rule count could cost. BPF_PROG_TEST_RUN times the program itself: each
pin folder holds a private load of tc/bypass.o with its own maps and rules, run here on the
packets of one bypassed flow from 198.18.0.10 to 198.19.0.10:80 inside a namespace that has
c_in and s_in (the lab's pep namespace: the forward path's FIB lookups see its real routes).

  first SYN     a new ISN each run, so the flow is decided anew: proxy state, the client
                and server LPM lookups, the port array, a flow_table update, the forward
  established   an ACK of that flow: one flow_table lookup, the forward
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

from pepctl import bpfsys
from pepctl import bypass_maps as bm

SEQ_OFF = 14 + 20 + 4             # Ethernet, IPv4 without options, then the TCP sequence number


def frame(flags: int, seq: int) -> bytearray:
    """An Ethernet/IPv4/TCP segment from the lab's client to its origin, port 80."""
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 40, 1, 0, 64, socket.IPPROTO_TCP, 0,
                     socket.inet_aton("198.18.0.10"), socket.inet_aton("198.19.0.10"))
    tcp = struct.pack("!HHIIBBHHH", 40000, 80, seq, 0 if flags == 0x02 else 1, 5 << 4, flags, 65535, 0, 0)
    return bytearray(bytes(6) + bytes.fromhex("020000000a0a") + b"\x08\x00" + ip + tcp)


def median_time(prog: bpfsys.Prog, packet: bytearray, ctx: bytes, runs: int, what: str, new_seq=None) -> float:
    times = []
    for i in range(runs):
        if new_seq is not None:
            struct.pack_into("!I", packet, SEQ_OFF, new_seq + i)   # a new flow each time
        res = prog.test_run(bytes(packet), ctx)
        if res.retval != 7:    # TC_ACT_REDIRECT: bypassed and forwarded
            raise SystemExit(f"bypass_ktime: {prog.path}: {what}: verdict {res.retval}, expected a redirect "
                             "(the lab's clients must be bypassed by a rule)")
        times.append(res.duration_ns)
    return statistics.median(times)


def measure(pins: list[str], rounds: int, runs: int) -> dict:
    c_in, s_in = socket.if_nametoindex("c_in"), socket.if_nametoindex("s_in")
    ctx = bpfsys.skb_ctx(c_in)
    progs = {}
    for p in pins:
        bm.set_side(p, c_in, bm.SIDE_ACCESS, s_in)
        bm.set_side(p, s_in, bm.SIDE_ORIGIN, c_in)
        bm.set_proxy_up(p, True)
        progs[p] = bpfsys.Prog(f"{p}/prog/{bm.PROGRAM}")
    syn, ack = frame(0x02, 1), frame(0x10, 2)
    out = {"syn_ns": {p: [] for p in pins}, "est_ns": {p: [] for p in pins}}
    try:
        for r in range(rounds):
            for p in pins if r % 2 == 0 else pins[::-1]:
                out["syn_ns"][p].append(median_time(progs[p], syn, ctx, runs, "first SYN", new_seq=r * runs + 1))
                out["est_ns"][p].append(median_time(progs[p], ack, ctx, runs, "established packet"))
    finally:
        for prog in progs.values():
            prog.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(prog="bypass_ktime", description=__doc__.splitlines()[0])
    ap.add_argument("pins", nargs="+", help="pin folders of private loads of tc/bypass.o")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--runs", type=int, default=2000, help="runs of each packet per round and pin folder")
    args = ap.parse_args()
    print(json.dumps(measure(args.pins, args.rounds, args.runs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
