"""bench responsiveness: does the phone stay responsive while something downloads? With and without the PEP.

One lab; for each access-link profile (default the trace-driven ones: capacity that swings and
stops, deep drop-tail buffers), proxy and end-to-end alternate REPS times on the same link:
  proxy  split at HAProxy: BBR toward the subscriber (paced: it keeps the deep buffer short)
  e2e    every lab client bypassed (a bypass rule): CUBIC end to end fills the buffer
Each run starts the link's traces over (the profile is set again), so both modes meet the same
capacity second by second. Each run, for SECONDS (3g-trace: 45 s, MIN_SECONDS):
  bulk        one download of the lab's 1 GB object, cut at SECONDS: its goodput (what arrived / the time)
  small       a 1 KB request-response on a connection of its own every 200 ms, on a fixed
              schedule (bench/probe_requests.py: a slow one does not hold back the next): its
              time from connect to the last byte: p50, p95, p99 of every run's requests together
  page        30 objects over 6 connections (curl --parallel: 10 of 100 KB, 20 of 1 KB), started
              3 s into the download: its completion time
Reported: medians over reps (request times: percentiles over every rep's requests together), and
the ratios proxy / e2e (above 1 for goodput; for times, e2e / proxy, so above 1 means the PEP is
better); JSON, a plot of request time over one run's time, and a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from contextlib import ExitStack

from netns.handle import PYTHON, REPO, LabHandle

from .common import RESULTS, git_rev, labs, median, write_report
from .pep_gain import set_mode

ORIGIN = "198.19.0.10"
URL = f"http://{ORIGIN}"
PROBE_INTERVAL = 0.2   # a 1 KB request every 200 ms, on a connection of its own
PAGE = [f"{URL}/{obj}?{i}" for i, obj in enumerate(["100k"] * 10 + ["1k"] * 20)]   # 30 objects, about 1 MB
PROFILES = ["lte-trace", "5g-trace", "3g-trace"]
# A run lasts --seconds, or longer where the page needs it: on 3g-trace (about 2 Mbit/s down, shared
# with the download) the page's 1 MB took 15-20 s, at the edge of a 20 s run.
MIN_SECONDS = {"3g-trace": 45.0}


def set_profile(lab: LabHandle, profile: str) -> None:
    proc = lab.run_pep_lab("link", profile)
    assert proc.returncode == 0, proc.stderr


def percentile(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))] if s else float("nan")


def one_run(lab: LabHandle, seconds: float) -> dict:
    """The bulk download, small requests beside it on a fixed schedule, and a page load 3 s in."""
    bulk = lab.popen("client", "curl", "-s", "-o", "/dev/null", "-m", f"{seconds:g}", "-w",
                     "%{size_download} %{time_total}", f"{URL}/1g")
    probe = lab.popen("client", PYTHON, "-m", "bench.probe_requests", ORIGIN, "--seconds", f"{seconds - 1:g}",
                      "--interval", f"{PROBE_INTERVAL:g}", cwd=REPO)
    received: list[tuple[float, int]] = []   # (offset s, bytes the client has received)
    stop = threading.Event()
    sampler = threading.Thread(target=sample_received, args=(lab, received, stop))
    sampler.start()
    time.sleep(3)
    t = time.monotonic()
    out = lab.run("client", "curl", "-s", "--parallel", "--parallel-max", "6", "-m", f"{seconds:g}",
                  *[a for u in PAGE for a in ("-o", "/dev/null", u)], check=False, timeout=seconds + 30)
    page_s = time.monotonic() - t if out.returncode == 0 else float("nan")
    probed = json.loads(probe.communicate(timeout=seconds + 30)[0])
    size, secs = (float(x) for x in bulk.communicate(timeout=seconds + 30)[0].split())
    stop.set()
    sampler.join()
    times = [x for _, x in probed["samples"]]
    return {"bulk_mbps": size * 8 / secs / 1e6 if secs else 0.0, **small_percentiles(times),
            "small_count": len(times), "small_failed": probed["failed"], "page_s": page_s,
            "small_series": probed["samples"], "goodput_series": rate_series(received)}


def sample_received(lab: LabHandle, into: list, stop: threading.Event) -> None:
    """Every 500 ms, the bytes the client's interfaces have received (/proc/net/dev of its netns)."""
    started = time.monotonic()
    while not stop.wait(0.5):
        lines = lab.run("client", "cat", "/proc/net/dev").stdout.splitlines()[2:]
        names_counters = [line.split(":", 1) for line in lines]
        into.append((time.monotonic() - started,
                     sum(int(counters.split()[0]) for name, counters in names_counters if name.strip() != "lo")))


def rate_series(received: list[tuple[float, int]]) -> list[list[float]]:
    """(offset s, Mbit/s) between consecutive samples."""
    return [[round(t1, 2), round((b1 - b0) * 8 / (t1 - t0) / 1e6, 3)]
            for (t0, b0), (t1, b1) in zip(received, received[1:], strict=False)]


def small_percentiles(times: list[float]) -> dict:
    return {f"small_p{p}_ms": percentile(times, p) * 1000 for p in (50, 95, 99)}


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
                r = one_run(lab, max(seconds, MIN_SECONDS.get(profile, 0.0)))
                samples[mode].append(r)
                print(f"{profile:10} rep {rep + 1}/{reps} {mode:5}: bulk {r['bulk_mbps']:6.2f} Mbit/s, 1 KB "
                      f"p50/p95/p99 {r['small_p50_ms']:6.0f}/{r['small_p95_ms']:6.0f}/{r['small_p99_ms']:6.0f} ms, "
                      f"page {r['page_s']:5.2f} s", flush=True)
        set_mode(lab, "proxy")
        # Goodput and page load: medians over runs. Request times: percentiles of every run's
        # requests together (a p99 of one run's 100 requests is its second-worst; of 500, its fifth).
        med = {m: {k: median([r[k] for r in samples[m]]) for k in ("bulk_mbps", "page_s")} for m in samples}
        for m in samples:
            med[m].update(small_percentiles([x for r in samples[m] for _, x in r["small_series"]]))
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
        fig, axes = plt.subplots(2, len(results), figsize=(5 * len(results), 6), squeeze=False, sharex="col")
        for col, c in enumerate(results):
            delay, goodput = axes[0][col], axes[1][col]
            for mode, colour in (("proxy", "tab:green"), ("e2e", "tab:grey")):
                run = c["samples"][mode][0]
                delay.plot([t for t, _ in run["small_series"]], [x * 1000 for _, x in run["small_series"]], ".-",
                           color=colour, ms=3, label=f"{mode}: p95 {c[mode]['small_p95_ms']:.0f} ms")
                goodput.plot([t for t, _ in run["goodput_series"]], [r for _, r in run["goodput_series"]], "-",
                             color=colour, label=f"{mode}: download {c[mode]['bulk_mbps']:.1f} Mbit/s")
            delay.set_yscale("log")
            delay.set_ylabel("1 KB request time, ms")
            delay.set_title(f"{c['profile']}: p95 gain {c['ratio']['small_p95_ms']:.2f}x, "
                            f"page gain {c['ratio']['page_s']:.2f}x", fontsize=9)
            goodput.set_ylabel("client receives, Mbit/s")
            goodput.set_xlabel("seconds into the download (first run)")
            for ax in (delay, goodput):
                ax.axvline(3, color="tab:blue", lw=0.8, ls=":")   # the page load starts
                ax.legend(fontsize=7)
        fig.suptitle("Latency under load: a 1 KB request every 200 ms while a download runs "
                     "(dotted: the page load starts)")
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
    ap.add_argument("--reps", type=int, default=5)
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
