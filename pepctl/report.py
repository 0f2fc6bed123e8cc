"""`pepctl report`: the PEP's gain on live traffic, from the experiment's flow records.

Each record (pepctl/experiment.py) is one flow of a subscriber of the treated group (proxied) or
of the control group (bypassed: end-to-end), measured by the datapath as the subscriber sees it.
Per graph (and "all" graphs together) and per size class of the download:
  - goodput = bytes_down / seconds of each flow; the gain is the median goodput of treated flows
    over that of control flows (above 1: the PEP makes downloads of that size faster);
  - completion time = seconds; its gain is control's median over treated's (above 1: sooner);
  - each gain with a 95% bootstrap interval: both groups resampled with replacement, each on its
    own, RESAMPLES times with a fixed seed (the same records give the same report).
A class with fewer than --min-flows flows in either group has no gain, and says so.
"""

from __future__ import annotations

import json
import math
import os
import random
import statistics
import sys
import time
from html import escape

from .experiment import SIZE_CLASSES, size_class

RESAMPLES = 1000
SEED = 1
BOOTSTRAP_MAX = 2000   # flows of a group a resample draws from: a random subset of larger groups
GROUPS = ("treated", "control")
SIZE_ORDER = [name for _, name in SIZE_CLASSES]


class RecordError(ValueError):
    pass


def read_records(path: str, strict: bool = False) -> tuple[list[dict], dict]:
    """The log's records, and counts of what was left out: lines that are no record (skipped; an error
    naming the file and line when strict), and flows that carried nothing (empty). The last line may
    be cut short by the exporter appending right now: left out silently."""
    with open(path) as f:
        lines = f.read().split("\n")
    out, skipped, empty = [], 0, 0
    last = max(i for i, ln in enumerate(lines) if ln.strip()) if any(ln.strip() for ln in lines) else -1
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
            problem = _problem(r)
        except ValueError as e:
            r, problem = None, f"not JSON ({e.args[0]})"
        if problem:
            if i == last and r is None:
                continue   # a line the exporter is still writing
            if strict:
                raise RecordError(f"{path}:{i + 1}: {problem}")
            skipped += 1
            continue
        if r["seconds"] <= 0 or r["bytes_down"] <= 0:
            empty += 1
            continue
        out.append(r)
    return out, {"skipped": skipped, "empty": empty}


def _problem(r) -> str | None:
    if not isinstance(r, dict):
        return "not a JSON object"
    for key, kind in (("graph", str), ("group", str), ("bytes_down", int), ("seconds", (int, float)),
                      ("end", (int, float))):
        if not isinstance(r.get(key), kind) or isinstance(r.get(key), bool):
            return f"field {key!r} missing or not a {kind.__name__ if isinstance(kind, type) else 'number'}"
    if r["group"] not in GROUPS:
        return f"group {r['group']!r}: not one of {', '.join(GROUPS)}"
    return None


def _median_ci(a: list[float], b: list[float], rng: random.Random, resamples: int) -> tuple[float, float, float]:
    """median(a) / median(b), and the 2.5 and 97.5 percentiles of that ratio over bootstrap resamples
    (stdlib only: pepctl runs on the system's Python)."""
    value = statistics.median(a) / statistics.median(b)
    a = rng.sample(a, BOOTSTRAP_MAX) if len(a) > BOOTSTRAP_MAX else a
    b = rng.sample(b, BOOTSTRAP_MAX) if len(b) > BOOTSTRAP_MAX else b
    ratios = sorted(statistics.median(rng.choices(a, k=len(a))) / statistics.median(rng.choices(b, k=len(b)))
                    for _ in range(resamples))
    return value, _percentile(ratios, 2.5), _percentile(ratios, 97.5)


def _percentile(xs: list[float], p: float) -> float:
    """Linear interpolation between the closest ranks of sorted xs."""
    k = (len(xs) - 1) * p / 100
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def _cell(rows: list[dict], min_flows: int, rng, resamples: int) -> dict:
    groups = {}
    for g in GROUPS:
        mine = [r for r in rows if r["group"] == g]
        # sorted: the resamples depend on the values only, not on the log's order
        goodput = sorted(r["bytes_down"] * 8 / r["seconds"] / 1e6 for r in mine)
        secs = sorted(r["seconds"] for r in mine)
        groups[g] = {"flows": len(mine), "goodput": goodput, "seconds": secs,
                     "median_mbps": statistics.median(goodput) if mine else None,
                     "median_s": statistics.median(secs) if mine else None,
                     "bytes": int(sum(r["bytes_down"] for r in mine))}
    t, c = groups["treated"], groups["control"]
    out = {g: {k: v for k, v in groups[g].items() if k not in ("goodput", "seconds")} for g in GROUPS}
    if t["flows"] < min_flows or c["flows"] < min_flows:
        out["goodput_gain"] = out["completion_gain"] = None
        out["note"] = f"too few flows (treated {t['flows']}, control {c['flows']})"
        return out
    v, lo, hi = _median_ci(t["goodput"], c["goodput"], rng, resamples)
    out["goodput_gain"] = {"value": v, "low": lo, "high": hi}
    v, lo, hi = _median_ci(c["seconds"], t["seconds"], rng, resamples)
    out["completion_gain"] = {"value": v, "low": lo, "high": hi}
    return out


