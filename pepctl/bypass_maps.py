"""The control plane's side of tc/pep_bypass.h: map names, struct layouts, counters, and the
bulk operations on one graph's pinned bypass maps.

A graph's pin folder is the one `bpftool prog loadall tc/bypass.o PINS/prog type classifier
pinmaps PINS/maps` filled: every function here takes PINS and opens PINS/maps/<name>.

Keep COUNTERS in the order of `enum bypass_counter` and VERDICTS in that of `enum
flow_verdict`; tests/unit/test_bypass_contract.py checks them against the header.

Rules are written with BPF_MAP_UPDATE_BATCH, one syscall per few ten thousand rules; a kernel
that refuses batches for a map type (older LPM tries) gets one update per rule instead. The
result of add_rules says which ran.
"""

from __future__ import annotations

import errno
import functools
import ipaddress
import os
import socket
import struct
from collections.abc import Iterable

from . import bpfsys

PROGRAM = "flow_ingress"
MAPS = ("side_config", "flow_table", "bypass_client4", "bypass_server4", "bypass_client6",
        "bypass_server6", "bypass_ports", "proxy_state", "bypass_stats")

COUNTERS = (
    "flows_proxied",
    "flows_bypass_rule",
    "flows_bypass_failopen",
    "pkts_bypassed",
    "pkts_ttl_expired",
    "pkts_fib_miss",
    "pkts_not_tcp",
    "pkts_no_flow",
    "flows_stale",
)

SIDE_ACCESS, SIDE_ORIGIN = 1, 2                  # enum bypass_side
VERDICTS = {1: "proxy", 2: "bypass_rule", 3: "bypass_failopen"}   # enum flow_verdict
BYPASS_PORTS_MAX = 65536

# Layouts (native byte order, as the kernel stores them; "x" is explicit padding).
SIDE_CONFIG = struct.Struct("=II")               # side, peer_ifindex
LPM4_KEY = struct.Struct("=I4s")                 # prefixlen, address (network order)
LPM6_KEY = struct.Struct("=I16s")
# sub_addr, org_addr (IPv4 as ::ffff:a.b.c.d), sub_port, org_port (network order), family
FLOW_KEY = struct.Struct("=16s16s2s2sB3x")
FLOW_VALUE = struct.Struct("=IIQ")               # verdict, syn_seq (host order), first_seen_ns
PROXY_STATE = struct.Struct("=II")               # up, pad
U32 = struct.Struct("=I")
U64 = struct.Struct("=Q")

RULE_PRESENT = U32.pack(1)
RULE_ABSENT = U32.pack(0)
_BATCH = 1 << 16  # pairs per BPF_MAP_UPDATE_BATCH call: bounds the buffers, not the speed
# What a kernel says when a map type has no batch operation: ENOTSUPP (524, kernel-internal,
# it still reaches user space), EOPNOTSUPP, or EINVAL from older kernels.
_NO_BATCH = {524, errno.EOPNOTSUPP, errno.EINVAL}

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


# -- encoders -----------------------------------------------------------------------------------
def network(value: str | Network) -> Network:
    """A rule's network; host bits set are an error (198.18.0.5/24 is not a network)."""
    if isinstance(value, ipaddress.IPv4Network | ipaddress.IPv6Network):
        return value
    try:
        return ipaddress.ip_network(value, strict=True)
    except ValueError as e:
        raise ValueError(f"bypass rule {value!r}: {e}; write a network like 198.18.0.0/24 "
                         f"or 2001:2:0:1::/64") from None


@functools.lru_cache(maxsize=1 << 18)   # a rule is parsed when checked and again when encoded
def fast_prefix(text: str) -> tuple[int, bytes, int] | None:
    """(family, packed address, prefix length) of "address/len" text via inet_pton, ten times
    quicker than ipaddress (it counts at 100k rules); None for anything unusual (netmasks, host
    bits set, errors), which ipaddress then judges in its own words."""
    addr, slash, plen = text.partition("/")
    family, bits = (socket.AF_INET6, 128) if ":" in addr else (socket.AF_INET, 32)
    if not slash or not (plen.isascii() and plen.isdigit()) or plen != str(int(plen)) or int(plen) > bits:
        return None
    try:
        packed = socket.inet_pton(family, addr)
    except OSError:
        return None
    if int.from_bytes(packed, "big") & ((1 << (bits - int(plen))) - 1):
        return None
    return family, packed, int(plen)


