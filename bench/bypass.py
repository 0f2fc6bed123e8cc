"""bench bypass: does the per-flow bypass slow down with 100,000 rules, and how fast do they load?

Two labs side by side, proxy on, both with rules bypassing every lab client
(client 198.18.0.0/24 and 2001:2:0:1::/64), loaded by `pepctl bypass add --from-file`:
  10     the two, and 8 rules that match nothing
  100k   the two, and 99,998 that match nothing: /32s and /24s in 198.18.128.0/17 (client) and
         198.19.128.0/17 (server), /64s under 2001:2::/48 (both kinds)
Measured alternately, REPS times, each metric of the two labs back to back (the order flips every
rep); the ratio is the median of each rep's ratio (bench/common.py paired_ratio):
  new connections/s through the bypass (wrk, 1 KB, `Connection: close`): every connection's
    first SYN does the LPM lookups in the client and server maps;
  packets/s of one established bypassed TCP stream of small segments (iperf3 -M 500, TSO/GSO off
    at the client so each segment is a packet): pkts_bypassed counter delta / time, both
    directions; only the flow table is looked up;
  the time to load 100,000 rules: wall time of the command, and of its map writes alone.
Then the kernel's own time for the program (bench/bypass_ktime.py: BPF_PROG_TEST_RUN on private
loads of tc/flow.o holding the same rules): per first SYN, where the rules are looked up, and per
established packet. The machine's drift, a quarter from minute to minute here, does not reach it.
Before measuring, each lab shows its flows are bypassed (flows_bypass_rule grows, HAProxy's
sessions do not); every measurement checks it again.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import subprocess
import tempfile
import time
from contextlib import ExitStack

from netns.addresses import ACCESS_NET4, ACCESS_NET6, ORIGIN4, ORIGIN_URL4, ORIGIN_URL6
from netns.handle import PYTHON, REPO, LabHandle
from pepctl import bypass, flow_maps
from pepctl import config as configmod
from pepctl.config.rules import parse_rule
from pepctl.plan import FLOW_OBJ, loadall_argv

from .common import git_rev, median, paired_ratio, write_report

LAB_CLIENTS = [f"client {ACCESS_NET4}", f"client {ACCESS_NET6}"]
NO_MATCH_10 = ["client 198.18.200.0/24", "server 198.19.200.0/24", "client 198.18.128.1/32",
               "server 198.19.128.1/32", "client 198.18.129.0/24", "server 198.19.129.0/24",
               "client 2001:2:0:100::/64", "server 2001:2:0:101::/64"]
MSS = 500
WRK_LUA = os.path.join(os.path.dirname(__file__), "wrk_json.lua")


def rules_100k() -> list[str]:
    """99,998 rules that match no lab traffic, and the two that match every lab client."""
    out = [f"{kind} {net}.{i}.0/24" for kind, net in (("client", "198.18"), ("server", "198.19"))
           for i in range(128, 256)]
    out += [f"{kind} {net}.{128 + i // 256}.{i % 256}/32" for kind, net in (("client", "198.18"), ("server", "198.19"))
            for i in range(32768)]
    # /64s under 2001:2::/48 from 2001:2:0:100::/64 on: clear of the lab's 2001:2:0:1:: and :2::.
    out += [f"{('client', 'server')[i % 2]} 2001:2:0:{0x100 + i:x}::/64" for i in range(100_000 - 2 - len(out))]
    return LAB_CLIENTS + out


VARIANTS = {"10": LAB_CLIENTS + NO_MATCH_10, "100k": rules_100k()}


class Lab:
    """A lab, its graph's pins, and what its flows did."""

    def __init__(self, handle: LabHandle):
        self.h = handle
        cfg = configmod.load(os.path.join(handle.run_dir, "pep.toml"))
        self.pins = bypass.pins(cfg)

    def counters(self) -> dict[str, int]:
        return flow_maps.read_counters(self.pins, 0)

    def sessions(self) -> int:
        return self.h.status()["pepctl"]["graphs"][0]["proxy"]["haproxy"]["sessions_total"]