def analyse(records: list[dict], min_flows: int = 2, resamples: int = RESAMPLES, seed: int = SEED) -> dict:
    """Rows of {graph, size, treated, control, goodput_gain, completion_gain}: per graph and for all
    graphs together ("all"), per size class present, smallest first."""
    rng = random.Random(seed)
    graphs = sorted({r["graph"] for r in records})
    rows = []
    for graph in (*graphs, "all") if len(graphs) > 1 else graphs:
        mine = records if graph == "all" else [r for r in records if r["graph"] == graph]
        by_size: dict[str, list[dict]] = {}
        for r in mine:
            by_size.setdefault(size_class(r["bytes_down"]), []).append(r)
        for size in sorted(by_size, key=SIZE_ORDER.index):
            rows.append({"graph": graph, "size": size, **_cell(by_size[size], min_flows, rng, resamples)})
    if len(graphs) == 1:   # all graphs are this one: the same rows, not a second draw
        rows += [{**r, "graph": "all"} for r in rows]
    ends = [r["end"] for r in records]
    return {"flows": len(records), "from": min(ends, default=None), "to": max(ends, default=None),
            "resamples": resamples, "seed": seed, "min_flows": min_flows, "rows": rows}


def _gain_text(g: dict | None) -> str:
    return "-" if g is None else f"{g['value']:.2f} [{g['low']:.2f}, {g['high']:.2f}]"


def print_report(analysis: dict, out) -> None:
    if not analysis["rows"]:
        print("no measured flows yet", file=out)
        return
    span = ""
    if analysis["from"]:
        span = f", {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(analysis['from']))} to " \
               f"{time.strftime('%H:%M:%S', time.localtime(analysis['to']))}"
    print(f"{analysis['flows']} measured flows{span}. Gain: treated (proxied) against control (end-to-end), "
          "median, [95% interval]; above 1 the PEP is better.", file=out)
    head = ("graph", "size", "flows t/c", "goodput t Mbit/s", "goodput c Mbit/s", "goodput gain", "completion gain")
    rows = [head]
    single = len({r["graph"] for r in analysis["rows"]}) == 2   # one graph, and "all": the same rows
    for r in analysis["rows"]:
        if single and r["graph"] == "all":
            continue
        t, c = r["treated"], r["control"]
        rows.append((r["graph"], r["size"], f"{t['flows']}/{c['flows']}",
                     "-" if t["median_mbps"] is None else f"{t['median_mbps']:.2f}",
                     "-" if c["median_mbps"] is None else f"{c['median_mbps']:.2f}",
                     _gain_text(r["goodput_gain"]) if r["goodput_gain"] else r.get("note", "-"),
                     _gain_text(r["completion_gain"])))
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(head))]
    for row in rows:
        print("  ".join(str(x).ljust(w) for x, w in zip(row, widths, strict=True)).rstrip(), file=out)


