"""[[graph]] and [defaults.proxy]: each graph's proxy, bypass rules and experiment (its sides are
pepctl/config/sides.py), and the checks across graphs (names, VLANs, networks)."""

from __future__ import annotations

import ipaddress
import json
from typing import Any

from .model import ONE_LISTENER, Bypass, Experiment, Graph, Net, Proxy
from .reader import BAD, BOOL, INT, LIST, STR, Reader, is_kind, type_name
from .rules import check_rule
from .schema import (
    BYPASS_KEYS,
    CONTROL_FRACTION_MAX,
    DEFAULTS_KEYS,
    ENUMS,
    EXPERIMENT_KEYS,
    GRAPH_KEYS,
    GRAPH_NAME_RE,
    MAX_ROUTE_PORTS,
    MAXCONN_MAX,
    NO_GRAPHS,
    PROXY_DEFAULTS,
    PROXY_KEYS,
)
from .sides import read_side
from .values import ascii_problem, in_ranges, port_count


def read_proxy_value(r: Reader, key: str, value: Any, path: str) -> Any:
    """Check one proxy key on its own; cross-key checks are in read_proxy()."""
    if key in ("enabled", "log_connections"):
        return value if is_kind(value, BOOL) else r.error(path, value, f"must be {BOOL}")
    if key in ENUMS:
        choices = ENUMS[key]
        if is_kind(value, STR) and ascii_problem(value):
            return r.error(path, value, ascii_problem(value))
        if not is_kind(value, STR) or value not in choices:
            return r.error(path, value, f"must be one of {', '.join(map(json.dumps, choices))}")
        return value
    if key == "ports":
        return read_proxy_ports(r, value, path)
    if not is_kind(value, INT):
        return r.error(path, value, f"must be {INT}, not {type_name(value)}")
    if key == "listen_port" and not 1 <= value <= 65535:
        return r.error(path, value, "not a TCP port; use 1-65535 (default 50080)")
    if key == "maxconn" and value < 0:
        return r.error(path, value, "must not be negative; use 0 for the host's maxconn")
    if key == "maxconn" and value > MAXCONN_MAX:
        return r.error(path, value, f"too large: use at most {MAXCONN_MAX} (HAProxy counts connections in "
                       "an int), or 0 for the host's maxconn")
    return value


def read_proxy_ports(r: Reader, value: Any, path: str) -> Any:
    """"all" -> None; [80, "8000-8080"] -> ((80, 80), (8000, 8080))."""
    if value == "all":
        return None
    if is_kind(value, STR) and ascii_problem(value):
        return r.error(path, value, ascii_problem(value))
    if not is_kind(value, LIST):
        return r.error(path, value, 'must be "all" or a list like [80, 443, "8000-8080"]')
    if not value:
        return r.error(path, value, 'empty; list at least one port, or use "all"')
    return r.port_list(value, path)


def read_defaults_proxy(r: Reader, doc: dict) -> dict[str, Any]:
    """[defaults.proxy]: checked once here, so a bad default is reported once, not per graph."""
    draw = r.subtable(doc, "", "defaults", DEFAULTS_KEYS)
    if draw is BAD:
        return {}
    praw = r.subtable(draw, "defaults", "proxy", PROXY_KEYS)
    if praw is BAD:
        return {}
    return {k: read_proxy_value(r, k, v, f"defaults.proxy.{k}") for k, v in praw.items() if k in PROXY_KEYS}


