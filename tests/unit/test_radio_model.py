"""pep_radio's control law (congestion/radio_law.h), run by the userspace model built from the same
header (congestion/model.c: linkem's trace link, a small TCP, a request every 200 ms beside a
download), on links made to order here. What the law promises, checked on what it does:

  - it holds the radio's queue near its target (the model's own wait of the link, sampled every
    10 ms), whatever the capacity, and the target is the operator's to set;
  - its rate estimate follows the capacity and is not inflated by bursty delivery (BBR's max filter
    is: the 2-3x that keeps a standing queue in a radio's buffer);
  - it follows capacity that swings tenfold;
  - an outage is counted once and the download resumes, at half its window, back at the whole
    within a round trip if the link came back as it was;
  - random loss is not congestion;
  - a subscriber's flows share its window equally;
  - the uplink's own queue (the ACKs wait for grants) does not hold the download back, ACKs it
    held back are neither an outage nor a burst of delivery, and its stalls do not grow the queue;
  - a slow link's grants far apart are not pauses, and a delayed ACK is not a queue;
  - short flows that begin in a download's queue do not hide it;
  - a flow that joins a held queue does not make the law hold twice the target (its drains);
  - a download left alone after the one it joined ends is not left blind (an early drain), nor is
    one that began beside a request's answer, in startup;
  - a capacity that falls fiftyfold (a handover) is followed within seconds;
  - the model's oracle, the yardstick of congestion/frontier.py, does what it says.
No root: the model is compiled here with the system's C compiler.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import statistics
import subprocess

import pytest

from congestion import frontier
from linkem import profiles
from pepctl import radio_maps

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCE = os.path.join(REPO, "congestion", "model.c")
TARGET_MS = radio_maps.TARGET_US / 1000
OPP_BITS = 1500 * 8


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler: the model is built from congestion/model.c")
    path = str(tmp_path_factory.mktemp("model") / "model")
    proc = subprocess.run([cc, "-O2", "-Wall", "-Wextra", "-Werror", "-std=gnu11", "-o", path, SOURCE, "-lm"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, f"building {SOURCE}: {proc.stderr}"
    return path


def write_trace(path, ms: list[int]) -> str:
    with open(path, "w") as f:
        f.write("".join(f"{t}\n" for t in ms))
    return str(path)


def rate_trace(rate_mbit, seconds: float) -> list[int]:
    """Opportunities at rate_mbit(t_ms) Mbit/s, each placed when its 1500 bytes have accrued."""
    ms, t = [], 0.0
    while t < seconds * 1000:
        t += OPP_BITS / (rate_mbit(t) * 1e3)
        ms.append(int(t))
    return ms


def constant(mbit: float, seconds: float = 30) -> list[int]:
    return rate_trace(lambda t: mbit, seconds)


def grants(mbit: float, every_ms: int, seconds: float = 30) -> list[int]:
    """The capacity of every_ms delivered at once, every every_ms: bursts, then silence."""
    per_ms, carry, ms = mbit * 1e3 / OPP_BITS, 0.0, []
    for t in range(every_ms, int(seconds * 1000) + 1, every_ms):
        carry += per_ms * every_ms
        ms += [t] * int(carry)
        carry -= int(carry)
    return ms


def tenfold_swing(t: float, period_ms: float = 1000) -> float:
    """A capacity (Mbit/s) at t ms between 2 and 20, a log-sinusoid of the period."""
    return 2 * 10 ** (0.5 - 0.5 * math.cos(2 * math.pi * t / period_ms))


def run(model: str, tmp_path, down: list[int], up: list[int], *args: str) -> dict:
    proc = subprocess.run([model, *args, write_trace(tmp_path / "down", down), write_trace(tmp_path / "up", up)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"model {' '.join(args)}: {proc.stderr}"
    return json.loads(proc.stdout)


def test_queue_held_near_the_target_on_a_steady_link(model, tmp_path):
    got = run(model, tmp_path, constant(10), constant(5))
    assert got["target_ms"] == TARGET_MS, f"the model runs the header's default target: {got['target_ms']}"
    assert 0.5 * TARGET_MS <= got["wait_p50_ms"] <= 1.5 * TARGET_MS, \
        f"10 Mbit/s, 50 ms RTT: the link's queue (median) {got['wait_p50_ms']} ms, target {TARGET_MS} ms"
    assert got["wait_p95_ms"] <= 2.5 * TARGET_MS, f"queue p95 {got['wait_p95_ms']} ms, target {TARGET_MS} ms"
    assert got["goodput_mbps"] >= 0.9 * got["offered_mbps"], \
        f"goodput {got['goodput_mbps']} Mbit/s of {got['offered_mbps']} offered: the queue must not run dry"


def test_target_is_the_operators(model, tmp_path):
    short = run(model, tmp_path, constant(10), constant(5), "--target", "20")
    long = run(model, tmp_path, constant(10), constant(5), "--target", "60")
    assert long["wait_p50_ms"] >= 2 * short["wait_p50_ms"], \
        f"a 60 ms target must hold a longer queue than a 20 ms one: {long['wait_p50_ms']} vs {short['wait_p50_ms']} ms"
    assert 0.5 * 60 <= long["wait_p50_ms"] <= 1.6 * 60, f"target 60 ms: queue median {long['wait_p50_ms']} ms"


def test_a_long_round_trip_holds_a_quarter_of_it(model, tmp_path):
    """The law follows a rise a round trip late, and the link lives on the queue until it does: a
    150 ms round trip (3G's) holds a quarter of it, 50 ms the target, and 600 ms (a GEO satellite's)
    no more than 50 ms (radio_window_queue), and 100 ms at a 20 ms target a quarter too (the target is
    the floor, not a constant). 4 Mbit/s down, 2 up, a 1.5 s buffer."""
    held = {}
    for one_way in (25, 75, 300):
        got = run(model, tmp_path, constant(4), constant(2), "--delay", str(one_way), "--limit", "1500")
        held[one_way] = got["window_queue_ms"]
        assert 0.7 * held[one_way] <= got["wait_p50_ms"] <= 1.5 * held[one_way], \
            f"{2 * one_way} ms RTT: the link's queue (median) {got['wait_p50_ms']} ms, held {held[one_way]} ms"
        # (Startup at 600 ms takes 4 s of the 20.)
        assert got["goodput_mbps"] >= 0.8 * got["offered_mbps"], \
            f"{2 * one_way} ms RTT: goodput {got['goodput_mbps']} of {got['offered_mbps']} Mbit/s offered"
    assert held[25] == TARGET_MS, f"50 ms RTT holds the target ({TARGET_MS} ms): {held[25]}"
    assert 150 / 4 <= held[75] <= 170 / 4, f"150 ms RTT (and the uplink's wait) holds a quarter of it: {held[75]} ms"
    assert held[300] == 50, f"600 ms RTT holds RADIO_PATH_QUEUE_MAX_US (50 ms): {held[300]}"
    got = run(model, tmp_path, constant(4), constant(2), "--delay", "50", "--target", "20")
    assert 100 / 4 <= got["window_queue_ms"] <= 120 / 4, \
        f"100 ms RTT at a 20 ms target holds a quarter of it: {got['window_queue_ms']} ms"


def test_rate_estimate_not_inflated_by_bursty_delivery(model, tmp_path):
    """25 ms of capacity delivered at once, then nothing: a max filter would read several times the rate."""
    got = run(model, tmp_path, grants(10, 25), constant(5))
    assert got["rate_estimate_mbps"] <= 1.15 * got["offered_mbps"], \
        f"bursts of 25 ms: estimate {got['rate_estimate_mbps']} Mbit/s, the link's {got['offered_mbps']}"
    assert got["goodput_mbps"] >= 0.85 * got["offered_mbps"], f"goodput {got['goodput_mbps']} Mbit/s"
    assert got["wait_p95_ms"] <= 2.5 * TARGET_MS + 25, f"queue p95 {got['wait_p95_ms']} ms"


def test_follows_capacity_swinging_tenfold(model, tmp_path):
    """Capacity between 2 and 20 Mbit/s (log-sinusoid, 2 s period): the link stays busy, the queue short."""
    got = run(model, tmp_path, rate_trace(lambda t: tenfold_swing(t, 2000), 30), constant(5))
    assert got["goodput_mbps"] >= 0.85 * got["offered_mbps"], \
        f"tenfold swing: goodput {got['goodput_mbps']} of {got['offered_mbps']} Mbit/s"
    assert got["wait_p95_ms"] <= 4 * TARGET_MS, f"tenfold swing: queue p95 {got['wait_p95_ms']} ms"


def rise_times(model: str, tmp_path, low: float, high: float) -> list[float]:
    """At 3G's round trip (150 ms, 10 ms of jitter), a link at `low` Mbit/s for 5 s, then at `high`
    for 5 s, six times: how long after each rise the download had three quarters of `high` again
    (over 300 ms; 4.7 s: never)."""
    down = rate_trace(lambda t: low if (t // 5000) % 2 == 0 else high, 60)
    rate = download_rate(model, tmp_path, down, constant(1, 60),
                         "--delay", "75", "--jitter", "10", "--limit", "1000", "--seconds", "60")
    return [next((step / 10 for step in range(47) if rate(rise + step / 10, rise + step / 10 + 0.3) >= 0.75 * high),
                 4.7) for rise in (5.0, 15.0, 25.0, 35.0, 45.0, 55.0)]


def test_a_long_path_follows_a_fade_s_end_within_a_second(model, tmp_path):
    """3G's round trip (150 ms, 10 ms of jitter) over a link that fades to 0.5 Mbit/s for 5 s, then
    comes back at 2, six times: the download has three quarters of the 2 Mbit/s again (over 300 ms)
    within a second of the rise, on the mean of the six. A control window of a whole round trip took
    1.2 s; half of one, 0.9 (radio_window_us)."""
    took = rise_times(model, tmp_path, 0.5, 2)
    assert sum(took) / len(took) <= 1.0, f"0.5 Mbit/s for 5 s, then 2, at 150 ms RTT: 1.5 Mbit/s again after {took} s"


def test_a_slow_link_s_own_wait_is_no_queue(model, tmp_path):
    """At 0.4 Mbit/s one frame is 30 ms: the link's own jitter (10 ms, frames kept in order) reads as
    half the target or more with nothing waiting. From 0.4 Mbit/s to 3, at 3G's round trip, six times:
    the download has three quarters of the 3 Mbit/s again (over 300 ms) within 1.1 s of the rise, on
    the mean of the six. Judged against the 30 ms target alone, the law took 1.35 s (radio_judged_target)."""
    took = rise_times(model, tmp_path, 0.4, 3)
    assert sum(took) / len(took) <= 1.1, f"0.4 Mbit/s for 5 s, then 3, at 150 ms RTT: 2.25 Mbit/s again after {took} s"


def test_outage_counted_once_and_the_download_resumes(model, tmp_path):
    """Both directions stop for 2 s, 8 s in."""
    down = [t for t in constant(10) if not 8000 <= t < 10000]
    up = [t for t in constant(5) if not 8000 <= t < 10000]
    got = run(model, tmp_path, down, up)
    assert got["outages"] == 1, f"one outage of 2 s: the law counted {got['outages']}"
    assert got["goodput_mbps"] >= 0.85 * got["offered_mbps"], \
        f"after the outage the download resumes at the link's rate: {got['goodput_mbps']} of {got['offered_mbps']}"


def outage_then(model, tmp_path, after_mbit: float) -> tuple[float, float]:
    """20 Mbit/s, both ways stopped from 8 to 10 s, then after_mbit: the longest wait of the downlink's
    frames in the 1.5 s after the outage (the model's series, every 100 ms), and the download's rate
    from 10.5 to 11 s (the retransmission timer has fired by then: a second at most)."""
    down = [t for t in rate_trace(lambda t: 20 if t < 8000 else after_mbit, 20) if not 8000 <= t < 10000]
    up = [t for t in constant(5, 20) if not 8000 <= t < 10000]
    _, waits = series_waits(model, tmp_path, down, up, "--seconds", "20")
    rate = download_rate(model, tmp_path, down, up, "--seconds", "20")
    return max(w for t, w in waits if 10.0 <= t < 11.5), rate(10.5, 11.0)


def test_a_link_back_from_an_outage_slower_meets_half_the_window(model, tmp_path):
    """A link that comes back from a 2 s outage at a fifth of its rate (another cell): the window it had
    before, 200 KB, would be 320 ms of its queue at once; half of it, 160."""
    wait, _ = outage_then(model, tmp_path, 4)
    assert wait <= 200, f"20 Mbit/s, a 2 s outage, then 4: the downlink's frames waited up to {wait} ms after it"


def test_a_link_back_from_an_outage_as_it_was_has_its_rate_at_once(model, tmp_path):
    """The same outage, the link back at 20 Mbit/s: startup from half the window is back at the old one
    within a round trip, and stops there (grown on past it, it read its queue a round trip late:
    94 ms for a moment)."""
    wait, mbit = outage_then(model, tmp_path, 20)
    assert mbit >= 16, f"20 Mbit/s before and after a 2 s outage: {mbit:.1f} Mbit/s 0.5-1 s after it"
    assert wait <= 2 * TARGET_MS, f"20 Mbit/s before and after a 2 s outage: frames waited up to {wait} ms after it"


def test_random_loss_is_not_congestion(model, tmp_path):
    clean = run(model, tmp_path, constant(10), constant(5))
    lossy = run(model, tmp_path, constant(10), constant(5), "--loss", "1")
    assert lossy["goodput_mbps"] >= 0.9 * clean["goodput_mbps"], \
        f"1% random loss: goodput {lossy['goodput_mbps']} against {clean['goodput_mbps']} Mbit/s without"


def test_flows_of_one_subscriber_share_its_window(model, tmp_path):
    got = run(model, tmp_path, constant(10), constant(5), "--flows", "2")
    a, b = got["bulk_mbps"]
    assert min(a, b) >= 0.8 * max(a, b), f"two downloads of one subscriber: {a} and {b} Mbit/s"
    assert got["wait_p50_ms"] <= 1.5 * TARGET_MS, f"together they hold one queue: {got['wait_p50_ms']} ms"



def test_many_small_flows_use_the_window_they_share(model, tmp_path):
    """Eight downloads of one subscriber on a slow, long link (3 Mbit/s, 150 ms RTT): each has a few
    packets of the window, and each ACK (of two packets: the peer delays its ACKs) leaves its flow
    half its window out until the flow refills it. Counted after the ACKs, the flows together seemed
    to use 60% of the window: it never grew to the link (queue median 8 ms, 0.83 of the link; a
    page's six connections beside a download on 3G did the same for the page's seconds). Counted
    before them (radio_flight_hi), the window fills the link and holds its queue (on this round trip
    more than the target: radio_window_queue)."""
    got = run(model, tmp_path, constant(3), constant(1), "--delay", "75", "--limit", "1000", "--flows", "8")
    held = got["window_queue_ms"]
    assert got["goodput_mbps"] >= 0.88 * got["offered_mbps"], \
        f"eight small flows: goodput {got['goodput_mbps']} of {got['offered_mbps']} Mbit/s"
    assert 0.5 * held <= got["wait_p50_ms"] <= 1.5 * held, \
        f"eight small flows: queue median {got['wait_p50_ms']} ms, the window holds {held} ms"
    assert got["wait_p95_ms"] <= 4 * held, f"eight small flows: queue p95 {got['wait_p95_ms']} ms, holds {held}"


def test_uplink_queue_does_not_hold_the_download_back(model, tmp_path):
    """The ACKs wait 40 ms for each uplink grant: with the peer's timestamps the law sees the downlink's
    queue alone."""
    got = run(model, tmp_path, constant(10), grants(5, 40))
    assert got["goodput_mbps"] >= 0.85 * got["offered_mbps"], \
        f"bursty uplink: goodput {got['goodput_mbps']} of {got['offered_mbps']} Mbit/s"
    assert got["wait_p50_ms"] <= 1.5 * TARGET_MS, f"bursty uplink: queue median {got['wait_p50_ms']} ms"


def test_an_uplink_that_holds_the_acks_back_is_no_outage(model, tmp_path):
    """The uplink falls silent for 300 ms every 2 s while the downlink delivers all along: the ACKs
    of 300 ms arrive at once. By the subscriber's clock (its timestamps) nothing paused, and the
    burst is no delivery rate (by their arrival: 10 outages counted, measured)."""
    up = [t for t in constant(5) if t % 2000 >= 300]
    got = run(model, tmp_path, constant(10), up)
    assert got["outages"] == 0, f"the downlink never paused: the law counted {got['outages']} outages"
    assert got["rate_estimate_mbps"] <= 1.15 * got["offered_mbps"], \
        f"held ACKs: estimate {got['rate_estimate_mbps']} Mbit/s, the link's {got['offered_mbps']}"


def test_an_uplink_silence_is_no_fall_of_capacity(model, tmp_path):
    """The uplink falls silent for 900 ms, 10 s into a download over 2 Mbit/s at 150 ms RTT: the
    download's flight arrives, its ACKs wait, and the sender has nothing more to send until they come.
    A control window is a capacity sample only between ACKs that can be dated and that delivered
    something. Ended by a request's first ACK (when its subscriber sent it is unknown: taken as its
    arrival, 0.9 s after the ACKs held with it) or by a duplicate ACK of a retransmission, the window
    spanned the silence, read a standing queue at a quarter of the rate, and halved it: 0.98 Mbit/s
    for a second and a half after the silence (measured)."""
    up = [t for t in constant(1) if not 10000 <= t < 10900]
    _, rates = series_of(model, tmp_path, constant(2), up, r"rate ([\d.]+) Mbit/s", "--delay", "75",
                         "--limit", "1000", "--seconds", "20")
    after = [r for t, r in rates if 11.0 <= t <= 12.0]
    assert min(after) >= 0.8 * 2, f"after the uplink's silence the rate estimate is the link's 2 Mbit/s: {after}"


@pytest.mark.parametrize("stall_ms,every_ms", [(300, 2000), (500, 3000)])
def test_a_stalled_uplink_does_not_grow_the_queue(model, tmp_path, stall_ms, every_ms):
    """The uplink falls silent for stall_ms every every_ms at 30 Mbit/s down: its ACKs come late, and
    taken as part of the path they grew the window by the stall, which then stood in the radio's
    buffer (queue p95 284 and 340 ms, measured). A stall is not a grant: the queue stays near the
    target."""
    up = [t for t in constant(5) if t % every_ms >= stall_ms]
    got = run(model, tmp_path, constant(30), up)
    assert got["wait_p95_ms"] <= 2.5 * TARGET_MS, \
        f"uplink silent {stall_ms} ms every {every_ms} ms: queue p95 {got['wait_p95_ms']} ms, target {TARGET_MS} ms"
    assert got["goodput_mbps"] >= 0.75 * got["offered_mbps"], \
        f"goodput {got['goodput_mbps']} of {got['offered_mbps']} Mbit/s"


def test_grants_far_apart_are_not_pauses(model, tmp_path):
    """A slow link whose scheduler grants every 150 ms, at 150 ms RTT: a silence between grants is
    no pause. (When it was one, every grant restarted the control window, no window ever ended, and
    startup held the first window for good: estimate 2.5 Mbit/s, queue median 780 ms, measured.)"""
    got = run(model, tmp_path, grants(0.5, 150), constant(1), "--delay", "75", "--limit", "1000")
    assert got["rate_estimate_mbps"] <= 1.5 * got["offered_mbps"], \
        f"grants every 150 ms: estimate {got['rate_estimate_mbps']} Mbit/s, the link's {got['offered_mbps']}"
    # (A frame waits up to 150 ms for its grant with no queue at all.)
    assert got["wait_p50_ms"] <= 250, f"grants every 150 ms: queue median {got['wait_p50_ms']} ms"


def test_a_delayed_ack_is_no_queue(model, tmp_path):
    """0.5 Mbit/s in grants every 60 ms at 150 ms RTT: the window is a few packets, paced, so most
    arrive alone and their ACK waits for the client's 40 ms timer. Read as a queue, that wait cuts
    the window to its floor (goodput 0.51 of the link, measured)."""
    got = run(model, tmp_path, grants(0.5, 60), constant(1), "--delay", "75", "--limit", "1000")
    assert got["goodput_mbps"] >= 0.65 * got["offered_mbps"], \
        f"delayed ACKs on a small window: goodput {got['goodput_mbps']} of {got['offered_mbps']} Mbit/s"


def test_short_flows_beside_a_download_do_not_hide_its_queue(model, tmp_path):
    """2 Mbit/s at 150 ms RTT: a 1 KB request on a new connection every 200 ms beside the download.
    Each request's connection begins in the download's queue and takes it for its one-way delay's
    floor, so its samples read no queue at all; counted, they hid the queue from the law, which held
    four times its target (116 ms, measured)."""
    got = run(model, tmp_path, constant(2), constant(1), "--delay", "75", "--limit", "1000")
    assert got["wait_p50_ms"] <= 1.6 * got["window_queue_ms"], \
        f"requests beside a download: queue median {got['wait_p50_ms']} ms, the window holds {got['window_queue_ms']}"
    assert got["goodput_mbps"] >= 0.85 * got["offered_mbps"], f"goodput {got['goodput_mbps']} Mbit/s"


def test_without_timestamps_the_law_falls_back_on_rtts(model, tmp_path):
    got = run(model, tmp_path, constant(10), constant(5), "--no-timestamps")
    assert 0.5 * TARGET_MS <= got["wait_p50_ms"] <= 1.5 * TARGET_MS, f"queue median {got['wait_p50_ms']} ms"
    assert got["goodput_mbps"] >= 0.9 * got["offered_mbps"], f"goodput {got['goodput_mbps']} Mbit/s"


def test_the_peer_s_timestamps_wrapping_change_nothing(model, tmp_path):
    """A peer's 32-bit timestamp (ms) wraps every 49.7 days, from a random start: a download whose
    peer's clock wraps 5 s in goes on as one whose does not. Taken as it was, the wrap moved the one-way
    delay by 2^32 ms and the flow never ended a control window again."""
    link = (constant(10), constant(5), "--seconds", "15")
    plain, wrapped = run(model, tmp_path, *link), run(model, tmp_path, *link, "--ts-wrap", "5")
    for key in ("goodput_mbps", "windows", "wait_p95_ms", "p95_ms"):
        assert wrapped[key] == plain[key], f"peer's clock wrapping 5 s in: {key} {wrapped[key]}, without {plain[key]}"


def series_of(model: str, tmp_path, down: list[int], up: list[int], pattern: str, *args: str) -> tuple[dict, list]:
    """The model's JSON and, from its --series line every 100 ms, (seconds, the number `pattern`'s one
    group matches there)."""
    proc = subprocess.run([model, "--series", *args, write_trace(tmp_path / "down", down),
                           write_trace(tmp_path / "up", up)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"model {' '.join(args)}: {proc.stderr}"
    lines = proc.stdout.splitlines()
    points = [(float(m.group(1)), float(m.group(2))) for m in
              (re.match(r"# ([\d.]+) s: .*?" + pattern, line) for line in lines) if m]
    return json.loads(lines[-1]), points


def series_waits(model: str, tmp_path, down: list[int], up: list[int], *args: str) -> tuple[dict, list]:
    """The model's JSON and its --series: (seconds, the link's queue wait in ms) every 100 ms."""
    return series_of(model, tmp_path, down, up, r"wait (\d+) ms", *args)


def download_rate(model: str, tmp_path, down: list[int], up: list[int], *args: str):
    """From the model's --series: a function of (t0, t1), seconds on its 100 ms grid, giving the
    download's Mbit/s between them."""
    _, delivered = series_of(model, tmp_path, down, up, r"delivered (\d+) B", *args)
    got = {round(t, 1): n for t, n in delivered}
    return lambda t0, t1: (got[round(t1, 1)] - got[round(t0, 1)]) * 8 / (t1 - t0) / 1e6


