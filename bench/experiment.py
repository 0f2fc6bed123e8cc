"""bench experiment: the control group's gain on live traffic against bench pep-gain's, one cell.

The acceptance of the control group (issue 14): in the lab with the lossy access link (50 ms
RTT, 1% loss, 100 Mbit/s both ways, a buffer of one RTT), the same run measures
  pep-gain    bench pep-gain's own measurement of the cell (bench/pep_gain.py run_grid): 10 MB
              downloads with curl, proxied and end-to-end (a bypass rule) alternating, REPS each,
              on a lab without the experiment;
  experiment  a lab with `[graph.experiment] control_fraction = F`: SECONDS of pep-replay traffic
              (trex-profiles/http_large.py at size=10m, RATE new connections/s from 241 client
              addresses, so about F of them in the control group), then `pepctl report`: the
              median goodput of treated (proxied) over control (bypassed) flows, with its 95%
              bootstrap interval.
Reported: both gains and their ratio, which the acceptance wants within 25% of 1.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
from contextlib import ExitStack
from types import SimpleNamespace

from netns.addresses import CLIENT4
from netns.handle import REPO
from netns.workloads import set_link
from pepctl.runner import wait_for

from .common import git_rev, labs, write_report
from .pep_gain import run_grid
from .replay import compile_profile

REPLAY = os.path.join(REPO, "replay", "pep-replay")
SIZE_CLASS = "10M+"           # a 10 MiB object, as pepctl/experiment.py classes it
PEP_GAIN_KEY = "down_10MB_mbps"


def replay_traffic(lab, profile: str, seconds: float, rate: float, drain_s: float) -> dict:
    for i in range(11, 251):
        lab.run("client", "ip", "addr", "add", f"198.18.0.{i}/24", "dev", "eth0", check=False)
    for i in range(11, 21):
        lab.run("origin", "ip", "addr", "add", f"198.19.0.{i}/24", "dev", "eth0", check=False)
    # The server's default timeout (10 s) would reset an end-to-end 10 MB transfer (about 30 s here).
    server = lab.popen("origin", REPLAY, "server", "--profile", profile, "--duration", "3600", "--timeout",
                       str(int((seconds + drain_s + 60) * 1000)), "--quiet")
    out = os.path.join(lab.run_dir, "experiment-client.json")
    try:
        wait_for(lambda: lab.run("origin", "ss", "-Hltn", "sport = :80", check=False).stdout.count("\n") >= 10,
                 timeout=5, what="pep-replay server listening")
        lab.run("client", REPLAY, "client", "--profile", profile, "--duration", f"{seconds:g}", "--rate",
                f"{rate:g}", "--drain", str(int(drain_s * 1000)), "--timeout", str(int(drain_s * 1000 + 60000)),
                "--clients", f"{CLIENT4}-198.18.0.250", "--quiet", "--json", out, check=False,
                timeout=seconds + drain_s + 120)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=15)
    with open(out) as f:
        return json.load(f)


def report_of(lab) -> dict:
    out = os.path.join(lab.run_dir, "experiment-report.json")
    proc = lab.pepctl("report", "--json", out, "--plot", os.path.join(lab.run_dir, "experiment-report.svg"))
    print(proc.stdout, flush=True)
    with open(out) as f:
        return json.load(f)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench experiment", description=__doc__.splitlines()[0])
    ap.add_argument("--fraction", type=float, default=0.2, help="control_fraction (default 0.2)")
    ap.add_argument("--seconds", type=float, default=120, help="seconds of pep-replay traffic (default 120)")
    ap.add_argument("--rate", type=float, default=0.25, help="new connections/s of 10 MB objects (default 0.25)")
    ap.add_argument("--drain", type=float, default=60, help="seconds for flows still running at the end")
    ap.add_argument("--reps", type=int, default=3, help="pep-gain's repetitions of the cell (default 3)")
    ap.add_argument("--cap", type=float, default=30, help="pep-gain's cap on a transfer, s (default 30)")
    args = ap.parse_args(argv)
    cell = (50, 1, 100)
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="plbench-") as tmp:
        profile = compile_profile(tmp, "http_large.py", "10m")
        both = labs(stack, {"gain": ["--link", "none"],
                            "experiment": ["--link", "none", "--control-fraction", f"{args.fraction:g}"]})
        grid_args = SimpleNamespace(reps=args.reps, sizes=[10], cap=args.cap, shorts=0, directions=["down"])
        gain_cell = run_grid(both["gain"], [cell], grid_args, log=lambda m: print(m, flush=True))[0]
        exp = both["experiment"]
        set_link(exp, *cell)
        client = replay_traffic(exp, profile, args.seconds, args.rate, args.drain)
        rep = report_of(exp)
    pep_gain = gain_cell["ratio"][PEP_GAIN_KEY]
    row = next(r for r in rep["rows"] if r["graph"] == "all" and r["size"] == SIZE_CLASS)
    live = row["goodput_gain"]
    agreement = live["value"] / pep_gain
    table = [["10 MB downloads, 50 ms / 1% / 100 Mbit/s", "PEP gain", "95% interval", "flows (treated / control)"],
             ["bench pep-gain (curl, proxied vs bypassed)", f"{pep_gain:.2f}", "-",
              f"{args.reps} / {args.reps}"],
             [f"pepctl report (pep-replay, control_fraction {args.fraction:g})", f"{live['value']:.2f}",
              f"[{live['low']:.2f}, {live['high']:.2f}]", f"{row['treated']['flows']} / {row['control']['flows']}"],
             ["report / pep-gain", f"{agreement:.2f}", "acceptance: 0.75-1.25", ""]]

    def plot(plt):
        fig, ax = plt.subplots(figsize=(5.5, 3.5))
        ax.bar(["bench pep-gain", "pepctl report"], [pep_gain, live["value"]], color=["#888", "#37a"],
               yerr=[[0, live["value"] - live["low"]], [0, live["high"] - live["value"]]], capsize=6)
        ax.set_ylabel("goodput gain (proxied / end-to-end)")
        ax.set_title(f"10 MB, 50 ms RTT, 1% loss, 100 Mbit/s: ratio {agreement:.2f}")
        return fig

    write_report("experiment", {"command": "./scripts/bench experiment " + " ".join(sys.argv[1:] if argv is None
                                                                                   else argv),
                                "commit": git_rev(), "cell": {"rtt_ms": 50, "loss_pct": 1, "rate_mbit": 100},
                                "args": vars(args), "pep_gain": gain_cell, "replay_client": client, "report": rep,
                                "results": {"pep_gain": pep_gain, "report_gain": live, "ratio": agreement}},
                 table, plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
