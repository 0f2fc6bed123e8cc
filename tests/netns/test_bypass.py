"""Per-flow bypass and fail-open in the lab: rules change only new flows; a dead proxy fails open.

   client  198.18.0.10 / 2001:2:0:1::10   (proxied: no rule matches them when they start)
           198.18.0.11 / 2001:2:0:1::11   (bypassed: a client rule matches them when they start)
           198.18.0.12-14                 (one per fail-open test: their flows are remembered)
      |
   switch == nic0 [proxyhost: HAProxy, supervisor, keeper] == c_in [pep: tc flow_ingress -> listener] s_in
      == ... -- origin nginx
                    \\___ bypass (rule or fail-open): forwarded at L3 by tc, never reaching a socket ___/

Every test runs on three labs: the default one (interception `bpf`: tc hands proxied packets to
their sockets), one with `--interception nft --ports 80` (nft's tproxy does) and one with
`--interception route --ports 80` (policy routing delivers them to the local stack).

How right is told from wrong: every flow's verdict is read back three ways.
HAProxy's stats count the sessions it carried (`stot` of frontend graph_pep);
the interception counts the packets it handed to HAProxy (bpf: flow_ingress's
pkts_assigned; nft: the counters of the interception table; route, which has no counters of its
own: flow_ingress's pkts_no_flow, the packets it passed to the stack); and the flow
tables (flows_new, flows) hold the verdict of every bypassed flow under
(subscriber, port), next to the counters flows_proxied, flows_bypass_rule,
flows_bypass_failopen. Proxied flows are not remembered: their sockets are
their record, so a proxied flow has no entry. A proxied flow moves HAProxy's
count, the interception's and flows_proxied; a bypassed one moves only
flows_bypass_rule (or flows_bypass_failopen) and pkts_bypassed. Downloads are
compared byte for byte with the origin's files, and the origin's access log
names the peer it saw (the client's own address either way: both paths are
transparent). Fail-open is told by a client opening connection after
connection around a `kill -9` of HAProxy: every attempt is timed, and the
flow tables say which of them were bypassed while HAProxy was down.
"""

from __future__ import annotations

import filecmp
import json
import os
import re
import secrets
import signal
import time

import pytest

from haproxy.supervise import is_our_haproxy
from netns.addresses import ACCESS_NET4, CLIENT4, CLIENT6, ORIGIN4, ORIGIN6
from netns.handle import PYTHON, LabHandle
from pepctl import config as configmod
from pepctl import flow_maps, status
from pepctl.runner import wait_for

LAB_MODES = {"bpf": [], "nft": ["--interception", "nft", "--ports", "80"],
             "route": ["--interception", "route", "--ports", "80"]}
PROXIED = {4: CLIENT4, 6: CLIENT6}       # the lab's client addresses
BYPASSED = {4: "198.18.0.11", 6: "2001:2:0:1::11"}      # added by the `lab` fixture, as are:
# one address per fail-open test (see test_stale_...): their bypassed flows stay remembered
LOADERS = {"haproxy": "198.18.0.12", "supervisor then haproxy": "198.18.0.13", "supervisor stopped": "198.18.0.14"}
URL = {4: f"http://{ORIGIN4}", 6: f"http://[{ORIGIN6}]"}
# flow_ingress's count of the packets a mode hands to HAProxy (nft's are its table's own counters)
INTERCEPTION_COUNTER = {"bpf": "pkts_assigned", "route": "pkts_no_flow"}

# A download that lasts: reads at RATE bytes/s through a small receive buffer, so the sender cannot
# run ahead (curl 7.88's --limit-rate lets bursts of megabytes through here). Prints its local port;
# writes the whole answer, headers too, to the file.
SLOW_GET = r"""
import socket, sys, time
src, dst, path, rate, out = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5]
s = socket.socket(socket.AF_INET6 if ":" in dst else socket.AF_INET)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
s.bind((src, 0))
s.settimeout(10)
s.connect((dst, 80))
print(s.getsockname()[1], flush=True)
s.sendall(f"GET {path} HTTP/1.0\r\nHost: origin\r\n\r\n".encode())
start, got = time.monotonic(), 0
with open(out, "wb") as f:
    while chunk := s.recv(16384):
        f.write(chunk)
        got += len(chunk)
        time.sleep(max(0.0, got / rate - (time.monotonic() - start)))
"""
RATE = 1_250_000   # bytes/s: the 10 MB object takes 8 s, time for a dozen runs of pepctl or more

