"""The control plane's side of tc/pep_flow.h: map names, struct layouts, flags, counters, and
the operations on an instance's flow maps.

One program and one set of maps serve every graph of an instance: `bpftool prog loadall
tc/flow.o PINS/prog type classifier pinmaps PINS/maps` fills the pin folder PINS, and every
function here takes PINS and the graph's slot. Every read and write goes through bpf(2)
(pepctl/bpfsys.py), never bpftool's text.

Keep COUNTERS in the order of `enum flow_counter`, VERDICTS in that of `enum flow_verdict`;
tests/unit/test_flow_contract.py checks them, the flags and the struct layouts against the
header.

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
EGRESS_PROGRAM = "flow_egress"
CONNS_PROGRAM = "flow_conns"                     # sock_ops, on the root of the cgroup v2 hierarchy
MAPS = ("graphs", "graph_addrs", "bypass_ports", "intercept_ports", "bypass_client4", "bypass_server4",
        "bypass_client6", "bypass_server6", "flows_new", "flows", "syns", "marks", "measured", "flow_records",
        "flow_stats", "netns_slots", "conns")

COUNTERS = (
    "flows_proxied",
    "flows_bypass_rule",
    "flows_bypass_failopen",
    "flows_not_intercepted",
    "syn_to_self",
    "assign_failed",
    "pkts_bypassed",
    "pkts_ttl_expired",
    "pkts_fib_miss",
    "pkts_not_tcp",
    "pkts_no_flow",
    "pkts_assigned",
    "pkts_syncookie",
    "flows_stale",
    "flows_promoted",
    "flows_table_full",
    "flows_expired",
    "flows_closed",
    "flows_bypass_control",
    "flows_measured",
    "records_dropped",
    "flows_bypass_mptcp",
    "tw_reset",
    "tw_old_syn",
    "flows_bypass_busy",
    "resets_to_sub",
    "syns_probed",
    "origin_accepted",
    "origin_refused",
    "probe_failed",
    "flows_bypass_overload",
    "port_freed",
    "fin_deferred",
    "port_held",
    "pkts_old_connection",
    "flows_no_timer",
    "pkts_unowned",
)

GRAPHS_MAX = 2048                                # PEP_GRAPHS_MAX
IFINDEX_BASE = 0x100000                          # PEP_IFINDEX_BASE
LOCAL_MARK = 1                                   # PEP_LOCAL_MARK
RETRY_MARK = 2                                   # PEP_RETRY_MARK
PORT_RETRY_MARK = 3                              # PEP_PORT_RETRY_MARK
SIDE_ACCESS, SIDE_ORIGIN = 1, 2                  # enum flow_side
VERDICTS = {1: "proxy", 2: "bypass_rule", 3: "bypass_failopen", 4: "bypass_control",   # enum flow_verdict
            5: "bypass_mptcp", 6: "bypass_busy", 7: "bypass_overload"}
STATES = {1: "syn_seen", 2: "synack_seen", 3: "proven"}   # enum flow_state
GRAPH_F_ENABLED, GRAPH_F_ASSIGN, GRAPH_F_ALL_PORTS, GRAPH_F_ORIGIN_SYNS = 0x1, 0x2, 0x4, 0x8
GRAPH_F_MEASURE, GRAPH_F_PROXY_MPTCP, GRAPH_F_KEEP_PORT, GRAPH_F_HONEST = 0x10, 0x20, 0x40, 0x80
SYN_STATES = {1: "probing", 2: "accepted"}        # enum syn_state
PORTS = 65536

# Layouts (native byte order, as the kernel stores them; "x" is explicit padding).
# flags, listen_port, pad, control_below, control_seed, maxconn, host_maxconn
GRAPH_CONFIG = struct.Struct("=IHHIIII")
PORT_KEY = struct.Struct("=II")                  # graph, port
ADDR_KEY = struct.Struct("=I16s")                # graph, address (IPv4 as ::ffff:a.b.c.d)
LPM4_KEY = struct.Struct("=I4s4s")               # prefixlen (32 + plen), graph (BE), address
LPM6_KEY = struct.Struct("=I4s16s")
# sub_addr, org_addr, sub_port, org_port (network order), graph, family
FLOW_KEY = struct.Struct("=16s16s2s2sHBx")
FLOW_NEW = struct.Struct("=IIIBBxxQ")            # verdict, syn_seq, synack_seq, opener, state, first_seen_ns
FLOW_EST = struct.Struct("=IIQQBB6x16s")         # verdict, syn_seq, first_seen, last_seen, fins, closing, timer
FLOW_MARKS = struct.Struct("=BBBBHH")            # sub_dscp, org_dscp, flags, seen, sub_mss, org_mss
CONN_TAG = struct.Struct("=I")                   # slot1 (flow_conns' tag of a counted socket)
# syn_seq, state, opener, tcp_flags, opt_len, window (BE), ttl, tos, ip_word (BE), macs, opts, first_seen_ns
FLOW_SYN = struct.Struct("=IBBBB2sBB4s12s40s4xQ")
MARK_F_SUB_ECN, MARK_F_ORG_RESET, MARK_F_SUB_SACK, MARK_F_SUB_TS = 0x1, 0x2, 0x4, 0x8
MARK_F_ORG_SACK, MARK_F_ORG_TS, MARK_F_SUB_OPTS, MARK_F_ORG_OPTS = 0x10, 0x20, 0x40, 0x80
MARK_S_SUB_DATA, MARK_S_FIN_HELD, MARK_S_KEPT = 0x1, 0x2, 0x4
U32 = struct.Struct("=I")
U64 = struct.Struct("=Q")

PRESENT = U32.pack(1)
ABSENT = U32.pack(0)
_BATCH = 1 << 16  # pairs per BPF_MAP_UPDATE_BATCH call: bounds the buffers, not the speed
# What a kernel says when a map type has no batch operation: ENOTSUPP (524, kernel-internal,
# it still reaches user space), EOPNOTSUPP, or EINVAL from older kernels.
_NO_BATCH = {524, errno.EOPNOTSUPP, errno.EINVAL}

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def ifindexes(slot: int) -> tuple[int, int]:
    """The ifindexes c_in and s_in of graph slot get inside its namespace."""
    if not 0 <= slot < GRAPHS_MAX:
        raise ValueError(f"graph slot {slot}: use 0-{GRAPHS_MAX - 1}")
    return IFINDEX_BASE + 2 * slot, IFINDEX_BASE + 2 * slot + 1


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
    bits set, non-ASCII, errors), which ipaddress then judges in its own words."""
    if not text.isascii():
        return None
    addr, slash, plen = text.partition("/")
    family, bits = (socket.AF_INET6, 128) if ":" in addr else (socket.AF_INET, 32)
    if not slash or not plen.isdigit() or plen != str(int(plen)) or int(plen) > bits:
        return None
    try:
        packed = socket.inet_pton(family, addr)
    except OSError:
        return None
    if int.from_bytes(packed, "big") & ((1 << (bits - int(plen))) - 1):
        return None
    return family, packed, int(plen)


