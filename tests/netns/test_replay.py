"""pep-replay on Linux sockets: the http_small profile between two namespaces, checked byte for byte.

    client ns ptr-<id>-c                                   origin ns ptr-<id>-o
    198.18.0.10 ... 198.18.0.250/24                        198.19.0.10 ... 198.19.0.20/24  pep-replay server
    (241 source addresses)   veth ptr-<id>-a ==== ptr-<id>-b
    route 198.19.0.0/24 dev a                              route 198.18.0.0/24 dev b

The two namespaces share one veth link; each side reaches the other's subnet by a link route.

How right is told from wrong: the client checks every response byte against the profile (a
deliberately altered server profile must show up as `mismatch`), the server picks each response from
the request's URL and counts per template, so both sides' per-template counts must agree; the bytes
each side sent must equal what the other received and what the compiled profile says a transaction
carries; the server logs every peer address, and 241 source addresses were offered, so at least 200
must appear. Speed against wrk is a benchmark, not a test: `./scripts/bench replay`; the same profile
through the proxied lab is tests/netns/test_replay_lab.py.

Each load lasts 2-5 s. Everything runs inside the two namespaces; processes are stopped by PID.
"""

from __future__ import annotations

import base64
import importlib.machinery
import importlib.util
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from netns.addresses import ACCESS_NET4, ORIGIN_NET4

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REPLAY_DIR = os.path.join(REPO, "replay")
BINARY = os.path.join(REPLAY_DIR, "pep-replay")
PROFILES = os.path.join(REPO, "trex-profiles")
CLIENTS = [f"198.18.0.{i}" for i in range(10, 251)]
SERVERS = [f"198.19.0.{i}" for i in range(10, 21)]


class Topo:
    def __init__(self, tmp):
        rid = secrets.token_hex(3)
        self.tmp = tmp
        self.client, self.origin = f"ptr-{rid}-c", f"ptr-{rid}-o"
        self.cif, self.oif = f"ptr-{rid}-a", f"ptr-{rid}-b"
        self.namespaces: list[str] = []
        self.procs: list[subprocess.Popen] = []

    def sh(self, *cmd, check=True, **kw):
        p = subprocess.run(list(cmd), capture_output=True, text=True, **kw)
        if check and p.returncode:
            raise RuntimeError(f"{' '.join(cmd)}: rc {p.returncode}: {p.stderr.strip()[-500:]}")
        return p

    def run(self, ns, *cmd, **kw):
        return self.sh("ip", "netns", "exec", ns, *cmd, **kw)

    def popen(self, ns, *cmd, **kw):
        p = subprocess.Popen(["ip", "netns", "exec", ns, *cmd], **kw)
        self.procs.append(p)
        return p

    def up(self):
        for ns in (self.client, self.origin):
            self.sh("ip", "netns", "add", ns)
            self.namespaces.append(ns)
            self.sh("ip", "-n", ns, "link", "set", "lo", "up")
        # Created inside the namespaces: nothing appears in the root namespace.
        self.sh("ip", "link", "add", self.cif, "netns", self.client, "type", "veth",
                "peer", "name", self.oif, "netns", self.origin)
        batch = "".join(f"addr add {a}/24 dev {self.cif}\n" for a in CLIENTS)
        self.sh("ip", "-n", self.client, "-batch", "-", input=batch)
        batch = "".join(f"addr add {a}/24 dev {self.oif}\n" for a in SERVERS)
        self.sh("ip", "-n", self.origin, "-batch", "-", input=batch)
        for ns, dev, net in ((self.client, self.cif, ORIGIN_NET4), (self.origin, self.oif, ACCESS_NET4)):
            self.sh("ip", "-n", ns, "link", "set", dev, "up")
            self.sh("ip", "-n", ns, "route", "add", net, "dev", dev)
        # One request per connection: give both generators the whole port range, and let the
        # client reuse TIME_WAIT ports (per-namespace settings, gone with the namespace).
        self.run(self.client, "sysctl", "-qw", "net.ipv4.ip_local_port_range=1024 65535",
                 "net.ipv4.tcp_tw_reuse=1")

    def stop(self, p, sig=signal.SIGTERM, timeout=10.0):
        if p.poll() is None:
            p.send_signal(sig)
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        return p.returncode

    def down(self):
        for p in self.procs:
            self.stop(p)
        for ns in reversed(self.namespaces):
            self.sh("ip", "netns", "del", ns, check=False)

    def wait_listening(self, ns, addr, count=1, timeout=5.0):
        deadline = time.monotonic() + timeout
        while True:
            out = self.run(ns, "ss", "-Hltn", check=False).stdout
            n = sum(1 for line in out.splitlines() if re.search(rf"\s{re.escape(addr)}:80\s", line))
            if n >= count:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{ns}: nothing listening on {addr}:80 after {timeout}s:\n{out}")
            time.sleep(0.05)


