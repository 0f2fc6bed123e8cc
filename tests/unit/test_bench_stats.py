"""The statistics every benchmark reports its ratios with (bench/common.py), and bench proxy's floor."""

from __future__ import annotations

import pytest

from bench.common import median, paired_ratio
from bench.proxy import endpoints_floor, versus_nginx


def test_paired_ratio_keeps_pairs_measured_together():
    # a is 5% faster than b. The machine's speed drifts from rep to rep (x1, x2, x1.5), and in rep 2
    # it halved between a's sample and b's.
    a = [105.0, 210.0, 157.5]
    b = [100.0, 100.0, 150.0]
    assert paired_ratio(a, b) == pytest.approx(1.05)
    # The medians of the two lists come from different reps: their ratio is off by half.
    assert median(a) / median(b) == pytest.approx(1.575)


def test_paired_ratio_is_the_median_of_the_pairs():
    assert paired_ratio([1.0, 3.0, 10.0], [1.0, 1.0, 1.0]) == 3.0


@pytest.mark.parametrize("a, b", [([1.0, 2.0], [1.0]), ([], [])])
def test_paired_ratio_needs_pairs(a, b):
    with pytest.raises(ValueError, match="as many samples"):
        paired_ratio(a, b)


def test_endpoints_floor_and_the_share_that_beats_nginx():
    # Cores shared by client, origin and proxy: with both busy, tx/s x CPU per tx = 2 CPU-seconds a second.
    kinds = {"user_us_per_tx": 10.0, "system_us_per_tx": 50.0, "softirq_us_per_tx": 20.0}
    med = {"routed": {"tps": 10000.0, "cpu_us_per_tx": 100.0}, "nginx-stream": {"tps": 5000.0, "cpu_us_per_tx": 380.0},
           "endpoints": {"tps": 20000.0, "cpu_us_per_tx": 80.0, **kinds}}
    floor = endpoints_floor(med, {"bpf": 100.0, "nginx-stream": 280.0}, cpus=2)
    assert floor["endpoints_us_per_tx"] == 80.0
    assert floor["endpoints_by_kind"] == {"user": 10.0, "system": 50.0, "softirq": 20.0}
    assert floor["share_over_endpoints"] == {"bpf": pytest.approx(1.25), "nginx-stream": pytest.approx(3.5)}
    assert floor["busy_cpus"] == {"routed": pytest.approx(1.0), "nginx-stream": pytest.approx(1.9),
                                  "endpoints": pytest.approx(1.6)}
    # 1.3 x 5,000 tx/s on 2 CPUs: 307.7 us of CPU per transaction, of which routed's 100 leave 207.7.
    assert floor["share_for_1.3x_nginx_us"] == pytest.approx(2e6 / 6500 - 100)
    assert endpoints_floor({"routed": {"cpu_us_per_tx": 100.0}}, {}, cpus=2) is None


def test_versus_nginx_pairs_each_rep_and_the_proxies_own_share():
    raw = {"routed": {"cpu_us_per_tx": [100.0, 200.0]},
           "bpf": {"tps": [130.0, 65.0], "ttfb_p50_us": [90.0, 45.0], "ttfb_p99_us": [1.0, 1.0],
                   "gbps_10m": [4.0, 2.0], "cpu_us_per_tx": [150.0, 300.0]},
           "nginx-stream": {"tps": [100.0, 50.0], "ttfb_p50_us": [100.0, 50.0], "ttfb_p99_us": [1.0, 1.0],
                            "gbps_10m": [2.0, 1.0], "cpu_us_per_tx": [200.0, 400.0]}}
    got = versus_nginx(raw)
    # The machine ran at half speed in rep 2: the pairs still agree.
    assert got["tps"] == pytest.approx(1.3) and got["gbps_10m"] == pytest.approx(2.0)
    assert got["ttfb_p50_us"] == pytest.approx(0.9)
    # Own shares: 50 against 100 in rep 1, 100 against 200 in rep 2.
    assert got["proxy_cpu_us_per_tx"] == pytest.approx(0.5)
    assert versus_nginx({"routed": {}, "bpf": {}}) is None