def read_proxy(r: Reader, graw: dict, where: str, defaults: dict[str, Any]) -> Proxy | Any:
    path = f"{where}.proxy"
    praw = r.subtable(graw, where, "proxy", PROXY_KEYS)
    if praw is BAD:
        return BAD
    v: dict[str, Any] = {}
    origin: dict[str, str] = {}  # where each value came from, for error paths
    for key in PROXY_KEYS:
        if key in praw:
            v[key] = read_proxy_value(r, key, praw[key], f"{path}.{key}")
        else:
            v[key] = defaults.get(key, PROXY_DEFAULTS[key])
        origin[key] = f"{path}.{key}" if key in praw or key not in defaults else f"defaults.proxy.{key}"

    def fail(key: str, msg: str) -> None:
        # Report at this graph's path even if the value came from [defaults.proxy]: the
        # conflict is between keys of this graph. Name where the value came from.
        src = "" if origin[key].startswith(where) else f" (from {origin[key]})"
        shown = "all" if key == "ports" and v[key] is None else v[key]
        if key == "ports" and v[key] is not None:
            shown = [lo if lo == hi else f"{lo}-{hi}" for lo, hi in v[key]]
        r.error(f"{path}.{key}", shown, msg + src)
        v[key] = BAD

    mode, ports, listen = v["interception"], v["ports"], v["listen_port"]
    if mode == "route" and ports is None:
        fail("ports", 'interception = "route" needs a list of ports (HAProxy binds each one); '
             'set ports = [80, 443] or use interception = "nft"')
    elif mode == "route" and ports is not BAD and port_count(ports) > MAX_ROUTE_PORTS:
        fail("ports", f'interception = "route" binds one listener per port: at most {MAX_ROUTE_PORTS} '
             'ports; use interception = "nft" for large port sets')
    if mode in ONE_LISTENER and ports not in (None, BAD) and listen is not BAD and in_ranges(listen, ports):
        fail("listen_port", f"is also an intercepted port (ports); the proxy's listener needs a port of "
             f"its own: pick one outside ports (default {PROXY_DEFAULTS['listen_port']})")
    proxy_handshake(v, fail)
    values = [v[k] for k in PROXY_KEYS]
    return BAD if any(x is BAD for x in values) else Proxy(*values)


def proxy_handshake(v: dict, fail) -> None:
    """handshake: "honest" (the origin answers a new flow's SYN before the proxy does) needs the
    datapath's own interception; the default is honest there and early elsewhere."""
    mode = v["interception"]
    if v["handshake"] is None:
        v["handshake"] = "honest" if mode == "bpf" else "early"
    elif v["handshake"] == "honest" and mode not in ("bpf", BAD):
        fail("handshake", f'"honest" needs interception = "bpf" (the datapath sends the SYN to the origin '
             f'and hands it to the listener itself; interception is "{mode}"): use handshake = "early" or '
             'interception = "bpf"')


def read_experiment(r: Reader, graw: dict, where: str) -> Experiment | Any:
    path = f"{where}.experiment"
    raw = r.subtable(graw, where, "experiment", EXPERIMENT_KEYS)
    if raw is BAD:
        return BAD
    fraction = raw.get("control_fraction", 0.0)
    if isinstance(fraction, bool) or not isinstance(fraction, int | float):
        fraction = r.error(f"{path}.control_fraction", fraction,
                           f"must be a number, not {type_name(fraction)}; e.g. 0.05 for 5% of subscribers")
    elif not 0 <= fraction <= CONTROL_FRACTION_MAX:
        fraction = r.error(f"{path}.control_fraction", fraction,
                           f"use 0 (no experiment) to {CONTROL_FRACTION_MAX}: the share of subscribers "
                           "left unproxied; to bypass more, write a bypass rule")
    seed = r.get(raw, path, "seed", INT, 0)
    if seed is not BAD and not 0 <= seed < 1 << 32:
        seed = r.error(f"{path}.seed", seed, "use 0-4294967295")
    return BAD if BAD in (fraction, seed) else Experiment(float(fraction), seed)


def read_bypass(r: Reader, graw: dict, where: str) -> Bypass | Any:
    """[graph.bypass]: clients and servers (networks) and ports, each item a rule of the one grammar
    (config/rules.py)."""
    path = f"{where}.bypass"
    raw = r.subtable(graw, where, "bypass", BYPASS_KEYS)
    if raw is BAD:
        return BAD
    nets: dict[str, Any] = {}
    for key in ("clients", "servers"):
        items = r.strings(raw, path, key, [])
        rules = BAD if items is BAD else r.each(items, lambda text, _, kind=key[:-1]: check_rule(kind, text))
        nets[key] = BAD if rules is BAD else tuple(ipaddress.ip_network(rule.value) for rule in rules)
    ports = r.get(raw, path, "ports", LIST, [])
    if ports is not BAD:
        ports = r.port_list(ports, f"{path}.ports")
    parts = [nets["clients"], nets["servers"], ports]
    return BAD if any(p is BAD for p in parts) else Bypass(*parts)


