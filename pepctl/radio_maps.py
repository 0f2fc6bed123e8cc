"""The control plane's side of congestion/radio.h: pep_radio, the access side's congestion control.

Follows congestion/radio.h (name, constants, the layouts of struct radio_params, struct
radio_graph_stats, struct radio_sub_key and struct radio_sub, the histograms' bucket bounds, the
RADIO_TS_* clock verdicts) and the map names
congestion/radio.bpf.c gives its maps. tests/unit/test_radio_contract.py compiles the header and
compares all of it with what is here: a field added, removed, resized or moved in the header fails
that test, and a loaded
object whose maps' value sizes differ from these layouts is refused at run time (ValueError), so
a change never reads as silent garbage.

The maps are pinned once per host (pepctl/congestion.py registers the congestion control; the
folder is pepctl/names.py congestion_pins()); every function here takes that folder. Keys are a
graph namespace's inode number (os.stat("/run/netns/NS").st_ino: the kernel's net->ns.inum). All
map access goes through bpf(2) (pepctl/bpfsys.py).
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
import time

from . import bpfsys

NAME = "pep_radio"                  # RADIO_NAME: what `congctl` and `ss -ti` name
GRAPHS_MAX = 4096                   # RADIO_GRAPHS_MAX: entries of radio_params and radio_stats
SUBSCRIBERS_MAX = 131072            # RADIO_SUBSCRIBERS_MAX
TARGET_US = 30000                   # RADIO_TARGET_US: a graph's queue delay target by default
EPOCH_US = 10_000_000               # RADIO_EPOCH_US: "subscribers active" counts one epoch
STALE_US = 30_000_000               # RADIO_STALE_US: a subscriber's state older than this starts over
OUTAGE_US = 250_000                 # RADIO_OUTAGE_US
RTO_MAX_MS = 1000                   # RADIO_RTO_MAX_MS: the access side's longest retransmission backoff
RTO_MAX_RTTS = 3                    # RADIO_RTO_MAX_RTTS: ... or this many of the handshake's round trips
FAST_RETRIES = 20                   # RADIO_FAST_RETRIES: ... for this many retransmissions of a silence
# Bucket i counts the samples above bound i-1 and at most bound i; a bound of 0 is +Inf and
# closes the list (the exporter makes them cumulative).
QDELAY_BOUNDS_US = (5000, 10000, 20000, 40000, 80000, 160000, 320000, 640000, 0)   # RADIO_QDELAY_BOUNDS_US
RATE_BOUNDS = (125000, 250000, 625000, 1250000, 2500000, 6250000, 12500000, 25000000, 62500000,
               125000000, 0)        # RADIO_RATE_BOUNDS, bytes/s
QDELAY_BUCKETS = len(QDELAY_BOUNDS_US)   # RADIO_QDELAY_BUCKETS
RATE_BUCKETS = len(RATE_BOUNDS)          # RADIO_RATE_BUCKETS

PARAMS_MAP, SUBS_MAP, STATS_MAP = "radio_params", "radio_subs", "radio_stats"   # radio.bpf.c's maps
MAPS = (PARAMS_MAP, SUBS_MAP, STATS_MAP)

KEY = struct.Struct("=I")           # the graph namespace's inode number


class Layout:
    """A C struct as its fields in order: (name as offsetof() writes it, struct code). Native byte
    order and no implicit padding ("="), so a pad in the header is a field here too. Array fields
    ("9Q") unpack to tuples."""

    def __init__(self, c_name: str, fields: tuple[tuple[str, str], ...]):
        self.c_name = c_name
        self.fields = fields
        self.struct = struct.Struct("=" + "".join(code for _, code in fields))
        self.size = self.struct.size

    def pack(self, **values) -> bytes:
        return self.struct.pack(*(values[name] for name, _ in self.fields))

    def check(self, size: int, where: str) -> None:
        """A map's value size against this layout."""
        if size != self.size:
            raise ValueError(f"{where}: struct {self.c_name} is {size} bytes there, pepctl/radio_maps.py expects "
                             f"{self.size}: the loaded congestion/radio.bpf.o and pepctl disagree; rebuild it "
                             "(scripts/setup), then bring every instance that uses it down and up")

    def zero(self) -> dict:
        """Every field 0: what an entry the BPF program has not made yet counts."""
        return self.unpack(bytes(self.size))

    def unpack(self, raw: bytes, where: str = "") -> dict:
        self.check(len(raw), where or f"struct {self.c_name}")
        flat = iter(self.struct.unpack(raw))
        out = {}
        for name, code in self.fields:
            if code[:-1] and not code.endswith("s"):     # an array; "16s" is one bytes value
                out[name] = tuple(next(flat) for _ in range(int(code[:-1])))
            else:
                out[name] = next(flat)
        return out


