"""The transparent proxy in the lab: split TCP, BBR to clients, CUBIC to origin, in each interception mode.

   client 198.18.0.10 -- switch == nic0 [proxyhost: HAProxy, stats socket, exporter 127.0.0.1:9101]
                                      == c_in [pep: tc flow_ingress (bpf: sk_assign | nft: TPROXY) -> listener] s_in
                                      == ... -- origin nginx 198.19.0.10

Every test runs on two labs (LAB_MODES): the default one (interception `bpf`, every TCP port), and one
with `--interception nft --ports 80`, so the nft path stays covered.

How right is told from wrong: the origin's access log names the peer of each
request it served; through a transparent proxy that must be the client's own
address. HAProxy's stats (frontend graph_pep) count the sessions it carried, and
flow_ingress's counters (flows_proxied, flows_not_intercepted, syn_to_self,
pkts_assigned) say what it decided, so a request that went through HAProxy moves
`stot` and one that was only routed (ping, UDP, TCP to a port not intercepted)
does not. `ss -tin` inside the pep namespace (where HAProxy opens its sockets,
`namespace` on bind and server) shows each socket's congestion control. Which
interception ran is told by what it leaves: an nft table and its counters in
nft mode; no nft ruleset at all, and packets handed to sockets (pkts_assigned),
in bpf mode.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess

import pytest

from netns.addresses import (
    ACCESS_GW4,
    ACCESS_GW6,
    ACCESS_NET4,
    ACCESS_NET6,
    CLIENT4,
    CLIENT6,
    ORIGIN4,
    ORIGIN6,
    ORIGIN_GW4,
    ORIGIN_GW6,
    ORIGIN_NET4,
    ORIGIN_NET6,
    ORIGIN_URL4,
    ORIGIN_URL6,
)
from netns.handle import PEP_LAB, PYTHON
from netns.lab import DEFAULT_CONGESTION
from pepctl import nsutil
from pepctl.runner import wait_for

# The lab's options per interception mode.
LAB_MODES = {"bpf": [], "nft": ["--interception", "nft", "--ports", "80"]}



def graph(lab) -> dict:
    return lab.status()["pepctl"]["graphs"][0]


def sessions(lab) -> int:
    return graph(lab)["proxy"]["haproxy"]["sessions_total"]


def flows(lab) -> dict[str, int]:
    return graph(lab)["flows"]


def grew(before: dict, after: dict) -> dict:
    return {k: after[k] - before[k] for k in before if after[k] != before[k]}


@pytest.mark.parametrize("url,client", [(f"{ORIGIN_URL4}/", CLIENT4),
                                        (f"{ORIGIN_URL6}/", CLIENT6)])
def test_origin_sees_client_address_and_haproxy_counts_it(lab, url, client):
    before, f0 = sessions(lab), flows(lab)
    tag = f"t{secrets.token_hex(4)}"
    body = lab.run("client", "curl", "-s", "-m", "5", f"{url}?{tag}").stdout
    assert "PEP lab origin" in body, f"client: curl {url}: {body[:200]!r}"
    peer = lab.origin_peer(tag)
    assert peer == client, f"origin log: expected peer {client}, got {peer}"
    after = wait_for(lambda: sessions(lab) > before and sessions(lab), timeout=3, what="HAProxy stot")
    assert after == before + 1, f"HAProxy graph_pep sessions_total: expected {before + 1}, got {after}"
    f1 = flows(lab)
    assert f1["flows_proxied"] == f0["flows_proxied"] + 1, \
        f"pep flow counters ({lab.interception}): expected flows_proxied +1, got {grew(f0, f1)}"


def _ss_sockets(lab) -> list[tuple[str, str, str]]:
    """(local, peer, info line) for every established TCP socket in the pep namespace."""
    out = lab.run("pep", "ss", "-tinH", "state", "established").stdout.splitlines()
    found = []
    for head, info in zip(out[::2], out[1::2], strict=False):
        cols = head.split()
        found.append((cols[-2], cols[-1], info))
    return found


def test_the_default_toward_client_and_cubic_toward_origin(lab):
    download = lab.popen("client", "curl", "-s", "-o", "/dev/null", "--limit-rate", "5M", "-m", "8",
                         f"{ORIGIN_URL4}/50m")
    try:
        def both_sockets():
            socks = _ss_sockets(lab)
            to_client = [i for local, peer, i in socks if peer.startswith(f"{CLIENT4}:")]
            to_origin = [i for local, peer, i in socks if peer == f"{ORIGIN4}:80"]
            return (to_client, to_origin) if to_client and to_origin else None
        to_client, to_origin = wait_for(both_sockets, timeout=5, what="both halves of the split flow in ss")
        assert re.search(rf"\b{DEFAULT_CONGESTION}\b", to_client[0]), \
            f"pep: client-facing socket: expected {DEFAULT_CONGESTION}: {to_client[0]}"
        assert re.search(r"\bcubic\b", to_origin[0]), f"pep: origin-facing socket: expected cubic: {to_origin[0]}"
    finally:
        download.kill()
        download.wait()


def test_side_routes_carry_congctl_and_initial_window(lab):
    """Both are route metrics: every accepted (client-facing) or connecting (origin-facing)
    socket takes the metrics of its route. Defaults: pepctl's own pep_radio and 32 segments toward
    the subscribers; cubic and the kernel's initial window toward the origin."""
    want = {ACCESS_NET4: {"congestion": DEFAULT_CONGESTION, "initcwnd": 32},
            ACCESS_NET6: {"congestion": DEFAULT_CONGESTION, "initcwnd": 32},
            ORIGIN_NET4: {"congestion": "cubic"}, ORIGIN_NET6: {"congestion": "cubic"}}
    got = {}
    for fam in ("-4", "-6"):
        for route in json.loads(lab.run("pep", "ip", "-j", fam, "route", "show").stdout):
            if route["dst"] in want:
                got[route["dst"]] = {k: v for m in route.get("metrics", []) for k, v in m.items()}
    assert got == want, f"pep namespace: route metrics per prefix: expected {want}, got {got}"


