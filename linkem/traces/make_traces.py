"""The shipped capacity traces: a documented model of a cellular link, in mahimahi's format.

mahimahi's format: one line per delivery opportunity of 1500 bytes, its time in ms from the start
of the trace; lines are non-decreasing; the trace loops (linkem/README.md, "Traces").

The model, per 10 ms step (all random draws from one seeded generator, so the files reproduce):
  - fading: the log of the capacity follows an AR(1) process around log(mean), with a correlation
    time of CORR_MS (a few hundred ms: scheduler and channel changes) and a standard deviation of
    SIGMA (a factor of about 2 either way at one sigma);
  - slow drift: a second AR(1) component with a correlation time of several seconds (the
    subscriber moves, the cell's load changes);
  - outages: they start as a Poisson process (OUTAGES_PER_MIN) and last an exponential time (mean
    OUTAGE_MS), with no capacity at all (handover, deep fade);
  - the capacity of a step becomes opportunities: its bits, plus what the last step left over,
    in 12,000-bit units spread evenly over its 10 ms.
The mean of the result differs from `mean` by the outages' share and the draws; each file's real
mean rate is what linkem reports (`params`: trace_mean_bps).

    .venv/bin/python linkem/traces/make_traces.py    # rewrites linkem/traces/*.trace
"""

from __future__ import annotations

import math
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
STEP_MS = 10
BITS_PER_OPP = 1500 * 8

# name: (mean Mbit/s, seconds, fading sigma, correlation ms, outages a minute, mean outage ms, seed)
TRACES = {
    "lte-down": (30, 30, 0.6, 300, 4, 300, 1),
    "lte-up": (10, 30, 0.6, 300, 4, 300, 2),
    "5g-down": (120, 20, 0.5, 200, 3, 150, 3),
    "5g-up": (30, 20, 0.5, 200, 3, 150, 4),
    "3g-down": (3, 60, 0.7, 500, 6, 800, 5),
    "3g-up": (1, 60, 0.7, 500, 6, 800, 6),
}
DRIFT_MS, DRIFT_SIGMA = 5000, 0.3


def ar1(rng: random.Random, x: float, corr_ms: float, sigma: float) -> float:
    """One STEP_MS step of an AR(1) process with stationary standard deviation sigma."""
    a = math.exp(-STEP_MS / corr_ms)
    return a * x + math.sqrt(1 - a * a) * sigma * rng.gauss(0, 1)


def trace(mean_mbit: float, seconds: float, sigma: float, corr_ms: float, outages_per_min: float,
          outage_ms: float, seed: int) -> list[int]:
    rng = random.Random(seed)
    fade = drift = carry = 0.0
    outage_left = 0.0
    out: list[int] = []
    for step in range(int(seconds * 1000 / STEP_MS)):
        fade = ar1(rng, fade, corr_ms, sigma)
        drift = ar1(rng, drift, DRIFT_MS, DRIFT_SIGMA)
        if outage_left <= 0 and rng.random() < outages_per_min * STEP_MS / 60000:
            outage_left = rng.expovariate(1 / outage_ms)
        # exp of a normal of variance v has mean exp(v / 2): subtracted, so the mean stays mean_mbit
        level = math.exp(fade + drift - (sigma ** 2 + DRIFT_SIGMA ** 2) / 2)
        rate = 0.0 if outage_left > 0 else mean_mbit * 1e6 * level
        outage_left -= STEP_MS
        carry += rate * STEP_MS / 1000
        opps = int(carry // BITS_PER_OPP)
        carry -= opps * BITS_PER_OPP
        out += [step * STEP_MS + (i * STEP_MS) // max(opps, 1) for i in range(opps)]
    end = int(seconds * 1000)
    return out + [end] if not out or out[-1] < end else out   # the period is the trace's length


def main() -> None:
    for name, params in TRACES.items():
        ms = trace(*params)
        path = os.path.join(HERE, f"{name}.trace")
        with open(path, "w") as f:
            f.write("".join(f"{t}\n" for t in ms))
        mean = len(ms) * BITS_PER_OPP / ms[-1] / 1e3
        print(f"{path}: {len(ms)} opportunities in {ms[-1] / 1000:g} s, mean {mean:.1f} Mbit/s")


if __name__ == "__main__":
    main()
