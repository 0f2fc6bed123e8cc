"""`pepctl subscribers`' pure parts: what an operator may select by, and what an entry of radio_subs
reads as (pepctl/radio_maps.py subscriber_view, the table). The map itself is read in
tests/netns/test_radio.py, while a download runs through pep_radio.

How right is told from wrong: an entry is packed with the mirror of struct radio_sub (whose layout
tests/unit/test_radio_contract.py checks against the header), unpacked as the map's bytes would
be, and its view compared field by field with what the entry says.
"""

import io
import ipaddress
import socket

import pytest

from pepctl import radio_maps as rm
from pepctl import subscribers

NOW = 1_000_000_000


def entry(**fields) -> dict:
    """A radio_subs entry as read_subscribers gives it: the mirror's bytes, unpacked."""
    values = {name: 0 for name, _ in rm.SUB.fields} | {"pad": bytes(7)} | fields
    raw = rm.SUB.pack(**values)
    return {"graph": "pep", "address": "198.18.0.10", **rm.SUB.unpack(raw, "test")}


def test_selectors_take_addresses_and_networks_of_either_family():
    got = subscribers.selectors(["198.18.0.10", "198.18.0.0/24", "2001:2::/48", "::ffff:198.18.0.7"])
    assert got == [ipaddress.ip_network("198.18.0.10/32"), ipaddress.ip_network("198.18.0.0/24"),
                   ipaddress.ip_network("2001:2::/48"), ipaddress.ip_network("198.18.0.7/32")], got


@pytest.mark.parametrize("word", ["198.18.0.300", "client", "198.18.0.0/33", ""])
def test_a_selector_that_is_no_address_is_refused_naming_it(word):
    with pytest.raises(subscribers.BadSelector, match=f"'{word}': not an address or a network"):
        subscribers.selectors([word])


def test_an_entry_reads_as_its_estimate():
    view = rm.subscriber_view(entry(rate=2_500_000, window=150_000, inflight=90_000, min_rtt_us=52_000,
                                    min_rtt_prev_us=50_500, qdelay_us=21_000, target_us=30_000, flows=3,
                                    outages=2, last_ack_us=NOW - 400_000, ts_clock=1), NOW)
    assert view == {"graph": "pep", "address": "198.18.0.10", "state": "steady", "flows": 3,
                    "rate_bytes_per_second": 2_500_000, "window_bytes": 150_000, "in_flight_bytes": 90_000,
                    "min_rtt_seconds": 0.0505, "queue_delay_seconds": 0.021, "queue_target_seconds": 0.03,
                    "queue_window_seconds": 0.03, "outages": 2, "heard_seconds_ago": 0.4, "timestamp_clock": "ms"}, view


def test_a_long_round_trip_s_entry_shows_the_queue_its_window_holds():
    """On 3G's round trip the window holds more than the target (radio_window_queue): the entry says
    both, and before its first control window set it, the target."""
    view = rm.subscriber_view(entry(target_us=30_000, window_queue_us=39_000, min_rtt_us=150_000,
                                    last_ack_us=NOW), NOW)
    assert (view["queue_target_seconds"], view["queue_window_seconds"]) == (0.03, 0.039), view
    view = rm.subscriber_view(entry(target_us=30_000, min_rtt_us=150_000, last_ack_us=NOW), NOW)
    assert view["queue_window_seconds"] == 0.03, view


@pytest.mark.parametrize("fields, state", [
    ({"startup": 1}, "startup"),
    ({"draining": 1}, "draining"),
    ({"draining": 1, "last_ack_us": NOW - rm.STALE_US}, "stale"),
    ({}, "steady"),
])
def test_an_entry_s_state(fields, state):
    got = rm.subscriber_view(entry(**({"last_ack_us": NOW - 1000} | fields)), NOW)["state"]
    assert got == state, f"{fields}: state {got}, expected {state}"


def test_the_minimum_rtt_is_the_law_s_and_none_before_a_sample():
    """The lesser of the two buckets', a bucket of 0 being empty (radio_known_min_rtt)."""
    for cur, prev, expected in ((40_000, 0, 0.04), (0, 45_000, 0.045), (60_000, 45_000, 0.045), (0, 0, None)):
        got = rm.subscriber_view(entry(min_rtt_us=cur, min_rtt_prev_us=prev), NOW)["min_rtt_seconds"]
        assert got == expected, f"min_rtt_us {cur}, min_rtt_prev_us {prev}: {got}, expected {expected}"


def test_a_negative_flight_reads_as_none():
    """inflight is a signed sum of the flows' last ACKs' counts: racing CPUs can leave it below 0 for a moment."""
    assert rm.subscriber_view(entry(inflight=-3000), NOW)["in_flight_bytes"] == 0


def test_keys_of_both_families_read_as_their_addresses():
    for addr in ("198.18.0.10", "2001:2:0:1::10"):
        ip = ipaddress.ip_address(addr)
        key = rm.SUB_KEY.unpack(rm.SUB_KEY.pack(netns=7, family=socket.AF_INET if ip.version == 4 else socket.AF_INET6,
                                                addr=ip.packed.ljust(16, b"\0")))
        assert rm._address(key) == addr, (addr, key)


def test_the_table_names_every_figure_and_says_what_it_left_out():
    views = [rm.subscriber_view(entry(rate=1_250_000, window=60_000, min_rtt_us=50_000, qdelay_us=18_000,
                                      target_us=30_000, flows=2, last_ack_us=NOW - 100_000), NOW)]
    out = io.StringIO()
    subscribers.print_table({"subscribers": views, "count": 3, "unmatched": []}, out)
    lines = out.getvalue().splitlines()
    assert lines[0].split()[:4] == ["graph", "subscriber", "state", "flows"], lines[0]
    assert lines[1].split() == ["pep", "198.18.0.10", "steady", "2", "10.00", "60.0", "0.0", "50.0", "18", "30",
                                "0", "0.1", "s"], lines[1]
    assert lines[2] == "(1 of 3 shown, fastest first: --top N for more, --top 0 for all)", lines[2]
    out = io.StringIO()
    subscribers.print_table({"subscribers": [], "count": 0, "unmatched": []}, out)
    assert "no subscriber has pep_radio state now" in out.getvalue(), out.getvalue()