def test_ping_and_udp_are_routed_not_proxied(lab):
    before, f0 = sessions(lab), flows(lab)
    for dst in (ORIGIN4, ORIGIN6):
        lab.run("client", "ping", "-c", "2", "-i", "0.1", "-W", "2", dst)
    echo = ("import socket;s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);s.bind(('0.0.0.0',80));"
            "print('ready',flush=True);s.settimeout(5);d,a=s.recvfrom(2048);s.sendto(d.upper(),a)")
    server = lab.popen("origin", PYTHON, "-c", echo)
    assert server.stdout.readline().strip() == "ready"
    ask = ("import socket;s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);s.settimeout(3);"
           f"s.sendto(b'udp to port 80',('{ORIGIN4}',80));print(s.recv(2048).decode())")
    assert lab.run("client", PYTHON, "-c", ask).stdout.strip() == "UDP TO PORT 80"
    server.wait(timeout=5)
    assert sessions(lab) == before, "HAProxy counted a session for ping/UDP"
    f1 = flows(lab)
    # 4 echo requests and replies per family, the datagram and its answer: all passed to the stack.
    assert f1["pkts_not_tcp"] >= f0["pkts_not_tcp"] + 10 and f1["flows_proxied"] == f0["flows_proxied"], \
        f"pep flow counters ({lab.interception}): expected pkts_not_tcp +10 or more and no flow proxied, " \
        f"got {grew(f0, f1)}"


# A TCP server on the origin that answers with the peer address it saw, on any port.
ECHO_PEER = ("import socket,sys;fam=socket.AF_INET6 if ':' in sys.argv[1] else socket.AF_INET;s=socket.socket(fam);"
             "s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);s.bind((sys.argv[1],int(sys.argv[2])));s.listen();"
             "print('ready',flush=True);s.settimeout(5);c,a=s.accept();c.sendall(a[0].encode());c.close()")
