"""pep-replay plays the small-object TRex profile through the proxied lab.

   client ns: 198.18.0.10-250 (241 sources)  -- switch == proxyhost == pep (HAProxy, TPROXY) == ... --
   origin ns: pep-replay server on 198.19.0.11-20:80 (nginx keeps 198.19.0.10)

How right is told from wrong: pep-replay checks every response byte for
byte and counts failures by kind; the server writes every peer address it
saw, which through a transparent proxy must be the clients' own (at least
200 distinct); HAProxy's session count must grow by the connections made,
proving they were proxied, not routed. The one exception by design: a client
port that is the proxy's own listener port (50080, inside Linux's ephemeral
range) cannot be kept toward the origin, so such a flow goes end to end
(bypass_busy); about one connection in 28,000 here, each checked in the
flow tables.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile

import pytest

from netns.handle import REPO
from pepctl import flow_maps
from pepctl.runner import wait_for

REPLAY = os.path.join(REPO, "replay", "pep-replay")
SERVERS = "198.19.0.11-198.19.0.20"
LAB_OPTIONS: list[str] = []


@pytest.fixture(scope="module")
def profile():
    out = os.path.join(tempfile.mkdtemp(prefix="plreplay-"), "small.json")
    proc = subprocess.run([sys.executable, os.path.join(REPO, "replay", "compile_profile.py"),
                           os.path.join(REPO, "trex-profiles", "http_small.py"), out, "-t", f"servers={SERVERS}"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-1500:]
    yield out
    os.unlink(out)
    os.rmdir(os.path.dirname(out))


def sessions(lab) -> int:
    return lab.status()["pepctl"]["graphs"][0]["proxy"]["haproxy"]["sessions_total"]


def test_small_objects_through_the_proxy_from_241_clients(lab, profile):
    for i in range(11, 251):
        lab.run("client", "ip", "addr", "add", f"198.18.0.{i}/24", "dev", "eth0")
    for i in range(11, 21):
        lab.run("origin", "ip", "addr", "add", f"198.19.0.{i}/24", "dev", "eth0")
    peers = os.path.join(lab.run_dir, "replay-peers.txt")
    srv_json = os.path.join(lab.run_dir, "replay-server.json")
    cli_json = os.path.join(lab.run_dir, "replay-client.json")
    before = sessions(lab)
    server = lab.popen("origin", REPLAY, "server", "--profile", profile, "--duration", "60", "--quiet",
                       "--json", srv_json, "--peers", peers)
    try:
        wait_for(lambda: lab.run("origin", "ss", "-Hltn", "sport = :80", check=False).stdout.count("\n") >= 11,
                 timeout=5, what="pep-replay listening on 198.19.0.11-20:80")
        client = lab.run("client", REPLAY, "client", "--profile", profile, "--duration", "5", "--concurrency",
                         "32", "--quiet", "--json", cli_json, timeout=60, check=False)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=15)
    with open(cli_json) as f:
        rep = json.load(f)
    c = rep["counters"]
    assert client.returncode == 0 and c["transactions_failed"] == 0, \
        f"client: {c['transactions_failed']} failed transactions: {rep['errors']} {client.stderr[-500:]}"
    assert c["transactions_ok"] > 200, f"client: only {c['transactions_ok']} transactions in 5 s"
    with open(peers) as f:
        seen = {line.split()[0] for line in f if line.strip()}
    assert len(seen) >= 200, f"origin (pep-replay server): saw {len(seen)} distinct client addresses, want >= 200"
    assert all(a.startswith("198.18.0.") for a in seen), f"origin saw non-client peers: {sorted(seen)[:5]}"
    grown = sessions(lab) - before
    cfg = lab.config()
    g = cfg.graphs[0]
    busy = [f for f in flow_maps.flows(cfg.instance_names().flow_pins, graph=g.index) if f["verdict"] == "bypass_busy"]
    assert all(f["sub_port"] == g.proxy.listen_port for f in busy), \
        f"pep: flows bypassed as busy from other ports than the listener's {g.proxy.listen_port}: {busy}"
    assert grown + len(busy) >= c["conn_established"], \
        f"HAProxy sessions grew by {grown}, and {len(busy)} flow(s) from port {g.proxy.listen_port} went end to " \
        f"end: fewer than the {c['conn_established']} connections made"
