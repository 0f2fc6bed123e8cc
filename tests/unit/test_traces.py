"""The shipped capacity traces (linkem/traces/) are what their documented model makes, are valid
mahimahi traces, deliver in bursts the way the public LTE drive traces do (the statistics the
model is calibrated to, within bands), keep the outage rules, and the trace-driven profiles name
them.

How right is told from wrong: each trace is read from its file and measured with
make_traces.statistics() (the definitions the calibration used); the bands below are the range
of the real traces' statistics (in the model's docstring) widened by a tolerance, per rate class:
a slow link (a few Mbit/s) delivers one or two packets per active ms, a fast one several.
"""

from __future__ import annotations

import importlib.util
import os
import re

import pytest

from linkem import profiles

TRACES_DIR = os.path.join(os.path.dirname(profiles.__file__), "traces")
spec = importlib.util.spec_from_file_location("make_traces", os.path.join(TRACES_DIR, "make_traces.py"))
make_traces = importlib.util.module_from_spec(spec)
spec.loader.exec_module(make_traces)

TRACES = [(link, d) for link in make_traces.LINKS for d in make_traces.DIRECTIONS]
PROFILES = {"lte": "lte-trace", "5g": "5g-trace", "3g": "3g-trace", "drive": "drive-trace"}

# Statistic: (low, high) per rate class. Real LTE/UMTS traces: the share of active ms with several
# packets 0.23-0.46 (4-6 Mbit/s) and 0.59-0.82 (13-17 Mbit/s), 0.11 on the UMTS uplink (1 Mbit/s);
# packets per active ms 1.37-1.70 and 2.55-5.07, 1.14 on the UMTS uplink; gap percentiles 1-10 /
# 4-20 / 12-54 ms; 100 ms CV 0.53-1.22; the step from one 100 ms bin to the next, over the mean,
# 0.12-0.46 (median) and 0.38-1.61 (90th percentile).
STEPS = {"step_100ms_p50": (0.1, 0.35), "step_100ms_p90": (0.3, 1.0)}
SLOW, MID, FAST = "slow (< 4 Mbit/s)", "mid (4-12 Mbit/s)", "fast (> 12 Mbit/s)"
BANDS = {
    SLOW: {"multi": (0.08, 0.5), "per_active": (1.1, 2.0), "gap_p50": (2, 12), "gap_p90": (8, 45),
           "gap_p99": (25, 130), "cv_100ms": (0.5, 1.3), **STEPS},
    MID: {"multi": (0.2, 0.65), "per_active": (1.3, 3.5), "gap_p50": (1, 3), "gap_p90": (5, 16),
          "gap_p99": (15, 60), "cv_100ms": (0.5, 1.3), **STEPS},
    FAST: {"multi": (0.5, 1.0), "per_active": (2.5, 40), "gap_p50": (1, 3), "gap_p90": (5, 16),
           "gap_p99": (15, 60), "cv_100ms": (0.45, 1.3), **STEPS},
}


def read_trace(link: str, direction: str) -> list[int]:
    with open(os.path.join(TRACES_DIR, f"{link}-{direction}.trace")) as f:
        return [int(line) for line in f]


def rate_class(mean_mbit: float) -> str:
    return SLOW if mean_mbit < 4 else MID if mean_mbit <= 12 else FAST


def silences(ms: list[int], at_least: int) -> list[tuple[int, int]]:
    """The silences of at least at_least ms: (last opportunity before, first after) in ms."""
    return [(a, b) for a, b in zip(ms, ms[1:], strict=False) if b - a >= at_least]


def sent_in(ms: list[int], start: int, end: int) -> list[int]:
    return [t for t in ms if start <= t < end]


@pytest.fixture(scope="module")
def shipped() -> dict[tuple[str, str], list[int]]:
    return {(link, d): read_trace(link, d) for link, d in TRACES}


@pytest.mark.parametrize(("link", "direction"), TRACES)
def test_shipped_trace_is_the_models_and_valid(link, direction, shipped):
    name = f"{link}-{direction}"
    ms = shipped[link, direction]
    assert ms == make_traces.trace(link, direction), \
        f"linkem/traces/{name}.trace is not what make_traces.py makes: run it again and commit"
    assert ms[0] >= 0 and all(a <= b for a, b in zip(ms, ms[1:], strict=False)), f"{name}: times must not decrease"
    lk = make_traces.LINKS[link]
    assert ms[-1] == lk.seconds * 1000, f"{name}: period {ms[-1]} ms, want the link's {lk.seconds} s"
    mean_mbit = lk.down if direction == "down" else lk.up
    got = make_traces.statistics(ms)["mean_mbit"]
    # the outages take their share, the fading's draws over a few drift times some more
    assert 0.5 * mean_mbit < got < 1.5 * mean_mbit, f"{name}: mean {got:.1f} Mbit/s, the model's {mean_mbit}"
    # and the profile's description says what the file holds: "~24/10 Mbit/s"
    description = profiles.load()[PROFILES[link]]["description"]
    said = re.search(r"~([\d.]+)/([\d.]+) Mbit/s", description)
    assert said, f"{PROFILES[link]}: its description names no ~DOWN/UP Mbit/s: {description!r}"
    want = float(said.group(1 if direction == "down" else 2))
    assert abs(got / want - 1) < 0.1, f"{name}: mean {got:.2f} Mbit/s, its profile's description says ~{want}"
    assert os.path.getsize(os.path.join(TRACES_DIR, f"{name}.trace")) < 1.5e6, f"{name}: too big to ship"