# Every rule that matches the lab's flows: the churn adds and removes them all, over and over.
CHURN_RULES = """\
# every one of these matches a flow of the churn test
client 198.18.0.10/32
client 198.18.0.11/32
client 198.18.0.0/24
server 198.19.0.10/32
port 80
client 2001:2:0:1::10/128
client 2001:2:0:1::11/128
client 2001:2:0:1::/64
server 2001:2:0:2::10/128
"""


def lab_setup(handle) -> None:
    """The extra client addresses of this module's tests."""
    for addr in (BYPASSED[4], *LOADERS.values()):
        handle.run("client", "ip", "addr", "add", f"{addr}/24", "dev", "eth0")
    handle.run("client", "ip", "-6", "addr", "add", f"{BYPASSED[6]}/64", "dev", "eth0", "nodad")


class Graph:
    """The lab's graph as pepctl names it: its slot in the instance's flow maps, the pins, the
    instance's files (HAProxy's config, the supervisor's state)."""

    def __init__(self, lab: LabHandle):
        cfg = configmod.load(os.path.join(lab.run_dir, "pep.toml"))
        g = cfg.graphs[0]
        self.names = cfg.graph_names(g)
        self.instance = cfg.instance_names()
        self.pins = self.instance.flow_pins
        self.slot = g.index
        self.config = cfg.path
        self.listen_port = min(status.listen_ports(g))   # listen_port, or route mode's port itself


@pytest.fixture(scope="module")
def graph(lab) -> Graph:
    return Graph(lab)


@pytest.fixture(autouse=True)
def no_live_rules_after(lab, tmp_path):
    """Each test starts and ends with no live rule, whatever it did."""
    yield
    rules = json.loads(lab.pepctl("bypass", "list", "--json").stdout)["rules"]
    live = [f"{r['kind']} {r['value']}" for r in rules if r["source"] == "live"]
    if live:
        path = tmp_path / "cleanup.rules"
        path.write_text("\n".join(live) + "\n")
        lab.pepctl("bypass", "del", "--from-file", str(path))


# -- what the lab says ----------------------------------------------------------------------------
def pep_status(lab) -> dict:
    """`pepctl status --json` (it exits 1 while the instance is damaged, e.g. HAProxy down)."""
    return json.loads(lab.pepctl("status", "--json", check=False).stdout)


def graph_status(lab) -> dict:
    return pep_status(lab)["graphs"][0]


def sessions(lab, what: str = "sessions_total") -> int:
    return graph_status(lab)["proxy"]["haproxy"][what]


def counters(graph: Graph) -> dict[str, int]:
    return flow_maps.read_counters(graph.pins, graph.slot)


def handed_to_proxy(lab, graph: Graph) -> dict[str, int]:
    """The interception's own counts of packets handed to HAProxy: pkts_assigned (bpf), the nft
    table's counters (nft), or the packets flow_ingress passed to the stack, whose policy routes
    deliver them locally (route: pkts_no_flow; a bypassed flow's are forwarded, not passed)."""
    if lab.interception in INTERCEPTION_COUNTER:
        name = INTERCEPTION_COUNTER[lab.interception]
        return {name: counters(graph)[name]}
    out = json.loads(lab.run("pep", "nft", "-j", "list", "counters").stdout)["nftables"]
    return {c["counter"]["name"]: c["counter"]["packets"] for c in out if "counter" in c}


def grew(before: dict, after: dict) -> dict:
    return {k: after[k] - before[k] for k in before if after[k] != before[k]}


def verdict_of(graph: Graph, subscriber: str, port: int) -> str | None:
    """The verdict the flow tables hold for a flow to port 80; None: no entry (a proxied flow)."""
    for f in flow_maps.flows(graph.pins, graph=graph.slot):
        if f["subscriber"] == subscriber and f["sub_port"] == port and f["org_port"] == 80:
            return f["verdict"]
    return None


def idle(lab) -> None:
    """No proxied connection left from an earlier test (they would move the interception's counters)."""
    wait_for(lambda: sessions(lab, "sessions_current") == 0, timeout=10, what="HAProxy sessions_current == 0")


def fetch(lab, tmp_path, fam: int, src: str, obj: str = "100k") -> tuple[int, str]:
    """curl OBJ from src; checks it byte for byte; returns (local port, tag in the origin's log)."""
    tag = f"t{secrets.token_hex(4)}"
    out = tmp_path / f"{obj}-{tag}"
    got = lab.run("client", "curl", "-sS", "-g", "-m", "10", "--interface", src, "-o", str(out),
                  "-w", "%{local_port}", f"{URL[fam]}/{obj}?{tag}").stdout
    assert filecmp.cmp(out, os.path.join(lab.run_dir, "www", obj), shallow=False), \
        f"client {src}: /{obj} differs from the origin's file"
    return int(got), tag