def p95(values: list[int]) -> int:
    return sorted(values)[int(0.95 * len(values))]


@pytest.mark.parametrize("hz", [250, 1_000_000])
def test_a_peer_clock_not_in_ms_is_not_read_as_one(model, tmp_path, hz):
    """A peer whose timestamps tick at 250 Hz (Linux before 4.13) or at 1 MHz (TCP_USEC_TS): read as
    ms, the first made the queue read empty and the law filled the buffer (499 ms, measured), the
    second read a queue that grew for good (median 188 ms). Judged, they are read as no timestamps."""
    got, waits = series_waits(model, tmp_path, constant(10), constant(5), "--seconds", "20", "--ts-hz", str(hz))
    late = [w for t, w in waits if t >= 5]
    assert statistics.median(late) <= 1.5 * TARGET_MS and p95(late) <= 2 * TARGET_MS, \
        f"peer's clock at {hz} Hz: queue after 5 s median {statistics.median(late)} ms, p95 {p95(late)} ms"
    assert got["goodput_mbps"] >= 0.9 * got["offered_mbps"], f"peer's clock at {hz} Hz: goodput {got['goodput_mbps']}"


@pytest.mark.parametrize("hz", [1000.1, 999.9])
def test_a_peer_clock_that_drifts_is_not_read_as_a_queue(model, tmp_path, hz):
    """A peer's clock 100 ppm fast or slow, over one download of 10 min: 60 ms of drift. A base that
    only moved down read the fast one as a queue that grew (p95 332 ms after 5 min, 0.65 of the
    goodput, measured) and the slow one as an uplink that held every ACK longer."""
    got, waits = series_waits(model, tmp_path, constant(10, 600), constant(5, 600), "--seconds", "600",
                              "--ts-hz", str(hz))
    late = [w for t, w in waits if t >= 300]
    assert p95(late) <= 2 * TARGET_MS, f"peer's clock at {hz} Hz: queue p95 {p95(late)} ms after 5 min"
    assert got["goodput_mbps"] >= 0.9 * got["offered_mbps"], f"peer's clock at {hz} Hz: goodput {got['goodput_mbps']}"


