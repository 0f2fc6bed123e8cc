"""The shipped capacity traces: a documented model of a cellular link, in mahimahi's format.

mahimahi's format: one line per delivery opportunity of 1500 bytes, its time in ms from the start
of the trace; lines are non-decreasing; the trace loops (linkem/README.md, "Traces").

The model has two layers. All random draws come from generators seeded per link and direction,
so the files reproduce exactly (tests/unit/test_traces.py checks that the shipped files are what
this module makes).

1. The capacity process, per 10 ms step (STEP_MS): what the radio could carry.
   - fading: the log of the capacity follows an AR(1) process around log(mean), with a correlation
     time of `corr_ms` (a few hundred ms: scheduler and channel changes) and a standard deviation
     of `sigma` (a factor of about 2 either way at one sigma);
   - slow drift: a second AR(1) component, DRIFT_MS and DRIFT_SIGMA (the subscriber moves, the
     cell's load changes);
   - outages: they start as a Poisson process (`outages_per_min`) and last an exponential time
     (mean `outage_ms`, clipped to `outage_min_ms`..`outage_max_ms`), with no capacity at all
     (handover, deep fade, tunnel). One schedule stops both directions at once, as a radio that
     stops, stops both ways. A link may also have outages of one direction only
     (`oneway_per_min` per direction, the same length law): drive traces show the uplink losing
     its grants for seconds while the downlink still delivers, and the other way round. A
     one-way outage closer than ONEWAY_GUARD_MS to a joint one is dropped, so every outage is a
     silence of its own and none is longer than `outage_max_ms`.
   Each direction has its own fading and drift (its own seed): the uplink that carries the ACKs
   varies on its own.

2. The grant process, per ms: when the capacity is delivered. An LTE eNodeB does not hand a
   subscriber its capacity evenly: it schedules it in grants, at instants a few ms apart, with
   several 1500-byte packets in one ms and then none for a while. The model:
   - scheduling instants: the time to the next one is, with probability 1 - P_LONG, geometric on
     1, 2, 3... ms with mean SHORT_GAP_MS (consecutive TTIs, and the rhythm of a scheduler that
     serves other users between grants); with probability P_LONG a long gap, lognormal with
     median LONG_GAP_MS and log-sd LONG_GAP_SIGMA, at least LONG_GAP_FLOOR_MS (HARQ round trips,
     DRX, a subscriber the scheduler passes over for a while). MEAN_GAP_MS is their mean;
   - scheduler silences: per direction, a Poisson process of `silences_per_min` pauses of
     SILENCE_MIN_MS plus an exponential time of mean SILENCE_MEAN_MS, during which no grant
     comes although the link is up. Their capacity is lost (the scheduler served others), so the
     capacity process is raised by their expected share, and the link's mean stays `down`/`up`;
   - grant size: each instant carries a number of opportunities drawn independently of the gap
     before it (real traces show no such link): 1 plus a geometric number, of mean
     m = (capacity + debt / DEBT_MS) * MEAN_GAP_MS, the capacity of one mean gap. The debt is
     what the capacity process offered and the grants did not deliver yet; dividing it by
     DEBT_MS repays it over about that time, so the mean rate over seconds is the capacity's,
     while over tens of ms it swings by the grants' chance;
   - slow links: when m falls below GRANT_MIN (about 1.4 opportunities), an instant grants only
     once the debt holds a whole opportunity, and the grant's mean is GRANT_MIN. So a slow link
     gets rarer grants of one or two packets, not many grants of one, as in the real traces;
   - a grant larger than `max_per_ms` (the radio's peak: its largest transport block a ms)
     continues in the following ms.
   So the packets per active ms grow with the rate (about 1.5 at 5 Mbit/s, 4-5 at 15 Mbit/s) and
   the gaps between them keep the scheduler's rhythm whatever the rate, as measured.

The parameters of the grant process were calibrated to the published statistics of public LTE
drive traces (ATT, T-Mobile and Verizon LTE and T-Mobile UMTS, up and down; see
statistics() for the definitions): gaps between active ms with a median of 2 ms, a 90th
percentile of 6-16 ms, a 99th of 20-55 ms, and 1-50 silences of 100 ms or more a minute; 0.24
of the active ms with several packets and 1.45 packets per active ms on 5 Mbit/s links, 0.8 and
5 at 13-17 Mbit/s; a coefficient of variation of 0.6-1.2 for the rate in 100 ms bins, which moves from one 100 ms bin to
the next by a median of 0.14-0.26 of the mean (90th percentile 0.5-0.8): the fading's correlation
time (800-1000 ms) is what keeps the model's steps near that (at 300 ms they were twice the real
ones). The grant
sizes are geometric because the real per-ms counts are (P(1), P(2), ... fall by a constant
factor). 5G uses the LTE grant rhythm (no public 5G trace was measured); only its peak differs.
A 3G link (`tti_ms`) grants on UMTS's transmission time interval instead of that rhythm: every
tti_ms, give or take TTI_JITTER_MS, a TTI carries what the capacity owes (the debt, rounded at
random: a slow link skips TTIs), over consecutive ms of one to max_per_ms packets each. The recorded
TMobile-UMTS-driving trace does so: 73% of its uplink's bursts start 9-11 ms after the one before
(10% 19-21 ms: a skipped TTI), its downlink's 53%, and its 100 ms bins move from
one to the next by 0.12-0.13 of the mean (median), where LTE's rhythm made 3g 0.20-0.24 (and an
uplink gap p99 of 92 ms against the real 52). Its uplink is steadier than its downlink (100 ms CV
0.53 against 0.83): `up_sigma`. Measured on that trace against 3g (make_traces.statistics):
down multi 0.33/0.34, per active ms 1.41/1.41, gaps 6/16/41 against 9/18/31, 100 ms steps
0.12/0.48 against 0.13/0.51; up multi 0.11/0.15, 1.14/1.16, gaps 10/20/52 against 10/21/38, CV
0.53/0.53, steps 0.13/0.38 against 0.12/0.35. Over 1 s the model's 3g still moves about twice as
much as that recording (median step 0.27 against 0.14): harder, not easier.
The drive link's seed (see LINKS) was chosen for its outage schedule: the first seed from 6 up
whose first 20 s hold two joint outages of 0.5 s or more, one of them 1.5 s or more (so a 20 s
run from the start of the trace meets them), and that has one-way outages in both directions.

The mean of a file differs from `down`/`up` by the outages' share and the draws; each file's
real mean rate is what linkem reports (`params`: trace_mean_bps) and what this script prints.

    .venv/bin/python linkem/traces/make_traces.py    # rewrites linkem/traces/*.trace
"""