ASK_PEER = ("import socket,sys;c=socket.create_connection((sys.argv[1],int(sys.argv[2])),3);"
            "print(c.recv(100).decode())")

# Per lab: (origin address, port, client, what should happen), one IPv4 and one IPv6 case. The default
# lab intercepts every TCP port; the nft lab only port 80, so other ports are routed.
PORTS = {
    "bpf": [(ORIGIN4, 8081, CLIENT4, "proxied"), (ORIGIN6, 4011, CLIENT6, "proxied")],
    "nft": [(ORIGIN4, 8081, CLIENT4, "routed"), (ORIGIN6, 4011, CLIENT6, "routed")],
}


@pytest.mark.parametrize("case", [0, 1], ids=["v4", "v6"])
def test_tcp_port_is_proxied_when_intercepted_and_routed_when_not(lab, case):
    origin, port, client, want = PORTS[lab.interception][case]
    before, f0 = sessions(lab), flows(lab)
    server = lab.popen("origin", PYTHON, "-c", ECHO_PEER, origin, str(port))
    assert server.stdout.readline().strip() == "ready"
    got = lab.run("client", PYTHON, "-c", ASK_PEER, origin, str(port)).stdout.strip()
    server.wait(timeout=5)
    assert got == client, f"origin: TCP port {port}: expected to see peer {client}, saw {got!r}"
    f1 = flows(lab)
    if want == "proxied":
        wait_for(lambda: sessions(lab) == before + 1, timeout=3,
                 what=f"HAProxy sessions_total {before + 1} (port {port} proxied)")
        assert f1["flows_proxied"] == f0["flows_proxied"] + 1, \
            f"pep flow counters: port {port}: expected flows_proxied +1, got {grew(f0, f1)}"
    else:
        assert sessions(lab) == before, f"HAProxy counted a session for port {port}, which it does not intercept"
        assert f1["flows_not_intercepted"] == f0["flows_not_intercepted"] + 1 and \
            f1["flows_proxied"] == f0["flows_proxied"], \
            f"pep flow counters: port {port}: expected flows_not_intercepted +1 only, got {grew(f0, f1)}"


def nft_counters(lab) -> dict[str, int]:
    out = json.loads(lab.run("pep", "nft", "-j", "list", "counters").stdout)["nftables"]
    return {c["counter"]["name"]: c["counter"]["packets"] for c in out if "counter" in c}


def test_interception_is_the_modes_own(lab):
    """bpf: no netfilter at all in the graph's namespace, and the request's packets are handed to
    sockets by tc; nft: the instance's table, whose counters the request moves."""
    f0 = flows(lab)
    n0 = nft_counters(lab) if lab.interception == "nft" else {}
    lab.run("client", "curl", "-s", "-m", "5", "-o", "/dev/null", f"{ORIGIN_URL4}/1k")
    f1 = flows(lab)
    if lab.interception == "bpf":
        ruleset = lab.run("pep", "nft", "-j", "list", "ruleset").stdout
        items = [i for i in json.loads(ruleset)["nftables"] if "metainfo" not in i]
        assert items == [], f"pep namespace in bpf mode: expected no nft ruleset, got {items}"
        assert f1["pkts_assigned"] > f0["pkts_assigned"], \
            f"pep flow counters: a proxied request in bpf mode moved no pkts_assigned: {grew(f0, f1)}"
    else:
        tables = [i["table"]["name"] for i in json.loads(lab.run("pep", "nft", "-j", "list", "tables").stdout)
                  ["nftables"] if "table" in i]
        cfg = lab.config()
        want = cfg.graph_names(cfg.graphs[0]).nft_table
        assert tables == [want], f"pep namespace in nft mode: tables: expected [{want}], got {tables}"
        n1 = nft_counters(lab)
        assert n1["intercepted_v4"] > n0["intercepted_v4"] and n1["proxied"] > n0["proxied"], \
            f"pep nft counters: a proxied request did not move them: {grew(n0, n1)}"
        assert f1["pkts_assigned"] == f0["pkts_assigned"], f"nft mode assigned packets in tc: {grew(f0, f1)}"


