"""The shipped capacity traces (linkem/traces/) are what their documented model makes, are valid
mahimahi traces, and the trace-driven profiles name them."""

from __future__ import annotations

import importlib.util
import os

import pytest

from linkem import profiles

TRACES_DIR = os.path.join(os.path.dirname(profiles.__file__), "traces")
spec = importlib.util.spec_from_file_location("make_traces", os.path.join(TRACES_DIR, "make_traces.py"))
make_traces = importlib.util.module_from_spec(spec)
spec.loader.exec_module(make_traces)


def read_trace(link: str, direction: str) -> list[int]:
    with open(os.path.join(TRACES_DIR, f"{link}-{direction}.trace")) as f:
        return [int(line) for line in f]


def gaps(ms: list[int], at_least: int) -> list[tuple[int, int]]:
    """The silences of at least at_least ms: (start, end) in ms."""
    return [(a, b) for a, b in zip(ms, ms[1:], strict=False) if b - a >= at_least]


@pytest.mark.parametrize("link", sorted(make_traces.LINKS))
@pytest.mark.parametrize("direction", make_traces.DIRECTIONS)
def test_shipped_trace_is_the_models_and_valid(link, direction):
    name = f"{link}-{direction}"
    shipped = read_trace(link, direction)
    assert shipped == make_traces.trace(link, direction), \
        f"linkem/traces/{name}.trace is not what make_traces.py makes: run it again and commit"
    assert all(a <= b for a, b in zip(shipped, shipped[1:], strict=False)), f"{name}: times must not decrease"
    down, up, seconds = make_traces.LINKS[link][:3]
    mean_mbit = down if direction == "down" else up
    got = len(shipped) * 1500 * 8 / (shipped[-1] / 1000) / 1e6
    assert 0.5 * mean_mbit < got < 1.5 * mean_mbit, f"{name}: mean {got:.1f} Mbit/s, the model's {mean_mbit}"
    assert gaps(shipped, 100), f"{name}: no outage of 100 ms or more in {seconds} s"


@pytest.mark.parametrize("link", sorted(make_traces.LINKS))
def test_outages_stop_both_directions_at_once(link):
    """A radio that stops, stops both ways: each outage of the downlink is silence on the uplink."""
    down, up = read_trace(link, "down"), read_trace(link, "up")
    for start, end in gaps(down, 100):
        # the uplink's capacity fills what the outage left at its edges: look inside by one step
        inside = [t for t in up if start + make_traces.STEP_MS < t < end - make_traces.STEP_MS]
        assert not inside, f"{link}: the downlink is silent {start}..{end} ms, the uplink sends at {inside[:3]}"


@pytest.mark.parametrize("profile", ["lte-trace", "5g-trace", "3g-trace"])
def test_trace_profiles_name_shipped_traces_with_deep_buffers(profile):
    words = dict(w.split("=", 1) for w in profiles.profile_words(profile))
    for d in ("a2b", "b2a"):
        assert os.path.isfile(words[f"{d}.trace"]), words
        assert float(words[f"{d}.limit_ms"]) >= 200, words