@pytest.mark.parametrize("clock", ["--ts-hz=1000", "--no-timestamps"])
def test_a_path_that_grows_longer_is_not_read_as_a_queue(model, tmp_path, clock):
    """20 s into a download the path's one-way delay goes from 25 to 75 ms (a new route, another
    gateway). Bases that only moved down read the 100 ms more as a queue for good: 2.3 Mbit/s of 10
    with timestamps and 1.8 without, for the rest of the run, and no queue held. The bases rise after
    two drain epochs (radio_rise), and the law holds its target again."""
    got, waits = series_waits(model, tmp_path, constant(10, 120), constant(5, 120), "--seconds", "120",
                              "--delay-step", "20:75", *clock.split("="))
    late = [w for t, w in waits if t >= 60]
    assert statistics.median(late) >= 0.5 * TARGET_MS, \
        f"{clock}, the path 100 ms longer at 20 s: queue median {statistics.median(late)} ms after 60 s"
    assert got["goodput_mbps"] >= 0.7 * got["offered_mbps"], f"{clock}, the path longer: goodput {got['goodput_mbps']}"


def test_a_flow_that_joins_a_held_queue_does_not_double_it(model, tmp_path):
    """A second download starts 5 s in, into the queue the first holds: its first one-way delays
    carry that queue, so its base reads it as none. Without the law's drains the two would hold
    twice the target for good (58 ms here, measured); with them, the target."""
    got, waits = series_waits(model, tmp_path, constant(10), constant(5), "--seconds", "30", "--flows", "2",
                              "--join", "5")
    late = statistics.median(w for t, w in waits if t >= 15)
    assert late <= 1.5 * TARGET_MS, f"two downloads, the second joined at 5 s: queue median {late} ms after 15 s"
    assert got["goodput_mbps"] >= 0.85 * got["offered_mbps"], f"goodput {got['goodput_mbps']} Mbit/s"


