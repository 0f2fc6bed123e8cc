"""bench responsiveness: does the phone stay responsive while something downloads? With and without the PEP.

One lab; for each access-link profile (default the trace-driven ones: capacity that swings and
stops, deep drop-tail buffers), proxy and end-to-end alternate REPS times on the same link:
  proxy  split at HAProxy: BBR toward the subscriber (paced: it keeps the deep buffer short)
  e2e    every lab client bypassed (a bypass rule): CUBIC end to end fills the buffer
Each run starts the link's traces over (the profile is set again), so both modes meet the same
capacity second by second. Each run, for SECONDS:
  bulk        one download of the lab's 50 MB object: its goodput (what arrived / the time)
  small       a 1 KB request-response on a connection of its own every 200 ms: its time
              (curl's time_total, handshake included): p50, p95, p99
  page        30 objects over 6 connections (curl --parallel: 10 of 100 KB, 20 of 1 KB), started
              3 s into the download: its completion time
Reported: medians over reps, and the ratios proxy / e2e (above 1 for goodput; for times, e2e /
proxy, so above 1 means the PEP is better); JSON, a plot of request time and goodput over one
run's time, and a markdown table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from contextlib import ExitStack

from netns.handle import LabHandle

from .common import RESULTS, git_rev, labs, median, write_report
from .pep_gain import set_mode

URL = "http://198.19.0.10"
PAGE = [f"{URL}/{obj}?{i}" for i, obj in enumerate(["100k"] * 10 + ["1k"] * 20)]   # 30 objects, about 1 MB
PROFILES = ["lte-trace", "5g-trace", "3g-trace"]


def set_profile(lab: LabHandle, profile: str) -> None:
    proc = lab.run_pep_lab("link", profile)
    assert proc.returncode == 0, proc.stderr


def percentile(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))] if s else float("nan")


def one_run(lab: LabHandle, seconds: float) -> dict:
    """The bulk download, small requests beside it, and a page load 3 s in."""
    bulk = lab.popen("client", "curl", "-s", "-o", "/dev/null", "-m", f"{seconds:g}", "-w",
                     "%{size_download} %{time_total}", f"{URL}/50m")
    started = time.monotonic()
    small: list[tuple[float, float]] = []   # (offset s, request time s)
    page: dict = {}

    def load_page():
        time.sleep(3)
        out = lab.run("client", "curl", "-s", "--parallel", "--parallel-max", "6", "-m", f"{seconds:g}",
                      *[a for u in PAGE for a in ("-o", "/dev/null", u)], "-w", "%{time_total}\n",
                      check=False, timeout=seconds + 30)
        page["s"] = time.monotonic() - started - 3 if out.returncode == 0 else float("nan")

    pager = threading.Thread(target=load_page)
    pager.start()
    while time.monotonic() - started < seconds - 1:
        t = time.monotonic()
        out = lab.run("client", "curl", "-s", "-o", "/dev/null", "-m", "10", "-H", "Connection: close", "-w",
                      "%{time_total}", f"{URL}/1k?{len(small)}", check=False, timeout=20)
        if out.returncode == 0:
            small.append((t - started, float(out.stdout)))
        time.sleep(max(0.0, 0.2 - (time.monotonic() - t)))
    pager.join()
    size, secs = (float(x) for x in bulk.communicate(timeout=seconds + 30)[0].split())
    times = [x for _, x in small]
    return {"bulk_mbps": size * 8 / secs / 1e6 if secs else 0.0, "small_p50_ms": percentile(times, 50) * 1000,
            "small_p95_ms": percentile(times, 95) * 1000, "small_p99_ms": percentile(times, 99) * 1000,
            "small_count": len(times), "page_s": page.get("s", float("nan")), "small_series": small}


KEYS = ("bulk_mbps", "small_p50_ms", "small_p95_ms", "small_p99_ms", "page_s")


def run_profiles(lab: LabHandle, profiles: list[str], reps: int, seconds: float) -> list[dict]:
    results = []
    for profile in profiles:
        samples: dict[str, list[dict]] = {"proxy": [], "e2e": []}
        for rep in range(reps):
            for mode in ("proxy", "e2e") if rep % 2 == 0 else ("e2e", "proxy"):
                set_mode(lab, mode)
                # Set again before every run: the traces start over with its first frame, so proxy
                # and end-to-end meet the same capacity, second by second.
                set_profile(lab, profile)
                r = one_run(lab, seconds)
                samples[mode].append(r)
                print(f"{profile:10} rep {rep + 1}/{reps} {mode:5}: bulk {r['bulk_mbps']:6.2f} Mbit/s, 1 KB "
                      f"p50/p95/p99 {r['small_p50_ms']:6.0f}/{r['small_p95_ms']:6.0f}/{r['small_p99_ms']:6.0f} ms, "
                      f"page {r['page_s']:5.2f} s", flush=True)
        set_mode(lab, "proxy")
        med = {m: {k: median([r[k] for r in samples[m]]) for k in KEYS} for m in samples}
        ratio = {k: (med["proxy"][k] / med["e2e"][k] if k == "bulk_mbps" else med["e2e"][k] / med["proxy"][k])
                 for k in KEYS}
        results.append({"profile": profile, "samples": samples, "proxy": med["proxy"], "e2e": med["e2e"],
                        "ratio": ratio})
    return results


def table(results: list[dict]) -> list[list[str]]:
    rows = [["profile", "mode", "bulk Mbit/s", "1 KB p50 ms", "p95 ms", "p99 ms", "page (30 objects) s"]]
    for c in results:
        for mode in ("proxy", "e2e"):
            m = c[mode]
            rows.append([c["profile"], mode, f"{m['bulk_mbps']:.2f}", f"{m['small_p50_ms']:.0f}",
                         f"{m['small_p95_ms']:.0f}", f"{m['small_p99_ms']:.0f}", f"{m['page_s']:.2f}"])
        r = c["ratio"]
        rows.append([c["profile"], "gain", f"{r['bulk_mbps']:.2f}x", f"{r['small_p50_ms']:.2f}x",
                     f"{r['small_p95_ms']:.2f}x", f"{r['small_p99_ms']:.2f}x", f"{r['page_s']:.2f}x"])
    return rows


def plot_runs(results: list[dict]):
    def plot(plt):
        fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 3.6), squeeze=False)
        for ax, c in zip(axes[0], results, strict=True):
            for mode, colour in (("proxy", "tab:green"), ("e2e", "tab:grey")):
                series = c["samples"][mode][0]["small_series"]
                ax.plot([t for t, _ in series], [x * 1000 for _, x in series], ".-", color=colour, ms=3,
                        label=f"{mode}: bulk {c[mode]['bulk_mbps']:.1f} Mbit/s")
            ax.set_yscale("log")
            ax.set_xlabel("seconds into the download")
            ax.set_ylabel("1 KB request time, ms")
            ax.set_title(f"{c['profile']}: p95 gain {c['ratio']['small_p95_ms']:.1f}x", fontsize=9)
            ax.legend(fontsize=7)
        fig.suptitle("Latency under load: a 1 KB request every 200 ms while a 50 MB download runs")
        fig.tight_layout()
        return fig
    return plot


def write_markdown(path: str, results: list[dict], reps: int, command: str) -> None:
    with open(path, "w") as f:
        f.write(f"Medians of {reps} runs each, proxy and end-to-end alternating (`{command}`); gain: proxy / e2e "
                "for goodput, e2e / proxy for times (above 1: the PEP is better).\n\n")
        rows = table(results)
        f.write("| " + " | ".join(rows[0]) + " |\n|" + "---|" * len(rows[0]) + "\n")
        for r in rows[1:]:
            f.write("| " + " | ".join(r) + " |\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench responsiveness", description=__doc__.splitlines()[0])
    ap.add_argument("--profiles", default=",".join(PROFILES), help="linkem profiles (linkem/profiles.toml)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=20, help="length of each run (the bulk download's cap)")
    ap.add_argument("--name", default="responsiveness", help="results/NAME.json, .png and .md")
    args = ap.parse_args(argv)
    command = "./scripts/bench responsiveness " + " ".join(sys.argv[1:] if argv is None else argv)
    with ExitStack() as stack:
        lab = labs(stack, {"lab": ["--link", "none"]})["lab"]
        results = run_profiles(lab, args.profiles.split(","), args.reps, args.seconds)
    for c in results:
        for mode in ("proxy", "e2e"):
            c[f"{mode}_p95_spread"] = statistics.pstdev([r["small_p95_ms"] for r in c["samples"][mode]])
    write_report(args.name, {"command": command, "commit": git_rev(), "reps": args.reps, "seconds": args.seconds,
                             "profiles": results}, table(results), plot_runs(results))
    write_markdown(os.path.join(RESULTS, f"{args.name}.md"), results, args.reps, command)
    print(f"markdown table: results/{args.name}.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
