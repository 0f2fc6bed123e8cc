"""How close pep_radio's law is to the best a sender at the PEP could do, on a trace profile.

    python3 -m congestion.frontier [--profile 3g-trace|trace:PATH] [--targets 20,30,50,80] [--model PATH]
                                   [--starts 0,15,30,45] [--seconds 45] [--split] [--slowest N] [--unused N]

Runs the model (congestion/model.c, built by `make -C congestion model`) on the profile's link
(linkem/profiles.toml: its traces, delays, jitter and buffer) as `bench responsiveness` loads it: a
download, a 1 KB request every 200 ms, a page 3 s in; the floor is the requests alone. Two senders
at each queue target: the law, and the model's oracle, which sets the window from the link's true
capacity one round trip ago (every delivery opportunity, used or not: what no real sender sees).
Each figure is the mean over starts into the trace (four unless --starts says: `--starts 0` is the
lab's own stretch, for bench responsiveness starts every run at the trace's first frame; `--seconds`
is its length, 45 s on 3G and 20 elsewhere), as goodput over end-to-end CUBIC's (and
over what the trace offered, which compares with the lab's table) and request p95 over the floor's:
the two bars of issue 24 (bench/responsiveness.py has them), and the p95 of the radio queue's
delay (sampled every 10 ms, thousands of samples where the requests are a few hundred: steadier,
for comparing laws whose request p95 lies within a run's spread); a last row gives CUBIC's own.
The oracle's row is the frontier: a target where even it misses a bar is a pair of bars no law at the
PEP meets on that trace (in the model). `--split` adds two rows a target: the law told the link's rises
(its flows' shares from the oracle's window where that is larger) and the law told its falls (where it
is smaller), which split the oracle's lead into what knowing each is worth. `--slowest N` then names
the moments: the N requests the law took longest over on the first start, at the first target, each
beside what the oracle and the idle link took for the request begun at the same moment (every run
begins its requests on one clock), so that a p95 the law loses to the oracle can be read with the
model's `--series` where it is lost.
`--unused N` does the same for goodput: the N seconds of that run in which the law left the most of
the link's capacity unused beyond what the oracle left, each beside the capacity the trace offered
then and what the oracle and CUBIC left (the model's `--unused`).

This is a tuning aid built on the model, not a measurement: `bench responsiveness` measures.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys

from linkem import profiles

MODEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "model")
OFFSETS_S = (0, 15, 30, 45)   # four starts into the trace: one start's figures swing with its luck
SECONDS = 45                  # bench responsiveness's run on 3G, whose page needs it
PAGE_AT_S = 3
SENDERS = ("law", "oracle")
SPLIT = ("law+rises", "law+falls")   # the law told the oracle's window where it is larger, or smaller


def model_argv(model: str, profile: dict, offset: int, *extra: str, seconds: int = SECONDS) -> list[str]:
    """The model's command line for the profile's link (a profile as linkem.profiles.load gives it)."""
    link = profile["both"]
    return [model, "--delay", link["delay"], "--jitter", link.get("jitter", "0"), "--limit", link["limit_ms"],
            "--seconds", str(seconds), "--offset", str(offset), *extra,
            profiles.trace_path(profile["down"]["trace"]), profiles.trace_path(profile["up"]["trace"])]


def is_trace_profile(profile: dict) -> bool:
    """Whether the model can run the profile: traces both ways, and a delay and a buffer for both."""
    return all(k in profile["both"] for k in ("delay", "limit_ms")) and \
        all("trace" in profile[d] for d in ("down", "up"))


def sender_args(sender: str, target: int) -> tuple[str, ...]:
    """The model's arguments for the law, the oracle or CUBIC (which has no target) at a queue target,
    beside bench responsiveness's page."""
    return ("--target", str(target), "--page", str(PAGE_AT_S), *(("--sender", sender) if sender != "law" else ()))


def run_model(model: str, profile: dict, offset: int, *extra: str,
              seconds: int = SECONDS) -> subprocess.CompletedProcess:
    """The model, run on the profile's link; its failure stops the frontier, naming the command."""
    argv = model_argv(model, profile, offset, *extra, seconds=seconds)
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if proc.returncode:
        raise SystemExit(f"frontier: {' '.join(argv)}: {proc.stderr.strip()}")
    return proc


def run(model: str, profile: dict, offset: int, *extra: str, seconds: int = SECONDS) -> dict:
    """The model's figures for one run (its JSON)."""
    return json.loads(run_model(model, profile, offset, *extra, seconds=seconds).stdout)


REQUEST_LINE = re.compile(r"request at (?P<begun>[\d.]+) s: (?P<ms>[\d.]+) ms")  # the model's --requests lines
UNUSED_LINE = re.compile(r"second (?P<second>\d+): offered (?P<offered>\d+) B, unused (?P<unused>\d+) B")  # --unused


def request_times(model: str, profile: dict, offset: int, *extra: str, seconds: int = SECONDS) -> dict[float, float]:
    """How long each request took (ms), by when it began (s): the model's --requests lines."""
    times = {}
    for line in run_model(model, profile, offset, "--requests", *extra, seconds=seconds).stderr.splitlines():
        match = REQUEST_LINE.fullmatch(line)
        if match:
            times[float(match["begun"])] = float(match["ms"])
    return times