def install(lab: Lab, rules: list[str], folder: str) -> dict:
    """`pepctl bypass add --from-file`; its wall time, and the map writes' time and method it prints."""
    path = os.path.join(folder, f"rules-{len(rules)}.txt")
    with open(path, "w") as f:
        f.write("# bench bypass\n" + "\n".join(rules) + "\n")
    started = time.monotonic()
    out = lab.h.pepctl("bypass", "add", "--from-file", path).stdout
    wall = time.monotonic() - started
    m = re.search(r"maps written in ([\d.]+) s \((\S+)\)", out)
    if not m:
        raise SystemExit(f"bench bypass: cannot read the map time from pepctl's answer: {out!r}")
    return {"wall_s": wall, "maps_s": float(m.group(1)), "method": m.group(2)}


def uninstall(lab: Lab, rules: list[str], folder: str) -> None:
    path = os.path.join(folder, f"rules-{len(rules)}.txt")
    lab.h.pepctl("bypass", "del", "--from-file", path)


def check_bypassed(lab: Lab, name: str, c0: dict, s0: int, new_flows: int) -> None:
    c1, s1 = lab.counters(), lab.sessions()
    grew = c1["flows_bypass_rule"] - c0["flows_bypass_rule"]
    if s1 != s0 or grew < new_flows or c1["flows_proxied"] != c0["flows_proxied"]:
        raise SystemExit(f"bench bypass: lab {name}: flows not bypassed: HAProxy sessions {s0} -> {s1}, "
                         f"flows_bypass_rule +{grew} (expected >= {new_flows}), flows_proxied "
                         f"{c0['flows_proxied']} -> {c1['flows_proxied']}")


def verify(lab: Lab, name: str) -> None:
    c0, s0 = lab.counters(), lab.sessions()
    for url in (f"{ORIGIN_URL4}/1k", f"{ORIGIN_URL6}/1k"):
        for _ in range(3):
            lab.h.run("client", "curl", "-sS", "-g", "-m", "5", "-o", "/dev/null", url)
    check_bypassed(lab, name, c0, s0, 6)


def new_connections(lab: Lab, name: str, seconds: float) -> float:
    c0, s0 = lab.counters(), lab.sessions()
    out = lab.h.run("client", "wrk", "-t1", "-c16", f"-d{seconds:g}s", "-s", WRK_LUA, "-H", "Connection: close",
                    f"{ORIGIN_URL4}/1k", timeout=seconds + 30).stdout
    r = json.loads(out.strip().splitlines()[-1])
    if r["errors"] or r["status_errors"]:
        raise SystemExit(f"bench bypass: lab {name}: wrk errors: {r}")
    check_bypassed(lab, name, c0, s0, r["requests"])
    return r["requests"] / (r["duration_us"] / 1e6)


def stream_pps(lab: Lab, name: str, seconds: float) -> float:
    """pkts_bypassed per second over the steady middle of one iperf3 stream (1 s skipped each end)."""
    srv = lab.h.popen("origin", "iperf3", "-s", "-1", "-B", ORIGIN4, "-p", "5201")
    try:
        deadline = time.monotonic() + 5
        while not lab.h.run("origin", "ss", "-Hltn", "sport = :5201", check=False).stdout.strip():
            if time.monotonic() > deadline:
                raise SystemExit(f"bench bypass: lab {name}: iperf3 server did not listen")
            time.sleep(0.02)
        c0, s0 = lab.counters(), lab.sessions()
        client = lab.h.popen("client", "iperf3", "-c", ORIGIN4, "-p", "5201", "-t", f"{seconds:g}",
                             "-M", str(MSS), "-J")
        time.sleep(1.0)
        p0, t0 = lab.counters()["pkts_bypassed"], time.monotonic()
        time.sleep(seconds - 2.0)
        p1, t1 = lab.counters()["pkts_bypassed"], time.monotonic()
        out, err = client.communicate(timeout=seconds + 30)
        if client.returncode != 0:
            raise SystemExit(f"bench bypass: lab {name}: iperf3 failed: {err or out[-500:]}")
        check_bypassed(lab, name, c0, s0, 2)   # iperf3's control and data connections
        return (p1 - p0) / (t1 - t0)
    finally:
        srv.kill()
        srv.wait()