from __future__ import annotations

import math
import os
import random
import statistics as stats
from typing import NamedTuple

HERE = os.path.dirname(os.path.abspath(__file__))
STEP_MS = 10
BITS_PER_OPP = 1500 * 8
DIRECTIONS = ("down", "up")
DRIFT_MS, DRIFT_SIGMA = 5000, 0.3

# The grant process (see the docstring), calibrated to public LTE drive traces.
SHORT_GAP_MS = 2.6          # geometric rhythm: P(1 ms) = 0.38, P(2) = 0.24, P(3) = 0.15, ...
P_LONG = 0.07               # share of long gaps: they make the 90th percentile 7-9 ms
LONG_GAP_MS, LONG_GAP_SIGMA, LONG_GAP_FLOOR_MS = 12.0, 0.5, 6   # and the 99th 20-30 ms
MEAN_GAP_MS = (1 - P_LONG) * SHORT_GAP_MS + P_LONG * LONG_GAP_MS * math.exp(LONG_GAP_SIGMA ** 2 / 2)
GRANT_MIN = 1.4             # the smallest mean grant: 1.45 packets per active ms on slow links
DEBT_MS = 300.0             # the undelivered capacity is repaid over about this time
SILENCE_MIN_MS, SILENCE_MEAN_MS = 100, 70   # scheduler silences: median about 150 ms, as measured
ONEWAY_GUARD_MS = 500
TTI_JITTER_MS = 0.7         # a TTI 9, 10 or 11 ms after the one before: 0.22, 0.53, 0.22


class Link(NamedTuple):
    down: float                 # mean of the capacity process, Mbit/s, network -> client
    up: float                   # the same, client -> network
    seconds: int                # the trace's length (it loops)
    sigma: float                # fading: standard deviation of the log of the capacity
    corr_ms: float              # fading: correlation time
    outages_per_min: float      # joint outages (both directions)
    outage_ms: float            # their mean length (exponential), and the one-way ones'
    seed: int
    silences_per_min: float     # scheduler silences of 100 ms or more, per direction
    max_per_ms: int             # the radio's peak: opportunities in one ms
    oneway_per_min: float = 0.0             # outages of one direction only, per direction
    outage_min_ms: float = 0.0              # outage lengths clipped to this range
    outage_max_ms: float = math.inf
    up_sigma: float | None = None           # the uplink's fading, when it differs from the downlink's
    tti_ms: int = 0                         # grants on this fixed rhythm (3G's TTI), 0: LTE's scheduler