def test_connections_that_begin_together_count_their_first_flight_at_once(model, tmp_path):
    """A download ends 3 s in and leaves its subscriber a window; half a second later a page's six
    connections get their first objects (100 KB) at once. Each counts what it sends from its first
    packet (radio_on_tx_start), so together they stay within the window: the queue stays within a
    few targets. Counted from their first ACKs only, each took the whole window: 173 ms (measured)."""
    got, waits = series_waits(model, tmp_path, constant(10), constant(10), "--seconds", "6", "--leave", "3",
                              "--page", "3.5")
    page = [w for t, w in waits if 3.5 <= t <= 4.5]
    assert max(page) <= 3 * TARGET_MS, f"a page's six connections beginning at once: queue {page} ms"
    assert got["page_s"] <= 1.0, f"the page: {got['page_s']} s"


@pytest.mark.parametrize("before, after, want", [(30, 5, "queue"), (10, 30, "goodput")])
def test_a_download_left_alone_is_not_blind(model, tmp_path, before, after, want):
    """A download joins another at 11 s and takes their queue for its floor: its samples count only
    once a drain has passed under it. The first one ends at 12 s, and the capacity moves at 13 s.
    Until the next drain (20 s) the law would see no queue at all, and hold its window whatever the
    capacity: one that fell sixfold stood in the buffer as 440 ms of queue, one that tripled went
    unused (measured). Blind for two windows, it drains at once."""
    got, waits = series_waits(model, tmp_path, rate_trace(lambda t: before if t < 13000 else after, 30), constant(5),
                              "--seconds", "30", "--flows", "2", "--join", "11", "--leave", "12")
    if want == "queue":
        late = statistics.median(w for t, w in waits if 14 <= t < 20)
        assert late <= 1.5 * TARGET_MS, f"{before} -> {after} Mbit/s at 13 s: queue median {late} ms over 14-20 s"
    else:
        offered = (2 * before + 17 * after) / 30   # what the second download was offered, over the run's 30 s
        assert got["bulk_mbps"][1] >= 0.85 * offered, \
            f"{before} -> {after} Mbit/s at 13 s: the second download got {got['bulk_mbps'][1]} of {offered:.1f} Mbit/s"