def kernel_times(lab: Lab) -> dict:
    """Private loads of tc/flow.o with each variant's rules, timed by bench/bypass_ktime.py in the
    lab's pep namespace; the pins are removed again."""
    ns = lab.h.netns("pep")
    pins = {v: f"/sys/fs/bpf/{ns}-kt{v}" for v in VARIANTS}
    try:
        for v, rules in VARIANTS.items():
            os.makedirs(pins[v])
            subprocess.run(loadall_argv(FLOW_OBJ, pins[v]), check=True, capture_output=True)
            flow_maps.add_rules(pins[v], 0, **bypass.map_args([parse_rule(*r.split()) for r in rules]))
        proc = subprocess.run(["nsenter", f"--net=/run/netns/{ns}", PYTHON, "-m", "bench.bypass_ktime",
                               *pins.values()], cwd=REPO, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise SystemExit(f"bench bypass: kernel times: {proc.stderr.strip() or proc.stdout.strip()}")
        got = json.loads(proc.stdout)
        return {m: {v: got[m][pins[v]] for v in VARIANTS} for m in ("syn_ns", "est_ns")}
    finally:
        for p in pins.values():
            shutil.rmtree(p, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(prog="bench bypass", description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=4)
    args = ap.parse_args()
    if args.seconds < 3:
        ap.error("--seconds: at least 3 (the packet rate skips the first and last second)")
    samples = {m: {v: [] for v in VARIANTS} for m in ("conn_per_s", "stream_pps")}
    installs: list[dict] = []
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="hbbench-") as folder:
        # Named hb...: other sessions run labs on this machine at the same time.
        lab = {v: Lab(stack.enter_context(LabHandle.up(f"hb{secrets.token_hex(3)}", []))) for v in VARIANTS}
        for v, rules in VARIANTS.items():
            got = install(lab[v], rules, folder)
            print(f"lab {v}: {len(rules):,} rules loaded in {got['wall_s']:.2f} s "
                  f"(maps {got['maps_s']:.3f} s, {got['method']})", flush=True)
            if v == "100k":
                installs.append(got)
            listed = json.loads(lab[v].h.pepctl("bypass", "list", "--json").stdout)["rules"]
            if len(listed) != len(rules):
                raise SystemExit(f"bench bypass: lab {v}: {len(listed)} rules listed, {len(rules)} loaded")
            # Small segments: without TSO/GSO each MSS-sized segment is its own packet.
            lab[v].h.run("client", "ethtool", "-K", "eth0", "tso", "off", "gso", "off")
            verify(lab[v], v)
        measures = {"conn_per_s": (new_connections, "new conn/s"), "stream_pps": (stream_pps, "pkts/s bypassed")}
        for rep in range(args.reps):
            order = list(VARIANTS) if rep % 2 == 0 else list(VARIANTS)[::-1]
            for m, (fn, unit) in measures.items():
                for v in order:
                    samples[m][v].append(fn(lab[v], v, args.seconds))
                    print(f"rep {rep + 1}/{args.reps} {v:<5} {samples[m][v][-1]:11,.0f} {unit}", flush=True)
        ktime = kernel_times(lab["10"])
        for m, unit in (("syn_ns", "ns per first SYN"), ("est_ns", "ns per established packet")):
            print(f"kernel time: {unit}: " + ", ".join(f"{v} rules {median(x):.0f}" for v, x in ktime[m].items()),
                  flush=True)
        # More load times of 100,000 rules: remove them all and load them again.
        for _ in range(args.reps - 1):
            uninstall(lab["100k"], VARIANTS["100k"], folder)
            installs.append(install(lab["100k"], VARIANTS["100k"], folder))
            print(f"reload of 100,000 rules: {installs[-1]['wall_s']:.2f} s (maps {installs[-1]['maps_s']:.3f} s)",
                  flush=True)

    med = {m: {v: median(x) for v, x in s.items()} for m, s in samples.items()}
    ratios = {m: paired_ratio(samples[m]["100k"], samples[m]["10"]) for m in med}
    # As rates: time with 10 rules / time with 100,000 (above 1: the many rules are faster).
    kmed = {m: {v: median(x) for v, x in t.items()} for m, t in ktime.items()}
    kratios = {m: paired_ratio(t["10"], t["100k"]) for m, t in ktime.items()}
    ratios_of_medians = {m: med[m]["100k"] / med[m]["10"] for m in med}
    load = {"wall_s": median([i["wall_s"] for i in installs]), "maps_s": median([i["maps_s"] for i in installs]),
            "method": installs[0]["method"], "samples": installs}
    table = [["metric", "10 rules", "100,000 rules", "ratio 100k/10 (paired)", "acceptance"],
             ["new connections/s through the bypass (1 KB, Connection: close)", f"{med['conn_per_s']['10']:,.0f}",
              f"{med['conn_per_s']['100k']:,.0f}", f"{ratios['conn_per_s']:.3f}",
              ">= 0.95 " + ("ok" if ratios["conn_per_s"] >= 0.95 else "MISSED")],
             [f"packets/s of a bypassed stream (MSS {MSS}, both directions)", f"{med['stream_pps']['10']:,.0f}",
              f"{med['stream_pps']['100k']:,.0f}", f"{ratios['stream_pps']:.3f}",
              ">= 0.95 " + ("ok" if ratios["stream_pps"] >= 0.95 else "MISSED")],
             *[[f"kernel time of flow_ingress per {what}, ns (rate ratio)", f"{kmed[m]['10']:.0f}",
                f"{kmed[m]['100k']:.0f}", f"{kratios[m]:.3f}", ">= 0.95 " + ("ok" if kratios[m] >= 0.95 else "MISSED")]
               for m, what in (("syn_ns", "first SYN (rule lookups)"), ("est_ns", "established packet"))],
             ["load 100,000 rules: `pepctl bypass add --from-file`, wall s", "", f"{load['wall_s']:.2f}", "",
              "< 2 s " + ("ok" if load["wall_s"] < 2 else "MISSED")],
             [f"  of which map writes, s ({load['method']})", "", f"{load['maps_s']:.3f}", "",
              "< 2 s " + ("ok" if load["maps_s"] < 2 else "MISSED")]]

    def plot(plt):
        fig, axes = plt.subplots(1, 4, figsize=(17, 3.8))
        for ax, (m, title) in zip(axes, (("conn_per_s", "new connections/s"),
                                         ("stream_pps", f"bypassed packets/s (MSS {MSS})")), strict=False):
            ax.bar(["10 rules", "100,000 rules"], [med[m]["10"], med[m]["100k"]], color=["#888", "#37a"])
            ax.set_title(f"{title}\npaired ratio {ratios[m]:.3f}")
        ax = axes[2]
        xs = range(2)
        for i, (v, colour) in enumerate((("10", "#888"), ("100k", "#37a"))):
            ax.bar([x + 0.4 * i for x in xs], [kmed["syn_ns"][v], kmed["est_ns"][v]], width=0.4, color=colour,
                   label=f"{'10' if v == '10' else '100,000'} rules")
        ax.set_xticks([x + 0.2 for x in xs], ["first SYN", "established"])
        ax.set_ylabel("ns per packet")
        ax.legend(fontsize=8)
        ax.set_title(f"kernel time of flow_ingress\nrate ratios {kratios['syn_ns']:.3f}, {kratios['est_ns']:.3f}")
        ax = axes[3]
        ax.bar(["command (wall)", "map writes"], [load["wall_s"], load["maps_s"]], color=["#37a", "#3a7"])
        ax.axhline(2.0, color="r", lw=0.8)
        ax.set_title(f"load 100,000 rules, s ({load['method']})")
        fig.suptitle(f"Per-flow bypass: 10 vs 100,000 rules (medians of {args.reps})", y=1.06)
        return fig

    write_report("bypass", {"reps": args.reps, "seconds": args.seconds, "commit": git_rev(),
                            "command": "./scripts/bench bypass", "mss": MSS, "client_offloads": "tso off, gso off",
                            "rules": {v: len(r) for v, r in VARIANTS.items()}, "medians": med, "ratios": ratios,
                            "ratios_of_medians": ratios_of_medians,
                            "kernel_time_ns": {"medians": kmed, "rate_ratios": kratios, "samples": ktime},
                            "install_100k": load, "samples": samples}, table, plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
