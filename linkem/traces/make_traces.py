"""The shipped capacity traces: a documented model of a cellular link, in mahimahi's format.

mahimahi's format: one line per delivery opportunity of 1500 bytes, its time in ms from the start
of the trace; lines are non-decreasing; the trace loops (linkem/README.md, "Traces").

The model, per 10 ms step (all random draws from one seeded generator, so the files reproduce):
  - fading: the log of the capacity follows an AR(1) process around log(mean), with a correlation
    time of CORR_MS (a few hundred ms: scheduler and channel changes) and a standard deviation of
    SIGMA (a factor of about 2 either way at one sigma);
  - slow drift: a second AR(1) component with a correlation time of several seconds (the
    subscriber moves, the cell's load changes);
  - outages: they start as a Poisson process (outages a minute) and last an exponential time
    (mean outage ms), with no capacity at all (handover, deep fade); one schedule for both
    directions of a link, as a radio that stops, stops both ways;
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

# link: (mean Mbit/s down, up, seconds, fading sigma, correlation ms, outages a minute, mean outage ms, seed)
LINKS = {
    "lte": (30, 10, 30, 0.6, 300, 4, 300, 2),
    "5g": (120, 30, 20, 0.5, 200, 3, 150, 3),
    "3g": (3, 1, 60, 0.7, 500, 6, 800, 5),
}
DIRECTIONS = ("down", "up")
DRIFT_MS, DRIFT_SIGMA = 5000, 0.3


def ar1(rng: random.Random, x: float, corr_ms: float, sigma: float) -> float:
    """One STEP_MS step of an AR(1) process with stationary standard deviation sigma."""
    a = math.exp(-STEP_MS / corr_ms)
    return a * x + math.sqrt(1 - a * a) * sigma * rng.gauss(0, 1)


def outages(steps: int, outages_per_min: float, outage_ms: float, seed: int) -> list[bool]:
    """Per step, whether the link is out. One schedule for both directions of a link: a handover
    or a deep fade stops the radio both ways at once."""
    rng = random.Random(seed)
    out, left = [], 0.0
    for _ in range(steps):
        if left <= 0 and rng.random() < outages_per_min * STEP_MS / 60000:
            left = rng.expovariate(1 / outage_ms)
        out.append(left > 0)
        left -= STEP_MS
    return out


def capacity(mean_mbit: float, steps: int, sigma: float, corr_ms: float, seed: int) -> list[float]:
    """Per step, the capacity in bit/s: fading and drift, their mean kept at mean_mbit."""
    rng = random.Random(seed)
    fade = drift = 0.0
    rates = []
    for _ in range(steps):
        fade = ar1(rng, fade, corr_ms, sigma)
        drift = ar1(rng, drift, DRIFT_MS, DRIFT_SIGMA)
        # exp of a normal of variance v has mean exp(v / 2): subtracted, so the mean stays mean_mbit
        rates.append(mean_mbit * 1e6 * math.exp(fade + drift - (sigma ** 2 + DRIFT_SIGMA ** 2) / 2))
    return rates


def trace(link: str, direction: str) -> list[int]:
    """The opportunities (ms) of one direction of one link of LINKS."""
    down, up, seconds, sigma, corr_ms, per_min, outage_ms, seed = LINKS[link]
    steps = int(seconds * 1000 / STEP_MS)
    out = outages(steps, per_min, outage_ms, seed)
    mean = down if direction == "down" else up
    rates = capacity(mean, steps, sigma, corr_ms, seed * 10 + DIRECTIONS.index(direction) + 1)
    carry = 0.0
    ms: list[int] = []
    for step, (rate, is_out) in enumerate(zip(rates, out, strict=True)):
        carry += 0.0 if is_out else rate * STEP_MS / 1000
        opps = int(carry // BITS_PER_OPP)
        carry -= opps * BITS_PER_OPP
        ms += [step * STEP_MS + (i * STEP_MS) // max(opps, 1) for i in range(opps)]
    end = int(seconds * 1000)
    return ms + [end] if not ms or ms[-1] < end else ms   # the period is the trace's length


def main() -> None:
    for link in LINKS:
        for direction in DIRECTIONS:
            write(link, direction)


def write(link: str, direction: str) -> None:
    ms = trace(link, direction)
    path = os.path.join(HERE, f"{link}-{direction}.trace")
    with open(path, "w") as f:
        f.write("".join(f"{t}\n" for t in ms))
    mean = len(ms) * BITS_PER_OPP / ms[-1] / 1e3
    print(f"{path}: {len(ms)} opportunities in {ms[-1] / 1000:g} s, mean {mean:.1f} Mbit/s")


if __name__ == "__main__":
    main()
