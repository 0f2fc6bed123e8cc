"""bench proxy: what the PEP costs against plain routing, and the Netdev talk's table.

Labs side by side (same topology, same steering), measured alternately, REPS times:
  routed        proxy off: the pep namespace routes (the baseline of every ratio)
  pep           nft interception, splice request+response, TCP mode (the default)
  route         interception by policy routing, no netfilter
  splice-auto   splice-auto
  splice-off    no splice
  http-mode     HAProxy in HTTP mode
For each: one-transaction-per-connection 1 KB HTTP (wrk, `Connection: close`:
transactions/s), time to first byte of a new connection (curl, sequential:
p50 and p99), and 10 MB objects over keep-alive (wrk: Gbit/s). Reported: medians, and
each variant's ratio to routed, the median of its ratios rep by rep (bench/common.py paired_ratio).
"""

from __future__ import annotations

import argparse
import json
import os
from contextlib import ExitStack

from .common import git_rev, labs, median, paired_ratio, write_report

VARIANTS = {
    "routed": ["--no-proxy"],
    "pep": [],
    "route": ["--interception", "route"],
    "splice-auto": ["--splice", "auto"],
    "splice-off": ["--splice", "off"],
    "http-mode": ["--mode", "http"],
}
WRK_LUA = os.path.join(os.path.dirname(__file__), "wrk_json.lua")
URL = "http://198.19.0.10"


def wrk(lab, path: str, seconds: float, conns: int, close: bool) -> dict:
    args = ["wrk", "-t1", f"-c{conns}", f"-d{seconds:g}s", "-s", WRK_LUA]
    if close:
        args += ["-H", "Connection: close"]
    out = lab.run("client", *args, f"{URL}{path}", timeout=seconds + 30).stdout
    return json.loads(out.strip().splitlines()[-1])


def transactions_1k(lab, seconds: float) -> dict:
    r = wrk(lab, "/1k", seconds, 16, close=True)
    return {"tps": r["requests"] / (r["duration_us"] / 1e6), "errors": r["errors"] + r["status_errors"]}


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


def main() -> int:
    ap = argparse.ArgumentParser(prog="bench proxy", description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=4)
    ap.add_argument("--ttfb-count", type=int, default=200)
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset (routed always runs)")
    args = ap.parse_args()
    chosen = ["routed"] + [v for v in args.variants.split(",") if v in VARIANTS and v != "routed"]
    raw = {v: {"tps": [], "errors": [], "ttfb_p50_us": [], "ttfb_p99_us": [], "gbps_10m": []} for v in chosen}
    with ExitStack() as stack:
        lab = labs(stack, {v: VARIANTS[v] for v in chosen})
        for rep in range(args.reps):
            order = chosen if rep % 2 == 0 else chosen[::-1]
            for v in order:
                t = transactions_1k(lab[v], args.seconds)
                f = ttfb(lab[v], args.ttfb_count)
                g = large_gbps(lab[v], args.seconds)
                s = raw[v]
                s["tps"].append(t["tps"])
                s["errors"].append(t["errors"] + g["errors"])
                s["ttfb_p50_us"].append(f["p50_us"])
                s["ttfb_p99_us"].append(f["p99_us"])
                s["gbps_10m"].append(g["gbps"])
                print(f"rep {rep + 1}/{args.reps} {v:<12} {t['tps']:9,.0f} tx/s  ttfb p50 {f['p50_us']:6.0f} us "
                      f"p99 {f['p99_us']:6.0f} us  10MB {g['gbps']:6.2f} Gbit/s", flush=True)
    med = {v: {k: median(x) for k, x in s.items() if k != "errors"} | {"errors": sum(s["errors"])}
           for v, s in raw.items()}
    base = med["routed"]
    # Every rep measures every variant: a variant's ratio is the median of its ratios to routed rep by rep.
    ratios = {v: {k: paired_ratio(raw[v][k], raw["routed"][k]) for k in ("tps", "ttfb_p50_us", "ttfb_p99_us",
                                                                        "gbps_10m")} for v in chosen}
    ratios_of_medians = {v: {k: m[k] / base[k] for k in ("tps", "ttfb_p50_us", "ttfb_p99_us", "gbps_10m")}
                         for v, m in med.items()}
    table = [["variant", "1 KB tx/s", "ratio", "TTFB p50 us", "ratio", "TTFB p99 us", "ratio", "10 MB Gbit/s",
              "ratio", "errors"]]   # ratios paired rep by rep; medians of the samples
    for v in chosen:
        m, r = med[v], ratios[v]
        table.append([v, f"{m['tps']:,.0f}", f"{r['tps']:.2f}", f"{m['ttfb_p50_us']:.0f}", f"{r['ttfb_p50_us']:.2f}",
                      f"{m['ttfb_p99_us']:.0f}", f"{r['ttfb_p99_us']:.2f}", f"{m['gbps_10m']:.2f}",
                      f"{r['gbps_10m']:.2f}", str(m["errors"])])

    def plot(plt):
        fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
        for ax, (key, title) in zip(axes, (("tps", "1 KB transactions/s"), ("ttfb_p50_us", "TTFB p50"),
                                           ("gbps_10m", "10 MB objects, Gbit/s")), strict=True):
            ax.bar(chosen, [ratios[v][key] for v in chosen], color=["#888"] + ["#37a"] * (len(chosen) - 1))
            ax.axhline(1.0, color="k", lw=0.6)
            ax.set_title(f"{title} (ratio to routed)")
            ax.tick_params(axis="x", rotation=35)
        fig.suptitle(f"PEP variants vs routing without the proxy (medians of {args.reps})")
        return fig

    write_report("proxy", {"reps": args.reps, "seconds": args.seconds, "commit": git_rev(),
                           "command": "./scripts/bench proxy", "medians": med, "ratios": ratios,
                           "ratios_of_medians": ratios_of_medians, "samples": raw},
                 table, plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
