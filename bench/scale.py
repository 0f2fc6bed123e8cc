"""bench scale: what a graph costs, and what a proxied connection costs, on the lab's proxy host.

1. Graphs. The lab's proxy host is brought up by pepctl with N graphs (N in --graphs, default
   1, 64, 256, 1024): the lab's own graph, whose hosts carry traffic, and N-1 more with VLANs
   and subnets of their own (`pep-lab up --graphs N`). For each N, on the same lab:
     up, down     wall time of `pepctl up` and `pepctl down`
     memory       MemAvailable with the instance down minus with it up, settled: kernel
                  included (namespaces, links, routes, maps, sockets) and HAProxy; per graph,
                  and the marginal cost of a graph from the largest two N
     idle CPU     CPU time of the instance's processes (HAProxy, supervisor, keeper, exporter) over
                  --idle seconds without traffic, per graph, in % of one core
2. Packets/s through graph 1 with 1 graph and with the largest N: two labs side by side, small
   UDP packets from the client to the origin (iperf3, 64-byte frames), alternating, paired.
3. Idle connections: --connections TCP connections from the client to the origin held open,
   idle, through the proxy and through the same lab routing (no proxy): MemAvailable before
   minus after, per connection. (10,000 do not fit here: HAProxy's open-file limit is this
   machine's hard limit of 20,000 descriptors, and maxconn is sized from it at 7,918.)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from contextlib import ExitStack

from netns.addresses import ORIGIN4
from netns.handle import PYTHON, LabHandle
from netns.lab import extra_graph

from .common import exporter_cpu_seconds, git_rev, labs, median, paired_ratio, process_cpu_seconds, write_report
from .steering import udp_small_pps


def mem_available_kib() -> int:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))


def settled_mem(seconds: float = 3.0) -> int:
    """MemAvailable once freed memory has come back (RCU, deferred frees): the last of a few reads."""
    time.sleep(seconds)
    return mem_available_kib()


def with_graphs(lab: LabHandle, n: int) -> None:
    """Rewrites the lab's pepctl config with n graphs (the lab's own first)."""
    conf = os.path.join(lab.run_dir, "pep.toml")
    with open(conf) as f:
        text = f.read()
    base = text[:text.index("[[graph]]", text.index("[[graph]]") + 1)] if text.count("[[graph]]") > 1 else text
    proxy = base[base.index("[graph.proxy]"):]
    with open(conf, "w") as f:
        f.write(base + "".join(extra_graph(i, proxy) for i in range(2, n + 1)))


def timed_pepctl(lab: LabHandle, verb: str) -> float:
    started = time.monotonic()
    proc = lab.pepctl(verb, check=False, timeout=600)
    took = time.monotonic() - started
    if proc.returncode != 0:
        raise SystemExit(f"bench scale: pepctl {verb}: {proc.stderr.strip()[-2000:]}")
    return took


def instance_cpu_seconds(lab: LabHandle) -> float:
    """utime + stime of the instance's keeper, supervisor, HAProxy and metrics exporter, from their
    recorded PIDs."""
    st = json.loads(lab.pepctl("status", "--json").stdout)["proxy"]
    pids = (st["keeper"]["pid"], st["supervisor"]["pid"], st["haproxy"]["pid"])
    return sum(process_cpu_seconds(pid) for pid in pids) + exporter_cpu_seconds(lab)


def graph_sweep(lab: LabHandle, counts: list[int], idle: float) -> dict:
    out = {}
    for n in counts:
        timed_pepctl(lab, "down")
        with_graphs(lab, n)
        mem_down = settled_mem()
        up = timed_pepctl(lab, "up")
        mem_up = settled_mem()
        cpu0, t0 = instance_cpu_seconds(lab), time.monotonic()
        time.sleep(idle)
        cpu = (instance_cpu_seconds(lab) - cpu0) / (time.monotonic() - t0)
        st = json.loads(lab.pepctl("status", "--json").stdout)
        proxied = sum(g["proxy"].get("mode") == "proxy" for g in st["graphs"])
        if proxied != n:
            raise SystemExit(f"bench scale: {n} graphs up, but only {proxied} proxy new flows")
        down = timed_pepctl(lab, "down")
        mem_after = settled_mem()
        used = mem_down - mem_up
        out[n] = {"up_s": up, "down_s": down, "mem_kib": used, "mem_kib_per_graph": used / n,
                  "mem_back_kib": mem_after - mem_up, "idle_cpu_pct": cpu * 100,
                  "idle_cpu_pct_per_graph": cpu * 100 / n}
        print(f"{n:5} graphs: up {up:6.2f} s, down {down:5.2f} s, {out[n]['mem_kib_per_graph'] / 1024:6.2f} MiB/graph, "
              f"idle CPU {cpu * 100:6.3f}% of a core ({cpu * 100 / n:.5f}% per graph)", flush=True)
    return out


def hold(lab: LabHandle, count: int) -> dict:
    """Memory of count idle connections from the client to the origin, through this lab."""
    before = settled_mem(2)
    proc = lab.popen("client", PYTHON, "-m", "bench.hold_connections", ORIGIN4, "80", str(count), "--hold", "120",
                     stdin=subprocess.PIPE)
    try:
        got = json.loads(proc.stdout.readline())
        if got["failed"] or got["established"] != count:
            raise SystemExit(f"bench scale: {got['established']} of {count} connections established")
        after = settled_mem(3)
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
    return {"kib_per_connection": (before - after) / count, "established_s": got["seconds"]}


def main() -> int:
    ap = argparse.ArgumentParser(prog="bench scale", description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", default="1,64,256,1024", help="graph counts of the sweep")
    ap.add_argument("--idle", type=float, default=10, help="seconds of idle CPU measured per count")
    ap.add_argument("--reps", type=int, default=5, help="packet-rate samples per lab")
    ap.add_argument("--seconds", type=float, default=4)
    ap.add_argument("--connections", type=int, default=7000)
    args = ap.parse_args()
    counts = sorted({int(x) for x in args.graphs.split(",")})
    big = counts[-1]
    with ExitStack() as stack:
        lab = labs(stack, {"sweep": []})["sweep"]
        sweep = graph_sweep(lab, counts, args.idle)
    pps = {"1": [], str(big): []}
    with ExitStack() as stack:
        two = labs(stack, {"1": [], str(big): ["--graphs", str(big)]})
        for rep in range(args.reps):
            for v in ("1", str(big)) if rep % 2 == 0 else (str(big), "1"):
                pps[v].append(udp_small_pps(two[v], args.seconds))
                print(f"rep {rep + 1}/{args.reps} graph 1 with {v:>5} graphs: {pps[v][-1]:,.0f} packets/s", flush=True)
    conns = {"proxied": [], "routed": []}
    with ExitStack() as stack:
        two = labs(stack, {"proxied": [], "routed": ["--no-proxy"]})
        for rep in range(2):
            for v in ("proxied", "routed") if rep % 2 == 0 else ("routed", "proxied"):
                conns[v].append(hold(two[v], args.connections)["kib_per_connection"])
                print(f"rep {rep + 1}/2 {v}: {conns[v][-1]:.1f} KiB per idle connection", flush=True)
    marginal = None
    if len(counts) > 1:
        a, b = counts[-2], counts[-1]
        marginal = (sweep[b]["mem_kib"] - sweep[a]["mem_kib"]) / (b - a)
    pps_ratio = paired_ratio(pps[str(big)], pps["1"])
    table = [["graphs", "up s", "down s", "MiB per graph", "idle CPU % of a core per graph"]]
    for n in counts:
        s = sweep[n]
        table.append([str(n), f"{s['up_s']:.2f}", f"{s['down_s']:.2f}", f"{s['mem_kib_per_graph'] / 1024:.2f}",
                      f"{s['idle_cpu_pct_per_graph']:.5f}"])
    if marginal is not None:
        table.append([f"marginal ({counts[-2]}->{big})", "", "", f"{marginal / 1024:.2f}", ""])
    table.append([f"graph 1 packets/s, {big} vs 1 graph", f"{median(pps[str(big)]):,.0f}", f"{median(pps['1']):,.0f}",
                  f"ratio {pps_ratio:.3f}", ""])
    table.append([f"KiB per idle connection ({args.connections})", f"proxied {median(conns['proxied']):.1f}",
                  f"routed {median(conns['routed']):.1f}",
                  f"proxy's {median(conns['proxied']) - median(conns['routed']):.1f}", ""])

    def plot(plt):
        fig, axes = plt.subplots(1, 3, figsize=(15, 3.8))
        axes[0].plot(counts, [sweep[n]["up_s"] for n in counts], "o-", label="up")
        axes[0].plot(counts, [sweep[n]["down_s"] for n in counts], "o-", label="down")
        axes[0].set(xscale="log", xlabel="graphs", ylabel="seconds", title="pepctl up / down")
        axes[0].legend()
        axes[1].plot(counts, [sweep[n]["mem_kib_per_graph"] / 1024 for n in counts], "o-")
        axes[1].axhline(2.0, color="r", lw=0.6, ls="--")
        axes[1].set(xscale="log", xlabel="graphs", ylabel="MiB per graph", title="memory per graph (kernel included)")
        axes[2].bar(["1 graph", f"{big} graphs"], [median(pps["1"]), median(pps[str(big)])], color=["#888", "#37a"])
        axes[2].set(ylabel="packets/s", title="UDP 64-byte frames through graph 1")
        return fig

    write_report("scale", {"counts": counts, "commit": git_rev(), "command": "./scripts/bench scale " +
                           " ".join(f"--{k} {v}" for k, v in vars(args).items()),
                           "sweep": sweep, "marginal_kib_per_graph": marginal,
                           "pps": {"samples": pps, "ratio": pps_ratio},
                           "idle_connections": {"count": args.connections, "kib_per_connection": conns}},
                 table, plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