def read_graphs(r: Reader, doc: dict, defaults: dict[str, Any]) -> list[Graph | Any]:
    if "graph" not in doc:
        r.error("graph", None, NO_GRAPHS)
        return []
    raw = doc["graph"]
    if isinstance(raw, dict):
        r.error("graph", raw, "must be an array of tables: write [[graph]], not [graph]")
        return []
    if not isinstance(raw, list) or not all(isinstance(g, dict) for g in raw):
        r.error("graph", raw, "must be an array of [[graph]] tables")
        return []
    if not raw:
        r.error("graph", raw, NO_GRAPHS)
        return []
    out = []
    for i, graw in enumerate(raw):
        where = f"graph[{i}]"
        r.unknown_keys(graw, where, GRAPH_KEYS)
        name = r.get(graw, where, "name", STR, f"g{i}")
        if name is not BAD and not GRAPH_NAME_RE.fullmatch(name):
            name = r.error(f"{where}.name", name, "must be 1-12 characters of a-z, 0-9 and '-', "
                           "starting with a letter or digit, e.g. \"g1\"")
        access = read_side(r, graw, where, "access")
        origin = read_side(r, graw, where, "origin")
        proxy = read_proxy(r, graw, where, defaults)
        bypass = read_bypass(r, graw, where)
        experiment = read_experiment(r, graw, where)
        parts = [name, i, access, origin, proxy, bypass, experiment]
        out.append(BAD if any(p is BAD for p in parts) else Graph(*parts))
    cross_checks(r, raw)
    return out


def cross_checks(r: Reader, raw: list[dict]) -> None:
    """Checks across sides and graphs; they use the raw values that passed their own checks."""
    names: dict[str, str] = {}
    vlans: dict[int, str] = {}
    access_nets: list[tuple[Net, str, str]] = []   # of every graph's access side, see _side_nets
    for i, graw in enumerate(raw):
        where = f"graph[{i}]"
        name = graw.get("name", f"g{i}")
        if isinstance(name, str):
            if name in names:
                implicit = "" if "name" in graw else f" (the default name of {where}: give it a name)"
                r.error(f"{where}.name", name, f"already the name of {names[name]}; graph names must "
                        f"be unique{implicit}")
            else:
                names[name] = where
        sides = {s: graw.get(s) for s in ("access", "origin")}
        for s, sraw in sides.items():
            vlan = sraw.get("vlan") if isinstance(sraw, dict) else None
            if not (is_kind(vlan, INT) and 1 <= vlan <= 4094):
                continue
            field = f"{where}.{s}.vlan"
            if vlan in vlans:
                first = vlans[vlan]
                if first == f"{where}.access.vlan":
                    r.error(field, vlan, "same VLAN as the access side; access and origin must be "
                            "different VLANs")
                else:
                    r.error(field, vlan, f"already used by {first}; every side of every graph needs "
                            "a VLAN of its own")
            else:
                vlans[vlan] = field
        nets = {s: _side_nets(sraw, f"{where}.{s}") for s, sraw in sides.items()}
        for anet, afield, atext in nets["access"]:
            for onet, ofield, otext in nets["origin"]:
                # The origin side is usually the default route (0.0.0.0/0, ::/0): it contains
                # the access prefixes on purpose, and the longer access prefix wins.
                if onet.prefixlen == 0 and anet.prefixlen > 0:
                    continue
                if anet.version == onet.version and anet.overlaps(onet):
                    r.error(ofield, otext, f'overlaps {afield} = "{atext}"; a network is on the '
                            "access side or the origin side, not both")
            for other, ofield, otext in access_nets:
                if anet.version == other.version and anet.overlaps(other):
                    r.error(afield, atext, f'overlaps {ofield} = "{otext}"; subscribers of two '
                            "graphs cannot share a network")
        access_nets += nets["access"]


def _side_nets(sraw: Any, path: str) -> list[tuple[Net, str, str]]:
    """The networks a side owns, as (network, field, text in the file): its prefixes, and the
    subnets of its addresses that no prefix but a default route covers (they get connected
    routes). Unparsable ones are left out: their own check reported them."""
    if not isinstance(sraw, dict):
        return []
    out: list[tuple[Net, str, str]] = []
    for key in ("prefixes", "addresses"):
        items = sraw.get(key)
        for i, text in enumerate(items if isinstance(items, list) else []):
            if not isinstance(text, str):   # ip_network(1) is 0.0.0.1/32: its own check reported it
                continue
            try:
                net = ipaddress.ip_network(text, strict=key == "prefixes")
            except (ValueError, TypeError):
                continue
            if not any(net.version == n.version and n.prefixlen and net.subnet_of(n) for n, _, _ in out):
                out.append((net, f"{path}.{key}[{i}]", text))
    return out
