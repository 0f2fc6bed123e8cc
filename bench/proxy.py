"""bench proxy: what the PEP costs against plain routing, and the Netdev talk's table.

Labs side by side (same topology, same steering), measured alternately, REPS times. Every
proxied variant intercepts port 80 only, so the interception modes do the same work:
  routed        proxy off: the pep namespace routes (the baseline of every ratio)
  bpf           interception in the tc program (bpf_sk_assign), splice request+response, TCP mode,
                the honest handshake, the client's own port toward the origin, pep_radio toward the
                subscriber: the default; its metrics exporter is scraped every 5 s (pepctl/exporter.py:
                datapath and proxy figures, fail-open polling, tcp_info sampling)
  bpf-early     bpf as before the transparency work: the proxy answers a new flow's SYN at once
                (handshake = "early") and connects from a spare port (source_port = "any"): what
                the transparent default costs is bpf / bpf-early, paired
  bpf-any-port  bpf connecting from a spare port (source_port = "any"): what keeping the
                client's port costs is bpf / bpf-any-port, paired
  bpf-bbr       bpf with BBR toward the subscriber instead of the default pep_radio (congestion/):
                what the access side's own congestion control costs is bpf / bpf-bbr, paired
  no-metrics    bpf without the metrics exporter (metrics_port = 0): what metrics and sampling
                cost is bpf / no-metrics, paired
  nft           interception by an nftables tproxy table
  route         interception by policy routing (no netfilter, a listener per port)
  splice-auto   bpf, splice-auto
  splice-off    bpf, no splice
  http-mode     bpf, HAProxy in HTTP mode
  nginx-stream  the proxy an operator might pick instead: nginx 1.22 `stream`, transparent both
                ways, nft interception, the same congestion control per side (netns/engines.py)
  minrelay      the least a transparent split-TCP proxy does (minrelay/minrelay.c: accept, connect
                from the client's address, copy both ways, pass half-closes on), set up as
                nginx-stream: what HAProxy costs above it, a leaner proxy could save
  bpf-1-thread, nginx-stream-1-worker   the two with one thread or worker each (the default: one
                per CPU): on this machine the proxy shares its cores with the client and the origin
  endpoints     no network and no proxy: wrk in the origin's namespace against the origin itself
                (loopback), so the two TCP endpoints alone, the same programs as in every lab. A
                split-TCP proxy is a server to the client and a client to the origin: this is the
                scale of its own cost (1 KB transactions and CPU only)
For each: one-transaction-per-connection 1 KB HTTP (wrk, `Connection: close`: transactions/s),
the machine's CPU time per such transaction (busy time of all CPUs from /proc/stat over the run,
divided by its transactions: client and origin included, so the proxy's own cost is a
variant's figure minus routed's), time to first byte of a new connection (curl, sequential: p50
and p99), and 10 MB objects over keep-alive (wrk: Gbit/s). Reported: medians, and each
variant's ratio to routed, the median of its ratios rep by rep (bench/common.py paired_ratio).
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from contextlib import ExitStack

from netns.addresses import ORIGIN_URL4

from .common import exporter_cpu_seconds, git_rev, labs, median, paired_ratio, write_report

PORT80 = ["--ports", "80"]
VARIANTS = {
    "routed": ["--no-proxy"],
    "bpf": [*PORT80],
    "bpf-early": ["--handshake", "early", "--source-port", "any", *PORT80],
    "bpf-any-port": ["--source-port", "any", *PORT80],
    "bpf-bbr": ["--congestion", "bbr", *PORT80],
    "no-metrics": ["--no-metrics", *PORT80],
    "nft": ["--interception", "nft", *PORT80],
    "route": ["--interception", "route", *PORT80],
    "splice-auto": ["--splice", "auto", *PORT80],
    "splice-off": ["--splice", "off", *PORT80],
    "http-mode": ["--mode", "http", *PORT80],
    "nginx-stream": ["--proxy-engine", "nginx", *PORT80],
    "minrelay": ["--proxy-engine", "minrelay", *PORT80],
    "bpf-1-thread": ["--threads", "1", *PORT80],
    "nginx-stream-1-worker": ["--proxy-engine", "nginx", "--threads", "1", *PORT80],
    "endpoints": ["--no-proxy"],
}
ENDPOINTS = "endpoints"   # measured from the origin's own namespace, 1 KB transactions only
WRK_LUA = os.path.join(os.path.dirname(__file__), "wrk_json.lua")
URL = ORIGIN_URL4
METRICS = "http://127.0.0.1:9101/metrics"
SCRAPE_EVERY = 5.0   # s; Prometheus is commonly set to 15 s or 1 min: this is harsher


def wrk(lab, path: str, seconds: float, conns: int, close: bool, node: str = "client") -> dict:
    args = ["wrk", "-t1", f"-c{conns}", f"-d{seconds:g}s", "-s", WRK_LUA]
    if close:
        args += ["-H", "Connection: close"]
    out = lab.run(node, *args, f"{URL}{path}", timeout=seconds + 30).stdout
    return json.loads(out.strip().splitlines()[-1])


def scrape_every(lab, stop: threading.Event) -> None:
    while not stop.wait(SCRAPE_EVERY):
        lab.run("proxyhost", "curl", "-s", "-m", "5", "-o", "/dev/null", METRICS, check=False)


CPU_KINDS = ("user", "system", "softirq")   # where a transaction's CPU time goes (CPU_FIELDS below)
# The first line of /proc/stat: user nice system idle iowait irq softirq steal (USER_HZ ticks). Busy time is
# all but idle and iowait; nice counts as user, hard irq as softirq (packets: both are the network's).
CPU_FIELDS = {"user": (0, 1), "system": (2,), "softirq": (5, 6, 7)}


def cpu_seconds() -> dict[str, float]:
    """Busy time of all CPUs since boot by kind (CPU_KINDS), and "busy", their sum."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:9]]
    hz = os.sysconf("SC_CLK_TCK")
    out = {kind: sum(ticks[i] for i in fields) / hz for kind, fields in CPU_FIELDS.items()}
    return out | {"busy": sum(out.values())}


