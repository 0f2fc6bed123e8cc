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


@pytest.mark.parametrize("name", sorted(make_traces.TRACES))
def test_shipped_trace_is_the_models_and_valid(name):
    with open(os.path.join(TRACES_DIR, f"{name}.trace")) as f:
        shipped = [int(line) for line in f]
    assert shipped == make_traces.trace(*make_traces.TRACES[name]), \
        f"linkem/traces/{name}.trace is not what make_traces.py makes: run it again and commit"
    assert all(a <= b for a, b in zip(shipped, shipped[1:], strict=False)), f"{name}: times must not decrease"
    mean_mbit, seconds = make_traces.TRACES[name][:2]
    got = len(shipped) * 1500 * 8 / (shipped[-1] / 1000) / 1e6
    assert 0.5 * mean_mbit < got < 1.5 * mean_mbit, f"{name}: mean {got:.1f} Mbit/s, the model's {mean_mbit}"
    gaps = [b - a for a, b in zip(shipped, shipped[1:], strict=False)]
    if name.endswith("-down"):   # the up traces' own draws gave them none in their short length
        assert max(gaps) >= 100, f"{name}: no outage of 100 ms or more in {seconds} s"


@pytest.mark.parametrize("profile", ["lte-trace", "5g-trace", "3g-trace"])
def test_trace_profiles_name_shipped_traces_with_deep_buffers(profile):
    words = dict(w.split("=", 1) for w in profiles.profile_words(profile))
    for d in ("a2b", "b2a"):
        assert os.path.isfile(words[f"{d}.trace"]), words
        assert float(words[f"{d}.limit_ms"]) >= 200, words