def compile_profile(tmp, name, out, *tunables):
    args = [sys.executable, os.path.join(REPLAY_DIR, "compile_profile.py"),
            os.path.join(PROFILES, f"{name}.py"), out]
    for t in tunables:
        args += ["-t", t]
    p = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, f"compile {name} {tunables}: {p.stderr[-1500:]}"
    with open(out) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def topo():
    pytest.importorskip("lbr_trex_client", reason="TRex client library (lbr-trex-client) not installed")
    build = subprocess.run(["make", "-s", "-C", REPLAY_DIR], capture_output=True, text=True)
    assert build.returncode == 0, f"make -C replay failed:\n{build.stderr[-2000:]}"
    tmp = tempfile.mkdtemp(prefix="ptr-replay-")
    t = Topo(tmp)
    try:
        t.small = compile_profile(tmp, "http_small", os.path.join(tmp, "small.json"))
        t.one_k = compile_profile(tmp, "http_small", os.path.join(tmp, "1k.json"), "size=1k")
        t.up()
        yield t
    finally:
        t.down()
        shutil.rmtree(tmp, ignore_errors=True)


def replay(topo, role, ns, profile, *args, name=None):
    """Starts pep-replay; returns (process, json path)."""
    out = os.path.join(topo.tmp, f"{name or role}-{secrets.token_hex(2)}.json")
    p = topo.popen(ns, BINARY, role, "--profile", profile, "--json", out, "--quiet", *args,
                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return p, out


def finish(topo, p, out, timeout=30.0):
    try:
        p.wait(timeout)
    except subprocess.TimeoutExpired:
        topo.stop(p)
        raise AssertionError(f"pep-replay did not stop within {timeout}s") from None
    err = p.stderr.read()
    assert os.path.exists(out), f"pep-replay wrote no report (rc {p.returncode}): {err[-1000:]}"
    with open(out) as f:
        return json.load(f), p.returncode, err


def server_stop(topo, p, out):
    topo.stop(p)
    return finish(topo, p, out)[0]


def transaction_sizes(prof):
    """(request bytes, response bytes) of each template of a compiled profile."""
    def buf_len(i):
        b = prof["buf_list"][i]
        return b["size"] if isinstance(b, dict) else len(base64.b64decode(b))

    def tx(prog_index):
        return sum(buf_len(c["buf_index"]) for c in prof["program_list"][prog_index]["commands"]
                   if c["name"] == "tx")
    return [(tx(t["client_template"]["program_index"]), tx(t["server_template"]["program_index"]))
            for t in prof["templates"]]


def report_keys():
    loader = importlib.machinery.SourceFileLoader("trex_run", os.path.join(REPO, "scripts", "trex-run"))
    spec = importlib.util.spec_from_loader("trex_run", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module.REPORT_KEYS


def test_http_small_plays_clean_from_200_addresses(topo):
    peers = os.path.join(topo.tmp, "peers.txt")
    srv, srv_out = replay(topo, "server", topo.origin, os.path.join(topo.tmp, "small.json"),
                          "--duration", "30", "--peers", peers)
    topo.wait_listening(topo.origin, SERVERS[0])
    cli, cli_out = replay(topo, "client", topo.client, os.path.join(topo.tmp, "small.json"),
                          "--duration", "5", "--concurrency", "64")
    c, rc, err = finish(topo, cli, cli_out)
    s = server_stop(topo, srv, srv_out)

    cc, sc = c["counters"], s["counters"]
    print(f"\nhttp_small 5 s, concurrency 64: {c['rates']['transactions_per_s']:.0f} transactions/s, "
          f"{c['rates']['rx_bits_per_s'] / 1e6:.0f} Mbit/s, completion p50/p99 "
          f"{c['latency_ms']['complete']['p50']}/{c['latency_ms']['complete']['p99']} ms")
    assert rc == 0, f"client exit {rc}: {err[-500:]}"
    assert cc["transactions_ok"] > 500, f"client: only {cc['transactions_ok']} transactions in 5 s"
    assert cc["transactions_failed"] == 0 and not any(c["errors"].values()), f"client errors: {c['errors']}"
    assert sc["transactions_failed"] == 0 and not any(s["errors"].values()), f"server errors: {s['errors']}"
    assert cc["conn_attempts"] == cc["conn_established"] == cc["conn_closed"] == cc["transactions_ok"]
    assert sc["conn_accepted"] == sc["transactions_ok"] == cc["transactions_ok"], \
        f"server accepted {sc['conn_accepted']}, served {sc['transactions_ok']}; client did {cc['transactions_ok']}"

    # Both sides agree on which object each connection carried (the server read it from the URL).
    per_c = [t["transactions_ok"] for t in c["templates"]]
    per_s = [t["transactions_ok"] for t in s["templates"]]
    assert per_c == per_s, f"per-template transactions: client {per_c}, server {per_s}"
    assert all(per_c), f"some object size was never fetched: {per_c}"

    # Byte counts add up: across the link, and against the profile's request/response sizes.
    sizes = transaction_sizes(topo.small)
    want_tx = sum(n * req for n, (req, _) in zip(per_c, sizes, strict=True))
    want_rx = sum(n * resp for n, (_, resp) in zip(per_c, sizes, strict=True))
    assert (cc["bytes_tx"], cc["bytes_rx"]) == (want_tx, want_rx), \
        f"client bytes tx/rx {cc['bytes_tx']}/{cc['bytes_rx']}, profile says {want_tx}/{want_rx}"
    assert (sc["bytes_rx"], sc["bytes_tx"]) == (cc["bytes_tx"], cc["bytes_rx"]), \
        f"server bytes rx/tx {sc['bytes_rx']}/{sc['bytes_tx']} != client tx/rx {cc['bytes_tx']}/{cc['bytes_rx']}"

    # Source addresses: the server saw at least 200 distinct clients, all from the client range.
    with open(peers) as f:
        seen = {line.split()[0]: int(line.split()[1]) for line in f if line.strip()}
    assert len(seen) >= 200 and s["addresses"]["distinct"] == len(seen), \
        f"server saw {len(seen)} client addresses (report: {s['addresses']['distinct']}), expected >= 200"
    assert set(seen) <= set(CLIENTS), f"peers outside the client range: {sorted(set(seen) - set(CLIENTS))[:5]}"
    assert sum(seen.values()) == sc["conn_accepted"]

    lat = c["latency_ms"]
    for k in ("connect", "ttfb", "complete"):
        assert lat[k]["count"] == cc["transactions_ok"], f"latency {k}: {lat[k]['count']} samples"
        assert 0 < lat[k]["p50"] <= lat[k]["p90"] <= lat[k]["p99"], f"latency {k}: {lat[k]}"
    assert lat["connect"]["p50"] <= lat["ttfb"]["p50"] <= lat["complete"]["p50"]
    assert list(c) == report_keys() == list(s), "pep-replay report keys differ from scripts/trex-run's"


def test_altered_response_is_a_mismatch(topo):
    """A server whose profile sends one different body byte: every transaction must fail."""
    bad = json.loads(json.dumps(topo.one_k))
    resp = next(b for b in bad["buf_list"] if isinstance(b, dict))
    fill = bytearray(base64.b64decode(resp["fill"]))
    fill[5] ^= 0x20
    resp["fill"] = base64.b64encode(bytes(fill)).decode()
    bad_path = os.path.join(topo.tmp, "1k-altered.json")
    with open(bad_path, "w") as f:
        json.dump(bad, f)

    srv, srv_out = replay(topo, "server", topo.origin, bad_path, "--duration", "20", name="bad-server")
    topo.wait_listening(topo.origin, SERVERS[0])
    cli, cli_out = replay(topo, "client", topo.client, os.path.join(topo.tmp, "1k.json"),
                          "--duration", "1", "--rate", "200")
    c, rc, _ = finish(topo, cli, cli_out)
    server_stop(topo, srv, srv_out)
    assert rc == 1, f"client exit {rc} despite altered responses"
    assert c["counters"]["transactions_ok"] == 0, f"{c['counters']['transactions_ok']} altered responses passed"
    assert c["errors"]["mismatch"] == c["counters"]["transactions_failed"] > 100, f"errors {c['errors']}"





def test_client_says_which_source_address_is_missing(topo):
    """A client range wider than what the namespace holds fails before any load, naming the address."""
    cli, out = replay(topo, "client", topo.client, os.path.join(topo.tmp, "1k.json"),
                      "--duration", "1", "--clients", "198.18.0.240-198.18.0.251")
    try:
        cli.wait(10)
    finally:
        topo.stop(cli)
    err = cli.stderr.read()
    assert cli.returncode == 2 and "198.18.0.251" in err and "ip addr add" in err, f"rc {cli.returncode}: {err}"
    assert not os.path.exists(out), "a client that refused to start wrote a report"
