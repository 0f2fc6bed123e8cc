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
    subscribers = read_networks(r, raw, "subscribers", '["198.18.0.0/24", "2001:2:0:1::/64"]')
    versions = sorted({n.version for n in subscribers}) if subscribers is not BAD else []
    hosts = read_members(r, raw, graph, versions)
    me = r.get(raw, "routing", "host", STR, example='"ph1"')
    names = [m.name for m in hosts] if hosts is not BAD else []
    if me is not BAD and hosts is not BAD and me not in names:
        me = r.error("routing.host", me, f"not in routing.hosts ({', '.join(names)}); name this host as "
                     "hosts does")
    elif me is not BAD and hosts is not BAD and graph is not None:
        mine = next(m for m in hosts if m.name == me)
        for side, addrs in (("access", mine.access), ("origin", mine.origin)):
            own = [a.ip for a in (graph.access if side == "access" else graph.origin).addresses]
            for addr in addrs:
                if addr not in own:
                    r.error(f"routing.hosts[{names.index(me)}].{side}", str(addr), f"this host's entry: give "
                            f"its graph's {side} addresses ({', '.join(map(str, own))})")
    shares = r.get(raw, "routing", "shares", INT, 8)
    if shares is not BAD and (shares < 1 or shares > SHARES_MAX or shares & (shares - 1)):
        shares = r.error("routing.shares", shares, f"use a power of 2 from 1 to {SHARES_MAX}: the subscriber "
                         "space splits into equal prefixes")
    elif shares is not BAD and subscribers is not BAD:
        small = [n for n in subscribers if n.prefixlen + (shares - 1).bit_length() > n.max_prefixlen]
        if small:
            shares = r.error("routing.shares", shares, f"{small[0]} has too few addresses for {shares} "
                             "shares; give fewer shares or a larger network in routing.subscribers")
    anchors = read_anchors(r, raw, subscribers, shares)
    peers = read_peers(r, raw, graph, versions)
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
                                "one (default: the graph's first IPv4 access address)") if router_id else \
                r.error("routing.router_id", None, "missing, and the graph has no IPv4 access address to take "
                        "as default: BGP names a router by an IPv4 address; give one")
    assign = read_assign(r, raw, hosts, shares)
    parts = [graph, asn, router_id, me, hosts, subscribers, shares, anchors, peers, interval, multiplier, assign]
    if any(p is BAD or p is None for p in parts):
        return BAD
    return Routing(graph.name, asn, router_id, me, tuple(hosts), subscribers, shares, anchors, peers,
                   interval, multiplier, assign)


def read_text_list(r: Reader, raw: dict, path: str, key: str, example: str) -> list[tuple[str, str]] | Any:
    """path.key: a string, or a list of them (one per family): (field path, text) of each."""
    value = r.get(raw, path, key, STR if isinstance(raw.get(key), str) else LIST, example=example)
    if value is BAD:
        return BAD
    if isinstance(value, str):
        return [(f"{path}.{key}", value)]
    if not value:
        return r.error(f"{path}.{key}", [], f"empty; give at least one, e.g. {example}")
    return r.strings(raw, path, key, BAD)


def read_networks(r: Reader, raw: dict, key: str, example: str) -> tuple | Any:
    """routing.KEY: IPv4 and IPv6 networks (a string or a list), none overlapping another."""
    items = read_text_list(r, raw, "routing", key, example)
    if items is BAD:
        return BAD

    def network(text: str, before: list):
        try:
            net = ipaddress.ip_network(text)
        except ValueError:
            return f"not an IPv4 or IPv6 network (with no host bits), e.g. {example}"
        clash = next((b for b in before if b.version == net.version and b.overlaps(net)), None)
        return f"overlaps {clash}, given before it" if clash else net
    nets = r.each(items, network)
    return BAD if nets is BAD else tuple(nets)