# -- rules change only new flows -----------------------------------------------------------------
def test_flows_keep_their_verdict_while_rules_churn(lab, graph, tmp_path):
    idle(lab)
    churn = tmp_path / "churn.rules"
    churn.write_text(CHURN_RULES)
    c0, s0 = counters(graph), sessions(lab)
    started, ended, procs = {}, {}, {}

    def start(name: str, fam: int, src: str):
        procs[name] = (fam, src, lab.popen("client", PYTHON, "-c", SLOW_GET, src, URL[fam].split("//")[1].strip("[]"),
                                           "/10m", str(RATE), str(tmp_path / name)))
        started[name] = time.monotonic()

    try:
        # Proxied: started while no rule matches them; they are under way once HAProxy holds both.
        start("v4-proxied", 4, PROXIED[4])
        start("v6-proxied", 6, PROXIED[6])
        wait_for(lambda: sessions(lab, "sessions_current") >= 2, timeout=5,
                 what="both proxied downloads in HAProxy")
        # Bypassed: started while a rule matches them.
        lab.pepctl("bypass", "add", "client", f"{BYPASSED[4]}/32")
        lab.pepctl("bypass", "add", "client", f"{BYPASSED[6]}/128")
        start("v4-bypassed", 4, BYPASSED[4])
        start("v6-bypassed", 6, BYPASSED[6])
        wait_for(lambda: counters(graph)["flows_bypass_rule"] >= c0["flows_bypass_rule"] + 2, timeout=5,
                 what="both bypassed downloads decided")
        # Churn: add then remove every matching rule, as fast as pepctl goes (0.1-0.5 s a run, by the
        # machine and whether its Python finds bytecode).
        churned = []
        while any(p.poll() is None for _, _, p in procs.values()):
            action = "del" if len(churned) % 2 else "add"
            lab.pepctl("bypass", action, "--from-file", str(churn))
            churned.append(time.monotonic())
            for name, (_, _, p) in procs.items():
                if p.poll() is not None and name not in ended:
                    ended[name] = time.monotonic()
            assert time.monotonic() - min(started.values()) < 30, "downloads still running after 30 s"
    finally:
        for _, _, p in procs.values():
            if p.poll() is None:
                p.kill()
    for name in procs:
        ended.setdefault(name, time.monotonic())
    ports = {}
    with open(os.path.join(lab.run_dir, "www", "10m"), "rb") as f:
        want = f.read()
    for name, (_, src, p) in procs.items():
        out, err = p.communicate(timeout=5)
        assert p.returncode == 0, f"client {src}: {name} download failed: {err.strip()}"
        head, _, body = (tmp_path / name).read_bytes().partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 ") and body == want, \
            f"client {src}: {name}: expected the origin's 10 MB object, got {head[:40]!r} and {len(body)} bytes"
        ports[name] = int(out)
    during = [t for t in churned if max(started.values()) < t < min(ended.values())]
    assert len(during) >= 10, f"expected >= 10 rule changes while all four downloads ran, got {len(during)} " \
                              f"(downloads took {[round(ended[n] - started[n], 1) for n in procs]} s)"
    # The verdicts were those the test claims, and stayed so: bypassed flows have their entry, proxied
    # flows none (a proxied flow that had met a rule midway would have been given one).
    for name, (_, src, _) in procs.items():
        want_verdict = "bypass_rule" if "bypassed" in name else None
        got = verdict_of(graph, src, ports[name])
        assert got == want_verdict, f"pep flow tables: {name} ({src} port {ports[name]}): expected " \
                                    f"{want_verdict or 'no entry (proxied)'}, got {got}"
    c1 = counters(graph)
    assert sessions(lab) == s0 + 2, f"HAProxy sessions_total: expected {s0 + 2} (the proxied two), got {sessions(lab)}"
    assert c1["flows_proxied"] == c0["flows_proxied"] + 2, f"flows_proxied: {grew(c0, c1)}"
    assert c1["flows_bypass_rule"] == c0["flows_bypass_rule"] + 2, f"flows_bypass_rule: {grew(c0, c1)}"
    # 2 x 10 MB bypassed in segments of at most ~64 KB (GRO): thousands of packets forwarded by tc.
    assert c1["pkts_bypassed"] - c0["pkts_bypassed"] > 300, f"pkts_bypassed: {grew(c0, c1)}"