PARAMS = Layout("radio_params", (("target_us", "I"), ("flags", "I")))
SUB_KEY = Layout("radio_sub_key", (("netns", "I"), ("family", "I"), ("addr", "16s")))
SUB = Layout("radio_sub", (
    *((f, "Q") for f in ("window", "rate", "win_start_us", "win_delivered", "win_lost", "last_ack_us", "last_rx_us",
                         "min_rtt_stamp_us", "resumed_us", "drained_us", "resume_window")),
    ("inflight", "q"), ("inflight_hi", "q"), ("min_rtt_us", "I"), ("min_rtt_prev_us", "I"),
    ("win_path_sum_us", "Q"),
    *((f, "I") for f in ("win_path_n", "win_qd_us", "win_bulk", "win_full", "bulk", "bulk_last", "window_id",
                         "qdelay_us", "target_us", "window_queue_us", "flows", "id", "outages", "epoch")),
    *((f"rtt_rise.{f}", "I") for f in ("drain_ms", "least_us", "before_us")),
    *((f, "B") for f in ("startup", "draining", "win_seen", "blind", "ts_clock")),
    ("pad", "7s"),
))
TS_CLOCKS = {0: "judging", 1: "ms", 2: "other"}   # RADIO_TS_JUDGING, RADIO_TS_MS, RADIO_TS_OTHER
EPOCH_SLOTS = 2                     # active[2], indexed by epoch % 2
STATS = Layout("radio_graph_stats", (
    ("flows_started", "Q"), ("flows_ended", "Q"), ("flows_warm", "Q"), ("subscribers_new", "Q"), ("outages", "Q"),
    ("outage_us", "Q"), ("windows", "Q"), ("qdelay_sum_us", "Q"), ("rate_sum", "Q"),
    ("qdelay_bucket", f"{QDELAY_BUCKETS}Q"), ("rate_bucket", f"{RATE_BUCKETS}Q"),
    *((f"active[{i}].{f}", code) for i in range(EPOCH_SLOTS)
      for f, code in (("epoch", "I"), ("subscribers", "I"), ("rate_sum", "Q"))),
))


# -- a graph's entries ------------------------------------------------------------------------------
def netns_key(netns_path: str) -> bytes:
    """The maps' key of a namespace: its inode number. FileNotFoundError if it is gone."""
    return KEY.pack(os.stat(netns_path).st_ino)


def subscriber_key(netns_path: str, address: str) -> bytes:
    """radio_subs' key of a subscriber (its address, IPv4 or IPv6) in a graph's namespace."""
    ip = ipaddress.ip_address(address)
    return SUB_KEY.pack(netns=os.stat(netns_path).st_ino, family=socket.AF_INET if ip.version == 4 else socket.AF_INET6,
                        addr=ip.packed.ljust(16, b"\0"))


def _map(pins: str, name: str, read_only: bool = False) -> bpfsys.Map:
    return bpfsys.Map(os.path.join(pins, name), read_only=read_only)


def set_params(pins: str, netns_path: str, target_us: int, flags: int = 0) -> None:
    """The graph's parameters: its sockets read them when they start."""
    key = netns_key(netns_path)
    with _map(pins, PARAMS_MAP) as m:
        PARAMS.check(m.value_size, m.path)
        m.update(key, PARAMS.pack(target_us=target_us, flags=flags))


def forget_graph(pins: str, netns_path: str) -> None:
    """Removes the graph's parameters and statistics (the namespace must still exist: its inode
    is the key). Absent entries are fine."""
    key = netns_key(netns_path)
    for name in (PARAMS_MAP, STATS_MAP):
        with _map(pins, name) as m:
            m.delete(key, missing_ok=True)


def read_params(pins: str, netns_path: str) -> dict | None:
    with _map(pins, PARAMS_MAP, read_only=True) as m:
        raw = m.lookup(netns_key(netns_path))
        return PARAMS.unpack(raw, m.path) if raw is not None else None


def open_stats(pins: str) -> bpfsys.Map:
    """radio_stats, read-only, its value size checked against the mirror's layout."""
    m = _map(pins, STATS_MAP, read_only=True)
    try:
        STATS.check(m.value_size, m.path)
    except ValueError:
        m.close()
        raise
    return m


def stats_of(m: bpfsys.Map, netns_path: str) -> dict | None:
    """A graph's statistics in an open radio_stats, as counted since its first pep_radio socket;
    None before that."""
    raw = m.lookup(netns_key(netns_path))
    return STATS.unpack(raw, m.path) if raw is not None else None


def read_stats(pins: str, netns_path: str) -> dict | None:
    with open_stats(pins) as m:
        return stats_of(m, netns_path)


# -- a graph's subscribers --------------------------------------------------------------------------
def _address(key: dict) -> str:
    if key["family"] == socket.AF_INET:
        return str(ipaddress.IPv4Address(key["addr"][:4]))
    return str(ipaddress.IPv6Address(key["addr"]))


