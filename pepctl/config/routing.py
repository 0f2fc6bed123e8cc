"""[routing]: several proxy hosts behind routers (pepctl/routing.py holds its dataclasses and says
what they mean)."""

from __future__ import annotations

import ipaddress
from typing import Any

from ..routing import Member, Peer, Routing
from .model import Graph, key_text
from .reader import BAD, INT, LIST, REQUIRED, STR, TABLE, Reader, is_kind
from .schema import BFD_KEYS, HOST_NAME_RE, MEMBER_KEYS, PEER_KEYS, ROUTING_KEYS, SHARES_MAX


def read_routing(r: Reader, doc: dict, graphs: list) -> Routing | Any:
    raw = r.subtable(doc, "", "routing", ROUTING_KEYS)
    if raw is BAD:
        return BAD
    good = [g for g in graphs if g is not BAD]
    name = r.get(raw, "routing", "graph", STR, good[0].name if len(good) == 1 else REQUIRED,
                 example='"g1"')
    graph = next((g for g in good if g.name == name), None) if name is not BAD else None
    if name is not BAD and graph is None and len(good) == len(graphs):
        r.error("routing.graph", name, "no graph has this name; give the graph whose namespace faces "
                f"the routers: {', '.join(g.name for g in good)}")
    asn = read_asn(r, raw, "routing", "asn")
    hosts = read_members(r, raw, graph)
    me = r.get(raw, "routing", "host", STR, example='"ph1"')
    names = [m.name for m in hosts] if hosts is not BAD else []
    if me is not BAD and hosts is not BAD and me not in names:
        me = r.error("routing.host", me, f"not in routing.hosts ({', '.join(names)}); name this host as "
                     "hosts does")
    elif me is not BAD and hosts is not BAD and graph is not None:
        mine = next(m for m in hosts if m.name == me)
        for side, addr in (("access", mine.access), ("origin", mine.origin)):
            own = [a.ip for a in (graph.access if side == "access" else graph.origin).addresses]
            if addr not in own:
                r.error(f"routing.hosts[{names.index(me)}].{side}", str(addr), f"this host's entry: give "
                        f"its graph's {side} address ({', '.join(map(str, own))})")
    subscribers = read_ipv4_net(r, raw, "routing", "subscribers", '"198.18.0.0/24"')
    shares = r.get(raw, "routing", "shares", INT, 8)
    if shares is not BAD and (shares < 1 or shares > SHARES_MAX or shares & (shares - 1)):
        shares = r.error("routing.shares", shares, f"use a power of 2 from 1 to {SHARES_MAX}: the subscriber "
                         "space splits into equal prefixes")
    elif shares is not BAD and subscribers is not BAD and \
            subscribers.prefixlen + (shares - 1).bit_length() > 32:
        shares = r.error("routing.shares", shares, f"{subscribers} has too few addresses for {shares} "
                         "shares; give fewer shares or a larger routing.subscribers")
    anchors = read_ipv4_net(r, raw, "routing", "anchors", '"198.18.96.0/27"')
    if anchors is not BAD and shares is not BAD and anchors.num_addresses < shares:
        anchors = r.error("routing.anchors", str(anchors), f"{anchors.num_addresses} addresses for {shares} "
                          "shares: every share needs an anchor address; give a larger network")
    if BAD not in (anchors, subscribers) and anchors.overlaps(subscribers):
        anchors = r.error("routing.anchors", str(anchors), "overlaps routing.subscribers: anchors are "
                          "addresses of their own, announced to the access-side router; take them elsewhere")
    peers = read_peers(r, raw, graph)
    bfd = r.subtable(raw, "routing", "bfd", BFD_KEYS)
    interval = multiplier = BAD
    if bfd is not BAD:
        interval = r.get(bfd, "routing.bfd", "interval_ms", INT, 100)
        if interval is not BAD and not 10 <= interval <= 60000:
            interval = r.error("routing.bfd.interval_ms", interval, "use 10-60000 ms (FRR's range)")
        multiplier = r.get(bfd, "routing.bfd", "multiplier", INT, 3)
        if multiplier is not BAD and not 2 <= multiplier <= 255:
            multiplier = r.error("routing.bfd.multiplier", multiplier, "use 2-255 (FRR's range)")
    router_id = r.get(raw, "routing", "router_id", STR, "")
    if router_id == "" and graph is not None:
        router_id = str(next((a.ip for a in graph.access.addresses if a.version == 4), ""))
    if router_id is not BAD:
        try:
            router_id = ipaddress.IPv4Address(router_id)
        except ValueError:
            router_id = r.error("routing.router_id", router_id, "not an IPv4 address; BGP names a router by "
                                "one (default: the graph's first IPv4 access address)")
    assign = read_assign(r, raw, hosts, shares)
    parts = [graph, asn, router_id, me, hosts, subscribers, shares, anchors, peers, interval, multiplier, assign]
    if any(p is BAD or p is None for p in parts):
        return BAD
    return Routing(graph.name, asn, router_id, me, tuple(hosts), subscribers, shares, anchors, peers,
                   interval, multiplier, assign)