@pytest.mark.parametrize("fam", [4, 6])
def test_bypassed_flow_skips_haproxy_and_interception(lab, graph, tmp_path, fam):
    idle(lab)
    client = PROXIED[fam]
    plen = 32 if fam == 4 else 128
    lab.pepctl("bypass", "add", "client", f"{client}/{plen}")
    c0, s0, n0 = counters(graph), sessions(lab), handed_to_proxy(lab, graph)
    port, tag = fetch(lab, tmp_path, fam, client)
    c1, s1, n1 = counters(graph), sessions(lab), handed_to_proxy(lab, graph)
    assert lab.origin_peer(tag) == client, f"origin log: expected peer {client}"
    assert verdict_of(graph, client, port) == "bypass_rule", f"pep flow tables: {client} port {port}"
    assert s1 == s0, f"HAProxy sessions_total: a bypassed flow moved it from {s0} to {s1}"
    assert n1 == n0, f"pep {lab.interception} interception: a bypassed flow moved its counters: {grew(n0, n1)}"
    flows = {k: c1[k] - c0[k] for k in ("flows_proxied", "flows_bypass_rule", "flows_bypass_failopen")}
    assert flows == {"flows_proxied": 0, "flows_bypass_rule": 1, "flows_bypass_failopen": 0}, \
        f"pep flow counters: expected one flow bypassed by rule, got {flows}"
    assert c1["pkts_bypassed"] > c0["pkts_bypassed"] + 10, f"pkts_bypassed: {grew(c0, c1)}"

    # The same request without the rule is proxied, and all of the above move: the checks can tell.
    lab.pepctl("bypass", "del", "client", f"{client}/{plen}")
    port, tag = fetch(lab, tmp_path, fam, client)
    assert lab.origin_peer(tag) == client, f"origin log: expected peer {client}"
    assert verdict_of(graph, client, port) is None, \
        f"pep flow tables: {client} port {port}: a proxied flow has an entry ({verdict_of(graph, client, port)})"
    wait_for(lambda: sessions(lab) == s1 + 1, timeout=3, what=f"HAProxy sessions_total {s1 + 1}")
    c2, n2 = counters(graph), handed_to_proxy(lab, graph)
    assert c2["flows_proxied"] == c1["flows_proxied"] + 1, f"flows_proxied: {grew(c1, c2)}"
    moved = grew(n1, n2)
    want = {INTERCEPTION_COUNTER[lab.interception]} if lab.interception in INTERCEPTION_COUNTER \
        else {f"intercepted_v{fam}", "proxied"}
    assert want <= set(moved), \
        f"pep {lab.interception} interception: a proxied flow should move {sorted(want)}, moved {moved}"


# -- fail-open ------------------------------------------------------------------------------------
LOAD_CLIENT = r"""
import json, random, socket, sys, time
# Sequential new connections from argv[2] (GET /1k, HTTP/1.0) for argv[1] seconds; prints JSON:
# [[start, end, ok, error, local port], ...] on the monotonic clock (shared with the test: same host).
# Each from a port of its own, in turn through 40,000 of them from a random start: a port the kernel
# picked could come round again within the run (the client closes last, so its ports are free at
# once), and a proxied flow on a fail-open flow's 4-tuple takes its entry in the flow tables.
end, src = time.monotonic() + float(sys.argv[1]), sys.argv[2]
out, nxt = [], random.randrange(40000)
while time.monotonic() < end:
    t0, ok, err, port = time.monotonic(), False, "", None
    try:
        with socket.socket() as s:
            while port is None:
                try:
                    s.bind((src, 20000 + nxt))   # before connect: a failed attempt has its port too
                    port = 20000 + nxt
                except OSError:
                    pass                         # held by a connection of an earlier run: the next
                nxt = (nxt + 1) % 40000
            s.settimeout(0.25)
            s.connect(("198.19.0.10", 80))
            s.sendall(b"GET /1k HTTP/1.0\r\nHost: origin\r\n\r\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        ok = data.startswith(b"HTTP/1.1 200") and len(data) > 1024
        err = "" if ok else f"short answer ({len(data)} bytes)"
    except OSError as e:
        err = type(e).__name__
    out.append((t0, time.monotonic(), ok, err, port))
    if not ok:
        time.sleep(0.005)  # a refused connection fails at once: do not spin
print(json.dumps(out))
"""
NEW_FLOWS_WITHIN = 0.010   # s: new connections work again this soon after kill -9 of HAProxy (issue 11)
BACK_WITHIN = 2.0          # s: HAProxy is back this soon (issue 11)


