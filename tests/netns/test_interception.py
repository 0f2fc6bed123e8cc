"""Interception in the tc datapath: every TCP port, IPv4 and IPv6, no netfilter; the PEP answers no
connection to itself; a bypassed flow on the listener's own port is not taken by it.

   client 198.18.0.10 / 2001:2:0:1::10 (proxied), 198.18.0.30 / 2001:2:0:1::30 (bypassed by rule)
      |
   switch == nic0 [proxyhost: HAProxy, exporter 127.0.0.1:9101]
      == c_in 198.18.0.1 / 2001:2:0:1::1 [pep: tc flow_ingress -> listener :50080] s_in 198.19.0.1 / 2001:2:0:2::1
      == ... -- origin 198.19.0.10 / 2001:2:0:2::10: one TCP server on many odd ports (MANY_PORTS)

Every test runs on two labs: the default (interception `bpf`, every port) and one with
`--interception nft` (every port too), against which the bpf-only claims are contrasted. Both
connect to the origin from a spare port (`--source-port any`; the default keeps the client's):
that is how the origin tells a proxied connection from a routed one.

How right is told from wrong:
- no netfilter: `nft -j list ruleset` in the graph's namespace holds nothing in mode bpf (and the
  instance's table in mode nft: the check can tell);
- intercepted on every port: the origin's server answers each connection with the peer it saw.
  Through HAProxy (`usesrc clientip`, source_port = "any") that is the client's own address but not
  its port: HAProxy connects from a port of its own. Routed, the port would be the client's. HAProxy's sessions_total
  and flow_ingress's flows_proxied must each grow by the number of connections, and
  flows_not_intercepted not at all;
- no connection to the PEP itself: connects from the client and from the origin to all four of the
  PEP's addresses, on ports the PEP has listeners on (50080 HAProxy, 9101 the exporter in the host,
  80) and others, must all fail, and syn_to_self must count them; ping to the same addresses must
  still be answered (ICMP is not TCP: the stack answers it);
- a bypassed flow on the listener's port: a connection bypassed by a client rule whose packets are
  addressed to port 50080 (the client's own source port 50080, so the origin's answers are; or
  the origin's port 50080) must complete, byte for byte, and be remembered bypass_rule;
- an IP packet socket in the graph's namespace: beside an IPv4 and an IPv6 one, connections of
  both families fail in mode bpf (not in nft) and status names their holder; once pepctl's pin has
  bound them to lo (what `up` does to FRR's bfdd's), they succeed and status names nothing.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from netns.addresses import ACCESS_GW4, ACCESS_GW6, CLIENT4, CLIENT6, ORIGIN4, ORIGIN6, ORIGIN_GW4, ORIGIN_GW6
from netns.handle import PYTHON
from pepctl import config as configmod
from pepctl import flow_maps, nsutil
from pepctl.runner import wait_for

LAB_MODES = {"bpf": ["--source-port", "any"], "nft": ["--interception", "nft", "--source-port", "any"]}
ORIGIN = {4: ORIGIN4, 6: ORIGIN6}
CLIENT = {4: CLIENT4, 6: CLIENT6}
BYPASSED = {4: "198.18.0.30", 6: "2001:2:0:1::30"}
PEP_ADDRS = (ACCESS_GW4, ACCESS_GW6, ORIGIN_GW4, ORIGIN_GW6)
LISTEN_PORT = 50080
# Odd ports, low and high, the listener's and the exporter's among them.
MANY_PORTS = (1, 22, 443, 4011, 9101, 31337, LISTEN_PORT, 65535)
SELF_PORTS = (1, 22, 80, 443, 9101, LISTEN_PORT, 65535)

# On the origin: one listener per (address, port); each connection is answered with
# "PEER_ADDR PEER_PORT LOCAL_PORT\n" and closed. Runs until killed (at most 60 s).
MULTI_SERVER = r"""
import selectors, socket, sys, time
sel = selectors.DefaultSelector()
for addr in sys.argv[1].split(","):
    for port in map(int, sys.argv[2].split(",")):
        s = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((addr, port))
        s.listen(64)
        sel.register(s, selectors.EVENT_READ)
