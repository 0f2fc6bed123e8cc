"""pepctl report's statistics (pepctl/report.py) on records whose truth is known: the gain it gives
must be the one built into them, and its interval must hold it and exclude what it is not."""

from __future__ import annotations

import argparse
import io
import json
import random
import xml.dom.minidom

import pytest

from pepctl import report

MB = 10_500_000   # a 10 MiB object and its headers: size class "10M+"


def flows(n: int, group: str, mbps: float, size: int = MB, graph: str = "g1", seed: int = 0, spread: float = 0.2):
    """n records of goodput around mbps (uniform +-spread), all of one size."""
    rng = random.Random(hash((group, seed, mbps)))
    out = []
    for i in range(n):
        rate = mbps * (1 + rng.uniform(-spread, spread))
        out.append({"end": 1_800_000_000 + i, "graph": graph, "group": group, "client": f"198.18.0.{10 + i % 200}",
                    "server": "198.19.0.10", "server_port": 80, "bytes_down": size, "bytes_up": 100,
                    "seconds": size * 8 / rate / 1e6, "closed_by": "fin"})
    return out


def row(analysis: dict, size: str, graph: str = "all") -> dict:
    return next(r for r in analysis["rows"] if r["graph"] == graph and r["size"] == size)


def test_ten_times_faster_gives_ten_and_an_interval_that_excludes_one():
    a = report.analyse(flows(60, "treated", 60.0) + flows(15, "control", 6.0))
    g = row(a, "10M+")["goodput_gain"]
    assert 9 < g["value"] < 11, g
    assert g["low"] < g["value"] < g["high"] and g["low"] > 1, g
    c = row(a, "10M+")["completion_gain"]
    assert 9 < c["value"] < 11 and c["low"] > 1, c


def test_identical_groups_give_an_interval_around_one():
    a = report.analyse(flows(40, "treated", 20.0, seed=1) + flows(40, "control", 20.0, seed=2))
    g = row(a, "10M+")["goodput_gain"]
    assert g["low"] < 1 < g["high"], g


def test_size_classes_and_graphs_are_kept_apart():
    recs = (flows(5, "treated", 50, size=2_000_000) + flows(5, "control", 5, size=2_000_000)
            + flows(5, "treated", 10, size=50_000, graph="g2") + flows(5, "control", 8, size=50_000, graph="g2"))
    a = report.analyse(recs)
    got = sorted((r["graph"], r["size"], r["treated"]["flows"], r["control"]["flows"]) for r in a["rows"])
    assert got == [("all", "10k-100k", 5, 5), ("all", "1M-10M", 5, 5), ("g1", "1M-10M", 5, 5),
                   ("g2", "10k-100k", 5, 5)], got
    assert 8 < row(a, "1M-10M", "g1")["goodput_gain"]["value"] < 12


def test_too_few_flows_give_no_gain_and_say_so():
    a = report.analyse(flows(10, "treated", 50) + flows(1, "control", 5))
    r = row(a, "10M+")
    assert r["goodput_gain"] is None and r["note"] == "too few flows (treated 10, control 1)", r


def test_same_records_same_report():
    recs = flows(30, "treated", 40) + flows(10, "control", 4)
    assert report.analyse(recs) == report.analyse(list(reversed(recs)))


def test_log_reading_tolerates_a_partial_last_line_and_names_a_bad_one(tmp_path):
    log = tmp_path / "experiment.jsonl"
    good = flows(2, "treated", 10) + flows(2, "control", 1)
    empty = {**good[0], "seconds": 0}
    log.write_text("".join(json.dumps(r) + "\n" for r in (*good, empty)) + '{"end": 17')
    recs, left_out = report.read_records(str(log))
    assert len(recs) == 4 and left_out == {"skipped": 0, "empty": 1}, (len(recs), left_out)
    log.write_text(json.dumps(good[0]) + "\n" + json.dumps({**good[1], "group": "other"}) + "\n"
                   + json.dumps(good[2]) + "\n")
    with pytest.raises(report.RecordError, match=r"experiment.jsonl:2: group 'other'"):
        report.read_records(str(log), strict=True)
    assert report.read_records(str(log))[1]["skipped"] == 1


def args(**kw) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    report.add_arguments(p)
    return p.parse_args([f"--{k.replace('_', '-')}={v}" for k, v in kw.items()])


def test_run_prints_writes_json_and_draws(tmp_path):
    log = tmp_path / "experiment.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in flows(20, "treated", 60) + flows(8, "control", 3)))
    out = io.StringIO()
    assert report.run(args(json=tmp_path / "r.json", plot=tmp_path / "r.svg"), str(log), out) == 0
    text = out.getvalue()
    assert "10M+" in text and "20/8" in text, text
    saved = json.loads((tmp_path / "r.json").read_text())
    assert 15 < row(saved, "10M+")["goodput_gain"]["value"] < 25
    svg = xml.dom.minidom.parse(str(tmp_path / "r.svg"))
    assert svg.documentElement.tagName == "svg" and svg.getElementsByTagName("circle"), "no gain drawn"


def test_run_without_a_log_says_how_to_turn_the_experiment_on(tmp_path, capsys):
    assert report.run(args(), str(tmp_path / "none.jsonl"), io.StringIO()) == 1
    assert "control_fraction" in capsys.readouterr().err