def cpu_busy_seconds() -> float:
    return cpu_seconds()["busy"]


def transactions_1k(lab, seconds: float, node: str = "client") -> dict:
    before = cpu_seconds()
    r = wrk(lab, "/1k", seconds, 16, close=True, node=node)
    after = cpu_seconds()
    per_tx = {k: (after[k] - before[k]) / max(r["requests"], 1) * 1e6 for k in after}
    return {"tps": r["requests"] / (r["duration_us"] / 1e6), "errors": r["errors"] + r["status_errors"],
            "cpu_us_per_tx": per_tx["busy"], **{f"{k}_us_per_tx": per_tx[k] for k in CPU_KINDS}}


def ttfb(lab, count: int) -> dict:
    """Sequential new connections; curl's time_starttransfer includes the TCP handshake."""
    targets = [arg for i in range(count) for arg in ("-o", "/dev/null", f"{URL}/1k?{i}")]
    out = lab.run("client", "curl", "-s", "-H", "Connection: close", "-w", "%{time_starttransfer}\n", *targets,
                  timeout=120).stdout.split()
    times = sorted(float(x) * 1e6 for x in out)
    return {"p50_us": times[len(times) // 2], "p99_us": times[min(len(times) - 1, int(len(times) * 0.99))]}


def large_gbps(lab, seconds: float) -> dict:
    r = wrk(lab, "/10m", seconds, 4, close=False)
    return {"gbps": r["bytes"] * 8 / (r["duration_us"] / 1e6) / 1e9, "errors": r["errors"]}


SAMPLE_KEYS = ("tps", "errors", "cpu_us_per_tx", *(f"{k}_us_per_tx" for k in CPU_KINDS), "ttfb_p50_us",
               "ttfb_p99_us", "gbps_10m")


def measure(lab, name: str, rep: str, seconds: float, ttfb_count: int) -> dict:
    """One sample of every figure (SAMPLE_KEYS; ENDPOINTS: its 1 KB transactions only) on one lab,
    printed as a line."""
    if name == ENDPOINTS:
        t = transactions_1k(lab, seconds, node="origin")
        print(f"rep {rep} {name:<20} {t['tps']:9,.0f} tx/s  {t['cpu_us_per_tx']:5.0f} us CPU/tx  "
              "(loopback in the origin)", flush=True)
        return t
    t = transactions_1k(lab, seconds)
    f = ttfb(lab, ttfb_count)
    g = large_gbps(lab, seconds)
    print(f"rep {rep} {name:<20} {t['tps']:9,.0f} tx/s  {t['cpu_us_per_tx']:5.0f} us CPU/tx  "
          f"ttfb p50 {f['p50_us']:6.0f} us p99 {f['p99_us']:6.0f} us  10MB {g['gbps']:6.2f} Gbit/s", flush=True)
    return {**t, "errors": t["errors"] + g["errors"], "ttfb_p50_us": f["p50_us"], "ttfb_p99_us": f["p99_us"],
            "gbps_10m": g["gbps"]}


def own_shares(raw: dict[str, dict[str, list]], variant: str, key: str = "cpu_us_per_tx") -> list[float]:
    """The proxy's own CPU per transaction (key: a *_us_per_tx figure), rep by rep: the variant's
    machine-wide figure less routed's of the same rep."""
    return [a - b for a, b in zip(raw[variant][key], raw["routed"][key], strict=True)]


def proxy_share(raw: dict[str, dict[str, list]], variant: str, key: str) -> float:
    """The median of own_shares."""
    return median(own_shares(raw, variant, key))


def medians(raw: dict[str, dict[str, list]]) -> dict[str, dict[str, float]]:
    """Every variant's median of each figure it has, and its errors summed."""
    return {v: {k: median(x) for k, x in s.items() if x and k != "errors"} | {"errors": sum(s["errors"])}
            for v, s in raw.items()}


def ratio_bars(plt, ratios: dict[str, dict[str, float]], panels, baseline: str, colors: list[str], title: str):
    """One bar chart per (key, title) in panels: the ratio to baseline of every variant that has it."""
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 4))
    for ax, (key, panel) in zip(axes, panels, strict=True):
        bars = [(v, r[key], c) for (v, r), c in zip(ratios.items(), colors, strict=True) if key in r]
        ax.bar([b[0] for b in bars], [b[1] for b in bars], color=[b[2] for b in bars])
        ax.axhline(1.0, color="k", lw=0.6)
        ax.set_title(f"{panel} (ratio to {baseline})")
        ax.tick_params(axis="x", rotation=50)
    fig.suptitle(title)
    return fig