def test_a_download_that_begins_beside_a_request_leaves_startup(model, tmp_path):
    """A new subscriber's first flow is a request; the download begins 100 ms in, while the request's
    answer is in flight, so its queue samples wait for a drain (it may have taken that answer's queue
    for its floor), and so do the later requests'. Every window is then blind, and startup grows
    only on queue samples: a blind startup must drain, or the download keeps its first window for
    good (measured: 6.7 Mbit/s of 40; the lab's ATT-LTE-driving, 3.2 of 7 Mbit/s)."""
    got = run(model, tmp_path, constant(40), constant(5), "--bulk-at", "0.1", "--seconds", "10")
    assert got["goodput_mbps"] >= 0.8 * got["offered_mbps"], \
        f"a download begun beside a request's answer: {got['goodput_mbps']} of {got['offered_mbps']} Mbit/s"


def test_a_capacity_that_falls_fiftyfold_is_followed(model, tmp_path):
    """A handover: 50 Mbit/s for 5 s, then 2. The window the fast link needed overflows the slow
    link's buffer; the law takes what is delivered as the capacity at once, and within 2 s holds
    the target again."""
    got, waits = series_waits(model, tmp_path, rate_trace(lambda t: 50 if t < 5000 else 2, 20), constant(5))
    late = statistics.median(w for t, w in waits if t >= 7)
    assert late <= 1.5 * TARGET_MS, f"50 -> 2 Mbit/s at 5 s: queue median {late} ms after 7 s"
    assert got["goodput_mbps"] >= 0.85 * got["offered_mbps"], \
        f"50 -> 2 Mbit/s: goodput {got['goodput_mbps']} of {got['offered_mbps']} Mbit/s"


