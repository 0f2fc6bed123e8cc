"""pep_radio's control law (congestion/radio_law.h) driven ACK by ACK from a small C program built
from the same header, where the model (test_radio_model.py) cannot make the pattern on demand: the
kernel sends a flow held to a few packets as one burst, the model paces it.

How right is told from wrong: the program feeds radio_on_ack a made-up ACK stream and prints what the
law decided at each control window's end; the test reads those lines.
"""

import os
import shutil
import subprocess

import pytest

CONGESTION = os.path.join(os.path.dirname(__file__), "..", "..", "congestion")

# Two downloads of one subscriber, no timestamps, 50 ms minimum RTT and 80 ms RTTs (30 ms of queue):
# flow a holds 62 packets and hears an ACK of two every 5 ms; flow b holds 4 and hears its ACK of two
# once every 80 ms, so some control windows (50 ms) hear nothing of it. At every window's end: the
# number of flows the window is shared among.
TWO_FLOWS = r"""
#include <stdio.h>
#include <linux/types.h>
#include "radio.h"
#include "radio_law.h"

static void ack(struct radio_sub *sub, struct radio_flow *f, __u64 now, __u32 out, __u32 cwnd)
{
    struct radio_ack a = {.now_us = now, .acked_bytes = 2 * 1448, .rtt_us = 80000, .srtt_us = 80000,
                  .packets_out = out, .prior_in_flight = out + 2, .cwnd = cwnd, .mss = 1448};
    struct radio_out o;

    radio_on_ack(sub, f, &a, &o);
    if (o.window_ended && now >= 2000000)
        printf("%llu %u\n", (unsigned long long)now, sub->bulk);
}

int main(void)
{
    struct radio_sub sub;
    struct radio_flow a, b;
    struct radio_out o;
    __u64 t = 1000000;
    int step;

    radio_sub_init(&sub, NULL, t, 50000, 32, 1448, RADIO_TARGET_US);
    radio_start(&sub, &a, t, 50000, 1448, RADIO_TARGET_US, &o);
    radio_start(&sub, &b, t, 50000, 1448, RADIO_TARGET_US, &o);
    for (step = 1; step <= 1000; step++) {
        t += 5000;
        ack(&sub, &a, t, 60, 62);
        if (step % 16 == 0)
            ack(&sub, &b, t, 2, 4);
    }
    return 0;
}
"""


# One download, no timestamps, no queue (every RTT the minimum, 50 ms): each ACK covers the whole
# flight, the window the law gave it (32 packets at first), and leaves nothing out (a stretch ACK,
# or ACKs coalesced on the way). At the end: the subscriber's window, bytes.
STRETCH_ACKS = r"""
#include <stdio.h>
#include <linux/types.h>
#include "radio.h"
#include "radio_law.h"

int main(void)
{
    struct radio_sub sub;
    struct radio_flow f;
    struct radio_out o;
    __u64 t = 1000000;
    __u32 cwnd = 32;
    int step;

    radio_sub_init(&sub, NULL, t, 50000, cwnd, 1448, RADIO_TARGET_US);
    radio_start(&sub, &f, t, 50000, 1448, RADIO_TARGET_US, &o);
    sub.startup = 0;
    for (step = 1; step <= 40; step++) {
        struct radio_ack a = {.now_us = t += 50000, .acked_bytes = (__u64)cwnd * 1448, .rtt_us = 50000,
                              .srtt_us = 50000, .packets_out = 0, .prior_in_flight = cwnd, .cwnd = cwnd,
                              .mss = 1448};

        radio_on_ack(&sub, &f, &a, &o);
        cwnd = o.cwnd;
    }
    printf("%llu\n", (unsigned long long)sub.window);
    return 0;
}
"""


def run_program(tmp_path, source: str) -> list[list[int]]:
    cc = shutil.which("gcc")
    if cc is None:
        pytest.skip("gcc not installed: the law is built from congestion/radio_law.h")
    (tmp_path / "law.c").write_text(source)
    build = subprocess.run([cc, "-O2", "-Wall", "-Werror", "-I", CONGESTION, "-o", str(tmp_path / "law"),
                            str(tmp_path / "law.c")], capture_output=True, text=True)
    assert build.returncode == 0, f"gcc on congestion/radio_law.h: {build.stderr}"
    out = subprocess.run([str(tmp_path / "law")], capture_output=True, text=True, timeout=30, check=True).stdout
    return [[int(w) for w in line.split()] for line in out.splitlines()]


def test_a_flow_held_to_a_few_packets_still_shares_the_window(tmp_path):
    """Counted only in the windows that heard its ACK, the small flow was no sharer in every other
    one: the other flow's share was then the whole window, which left the small one its floor of four
    packets, so it stayed small (lab: 4 and 18 MB of a 20 Mbit/s link in 10 s, in turns)."""
    windows = run_program(tmp_path, TWO_FLOWS)
    assert len(windows) >= 40, f"control windows from 2 to 6 s: {len(windows)}"
    alone = [t for t, sharers in windows if sharers != 2]
    assert not alone, f"two downloads: windows shared among other than 2 flows at {alone[:10]} us " \
                      f"(of {len(windows)})"


def test_a_flow_whose_acks_leave_nothing_out_still_fills_the_window(tmp_path):
    """A flow counts what it had out before its ACK toward the window's use, also when the ACK left
    it nothing out: counted as 0 there, a download whose ACKs each covered its whole flight never
    filled its window, and on an empty link the window never grew."""
    [[window]] = run_program(tmp_path, STRETCH_ACKS)
    assert window > 2 * 32 * 1448, f"no queue, the whole window used every round trip: window {window} bytes, " \
                                   f"started at {32 * 1448}"
