"""`pepctl report`: the PEP's gain on live traffic, from the experiment's flow records.

Each record (pepctl/experiment.py) is one flow of a subscriber of the treated group (proxied) or
of the control group (bypassed: end-to-end), measured by the datapath as the subscriber sees it.
Per graph (and "all" graphs together) and per size class of the download:
  - goodput = bytes_down * 8 / seconds of each flow; the gain is the median goodput of treated
    flows over that of control flows (above 1: the PEP makes downloads of that size faster);
  - completion time = seconds; its gain is control's median over treated's (above 1: sooner);
  - each median and each gain with a 95% bootstrap interval: both groups resampled with
    replacement, each on its own, RESAMPLES times with a fixed seed (the same records give the
    same report), the interval between the 2.5th and 97.5th percentiles of the resamples.
A class with fewer than --min-flows flows in either group has no gain, and says so.

Standard library only, like the rest of pepctl (scripts/pepctl runs the system's python3): the
bootstrap draws each resample's median directly (_median_draws), which takes the same time for
10 flows as for 10 million, and the plot is an SVG written by hand.
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
from .names import previous_log

RESAMPLES = 2000
SEED = 1
GROUPS = ("treated", "control")
SIZE_ORDER = [name for _, name in SIZE_CLASSES]
TURN_ON = ("Is the experiment on? Set `[graph.experiment] control_fraction = 0.05` in the config, run "
           "`pepctl reload`, and let traffic flow.")


class RecordError(ValueError):
    pass


def read_records(path: str, strict: bool = False) -> tuple[list[dict], dict]:
    """The log's records, and counts of what was left out: lines that are no record (skipped; with
    strict, a RecordError naming the file and line), and flows that carried nothing (empty). A last
    line with no newline yet is one the exporter is still appending: left out silently."""
    out, skipped, empty = [], 0, 0
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
                problem = _problem(r)
            except ValueError as e:
                if not line.endswith("\n"):
                    break   # being written
                problem = f"not JSON ({e.args[0]})"
            if problem:
                if strict:
                    raise RecordError(f"{path}:{number}: {problem}")
                skipped += 1
            elif r["seconds"] <= 0 or r["bytes_down"] <= 0:
                empty += 1
            else:
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


def _median_draws(rng: random.Random, n: int, resamples: int) -> list[tuple[int, int]]:
    """For each bootstrap resample of n sorted values, the indices of the two values whose mean is
    its median (the same index twice when n is odd).

    A resample (n draws with replacement from sorted xs) is xs[ceil(n * U) - 1] for n uniform U.
    That index grows with U, so the resample's r-th smallest value is xs[ceil(n * U_(r)) - 1], where
    U_(r), the r-th smallest of n uniforms, is Beta(r, n - r + 1), and the next one is
    U_(r+1) = U_(r) + (1 - U_(r)) * Beta(1, n - r). Two draws give a resample's median, exactly as
    likely as drawing the n values and taking statistics.median of them."""
    r = (n + 1) // 2   # the (lower) middle rank

    def index(u: float) -> int:
        return min(n, max(1, math.ceil(n * u))) - 1

    out = []
    for _ in range(resamples):
        u = rng.betavariate(r, n - r + 1)
        nxt = u + (1 - u) * rng.betavariate(1, n - r) if n % 2 == 0 else u
        out.append((index(u), index(nxt)))
    return out


def _percentile(xs: list[float], p: float) -> float:
    """Linear interpolation between the closest ranks of sorted xs."""
    k = (len(xs) - 1) * p / 100
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def _interval(value: float, resampled: list[float]) -> dict:
    resampled = sorted(resampled)
    return {"value": value, "low": _percentile(resampled, 2.5), "high": _percentile(resampled, 97.5)}


def _cell(rows: list[dict], min_flows: int, rng: random.Random, resamples: int) -> dict:
    """Both groups of one graph and size class: their medians, and the gains, with intervals."""
    out: dict = {}
    medians = {}   # group -> the goodput and completion-time medians of its resamples
    for g in GROUPS:
        mine = [r for r in rows if r["group"] == g]
        out[g] = {"flows": len(mine), "bytes": sum(r["bytes_down"] for r in mine), "goodput_mbps": None,
                  "completion_s": None}
        if not mine:
            continue
        # sorted: the resamples, and so the report, depend on the values only, not on the log's order
        goodput = sorted(r["bytes_down"] * 8 / r["seconds"] / 1e6 for r in mine)
        secs = sorted(r["seconds"] for r in mine)
        draws = _median_draws(rng, len(mine), resamples)
        medians[g] = ([(goodput[i] + goodput[j]) / 2 for i, j in draws], [(secs[i] + secs[j]) / 2 for i, j in draws])
        out[g]["goodput_mbps"] = _interval(statistics.median(goodput), medians[g][0])
        out[g]["completion_s"] = _interval(statistics.median(secs), medians[g][1])
    t, c = out["treated"], out["control"]
    if min(t["flows"], c["flows"]) < max(min_flows, 1):
        out["goodput_gain"] = out["completion_gain"] = None
        out["note"] = f"too few flows (treated {t['flows']}, control {c['flows']})"
        return out
    (t_rate, t_secs), (c_rate, c_secs) = medians["treated"], medians["control"]
    out["goodput_gain"] = _interval(t["goodput_mbps"]["value"] / c["goodput_mbps"]["value"],
                                    [a / b for a, b in zip(t_rate, c_rate, strict=True)])
    out["completion_gain"] = _interval(c["completion_s"]["value"] / t["completion_s"]["value"],
                                       [a / b for a, b in zip(c_secs, t_secs, strict=True)])
    return out


def analyse(records: list[dict], min_flows: int = 2, resamples: int = RESAMPLES, seed: int = SEED) -> dict:
    """Rows of {graph, size, treated, control, goodput_gain, completion_gain[, note]}: per graph and
    for all graphs together ("all"), per size class present, smallest first. Records that carried
    nothing (seconds or bytes_down not above 0) are left out."""
    records = [r for r in records if r["seconds"] > 0 and r["bytes_down"] > 0]
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
                     "-" if t["goodput_mbps"] is None else f"{t['goodput_mbps']['value']:.2f}",
                     "-" if c["goodput_mbps"] is None else f"{c['goodput_mbps']['value']:.2f}",
                     _gain_text(r["goodput_gain"]) if r["goodput_gain"] else r.get("note", "-"),
                     _gain_text(r["completion_gain"])))
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(head))]
    for row in rows:
        print("  ".join(str(x).ljust(w) for x, w in zip(row, widths, strict=True)).rstrip(), file=out)


# The plot's panels, each on a log axis: series of (key, label, colour). A key is a group (its median
# goodput) or a gain.
PANELS = (("median goodput, Mbit/s (log)", (("treated", "treated (proxied)", "#2a7"),
                                            ("control", "control (end-to-end)", "#888"))),
          ("gain, treated vs control (log)", (("goodput_gain", "goodput gain", "#237"),
                                              ("completion_gain", "completion gain", "#c62"))))


def _estimate(row: dict, key: str) -> dict | None:
    """{value, low, high} of a series in a row, or None."""
    return row[key]["goodput_mbps"] if key in GROUPS else row[key]


def _log_ticks(lo: float, hi: float) -> list[float]:
    """1, 2 and 5 times powers of ten between 10**lo and 10**hi."""
    return [m * 10.0 ** e for e in range(math.floor(lo), math.ceil(hi) + 1) for m in (1, 2, 5)
            if lo <= math.log10(m * 10.0 ** e) <= hi]


def plot(analysis: dict, path: str) -> None:
    """An SVG of the "all" rows: per size class, both groups' median goodput on the left and the two
    gains on the right (dashed: 1, no gain), each a dot with its 95% interval as a bar, on log axes."""
    rows = [r for r in analysis["rows"] if r["graph"] == "all"]
    w, h, top, bottom, panel_w, gap = 980, 380, 50, 70, 400, 90
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" '
           f'font-size="12"><rect width="{w}" height="{h}" fill="white"/>',
           f'<text x="{w / 2}" y="20" text-anchor="middle" font-size="14">The PEP on live traffic: '
           f'{analysis["flows"]} flows; treated (proxied) vs control (end-to-end), medians and 95% intervals</text>']
    step = panel_w / max(len(rows), 1)
    for p, (title, series) in enumerate(PANELS):
        x0 = 70 + p * (panel_w + gap)
        span = [e[k] for r in rows for key, *_ in series if (e := _estimate(r, key)) for k in ("low", "high")]
        span += [1.0] if p else []
        lo, hi = (math.log10(min(span)) - 0.15, math.log10(max(span)) + 0.15) if span else (0.0, 1.0)

        def y_of(v: float, lo=lo, hi=hi) -> str:
            return f"{top + (h - top - bottom) * (1 - (math.log10(v) - lo) / (hi - lo)):.1f}"

        svg.append(f'<text x="{x0 + panel_w / 2}" y="{top - 12}" text-anchor="middle">{title}</text>'
                   f'<line x1="{x0}" y1="{h - bottom}" x2="{x0 + panel_w}" y2="{h - bottom}" stroke="black"/>')
        for v in _log_ticks(lo, hi):
            svg.append(f'<line x1="{x0}" y1="{y_of(v)}" x2="{x0 + panel_w}" y2="{y_of(v)}" stroke="#ddd"/>'
                       f'<text x="{x0 - 6}" y="{float(y_of(v)) + 4}" text-anchor="end">{v:g}</text>')
        if p:
            svg.append(f'<line x1="{x0}" y1="{y_of(1)}" x2="{x0 + panel_w}" y2="{y_of(1)}" stroke="black" '
                       'stroke-dasharray="4"/>')
        for i, r in enumerate(rows):
            svg.append(f'<text x="{x0 + step * (i + 0.5):.1f}" y="{h - bottom + 18}" '
                       f'text-anchor="middle">{escape(r["size"])}</text>')
            for s, (key, label, colour) in enumerate(series):
                e, x = _estimate(r, key), f"{x0 + step * (i + 0.35 + 0.3 * s):.1f}"
                if e:
                    svg.append(f'<g class="{key}"><title>{escape(label)}, {escape(r["size"])}: {e["value"]:.3g} '
                               f'[{e["low"]:.3g}, {e["high"]:.3g}]</title>'
                               f'<line x1="{x}" y1="{y_of(e["low"])}" x2="{x}" y2="{y_of(e["high"])}" '
                               f'stroke="{colour}" stroke-width="2"/>'
                               f'<circle cx="{x}" cy="{y_of(e["value"])}" r="4" fill="{colour}"/></g>')
        for s, (_, label, colour) in enumerate(series):
            svg.append(f'<text x="{x0 + s * 180}" y="{h - 16}" fill="{colour}">&#9679; {escape(label)}</text>')
    svg.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(svg) + "\n")


def add_arguments(p) -> None:
    p.add_argument("--log", help="the experiment log (default: the instance's, in its run folder)")
    p.add_argument("--graph", help="one graph only")
    p.add_argument("--since", type=float, metavar="SECONDS", help="flows that ended in the last SECONDS (or after "
                   "this unix time, if larger than a year)")
    p.add_argument("--min-flows", type=int, default=2, help="flows each group needs for a gain (default 2)")
    p.add_argument("--strict", action="store_true", help="stop at the first line that is no flow record, "
                   "naming it (default: skip it and count it)")
    p.add_argument("--json", metavar="FILE", help="write the analysis as JSON (- for stdout)")
    p.add_argument("--plot", metavar="FILE.svg", help="draw goodput and gains by size, with intervals (SVG)")


def run(args, log_path: str, out=sys.stdout) -> int:
    if not os.path.exists(log_path):
        print(f"pepctl report: {log_path}: no flow records. {TURN_ON}", file=sys.stderr)
        return 1
    records, left_out = [], {"skipped": 0, "empty": 0}
    # The exporter rotates the log to .1 beyond LOG_MAX_BYTES: the older records are read first.
    older = previous_log(log_path)
    for path in (older, log_path) if os.path.exists(older) else (log_path,):
        try:
            got, counts = read_records(path, strict=getattr(args, "strict", False))
        except RecordError as e:
            print(f"pepctl report: {e}", file=sys.stderr)
            return 1
        records += got
        left_out = {k: left_out[k] + counts[k] for k in left_out}
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
        if left_out["skipped"] or left_out["empty"]:
            print(f"({left_out['skipped']} line(s) of {log_path} were no flow record and were skipped; "
                  f"{left_out['empty']} flow(s) carried no data)", file=out)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(analysis, f, indent=1)
    if args.plot:
        plot(analysis, args.plot)
    return 0
