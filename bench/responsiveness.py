"""bench responsiveness: does the phone stay responsive while something downloads? Transports side by side.

Two labs, one per access-side transport of the PEP, on the same link profiles (default: every
trace-driven profile, whose capacity swings, bursts and stops behind deep drop-tail buffers, and
the fixed-rate lossy ones). For each profile, REPS times, in an order that turns each rep:
  pep_radio  split at HAProxy, pep_radio toward the subscriber (congestion/), CUBIC to the origin
  bbr        split at HAProxy, BBR toward the subscriber
  e2e        every lab client bypassed (a bypass rule): CUBIC end to end fills the buffer
  idle       the floor: the same small requests on the idle link (bypassed), nothing else
Each run starts the link's traces over (the profile is set again), so every transport meets the
same capacity, second by second. A profile trace:PATH replays one's own recording (PATH.down and
PATH.up, mahimahi's format) at 50 ms base RTT behind 500 ms drop-tail buffers.
Each run, for SECONDS (3G profiles: 45 s, MIN_SECONDS):
  bulk        one download of the lab's 1 GB object, cut at SECONDS: its goodput (what arrived / the
              time), and that as a share of what the link offered over the same seconds (a trace's
              opportunities, or a fixed rate)
  small       a 1 KB request-response on a connection of its own every 200 ms, on a fixed schedule
              (netns/probe_requests.py: a slow one does not hold back the next): its time from
              connect to the last byte: p50, p95, p99 of every rep's requests together
  page        30 objects over 6 connections (curl --parallel: 10 of 100 KB, 20 of 1 KB), started
              3 s into the download: its completion time
Reported per profile and transport: medians over reps (request times: percentiles over every rep's
requests together), the request p95 over the idle floor's, goodput over e2e's, and whether the
transport is never worse than e2e on p50, p95 and page load; JSON, a plot of request time and
goodput over one run's time, and a markdown table. --queue-target MS runs pep_radio at another
target than the config's default (what a graph's queue_target_ms would give, on one's own traces).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import statistics
import sys
from contextlib import ExitStack

from linkem import profiles as link_profiles
from netns.handle import LabHandle
from netns.workloads import link_words, one_run, profile_label, set_mode, set_profile, small_percentiles

from .common import RESULTS, git_rev, labs, median, write_report

TRACE_PROFILES = ["lte-trace", "5g-trace", "3g-trace", "drive-trace"]
LOSSY_PROFILES = ["lte", "3g", "wifi-lossy"]
PROFILES = TRACE_PROFILES + LOSSY_PROFILES
TRANSPORTS = ["pep_radio", "bbr", "e2e"]
PROXIED = {"pep_radio": ["--congestion", "pep_radio"], "bbr": ["--congestion", "bbr"]}
# A run lasts --seconds, or longer where the page needs it: on 3G (about 2 Mbit/s down, shared
# with the download) the page's 1 MB took 15-20 s, at the edge of a 20 s run.
MIN_SECONDS = {"3g-trace": 45.0, "3g": 45.0}
# The bar (24): a request's p95 under load within this of the idle link's.
P95_OVER_IDLE_MS = {"3g-trace": 300.0, "3g": 300.0}
P95_OVER_IDLE_DEFAULT_MS = 150.0
GOODPUT_OVER_E2E = 0.85


def link_params(profile: str) -> dict[str, str]:
    """linkem's parameters for a profile (or trace:PATH), by direction: {"b2a.trace": ..., ...}.
    ProfileError for a name linkem/profiles.toml lacks or a recording whose files are missing."""
    name, *overrides = link_words(profile)
    return dict(w.split("=", 1) for w in link_profiles.profile_words(name, overrides))


def offered_mbps(profile: str, seconds: float) -> float | None:
    """What the profile's downlink can carry over the first `seconds` of a run: a trace's 1500-byte
    opportunities (the trace starts over with the run and loops), or its fixed rate; None: no limit."""
    words = link_params(profile)
    trace, rate = words.get("b2a.trace"), words.get("b2a.rate")
    if trace and trace != "none":
        with open(trace) as f:
            ms = [int(line) for line in f if line.strip()]
        period, whole = ms[-1], int(seconds * 1000)
        count = (whole // period) * len(ms) + sum(1 for t in ms if t < whole % period)
        return count * 1500 * 8 / seconds / 1e6
    if rate:
        # linkem's rate words (linkem/README.md): bit/s with an optional k/M/G (x1000) and bit/bps
        m = re.fullmatch(r"([\d.]+)([kMG]?)(?:bit|bps)?", rate)
        return float(m.group(1)) * {"": 1e-6, "k": 1e-3, "M": 1.0, "G": 1e3}[m.group(2)] if m else None
    return None


def page_median(times: list[float]) -> float:
    """The median page load over runs, a page that did not load (NaN: workloads.one_run) counted as
    slower than any that did; NaN when none was loaded (the idle floor loads none). A NaN in the
    list made the median itself NaN, and e2e's NaN then made every transport "worse than e2e"."""
    if all(math.isnan(t) for t in times):
        return float("nan")
    return median([math.inf if math.isnan(t) else t for t in times])


