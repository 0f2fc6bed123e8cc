"""pepctl report's statistics (pepctl/report.py) on records whose truth is known: the gain it gives
must be the one built into them, and its interval must hold it and exclude what it is not.

How right is told from wrong: flows() spreads a group's goodputs evenly around a chosen median (an
odd count has exactly that median), so a report's medians and gains are known in advance; the
bootstrap's shortcut (_median_draws) is held against drawing whole resamples."""

from __future__ import annotations

import argparse
import io
import json
import random
import statistics
import time
import xml.dom.minidom

import pytest

from pepctl import report

MB = 10_500_000   # a 10 MiB object and its headers: size class "10M+"


def flows(n: int, group: str, mbps: float, size: int = MB, graph: str = "g1", spread: float = 0.2,
          end: float = 1_800_000_000) -> list[dict]:
    """n records of one size whose goodputs are spread evenly over mbps * (1 +- spread), in a shuffled
    order: their median is mbps when n is odd."""
    rates = [mbps * (1 + spread * (2 * i / (n - 1) - 1)) if n > 1 else mbps for i in range(n)]
    random.Random(f"{group} {n} {mbps}").shuffle(rates)
    return [{"end": end + i, "graph": graph, "group": group, "client": f"198.18.0.{10 + i % 200}",
             "server": "198.19.0.10", "server_port": 80, "bytes_down": size, "bytes_up": 100,
             "seconds": size * 8 / rate / 1e6, "closed_by": "fin"} for i, rate in enumerate(rates)]


def row(analysis: dict, size: str, graph: str = "all") -> dict:
    return next(r for r in analysis["rows"] if r["graph"] == graph and r["size"] == size)


def test_ten_times_faster_gives_ten_and_an_interval_that_holds_ten_and_excludes_one():
    a = report.analyse(flows(61, "treated", 60.0) + flows(15, "control", 6.0))
    r = row(a, "10M+")
    assert r["treated"]["goodput_mbps"]["value"] == pytest.approx(60) and \
        r["control"]["goodput_mbps"]["value"] == pytest.approx(6), r
    for name in ("goodput_gain", "completion_gain"):
        g = r[name]
        assert g["value"] == pytest.approx(10), (name, g)
        assert 1 < g["low"] < 10 < g["high"] < 20, (name, g)


def test_identical_groups_give_an_interval_around_one():
    a = report.analyse(flows(41, "treated", 20.0) + flows(31, "control", 20.0))
    for name in ("goodput_gain", "completion_gain"):
        g = row(a, "10M+")[name]
        assert g["value"] == pytest.approx(1) and g["low"] < 1 < g["high"], (name, g)


def test_a_groups_interval_holds_its_median():
    a = report.analyse(flows(21, "treated", 30.0) + flows(21, "control", 3.0))
    for group in ("treated", "control"):
        for name in ("goodput_mbps", "completion_s"):
            e = row(a, "10M+")[group][name]
            assert e["low"] < e["value"] < e["high"], (group, name, e)


@pytest.mark.parametrize("n", [1, 2, 7, 8])
def test_median_draws_are_distributed_as_whole_resamples(n):
    """The shortcut and the real thing (n draws with replacement, statistics.median), on skewed values:
    the frequencies of each possible median must agree (total variation distance)."""
    xs = sorted(1.5 ** i for i in range(n))
    k = 40_000
    fast = [(xs[i] + xs[j]) / 2 for i, j in report._median_draws(random.Random(3), n, k)]
    rng = random.Random(4)
    slow = [statistics.median(rng.choices(xs, k=n)) for _ in range(k)]

    def freq(ms: list[float]) -> dict[float, float]:
        out: dict[float, float] = {}
        for m in ms:
            out[round(m, 9)] = out.get(round(m, 9), 0) + 1 / k
        return out

    f, s = freq(fast), freq(slow)
    distance = sum(abs(f.get(v, 0) - s.get(v, 0)) for v in f.keys() | s.keys()) / 2
    assert distance < 0.02, f"n={n}: shortcut vs whole resamples differ by {distance:.3f}: {sorted(f.items())[:8]}"