def ours(pid: int, what: str, *words: str) -> int:
    """pid, checked to be a live process of this lab's instance before anyone signals it."""
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
    assert all(w in cmd for w in words), f"{what}: pid {pid} runs {cmd!r}, not this instance's {what}"
    return pid


def haproxy_pid(lab, graph: Graph) -> int:
    """HAProxy's pid from `pepctl status`, checked to be this instance's, in the proxy host's namespace."""
    pid = pep_status(lab)["proxy"]["haproxy"]["pid"]
    assert pid and is_our_haproxy(pid, graph.instance.haproxy_cfg), f"status: haproxy pid {pid} is not ours"
    want = os.stat(f"/run/netns/{lab.netns('proxyhost')}").st_ino
    assert os.stat(f"/proc/{pid}/ns/net").st_ino == want, f"HAProxy pid {pid} is not in {lab.netns('proxyhost')}"
    return pid


def supervisor_pid(lab, graph: Graph) -> int:
    return ours(pep_status(lab)["proxy"]["supervisor"]["pid"], "supervisor", "supervise", graph.instance.dir)


def timeline(attempts: list, since: float) -> str:
    """The attempts after `since`, for an assertion message: +0.012 ok, +0.3 TimeoutError, ..."""
    return ", ".join(f"+{a[0] - since:.3f} {'ok' if a[2] else a[3]}" for a in attempts if a[0] >= since)[:1500]


def proxy_back(lab, victim: int):
    """The status once a new HAProxy runs and the graph's new flows are proxied again; else None."""
    st = pep_status(lab)
    h = st["proxy"]["haproxy"]
    return st if h["running"] and h["pid"] != victim and st["graphs"][0]["proxy"]["mode"] == "proxy" else None


