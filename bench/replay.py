"""bench replay: pep-replay is not the bottleneck of the lab's measurements.

One lab without the proxy (the pep namespace routes). Alternating REPS times,
one request per connection, 1 KB objects, the same concurrency:
  wrk         -> nginx at 198.19.0.10 (`Connection: close`)
  pep-replay  -> pep-replay server at 198.19.0.11-20, the http_small profile at size=1k,
                 from 241 client addresses
Reported: transactions/s, medians, and the ratio pep-replay / wrk, the median of the reps'
back-to-back pairs (it must be at least 1: the traffic player keeps up with the reference client).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
from contextlib import ExitStack

from netns.handle import REPO
from pepctl.runner import wait_for

from .common import git_rev, labs, median, paired_ratio, write_report
from .proxy import wrk

REPLAY = os.path.join(REPO, "replay", "pep-replay")


def compile_profile(tmp: str, profile: str, size: str) -> str:
    """trex-profiles/PROFILE at one object size, served by 198.19.0.11-20 (nginx keeps .10)."""
    out = os.path.join(tmp, f"{size}.json")
    subprocess.run([sys.executable, os.path.join(REPO, "replay", "compile_profile.py"),
                    os.path.join(REPO, "trex-profiles", profile), out, "-t", f"size={size}",
                    "-t", "servers=198.19.0.11-198.19.0.20"], check=True, capture_output=True, timeout=120)
    return out


def replay_tps(lab, profile: str, seconds: float, conns: int) -> float:
    out = os.path.join(lab.run_dir, "replay-client.json")
    lab.run("client", REPLAY, "client", "--profile", profile, "--duration", f"{seconds:g}", "--concurrency",
            str(conns), "--quiet", "--json", out, timeout=seconds + 60)
    with open(out) as f:
        rep = json.load(f)
    assert rep["counters"]["transactions_failed"] == 0, f"pep-replay: failed transactions: {rep['errors']}"
    return rep["rates"]["transactions_per_s"]


def main() -> int:
    ap = argparse.ArgumentParser(prog="bench replay", description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=4)
    ap.add_argument("--concurrency", type=int, default=64)
    args = ap.parse_args()
    samples: dict[str, list[float]] = {"wrk": [], "pep-replay": []}
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="plbench-") as tmp:
        profile = compile_profile(tmp, "http_small.py", "1k")
        lab = labs(stack, {"routed": ["--no-proxy"]})["routed"]
        for i in range(11, 251):
            lab.run("client", "ip", "addr", "add", f"198.18.0.{i}/24", "dev", "eth0")
        for i in range(11, 21):
            lab.run("origin", "ip", "addr", "add", f"198.19.0.{i}/24", "dev", "eth0")
        server = lab.popen("origin", REPLAY, "server", "--profile", profile, "--duration", "3600", "--quiet")
        try:
            wait_for(lambda: lab.run("origin", "ss", "-Hltn", "sport = :80", check=False).stdout.count("\n") >= 11,
                     timeout=5, what="pep-replay server listening")
            for rep in range(args.reps):
                for tool in ("wrk", "pep-replay") if rep % 2 == 0 else ("pep-replay", "wrk"):
                    if tool == "wrk":
                        r = wrk(lab, "/1k", args.seconds, args.concurrency, close=True)
                        assert r["errors"] + r["status_errors"] == 0, f"wrk errors: {r}"
                        samples[tool].append(r["requests"] / (r["duration_us"] / 1e6))
                    else:
                        samples[tool].append(replay_tps(lab, profile, args.seconds, args.concurrency))
                    print(f"rep {rep + 1}/{args.reps} {tool:<10} {samples[tool][-1]:10,.0f} transactions/s", flush=True)
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=15)
    w, p = median(samples["wrk"]), median(samples["pep-replay"])
    ratio = paired_ratio(samples["pep-replay"], samples["wrk"])   # each rep runs the two back to back
    table = [["client (1 KB, one request per connection)", "transactions/s", "ratio to wrk (paired)"],
             ["wrk -> nginx", f"{w:,.0f}", "1.00"], ["pep-replay -> pep-replay server", f"{p:,.0f}", f"{ratio:.2f}"]]

    def plot(plt):
        fig, ax = plt.subplots(figsize=(5, 3.5))
        ax.bar(["wrk", "pep-replay"], [w, p], color=["#888", "#37a"])
        ax.set_ylabel("transactions/s")
        ax.set_title(f"lab without proxy, c={args.concurrency}: paired ratio {ratio:.2f}")
        return fig

    write_report("replay", {"reps": args.reps, "seconds": args.seconds, "concurrency": args.concurrency,
                            "commit": git_rev(), "command": "./scripts/bench replay",
                            "results": {"wrk_tps": w, "replay_tps": p, "ratio": ratio, "ratio_of_medians": p / w,
                                        "samples": samples}},
                 table, plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