# Connections to every one of the PEP's own addresses: (node, address), each on port 80 (intercepted
# in both labs) and on the listener's port 50080.
SELF = [("client", ACCESS_GW4), ("client", ACCESS_GW6), ("client", ORIGIN_GW4),
        ("origin", ORIGIN_GW4), ("origin", ORIGIN_GW6), ("origin", ACCESS_GW4)]
TRY_CONNECT = r"""
import json, socket, sys, threading
out = {}
def one(addr, port):
    try:
        socket.create_connection((addr, port), timeout=1.5).close()
        out[f"{addr} {port}"] = "connected"
    except OSError as e:
        out[f"{addr} {port}"] = type(e).__name__
ts = [threading.Thread(target=one, args=(a, int(p))) for a, p in (t.split(",") for t in sys.argv[1:])]
[t.start() for t in ts]
[t.join() for t in ts]
print(json.dumps(out))
"""


def test_no_connection_to_the_peps_own_addresses(lab):
    f0 = flows(lab)
    connected = {}
    for node in ("client", "origin"):
        targets = [f"{addr},{port}" for n, addr in SELF if n == node for port in (80, 50080)]
        got = json.loads(lab.run(node, PYTHON, "-c", TRY_CONNECT, *targets, timeout=30).stdout)
        connected.update({f"{node} -> {k}": v for k, v in got.items() if v == "connected"})
    assert not connected, f"connections to the PEP's own addresses succeeded ({lab.interception}): {connected}"
    f1 = flows(lab)
    assert f1["syn_to_self"] - f0["syn_to_self"] >= 2 * len(SELF), \
        f"pep flow counters: expected syn_to_self +{2 * len(SELF)} or more, got {grew(f0, f1)}"


def test_pepctl_up_twice_changes_nothing(lab):
    proc = lab.pepctl("up")
    assert "nothing changed" in proc.stdout, proc.stdout


def test_reload_during_load_loses_no_transaction(lab):
    with open(os.path.join(lab.run_dir, "pep.toml")) as f:
        original = f.read()
    gen0 = json.loads(lab.pepctl("status", "--json").stdout)["proxy"]["generation"]
    out, _ = lab.reload_under_load([re.sub(r'splice = "\w+"', f'splice = "{splice}"', original)
                                    for splice in ("auto", "off", "both")])
    done = int(re.search(r"(\d+) requests in", out).group(1))
    assert done > 100, f"wrk made only {done} requests: {out}"
    assert "Socket errors" not in out and "Non-2xx" not in out, f"transactions lost during reload:\n{out}"
    proxy = json.loads(lab.pepctl("status", "--json").stdout)["proxy"]
    assert proxy["generation"] == gen0 + 4 and proxy["last_reload"]["ok"], \
        f"supervisor: expected 4 more reloads, all ok, got generation {gen0} -> {proxy['generation']}, " \
        f"last {proxy['last_reload']}"


def test_reload_refuses_structural_change_and_changes_nothing(lab):
    conf = os.path.join(lab.run_dir, "pep.toml")
    with open(conf) as f:
        original = f.read()
    try:
        with open(conf, "w") as f:
            f.write(original.replace("vlan = 100", "vlan = 101"))
        proc = lab.pepctl("reload", check=False)
        assert proc.returncode != 0 and "graph[0].access" in proc.stderr, proc.stderr
    finally:
        with open(conf, "w") as f:
            f.write(original)
    assert "PEP lab origin" in lab.run("client", "curl", "-s", "-m", "5", f"{ORIGIN_URL4}/").stdout