@pytest.mark.parametrize("which", ["haproxy", "supervisor then haproxy"])
def test_kill_haproxy_fails_open_at_once_then_proxies_again(lab, graph, which):
    st0 = pep_status(lab)
    assert st0["graphs"][0]["proxy"]["mode"] == "proxy", f"status before: {st0['graphs'][0]['proxy']}"
    if which == "supervisor then haproxy":
        # The keeper restarts the supervisor, which adopts the running HAProxy: nothing changes for traffic.
        sup = supervisor_pid(lab, graph)
        hap = haproxy_pid(lab, graph)
        os.kill(sup, signal.SIGKILL)
        st0 = wait_for(lambda: (s := pep_status(lab))["proxy"]["supervisor"]["running"] and
                       s["proxy"]["supervisor"]["pid"] != sup and s, timeout=5,
                       what=f"the keeper to restart the supervisor (was pid {sup})")
        assert st0["proxy"]["haproxy"]["pid"] == hap, \
            f"the restarted supervisor did not adopt HAProxy pid {hap}: {st0['proxy']['haproxy']}"
        supervisor_pid(lab, graph)
    c0 = counters(graph)
    victim = haproxy_pid(lab, graph)
    src = LOADERS[which]
    # From an address of its own: the flows it leaves bypassed (fail-open) must not meet HAProxy's
    # connections of another test (see test_stale_bypass_entry_does_not_hijack_the_proxys_connection).
    load = lab.popen("client", PYTHON, "-c", LOAD_CLIENT, "4", src)
    try:
        time.sleep(1.0)
        killed_at = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        out, err = load.communicate(timeout=20)
    finally:
        if load.poll() is None:
            load.kill()
            load.wait()
    assert load.returncode == 0, f"client: load client failed: {err}"
    attempts = json.loads(out)
    before = [a for a in attempts if a[1] < killed_at]
    after = [a for a in attempts if a[0] > killed_at]
    assert sum(a[2] for a in before) >= 20, f"client {src}: only {sum(a[2] for a in before)} successes before " \
                                            f"the kill: {timeline(attempts, attempts[0][0])}"
    # Connections under way at the kill were HAProxy's and die with it; every one started after may not fail.
    late = [a for a in attempts if a[0] >= killed_at + NEW_FLOWS_WITHIN and not a[2]]
    assert not late, f"client {src}: {len(late)} connection(s) started more than {NEW_FLOWS_WITHIN * 1000:g} ms " \
                     f"after kill -9 of HAProxy failed ({sorted({a[3] for a in late})}), at " \
                     f"{', '.join(f'+{a[0] - killed_at:.3f}' for a in late)} s; flow counters moved " \
                     f"{grew(c0, counters(graph))}; after the kill: {timeline(attempts, killed_at)}"
    assert sum(a[2] for a in after) >= 20, f"client {src}: only {sum(a[2] for a in after)} successes after the kill"

    # Which attempts the datapath bypassed (fail-open) while HAProxy was down: they are remembered.
    by_port = {a[4]: a for a in attempts if a[2]}
    failopen = sorted(by_port[f["sub_port"]][0] - killed_at for f in flow_maps.flows(graph.pins, graph=graph.slot)
                      if f["subscriber"] == src and f["sub_port"] in by_port and f["verdict"] == "bypass_failopen")
    if not failopen:
        held = sorted({f["verdict"] for f in flow_maps.flows(graph.pins, graph=graph.slot) if f["subscriber"] == src})
        raise AssertionError(f"pep flow tables: no flow of {src} was bypassed (fail-open) after the kill; its entries' "
                             f"verdicts {held}; flow counters moved {grew(c0, counters(graph))}; "
                             f"{timeline(attempts, killed_at)}")
    assert failopen[0] < NEW_FLOWS_WITHIN + 0.05, \
        f"client {src}: the first fail-open flow started {failopen[0]:.3f} s after the kill; expected at once"
    assert failopen[-1] < BACK_WITHIN, \
        f"client {src}: flows were still bypassed (fail-open) {failopen[-1]:.3f} s after the kill: HAProxy was " \
        f"not back within {BACK_WITHIN} s"
    # The counter counts every fail-open flow, the tables those whose entries are still there (the
    # client does not reuse a port within the run, but an entry of an earlier run's may be replaced).
    c1 = counters(graph)
    n = c1["flows_bypass_failopen"] - c0["flows_bypass_failopen"]
    assert len(failopen) <= n <= len(after), \
        f"flows_bypass_failopen: expected +{len(failopen)} (the remembered fail-open flows) to +{len(after)} " \
        f"(the attempts after the kill), got {grew(c0, c1)}"

    # The supervisor brought HAProxy back, and status says so.
    st1 = wait_for(lambda: proxy_back(lab, victim), timeout=5, what="a new HAProxy and mode proxy in status")
    p0, p1 = st0["proxy"], st1["proxy"]
    assert p1["restarts"] == p0["restarts"] + 1 and p1["last_exit"]["pid"] == victim, \
        f"status proxy: expected restarts {p0['restarts'] + 1} and last exit of pid {victim}, got {p1}"
    text = lab.pepctl("status").stdout
    assert "new flows: PROXY" in text and f"restarts {p1['restarts']}" in text, text

    # Back to proxy: a new connection goes through the new HAProxy (its count starts at 0).
    s0, f0 = sessions(lab), counters(graph)["flows_proxied"]
    body = lab.run("client", "curl", "-sS", "-m", "5", f"{URL[4]}/").stdout
    assert "PEP lab origin" in body, f"client: curl after recovery: {body[:200]!r}"
    wait_for(lambda: sessions(lab) == s0 + 1, timeout=3, what=f"new HAProxy sessions_total {s0 + 1}")
    assert counters(graph)["flows_proxied"] == f0 + 1, "flows_proxied did not grow after recovery"