def summarize(samples: list[dict]) -> dict:
    """Goodput and page load: medians over runs. Request times: percentiles of every run's requests
    together (a p99 of one run's 100 requests is its second-worst; of 500, its fifth)."""
    out = {"bulk_mbps": median([r["bulk_mbps"] for r in samples]),
           "page_s": page_median([r["page_s"] for r in samples])}
    out.update(small_percentiles([x for r in samples for _, x in r["small_series"]]))
    out["small_failed"] = sum(r["small_failed"] for r in samples)
    estimates = [x for r in samples for x in r.get("bbr_bw_mbps", [])]
    if estimates:
        out["bbr_bw_mbps"] = median(estimates)
    return out


def verdicts(profile: str, med: dict, offered: float | None) -> dict:
    """Per transport: request p95 over the idle floor's, goodput over e2e's and over what the link
    offered, and the issue's bars (within P95_OVER_IDLE of idle, GOODPUT_OVER_E2E of e2e, never
    worse than e2e on p50, p95 or page load). Without e2e in the run, the bars that need it are
    None (not judged)."""
    idle, e2e = med["idle"], med.get("e2e")
    bar = P95_OVER_IDLE_MS.get(profile, P95_OVER_IDLE_DEFAULT_MS)
    out = {}
    for t, m in med.items():
        if t == "idle":
            continue
        v = {"p95_over_idle_ms": m["small_p95_ms"] - idle["small_p95_ms"],
             "goodput_over_e2e": m["bulk_mbps"] / e2e["bulk_mbps"] if e2e and e2e["bulk_mbps"] else float("nan"),
             "goodput_share_offered": m["bulk_mbps"] / offered if offered else float("nan")}
        v["p95_within_bar"] = v["p95_over_idle_ms"] <= bar
        v["goodput_bar"] = v["goodput_over_e2e"] >= GOODPUT_OVER_E2E if e2e else None
        v["never_worse_than_e2e"] = (all(m[k] <= e2e[k] for k in ("small_p50_ms", "small_p95_ms", "page_s"))
                                     if e2e else None)
        v["meets_all"] = (v["p95_within_bar"] and v["goodput_bar"] and v["never_worse_than_e2e"]) if e2e else None
        out[t] = v
    return out