def read_subscribers(pins: str, graphs: dict[int, str]) -> list[dict]:
    """The entries of radio_subs in the given graph namespaces (inode number -> graph name), each as
    struct radio_sub with its "graph" and "address". The map is live: an entry that goes while it is
    read is left out, and one read is not a snapshot of all at one instant."""
    out = []
    with _map(pins, SUBS_MAP, read_only=True) as m:
        SUB.check(m.value_size, m.path)
        if m.key_size != SUB_KEY.size:
            raise ValueError(f"{m.path}: its key is {m.key_size} bytes, struct radio_sub_key {SUB_KEY.size}: "
                             "the loaded congestion/radio.bpf.o and pepctl disagree")
        for raw_key in m.keys():
            key = SUB_KEY.unpack(raw_key, m.path)
            if key["netns"] not in graphs:
                continue
            raw = m.lookup(raw_key)
            if raw is not None:
                out.append({"graph": graphs[key["netns"]], "address": _address(key), **SUB.unpack(raw, m.path)})
    return out


def known_min_rtt_us(sub: dict) -> int:
    """The subscriber's minimum RTT as the law knows it (radio_known_min_rtt): the lesser of its two
    buckets', 0 before any."""
    a, b = sub["min_rtt_us"], sub["min_rtt_prev_us"]
    return a if a and (not b or a < b) else b


def subscriber_view(sub: dict, now: int) -> dict:
    """What an operator reads of an entry of read_subscribers at `now` (now_us()): its estimate, and
    what it is doing. state: startup (no queue seen yet: the window grows by what each ACK
    delivers), draining (this control window empties the radio's queue), steady, or stale (silent
    for RADIO_STALE_US: its next flow starts over)."""
    heard_us = max(now - sub["last_ack_us"], 0)
    state = ("stale" if heard_us >= STALE_US else "draining" if sub["draining"] else
             "startup" if sub["startup"] else "steady")
    min_rtt = known_min_rtt_us(sub)
    return {"graph": sub["graph"], "address": sub["address"], "state": state, "flows": sub["flows"],
            "rate_bytes_per_second": sub["rate"], "window_bytes": sub["window"],
            "in_flight_bytes": max(sub["inflight"], 0), "min_rtt_seconds": min_rtt / 1e6 if min_rtt else None,
            "queue_delay_seconds": sub["qdelay_us"] / 1e6, "queue_target_seconds": sub["target_us"] / 1e6,
            # What its window holds (the target, or more on a long path: radio_window_queue), once it has one.
            "queue_window_seconds": (sub["window_queue_us"] or sub["target_us"]) / 1e6,
            "outages": sub["outages"], "heard_seconds_ago": heard_us / 1e6,
            "timestamp_clock": TS_CLOCKS.get(sub["ts_clock"], f"unknown({sub['ts_clock']})")}


# -- reading the statistics ----------------------------------------------------------------------------
def now_us() -> int:
    """CLOCK_MONOTONIC in microseconds: the clock of the kernel's tcp_mstamp, which the BPF
    program stamps epochs with."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


def active(stats: dict, now: int | None = None) -> tuple[int, float]:
    """(subscribers heard from, their mean rate in bytes/s) in the last complete epoch. A slot
    that holds another epoch (none were heard in the last one) counts 0."""
    last = ((now_us() if now is None else now) // EPOCH_US - 1) & 0xFFFFFFFF   # the BPF side keeps a __u32
    slot = last % EPOCH_SLOTS
    if stats[f"active[{slot}].epoch"] != last:
        return 0, 0.0
    n = stats[f"active[{slot}].subscribers"]
    return n, (stats[f"active[{slot}].rate_sum"] / n if n else 0.0)


def buckets(bounds: tuple[int, ...], counts: tuple[int, ...], scale: float = 1.0) -> list[tuple[float, int]]:
    """Cumulative (upper bound, count) pairs in base units (bounds / scale); +Inf last."""
    out, cum = [], 0
    for bound, n in zip(bounds, counts, strict=True):
        cum += n
        out.append((bound / scale if bound else float("inf"), cum))
    return out


def quantile(q: float, cumulative: list[tuple[float, int]]) -> float | None:
    """The q-quantile of a cumulative histogram, interpolated within its bucket as Prometheus's
    histogram_quantile() does (the +Inf bucket answers with the last finite bound); None if empty."""
    total = cumulative[-1][1] if cumulative else 0
    if not total:
        return None
    rank = q * total
    lower, below = 0.0, 0
    for bound, cum in cumulative:
        if cum >= rank:
            if bound == float("inf"):
                return lower
            return lower + (bound - lower) * ((rank - below) / (cum - below) if cum > below else 0.0)
        lower, below = bound, cum
    return lower