def test_status_tells_fail_open_and_a_fail_open_flow_outlives_the_proxys_return(lab, graph, tmp_path):
    """The supervisor is stopped (SIGSTOP) so that HAProxy stays dead while the test looks: status
    must say fail-open, new flows must work (bypassed), and a download begun then must finish intact
    after HAProxy is back, still bypassed: a flow keeps its verdict for life."""
    src = LOADERS["supervisor stopped"]
    sup = supervisor_pid(lab, graph)
    victim = haproxy_pid(lab, graph)
    name = "failopen-download"
    download = None
    os.kill(sup, signal.SIGSTOP)
    try:
        os.kill(victim, signal.SIGKILL)
        st = wait_for(lambda: (s := pep_status(lab))["graphs"][0]["proxy"]["mode"] == "fail-open" and s,
                      timeout=2, what="status mode fail-open")
        mode = st["graphs"][0]["proxy"]
        assert f"no listener on {graph.listen_port}" in mode["why"], \
            f"status: fail-open without the reason: {mode}"
        assert st["state"] == "damaged" and any("HAProxy not running" in p for p in st["problems"]), \
            f"status: expected state damaged naming HAProxy, got {st['state']}: {st['problems']}"
        assert "new flows: FAIL-OPEN" in lab.pepctl("status", check=False).stdout
        port, tag = fetch(lab, tmp_path, 4, src)
        assert lab.origin_peer(tag) == src, f"origin log: expected peer {src}"
        assert verdict_of(graph, src, port) == "bypass_failopen", f"pep flow tables: {src} port {port}"
        download = lab.popen("client", PYTHON, "-c", SLOW_GET, src, ORIGIN4, "/10m", str(RATE), str(tmp_path / name))
        dport = int(download.stdout.readline())
        wait_for(lambda: verdict_of(graph, src, dport) == "bypass_failopen", timeout=3,
                 what=f"the download from {src} port {dport} bypassed (fail-open)")
    finally:
        os.kill(sup, signal.SIGCONT)
    try:
        wait_for(lambda: proxy_back(lab, victim), timeout=BACK_WITHIN, what="a new HAProxy and mode proxy")
        assert download.poll() is None, "the download ended before HAProxy was back: the test proves nothing"
        out, err = download.communicate(timeout=30)
    finally:
        if download and download.poll() is None:
            download.kill()
            download.wait()
    assert download.returncode == 0, f"client {src}: the fail-open download failed after HAProxy came back: {err}"
    head, _, body = (tmp_path / name).read_bytes().partition(b"\r\n\r\n")
    with open(os.path.join(lab.run_dir, "www", "10m"), "rb") as f:
        assert head.startswith(b"HTTP/1.1 200 ") and body == f.read(), \
            f"client {src}: the fail-open download: got {head[:40]!r} and {len(body)} bytes, not the 10 MB object"
    assert verdict_of(graph, src, dport) == "bypass_failopen", f"pep flow tables: {src} port {dport} changed verdict"
    s0 = sessions(lab)
    port, _ = fetch(lab, tmp_path, 4, src)
    assert verdict_of(graph, src, port) is None, f"a new flow of {src} after HAProxy's return was not proxied"
    wait_for(lambda: sessions(lab) == s0 + 1, timeout=3, what=f"HAProxy sessions_total {s0 + 1}")


def test_stale_bypass_entry_does_not_hijack_the_proxys_connection(lab):
    """HAProxy connects to the origin from the client's address (usesrc clientip) and a port the
    graph's namespace picks (its sockets live there: `namespace` on the server line). When a bypassed
    flow of that client used the same port before, the origin's SYN-ACK finds the ended flow's entry on
    s_in; unless tc sees that it answers another SYN (flows_stale), it forwards it to the client and the
    proxied request hangs. By chance that is one proxied connection in 65536 per such entry; forced here
    by narrowing the pep namespace's port range to two ports that bypassed flows used."""
    saved = lab.run("pep", "sysctl", "-n", "net.ipv4.ip_local_port_range").stdout.split()
    port = 40000 + secrets.randbelow(20000)
    lab.pepctl("bypass", "add", "client", f"{CLIENT4}/32")
    for p in (port, port + 1):
        lab.run("client", "curl", "-sS", "-m", "3", "--local-port", str(p), "-o", "/dev/null", f"{URL[4]}/")
    lab.pepctl("bypass", "del", "client", f"{CLIENT4}/32")
    lab.run("pep", "sysctl", "-q", "-w", f"net.ipv4.ip_local_port_range={port} {port + 1}")
    try:
        proc = lab.run("client", "curl", "-sS", "-m", "3", f"{URL[4]}/", check=False)
    finally:
        lab.run("pep", "sysctl", "-q", "-w", f"net.ipv4.ip_local_port_range={saved[0]} {saved[1]}")
    assert proc.returncode == 0 and "PEP lab origin" in proc.stdout, \
        f"client: a proxied request after bypassed flows on HAProxy's ports: curl exited {proc.returncode}: " \
        f"{proc.stderr.strip()}"


# -- the operator's view --------------------------------------------------------------------------
def test_live_rule_survives_reload(lab, graph, tmp_path):
    lab.pepctl("bypass", "add", "client", f"{CLIENT4}/32")
    proc = lab.pepctl("reload")
    assert "reloaded" in proc.stdout, proc.stdout
    listed = json.loads(lab.pepctl("bypass", "list", "--json").stdout)
    assert {"kind": "client", "value": f"{CLIENT4}/32", "source": "live"} in listed["rules"], \
        f"bypass list --json after reload: {listed['rules']}"
    assert listed["graph"] == "pep" and set(listed["counters"]) == set(flow_maps.COUNTERS), listed
    c0, s0 = counters(graph), sessions(lab)
    port, _ = fetch(lab, tmp_path, 4, PROXIED[4])
    assert verdict_of(graph, PROXIED[4], port) == "bypass_rule", "a new flow after reload was not bypassed"
    assert sessions(lab) == s0, f"HAProxy sessions_total moved from {s0} to {sessions(lab)}"
    assert counters(graph)["flows_bypass_rule"] == c0["flows_bypass_rule"] + 1