def slowest(model: str, profile: dict, target: int, count: int, offset: int = 0,
            seconds: int = SECONDS) -> list[dict]:
    """The `count` requests the law took longest over, in the order they began, each with what the
    oracle and the idle link took for the request begun at the same moment (None: it had not ended)."""
    times = {sender: request_times(model, profile, offset, *sender_args(sender, target), seconds=seconds)
             for sender in ("law", "oracle")}
    times["idle"] = request_times(model, profile, offset, "--idle", seconds=seconds)
    worst = sorted(times["law"], key=lambda begun: -times["law"][begun])[:count]
    return [{"begun_s": begun, **{sender: got.get(begun) for sender, got in times.items()}} for begun in sorted(worst)]


class NothingToCompare(Exception):
    """End-to-end CUBIC delivered nothing in any start: the trace offers too little there for a ratio."""


def frontier(model: str, profile: dict, targets: list[int], offsets: tuple[int, ...] = OFFSETS_S,
             seconds: int = SECONDS, senders: tuple[str, ...] = SENDERS) -> list[dict]:
    """Per sender and target: mean goodput over CUBIC's and request p95 over the floor's (ms), over the
    starts where CUBIC delivered something (a recording may hold minutes of a dead link: a start inside
    them has no ratio). Every row names those starts."""
    page = ("--page", str(PAGE_AT_S))
    base = {o: (run(model, profile, o, "--sender", "cubic", *page, seconds=seconds),
                run(model, profile, o, "--idle", seconds=seconds))
            for o in offsets}
    starts = [o for o in offsets if base[o][0]["goodput_mbps"] > 0]
    if not starts:
        raise NothingToCompare(f"end-to-end CUBIC delivered nothing in any start ({', '.join(map(str, offsets))} s "
                               f"into the trace, {seconds} s each): the link is down there; nothing to compare")
    rows = []
    for sender in senders:
        for target in targets:
            extra = sender_args(sender, target)
            goodput = offered = p95 = queue = 0.0
            for o in starts:
                got, (cubic, idle) = run(model, profile, o, *extra, seconds=seconds), base[o]
                goodput += got["goodput_mbps"] / cubic["goodput_mbps"]
                offered += got["goodput_mbps"] / got["offered_mbps"]
                p95 += got["p95_ms"] - idle["p95_ms"]
                queue += got["wait_p95_ms"]
            rows.append({"sender": sender, "target_ms": target, "goodput_over_cubic": goodput / len(starts),
                         "of_offered": offered / len(starts), "p95_over_idle_ms": p95 / len(starts),
                         "queue_p95_ms": queue / len(starts), "starts": starts})
    kept = [base[o] for o in starts]
    rows.append({"sender": "cubic", "target_ms": 0, "goodput_over_cubic": 1.0,
                 "of_offered": sum(c["goodput_mbps"] / c["offered_mbps"] for c, _ in kept) / len(kept),
                 "p95_over_idle_ms": sum(c["p95_ms"] - i["p95_ms"] for c, i in kept) / len(kept),
                 "queue_p95_ms": sum(c["wait_p95_ms"] for c, _ in kept) / len(kept), "starts": starts})
    return rows


def unused_by_second(model: str, profile: dict, offset: int, *extra: str,
                     seconds: int = SECONDS) -> dict[int, tuple[int, int]]:
    """Per second of the run: the downlink's bytes offered and those left unused (the model's --unused lines)."""
    got = {}
    for line in run_model(model, profile, offset, "--unused", *extra, seconds=seconds).stderr.splitlines():
        match = UNUSED_LINE.fullmatch(line)
        if match:
            got[int(match["second"])] = (int(match["offered"]), int(match["unused"]))
    return got