print("ready", flush=True)
end = time.monotonic() + 60
while time.monotonic() < end:
    for key, _ in sel.select(timeout=0.5):
        c, peer = key.fileobj.accept()
        c.sendall(f"{peer[0]} {peer[1]} {key.fileobj.getsockname()[1]}\n".encode())
        c.close()
"""

# Connects to every ADDR,PORT of argv[3:] at once from argv[1] (source address, "" for any) with
# a timeout of argv[2] s; prints {"ADDR PORT": {"local_port": p, "answer": "..."} or {"error": "..."}}.
CONNECT_ALL = r"""
import json, socket, sys, threading
src, timeout, out = sys.argv[1], float(sys.argv[2]), {}
def one(addr, port):
    key = f"{addr} {port}"
    try:
        with socket.create_connection((addr, port), timeout=timeout,
                                      source_address=(src, 0) if src else None) as s:
            local = s.getsockname()[1]
            data = b""
            while chunk := s.recv(256):
                data += chunk
        out[key] = {"local_port": local, "answer": data.decode().strip()}
    except OSError as e:
        out[key] = {"error": type(e).__name__}
ts = [threading.Thread(target=one, args=(t.rsplit(",", 1)[0], int(t.rsplit(",", 1)[1]))) for t in sys.argv[3:]]
[t.start() for t in ts]
[t.join() for t in ts]
print(json.dumps(out))
"""


def lab_setup(handle) -> None:
    """The bypassed client's addresses."""
    handle.run("client", "ip", "addr", "add", f"{BYPASSED[4]}/24", "dev", "eth0")
    handle.run("client", "ip", "-6", "addr", "add", f"{BYPASSED[6]}/64", "dev", "eth0", "nodad")


@pytest.fixture(scope="module")
def pins(lab) -> str:
    cfg = configmod.load(os.path.join(lab.run_dir, "pep.toml"))
    g = cfg.graphs[0]
    assert g.index == 0 and g.proxy.listen_port == LISTEN_PORT, \
        f"lab config: expected graph slot 0 listening on {LISTEN_PORT}, got {g.index}, {g.proxy.listen_port}"
    return cfg.instance_names().flow_pins


def counters(pins: str) -> dict[str, int]:
    return flow_maps.read_counters(pins, 0)


def grew(before: dict, after: dict) -> dict:
    return {k: after[k] - before[k] for k in before if after[k] != before[k]}


def sessions(lab) -> int:
    st = json.loads(lab.pepctl("status", "--json").stdout)
    return st["graphs"][0]["proxy"]["haproxy"]["sessions_total"]


def connect_all(lab, node: str, targets: list[tuple[str, int]], src: str = "", timeout: float = 3.0) -> dict:
    proc = lab.run(node, PYTHON, "-c", CONNECT_ALL, src, str(timeout), *(f"{a},{p}" for a, p in targets),
                   timeout=timeout + 20)
    return json.loads(proc.stdout)


# -- no netfilter ----------------------------------------------------------------------------------
def test_graph_namespace_has_no_nft_ruleset_in_mode_bpf(lab):
    out = lab.run("pep", "nft", "-j", "list", "ruleset").stdout
    items = [i for i in json.loads(out)["nftables"] if "metainfo" not in i]
    tables = [i["table"]["name"] for i in items if "table" in i]
    if lab.interception == "bpf":
        assert items == [], f"pep namespace ({lab.netns('pep')}) in mode bpf: expected no nft ruleset, got {items}"
    else:
        cfg = lab.config()
        want = cfg.graph_names(cfg.graphs[0]).nft_table
        assert tables == [want], f"pep namespace in mode nft: expected the instance's table {want}, got tables {tables}"


# -- every port, IPv4 and IPv6 ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def origin_server(lab):
    """MULTI_SERVER on the origin, on both of its addresses and every port of MANY_PORTS."""
    server = lab.popen("origin", PYTHON, "-c", MULTI_SERVER, f"{ORIGIN[4]},{ORIGIN[6]}",
                       ",".join(map(str, MANY_PORTS)))
    try:
        line = server.stdout.readline().strip()
        assert line == "ready", f"origin: the multi-port server did not start: {line!r} {server.stderr.read()}"
        yield server
    finally:
        server.kill()
        server.wait()


