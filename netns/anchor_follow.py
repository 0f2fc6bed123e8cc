"""The cluster lab's access router ra, IPv6: each share's table gets a default route toward the
share's anchor, following the anchor's route as BGP changes it (what a router's recursive
resolution does).

    python3 -m netns.anchor_follow --anchors 2001:2:0:196::/64 --shares 8 --table-base 100 --ready FILE

Run inside ra's namespace. FRR does this for IPv4 (staticd: `ip route 0.0.0.0/0 ANCHOR table T`),
but FRR 8.4 (Debian bookworm) never re-resolves an IPv6 recursive static route once it is
installed (checked on this machine: with the anchor's BGP route moved from one host to the other,
by a host going down or a better path arriving, `::/0 via ANCHOR table T` and even a main-table
`ipv6 route PREFIX ANCHOR` kept the first host's next hop, while the IPv4 ones followed). So here a
route change is only a trigger: on each one (netlink, RTMGRP_IPV6_ROUTE) the anchors' routes are
read again (`ip -6 -j route`) and every table whose next hop changed is set in one `ip -batch`:
`default via NEXTHOP dev DEV table T`, or no default while the anchor has no route. It writes
--ready once the tables are first set, and runs until it is stopped.
"""

from __future__ import annotations

import argparse
import errno
import ipaddress
import json
import socket
import subprocess
import sys

NETLINK_ROUTE = 0
RTMGRP_IPV6_ROUTE = 0x400


def anchor_routes(anchors: ipaddress.IPv6Network) -> dict[str, tuple[str, str]]:
    """anchor address -> (next hop, device) of its /128 route in the main table."""
    out = subprocess.run(["ip", "-6", "-j", "route", "show", "root", str(anchors)], capture_output=True,
                         text=True, check=True).stdout
    routes = {}
    for r in json.loads(out or "[]"):
        if r.get("gateway") and r.get("dev"):
            routes[str(ipaddress.IPv6Address(r["dst"].split("/")[0]))] = (r["gateway"], r["dev"])
    return routes


def sync(anchors: ipaddress.IPv6Network, shares: int, base: int, now: dict) -> dict:
    """Sets every share table whose anchor's route differs from what it has (now); what they have."""
    routes = anchor_routes(anchors)
    lines, want = [], {}
    for k in range(shares):
        want[k] = routes.get(str(anchors.network_address + k))
        if want[k] == now.get(k):
            continue
        if want[k]:
            lines.append(f"route replace default via {want[k][0]} dev {want[k][1]} table {base + k}")
        else:
            lines.append(f"route flush table {base + k}")
    if lines:
        subprocess.run(["ip", "-6", "-batch", "-"], input="\n".join(lines) + "\n", text=True, check=True)
    return want


def main() -> int:
    ap = argparse.ArgumentParser(prog="anchor_follow", description=__doc__.splitlines()[0])
    ap.add_argument("--anchors", type=ipaddress.IPv6Network, required=True)
    ap.add_argument("--shares", type=int, required=True)
    ap.add_argument("--table-base", type=int, required=True)
    ap.add_argument("--ready", required=True, help="a file written once the tables are first set")
    args = ap.parse_args()
    events = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE)
    events.bind((0, RTMGRP_IPV6_ROUTE))      # subscribed before the first read: no change is missed
    now = sync(args.anchors, args.shares, args.table_base, {})
    with open(args.ready, "w") as f:
        f.write("ready\n")
    while True:
        drain(events)
        now = sync(args.anchors, args.shares, args.table_base, now)


def drain(events: socket.socket) -> None:
    """Waits for a route change, then takes every one queued: a burst of changes is one sync. A
    burst that overflowed the socket (ENOBUFS) is a change too."""
    try:
        events.recv(65536)
        events.setblocking(False)
        while True:
            events.recv(65536)
    except BlockingIOError:
        pass
    except OSError as e:
        if e.errno != errno.ENOBUFS:
            raise
    finally:
        events.setblocking(True)


if __name__ == "__main__":
    sys.exit(main())
