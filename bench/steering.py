"""bench steering: what the tc BPF VLAN steering costs against plain forwarding.

Two labs side by side, both with the proxy off (the pep namespace routes):
  steered  one 802.1Q trunk; the switch and the proxy host steer with tc BPF
  plain    the same namespaces, one untagged trunk per side, Linux bridges
Measured from client to origin, alternating between the labs, REPS times:
  small-packet UDP rate (iperf3, 18-byte payloads: 64-byte frames on the wire,
  received packets/s at the origin), and TCP throughput (iperf3, Gbit/s).
Reported as medians, and the ratio steered / plain: the median of the reps' back-to-back pairs.
"""

from __future__ import annotations

import argparse
from contextlib import ExitStack

from .common import git_rev, iperf3, labs, median, paired_ratio, write_report


def udp_small_pps(lab, seconds: float) -> float:
    r = iperf3(lab, "-u", "-l", "18", "-b", "0", seconds=seconds)
    s = r["end"]["sum"]
    return (s["packets"] - s["lost_packets"]) / s["seconds"]


def tcp_gbps(lab, seconds: float) -> float:
    r = iperf3(lab, seconds=seconds)
    return r["end"]["sum_received"]["bits_per_second"] / 1e9


METRICS = {"udp_64B_pps": udp_small_pps, "tcp_gbps": tcp_gbps}
LABELS = {"udp_64B_pps": "UDP 64-byte frames (packets/s)", "tcp_gbps": "TCP throughput (Gbit/s)"}


def main() -> int:
    ap = argparse.ArgumentParser(prog="bench steering", description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=4)
    args = ap.parse_args()
    samples = {m: {"steered": [], "plain": []} for m in METRICS}
    with ExitStack() as stack:
        lab = labs(stack, {"steered": ["--no-proxy"], "plain": ["--plain"]})
        for rep in range(args.reps):
            for metric, fn in METRICS.items():
                for variant in ("steered", "plain") if rep % 2 == 0 else ("plain", "steered"):
                    samples[metric][variant].append(fn(lab[variant], args.seconds))
                    print(f"rep {rep + 1}/{args.reps} {metric:<12} {variant:<8} {samples[metric][variant][-1]:,.2f}",
                          flush=True)
    # Each rep measures a metric on the two labs back to back: the ratio is the median of those pairs'.
    result = {m: {"steered": median(v["steered"]), "plain": median(v["plain"]),
                  "ratio": paired_ratio(v["steered"], v["plain"]),
                  "ratio_of_medians": median(v["steered"]) / median(v["plain"]), "samples": v}
              for m, v in samples.items()}
    table = [["metric", "steered (BPF)", "plain (bridges)", "ratio (paired)"]]
    for m, r in result.items():
        fmt = "{:,.0f}" if "pps" in m else "{:.2f}"
        table.append([LABELS[m], fmt.format(r["steered"]), fmt.format(r["plain"]), f"{r['ratio']:.2f}"])

    def plot(plt):
        fig, axes = plt.subplots(1, len(result), figsize=(4.5 * len(result), 3.6))
        for ax, (m, r) in zip(axes, result.items(), strict=True):
            ax.bar(["steered (BPF)", "plain (bridges)"], [r["steered"], r["plain"]], color=["#3a7", "#888"])
            ax.set_title(f"{LABELS[m]}\npaired ratio {r['ratio']:.2f}")
        fig.suptitle(f"VLAN steering vs plain forwarding (medians of {args.reps})")
        return fig

    write_report("steering", {"reps": args.reps, "seconds": args.seconds, "commit": git_rev(),
                              "command": "./scripts/bench steering", "results": result}, table, plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