def run_profiles(lab: dict[str, LabHandle], profiles: list[str], transports: list[str], reps: int,
                 seconds: float) -> list[dict]:
    base = lab[next(t for t in transports if t in PROXIED)]   # where e2e and idle run: bypassed, as any lab
    modes = ["idle", *transports]
    results = []
    for profile in profiles:
        secs = max(seconds, MIN_SECONDS.get(profile, 0.0))
        label = profile_label(profile)
        samples: dict[str, list[dict]] = {m: [] for m in modes}
        for rep in range(reps):
            for mode in modes[rep % len(modes):] + modes[:rep % len(modes)]:
                where = lab[mode] if mode in PROXIED else base
                set_mode(where, "proxy" if mode in PROXIED else "e2e")
                # Set again before every run: the traces start over with its first frame, so every
                # transport meets the same capacity, second by second.
                set_profile(where, profile)
                r = one_run(where, secs, load=mode != "idle", bbr_estimates=mode == "bbr")
                samples[mode].append(r)
                print(f"{label:12} rep {rep + 1}/{reps} {mode:9}: bulk {r['bulk_mbps']:7.2f} Mbit/s, 1 KB "
                      f"p50/p95/p99 {r['small_p50_ms']:6.0f}/{r['small_p95_ms']:6.0f}/{r['small_p99_ms']:6.0f} ms, "
                      f"page {r['page_s']:5.2f} s", flush=True)
            set_mode(base, "proxy")
        med = {m: summarize(samples[m]) for m in modes}
        offered = offered_mbps(profile, secs)
        bbr_over = med.get("bbr", {}).get("bbr_bw_mbps", 0) / offered if offered else None
        if bbr_over:
            # Radio links deliver in grants: BBR's max filter reads their bursts as capacity (issue 24).
            print(f"{label:12} BBR's bandwidth estimate (median): {bbr_over:.2f} x what the link offered", flush=True)
        results.append({"profile": label, "link": link_words(profile), "seconds": secs, "offered_mbps": offered,
                        "bbr_estimate_over_offered": bbr_over, "samples": samples,
                        "medians": med, "verdicts": verdicts(profile, med, offered)})
    return results


def favoured(results: list[dict], transports: list[str]) -> str:
    """The transport the measurements favour: the most profiles where it meets every bar, then the
    lowest sum of request p95 over the idle floor."""
    proxied = [t for t in transports if t in PROXIED]

    def score(t: str) -> tuple:
        return (-sum(bool(c["verdicts"][t]["meets_all"]) for c in results),
                sum(c["verdicts"][t]["p95_over_idle_ms"] for c in results))
    return min(proxied, key=score) if proxied else ""


def table(results: list[dict], transports: list[str]) -> list[list[str]]:
    rows = [["profile", "transport", "goodput Mbit/s", "of offered", "vs e2e", "1 KB p50 ms", "p95 ms",
             "p95 over idle", "p99 ms", "page s", "bars met"]]
    for c in results:
        for t in ["idle", *transports]:
            m, v = c["medians"][t], c["verdicts"].get(t)
            share = f"{v['goodput_share_offered']:.2f}" if v and c["offered_mbps"] else "-"
            rows.append([c["profile"], t, f"{m['bulk_mbps']:.2f}" if t != "idle" else "-", share,
                         f"{v['goodput_over_e2e']:.2f}" if v else "-", f"{m['small_p50_ms']:.0f}",
                         f"{m['small_p95_ms']:.0f}", f"{v['p95_over_idle_ms']:+.0f}" if v else "-",
                         f"{m['small_p99_ms']:.0f}", f"{m['page_s']:.2f}" if t != "idle" else "-",
                         bars_text(v) if v and t != "e2e" else "-"])
    return rows


def bars_text(v: dict) -> str:
    """Which of the issue's bars the transport met: p95 near idle, goodput, never worse than e2e
    (-: not judged, e2e did not run)."""
    return "/".join(("-" if v[k] is None else "yes" if v[k] else "NO")
                    for k in ("p95_within_bar", "goodput_bar", "never_worse_than_e2e"))


COLOURS = {"pep_radio": "tab:green", "bbr": "tab:orange", "e2e": "tab:grey", "idle": "tab:blue"}


def plot_runs(results: list[dict], transports: list[str]):
    def plot(plt):
        fig, axes = plt.subplots(2, len(results), figsize=(4.2 * len(results), 6), squeeze=False, sharex="col")
        for col, c in enumerate(results):
            delay, goodput = axes[0][col], axes[1][col]
            for mode in ["idle", *transports]:
                run = c["samples"][mode][0]
                m = c["medians"][mode]
                delay.plot([t for t, _ in run["small_series"]], [x * 1000 for _, x in run["small_series"]], ".-",
                           color=COLOURS.get(mode), ms=2, lw=0.6, label=f"{mode}: p95 {m['small_p95_ms']:.0f} ms")
                if mode != "idle":
                    goodput.plot([t for t, _ in run["goodput_series"]], [r for _, r in run["goodput_series"]], "-",
                                 color=COLOURS.get(mode), lw=0.8, label=f"{mode}: {m['bulk_mbps']:.1f} Mbit/s")
            delay.set_yscale("log")
            delay.set_title(c["profile"], fontsize=9)
            goodput.set_xlabel("seconds into the run (first rep)")
            for ax in (delay, goodput):
                ax.legend(fontsize=6)
        axes[0][0].set_ylabel("1 KB request time, ms")
        axes[1][0].set_ylabel("client receives, Mbit/s")
        fig.suptitle("A 1 KB request every 200 ms while a download runs, per access-side transport")
        fig.tight_layout()
        return fig
    return plot