@pytest.mark.parametrize("fam", [4, 6])
def test_tcp_is_intercepted_on_every_port(lab, pins, origin_server, fam):
    targets = [(ORIGIN[fam], p) for p in MANY_PORTS]
    c0, s0 = counters(pins), sessions(lab)
    got = connect_all(lab, "client", targets, CLIENT[fam])
    wrong = {}
    for addr, port in targets:
        r = got[f"{addr} {port}"]
        if "error" in r:
            wrong[port] = r["error"]
            continue
        peer, peer_port, served = r["answer"].split()
        if peer != CLIENT[fam] or int(served) != port:
            wrong[port] = f"origin saw {peer} on its port {served}, expected {CLIENT[fam]} on {port}"
        elif int(peer_port) == r["local_port"]:
            wrong[port] = f"origin saw the client's own port {peer_port}: routed, not proxied"
    assert not wrong, f"client {CLIENT[fam]} -> origin {ORIGIN[fam]} ({lab.interception}): per port: {wrong}"
    n = len(targets)
    s1 = wait_for(lambda: (s := sessions(lab)) >= s0 + n and s, timeout=3,
                  what=f"HAProxy sessions_total {s0} + {n}")
    c1 = counters(pins)
    moved = {k: c1[k] - c0[k] for k in ("flows_proxied", "flows_not_intercepted", "flows_bypass_failopen")}
    assert s1 == s0 + n and moved == {"flows_proxied": n, "flows_not_intercepted": 0, "flows_bypass_failopen": 0}, \
        f"pep ({lab.interception}): {n} connections on ports {MANY_PORTS}: expected HAProxy sessions_total " \
        f"+{n} and flows_proxied +{n} only, got sessions +{s1 - s0} and {moved}"


# -- nothing connects to the PEP itself -----------------------------------------------------------------
@pytest.mark.parametrize("node", ["client", "origin"])
def test_no_connection_to_the_peps_own_addresses(lab, pins, node):
    targets = [(a, p) for a in PEP_ADDRS for p in SELF_PORTS]
    c0 = counters(pins)
    got = connect_all(lab, node, targets, timeout=1.5)
    connected = {k: v for k, v in got.items() if "error" not in v}
    assert not connected, f"{node} ({lab.interception}): connections to the PEP's own addresses succeeded: " \
                          f"{connected}"
    c1 = counters(pins)
    assert c1["syn_to_self"] - c0["syn_to_self"] >= len(targets), \
        f"pep flow counters ({lab.interception}): {len(targets)} connects from {node} to the PEP's addresses: " \
        f"expected syn_to_self +{len(targets)} or more, got {grew(c0, c1)}; answers: " \
        f"{sorted({v['error'] for v in got.values()})}"
    # ICMP still reaches them: the PEP's addresses answer ping.
    silent = [a for a in PEP_ADDRS
              if lab.run(node, "ping", "-c", "1", "-W", "2", a, check=False).returncode != 0]
    assert not silent, f"{node} ({lab.interception}): no answer to ping from {silent}"


# -- a bypassed flow on the listener's port ----------------------------------------------------------
BYPASS_CASES = {
    # (family, client source port, origin port)
    "v4 from client port 50080": (4, LISTEN_PORT, 80),
    "v6 from client port 50080": (6, LISTEN_PORT, 80),
    "v4 to origin port 50080": (4, 0, LISTEN_PORT),
}


