"""The demo: the appliance in the one-host lab, with real traffic, told in plain words.

Builds a lab of its own (PEP_LAB=demo-<pid>), shows a client reaching the
origin through the transparent proxy over IPv4 and IPv6, the split flow with
BBR toward the client and CUBIC toward the origin, the counters, and then
removes everything it made.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import secrets
import signal
import sys
import time

from bench.common import print_table, write_report
from bench.pep_gain import run_grid
from netns.addresses import CLIENT4, ORIGIN4, ORIGIN_URL4, ORIGIN_URL6
from netns.handle import LabHandle
from netns.lab import DEFAULT_CONGESTION
from netns.workloads import one_run, set_mode, set_profile


def say(text: str = "") -> None:
    print(text, flush=True)


def show_requests(lab: LabHandle) -> None:
    say("1. The client fetches the origin's page; the proxy answers as the origin, and connects to")
    say("   the origin as the client (transparent both ways):")
    for fam, url in (("IPv4", f"{ORIGIN_URL4}/"), ("IPv6", f"{ORIGIN_URL6}/")):
        tag = f"demo{secrets.token_hex(3)}"
        body = lab.run("client", "curl", "-s", "-m", "5", f"{url}?{tag}", check=False).stdout.strip()
        say(f"   {fam}: client got {body!r}; the origin saw the request come from {lab.origin_peer(tag)}")
    say()


def show_split_flow(lab: LabHandle) -> None:
    say("2. During a 50 MB download, inside the proxy namespace (ss -tin):")
    dl = lab.popen("client", "curl", "-s", "-o", "/dev/null", "--limit-rate", "20M", "-m", "10",
                   f"{ORIGIN_URL4}/50m")
    try:
        found = {}
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and len(found) < 2:
            lines = lab.run("pep", "ss", "-tinH", "state", "established").stdout.splitlines()
            for head, info in zip(lines[::2], lines[1::2], strict=False):
                peer = head.split()[-1]
                cc = re.search(rf"\b({DEFAULT_CONGESTION}|bbr|cubic|reno)\b", info)
                if cc and peer.startswith(f"{CLIENT4}:"):
                    found["client"] = (peer, cc.group(1))
                elif cc and peer == f"{ORIGIN4}:80":
                    found["origin"] = (peer, cc.group(1))
            time.sleep(0.1)
        for side, want in (("client", DEFAULT_CONGESTION), ("origin", "cubic")):
            peer, cc = found.get(side, ("?", "not seen"))
            mark = "ok" if cc == want else f"EXPECTED {want}"
            say(f"   socket toward the {side:<6} ({peer:<18}) congestion control: {cc:<6} [{mark}]")
    finally:
        dl.kill()
        dl.wait()
    say()


def show_throughput(lab: LabHandle) -> None:
    say("3. A 50 MB download through the proxy:")
    out = lab.run("client", "curl", "-s", "-o", "/dev/null", "-w", "%{size_download} %{time_total} %{speed_download}",
                  f"{ORIGIN_URL4}/50m", timeout=60).stdout.split()
    size, secs, speed = int(out[0]), float(out[1]), float(out[2])
    say(f"   {size / 1e6:.1f} MB in {secs:.2f} s = {speed * 8 / 1e9:.2f} Gbit/s "
        "(the access link has no impairment yet)")
    say()


def show_routed(lab: LabHandle) -> None:
    say("4. Everything that is not intercepted TCP is routed, not proxied:")
    ping = lab.run("client", "ping", "-c", "3", "-i", "0.2", "-q", ORIGIN4, check=False).stdout
    m = re.search(r"(\d+) received", ping)
    say(f"   ping {ORIGIN4}: {m.group(1) if m else '?'}/3 replies")
    say()


def show_gain(lab: LabHandle) -> None:
    rtt, loss, rate = 50, 1, 100
    say(f"5. The access link turns lossy ({rtt} ms RTT, {loss}% loss, {rate} Mbit/s, emulated by linkem):")
    say("   the same transfers with the PEP, and with it bypassed (end-to-end CUBIC, same path) ...")
    args = argparse.Namespace(reps=1, sizes=[10], cap=20.0, shorts=5, directions=["down"])
    cells = run_grid(lab, [(rtt, loss, rate)], args, log=lambda m: None)
    c = cells[0]
    rows = [["transfer", "with the PEP", "end-to-end CUBIC", "PEP gain"],
            ["10 MB download (goodput)", f"{c['proxy']['down_10MB_mbps']:.1f} Mbit/s",
             f"{c['e2e']['down_10MB_mbps']:.1f} Mbit/s", f"{c['ratio']['down_10MB_mbps']:.1f}x"],
            ["100 KB page (completion, median of 5)", f"{c['proxy']['short_100KB_s'] * 1000:.0f} ms",
             f"{c['e2e']['short_100KB_s'] * 1000:.0f} ms", f"{c['ratio']['short_100KB_s']:.1f}x"]]
    with contextlib.redirect_stdout(io.StringIO()):
        write_report("demo-gain", {"command": "./scripts/demo", "cells": cells}, rows,
                     plot_gain(c, f"{rtt} ms RTT, {loss}% loss, {rate} Mbit/s"))
    print_table_indented(rows)
    say("   (the e2e download is capped at 20 s; a 50 MB download and the whole grid: ./scripts/bench pep-gain)")
    say(f"   The download gains because the proxy's {DEFAULT_CONGESTION} toward the client takes no loss for")
    say("   congestion while the delay stays low, where end-to-end CUBIC backs off at each loss; the page,")
    say("   because the proxy starts toward the client with a larger, paced initial window (initcwnd 32).")
    say("   Uploads gain little: there the sender on the lossy link is the client.")
    say("   plot: results/demo-gain.png, numbers: results/demo-gain.json")
    say()


def show_responsiveness(lab: LabHandle) -> None:
    got = {}
    for mode in ("proxy", "e2e"):
        set_mode(lab, mode)
        set_profile(lab, "lte-trace")   # the trace starts over: both modes meet the same capacity
        got[mode] = one_run(lab, 12)
        if mode == "proxy":             # what pep_radio made of the link, before the entry ages
            estimate = lab.pepctl("subscribers", CLIENT4, check=False).stdout.strip()
    set_mode(lab, "proxy")
    set_profile(lab, "none")
    p, e = got["proxy"], got["e2e"]
    say("   On a trace-driven LTE link (lte-trace: capacity that swings and stops, a 500 ms buffer), while a")
    say(f"   download runs, a 1 KB request takes {p['small_p95_ms']:.0f} ms (p95) through the PEP and "
        f"{e['small_p95_ms']:.0f} ms end-to-end; the download gets {p['bulk_mbps']:.1f} vs {e['bulk_mbps']:.1f} Mbit/s")
    say("   (./scripts/bench responsiveness measures it on every trace profile)")
    if estimate:
        say(f"   {DEFAULT_CONGESTION}'s estimate of the client's link right after (pepctl subscribers {CLIENT4}):")
        say("   " + estimate.replace("\n", "\n   "))
    say()


def show_failopen(lab: LabHandle) -> None:
    say("6. HAProxy dies (kill -9). The demo holds its supervisor (SIGSTOP) so the gap lasts long enough")
    say("   to look at; unheld, a new HAProxy is up within about 0.1 s (tests/netns/test_failover.py):")

    def status() -> dict:
        return json.loads(lab.pepctl("status", "--json", check=False).stdout)

    def fetch() -> str:
        return lab.run("client", "curl", "-s", "-m", "5", "-o", "/dev/null", "-w", "%{http_code}",
                       f"{ORIGIN_URL4}/", check=False).stdout

    before = status()
    proxy = before["proxy"]
    held = [proxy["keeper"]["pid"], proxy["supervisor"]["pid"]]
    for pid in held:
        os.kill(pid, signal.SIGSTOP)
    try:
        os.kill(proxy["haproxy"]["pid"], signal.SIGKILL)
        time.sleep(0.1)
        gap = status()
        code = fetch()
        flows = status()["graphs"][0]["flows"]
        failopen = flows["flows_bypass_failopen"] - before["graphs"][0]["flows"]["flows_bypass_failopen"]
        say(f"   killed HAProxy pid {proxy['haproxy']['pid']}; status says new flows get: "
            f"{gap['graphs'][0]['proxy']['mode'].upper()} ({gap['graphs'][0]['proxy']['why']})")
        say(f"   a new connection got HTTP {code}: forwarded unproxied by the tc program, which found no listener")
        say(f"   ({failopen} flow(s) bypassed by fail-open; each keeps that verdict for its life)")
    finally:
        released = time.monotonic()
        for pid in reversed(held):
            os.kill(pid, signal.SIGCONT)
    after = status()
    while after["graphs"][0]["proxy"]["mode"] != "proxy" and time.monotonic() - released < 5:
        time.sleep(0.01)
        after = status()
    took = (time.monotonic() - released) * 1000
    proxied = after["graphs"][0]["flows"]["flows_proxied"]
    code = fetch()
    proxied = status()["graphs"][0]["flows"]["flows_proxied"] - proxied
    say(f"   released, the supervisor had HAProxy pid {after['proxy']['haproxy']['pid']} listening within "
        f"{took:.0f} ms; the next connection")
    say(f"   got HTTP {code}, proxied again ({proxied} new proxied flow)")
    say()


SHOWN_METRICS = ("pep_up", "pep_failopen{", "pep_failopen_switches_total", "pep_flows_total{",
                 "pep_proxy_sessions_total", "pep_proxy_errors_total", "pep_tcp_rtt_seconds_count",
                 "pep_tcp_sampled_sockets_total")


def show_metrics(lab: LabHandle) -> None:
    say("8. What the host's Prometheus scrapes (pepctl's exporter, 127.0.0.1:9101 in the proxy host; a few of")
    say("   its series, all in pepctl/metrics.py; monitoring/ has the Grafana dashboard and alert rules):")
    text = lab.run("proxyhost", "curl", "-s", "-m", "5", "http://127.0.0.1:9101/metrics", check=False).stdout
    lines = [ln for ln in text.splitlines() if ln.startswith(SHOWN_METRICS) and not ln.endswith(" 0")]
    say("   " + "\n   ".join(lines or ["(the exporter did not answer)"]))
    say()


def plot_gain(cell: dict, link: str):
    """Two bar pairs a person reads at a glance: the download's goodput against the link rate, and
    the page's completion time; with the PEP and end to end, the gain written above."""
    def plot(plt):
        fig, (left, right) = plt.subplots(1, 2, figsize=(8, 3.6))
        colours = ("tab:green", "tab:grey")
        names = ("with the PEP", "end-to-end CUBIC")
        for ax, key, scale, unit, title in (
                (left, "down_10MB_mbps", 1, "Mbit/s", "10 MB download goodput (higher is better)"),
                (right, "short_100KB_s", 1000, "ms", "100 KB page completion (lower is better)")):
            values = [cell["proxy"][key] * scale, cell["e2e"][key] * scale]
            bars = ax.bar(names, values, color=colours)
            ax.bar_label(bars, [f"{v:.1f} {unit}" if unit == "Mbit/s" else f"{v:.0f} {unit}" for v in values])
            ax.set_title(f"{title}\nPEP gain {cell['ratio'][key]:.1f}x", fontsize=9)
            ax.set_ylabel(unit)
            ax.set_ylim(0, max(values) * 1.25)
        left.set_ylim(0, max(left.get_ylim()[1], cell["rate_mbit"] * 1.15))
        left.axhline(cell["rate_mbit"], ls="--", color="black", lw=0.8)
        left.text(1.45, cell["rate_mbit"], "link rate", ha="right", va="bottom", fontsize=8)
        fig.suptitle(f"The PEP on a lossy access link: {link}")
        fig.tight_layout()
        return fig
    return plot


def print_table_indented(rows) -> None:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        print_table(rows)
    say("   " + buf.getvalue().rstrip().replace("\n", "\n   "))


def main() -> int:
    if os.geteuid() != 0:
        print("demo: must run as root", file=sys.stderr)
        return 1
    say("PEP demo: a transparent TCP performance-enhancing proxy in a one-host lab")
    say("building the lab: client, switch, proxy host (pepctl up), origin (nginx) ...")
    t0 = time.monotonic()
    with LabHandle.up(f"demo{os.getpid()}", ["--link", "none"]) as lab:
        say(f"lab up in {time.monotonic() - t0:.1f} s (run id {lab.rid})")
        say()
        show_requests(lab)
        show_split_flow(lab)
        show_throughput(lab)
        show_routed(lab)
        show_gain(lab)
        show_responsiveness(lab)
        show_failopen(lab)
        say("7. What the appliance counted (pepctl status, in the proxy host):")
        say("   " + lab.pepctl("status").stdout.strip().replace("\n", "\n   "))
        say()
        show_metrics(lab)
        say("removing the lab ...")
    say("done: the lab is gone (pep-lab down); nothing is left on this machine.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