def endpoints_floor(med: dict[str, dict], proxy_cpu: dict[str, float], cpus: int) -> dict | None:
    """The proxies' own CPU per transaction against two bare TCP endpoints' (ENDPOINTS); how many
    of the cpus each variant kept busy; and, with nginx stream in the run, the largest share of
    its own a proxy may take for 1.3 times nginx's transactions/s (issue 17): client, origin and
    proxy share the cores, so with all of them busy a transaction may take cpus / (1.3 x nginx's
    transactions/s) of CPU, of which routed's part is the client's, the origin's and the steering's."""
    if ENDPOINTS not in med:
        return None
    e = med[ENDPOINTS]["cpu_us_per_tx"]
    out = {"endpoints_us_per_tx": e, "endpoints_by_kind": {k: med[ENDPOINTS][f"{k}_us_per_tx"] for k in CPU_KINDS},
           "share_over_endpoints": {v: x / e for v, x in proxy_cpu.items()},
           "busy_cpus": {v: m["tps"] * m["cpu_us_per_tx"] / 1e6 for v, m in med.items()}}
    if "nginx-stream" in med:
        budget = cpus * 1e6 / (1.3 * med["nginx-stream"]["tps"])
        out["share_for_1.3x_nginx_us"] = budget - med["routed"]["cpu_us_per_tx"]
    return out


def versus_nginx(raw: dict[str, dict[str, list]]) -> dict[str, float] | None:
    """The project's default (bpf) over nginx stream, rep by rep: every figure issue 17 judges, the
    proxy's own CPU share included."""
    if not {"bpf", "nginx-stream"} <= raw.keys():
        return None
    out = {k: paired_ratio(raw["bpf"][k], raw["nginx-stream"][k])
           for k in ("tps", "ttfb_p50_us", "ttfb_p99_us", "gbps_10m")}
    return out | {"proxy_cpu_us_per_tx": paired_ratio(own_shares(raw, "bpf"), own_shares(raw, "nginx-stream"))}