@pytest.mark.parametrize("case", list(BYPASS_CASES))
def test_bypassed_flow_on_the_listeners_port_is_not_taken_by_it(lab, pins, origin_server, case):
    """A bypassed flow is forwarded for its whole life, whatever its ports: the proxy's listener
    (bound to :50080, transparent) must never be handed its packets. The origin's answers to a client
    whose source port is 50080 are addressed to port 50080; so are a client's packets to an origin
    server on port 50080."""
    fam, sport, dport = BYPASS_CASES[case]
    src, plen = BYPASSED[fam], 32 if fam == 4 else 128
    lab.pepctl("bypass", "add", "client", f"{src}/{plen}")
    try:
        c0 = counters(pins)
        if dport == 80:
            url = f"http://{ORIGIN[4]}/1k" if fam == 4 else f"http://[{ORIGIN[6]}]/1k"
            proc = lab.run("client", "curl", "-sS", "-g", "-m", "3", "--interface", src, "--local-port", str(sport),
                           "-o", "/dev/null", "-w", "%{http_code} %{size_download}", url, check=False)
            ok = proc.returncode == 0 and proc.stdout.split() == ["200", "1024"]
            what = f"curl exited {proc.returncode}: {proc.stdout.strip()} {proc.stderr.strip()}"
            port = sport
        else:
            r = connect_all(lab, "client", [(ORIGIN[fam], dport)], src)[f"{ORIGIN[fam]} {dport}"]
            ok = r.get("answer", "").split()[:1] == [src]
            what = json.dumps(r)
            port = r.get("local_port")
        c1 = counters(pins)
        verdicts = [f["verdict"] for f in flow_maps.flows(pins, graph=0)
                    if f["subscriber"] == src and f["sub_port"] == port and f["org_port"] == dport]
    finally:
        lab.pepctl("bypass", "del", "client", f"{src}/{plen}")
    assert ok, f"client {src} port {sport or 'any'} -> origin port {dport}, bypassed by rule " \
               f"({lab.interception}): {what}; pep flow counters moved {grew(c0, c1)}"
    assert verdicts == ["bypass_rule"], \
        f"pep flow tables: {src} port {port} -> {dport}: expected one bypass_rule entry, got {verdicts}"


# -- an IP packet socket in the graph's namespace ------------------------------------------------------
HOLD_PACKET_SOCKETS = r"""
import socket, sys, time
held = [socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(proto)) for proto in (0x0800, 0x86DD)]
print("open", flush=True)
sys.stdin.readline()
"""


def test_an_ip_packet_socket_in_the_graph_breaks_bpf_until_pinned_to_lo(lab, pins, origin_server):
    """The kernel (6.18) delivers a namespace's IPv4 (IPv6) packets to ip_rcv shared while a packet
    socket is bound to IPv4 (IPv6) on every device there (FRR's bfdd opens an IPv4 one for BFD
    echo); ip_rcv clones a shared packet, and the clone has lost the socket bpf_sk_assign gave: the
    SYN meets no socket. nft's tproxy assigns after that clone. So in mode bpf new flows of both
    families fail while they are open, and status names their holder; in mode nft nothing changes.
    Bound to lo by pepctl's pin (what `up` does to bfdd's: taken from the holder with pidfd_getfd),
    they see only lo's packets: flows work in both modes and status names nothing."""
    holder = lab.popen("pep", PYTHON, "-c", HOLD_PACKET_SOCKETS, stdin=subprocess.PIPE)
    targets = [(ORIGIN[4], 443), (ORIGIN[6], 443)]

    def state() -> tuple[dict, list[str], str]:
        got = connect_all(lab, "client", targets)
        st = json.loads(lab.pepctl("status", "--json", check=False).stdout)
        named = [p for p in st.get("problems", []) if "packet socket" in p and f"pid {holder.pid}" in p]
        return {f: "error" not in got[f"{a} {p}"] for f, (a, p) in zip((4, 6), targets, strict=True)}, named, \
            st["state"]
    try:
        assert holder.stdout.readline().strip() == "open", holder.stderr.read()
        ok, named, st = state()
        if lab.interception == "bpf":
            assert ok == {4: False, 6: False}, f"client: connections through the bpf graph beside IPv4 and IPv6 " \
                                               f"packet sockets: {ok} (True: succeeded)"
            assert len(named) == 2 and st == "damaged", f"status: state {st}, problems naming the holder {named}"
        else:
            assert ok == {4: True, 6: True}, f"client: connections through the nft graph beside packet sockets: {ok}"
            assert not named, f"status (mode nft) names the packet sockets: {named}"
        pinned = nsutil.pin_packet_sockets(lab.netns("pep"), holder.pid)
        assert sorted(p["family"] for p in pinned) == ["IPv4", "IPv6"], f"pinned {pinned}"
        ok, named, _ = state()
        assert ok == {4: True, 6: True}, f"client: connections with the packet sockets bound to lo: {ok}"
        assert not named, f"status names packet sockets bound to lo: {named}"
    finally:
        holder.communicate(input="\n", timeout=10)