def test_the_gains_interval_is_the_one_whole_resamples_give():
    recs = flows(15, "treated", 40, spread=0.5) + flows(12, "control", 8, spread=0.5)
    g = row(report.analyse(recs), "10M+")["goodput_gain"]
    t, c = ([r["bytes_down"] * 8 / r["seconds"] / 1e6 for r in recs if r["group"] == group]
            for group in ("treated", "control"))
    rng = random.Random(5)
    ratios = sorted(statistics.median(rng.choices(t, k=len(t))) / statistics.median(rng.choices(c, k=len(c)))
                    for _ in range(20_000))
    want = {"low": ratios[500], "high": ratios[19_500]}   # the 2.5th and 97.5th percentiles
    assert g["low"] == pytest.approx(want["low"], rel=0.05) and g["high"] == pytest.approx(want["high"], rel=0.05), \
        f"report {g}, whole resamples {want}"


def test_ten_thousand_flows_a_group_take_well_under_a_second():
    recs = flows(10_000, "treated", 50.0) + flows(10_000, "control", 5.0)
    start = time.perf_counter()
    a = report.analyse(recs, resamples=2000)
    took = time.perf_counter() - start
    assert took < 1.0, f"analyse of 2 x 10,000 flows x 2000 resamples took {took:.2f} s"
    g = row(a, "10M+")["goodput_gain"]
    assert 9.9 < g["low"] < g["high"] < 10.1, g   # 10,000 flows: a narrow interval


def test_size_classes_and_graphs_are_kept_apart():
    recs = (flows(5, "treated", 50, size=2_000_000) + flows(5, "control", 5, size=2_000_000)
            + flows(5, "treated", 10, size=50_000, graph="g2") + flows(5, "control", 8, size=50_000, graph="g2"))
    a = report.analyse(recs)
    got = sorted((r["graph"], r["size"], r["treated"]["flows"], r["control"]["flows"]) for r in a["rows"])
    assert got == [("all", "10k-100k", 5, 5), ("all", "1M-10M", 5, 5), ("g1", "1M-10M", 5, 5),
                   ("g2", "10k-100k", 5, 5)], got
    assert row(a, "1M-10M", "g1")["goodput_gain"]["value"] == pytest.approx(10)
    assert row(a, "10k-100k", "g2")["goodput_gain"]["value"] == pytest.approx(10 / 8)


def test_one_graph_gives_the_same_rows_for_all():
    a = report.analyse(flows(9, "treated", 50) + flows(9, "control", 5))
    assert [{**r, "graph": "all"} for r in a["rows"] if r["graph"] == "g1"] == \
        [r for r in a["rows"] if r["graph"] == "all"], a["rows"]


def test_too_few_flows_give_no_gain_and_say_so():
    a = report.analyse(flows(10, "treated", 50) + flows(1, "control", 5))
    r = row(a, "10M+")
    assert r["goodput_gain"] is None and r["completion_gain"] is None, r
    assert r["note"] == "too few flows (treated 10, control 1)", r
    assert report.analyse(flows(10, "treated", 50) + flows(1, "control", 5), min_flows=1)["rows"][0]["goodput_gain"]


def test_same_records_same_report_whatever_their_order():
    recs = flows(30, "treated", 40) + flows(10, "control", 4)
    assert report.analyse(recs) == report.analyse(list(reversed(recs)))
    assert report.analyse(recs) != report.analyse(recs, seed=2), "the seed must choose the resamples"


def write_log(path, lines: list) -> None:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))


def test_log_reading_tolerates_a_partial_last_line_and_counts_empty_flows(tmp_path):
    log = tmp_path / "experiment.jsonl"
    good = flows(2, "treated", 10) + flows(2, "control", 1)
    write_log(log, [*good, {**good[0], "seconds": 0}, {**good[1], "bytes_down": 0}])
    log.write_text(log.read_text() + '{"end": 17')   # the exporter is appending
    recs, left_out = report.read_records(str(log), strict=True)
    assert recs == good and left_out == {"skipped": 0, "empty": 2}, (recs, left_out)


def test_a_bad_line_is_named_when_strict_and_counted_otherwise(tmp_path):
    log = tmp_path / "experiment.jsonl"
    good = flows(3, "treated", 10)
    for bad, says in ((json.dumps({**good[1], "group": "other"}), "group 'other'"),
                      ('{"end": 17', "not JSON"),      # complete (a newline follows): not being written
                      (json.dumps({**good[1], "seconds": "1.2"}), "field 'seconds'")):
        write_log(log, [good[0], bad, good[2]])
        with pytest.raises(report.RecordError, match=rf"experiment.jsonl:2: {says}"):
            report.read_records(str(log), strict=True)
        assert report.read_records(str(log)) == ([good[0], good[2]], {"skipped": 1, "empty": 0}), bad