def test_client_reusing_its_port_is_not_delayed_by_time_wait(lab):
    """A client reusing a source port at once (the proxy closed first, so the proxy's socket of that
    4-tuple is in TIME_WAIT): its new SYN must reach HAProxy's listener at once, with no SYN
    retransmitted, and TIME_WAIT is kept (tcp_max_tw_buckets not 0). nft: tproxy hands the SYN past
    the TIME_WAIT socket. bpf: the datapath ends the TIME_WAIT socket with a RST and decides the SYN
    again (tc/flow.c past_time_wait; counted tw_reset)."""
    def syn_retransmits() -> int:
        out = lab.run("client", "nstat", "-az", "TcpExtTCPSynRetrans").stdout
        return int(re.search(r"TcpExtTCPSynRetrans\s+(\d+)", out).group(1))
    # Read to EOF before closing: the proxy closes first, so TIME_WAIT is on its side, not ours.
    get = ("import socket;s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);"
           f"s.bind(('{CLIENT4}',40999));s.settimeout(5);s.connect(('{ORIGIN4}',80));"
           "s.sendall(b'GET / HTTP/1.1\\r\\nHost: o\\r\\nConnection: close\\r\\n\\r\\n');d=b''\n"
           "while (c:=s.recv(65536)): d+=c\nprint(d.decode().split('\\r\\n')[0])")
    kept = lab.run("pep", "sysctl", "-n", "net.ipv4.tcp_max_tw_buckets").stdout.strip()
    assert kept != "0", f"pep: net.ipv4.tcp_max_tw_buckets is 0: TIME_WAIT not kept ({lab.interception})"
    before, resets = syn_retransmits(), flows(lab)["tw_reset"]
    for i in range(4):
        status = lab.run("client", PYTHON, "-c", get).stdout.strip()
        assert status == "HTTP/1.1 200 OK", f"client: GET {i + 1} from port 40999: {status!r}"
        tw = lab.run("pep", "ss", "-Htan", "state", "time-wait", "sport = :80", "dport = :40999").stdout
        assert tw.strip(), f"pep: no TIME_WAIT socket for port 40999 after GET {i + 1}: the case is not set up"
    assert syn_retransmits() == before, "client: SYNs were retransmitted: a SYN hit a TIME_WAIT socket"
    if lab.interception == "bpf":
        resets = flows(lab)["tw_reset"] - resets
        assert resets == 3, f"pep: tw_reset moved by {resets}, expected 3 (GETs 2-4 each met a TIME_WAIT socket)"


def test_prometheus_exporter_counts_sessions_on_the_host_only(lab):
    """The exporter lives in the proxy host's namespace (127.0.0.1:9101), where the host's monitoring
    scrapes it, never on a data VLAN: the graph's namespace has no listener on 9101."""
    lab.run("client", "curl", "-s", "-m", "5", "-o", "/dev/null", f"{ORIGIN_URL4}/")
    proc = lab.run("proxyhost", "curl", "-sS", "-m", "5", "http://127.0.0.1:9101/metrics", check=False)
    text = proc.stdout
    m = re.search(r'^pep_proxy_sessions_total\{graph="pep"\} (\d+)', text, re.M)
    assert m and int(m.group(1)) >= 1, \
        f"proxyhost: curl http://127.0.0.1:9101/metrics (exit {proc.returncode}, {proc.stderr.strip()!r}): " \
        f"no graph_pep sessions: {text[:300]!r}"
    ports = nsutil.listening_ports(lab.netns("pep"))
    assert 9101 not in ports, f"pep namespace: something listens on 9101 (listening: {sorted(ports)})"


def test_lab_status_is_up(lab):
    proc = subprocess.run([PEP_LAB, "status"], env=lab.env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    for want in ("up", "HAProxy pid", "supervisor pid", "new flows: PROXY", f"{lab.interception} interception"):
        assert want in proc.stdout, f"pep-lab status lacks {want!r}: {proc.stdout}"
