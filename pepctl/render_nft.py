"""One graph's nftables interception table (nft mode), as a script for `nft -f`.

The script declares the table, deletes it and declares it again with its
contents. `nft -f` applies a file as one transaction, so loading it again
replaces the table atomically: there is no moment without interception, and
the first load works too (declaring an existing or new table is no error).

In the table, one chain at prerouting, priority mangle (before routing), for
TCP arriving on the graph's two links:
  1. packets of flows HAProxy already owns (`socket transparent 1`: a
     transparent socket, listening or connected, matches them) get the mark,
     so policy routing (fwmark -> local table) delivers them to that socket.
     Not a first SYN (SYN without ACK): `socket` also finds TIME_WAIT
     sockets, and a client reusing its port would have its new SYN delivered
     to the old connection's TIME_WAIT socket, which answers with a stale ACK
     (no listener on the original port): about 10 ms lost per such
     connection, a third of the new-connection rate under load (measured).
     The tproxy statement of rule 2 handles TIME_WAIT itself: it hands such
     a SYN to the listener;
  2. other packets to the intercepted ports are handed to HAProxy's listener
     (`tproxy ... to :listen_port`) and marked the same way.
Rule 2 takes every packet without a socket, not only SYNs, as the kernel's
tproxy documentation does: the ACK that completes a SYN-cookie handshake
must reach the listener too.

Named counters say what was intercepted; read them with `nft -j list counters`:
  proxied         packets of flows HAProxy owns (rule 1)
  intercepted_v4  IPv4 packets handed to the listener (rule 2)
  intercepted_v6  IPv6 packets handed to the listener (rule 2)
"""

from __future__ import annotations

import re

from .config import Graph

IFACES = ("c_in", "s_in")   # the graph's access and origin links inside its namespace
COUNTERS = ("proxied", "intercepted_v4", "intercepted_v6")
TABLE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,31}")


def _port_set(ranges) -> str:
    items = [str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in ranges]
    return items[0] if len(items) == 1 else "{ " + ", ".join(items) + " }"


def render_nft(graph: Graph, *, table: str, mark: int = 1) -> str:
    p = graph.proxy
    if p.interception != "nft":
        raise ValueError(f"render_nft: graph {graph.name} uses {p.interception!r} interception, not nft")
    if not TABLE_RE.fullmatch(table):
        raise ValueError(f"render_nft: table name {table!r}: use 1-32 characters of A-Z, a-z, 0-9 and _, "
                         "not starting with a digit")
    if not 0 < mark <= 0xFFFFFFFF:
        raise ValueError(f"render_nft: mark {mark} must be 1-0xffffffff")

    ifaces = "{ " + ", ".join(f'"{i}"' for i in IFACES) + " }"
    match = f"iifname {ifaces} meta l4proto tcp"
    # No port list: every TCP port is intercepted.
    dport = "" if p.ports is None else f" tcp dport {_port_set(p.ports)}"
    set_mark = f"meta mark set {mark:#x}"
    lines = [
        f"# Interception table of graph {graph.name}, written by pepctl: do not edit.",
        f"table inet {table}",
        f"delete table inet {table}",
        f"table inet {table} {{",
        *(f"\tcounter {name} {{ }}" for name in COUNTERS),
        "",
        "\tchain prerouting {",
        "\t\ttype filter hook prerouting priority mangle; policy accept;",
        f"\t\t{match} tcp flags & (syn | ack) != syn socket transparent 1 counter name \"proxied\" {set_mark} accept",
        f"\t\t{match} meta nfproto ipv4{dport} counter name \"intercepted_v4\" "
        f"tproxy ip to :{p.listen_port} {set_mark} accept",
        f"\t\t{match} meta nfproto ipv6{dport} counter name \"intercepted_v6\" "
        f"tproxy ip6 to :{p.listen_port} {set_mark} accept",
        "\t}",
        "}",
    ]
    return "\n".join(lines) + "\n"