LINKS = {
    # fading of 0.45-0.6 with 0.8-1 s correlation: the 100 ms steps of the real traces (statistics())
    "lte": Link(30, 10, 30, 0.5, 1000, 4, 300, 2, silences_per_min=8, max_per_ms=25),
    "5g": Link(120, 30, 20, 0.45, 800, 3, 150, 3, silences_per_min=4, max_per_ms=100),
    # UMTS: grants on its 10 ms TTI, a steadier uplink (the recorded TMobile-UMTS-driving trace's)
    "3g": Link(3, 1, 60, 0.6, 1000, 6, 800, 5, silences_per_min=6, max_per_ms=3, up_sigma=0.3, tti_ms=10),
    # a drive: deeper fading, outages of 0.1-3 s (tunnels, handovers, cell edges), some one way
    "drive": Link(8, 3, 60, 0.55, 800, 6, 800, 13, silences_per_min=15, max_per_ms=25,
                  oneway_per_min=2, outage_min_ms=100, outage_max_ms=3000),
}


class Outage(NamedTuple):
    start_ms: int
    end_ms: int
    where: str                  # "both", "down" or "up"


def ar1(rng: random.Random, x: float, corr_ms: float, sigma: float) -> float:
    """One STEP_MS step of an AR(1) process with stationary standard deviation sigma."""
    a = math.exp(-STEP_MS / corr_ms)
    return a * x + math.sqrt(1 - a * a) * sigma * rng.gauss(0, 1)


def outage_spans(steps: int, per_min: float, mean_ms: float, lo: float, hi: float,
                 seed: int) -> list[tuple[int, int]]:
    """Outages as (start, end) ms, whole steps: Poisson starts, exponential lengths clipped."""
    rng = random.Random(seed)
    spans: list[list[int]] = []
    left = 0.0
    for step in range(steps):
        if left <= 0 and rng.random() < per_min * STEP_MS / 60000:
            left = min(max(rng.expovariate(1 / mean_ms), lo), hi)
            spans.append([step * STEP_MS, step * STEP_MS])
        if left > 0:
            spans[-1][1] = (step + 1) * STEP_MS
        left -= STEP_MS
    return [(a, b) for a, b in spans]


def schedule(link: str) -> list[Outage]:
    """Every outage of a link, joint and one-way, by start."""
    lk = LINKS[link]
    steps = lk.seconds * 1000 // STEP_MS
    args = (lk.outage_ms, lk.outage_min_ms, lk.outage_max_ms)
    joint = outage_spans(steps, lk.outages_per_min, *args, lk.seed)
    out = [Outage(a, b, "both") for a, b in joint]
    if lk.oneway_per_min:
        for i, where in enumerate(DIRECTIONS):
            for a, b in outage_spans(steps, lk.oneway_per_min, *args, lk.seed * 10 + 5 + i):
                if all(b + ONEWAY_GUARD_MS <= ja or a >= jb + ONEWAY_GUARD_MS for ja, jb in joint):
                    out.append(Outage(a, b, where))
    return sorted(out)


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


def grant_gap(rng: random.Random) -> int:
    """ms to the next scheduling instant."""
    if rng.random() < P_LONG:
        return max(LONG_GAP_FLOOR_MS, round(rng.lognormvariate(math.log(LONG_GAP_MS), LONG_GAP_SIGMA)))
    return 1 + int(math.log(1 - rng.random()) / math.log(1 - 1 / SHORT_GAP_MS))


def tti_gap(rng: random.Random, tti_ms: int) -> int:
    """ms to the next TTI: the interval, give or take a ms or two (the recorded UMTS traces' 9-11 ms)."""
    return max(1, tti_ms + round(rng.gauss(0, TTI_JITTER_MS)))


def grant_size(rng: random.Random, mean: float) -> int:
    """1 plus a geometric number of opportunities: mean `mean` (>= 1)."""
    q = (mean - 1) / mean
    return 1 if q <= 0 else 1 + int(math.log(1 - rng.random()) / math.log(q))