def _graph_be(graph: int) -> bytes:
    return graph.to_bytes(4, "big")


def lpm_key(net: str | Network, graph: int) -> bytes:
    """struct lpm4_key or lpm6_key of a network of graph, by its IP version."""
    got = fast_prefix(net) if isinstance(net, str) else None
    if got is None:
        n = network(net)
        got = (socket.AF_INET if n.version == 4 else socket.AF_INET6, n.network_address.packed, n.prefixlen)
    family, packed, plen = got
    fmt = LPM6_KEY if family == socket.AF_INET6 else LPM4_KEY
    return fmt.pack(32 + plen, _graph_be(graph), packed)


def addr16(addr: str | ipaddress.IPv4Address | ipaddress.IPv6Address) -> bytes:
    """An address as the datapath keeps it: IPv6 as is, IPv4 as ::ffff:a.b.c.d."""
    a = ipaddress.ip_address(addr)
    return b"\0" * 10 + b"\xff\xff" + a.packed if a.version == 4 else a.packed


def flow_key(sub_addr: str, sub_port: int, org_addr: str, org_port: int, graph: int = 0) -> bytes:
    """struct flow_key of a flow of graph: subscriber (access side) and origin end, either family."""
    sub, org = ipaddress.ip_address(sub_addr), ipaddress.ip_address(org_addr)
    if sub.version != org.version:
        raise ValueError(f"flow {sub} -> {org}: the two ends are of different IP versions")
    return FLOW_KEY.pack(addr16(sub), addr16(org), sub_port.to_bytes(2, "big"), org_port.to_bytes(2, "big"),
                         graph, sub.version)


def _addr_of(raw: bytes, family: int) -> str:
    return str(ipaddress.IPv4Address(raw[12:]) if family == 4 else ipaddress.IPv6Address(raw))


def decode_key(key: bytes) -> dict:
    """A struct flow_key as a dict: graph slot, subscriber and origin ends."""
    sub, org, sport, oport, graph, family = FLOW_KEY.unpack(key)
    return {"graph": graph, "family": family, "subscriber": _addr_of(sub, family),
            "sub_port": int.from_bytes(sport, "big"), "origin": _addr_of(org, family),
            "org_port": int.from_bytes(oport, "big")}


