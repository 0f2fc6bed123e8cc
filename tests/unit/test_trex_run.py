"""scripts/trex-run: TRex stats -> the pep-replay report, and its behaviour without a TRex server.

There is no TRex server here. The conversion is checked on dicts shaped like what ASTFClient.get_stats()
and STLClient.get_stats() return (traffic.client/server counters named as TRex's TCP stack names them;
port totals with opackets/obytes...). The report must have exactly pep-replay's keys and error kinds
(read from replay/report.h), so lab and one-host runs compare field by field. The last test runs the
script against 127.0.0.1, where no TRex listens, and expects a clear error within seconds.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "scripts", "trex-run")


def load_trex_run():
    loader = importlib.machinery.SourceFileLoader("trex_run", SCRIPT)
    spec = importlib.util.spec_from_loader("trex_run", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tr():
    before = set(sys.modules)
    module = load_trex_run()
    pulled = {m for m in set(sys.modules) - before if m.startswith(("trex", "lbr_trex_client", "scapy"))}
    assert not pulled, f"importing scripts/trex-run imported {sorted(pulled)}: TRex must load only when run"
    return module


# Shaped like ASTFClient.get_stats(skip_zero=False) after a 10 s run of 1000 connections.
ASTF_STATS = {
    "global": {"m_cpu_util": 12.5, "m_tx_bps": 1.0e9},
    0: {"opackets": 5000, "ipackets": 4990, "obytes": 400000, "ibytes": 1200000},
    1: {"opackets": 4990, "ipackets": 5000, "obytes": 1200000, "ibytes": 400000},
    "total": {"opackets": 9990, "ipackets": 9990, "obytes": 1600000, "ibytes": 1600000},
    "traffic": {
        "client": {"m_active_flows": 0, "m_est_flows": 0, "tcps_connattempt": 1000, "tcps_connects": 997,
                   "tcps_closed": 1000, "tcps_sndbyte": 133600, "tcps_rcvbyte": 1169481,
                   "tcps_conndrops": 3, "tcps_drops": 1, "tcps_timeoutdrop": 2, "tcps_keepdrops": 0,
                   "tcps_rexmttimeo": 7, "err_no_template": 0, "err_cwf": 0},
        "server": {"tcps_accepts": 997, "tcps_connects": 997, "tcps_closed": 997, "tcps_sndbyte": 1169481,
                   "tcps_rcvbyte": 133600, "err_no_template": 4, "err_rx_throttled": 5},
    },
    "latency": {},
}

STL_STATS = {
    "global": {"m_cpu_util": 30.0},
    0: {"opackets": 1000000, "ipackets": 999000, "obytes": 60000000, "ibytes": 59940000, "oerrors": 0,
        "ierrors": 0},
    1: {"opackets": 1000000, "ipackets": 999990, "obytes": 60000000, "ibytes": 59999400, "oerrors": 0,
        "ierrors": 2},
    "total": {"opackets": 2000000, "ipackets": 1998990, "obytes": 120000000, "ibytes": 119939400,
              "oerrors": 0, "ierrors": 2},
    "flow_stats": {}, "latency": {},
}


def replay_error_kinds():
    with open(os.path.join(REPO, "replay", "report.h")) as f:
        text = f.read()
    block = text[text.index("#define ERROR_KINDS(X)"):text.index("enum err_kind")]
    return re.findall(r"\bX\((\w+)\)", block)


def test_error_kinds_match_pep_replay(tr):
    assert tr.ERROR_KINDS == replay_error_kinds(), "scripts/trex-run ERROR_KINDS != replay/report.h ERROR_KINDS"


def test_astf_stats_become_a_pep_replay_report(tr):
    r = tr.astf_stats_to_report(ASTF_STATS, "trex-profiles/http_small.py", 10.0, 10.0, 2.0)
    assert list(r) == tr.REPORT_KEYS
    assert (r["schema"], r["tool"], r["mode"]) == ("pep-replay-report/1", "trex", {"mult": 2.0})
    c, e = r["counters"], r["errors"]
    assert list(e) == replay_error_kinds()
    assert (c["conn_attempts"], c["conn_established"], c["conn_accepted"], c["conn_closed"]) == \
        (1000, 997, 997, 1000)
    assert (c["bytes_tx"], c["bytes_rx"]) == (133600, 1169481), "bytes come from the client side"
    # closed flows that were not dropped: 1000 - 3 embryonic drops - 1 established drop
    assert c["transactions_ok"] == 996
    assert (e["connect_timeout"], e["reset"], e["timeout"], e["no_template"], e["other"]) == (3, 1, 2, 4, 5)
    assert c["transactions_failed"] == 3 + 1 + 2 + 4
    assert e["mismatch"] == 0, "TRex does not compare payloads"
    assert r["rates"]["transactions_per_s"] == 99.6
    assert r["rates"]["connections_per_s"] == 100.0
    assert r["rates"]["rx_bits_per_s"] == round(8 * 1169481 / 10)
    assert r["latency_ms"] == {"connect": None, "ttfb": None, "complete": None}


def test_stl_stats_become_a_report(tr):
    r = tr.stl_stats_to_report(STL_STATS, "trex-profiles/udp_vlan_steering.py", 5.0, 5.0, 1.0)
    assert list(r) == tr.REPORT_KEYS and r["role"] == "stl"
    assert (r["counters"]["packets_tx"], r["counters"]["packets_rx"]) == (2000000, 1998990)
    assert (r["counters"]["bytes_tx"], r["counters"]["bytes_rx"]) == (120000000, 119939400)
    assert r["rates"]["packets_per_s"] == 400000.0 and r["rates"]["packets_lost"] == 1010
    assert r["errors"]["other"] == 2


def test_wrong_mode_stats_say_what_to_do(tr):
    with pytest.raises(tr.RunError, match="ASTF mode"):
        tr.astf_stats_to_report({"total": {}}, "p.py", 1, 1, 1)
    with pytest.raises(tr.RunError, match="stateless mode"):
        tr.stl_stats_to_report({"traffic": {}}, "p.py", 1, 1, 1)


def test_unreachable_server_is_a_clear_error():
    pytest.importorskip("lbr_trex_client", reason="TRex client library (lbr-trex-client) not installed")
    # 127.0.0.1: loopback only, and nothing listens on TRex's RPC port here.
    p = subprocess.run([sys.executable, SCRIPT, os.path.join(REPO, "trex-profiles", "http_small.py"),
                        "--server", "127.0.0.1", "--connect-timeout", "1", "--duration", "1"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, f"rc {p.returncode}, stderr {p.stderr[-800:]}"
    assert "cannot reach TRex server at 127.0.0.1" in p.stderr and "t-rex-64" in p.stderr, p.stderr[-800:]
    assert "Traceback" not in p.stderr
