"""[graph.access] and [graph.origin]: a side's VLAN, addresses, routes and congestion control."""

from __future__ import annotations

import ipaddress
from typing import Any

from .. import radio_maps
from .model import Addr, Iface, Net, Side, toml_value
from .reader import BAD, INT, REQUIRED, STR, Reader, table_header
from .schema import (
    CONGCTL_RE,
    DEFAULT_CONGESTION,
    DEFAULT_INITCWND,
    MAX_INITCWND,
    OWN_CONGESTION,
    QUEUE_TARGET_MS_MAX,
    SIDE_KEYS,
)
from .values import address_problem, kind_problem, zone_problem


def read_side(r: Reader, graw: dict, where: str, name: str) -> Side | Any:
    path = f"{where}.{name}"
    raw = r.subtable(graw, where, name, SIDE_KEYS, required=True)
    if raw is BAD:
        return BAD
    vlan = r.get(raw, path, "vlan", INT, example="100")
    if vlan is not BAD and not 1 <= vlan <= 4094:
        vlan = r.error(f"{path}.vlan", vlan, "not a usable VLAN id; use 1-4094")
    addresses = read_addresses(r, raw, path)
    prefixes = read_prefixes(r, raw, path, addresses)
    gateways = read_gateways(r, raw, path, addresses)
    if BAD not in (prefixes, gateways, addresses):
        unreachable_prefixes(r, path, addresses, prefixes, gateways)
    congestion = read_congestion(r, raw, path, name)
    initcwnd = r.get(raw, path, "initcwnd", INT, DEFAULT_INITCWND[name])
    if initcwnd is not BAD and not 0 <= initcwnd <= MAX_INITCWND:
        initcwnd = r.error(f"{path}.initcwnd", initcwnd, f"use 0 for the kernel's initial window (10 "
                           f"segments), or 1-{MAX_INITCWND}")
    target = read_queue_target(r, raw, path, name, congestion)
    parts = [vlan, addresses, prefixes, gateways, congestion, initcwnd, target]
    return BAD if any(p is BAD for p in parts) else Side(*parts)


def read_congestion(r: Reader, raw: dict, path: str, side: str) -> str | Any:
    """The side's congestion control: `congestion`, or its old name `congctl` (with a notice)."""
    key = "congestion"
    if "congctl" in raw:
        if "congestion" in raw:
            return r.error(f"{path}.congctl", raw["congctl"], f"given with {path}.congestion = "
                           f"{toml_value(raw['congestion'])}; congctl is the old name of congestion: keep only "
                           "`congestion`")
        key = "congctl"
        line = r.line(f"{path}.congctl")
        r.notices.append(f"{r.path}{f':{line}' if line else ''}: {path}.congctl is deprecated: rename it to "
                         f"`congestion` (same values)")
    field = f"{path}.{key}"
    cc = r.get(raw, path, key, STR, DEFAULT_CONGESTION[side])
    if cc is BAD:
        return BAD
    if not CONGCTL_RE.fullmatch(cc):
        return r.error(field, cc, "not a congestion control name; see "
                       "/proc/sys/net/ipv4/tcp_available_congestion_control")
    if cc == radio_maps.NAME and side != "access":
        return r.error(field, cc, f"{cc} is the access side's congestion control: it keeps its state per "
                       "subscriber (a socket's peer), and toward the origin the peers are servers; use "
                       f"\"{DEFAULT_CONGESTION[side]}\" (the default) or \"bbr\" here")
    if cc not in OWN_CONGESTION and r.available_cc is not None and cc not in r.available_cc:
        return r.error(field, cc, f"this kernel does not offer it; use one of "
                       f"{', '.join(sorted(r.available_cc))}, or {' '.join(OWN_CONGESTION)} "
                       "(pepctl's own, registered by `up`)")
    return cc


def read_queue_target(r: Reader, raw: dict, path: str, side: str, congestion: Any) -> int | Any:
    """[graph.access] queue_target_ms: pep_radio's target; 0 (unused) for any other."""
    field = f"{path}.queue_target_ms"
    default = radio_maps.TARGET_US // 1000
    value = r.get(raw, path, "queue_target_ms", INT, default)
    if value is BAD:
        return BAD
    given = "queue_target_ms" in raw
    if given and side != "access":
        return r.error(field, value, "only the access side runs pep_radio, which holds a queue delay target; "
                       "remove queue_target_ms here (put it under [graph.access])")
    if given and congestion is not BAD and congestion != radio_maps.NAME:
        return r.error(field, value, f"only pep_radio holds a queue delay target, and this side's congestion "
                       f"is {toml_value(congestion)}: set congestion = \"{radio_maps.NAME}\" in "
                       f"[{table_header(path)}], or remove queue_target_ms")
    if not 1 <= value <= QUEUE_TARGET_MS_MAX:
        return r.error(field, value, f"use 1-{QUEUE_TARGET_MS_MAX} milliseconds of queueing delay for "
                       f"pep_radio to hold in the radio's buffer (default {default})")
    return value if congestion == radio_maps.NAME else 0


