"""bench linkem: what the access-link emulator can carry, and what it costs.

Two labs side by side, both with the proxy off (the pep namespace routes):
  direct   client -- switch: a plain veth
  linkem   client -- linkem (userspace, AF_PACKET) -- switch, no impairment but the delay
Measured from client to origin with one iperf3 TCP stream (after a warm-up that
iperf3 omits), alternating REPS times:
  direct      no emulator
  linkem 0    linkem with no delay
  linkem 50   linkem with 25 ms each way (50 ms RTT), the acceptance point: >= 1 Gbit/s
Reported: medians of Gbit/s, the ratio to direct, linkem's CPU (both threads, % of
one core) and the frames the kernel dropped before linkem read them (drop_rx).
The benchmarks of the PEP run the link at 20 and 100 Mbit/s: far below what this shows.
"""

from __future__ import annotations

import argparse
import os
from contextlib import ExitStack

from .common import git_rev, iperf3, labs, median, process_cpu_seconds, write_report

TARGET_GBPS = 1.0
VARIANTS = {"direct": ("direct", None), "linkem 0 ms": ("linkem", 0), "linkem 50 ms RTT": ("linkem", 25)}


def linkem_pid(lab) -> int:
    with open(os.path.join(lab.run_dir, "linkem.pid")) as f:
        return int(f.read().strip())


def drop_rx(lab) -> int:
    stats = lab.status()["access_link"]["stats"]
    return stats["a2b"]["drop_rx"] + stats["b2a"]["drop_rx"]


def measure(lab, delay_ms: float | None, seconds: float) -> dict:
    if delay_ms is None:
        res = iperf3(lab, "-O", "2", seconds=seconds + 2)
        return {"gbps": res["end"]["sum_received"]["bits_per_second"] / 1e9}
    proc = lab.run_pep_lab("link", "none", f"delay={delay_ms:g}")
    assert proc.returncode == 0, f"pep-lab link none delay={delay_ms:g}: {proc.stderr}"
    pid, drops = linkem_pid(lab), drop_rx(lab)
    cpu0 = process_cpu_seconds(pid)
    res = iperf3(lab, "-O", "2", seconds=seconds + 2)
    wall = res["end"]["sum_received"]["seconds"] + 2
    return {"gbps": res["end"]["sum_received"]["bits_per_second"] / 1e9,
            "linkem_cpu_pct": 100 * (process_cpu_seconds(pid) - cpu0) / wall, "drop_rx": drop_rx(lab) - drops}


def plot(result: dict, reps: int):
    def draw(plt):
        fig, ax = plt.subplots(figsize=(6, 3.6))
        names = list(result)
        bars = ax.bar(names, [result[n]["gbps"] for n in names], color=["#888", "#3a7", "#37a"])
        ax.bar_label(bars, fmt="%.2f")
        # Log scale: the kernel's direct veth path (with GSO) is ~20x what a per-frame userspace line carries.
        ax.set_yscale("log")
        ax.axhline(TARGET_GBPS, color="r", linestyle="--", label=f"target at 50 ms RTT ({TARGET_GBPS:g} Gbit/s)")
        ax.set_ylabel("TCP Gbit/s (one stream, log)")
        ax.legend(loc="upper right")
        ax.set_title(f"linkem capacity (medians of {reps})")
        return fig
    return draw


def main() -> int:
    ap = argparse.ArgumentParser(prog="bench linkem", description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=8, help="measured seconds of each run (after 2 s warm-up)")
    args = ap.parse_args()
    samples: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    with ExitStack() as stack:
        lab = labs(stack, {"direct": ["--no-proxy"], "linkem": ["--no-proxy", "--link", "none"]})
        for rep in range(args.reps):
            order = list(VARIANTS) if rep % 2 == 0 else list(reversed(VARIANTS))
            for variant in order:
                which, delay = VARIANTS[variant]
                samples[variant].append(measure(lab[which], delay, args.seconds))
                print(f"rep {rep + 1}/{args.reps} {variant:<17} {samples[variant][-1]}", flush=True)
    base = median([s["gbps"] for s in samples["direct"]])
    result = {}
    for variant, runs in samples.items():
        gbps = median([s["gbps"] for s in runs])
        result[variant] = {"gbps": gbps, "ratio_to_direct": gbps / base, "samples": runs}
        if variant != "direct":
            result[variant]["linkem_cpu_pct"] = median([s["linkem_cpu_pct"] for s in runs])
            result[variant]["drop_rx"] = median([s["drop_rx"] for s in runs])
    table = [["path", "TCP Gbit/s", "ratio to direct", "linkem CPU %", "drop_rx"]]
    for variant, r in result.items():
        table.append([variant, f"{r['gbps']:.2f}", f"{r['ratio_to_direct']:.2f}",
                      f"{r['linkem_cpu_pct']:.0f}" if "linkem_cpu_pct" in r else "-",
                      f"{r['drop_rx']:.0f}" if "drop_rx" in r else "-"])
    at50 = result["linkem 50 ms RTT"]["gbps"]
    verdict = "meets" if at50 >= TARGET_GBPS else "MISSES"
    print(f"linkem at 50 ms RTT: {at50:.2f} Gbit/s, {verdict} the {TARGET_GBPS:g} Gbit/s target")

    write_report("linkem", {"reps": args.reps, "seconds": args.seconds, "commit": git_rev(),
                            "command": "./scripts/bench linkem", "target_gbps_50ms": TARGET_GBPS,
                            "meets_target": at50 >= TARGET_GBPS, "results": result}, table,
                 plot(result, args.reps))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