def decode_flow(key: bytes, value: bytes) -> dict:
    """One entry of flows_new or flows (told apart by the value's size) as a dict."""
    sub, org, sport, oport, graph, family = FLOW_KEY.unpack(key)
    out = {"graph": graph, "family": family,
           "subscriber": _addr_of(sub, family), "sub_port": int.from_bytes(sport, "big"),
           "origin": _addr_of(org, family), "org_port": int.from_bytes(oport, "big")}
    if len(value) == FLOW_NEW.size:
        verdict, syn_seq, synack_seq, opener, state, first = FLOW_NEW.unpack(value)
        out.update(table="flows_new", state=STATES.get(state, f"unknown({state})"), opener=opener,
                   synack_seq=synack_seq)
    else:
        verdict, syn_seq, first, last, fins, closing, _timer = FLOW_EST.unpack(value)
        out.update(table="flows", state="closing" if closing else "established", fins=fins, last_seen_ns=last)
    out.update(verdict=VERDICTS.get(verdict, f"unknown({verdict})"), syn_seq=syn_seq, first_seen_ns=first)
    return out


def graph_config(flags: int, listen_port: int, control_below: int = 0, control_seed: int = 0,
                 maxconn: int = 0, host_maxconn: int = 0) -> bytes:
    if not 0 <= listen_port < PORTS:
        raise ValueError(f"listen_port {listen_port}: use 0-65535")
    return GRAPH_CONFIG.pack(flags, listen_port, 0, control_below, control_seed, maxconn, host_maxconn)


# -- maps of a pin folder -----------------------------------------------------------------------
def map_path(pins: str, name: str) -> str:
    return os.path.join(os.fspath(pins), "maps", name)


def open_map(pins: str, name: str) -> bpfsys.Map:
    if name not in MAPS:
        raise ValueError(f"{name!r} is no flow map; the maps are {', '.join(MAPS)}")
    return bpfsys.Map(map_path(pins, name))


def write_keys(m: bpfsys.Map, keys: list[bytes], value: bytes) -> str:
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
        if e.errno in (errno.ENOSPC, errno.E2BIG):
            raise OSError(e.errno, f"{e.strerror}: {m.path} holds at most {m.max_entries} entries; "
                                   f"remove rules or merge them into wider prefixes") from None
        if e.errno not in _NO_BATCH:
            raise
    # Writing a pair twice changes nothing, so whatever a refused batch wrote is harmless.
    for k in keys:
        bpfsys.map_update(m.fd, k, value, name=m.path)
    return "per-element"


def split_nets(nets: Iterable[str | Network], graph: int) -> tuple[list[bytes], list[bytes]]:
    """LPM keys of networks of graph: (IPv4 keys, IPv6 keys)."""
    v4, v6 = [], []
    for n in nets:
        key = lpm_key(n, graph)
        (v4 if len(key) == LPM4_KEY.size else v6).append(key)
    return v4, v6


def port_keys(ports: Iterable[tuple[int, int]], graph: int) -> list[bytes]:
    keys = set()
    for lo, hi in ports:
        if not 0 <= lo <= hi < PORTS:
            raise ValueError(f"port range {lo}-{hi}: need 0 <= low <= high <= 65535")
        keys.update(range(lo, hi + 1))
    return [PORT_KEY.pack(graph, p) for p in sorted(keys)]


def rule_keys(graph: int, clients=(), servers=(), ports=()) -> dict[str, list[bytes]]:
    """The map entries of bypass rules of graph, by map name."""
    c4, c6 = split_nets(clients, graph)
    s4, s6 = split_nets(servers, graph)
    return {"bypass_client4": c4, "bypass_client6": c6, "bypass_server4": s4, "bypass_server6": s6,
            "bypass_ports": port_keys(ports, graph)}


def add_rules(pins: str, graph: int, clients: Iterable[str | Network] = (),
              servers: Iterable[str | Network] = (), ports: Iterable[tuple[int, int]] = ()) -> dict:
    """Installs bypass rules of graph: client / server networks (IPv4 or IPv6), port ranges.

    Idempotent. Only flows whose first SYN comes later see them. Returns the number of
    entries written per map and "method": "batch" or "per-element" (of the LPM maps).
    """
    done: dict = {"method": "none"}
    for name, keys in rule_keys(graph, clients, servers, ports).items():
        if not keys:
            continue
        with open_map(pins, name) as m:
            how = write_keys(m, keys, PRESENT)
        done[name] = len(keys)
        if name != "bypass_ports" or done["method"] == "none":
            done["method"] = how
    return done


def del_keys(pins: str, name: str, keys: list[bytes]) -> int:
    """Removes keys from a hash or LPM map (absent ones are no error); returns how many were there."""
    with open_map(pins, name) as m:
        return sum(m.delete(k, missing_ok=True) for k in keys)