def read_anchors(r: Reader, raw: dict, subscribers: Any, shares: Any) -> tuple | Any:
    """routing.anchors: one network per family of the subscribers, an address for every share, apart
    from the subscribers."""
    anchors = read_networks(r, raw, "anchors", '["198.18.96.0/27", "2001:2:0:196::/64"]')
    if anchors is BAD or subscribers is BAD:
        return BAD
    problems = []      # (value, what is wrong and what to do)
    for v in sorted({n.version for n in subscribers}):
        mine = [n for n in anchors if n.version == v]
        if len(mine) != 1:
            problems.append(([str(n) for n in anchors], f"give one IPv{v} network for the IPv{v} subscribers "
                             f"(it has {len(mine)}): share k's IPv{v} anchor is its k-th address"))
    for net in anchors:
        if net.version not in {n.version for n in subscribers}:
            problems.append((str(net), f"no IPv{net.version} network in routing.subscribers: anchors are for the "
                             "subscribers' families; remove it or add the subscribers"))
        elif shares is not BAD and net.num_addresses < shares:
            problems.append((str(net), f"{net.num_addresses} addresses for {shares} shares: every share needs an "
                             "anchor address; give a larger network"))
        elif any(net.overlaps(n) for n in subscribers if n.version == net.version):
            problems.append((str(net), "overlaps routing.subscribers: anchors are addresses of their own, "
                             "announced to the access-side router; take them elsewhere"))
    for value, message in problems:
        r.error("routing.anchors", value, message)
    return BAD if problems else anchors


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


def read_link_address(r: Reader, field: str, text: str, graph: Graph | None, side: str,
                      whose: str) -> Any:
    """An address on the graph's link to the side's router (whose: the host's, the router's)."""
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return r.error(field, text, f"not an IPv4 or IPv6 address: {whose}, on the {side} routers' link")
    if graph is not None:
        nets = [a.network for a in (graph.access if side == "access" else graph.origin).addresses]
        if not any(address in n for n in nets if n.version == address.version):
            return r.error(field, text, f"not in graph {graph.name}'s {side} subnets "
                           f"({', '.join(map(str, nets))}): {whose}, on the link the routers share")
    return address


def read_member_addresses(r: Reader, item: dict, path: str, side: str, graph: Graph | None,
                          versions: list[int]) -> tuple | Any:
    """A host's addresses on one side: one of each family the subscribers have (a draining host
    hands that family's new flows to another host there)."""
    items = read_text_list(r, item, path, side, '["198.18.64.11", "2001:2:0:164::11"]')
    if items is BAD:
        return BAD
    addrs = [read_link_address(r, field, text, graph, side, "the host's") for field, text in items]
    if BAD in addrs:
        return BAD
    got = sorted(a.version for a in addrs)
    if got != sorted(set(got)) or not set(versions) <= set(got):
        return r.error(f"{path}.{side}", [str(a) for a in addrs], "give one address of each family the "
                       f"subscribers have (IPv{' and IPv'.join(map(str, versions))}), at most one of each: a "
                       "draining host hands that family's new flows to another there")
    return tuple(sorted(addrs, key=lambda a: a.version))


def read_members(r: Reader, raw: dict, graph: Graph | None, versions: list[int]) -> tuple[Member, ...] | Any:
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
        addrs = [read_member_addresses(r, item, path, side, graph, versions) for side in ("access", "origin")]
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


def read_peers(r: Reader, raw: dict, graph: Graph | None, versions: list[int]) -> tuple[Peer, ...] | Any:
    items = read_table_items(r, raw, "peer", PEER_KEYS, '[{ side = "access", address = "...", asn = 65001 }]')
    if items is BAD:
        return BAD
    out = []
    for path, item in items:
        side = r.get(item, path, "side", STR, example='"access"')
        if side is not BAD and side not in ("access", "origin"):
            side = r.error(f"{path}.side", side, 'must be "access" or "origin": the graph side the router is on')
        text = r.get(item, path, "address", STR, example='"198.18.64.1"')
        address = BAD if BAD in (side, text) else \
            read_link_address(r, f"{path}.address", text, graph, side, "the router's")
        asn = read_asn(r, item, path, "asn")
        if BAD not in (side, address, asn):
            out.append(Peer(side, address, asn))
    if len(out) != len(items):
        return BAD
    for side in ("access", "origin"):
        for v in versions:
            if not any(p.side == side and p.address.version == v for p in out):
                r.error("routing.peer", None, f"no IPv{v} {side}-side router; add a [[routing.peer]] with "
                        f"side = \"{side}\" and its IPv{v} address: a session carries its own family's "
                        f"prefixes, and both routers must learn this host's IPv{v} shares")
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