def test_the_oracle_follows_the_capacity_one_round_trip_late(model, tmp_path):
    """--sender oracle, the yardstick congestion/frontier.py sets the law against: its window is the
    link's true capacity of one round trip ago times the path plus the target. On a steady link it
    holds the target and fills the link; when the capacity falls fivefold, the queue is back near the
    target within a second."""
    got = run(model, tmp_path, constant(10), constant(5), "--sender", "oracle")
    assert 0.5 * TARGET_MS <= got["wait_p50_ms"] <= 1.5 * TARGET_MS, \
        f"oracle, 10 Mbit/s: the link's queue (median) {got['wait_p50_ms']} ms, target {TARGET_MS} ms"
    assert got["goodput_mbps"] >= 0.9 * got["offered_mbps"], \
        f"oracle, 10 Mbit/s: goodput {got['goodput_mbps']} of {got['offered_mbps']} Mbit/s"
    got, waits = series_waits(model, tmp_path, rate_trace(lambda t: 10 if t < 5000 else 2, 20), constant(5),
                              "--sender", "oracle")
    late = statistics.median(w for t, w in waits if t >= 6)
    assert late <= 1.5 * TARGET_MS, f"oracle, 10 -> 2 Mbit/s at 5 s: queue median {late} ms after 6 s"
    # A tenfold swing every second: the oracle knows the capacity the law must find, so its rate
    # is the link's own and it gets more of the link than the law does, at no longer a queue.
    law = run(model, tmp_path, rate_trace(tenfold_swing, 30), constant(5))
    oracle = run(model, tmp_path, rate_trace(tenfold_swing, 30), constant(5), "--sender", "oracle")
    assert abs(oracle["rate_estimate_mbps"] / oracle["offered_mbps"] - 1) <= 0.05, \
        f"oracle, 1 s swing: its rate {oracle['rate_estimate_mbps']} Mbit/s, the link's {oracle['offered_mbps']}"
    assert oracle["goodput_mbps"] > law["goodput_mbps"] and oracle["wait_p95_ms"] <= law["wait_p95_ms"], \
        f"1 s swing: oracle {oracle['goodput_mbps']} Mbit/s at queue p95 {oracle['wait_p95_ms']} ms, " \
        f"law {law['goodput_mbps']} at {law['wait_p95_ms']}"


def test_the_law_told_rises_or_falls_splits_the_oracle_s_lead(model, tmp_path):
    """--sender law+rises and law+falls: the law, its flows' shares taken from the oracle's window
    where that is larger (or smaller). On a swing of tenfold every second, knowing the rises gives
    more of the link than the law gets, and knowing the falls a shorter queue."""
    got = {sender: run(model, tmp_path, rate_trace(tenfold_swing, 30), constant(5),
                       *(("--sender", sender) if sender != "law" else ()))
           for sender in ("law", "law+rises", "law+falls")}
    law, rises, falls = got["law"], got["law+rises"], got["law+falls"]
    assert rises["goodput_mbps"] > 1.02 * law["goodput_mbps"], \
        f"1 s swing: told the rises {rises['goodput_mbps']} Mbit/s, the law {law['goodput_mbps']}"
    assert falls["wait_p95_ms"] < 0.8 * law["wait_p95_ms"], \
        f"1 s swing: told the falls, queue p95 {falls['wait_p95_ms']} ms; the law {law['wait_p95_ms']} ms"