def args(**kw) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    report.add_arguments(p)
    return p.parse_args([f"--{k.replace('_', '-')}" + ("" if v is True else f"={v}") for k, v in kw.items()])


def test_run_prints_writes_json_that_round_trips_and_draws(tmp_path):
    log = tmp_path / "experiment.jsonl"
    recs = flows(21, "treated", 60) + flows(7, "control", 3)
    write_log(log, [*recs, "not a record"])
    out = io.StringIO()
    assert report.run(args(json=tmp_path / "r.json", plot=tmp_path / "r.svg"), str(log), out) == 0
    text = out.getvalue()
    assert "10M+" in text and "21/7" in text and "20.00 [" in text and "1 line(s)" in text, text
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved == {**report.analyse(recs), "log": str(log), "skipped": 1, "empty": 0}


def test_plot_draws_both_groups_and_the_gains_with_their_intervals(tmp_path):
    a = report.analyse(flows(21, "treated", 60) + flows(21, "control", 3)
                       + flows(5, "treated", 2, size=50_000) + flows(1, "control", 2, size=50_000))
    report.plot(a, str(tmp_path / "r.svg"))
    svg = xml.dom.minidom.parse(str(tmp_path / "r.svg"))
    marks = {}
    for g in svg.getElementsByTagName("g"):
        line, dot = g.getElementsByTagName("line")[0], g.getElementsByTagName("circle")[0]
        low, high, y = (float(line.getAttribute("y1")), float(line.getAttribute("y2")), float(dot.getAttribute("cy")))
        assert high <= y <= low, f"{g.getAttribute('class')}: the dot at y={y} is not inside its interval {low}..{high}"
        marks.setdefault(g.getAttribute("class"), []).append(y)
    # 10M+ has all four; 10k-100k both medians (its control's one flow) but no gain
    assert {k: len(v) for k, v in marks.items()} == {"treated": 2, "control": 2, "goodput_gain": 1,
                                                      "completion_gain": 1}, marks
    assert marks["treated"][1] < marks["control"][1], "treated's 60 Mbit/s must be drawn above control's 3"


def test_run_filters_by_graph_and_time(tmp_path):
    log = tmp_path / "experiment.jsonl"
    old = flows(3, "treated", 10, graph="g1", end=1_700_000_000) + flows(3, "control", 1, graph="g1",
                                                                         end=1_700_000_000)
    new = flows(3, "treated", 10, graph="g2", end=time.time()) + flows(3, "control", 1, graph="g2", end=time.time())
    write_log(log, old + new)
    for kw, graphs in (({"graph": "g1"}, {"g1", "all"}), ({"since": 3600}, {"g2", "all"}),
                       ({"since": 1_750_000_000}, {"g2", "all"}), ({}, {"g1", "g2", "all"})):
        assert report.run(args(json=tmp_path / "r.json", **kw), str(log), io.StringIO()) == 0
        saved = json.loads((tmp_path / "r.json").read_text())
        assert {r["graph"] for r in saved["rows"]} == graphs, (kw, saved["rows"])


def test_run_strict_names_the_bad_line(tmp_path, capsys):
    log = tmp_path / "experiment.jsonl"
    write_log(log, [*flows(2, "treated", 10), "[1, 2]"])
    assert report.run(args(strict=True), str(log), io.StringIO()) == 1
    assert "experiment.jsonl:3: not a JSON object" in capsys.readouterr().err


def test_run_without_a_log_says_how_to_turn_the_experiment_on(tmp_path, capsys):
    assert report.run(args(), str(tmp_path / "none.jsonl"), io.StringIO()) == 1
    err = capsys.readouterr().err
    assert "control_fraction = 0.05" in err and "pepctl reload" in err, err


def test_run_reads_the_rotated_log_too(tmp_path):
    """The exporter moves a full log to .1: its records still count, the older first."""
    log = tmp_path / "experiment.jsonl"
    write_log(tmp_path / "experiment.jsonl.1", flows(10, "treated", 60) + flows(4, "control", 3))
    write_log(log, flows(11, "treated", 60) + flows(3, "control", 3))
    assert report.run(args(json=tmp_path / "r.json"), str(log), io.StringIO()) == 0
    saved = json.loads((tmp_path / "r.json").read_text())
    got = [(r["treated"]["flows"], r["control"]["flows"]) for r in saved["rows"] if r["graph"] == "g1"]
    assert got == [(21, 7)], got
