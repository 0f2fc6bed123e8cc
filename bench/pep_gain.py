"""bench pep-gain: what the PEP is for. Goodput over a lossy, high-RTT access link, with and without it.

One lab with the access-link emulator between client and switch. For every
cell of the grid (RTT x loss x rate; the link's buffer holds one RTT at the
rate), the same transfers run twice, alternating, REPS times:
  proxy  split at HAProxy: BBR over the access link, CUBIC to the origin
  e2e    the same path with the proxy bypassed (a bypass rule for every lab
         client: forwarded at L3 by tc), so client and origin run CUBIC end to end
Transfers: downloads and uploads of each size (goodput = bytes / time, capped
at --cap seconds: a capped transfer counts what arrived), and short flows
(100 KB downloads: completion time). Reported: medians, and the ratio
proxy / e2e of goodput (and e2e / proxy of short-flow time: > 1 means faster).
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
from contextlib import ExitStack

from matplotlib.colors import LogNorm

from netns.handle import LabHandle
from netns.lab import DEFAULT_CONGESTION
from netns.workloads import OBJECTS, download, set_link, set_mode, upload

from .common import RESULTS, git_rev, labs, median, write_report

SHORT = ("100k", 100 * 1024)


def short_flows(lab: LabHandle, count: int, cap: float) -> float:
    times = [download(lab, SHORT[0], cap)["seconds"] for _ in range(count)]
    return statistics.median(times)


def measure(lab: LabHandle, sizes: list[int], cap: float, shorts: int, directions: list[str]) -> dict:
    got = {}
    for mb in sizes:
        if "down" in directions:
            got[f"down_{mb}MB_mbps"] = download(lab, OBJECTS[mb], cap)["mbps"]
        if "up" in directions:
            got[f"up_{mb}MB_mbps"] = upload(lab, mb, cap)["mbps"]
    if shorts:
        got["short_100KB_s"] = short_flows(lab, shorts, cap)
    return got


def run_grid(lab: LabHandle, cells, args, log=print) -> list[dict]:
    results = []
    for rtt, loss, rate in cells:
        set_link(lab, rtt, loss, rate)
        samples: dict[str, dict[str, list[float]]] = {"proxy": {}, "e2e": {}}
        for rep in range(args.reps):
            for mode in ("proxy", "e2e") if rep % 2 == 0 else ("e2e", "proxy"):
                set_mode(lab, mode)
                for k, v in measure(lab, args.sizes, args.cap, args.shorts, args.directions).items():
                    samples[mode].setdefault(k, []).append(v)
        set_mode(lab, "proxy")
        cell = {"rtt_ms": rtt, "loss_pct": loss, "rate_mbit": rate, "samples": samples,
                "proxy": {k: median(v) for k, v in samples["proxy"].items()},
                "e2e": {k: median(v) for k, v in samples["e2e"].items()}}
        cell["ratio"] = {k: (cell["proxy"][k] / cell["e2e"][k] if "mbps" in k else cell["e2e"][k] / cell["proxy"][k])
                         if cell["e2e"][k] and cell["proxy"][k] else float("nan") for k in cell["proxy"]}
        results.append(cell)
        log(f"RTT {rtt:>4g} ms loss {loss:>3g}% rate {rate:>3g} Mbit/s: " + "  ".join(
            f"{k} {cell['proxy'][k]:.2f}/{cell['e2e'][k]:.2f} (x{cell['ratio'][k]:.1f})" for k in cell["proxy"]))
    return results


def table(results: list[dict], key: str) -> list[list[str]]:
    unit = "s" if key.endswith("_s") else "Mbit/s"
    rows = [["RTT ms", "loss %", "rate Mbit/s", f"proxy {unit}", f"e2e {unit}", "gain"]]
    for c in results:
        if key in c["proxy"]:
            rows.append([f"{c['rtt_ms']:g}", f"{c['loss_pct']:g}", f"{c['rate_mbit']:g}", f"{c['proxy'][key]:.2f}",
                         f"{c['e2e'][key]:.2f}", f"{c['ratio'][key]:.2f}x"])
    return rows


def plot_grid(results: list[dict], keys: list[str]):
    def plot(plt):
        rates = sorted({c["rate_mbit"] for c in results})
        rtts = sorted({c["rtt_ms"] for c in results})
        losses = sorted({c["loss_pct"] for c in results})
        fig, axes = plt.subplots(len(rates), len(keys), figsize=(3.6 * len(keys), 3.1 * len(rates)), squeeze=False)
        for (i, rate), (j, key) in itertools.product(enumerate(rates), enumerate(keys)):
            ax = axes[i][j]
            grid = [[next((c["ratio"].get(key, float("nan")) for c in results if c["rtt_ms"] == r and
                           c["loss_pct"] == lo and c["rate_mbit"] == rate), float("nan")) for lo in losses]
                    for r in rtts]
            top = max(4.0, max((x for row in grid for x in row if x == x), default=4.0))
            # Log scale centred on 1 (no gain): 0.5x and 2x are equally far from it.
            im = ax.imshow(grid, cmap="RdYlGn", norm=LogNorm(vmin=1 / top, vmax=top))
            for (y, x) in itertools.product(range(len(rtts)), range(len(losses))):
                if grid[y][x] == grid[y][x]:
                    ax.text(x, y, f"{grid[y][x]:.1f}", ha="center", va="center", fontsize=8)
            ax.set_xticks(range(len(losses)), [f"{lo:g}%" for lo in losses])
            ax.set_yticks(range(len(rtts)), [f"{r:g} ms" for r in rtts])
            ax.set_xlabel("loss (both directions)", fontsize=8)
            ax.set_ylabel("RTT", fontsize=8)
            ax.set_title(f"{label(key)}\n@ {rate:g} Mbit/s", fontsize=8)
            fig.colorbar(im, ax=ax, fraction=0.046)
        fig.suptitle("PEP gain: proxy / end-to-end CUBIC (goodput; short flows: e2e time / proxy time)")
        fig.tight_layout()
        return fig
    return plot


LABELS = {"short_100KB_s": "100 KB flow completion time, e2e / proxy"}


def label(key: str) -> str:
    if key in LABELS:
        return LABELS[key]
    direction, size, _ = key.split("_")
    return f"{size[:-2]} MB {'download' if direction == 'down' else 'upload'} goodput, proxy / e2e"


def gain_matrix(results: list[dict], key: str) -> list[str]:
    """One markdown table of the gain: a row per RTT, a column per (rate, loss)."""
    rates = sorted({c["rate_mbit"] for c in results})
    losses = sorted({c["loss_pct"] for c in results})
    rtts = sorted({c["rtt_ms"] for c in results})
    cell = {(c["rtt_ms"], c["loss_pct"], c["rate_mbit"]): c["ratio"].get(key) for c in results}
    head = ["RTT"] + [f"{rate:g} Mbit/s, {lo:g}% loss" for rate in rates for lo in losses]
    lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    for rtt in rtts:
        row = [f"{rtt:g} ms"]
        for rate in rates:
            for lo in losses:
                x = cell.get((rtt, lo, rate))
                row.append("-" if x is None or x != x else f"{x:.2f}")
        lines.append("| " + " | ".join(row) + " |")
    return lines


def write_markdown(path: str, results: list[dict], reps: int) -> None:
    """The gain matrices (docs/measured.md shows them too), then every cell's medians."""
    keys = list(results[0]["proxy"]) if results else []
    with open(path, "w") as f:
        for key in keys:
            f.write(f"\n**{label(key)}** (median of {reps}; above 1: the PEP is better)\n\n")
            f.write("\n".join(gain_matrix(results, key)) + "\n")
        for key in keys:
            f.write(f"\n**{key}** (median of {reps})\n\n")
            rows = table(results, key)
            f.write("| " + " | ".join(rows[0]) + " |\n|" + "---|" * len(rows[0]) + "\n")
            for r in rows[1:]:
                f.write("| " + " | ".join(r) + " |\n")


def floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench pep-gain", description=__doc__.splitlines()[0])
    ap.add_argument("--rtts", type=floats, default=[20, 50, 150, 600], help="ms, comma-separated")
    ap.add_argument("--losses", type=floats, default=[0, 0.5, 1, 2], help="percent")
    ap.add_argument("--rates", type=floats, default=[20, 100], help="Mbit/s")
    ap.add_argument("--sizes", type=lambda t: [int(x) for x in t.split(",")], default=[1, 10, 50],
                    help=f"MB, of {sorted(OBJECTS)}")
    ap.add_argument("--directions", type=lambda t: t.split(","), default=["down", "up"])
    ap.add_argument("--shorts", type=int, default=5, help="100 KB flows per measurement (0: none)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--cap", type=float, default=60, help="seconds a transfer may take (then: what arrived)")
    ap.add_argument("--congestion", default=DEFAULT_CONGESTION, help="the PEP's congestion control toward the "
                    f"subscriber (default {DEFAULT_CONGESTION}, a proxy host's; bbr, cubic...)")
    ap.add_argument("--name", default="pep-gain", help="results/NAME.json and .png")
    args = ap.parse_args(argv)
    if any(s not in OBJECTS for s in args.sizes):
        ap.error(f"--sizes: the lab origin has objects of {sorted(OBJECTS)} MB")
    cells = list(itertools.product(args.rtts, args.losses, args.rates))
    print(f"{len(cells)} cells x {args.reps} reps x 2 modes; transfers capped at {args.cap:g} s", flush=True)
    with ExitStack() as stack:
        lab = labs(stack, {"lab": ["--link", "none", "--congestion", args.congestion]})["lab"]
        results = run_grid(lab, cells, args, log=lambda m: print(m, flush=True))
    keys = list(results[0]["proxy"]) if results else []
    main_key = next((k for k in keys if k.startswith("down_")), keys[0] if keys else "")
    write_report(args.name, {"command": "./scripts/bench pep-gain " + " ".join(sys.argv[1:] if argv is None else argv),
                             "commit": git_rev(), "congestion": args.congestion,
                             "grid": {"rtts": args.rtts, "losses": args.losses, "rates": args.rates}, "reps": args.reps,
                             "cap_s": args.cap, "cells": results},
                 table(results, main_key), plot_grid(results, keys))
    write_markdown(os.path.join(RESULTS, f"{args.name}.md"), results, args.reps)
    print(f"markdown tables: results/{args.name}.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