def plot(analysis: dict, path: str) -> None:
    """An SVG (no plotting library: pepctl runs on the system's Python): per size class, both groups'
    median goodput (log scale) on the left, the goodput gain with its 95% interval on the right."""
    rows = [r for r in analysis["rows"] if r["graph"] == "all"]
    w, h, top, bottom, panel = 960, 360, 50, 60, 400
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" '
           f'font-size="12"><rect width="{w}" height="{h}" fill="white"/>',
           f'<text x="{w / 2}" y="20" text-anchor="middle" font-size="14">The PEP on live traffic: '
           f'{analysis["flows"]} flows; treated (proxied) vs control (end-to-end), medians and 95% intervals</text>']
    rates = [r[g]["median_mbps"] for r in rows for g in GROUPS if r[g]["median_mbps"]]
    gains = [x for r in rows if r["goodput_gain"] for x in (r["goodput_gain"]["low"], r["goodput_gain"]["high"], 1.0)]
    lo_r, hi_r = (math.log10(min(rates)) - 0.2, math.log10(max(rates)) + 0.2) if rates else (0, 1)
    lo_g, hi_g = (math.log10(min(gains)) - 0.1, math.log10(max(gains)) + 0.1) if gains else (-1, 1)

    def y_of(v: float, lo: float, hi: float) -> float:
        return top + (h - top - bottom) * (1 - (math.log10(v) - lo) / (hi - lo or 1))

    step = panel / max(len(rows), 1)
    for side, x0, title in (("rates", 70, "median goodput, Mbit/s (log)"), ("gain", 560, "goodput gain (log)")):
        out.append(f'<text x="{x0 + panel / 2}" y="{top - 12}" text-anchor="middle">{title}</text>')
        out.append(f'<line x1="{x0}" y1="{h - bottom}" x2="{x0 + panel}" y2="{h - bottom}" stroke="black"/>')
        lo, hi = (lo_r, hi_r) if side == "rates" else (lo_g, hi_g)
        for e in range(math.floor(lo), math.ceil(hi) + 1):
            if lo <= e <= hi:
                y = y_of(10 ** e, lo, hi)
                out.append(f'<line x1="{x0}" y1="{y}" x2="{x0 + panel}" y2="{y}" stroke="#ddd"/>'
                           f'<text x="{x0 - 6}" y="{y + 4}" text-anchor="end">{10 ** e:g}</text>')
        for i, r in enumerate(rows):
            cx = x0 + step * (i + 0.5)
            out.append(f'<text x="{cx}" y="{h - bottom + 18}" text-anchor="middle">{escape(r["size"])}</text>')
            if side == "rates":
                for j, (g, colour) in enumerate((("treated", "#2a7"), ("control", "#888"))):
                    v = r[g]["median_mbps"]
                    if v:
                        y = y_of(v, lo, hi)
                        out.append(f'<rect x="{cx - step * 0.35 + j * step * 0.35}" y="{y}" width="{step * 0.33}" '
                                   f'height="{h - bottom - y}" fill="{colour}"/>')
            elif r["goodput_gain"]:
                gg = r["goodput_gain"]
                y, y1, y2 = (y_of(gg[k], lo, hi) for k in ("value", "low", "high"))
                out.append(f'<line x1="{cx}" y1="{y1}" x2="{cx}" y2="{y2}" stroke="#237"/>'
                           f'<circle cx="{cx}" cy="{y}" r="4" fill="#237"/>'
                           f'<text x="{cx + 8}" y="{y - 6}">{gg["value"]:.2f}</text>')
        if side == "gain" and gains:
            y = y_of(1.0, lo, hi)
            out.append(f'<line x1="{x0}" y1="{y}" x2="{x0 + panel}" y2="{y}" stroke="black" stroke-dasharray="4"/>')
    out.append(f'<text x="70" y="{h - 12}" fill="#2a7">treated (proxied)</text>'
               f'<text x="200" y="{h - 12}" fill="#888">control (end-to-end)</text></svg>')
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def add_arguments(p) -> None:
    p.add_argument("--log", help="the experiment log (default: the instance's, in its run folder)")
    p.add_argument("--graph", help="one graph only")
    p.add_argument("--since", type=float, metavar="SECONDS", help="flows that ended in the last SECONDS (or after "
                   "this unix time, if larger than a year)")
    p.add_argument("--min-flows", type=int, default=2, help="flows each group needs for a gain (default 2)")
    p.add_argument("--json", metavar="FILE", help="write the analysis as JSON (- for stdout)")
    p.add_argument("--plot", metavar="FILE.svg", help="draw goodput and gain by size (SVG)")


def run(args, log_path: str, out=sys.stdout) -> int:
    if not os.path.exists(log_path):
        print(f"pepctl report: {log_path}: no flow records. Is the experiment on? Set `[graph.experiment] "
              "control_fraction = 0.05` in the config, run `pepctl reload`, and let traffic flow.", file=sys.stderr)
        return 1
    records, left_out = read_records(log_path)
    if args.graph:
        records = [r for r in records if r["graph"] == args.graph]
    if args.since:
        since = args.since if args.since > 365 * 86400 else time.time() - args.since
        records = [r for r in records if r["end"] >= since]
    analysis = analyse(records, min_flows=args.min_flows) | {"log": log_path, **left_out}
    if args.json == "-":
        json.dump(analysis, out, indent=1)
        print(file=out)
    else:
        print_report(analysis, out)
        if left_out["skipped"]:
            print(f"({left_out['skipped']} line(s) of {log_path} were no flow record and were left out)", file=out)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(analysis, f, indent=1)
    if args.plot:
        plot(analysis, args.plot)
    return 0