def read_table_items(r: Reader, raw: dict, key: str, keys: tuple, example: str) -> list[tuple[str, dict]] | Any:
    """routing.KEY, a list of tables: (path, table) of each, unknown keys named."""
    items = r.get(raw, "routing", key, LIST, example=example)
    if items is BAD:
        return BAD
    out = []
    for i, item in enumerate(items):
        path = f"routing.{key}[{i}]"
        if not is_kind(item, TABLE):
            r.error(path, item, f"must be a table with {', '.join(keys)}, e.g. {example}")
            continue
        r.unknown_keys(item, path, keys)
        out.append((path, item))
    return out if len(out) == len(items) else BAD


def read_link_address(r: Reader, item: dict, path: str, key: str, graph: Graph | None, side: str,
                      whose: str) -> ipaddress.IPv4Address | Any:
    """An IPv4 address on the graph's link to the side's router (whose: the host's, the router's)."""
    text = r.get(item, path, key, STR, example='"198.18.64.11"')
    if text is BAD:
        return BAD
    try:
        address = ipaddress.IPv4Address(text)
    except ValueError:
        return r.error(f"{path}.{key}", text, f"not an IPv4 address: {whose}, on the {side} routers' link")
    if graph is not None:
        nets = [a.network for a in (graph.access if side == "access" else graph.origin).addresses]
        if not any(address in n for n in nets):
            return r.error(f"{path}.{key}", text, f"not in graph {graph.name}'s {side} subnets "
                           f"({', '.join(map(str, nets))}): {whose}, on the link the routers share")
    return address


def read_members(r: Reader, raw: dict, graph: Graph | None) -> tuple[Member, ...] | Any:
    """routing.hosts: every host of the cluster, this one too: name, access, origin."""
    items = read_table_items(r, raw, "hosts", MEMBER_KEYS,
                             '[{ name = "ph1", access = "198.18.64.11", origin = "198.19.64.11" }, ...]')
    if items is BAD:
        return BAD
    out = []
    for path, item in items:
        name = r.get(item, path, "name", STR, example='"ph1"')
        if name is not BAD and not HOST_NAME_RE.fullmatch(name):
            name = r.error(f"{path}.name", name, "1-32 characters of a-z, 0-9 and '-', starting with a letter "
                           "or digit, e.g. \"ph1\"")
        addrs = [read_link_address(r, item, path, side, graph, side, "the host's") for side in ("access", "origin")]
        if BAD not in (name, *addrs):
            out.append(Member(name, *addrs))
    if len(out) != len(items):
        return BAD
    names = [m.name for m in out]
    if not out or len(set(names)) != len(names):
        return r.error("routing.hosts", names, "list every proxy host of the cluster once, this one too")
    return tuple(out)


def read_asn(r: Reader, raw: dict, path: str, key: str) -> int | Any:
    value = r.get(raw, path, key, INT, example="65011")
    if value is not BAD and not 1 <= value <= 4294967294:
        return r.error(f"{path}.{key}", value, "not an AS number; use 1-4294967294 (private: 64512-65534 or "
                       "4200000000-4294967294)")
    return value


def read_ipv4_net(r: Reader, raw: dict, path: str, key: str, example: str) -> ipaddress.IPv4Network | Any:
    text = r.get(raw, path, key, STR, example=example)
    if text is BAD:
        return BAD
    try:
        return ipaddress.IPv4Network(text)
    except ValueError:
        return r.error(f"{path}.{key}", text, f"not an IPv4 network (with no host bits), e.g. {example}")


def read_peers(r: Reader, raw: dict, graph: Graph | None) -> tuple[Peer, ...] | Any:
    items = read_table_items(r, raw, "peer", PEER_KEYS, '[{ side = "access", address = "...", asn = 65001 }]')
    if items is BAD:
        return BAD
    out = []
    for path, item in items:
        side = r.get(item, path, "side", STR, example='"access"')
        if side is not BAD and side not in ("access", "origin"):
            side = r.error(f"{path}.side", side, 'must be "access" or "origin": the graph side the router is on')
        address = BAD if side is BAD else read_link_address(r, item, path, "address", graph, side, "the router's")
        asn = read_asn(r, item, path, "asn")
        if BAD not in (side, address, asn):
            out.append(Peer(side, address, asn))
    if len(out) != len(items):
        return BAD
    for side in ("access", "origin"):
        if not any(p.side == side for p in out):
            r.error("routing.peer", None, f"no {side}-side router; add a [[routing.peer]] with "
                    f"side = \"{side}\": both routers must learn this host's shares")
            return BAD
    return tuple(out)


def read_assign(r: Reader, raw: dict, hosts: Any, shares: Any) -> tuple | Any:
    """routing.assign: { "3" = ["ph1", "ph2"] } pins share 3's primary and backup."""
    table = r.get(raw, "routing", "assign", TABLE, {})
    if table is BAD or not table:
        return () if table is not BAD else BAD
    out = []
    for key, pair in table.items():
        path = f"routing.assign.{key_text(key)}"
        if not key.isdigit() or (shares is not BAD and int(key) >= shares):
            last = "shares - 1" if shares is BAD else shares - 1
            r.error(path, pair, f"the key is a share number, 0 to {last}")
            continue
        if not is_kind(pair, LIST) or len(pair) != 2 or pair[0] == pair[1] or \
                (hosts is not BAD and any(h not in [m.name for m in hosts] for h in pair)):
            r.error(path, pair, "give [primary, backup]: two different hosts of routing.hosts")
            continue
        out.append((int(key), pair[0], pair[1]))
    return tuple(sorted(out)) if len(out) == len(table) else BAD