def test_frontier_sets_the_law_against_the_oracle(model):
    """congestion/frontier.py runs both senders on a shipped trace profile, as bench responsiveness
    loads the link, and names the trace profiles when given another."""
    profile = profiles.load()["lte-trace"]
    rows = frontier.frontier(model, profile, [30])
    assert [(r["sender"], r["target_ms"]) for r in rows] == [("law", 30), ("oracle", 30), ("cubic", 0)], rows
    for r in rows:
        assert 0.3 < r["goodput_over_cubic"] < 2 and 0.1 < r["of_offered"] <= 1 and \
            math.isfinite(r["p95_over_idle_ms"]), f"lte-trace, {r['sender']}: a figure no run gives: {r}"
    law, _, cubic = rows
    # CUBIC fills the 500 ms buffer; the law holds tens of ms: the queue's p95 tells them apart.
    assert 0 < law["queue_p95_ms"] < cubic["queue_p95_ms"] and cubic["queue_p95_ms"] > 250, \
        f"lte-trace: the radio queue's p95, law {law['queue_p95_ms']} ms, CUBIC {cubic['queue_p95_ms']} ms"


def test_frontier_runs_the_lab_s_own_stretch(model, capsys):
    """--starts 0 --seconds 20 runs what bench responsiveness runs (every run from the trace's first
    frame, 20 s): one start, named; starts it cannot read are an error naming the value."""
    rows = frontier.frontier(model, profiles.load()["lte-trace"], [30], (0,), 20)
    assert all(r["starts"] == [0] for r in rows), rows
    assert frontier.main(["--profile", "lte-trace", "--targets", "30", "--starts", "0", "--seconds", "20",
                          "--model", model]) == 0
    out = capsys.readouterr().out
    assert "mean of 1 start (0 s in), 20 s each" in out, out
    for bad in (["--starts", "0,x"], ["--starts", "-5"], ["--seconds", "2"]):
        assert frontier.main([*bad, "--model", model]) == 2, bad
        err = capsys.readouterr().err
        assert f"{bad[0]} {bad[1]}" in err, f"the error must name the option and its value: {err}"


def test_frontier_splits_the_oracle_s_lead_on_request(model, capsys):
    """--split adds the law told the rises and the law told the falls, at every target, between the
    oracle's rows and CUBIC's."""
    rows = frontier.frontier(model, profiles.load()["lte-trace"], [30], (0,), 20, frontier.SENDERS + frontier.SPLIT)
    assert [r["sender"] for r in rows] == ["law", "oracle", "law+rises", "law+falls", "cubic"], rows
    assert frontier.main(["--profile", "lte-trace", "--targets", "30", "--starts", "0", "--seconds", "20",
                          "--split", "--model", model]) == 0
    out = capsys.readouterr().out
    assert all(any(line.split()[:2] == [sender, "30"] for line in out.splitlines()) for sender in frontier.SPLIT), out


def test_frontier_names_the_law_s_slowest_requests(model, capsys):
    """--slowest N lists the N requests the law took longest over (the model's --requests lines, one
    per request of its JSON count), in the order they began, beside what the oracle and the idle link
    took for the request begun at the same moment; every one of them took the law at least its p95."""
    profile = profiles.load()["lte-trace"]
    law = frontier.run(model, profile, 0, *frontier.sender_args("law", 30), seconds=20)
    times = frontier.request_times(model, profile, 0, *frontier.sender_args("law", 30), seconds=20)
    assert len(times) == law["requests"], f"--requests: {len(times)} lines, the JSON counts {law['requests']}"
    rows = frontier.slowest(model, profile, 30, 3, 0, 20)
    assert [r["begun_s"] for r in rows] == sorted(r["begun_s"] for r in rows) and len(rows) == 3, rows
    for r in rows:
        assert r["law"] == times[r["begun_s"]] and r["law"] >= law["p95_ms"], \
            f"lte-trace, the request begun {r['begun_s']} s in: law {r['law']} ms, its p95 {law['p95_ms']} ms"
        assert r["oracle"] is not None and r["idle"] is not None and 0 < r["idle"] < 5000, r
    assert frontier.main(["--profile", "lte-trace", "--targets", "30", "--starts", "0", "--seconds", "20",
                          "--slowest", "3", "--model", model]) == 0
    out = capsys.readouterr().out
    assert "the law's 3 slowest requests at 30 ms, 0 s in" in out and \
        all(f"{r['begun_s']:>8.1f} {r['law']:>6.0f}" in out for r in rows), out
    assert frontier.main(["--slowest", "-1", "--model", model]) == 2
    assert "--slowest -1" in capsys.readouterr().err