def write_markdown(path: str, results: list[dict], transports: list[str], reps: int, command: str,
                   best: str) -> None:
    with open(path, "w") as f:
        f.write(f"Medians of {reps} runs each, transports alternating (`{command}`). Request times are "
                f"percentiles of every run's requests together; \"p95 over idle\" is the transport's p95 less the "
                f"idle link's; \"vs e2e\" is goodput over end-to-end CUBIC's; bars met: p95 within "
                f"{P95_OVER_IDLE_DEFAULT_MS:.0f} ms of idle (3G: 300) / goodput at least {GOODPUT_OVER_E2E:.0%} "
                f"of e2e / never worse than e2e on p50, p95 and page load. The measurements favour: "
                f"**{best}**.\n\n")
        rows = table(results, transports)
        f.write("| " + " | ".join(rows[0]) + " |\n|" + "---|" * len(rows[0]) + "\n")
        for r in rows[1:]:
            f.write("| " + " | ".join(r) + " |\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench responsiveness", description=__doc__.splitlines()[0])
    ap.add_argument("--profiles", default=",".join(PROFILES),
                    help="linkem profiles (linkem/profiles.toml), or trace:PATH for PATH.down and PATH.up (mahimahi "
                         "traces of one's own, at 50 ms RTT behind 500 ms buffers)")
    ap.add_argument("--transports", default=",".join(TRANSPORTS),
                    help=f"comma-separated subset of {', '.join(TRANSPORTS)} (the idle floor always runs)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=20, help="length of each run (the bulk download's cap)")
    ap.add_argument("--name", default="responsiveness", help="results/NAME.json, .png and .md")
    ap.add_argument("--queue-target", type=int, metavar="MS",
                    help="pep_radio's queue target, ms ([graph.access] queue_target_ms; default the config's)")
    args = ap.parse_args(argv)
    transports = [t for t in args.transports.split(",") if t]
    bad = [t for t in transports if t not in TRANSPORTS]
    if bad or not any(t in PROXIED for t in transports):
        ap.error(f"--transports {args.transports}: use {', '.join(TRANSPORTS)}, with pep_radio or bbr among them")
    profiles = [p for p in args.profiles.split(",") if p]
    try:   # every profile checked before any lab is up: a typo fails at once, not after an hour of runs
        for profile in profiles:
            link_params(profile)
    except link_profiles.ProfileError as e:
        ap.error(f"--profiles: {e}")
    command = "./scripts/bench responsiveness " + " ".join(sys.argv[1:] if argv is None else argv)
    with ExitStack() as stack:
        target = ["--queue-target", str(args.queue_target)] if args.queue_target else []
        lab = labs(stack, {t: ["--link", "none", *PROXIED[t], *(target if t == "pep_radio" else [])]
                           for t in transports if t in PROXIED})
        results = run_profiles(lab, profiles, transports, args.reps, args.seconds)
    for c in results:
        c["p95_spread_ms"] = {m: statistics.pstdev([r["small_p95_ms"] for r in c["samples"][m]])
                              for m in c["samples"]}
    best = favoured(results, transports)
    write_report(args.name, {"command": command, "commit": git_rev(), "reps": args.reps, "seconds": args.seconds,
                             "queue_target_ms": args.queue_target, "transports": transports, "favoured": best,
                             "profiles": results},
                 table(results, transports), plot_runs(results, transports))
    write_markdown(os.path.join(RESULTS, f"{args.name}.md"), results, transports, args.reps, command, best)
    print(f"the measurements favour: {best}")
    print(f"markdown table: results/{args.name}.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