def del_rules(pins: str, graph: int, clients: Iterable[str | Network] = (),
              servers: Iterable[str | Network] = (), ports: Iterable[tuple[int, int]] = ()) -> dict:
    """Removes bypass rules of graph (absent ones are no error); flows already decided keep their
    verdict. A port range clears each of its ports, also those another range still names: remove
    first, then re-add what must stay (pepctl.bypass.sync does). Returns entries removed per map."""
    return {name: del_keys(pins, name, keys)
            for name, keys in rule_keys(graph, clients, servers, ports).items() if keys}


def set_graph(pins: str, graph: int, flags: int, listen_port: int, addresses: Iterable[str] = (),
              intercept: Iterable[tuple[int, int]] = (), control: tuple[int, int] = (0, 0),
              limits: tuple[int, int] = (0, 0), netns_cookie: int | None = None) -> None:
    """Registers graph slot: its flags and listener, its own addresses, the ports it intercepts,
    its control group (control_below, control_seed), its connection limits (maxconn, host_maxconn),
    and its namespace's cookie, by which flow_conns counts the graph's connections."""
    if netns_cookie is not None:
        with open_map(pins, "netns_slots") as m:
            m.update(U64.pack(netns_cookie), U32.pack(graph))
    with open_map(pins, "graph_addrs") as m:
        write_keys(m, [ADDR_KEY.pack(graph, addr16(a)) for a in addresses], PRESENT)
    with open_map(pins, "intercept_ports") as m:
        write_keys(m, port_keys(intercept, graph), PRESENT)
    with open_map(pins, "graphs") as m:
        m.update(U32.pack(graph), graph_config(flags, listen_port, *control, *limits))


def set_intercept_ports(pins: str, graph: int, old: Iterable[tuple[int, int]],
                        new: Iterable[tuple[int, int]]) -> None:
    """Replaces the ports graph intercepts (a reload of its port list): new ones first."""
    new_keys = port_keys(new, graph)
    with open_map(pins, "intercept_ports") as m:
        write_keys(m, new_keys, PRESENT)
    del_keys(pins, "intercept_ports", sorted(set(port_keys(old, graph)) - set(new_keys)))


def set_flags(pins: str, graph: int, flags: int, listen_port: int, control: tuple[int, int] = (0, 0),
              limits: tuple[int, int] = (0, 0)) -> None:
    with open_map(pins, "graphs") as m:
        m.update(U32.pack(graph), graph_config(flags, listen_port, *control, *limits))


def read_limits(pins: str, graph: int) -> tuple[int, int]:
    """(maxconn, host_maxconn) of graph slot: where its new flows go end to end (0: no limit)."""
    with open_map(pins, "graphs") as m:
        return GRAPH_CONFIG.unpack(m.lookup(U32.pack(graph)))[5:7]


def read_conns(pins: str, graph: int | None = None) -> int:
    """The connections flow_conns counts for graph slot (None: all the instance's graphs)."""
    with open_map(pins, "conns") as m:
        raw = m.lookup(U32.pack(GRAPHS_MAX if graph is None else graph))
    return U64.unpack(raw)[0] if raw is not None else 0


def stats_index(index: int, old_entries: int, new_entries: int) -> int | None:
    """Where a counter of flow_stats goes when its size changes (pepctl upgrade): a graph's counters
    are CNT_MAX apart, and a counter keeps its number from one version to the next (new ones are added
    at the end of enum flow_counter). None: a counter this version no longer has."""
    old_n, new_n = old_entries // GRAPHS_MAX, new_entries // GRAPHS_MAX
    slot, counter = divmod(index, old_n)
    return slot * new_n + counter if counter < new_n and slot < GRAPHS_MAX else None


def read_counters(pins: str, graph: int) -> dict[str, int]:
    """enum flow_counter of graph, summed over CPUs: {"flows_proxied": n, ...}."""
    out = {}
    with open_map(pins, "flow_stats") as m:
        base = graph * len(COUNTERS)
        for i, name in enumerate(COUNTERS):
            out[name] = sum(U64.unpack(v)[0] for v in m.lookup_percpu(U32.pack(base + i)))
    return out


def flows(pins: str, limit: int | None = None, graph: int | None = None) -> list[dict]:
    """The entries of flows_new and flows (see decode_flow), at most limit of them, of one graph
    if given. Two syscalls per entry: for status and tests, not for a full table under load.
    Entries may come and go while it runs."""
    out: list[dict] = []
    for name in ("flows_new", "flows"):
        with open_map(pins, name) as m:
            for key in m.keys():
                if limit is not None and len(out) >= limit:
                    return out
                if graph is not None and FLOW_KEY.unpack(key)[4] != graph:
                    continue
                value = m.lookup(key)
                if value is not None:   # gone meanwhile
                    out.append(decode_flow(key, value))
    return out