def trace(link: str, direction: str) -> list[int]:
    """The opportunities (ms) of one direction of one link of LINKS."""
    lk = LINKS[link]
    d = DIRECTIONS.index(direction)
    steps = lk.seconds * 1000 // STEP_MS
    end = steps * STEP_MS
    out = [False] * steps
    for o in schedule(link):
        if o.where in ("both", direction):
            for s in range(o.start_ms // STEP_MS, min(o.end_ms // STEP_MS, steps)):
                out[s] = True
    silence_share = lk.silences_per_min * (SILENCE_MIN_MS + SILENCE_MEAN_MS) / 60000
    mean = lk.down if direction == "down" else lk.up
    sigma = lk.up_sigma if direction == "up" and lk.up_sigma is not None else lk.sigma
    # opportunities per ms, raised by the silences' share (their capacity is lost)
    per_ms = [r / (1 - silence_share) / BITS_PER_OPP / 1000
              for r in capacity(mean, steps, sigma, lk.corr_ms, lk.seed * 10 + d + 1)]
    rng = random.Random(lk.seed * 10 + 3 + d)
    silence_rate = lk.silences_per_min / 60000
    next_silence = rng.expovariate(silence_rate) if silence_rate else math.inf
    silent_until = 0.0
    debt, next_grant, spill = 0.0, 0, 0
    ms: list[int] = []
    for t in range(end):
        if t >= next_silence:
            silent_until = t + SILENCE_MIN_MS + rng.expovariate(1 / SILENCE_MEAN_MS)
            next_silence = silent_until + rng.expovariate(silence_rate)
        if out[t // STEP_MS]:
            spill = 0           # an outage cuts a grant short
            continue
        if t < silent_until:
            continue
        c = per_ms[t // STEP_MS]
        debt += c
        n = spill
        if t >= next_grant and lk.tti_ms:
            k = max(0, math.floor(debt + rng.random()))   # what is owed, rounded at random
            n += k
            debt -= k
            next_grant = t + tti_gap(rng, lk.tti_ms)
        elif t >= next_grant:
            m = max(0.0, (c + debt / DEBT_MS) * MEAN_GAP_MS)
            if m >= GRANT_MIN or debt >= 1:
                k = grant_size(rng, max(m, GRANT_MIN))
                n += k
                debt -= k
            next_grant = t + grant_gap(rng)
        # a TTI's packets leave over consecutive ms, one to max_per_ms a ms (as the UMTS traces' do)
        now = min(n, rng.randint(1, lk.max_per_ms) if lk.tti_ms and n else lk.max_per_ms)
        spill = n - now
        ms += [t] * now
    return ms + [end] if not ms or ms[-1] < end else ms   # the period is the trace's length


def statistics(ms: list[int]) -> dict[str, float]:
    """The statistics the model is calibrated to, of a trace (ms of its opportunities).

    mean_mbit: opportunities x 12,000 bits over the period (the last time); multi: the share of
    active ms (ms with an opportunity) that have several; per_active: opportunities per active ms;
    gap_p50/p90/p99/max: ms between consecutive active ms (nearest-rank percentiles);
    silences_per_min: gaps of 100 ms or more a minute; cv_100ms: the coefficient of variation of
    the opportunities in 100 ms bins; step_100ms_p50/p90: the change from one 100 ms bin to the
    next, over the mean bin (how fast the rate moves: what a sender must follow).
    """
    period = ms[-1]
    counts: dict[int, int] = {}
    for t in ms:
        counts[t] = counts.get(t, 0) + 1
    active = sorted(counts)
    gaps = sorted(b - a for a, b in zip(active, active[1:], strict=False))
    bins = [0] * (period // 100)
    for t in ms:
        if t // 100 < len(bins):
            bins[t // 100] += 1

    def pct(q: float) -> int:
        return gaps[min(len(gaps) - 1, int(q * len(gaps)))]

    mean_bin = stats.mean(bins)
    steps = sorted(abs(b - a) / mean_bin for a, b in zip(bins, bins[1:], strict=False))

    return {
        "mean_mbit": len(ms) * BITS_PER_OPP / period / 1000,
        "multi": sum(1 for c in counts.values() if c > 1) / len(active),
        "per_active": len(ms) / len(active),
        "gap_p50": pct(0.5), "gap_p90": pct(0.9), "gap_p99": pct(0.99), "gap_max": gaps[-1],
        "silences_per_min": sum(1 for g in gaps if g >= 100) / (period / 60000),
        "cv_100ms": stats.pstdev(bins) / stats.mean(bins),
        "step_100ms_p50": steps[len(steps) // 2], "step_100ms_p90": steps[int(0.9 * len(steps))],
    }


def main() -> None:
    for link in LINKS:
        for direction in DIRECTIONS:
            write(link, direction)


def write(link: str, direction: str) -> None:
    ms = trace(link, direction)
    path = os.path.join(HERE, f"{link}-{direction}.trace")
    with open(path, "w") as f:
        f.write("".join(f"{t}\n" for t in ms))
    s = statistics(ms)
    print(f"{path}: {len(ms)} opportunities in {ms[-1] / 1000:g} s, mean {s['mean_mbit']:.1f} Mbit/s, "
          f"multi {s['multi']:.2f}, {s['per_active']:.2f} a active ms, gaps "
          f"{s['gap_p50']}/{s['gap_p90']}/{s['gap_p99']}/{s['gap_max']} ms, "
          f"{s['silences_per_min']:.1f} silences a min, 100 ms CV {s['cv_100ms']:.2f}")


if __name__ == "__main__":
    main()