def _fast_lpm_key(text: str) -> bytes | None:
    got = fast_prefix(text)
    if got is None:
        return None
    family, packed, plen = got
    return (LPM6_KEY if family == socket.AF_INET6 else LPM4_KEY).pack(plen, packed)


def lpm_key(net: str | Network) -> bytes:
    """struct lpm4_key or lpm6_key of a network, by its IP version."""
    if isinstance(net, str):
        key = _fast_lpm_key(net)
        if key is not None:
            return key
    net = network(net)
    fmt = LPM4_KEY if net.version == 4 else LPM6_KEY
    return fmt.pack(net.prefixlen, net.network_address.packed)


def _addr16(addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bytes:
    if addr.version == 4:
        return b"\0" * 10 + b"\xff\xff" + addr.packed    # ::ffff:a.b.c.d
    return addr.packed


def flow_key(sub_addr: str, sub_port: int, org_addr: str, org_port: int) -> bytes:
    """struct flow_key of a flow: subscriber (access side) and origin end, either family."""
    sub, org = ipaddress.ip_address(sub_addr), ipaddress.ip_address(org_addr)
    if sub.version != org.version:
        raise ValueError(f"flow {sub} -> {org}: the two ends are of different IP versions")
    return FLOW_KEY.pack(_addr16(sub), _addr16(org), sub_port.to_bytes(2, "big"),
                         org_port.to_bytes(2, "big"), sub.version)


def _addr_of(raw: bytes, family: int) -> str:
    return str(ipaddress.IPv4Address(raw[12:]) if family == 4 else ipaddress.IPv6Address(raw))


def decode_flow(key: bytes, value: bytes) -> dict:
    """One flow_table entry as a dict (addresses as text, ports as numbers)."""
    sub, org, sport, oport, family = FLOW_KEY.unpack(key)
    verdict, syn_seq, first_seen_ns = FLOW_VALUE.unpack(value)
    return {"family": family,
            "subscriber": _addr_of(sub, family), "sub_port": int.from_bytes(sport, "big"),
            "origin": _addr_of(org, family), "org_port": int.from_bytes(oport, "big"),
            "verdict": VERDICTS.get(verdict, f"unknown({verdict})"),
            "syn_seq": syn_seq, "first_seen_ns": first_seen_ns}


def side_config(side: int, peer_ifindex: int) -> bytes:
    if side not in (SIDE_ACCESS, SIDE_ORIGIN):
        raise ValueError(f"side {side}: use SIDE_ACCESS ({SIDE_ACCESS}) or SIDE_ORIGIN ({SIDE_ORIGIN})")
    return SIDE_CONFIG.pack(side, peer_ifindex)


def proxy_state(up: bool) -> bytes:
    return PROXY_STATE.pack(1 if up else 0, 0)


# -- maps of a pin folder -----------------------------------------------------------------------
def map_path(pin_dir: str, name: str) -> str:
    return os.path.join(os.fspath(pin_dir), "maps", name)


def open_map(pin_dir: str, name: str) -> bpfsys.Map:
    if name not in MAPS:
        raise ValueError(f"{name!r} is no bypass map; the maps are {', '.join(MAPS)}")
    return bpfsys.Map(map_path(pin_dir, name))


def _write(m: bpfsys.Map, keys: list[bytes], value: bytes) -> str:
    """Writes value at every key; returns "batch" or "per-element", whichever ran."""
    if not keys:
        return "none"
    values = [value] * min(len(keys), _BATCH)
    try:
        for i in range(0, len(keys), _BATCH):
            chunk = keys[i:i + _BATCH]
            bpfsys.map_update_batch(m.fd, chunk, values[:len(chunk)], name=m.path)
        return "batch"
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise OSError(e.errno, f"{e.strerror}: {m.path} holds at most {m.max_entries} entries; "
                                   f"remove rules or merge them into wider prefixes") from None
        if e.errno not in _NO_BATCH:
            raise
    # Writing a pair twice changes nothing, so whatever a refused batch wrote is harmless.
    for k in keys:
        bpfsys.map_update(m.fd, k, value, name=m.path)
    return "per-element"


def _split_nets(nets: Iterable[str | Network]) -> tuple[list[bytes], list[bytes]]:
    v4, v6 = [], []
    for n in nets:
        key = lpm_key(n)
        (v4 if len(key) == LPM4_KEY.size else v6).append(key)
    return v4, v6


def _port_keys(ports: Iterable[tuple[int, int]]) -> list[bytes]:
    keys = set()
    for lo, hi in ports:
        if not 0 <= lo <= hi < BYPASS_PORTS_MAX:
            raise ValueError(f"port range {lo}-{hi}: need 0 <= low <= high <= 65535")
        keys.update(range(lo, hi + 1))
    return [U32.pack(p) for p in sorted(keys)]


def _rule_keys(clients, servers, ports) -> dict[str, list[bytes]]:
    c4, c6 = _split_nets(clients)
    s4, s6 = _split_nets(servers)
    return {"bypass_client4": c4, "bypass_client6": c6, "bypass_server4": s4, "bypass_server6": s6,
            "bypass_ports": _port_keys(ports)}


def add_rules(pin_dir: str, clients: Iterable[str | Network] = (), servers: Iterable[str | Network] = (),
              ports: Iterable[tuple[int, int]] = ()) -> dict:
    """Installs bypass rules: client / server networks (IPv4 or IPv6) and inclusive port ranges.

    Idempotent. Only flows whose first SYN comes later see them. Returns the number of
    entries written per map and "method": "batch" or "per-element" (of the LPM maps).
    """
    done: dict = {"method": "none"}
    for name, keys in _rule_keys(clients, servers, ports).items():
        if not keys:
            continue
        with open_map(pin_dir, name) as m:
            how = _write(m, keys, RULE_PRESENT)
        done[name] = len(keys)
        if name != "bypass_ports" or done["method"] == "none":
            done["method"] = how
    return done


def del_rules(pin_dir: str, clients: Iterable[str | Network] = (), servers: Iterable[str | Network] = (),
              ports: Iterable[tuple[int, int]] = ()) -> dict:
    """Removes bypass rules (absent ones are no error); flows already decided keep their verdict.

    A port range clears each of its ports, also those another range still names: remove first,
    then re-add what must stay (pepctl.bypass.sync does). Returns entries removed per map.
    """
    done: dict = {}
    for name, keys in _rule_keys(clients, servers, ports).items():
        if not keys:
            continue
        with open_map(pin_dir, name) as m:
            if name == "bypass_ports":
                _write(m, keys, RULE_ABSENT)   # an array has no absent slots: 0 means no rule
                done[name] = len(keys)
            else:
                done[name] = sum(m.delete(k, missing_ok=True) for k in keys)
    return done


def read_counters(pin_dir: str) -> dict[str, int]:
    """enum bypass_counter, summed over CPUs: {"flows_proxied": n, ...}."""
    out = {}
    with open_map(pin_dir, "bypass_stats") as m:
        for i, name in enumerate(COUNTERS):
            out[name] = sum(U64.unpack(v)[0] for v in m.lookup_percpu(U32.pack(i)))
    return out


def set_proxy_up(pin_dir: str, up: bool) -> None:
    """proxy_state.up: new flows are decided by the rules (up) or all bypassed (down)."""
    with open_map(pin_dir, "proxy_state") as m:
        m.update(U32.pack(0), proxy_state(up))


def proxy_is_up(pin_dir: str) -> bool:
    with open_map(pin_dir, "proxy_state") as m:
        return PROXY_STATE.unpack(m.lookup(U32.pack(0)))[0] != 0


def set_side(pin_dir: str, ifindex: int, side: int, peer_ifindex: int) -> None:
    """Registers the interface flow_ingress runs on: c_in is SIDE_ACCESS, s_in SIDE_ORIGIN."""
    with open_map(pin_dir, "side_config") as m:
        m.update(U32.pack(ifindex), side_config(side, peer_ifindex))


def flows(pin_dir: str, limit: int | None = None) -> list[dict]:
    """The entries of flow_table (see decode_flow), at most limit of them.

    Two syscalls per entry: for status and tests, not for a full table under load. Entries
    may come and go while it runs.
    """
    out = []
    with open_map(pin_dir, "flow_table") as m:
        for key in m.keys():
            if limit is not None and len(out) >= limit:
                break
            value = m.lookup(key)
            if value is not None:   # forgotten by the LRU meanwhile
                out.append(decode_flow(key, value))
    return out