def most_unused(model: str, profile: dict, target: int, count: int, offset: int = 0,
                seconds: int = SECONDS) -> list[dict]:
    """The `count` seconds in which the law left the most bytes unused beyond what the oracle left, in
    time order: each with what the trace offered (Mbit/s) and the share of it the law, the oracle and
    end-to-end CUBIC left unused."""
    runs = {sender: unused_by_second(model, profile, offset, *sender_args(sender, target), seconds=seconds)
            for sender in ("law", "oracle", "cubic")}
    offered = {second: both[0] for second, both in runs["law"].items()}
    worst = sorted((s for s in offered if offered[s]),
                   key=lambda s: runs["oracle"][s][1] - runs["law"][s][1])[:count]
    return [{"second": s, "offered_mbps": offered[s] * 8 / 1e6,
             **{sender: got[s][1] / offered[s] for sender, got in runs.items()}} for s in sorted(worst)]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="frontier", description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="3g-trace",
                    help="a trace profile of linkem/profiles.toml, or trace:PATH for a recording (PATH.down and "
                         "PATH.up, mahimahi's format, at 50 ms RTT behind 500 ms buffers)")
    ap.add_argument("--targets", default="20,30,50,80", help="queue targets, ms, comma-separated")
    ap.add_argument("--model", default=MODEL, help="the model's binary (make -C congestion model)")
    ap.add_argument("--starts", default=",".join(map(str, OFFSETS_S)),
                    help="seconds into the trace where runs start, comma-separated (0: the lab's stretch)")
    ap.add_argument("--seconds", type=int, default=SECONDS, help="each run's length (the lab: 45 on 3G, else 20)")
    ap.add_argument("--slowest", type=int, default=0, metavar="N",
                    help="then the law's N slowest requests on the first start, at the first target, beside the "
                         "oracle's and the idle link's")
    ap.add_argument("--split", action="store_true",
                    help="also the law told the link's rises (the oracle's window where it is larger) and its "
                         "falls (where it is smaller): how much of the oracle's lead each is worth")
    ap.add_argument("--unused", type=int, default=0, metavar="N",
                    help="then the N seconds of that run in which the law left the most of the link unused beyond "
                         "what the oracle left, beside the oracle's and CUBIC's")
    args = ap.parse_args(argv)
    known = profiles.load()
    try:
        profile = profiles.recording(args.profile) or known.get(args.profile)
    except profiles.ProfileError as e:
        print(f"frontier: --profile: {e}", file=sys.stderr)
        return 2
    if not profile or not is_trace_profile(profile):
        traced = ", ".join(n for n, p in known.items() if is_trace_profile(p))
        print(f"frontier: --profile {args.profile}: not a trace profile of linkem/profiles.toml "
              f"(those are: {traced}), nor {profiles.RECORDING_PREFIX}PATH of a recording", file=sys.stderr)
        return 2
    try:
        targets = [int(t) for t in args.targets.split(",")]
    except ValueError:
        print(f"frontier: --targets {args.targets}: give whole ms, comma-separated (20,30,50)", file=sys.stderr)
        return 2
    try:
        offsets = tuple(int(o) for o in args.starts.split(","))
    except ValueError:
        offsets = ()
    if not offsets or min(offsets) < 0:
        print(f"frontier: --starts {args.starts}: give whole seconds into the trace, comma-separated (0,15,30)",
              file=sys.stderr)
        return 2
    if args.seconds < 5:
        print(f"frontier: --seconds {args.seconds}: a run needs 5 s at least (its page starts {PAGE_AT_S} s in)",
              file=sys.stderr)
        return 2
    for flag, count, what in (("--slowest", args.slowest, "requests"), ("--unused", args.unused, "seconds")):
        if count < 0:
            print(f"frontier: {flag} {count}: give how many {what} to list (0: none)", file=sys.stderr)
            return 2
    if not os.access(args.model, os.X_OK):
        print(f"frontier: --model {args.model}: no such program; build it: make -C congestion model",
              file=sys.stderr)
        return 2
    try:
        rows = frontier(args.model, profile, targets, offsets, args.seconds, SENDERS + SPLIT if args.split else SENDERS)
    except NothingToCompare as e:
        print(f"frontier: --profile {args.profile}: {e}", file=sys.stderr)
        return 2
    starts = rows[0]["starts"]
    left_out = [o for o in offsets if o not in starts]
    print(f"{args.profile}: mean of {len(starts)} start{'s' if len(starts) > 1 else ''} "
          f"({', '.join(map(str, starts))} s in), {args.seconds} s each" +
          (f" (at {', '.join(map(str, left_out))} s in, CUBIC delivered nothing: left out)" if left_out else ""))
    print(f"{'sender':9} {'target ms':>9} {'goodput / CUBIC':>15} {'of offered':>10} {'p95 over idle ms':>16} "
          f"{'queue p95 ms':>12}")
    for r in rows:
        target = r["target_ms"] or "-"
        print(f"{r['sender']:9} {target:>9} {r['goodput_over_cubic']:>15.2f} {r['of_offered']:>10.2f} "
              f"{r['p95_over_idle_ms']:>+16.0f} {r['queue_p95_ms']:>12.0f}")
    if args.slowest:
        print(f"\nthe law's {args.slowest} slowest requests at {targets[0]} ms, {starts[0]} s in (ms; -: not ended):")
        print(f"{'begun s':>8} {'law':>6} {'oracle':>6} {'idle':>6}")
        for r in slowest(args.model, profile, targets[0], args.slowest, starts[0], args.seconds):
            print(f"{r['begun_s']:>8.1f} " + " ".join(f"{r[s]:>6.0f}" if r[s] is not None else f"{'-':>6}"
                                                       for s in ("law", "oracle", "idle")))
    if args.unused:
        print(f"\nthe {args.unused} seconds the law left most unused beyond the oracle at {targets[0]} ms, "
              f"{starts[0]} s in (share of what the trace offered):")
        print(f"{'second':>6} {'offered Mbit/s':>14} {'law':>5} {'oracle':>6} {'cubic':>5}")
        for r in most_unused(args.model, profile, targets[0], args.unused, starts[0], args.seconds):
            print(f"{r['second']:>6} {r['offered_mbps']:>14.2f} {r['law']:>5.2f} {r['oracle']:>6.2f} "
                  f"{r['cubic']:>5.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