def test_config_rule_cannot_be_deleted_live(lab, tmp_path):
    with open(os.path.join(lab.run_dir, "pep.toml")) as f:
        original = f.read()
    conf = os.path.join(lab.run_dir, "pep.toml")
    try:
        with open(conf, "w") as f:
            f.write(original + '\n[graph.bypass]\nservers = ["198.19.0.99/32"]\n')
        lab.pepctl("reload")
        listed = json.loads(lab.pepctl("bypass", "list", "--json").stdout)["rules"]
        assert {"kind": "server", "value": "198.19.0.99/32", "source": "config"} in listed, listed
        proc = lab.pepctl("bypass", "del", "server", "198.19.0.99/32", check=False)
        assert proc.returncode != 0 and conf in proc.stderr and "198.19.0.99/32" in proc.stderr, \
            f"bypass del of a config rule: rc {proc.returncode}, stderr {proc.stderr!r}"
        # From a file too, and all or nothing: the live rule in the same file stays.
        lab.pepctl("bypass", "add", "port", "8443")
        rules = tmp_path / "del.rules"
        rules.write_text("port 8443\nserver 198.19.0.99/32\n")
        proc = lab.pepctl("bypass", "del", "--from-file", str(rules), check=False)
        assert proc.returncode != 0 and conf in proc.stderr, proc.stderr
        listed = json.loads(lab.pepctl("bypass", "list", "--json").stdout)["rules"]
        assert {"kind": "port", "value": "8443", "source": "live"} in listed, f"refused del changed rules: {listed}"
    finally:
        with open(conf, "w") as f:
            f.write(original)
        lab.pepctl("reload")
    listed = json.loads(lab.pepctl("bypass", "list", "--json").stdout)["rules"]
    assert all(r["source"] == "live" for r in listed), f"config rule left after reload without it: {listed}"


@pytest.mark.parametrize("args,names", [
    (("add", "client", "198.18.0.5/24"), "198.18.0.5/24"),
    (("add", "server", "2001:2::zz/64"), "2001:2::zz/64"),
    (("add", "port", "70000"), "70000"),
    (("del", "client", "not-a-network"), "not-a-network"),
    (("add", "subscriber", ACCESS_NET4), "subscriber"),
])
def test_bad_rule_is_refused_naming_the_value(lab, args, names):
    before = lab.pepctl("bypass", "list", "--json").stdout
    proc = lab.pepctl("bypass", *args, check=False)
    assert proc.returncode != 0 and names in proc.stderr, \
        f"pepctl bypass {' '.join(args)}: rc {proc.returncode}, stderr {proc.stderr!r}"
    assert json.loads(lab.pepctl("bypass", "list", "--json").stdout)["rules"] == json.loads(before)["rules"]


def test_bad_rules_file_changes_nothing(lab, graph, tmp_path):
    rules = tmp_path / "bad.rules"
    rules.write_text(f"client {CLIENT4}/32   # fine\n\n# also fine:\nport 8443\nserver 198.19.0.5/24\n")
    proc = lab.pepctl("bypass", "add", "--from-file", str(rules), check=False)
    assert proc.returncode != 0 and f"{rules}:5:" in proc.stderr and "198.19.0.5/24" in proc.stderr, proc.stderr
    listed = json.loads(lab.pepctl("bypass", "list", "--json").stdout)["rules"]
    assert listed == [], f"a refused file installed rules: {listed}"
    with flow_maps.open_map(graph.pins, "bypass_client4") as m:
        assert m.lookup(flow_maps.lpm_key(f"{CLIENT4}/32", graph.slot)) is None, f"bypass_client4 holds {CLIENT4}/32"


def test_status_shows_what_new_flows_get_and_the_flow_counters(lab, graph):
    st = pep_status(lab)
    p = st["graphs"][0]["proxy"]
    assert st["state"] == "up" and p["mode"] == "proxy" and p["interception"] == lab.interception, \
        f"status --json: expected up, mode proxy, {lab.interception} interception: {st['state']}, {p}"
    assert p["why"] == f"HAProxy listens on {graph.listen_port}", f"status --json: why: {p['why']!r}"
    assert set(st["graphs"][0]["flows"]) == set(flow_maps.COUNTERS), st["graphs"][0]["flows"]
    text = lab.pepctl("status").stdout
    assert f"new flows: PROXY (HAProxy listens on {graph.listen_port}); {lab.interception} " \
        "interception" in text, text
    assert re.search(r"flows proxied \d+, bypassed by rule \d+, by fail-open \d+, not intercepted \d+", text), text