def add_measure_args(ap: argparse.ArgumentParser, reps: int, ttfb_count: int) -> None:
    ap.add_argument("--reps", type=int, default=reps)
    ap.add_argument("--seconds", type=float, default=4, help="of each wrk run")
    ap.add_argument("--ttfb-count", type=int, default=ttfb_count, help="sequential connections for TTFB")


def measure_alternately(lab: dict, chosen: list[str], args: argparse.Namespace) -> dict[str, dict[str, list]]:
    """args.reps samples of every lab in chosen, in alternating order (forward, then backward)."""
    raw = {v: {k: [] for k in SAMPLE_KEYS} for v in chosen}
    for rep in range(args.reps):
        for v in chosen if rep % 2 == 0 else chosen[::-1]:
            sample = measure(lab[v], v, f"{rep + 1}/{args.reps}", args.seconds, args.ttfb_count)
            for k in SAMPLE_KEYS:
                if k in sample:
                    raw[v][k].append(sample[k])
    return raw


def main() -> int:
    ap = argparse.ArgumentParser(prog="bench proxy", description=__doc__.splitlines()[0])
    add_measure_args(ap, reps=3, ttfb_count=200)
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset (routed always runs)")
    args = ap.parse_args()
    chosen = ["routed"] + [v for v in args.variants.split(",") if v in VARIANTS and v != "routed"]
    with ExitStack() as stack:
        lab = labs(stack, {v: VARIANTS[v] for v in chosen})
        exporter_cpu = None
        if "bpf" in lab:   # Prometheus's part: a scrape every SCRAPE_EVERY s, for as long as the bench runs
            exporter_cpu = (exporter_cpu_seconds(lab["bpf"]), time.monotonic())
            stop = threading.Event()
            scraper = threading.Thread(target=scrape_every, args=(lab["bpf"], stop), daemon=True)
            scraper.start()
            stack.callback(scraper.join)
            stack.callback(stop.set)
        raw = measure_alternately(lab, chosen, args)
        if exporter_cpu:
            used = exporter_cpu_seconds(lab["bpf"]) - exporter_cpu[0]
            exporter_cpu = {"cpu_s": used, "wall_s": time.monotonic() - exporter_cpu[1],
                            "share_of_a_core": used / (time.monotonic() - exporter_cpu[1])}
    med = medians(raw)
    base = med["routed"]
    # Every rep measures every variant: a variant's ratio is the median of its ratios to routed rep by rep.
    keys = ("tps", "cpu_us_per_tx", "ttfb_p50_us", "ttfb_p99_us", "gbps_10m")
    ratios = {v: {k: paired_ratio(raw[v][k], raw["routed"][k]) for k in keys if raw[v][k]} for v in chosen}
    ratios_of_medians = {v: {k: m[k] / base[k] for k in keys if k in m} for v, m in med.items()}
    proxies = [v for v in chosen if v not in ("routed", ENDPOINTS)]
    proxy_cpu = {v: proxy_share(raw, v, "cpu_us_per_tx") for v in proxies}
    # Where the proxy's time goes: its share of user, system and softirq time per transaction.
    proxy_cpu_kinds = {v: {k: proxy_share(raw, v, f"{k}_us_per_tx") for k in CPU_KINDS} for v in proxies}
    floor = endpoints_floor(med, proxy_cpu, os.cpu_count() or 1)
    against_nginx = versus_nginx(raw)
    # bpf against the other interception modes, paired rep by rep (the acceptance of issue 11).
    versus = {f"bpf/{v}": paired_ratio(raw["bpf"]["tps"], raw[v]["tps"])
              for v in ("nft", "route", "no-metrics", "bpf-early", "bpf-any-port") if "bpf" in raw and v in raw}
    if {"bpf", "bpf-early"} <= raw.keys():   # issue 26: the transparent default's cost in TTFB
        versus["bpf/bpf-early ttfb_p50"] = paired_ratio(raw["bpf"]["ttfb_p50_us"], raw["bpf-early"]["ttfb_p50_us"])
    # pep_radio against BBR: the machine's CPU per transaction, and the proxy's own share, paired.
    radio = ({"cpu_us_per_tx": paired_ratio(raw["bpf"]["cpu_us_per_tx"], raw["bpf-bbr"]["cpu_us_per_tx"]),
              "proxy_cpu_us_per_tx": paired_ratio(own_shares(raw, "bpf"), own_shares(raw, "bpf-bbr")),
              "tps": paired_ratio(raw["bpf"]["tps"], raw["bpf-bbr"]["tps"])}
             if {"bpf", "bpf-bbr"} <= raw.keys() else {})
    table = [["variant", "1 KB tx/s", "ratio", "CPU us/tx", "proxy's us/tx", "its user/sys/softirq", "TTFB p50 us",
              "ratio", "TTFB p99 us", "ratio", "10 MB Gbit/s", "ratio", "errors"]]   # ratios paired; medians
    def cell(d: dict, key: str, spec: str) -> str:
        return format(d[key], spec) if key in d else "-"

    for v in chosen:
        m, r = med[v], ratios[v]
        table.append([v, f"{m['tps']:,.0f}", f"{r['tps']:.2f}", f"{m['cpu_us_per_tx']:.0f}",
                      cell(proxy_cpu, v, ".0f"),
                      "/".join(f"{proxy_cpu_kinds[v][k]:.0f}" for k in CPU_KINDS) if v in proxies else "-",
                      cell(m, "ttfb_p50_us", ".0f"), cell(r, "ttfb_p50_us", ".2f"),
                      cell(m, "ttfb_p99_us", ".0f"), cell(r, "ttfb_p99_us", ".2f"), cell(m, "gbps_10m", ".2f"),
                      cell(r, "gbps_10m", ".2f"), str(m["errors"])])

    def plot(plt):
        panels = (("tps", "1 KB transactions/s"), ("cpu_us_per_tx", "CPU time per transaction"),
                  ("ttfb_p50_us", "TTFB p50"), ("gbps_10m", "10 MB objects, Gbit/s"))
        return ratio_bars(plt, ratios, panels, "routed", ["#888"] + ["#37a"] * (len(chosen) - 1),
                          f"PEP variants vs routing without the proxy (medians of {args.reps})")

    write_report("proxy", {"reps": args.reps, "seconds": args.seconds, "commit": git_rev(),
                           "command": "./scripts/bench proxy", "medians": med, "ratios": ratios,
                           "ratios_of_medians": ratios_of_medians, "proxy_cpu_us_per_tx": proxy_cpu,
                           "proxy_cpu_us_per_tx_by_kind": proxy_cpu_kinds,
                           "bpf_versus": versus, "radio_over_bbr": radio, "bpf_over_nginx_stream": against_nginx,
                           "endpoints_floor": floor,
                           "exporter_cpu": exporter_cpu, "scrape_every_s": SCRAPE_EVERY,
                           "samples": raw},
                 table, plot)
    for name, ratio in versus.items():
        print(f"{name} transactions/s (paired): {ratio:.2f}")
    if radio:
        print("pep_radio over bbr toward the subscriber, paired (issue 24 asks CPU/tx within 5%): "
              + ", ".join(f"{k} {x:.3f}" for k, x in radio.items()))
    if against_nginx:
        print("bpf over nginx-stream, paired (issue 17 asks tx/s >= 1.3, TTFB < 1, 10 MB >= 2): "
              + ", ".join(f"{k} {x:.2f}" for k, x in against_nginx.items()))
    if floor:
        e = floor["endpoints_us_per_tx"]
        print(f"two TCP endpoints alone (wrk and the origin's nginx over loopback): {e:.0f} us CPU/tx; each proxy's "
              f"own share over it: " + ", ".join(f"{v} {x:.2f}" for v, x in floor["share_over_endpoints"].items()))
        print("CPUs kept busy: " + ", ".join(f"{v} {x:.2f}" for v, x in floor["busy_cpus"].items()))
        if "share_for_1.3x_nginx_us" in floor:
            need = floor["share_for_1.3x_nginx_us"]
            print(f"1.3x nginx-stream's transactions/s with every CPU busy leaves a proxy at most {need:.0f} us/tx of "
                  f"its own: {need / e:.2f} of the two endpoints")
    if exporter_cpu:
        print(f"the metrics exporter (scraped every {SCRAPE_EVERY:g} s) used {exporter_cpu['cpu_s']:.2f} s of CPU in "
              f"{exporter_cpu['wall_s']:.0f} s: {exporter_cpu['share_of_a_core']:.2%} of a core")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
