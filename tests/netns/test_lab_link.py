"""The lab's access link: `pep-lab up --link PROFILE` and `pep-lab link PROFILE` on a running lab.

   client -- [link: linkem to-client <-> to-switch] -- switch == proxyhost == pep -- ... -- origin

How right is told from wrong: ping's RTT from the client to the origin must
follow the delay set on the link (about 0 ms with `none`, 2 x 20 ms after a
live change), the lab's status must report the setting linkem has, and
linkem's own counters must count the frames it carried. The emulator itself
is tested in detail in test_linkem.py.
"""

from __future__ import annotations

import re
import secrets
import statistics

from netns.addresses import ORIGIN4
from netns.handle import LabHandle

LAB_OPTIONS = ["--link", "none"]


def rtt_ms(lab, count: int = 20) -> float:
    out = lab.run("client", "ping", "-c", str(count), "-i", "0.02", "-W", "2", ORIGIN4).stdout
    times = [float(x) for x in re.findall(r"time=([\d.]+) ms", out)]
    assert len(times) >= count // 2, f"client: ping {ORIGIN4} lost too much: {out[-300:]}"
    return statistics.median(times)


def test_link_none_adds_no_delay_and_counts_frames(lab):
    assert rtt_ms(lab) < 5, "client: RTT through linkem with profile none should be near 0"
    stats = lab.status()["access_link"]["stats"]
    assert stats["a2b"]["out_pkts"] > 0 and stats["b2a"]["out_pkts"] > 0, f"linkem counted nothing: {stats}"


def test_live_change_sets_the_delay_and_status_reports_it(lab):
    proc = lab.run_pep_lab("link", "none", "delay=20")
    assert proc.returncode == 0, proc.stderr
    try:
        got = rtt_ms(lab)
        assert 39 <= got <= 45, f"client: RTT {got:.1f} ms with 20 ms each way, want about 40"
        setting = lab.status()["access_link"]["setting"]
        assert setting == {"profile": "none", "overrides": ["delay=20"]}, setting
    finally:
        assert lab.run_pep_lab("link", "none").returncode == 0


def test_named_profile_applies(lab):
    proc = lab.run_pep_lab("link", "lte")
    assert proc.returncode == 0, proc.stderr
    try:
        assert '"rate": 50000000' in proc.stdout, f"lte's downlink rate not in linkem's params: {proc.stdout}"
        got = rtt_ms(lab, 30)
        assert 45 <= got <= 65, f"client: RTT {got:.1f} ms on lte (50 ms, jitter 2 ms each way)"
    finally:
        assert lab.run_pep_lab("link", "none").returncode == 0


def test_bad_profile_and_bad_key_are_refused_and_change_nothing(lab):
    before = lab.status()["access_link"]["setting"]
    for args, word in ((["nosuch"], "nosuch"), (["none", "delya=5"], "delya")):
        proc = lab.run_pep_lab("link", *args)
        assert proc.returncode != 0 and word in proc.stderr, f"pep-lab link {args}: {proc.stderr}"
    assert lab.status()["access_link"]["setting"] == before


def test_link_on_a_lab_without_link_says_how():
    other = LabHandle.up(f"t{secrets.token_hex(3)}", ["--no-proxy"])
    try:
        proc = other.run_pep_lab("link", "lte")
        assert proc.returncode != 0 and "--link" in proc.stderr, proc.stderr
    finally:
        other.down()
