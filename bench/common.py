"""What every benchmark shares: labs side by side, medians, and the report (JSON + PNG + table)."""

from __future__ import annotations

import json
import os
import platform
import secrets
import statistics
import subprocess
import time
from contextlib import ExitStack

import matplotlib.pyplot as plt

from netns.addresses import ORIGIN4
from netns.handle import REPO, LabHandle

RESULTS = os.environ.get("PEP_RESULTS", os.path.join(REPO, "results"))


def labs(stack: ExitStack, variants: dict[str, list[str]]) -> dict[str, LabHandle]:
    """Bring up one lab per variant at once, so measurements can alternate between them."""
    out = {}
    for name, options in variants.items():
        out[name] = stack.enter_context(LabHandle.up(f"b{secrets.token_hex(3)}", options))
    return out


def process_cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def exporter_cpu_seconds(lab: LabHandle) -> float:
    """CPU time the lab's metrics exporter has used (its PID file is in the instance's folder)."""
    with open(lab.config().instance_names().exporter_pid) as f:
        return process_cpu_seconds(int(f.read()))


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def paired_ratio(a: list[float], b: list[float]) -> float:
    """The median of a[i] / b[i], for samples taken back to back in rep i. A shared 2-core machine
    drifts (one variant ran at 14k and 20k connections/s in one run): a ratio of two samples taken
    together sees the same machine, and the median over reps drops a rep whose machine changed
    between them. A ratio of two medians may divide samples of different reps."""
    if len(a) != len(b) or not a:
        raise ValueError(f"paired_ratio: need as many samples of each, got {len(a)} and {len(b)}")
    return statistics.median(x / y for x, y in zip(a, b, strict=True))


def iperf3(lab: LabHandle, *client_args: str, server: str = ORIGIN4, seconds: float = 4) -> dict:
    """One bounded iperf3 run from the client to an iperf3 server started in the origin for it."""
    srv = lab.popen("origin", "iperf3", "-s", "-1", "-B", server, "-p", "5201")
    try:
        deadline = time.monotonic() + 5
        while True:
            probe = lab.run("origin", "ss", "-Hltn", "sport = :5201", check=False).stdout
            if probe.strip() or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        proc = lab.run("client", "iperf3", "-c", server, "-p", "5201", "-t", str(seconds), "-J", *client_args,
                       timeout=seconds + 30, check=False)
        return json.loads(proc.stdout)
    finally:
        srv.kill()
        srv.wait()


def write_report(name: str, data: dict, table: list[list[str]], plot) -> str:
    """Write results/NAME.json and NAME.png, print the table; return the JSON path."""
    os.makedirs(RESULTS, exist_ok=True)
    data = {"benchmark": name, "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "host": {"kernel": platform.release(), "cpus": os.cpu_count()}, **data}
    path = os.path.join(RESULTS, f"{name}.json")
    with open(path, "w") as f:
        json.dump(data, f, indent=2)
    plt.switch_backend("Agg")   # files only: no display
    fig = plot(plt)
    png = os.path.join(RESULTS, f"{name}.png")
    fig.savefig(png, dpi=110, bbox_inches="tight")
    print_table(table)
    print(f"\nJSON: {os.path.relpath(path, REPO)}   plot: {os.path.relpath(png, REPO)}")
    return path


def print_table(rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for i, r in enumerate(rows):
        print("| " + " | ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(r, widths,
                                                                                                  strict=True)))
              + " |")
        if i == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")


def git_rev() -> str:
    """The commit measured, with -dirty when the tree had changes not yet committed."""
    return subprocess.run(["git", "-C", REPO, "describe", "--always", "--dirty"], capture_output=True,
                          text=True).stdout.strip()
