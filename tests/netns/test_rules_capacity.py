"""Rule loads are all or nothing, and every frame the NIC received is accounted for (issue 13).

   client -- switch ==trunk== proxyhost (nic0) -- graph "pep": the default lab

How right is told from wrong:
- a rules file of 1,100,000 client /96s (inside 2001:2::/48) (more than a map holds, 1,048,576) must be refused before
  the first map write: exit non-zero, a message naming the map and its capacity, and afterwards
  the map holds exactly what it held before (its entries are counted through bpf(2)) and the live
  rules file is byte for byte the same; a rule added before is still there and still works;
- `status` reports what the NIC received and what the kernel dropped before tc, beside the
  datapath's own counters: after the client sends frames, received grows by at least as many.
"""

from __future__ import annotations

import ipaddress
import json
import os

import pytest

from netns.addresses import ACCESS_NET6, ORIGIN4
from pepctl import bpfsys, config, flow_maps

LAB_OPTIONS: list[str] = []


def count_entries(path: str) -> int:
    with bpfsys.Map(path) as m:
        return sum(1 for _ in m.keys())


@pytest.mark.slow
def test_too_many_rules_are_refused_before_the_first_write(lab, tmp_path):
    cfg = config.load(os.path.join(lab.run_dir, "pep.toml"))
    n, g = cfg.instance_names(), cfg.graph_names(cfg.graphs[0])
    lab.pepctl("bypass", "add", "client", ACCESS_NET6)
    map6 = flow_maps.map_path(n.flow_pins, "bypass_client6")
    before = count_entries(map6)
    with open(g.live_rules, "rb") as f:
        live_before = f.read()
    base = int(ipaddress.ip_address("2001:2:0:8000::"))
    path = tmp_path / "too-many.rules"
    with open(path, "w") as f:
        for i in range(1_100_000):
            f.write(f"client {ipaddress.IPv6Address(base + (i << 32))}/96\n")
    proc = lab.pepctl("bypass", "add", "--from-file", str(path), check=False, timeout=300)
    assert proc.returncode != 0, f"1,100,000 rules were accepted: {proc.stdout}"
    assert "bypass_client6" in proc.stderr and "1,048,576" in proc.stderr and "nothing was changed" in proc.stderr, \
        proc.stderr
    assert "Traceback" not in proc.stderr
    assert count_entries(map6) == before, f"bypass_client6: expected {before} entries as before, got more"
    with open(g.live_rules, "rb") as f:
        assert f.read() == live_before, "the live rules file changed"
    listed = json.loads(lab.pepctl("bypass", "list", "--json").stdout)["rules"]
    assert {"kind": "client", "value": ACCESS_NET6, "source": "live"} in listed, listed


def test_status_accounts_for_the_frames_the_nic_received(lab):
    def nic():
        return json.loads(lab.pepctl("status", "--json").stdout)["trunk"]["nic"]
    before = nic()
    for key in ("packets", "dropped", "errors", "length_errors", "crc_errors", "missed_errors"):
        assert key in before, f"status trunk.nic lacks {key}: {before}"
    lab.run("client", "ping", "-c", "20", "-i", "0.01", "-q", ORIGIN4)
    after = nic()
    assert after["packets"] - before["packets"] >= 40, \
        f"nic0 received {after['packets'] - before['packets']} frames for 20 pings and 20 replies"