def unused_run(model: str, down: str, up: str, *args: str) -> tuple[dict, list, re.Match | None]:
    """The model's JSON, its --unused lines of each second and its line of the whole run."""
    proc = subprocess.run([model, "--seconds", "10", "--page", "3", "--unused", *args, down, up],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = [m for m in map(frontier.UNUSED_LINE.fullmatch, proc.stderr.splitlines()) if m]
    assert [int(m["second"]) for m in lines] == list(range(10)), f"{args}: {proc.stderr}"
    return json.loads(proc.stdout), lines, re.search(r"^in all: offered (\d+) B, carried (\d+) B$", proc.stderr, re.M)


def test_model_counts_the_capacity_left_unused(model, tmp_path):
    """--unused: a line per second of what the downlink offered and what found nothing waiting. The
    seconds' offers add up to the JSON's, and what went unused and what the frames took of it to all it
    offered. The idle link, with the requests and the page alone, leaves
    most of it unused; a download uses at least its goodput more, and no more than that with its
    headers (and CUBIC's retransmissions of what the buffer dropped). On a steady link, CUBIC (which
    fills the buffer) and the law leave little unused after the first second."""
    down, up = write_trace(tmp_path / "down", constant(10, 30)), write_trace(tmp_path / "up", constant(5, 30))
    used = {}
    for name, sender, most_unused_share in (("idle", ("--idle",), 1.0), ("cubic", ("--sender", "cubic"), 0.02),
                                             ("law", (), 0.2)):
        got, lines, total = unused_run(model, down, up, *sender)
        offered, unused = sum(int(m["offered"]) for m in lines), sum(int(m["unused"]) for m in lines)
        assert abs(offered * 8 / 10 / 1e6 - got["offered_mbps"]) < 0.01, (name, offered, got)
        assert total and int(total[1]) == offered and int(total[2]) == offered - unused, \
            f"{name}: every byte offered is carried or unused, once: {offered} offered, {unused} unused, {total}"
        used[name] = (offered - unused) * 8 / 10 / 1e6
        late = [int(m["unused"]) / int(m["offered"]) for m in lines[1:]]
        if name == "idle":
            quiet = late[:2] + late[3:]            # (the page loads in the fourth second)
            assert min(quiet) >= 0.95, f"idle: the requests alone leave almost all of the link unused: {late}"
            continue
        by_download = used[name] - used["idle"]
        assert got["goodput_mbps"] <= by_download <= got["goodput_mbps"] * 1514 / 1448 * 1.1, \
            f"{name}: used {used[name]:.2f} Mbit/s, the idle link {used['idle']:.2f}, goodput {got['goodput_mbps']}"
        assert max(late) <= most_unused_share, f"{name}: a steady 10 Mbit/s link, unused shares {late}"
    # An outage longer than the buffer: frames sent into it are dropped, and each drop passes the same
    # unused opportunities again; they still count once.
    gap = [t for t in constant(10, 30) if not 4000 <= t < 6000]
    got, lines, total = unused_run(model, write_trace(tmp_path / "gap", gap), up, "--limit", "300")
    unused = sum(int(m["unused"]) for m in lines)
    assert got["drops_down"] and total and int(total[2]) == int(total[1]) - unused, (got, total, unused)


def test_frontier_names_the_seconds_the_law_left_most_unused(model, capsys):
    """--unused N lists, in time order, the N seconds in which the law left the most of the link unused
    beyond what the oracle left: no second left out had a larger excess."""
    profile = profiles.load()["3g-trace"]
    rows = frontier.most_unused(model, profile, 30, 4, 0, 20)
    assert [r["second"] for r in rows] == sorted(r["second"] for r in rows) and len(rows) == 4, rows
    runs = {s: frontier.unused_by_second(model, profile, 0, *frontier.sender_args(s, 30), seconds=20)
            for s in ("law", "oracle")}
    excess = {s: (runs["law"][s][1] - runs["oracle"][s][1]) / o for s, (o, _) in runs["law"].items() if o}
    listed = {r["second"] for r in rows}
    assert min(excess[s] for s in listed) >= max(excess[s] for s in excess if s not in listed), (rows, excess)
    for r in rows:
        assert r["law"] > r["oracle"] and 0 <= r["cubic"] <= 1 and r["offered_mbps"] > 0, r
    assert frontier.main(["--targets", "30", "--starts", "0", "--seconds", "20", "--unused", "4",
                          "--model", model]) == 0
    out = capsys.readouterr().out
    assert "the 4 seconds the law left most unused beyond the oracle at 30 ms, 0 s in" in out and \
        all(f"{r['second']:>6} {r['offered_mbps']:>14.2f} {r['law']:>5.2f}" in out for r in rows), out
    assert frontier.main(["--unused", "-1", "--model", model]) == 2
    assert "--unused -1" in capsys.readouterr().err


def test_frontier_names_the_trace_profiles_for_another(model, capsys):
    assert frontier.main(["--profile", "lte", "--model", model]) == 2
    err = capsys.readouterr().err
    assert "--profile lte" in err and "3g-trace" in err, f"the error must name the value and the choices: {err}"


def test_frontier_takes_a_recording_as_bench_responsiveness_does(model, tmp_path, capsys):
    """--profile trace:PATH runs PATH.down and PATH.up at the recording link's delay and buffer
    (linkem.profiles.recording, the grammar bench responsiveness takes too); a missing half of the
    pair is an error naming the file."""
    write_trace(tmp_path / "steady.down", constant(10, 60))
    write_trace(tmp_path / "steady.up", constant(5, 60))
    profile = profiles.recording(f"trace:{tmp_path / 'steady'}")
    assert profile["both"] == profiles.RECORDING_LINK and profile["down"]["trace"] == f"{tmp_path / 'steady'}.down", \
        profile
    law = frontier.frontier(model, profile, [30])[0]
    assert law["sender"] == "law" and law["of_offered"] >= 0.8, f"a steady 10 Mbit/s recording: {law}"
    (tmp_path / "half.down").write_text("1\n")
    assert frontier.main(["--profile", f"trace:{tmp_path / 'half'}", "--model", model]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'half'}.up" in err, f"the error must name the missing file: {err}"


def test_frontier_leaves_out_the_starts_where_the_link_is_dead(model, tmp_path, capsys):
    """A recording may hold minutes of a dead link (mahimahi's TMobile-UMTS-driving offers 0.1 Mbit/s
    30-75 s in): a start inside them has no goodput ratio. It is left out, and said so; with no start
    left, the error says why and nothing is divided by zero."""
    def up_then_dead(t: float) -> float:       # 10 Mbit/s, dead from 25 s to 80 s (a trickle)
        return 0.01 if 25_000 <= t < 80_000 else 10
    write_trace(tmp_path / "gap.down", rate_trace(up_then_dead, 120))
    write_trace(tmp_path / "gap.up", constant(5, 120))
    rows = frontier.frontier(model, profiles.recording(f"trace:{tmp_path / 'gap'}"), [30])
    assert all(r["starts"] == [0, 15, 45] for r in rows), [r["starts"] for r in rows]
    assert all(math.isfinite(r["goodput_over_cubic"]) for r in rows), rows
    write_trace(tmp_path / "dead.down", [120_000])
    write_trace(tmp_path / "dead.up", constant(5, 120))
    assert frontier.main(["--profile", f"trace:{tmp_path / 'dead'}", "--model", model, "--targets", "30"]) == 2
    err = capsys.readouterr().err
    assert "delivered nothing" in err and f"trace:{tmp_path / 'dead'}" in err, err
