"""`pepctl subscribers`: pep_radio's state per subscriber, for the question "why is this one slow?".

pep_radio keeps one entry per subscriber address and graph (congestion/radio.h, radio_subs, an LRU
map shared by every instance of the host, pinned where pepctl/congestion.py registered it): the
capacity estimate and window its flows share, its minimum RTT, the queue it held in the last control
window, the outages it saw. `status` and the exporter sum them per graph; this reads them one by one,
through bpf(2) (pepctl/radio_maps.py), for the instance's graphs whose access side runs pep_radio.

    pepctl subscribers                       the 20 fastest subscribers that are not stale
    pepctl subscribers 198.18.0.10 2001:2::/48 --graph pep
    pepctl subscribers --all --top 0 --json  every entry, stale ones too, as JSON

Read-only: it takes no lock and changes nothing. The map is live, so a listing is not one instant's.
"""

from __future__ import annotations

import ipaddress
import os

from . import radio_maps
from .config import Config
from .names import congestion_pins, netns_path

TOP = 20


class Refused(Exception):
    """What the operator asked cannot be answered now: the message says why and what to do."""


class BadSelector(Refused):
    """An address or network that is none: bad input (exit 2)."""


def selectors(words: list[str]) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """Addresses or networks, as the operator wrote them; an IPv4-mapped IPv6 address is its IPv4
    (pep_radio keys such a peer so: congestion/radio.bpf.c, key_of)."""
    out = []
    for w in words:
        try:
            net = ipaddress.ip_network(w, strict=False)
        except ValueError:
            raise BadSelector(f"{w!r}: not an address or a network (198.18.0.10, 198.18.0.0/24, 2001:2::/48)") from None
        if isinstance(net, ipaddress.IPv6Network) and net.prefixlen == 128 and net.network_address.ipv4_mapped:
            net = ipaddress.ip_network(net.network_address.ipv4_mapped)
        out.append(net)
    return out


def graphs_of(cfg: Config, graph: str | None) -> dict[int, str]:
    """The instance's pep_radio graphs (or the one named, which the config has) by their namespace's
    inode number."""
    chosen = [g for g in cfg.graphs if graph is None or g.name == graph]
    radio = [g for g in chosen if g.access.congestion == radio_maps.NAME]
    if not radio:
        which = f"graph {graph}'s access side runs {chosen[0].access.congestion}" if graph else \
            f"no graph of {cfg.path} runs {radio_maps.NAME} toward its subscribers"
        raise Refused(f"{which}: only {radio_maps.NAME} keeps state per subscriber ([graph.access] congestion)")
    out = {}
    for g in radio:
        path = netns_path(cfg.graph_names(g).netns)
        try:
            out[os.stat(path).st_ino] = g.name
        except FileNotFoundError:
            raise Refused(f"graph {g.name}: its namespace {path} does not exist: is instance {cfg.host.instance} "
                          "up? (pepctl status)") from None
    return out


def collect(cfg: Config, words: list[str], graph: str | None = None, top: int = TOP,
            include_stale: bool = False) -> dict:
    """{"subscribers": views (pepctl/radio_maps.py subscriber_view), fastest first, at most `top` (0: all);
    "unmatched": the selectors no entry matched}. With selectors, stale entries are shown too."""
    nets = selectors(words)
    graphs = graphs_of(cfg, graph)
    pins = congestion_pins(radio_maps.NAME)
    if not os.path.exists(os.path.join(pins, radio_maps.SUBS_MAP)):
        raise Refused(f"{radio_maps.NAME} is not registered by pepctl on this host ({pins} has no "
                      f"{radio_maps.SUBS_MAP}): is instance {cfg.host.instance} up? (pepctl status)")
    now = radio_maps.now_us()
    views = [radio_maps.subscriber_view(s, now) for s in radio_maps.read_subscribers(pins, graphs)]
    if nets:
        views = [v for v in views if any(ipaddress.ip_address(v["address"]) in n for n in nets)]
    elif not include_stale:
        views = [v for v in views if v["state"] != "stale"]
    views.sort(key=lambda v: (-v["rate_bytes_per_second"], v["graph"], v["address"]))
    unmatched = [str(n) for n in nets if not any(ipaddress.ip_address(v["address"]) in n for v in views)]
    return {"subscribers": views[:top] if top else views, "count": len(views), "unmatched": unmatched}


def print_table(report: dict, out) -> None:
    subs = report["subscribers"]
    if subs:
        print(f"{'graph':<12} {'subscriber':<26} {'state':<8} {'flows':>5} {'rate Mbit/s':>11} {'window KB':>9} "
              f"{'in flight KB':>12} {'min RTT ms':>10} {'queue ms':>8} {'holds':>6} {'outages':>7} {'heard':>9}",
              file=out)
    for v in subs:
        rtt = "-" if v["min_rtt_seconds"] is None else f"{v['min_rtt_seconds'] * 1000:.1f}"
        print(f"{v['graph']:<12} {v['address']:<26} {v['state']:<8} {v['flows']:>5} "
              f"{v['rate_bytes_per_second'] * 8 / 1e6:>11.2f} {v['window_bytes'] / 1000:>9.1f} "
              f"{v['in_flight_bytes'] / 1000:>12.1f} {rtt:>10} {v['queue_delay_seconds'] * 1000:>8.0f} "
              f"{v['queue_window_seconds'] * 1000:>6.0f} {v['outages']:>7} {v['heard_seconds_ago']:>7.1f} s",
              file=out)
    shown, count = len(subs), report["count"]
    if shown < count:
        print(f"({shown} of {count} shown, fastest first: --top N for more, --top 0 for all)", file=out)
    if not count and not report["unmatched"]:
        print("no subscriber has pep_radio state now (stale entries: --all)", file=out)