@pytest.mark.parametrize(("link", "direction"), TRACES)
def test_delivery_is_bursty_like_real_lte(link, direction, shipped):
    """The statistics of the public LTE drive traces, within bands for the trace's rate class."""
    s = make_traces.statistics(shipped[link, direction])
    cls = rate_class(s["mean_mbit"])
    bad = {k: round(s[k], 2) for k, (lo, hi) in BANDS[cls].items() if not lo <= s[k] <= hi}
    assert not bad, f"{link}-{direction} ({cls}): outside the calibrated bands {BANDS[cls]}: {bad}"
    # scheduler silences: gaps of 100 ms or more that are not outages, a few a minute
    assert 3 <= s["silences_per_min"] <= 50, f"{link}-{direction}: {s['silences_per_min']:.1f} silences a minute"
    # a smooth model (the old one) had its 90th percentile gap at 1 ms on fast links: bursts, not a stream
    assert s["gap_p90"] >= 5, f"{link}-{direction}: 90% of gaps under 5 ms, the delivery is not bursty"


def test_packets_per_active_ms_grow_with_the_rate(shipped):
    """As in the real traces: a faster link gets bigger grants, not more frequent ones."""
    by_rate = sorted((make_traces.statistics(ms)["mean_mbit"], make_traces.statistics(ms)["per_active"], key)
                     for key, ms in shipped.items())
    per = [p for _, p, _ in by_rate]
    assert per == sorted(per), f"packets per active ms do not grow with the rate: {by_rate}"


@pytest.mark.parametrize("link", sorted(make_traces.LINKS))
def test_joint_outages_stop_both_directions(link, shipped):
    """A radio that stops, stops both ways: no opportunity in either direction during a joint
    outage; a one-way outage stops its own direction only."""
    outages = make_traces.schedule(link)
    assert any(o.where == "both" for o in outages), f"{link}: no joint outage in {make_traces.LINKS[link].seconds} s"
    for o in outages:
        for d in make_traces.DIRECTIONS:
            inside = sent_in(shipped[link, d], o.start_ms, o.end_ms)
            if o.where in ("both", d):
                assert not inside, f"{link}: {o} but the {d}link sends at {inside[:3]} ms"
    for o in (o for o in outages if o.where != "both"):
        other = "up" if o.where == "down" else "down"
        assert sent_in(shipped[link, other], o.start_ms, o.end_ms), \
            f"{link}: {o} is one-way, yet the {other}link is silent too"


def test_drive_outages():
    """The drive profile: outages of 0.1-3 s, some of one direction only (both ways), and a 20 s run
    from the start meets two joint ones of 0.5 s or more, one of them 1.5 s or more."""
    outages = make_traces.schedule("drive")
    lengths = [o.end_ms - o.start_ms for o in outages]
    assert all(100 <= n <= 3000 for n in lengths), f"drive: outage lengths {lengths} ms, want 100..3000"
    assert {o.where for o in outages} == {"both", "down", "up"}, f"drive: want joint and one-way outages: {outages}"
    first = sorted((o.end_ms - o.start_ms for o in outages if o.where == "both" and o.end_ms <= 20000), reverse=True)
    assert len(first) >= 2 and first[0] >= 1500 and first[1] >= 500, \
        f"drive: joint outages in the first 20 s last {first} ms; want two >= 500 ms, one >= 1500 ms"


def test_drive_silences_are_its_outages_at_most(shipped):
    """No silence in the drive traces is longer than the longest outage plus a grant gap and a
    scheduler silence at its edge."""
    longest = make_traces.LINKS["drive"].outage_max_ms
    for d in make_traces.DIRECTIONS:
        worst = max(b - a for a, b in silences(shipped["drive", d], 1))
        assert worst <= longest + 500, f"drive-{d}: a silence of {worst} ms, outages last at most {longest} ms"


@pytest.mark.parametrize(("link", "profile"), sorted(PROFILES.items()))
def test_trace_profiles_name_shipped_traces_with_deep_buffers(link, profile):
    words = dict(w.split("=", 1) for w in profiles.profile_words(profile))
    for d, direction in (("a2b", "up"), ("b2a", "down")):
        assert words[f"{d}.trace"] == os.path.join(TRACES_DIR, f"{link}-{direction}.trace"), words
        assert os.path.isfile(words[f"{d}.trace"]), words
        assert float(words[f"{d}.limit_ms"]) >= 200, words


def test_drive_profile():
    """50 ms RTT, a 500 ms drop-tail buffer, LTE-like rates, long enough that a 20 s run does not loop."""
    words = dict(w.split("=", 1) for w in profiles.profile_words("drive-trace"))
    assert float(words["a2b.delay"]) + float(words["b2a.delay"]) == 50, words
    assert words["a2b.limit_ms"] == words["b2a.limit_ms"] == "500", words
    lk = make_traces.LINKS["drive"]
    assert lk.seconds >= 60, lk
    down = make_traces.statistics(read_trace("drive", "down"))["mean_mbit"]
    up = make_traces.statistics(read_trace("drive", "up"))["mean_mbit"]
    assert 5 <= down <= 10 and 2 <= up <= 5, f"drive: {down:.1f}/{up:.1f} Mbit/s, want 5-10 down, 2-5 up"