def read_addresses(r: Reader, raw: dict, path: str) -> tuple[Iface, ...] | Any:
    items = r.strings(raw, path, "addresses", REQUIRED,
                      empty='give this side\'s own address with its prefix length, e.g. ["198.18.0.1/24"]')
    got = BAD if items is BAD else r.each(items, interface_of)
    return BAD if got is BAD else tuple(got)


def interface_of(text: str, before: list) -> Iface | str:
    msg = address_problem(text)
    if not msg and ipaddress.ip_interface(text) in before:
        msg = "listed twice; remove one"
    return msg or ipaddress.ip_interface(text)


def read_prefixes(r: Reader, raw: dict, path: str, addresses: Any) -> tuple[Net, ...] | Any:
    items = r.strings(raw, path, "prefixes", None,
                      empty="leave prefixes out to route just the subnets of addresses, or list the networks on "
                            "this side")
    if items is None:  # default: the subnets of the addresses (directly connected)
        return BAD if addresses is BAD else tuple(dict.fromkeys(a.network for a in addresses))
    got = BAD if items is BAD else r.each(items, lambda text, _: prefix_of(text))
    return BAD if got is BAD else tuple(dict.fromkeys(got))


def prefix_of(text: str) -> Net | str:
    if zone_problem(text):
        return zone_problem(text)
    try:
        net = ipaddress.ip_network(text)
    except ValueError:
        try:
            return f'has host bits set; write the network, "{ipaddress.ip_network(text, strict=False)}"'
        except ValueError:
            return 'not a network; write it like "198.18.0.0/16" or "2001:2::/48"'
    return kind_problem(net, "prefix") or net


def read_gateways(r: Reader, raw: dict, path: str, addresses: Any) -> tuple[Addr, ...] | Any:
    items = r.strings(raw, path, "gateways", [])
    if items is BAD:
        return BAD
    out: list[Addr] = []
    seen: dict[int, str] = {}
    for field, text in items:
        try:
            gw = ipaddress.ip_address(text)
            msg = zone_problem(text) or kind_problem(gw, "gateway")
        except ValueError:
            msg = zone_problem(text) or "not an IP address; write a router's address like \"198.19.0.254\""
        if msg:
            r.error(field, text, msg)
            continue
        if addresses is not BAD:
            if any(gw == a.ip for a in addresses):
                r.error(field, text, "is this side's own address; give the next router's address")
                continue
            nets = [a.network for a in addresses if a.version == gw.version and gw in a.network]
            if not nets:
                r.error(field, text, "not inside any subnet of this side's addresses; a gateway must "
                        "be directly reachable: fix it or add an address in its subnet")
                continue
            net = nets[0]
            if net.num_addresses > 2 and gw == net.network_address:
                r.error(field, text, f"is the network address of {net}; give the next router's address")
                continue
            if net.num_addresses > 2 and gw.version == 4 and gw == net.broadcast_address:
                r.error(field, text, f"is the broadcast address of {net}; give the next router's address")
                continue
        if gw.version in seen:
            r.error(field, text, f"second IPv{gw.version} gateway (first is {seen[gw.version]}); "
                    "give at most one gateway per address family")
            continue
        seen[gw.version] = field
        out.append(gw)
    return tuple(out) if len(out) == len(items) else BAD


def unreachable_prefixes(r: Reader, path: str, addresses, prefixes, gateways) -> None:
    """A prefix outside the connected subnets needs a gateway of its family to route to."""
    families = {gw.version for gw in gateways}
    for i, net in enumerate(prefixes):
        onlink = any(net.subnet_of(a.network) for a in addresses if a.version == net.version)
        if not onlink and net.version not in families:
            r.error(f"{path}.prefixes[{i}]", str(net), f"not inside this side's subnets and there is "
                    f"no IPv{net.version} gateway to route it to; add one to {path}.gateways")
