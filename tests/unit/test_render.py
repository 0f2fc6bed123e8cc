"""The HAProxy and nftables renderers: the text they write, checked by the real tools.

Each rendered HAProxy config goes through `haproxy -c`, and must pass with no
warning; the check binds nothing but opens the graphs' namespaces, so it runs
as root with two throwaway ones. Each nft script goes
through `nft -c` inside a throwaway network namespace (`unshare -n`, root
only), and is then loaded there for real, twice, to show a reload replaces
the table in one transaction and the named counters exist. The namespace is
anonymous and dies with the command: nothing is left behind.
Both checkers are first shown to reject a broken file, so these tests can fail.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import secrets
import shutil
import subprocess
import tempfile

import pytest

from bench.proxy_tuning import CANDIDATES
from haproxy.render import STATS_ENV, GraphProxy, Process
from haproxy.render import render as render_haproxy
from netns.configs import one_graph, toml_text
from pepctl.config import Graph, parse
from pepctl.hostinfo import HostInfo, maxconn_for
from pepctl.render_nft import COUNTERS, render_nft

CONFIG = toml_text(one_graph(proxy={"interception": "nft", "ports": [80, 443, "8000-8080"]}))
GRAPH = parse(CONFIG, "test.toml").graphs[0]
RUN_ID = secrets.token_hex(3)


def graph(**proxy) -> Graph:
    return dataclasses.replace(GRAPH, proxy=dataclasses.replace(GRAPH.proxy, **proxy))


@pytest.fixture(scope="module")
def workdir():
    with tempfile.TemporaryDirectory(prefix=f"pcf-render-{RUN_ID}-") as d:
        yield d


# -- HAProxy ------------------------------------------------------------------------------------

HAPROXY = shutil.which("haproxy") or ("/usr/sbin/haproxy" if os.path.exists("/usr/sbin/haproxy") else None)
needs_haproxy = pytest.mark.skipif(HAPROXY is None, reason="haproxy binary not installed (scripts/setup)")


def gp(name: str = "graph_g1", **kw) -> GraphProxy:
    base = {"name": name, "netns": "pep1-g1", "ports": ("50080",), "mode": "tcp", "splice": "both", "maxconn": 7000,
            "log_connections": False}
    return GraphProxy(**{**base, **kw})


def render(*graphs: GraphProxy, cpus=(0, 1), maxconn=7000) -> str:
    return render_haproxy(Process("instance pep1", tuple(cpus), maxconn), list(graphs or [gp()]))


def haproxy_check(text: str, workdir: str) -> subprocess.CompletedProcess:
    """haproxy -c, with the stats socket the supervisor would name in the environment."""
    path = os.path.join(workdir, f"check-{secrets.token_hex(4)}.cfg")
    with open(path, "w") as f:
        f.write(text)
    return subprocess.run([HAPROXY, "-c", "-f", path], capture_output=True, text=True, timeout=30,
                          env={**os.environ, STATS_ENV: f"{workdir}/h.sock"})


def section(text: str, header: str) -> list[str]:
    """The stripped lines of one section (`frontend graph_g1`), without its header."""
    lines = text.splitlines()
    start = lines.index(header) + 1
    out = []
    for line in lines[start:]:
        if not line.startswith(" "):
            break
        out.append(line.strip())
    return out


@pytest.fixture(scope="module")
def graph_namespaces():
    """haproxy -c opens the namespace of every `namespace` keyword: two throwaway ones (root only)."""
    if os.geteuid() != 0:
        pytest.skip("haproxy -c opens the graphs' namespaces: creating them needs root")
    names = [f"pcf{RUN_ID}-g1", f"pcf{RUN_ID}-g2"]
    for n in names:
        subprocess.run(["ip", "netns", "add", n], check=True)
    yield names
    for n in names:
        subprocess.run(["ip", "netns", "del", n], check=True)


COMBOS = list(itertools.product(("tcp", "http"), (("50080",), ("80", "8000-8080")), ("both", "auto", "off")))


@needs_haproxy
@pytest.mark.parametrize("mode,ports,splice", COMBOS, ids=["-".join((c[0], c[1][0], c[2])) for c in COMBOS])
def test_haproxy_accepts_rendered_config(mode, ports, splice, workdir, graph_namespaces):
    g1, g2 = graph_namespaces
    text = render(gp(netns=g1, mode=mode, ports=ports, splice=splice, log_connections=mode == "http"),
                  gp("graph_g2", netns=g2, mode="tcp", maxconn=10))
    proc = haproxy_check(text, workdir)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"haproxy -c rejected the {mode}/{ports}/{splice} config:\n{out}\n{text}"
    assert "[WARNING]" not in out and "[ALERT]" not in out, f"haproxy -c warned:\n{out}\n{text}"


@needs_haproxy
@pytest.mark.parametrize("candidate", CANDIDATES)
def test_bench_tuning_candidates_are_valid_haproxy(candidate, workdir, graph_namespaces):
    """bench proxy-tuning changes the rendered config one setting at a time: each change must
    change it, and HAProxy 2.6 must take the result without a warning (a candidate HAProxy
    ignored would measure nothing)."""
    text = render(gp(netns=graph_namespaces[0]), gp("graph_g2", netns=graph_namespaces[1], maxconn=10))
    changed = CANDIDATES[candidate][1](text)
    assert changed != text, f"candidate {candidate} left the config as it was"
    proc = haproxy_check(changed, workdir)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "[WARNING]" not in out and "[ALERT]" not in out, \
        f"haproxy -c on candidate {candidate}:\n{out}\n{changed}"


@needs_haproxy
def test_haproxy_check_can_fail(workdir, graph_namespaces):
    text = render(gp(netns=graph_namespaces[0])).replace(" transparent", " transparnet")
    proc = haproxy_check(text, workdir)
    assert proc.returncode != 0, "haproxy -c accepted a misspelt bind keyword: the check proves nothing"


def test_haproxy_global():
    text = render(cpus=[3, 1, 2], maxconn=1234)
    g = section(text, "global")
    assert "nbthread 3" in g
    # Thread i runs on cpus[i], in the caller's order.
    assert [x for x in g if x.startswith("cpu-map")] == ["cpu-map 1/1 3", "cpu-map 1/2 1", "cpu-map 1/3 2"]
    assert "maxconn 1234" in g
    # Each HAProxy process binds the stats socket its supervisor names (a reload's new and old ones differ).
    assert 'stats socket "${PEP_STATS_SOCK}" mode 660 level admin expose-fd listeners' in g
    assert "log stdout format raw local0 notice" in g
    assert not any("tcplog" in x or "httplog" in x for x in text.splitlines())
    assert "daemon" not in g and "master-worker" not in g, "HAProxy runs in the foreground under its supervisor"


def test_every_graph_has_its_own_frontend_backend_and_maxconn():
    text = render(gp(maxconn=100), gp("graph_g2", netns="pep1-g2", maxconn=200))
    for name, ns, maxconn in (("graph_g1", "pep1-g1", 100), ("graph_g2", "pep1-g2", 200)):
        fe, be = section(text, f"frontend {name}"), section(text, f"backend {name}")
        assert f"maxconn {maxconn}" in fe, fe
        for t in (1, 2):
            assert f"bind 0.0.0.0:50080 transparent namespace {ns} thread {t}" in fe, fe
            assert f"bind [::]:50080 transparent v6only namespace {ns} thread {t}" in fe, fe
        assert f"default_backend {name}" in fe
        assert f"server origin 0.0.0.0 namespace {ns}" in be, be


@pytest.mark.parametrize("mode,option", [("tcp", "option tcplog"), ("http", "option httplog")])
def test_haproxy_connection_logs(mode, option):
    text = render(gp(mode=mode, log_connections=True), gp("graph_g2", netns="pep1-g2"))
    assert "log stdout format raw local0 info" in section(text, "global")
    assert option in section(text, "frontend graph_g1")
    assert "no log" in section(text, "frontend graph_g2"), "a graph that does not log connections says no log"
    assert f"mode {mode}" in section(text, "frontend graph_g1")


@pytest.mark.parametrize("splice,want", [
    ("both", ["option splice-request", "option splice-response"]),
    ("auto", ["option splice-auto"]),
    ("off", []),
])
def test_haproxy_splice(splice, want):
    got = [x for x in section(render(gp(splice=splice)), "frontend graph_g1") if "splice" in x]
    assert got == want, f"splice={splice}: got {got}"


def test_haproxy_route_mode_binds_every_port_on_both_families():
    fe = section(render(gp(ports=("80", "443", "8000-8080")), cpus=(0,)), "frontend graph_g1")
    binds = [x for x in fe if x.startswith("bind")]
    assert binds == [f"bind {a}:{p} transparent{v6} namespace pep1-g1"
                     for p in ("80", "443", "8000-8080") for a, v6 in (("0.0.0.0", ""), ("[::]", " v6only"))]


@pytest.mark.parametrize("cpus", [(0,), (0, 1), (3, 1, 2)])
def test_haproxy_each_thread_has_listeners_of_its_own(cpus):
    """One listening socket per thread, address and port (SO_REUSEPORT: the kernel spreads new
    connections over them); one thread needs no `thread` owner."""
    fe = section(render(gp(ports=("80", "8000-8080")), cpus=cpus), "frontend graph_g1")
    binds = [x for x in fe if x.startswith("bind")]
    owners = [f" thread {t}" for t in range(1, len(cpus) + 1)] if len(cpus) > 1 else [""]
    assert binds == [f"bind {a}:{p} transparent{v6} namespace pep1-g1{owner}"
                     for p in ("80", "8000-8080") for a, v6 in (("0.0.0.0", ""), ("[::]", " v6only"))
                     for owner in owners], binds


@pytest.mark.parametrize("threads", [1, 2])
def test_the_descriptor_budget_counts_each_port_route_binds(threads):
    """route binds a socket per intercepted port (a range is a socket per port), per thread and
    address family; bpf and nft one listen_port: maxconn's budget leaves a descriptor for each."""
    ranges = ((80, 80), (443, 443), (8000, 8080))
    route, bpf = graph(interception="route", ports=ranges), graph(interception="bpf", ports=ranges)
    assert (route.proxy.bound_ports, bpf.proxy.bound_ports) == (83, 1), \
        f"ports bound: route {route.proxy.bound_ports}, bpf {bpf.proxy.bound_ports}; expected 83 and 1"
    budget = {g.proxy.interception: maxconn_for(20000, [g.proxy.bound_ports], threads) for g in (route, bpf)}
    spare = budget["bpf"] - budget["route"]
    sockets = 2 * threads * 82   # route's 82 ports more, per address family and thread
    assert abs(spare - sockets / 2.5) <= 1, f"{threads} threads: route leaves {spare} connections fewer; " \
                                              f"expected {sockets / 2.5:.0f} for {sockets} more listening sockets"


@pytest.mark.parametrize("mode,keep_port,usesrc", [("tcp", True, "client"), ("http", True, "client"),
                                                   ("tcp", False, "clientip")])
def test_haproxy_backend_goes_to_original_destination_from_client_address(mode, keep_port, usesrc):
    b = section(render(gp(mode=mode, keep_port=keep_port)), "backend graph_g1")
    assert f"source 0.0.0.0 usesrc {usesrc}" in b, b
    assert "server origin 0.0.0.0 namespace pep1-g1" in b
    assert ("http-reuse never" in b) == (mode == "http")


def test_haproxy_serves_no_metrics_port_of_its_own():
    """pepctl's exporter serves the proxy's figures (from the stats socket): one endpoint per host."""
    text = render()
    assert "prometheus-exporter" not in text and "frontend metrics" not in text, text


@pytest.mark.parametrize("kwargs,words", [
    ({"cpus": []}, "need 1-64 CPUs"),
    ({"cpus": list(range(65))}, "need 1-64 CPUs"),
    ({"maxconn": 0}, "maxconn must be positive"),
])
def test_haproxy_refuses_impossible_requests(kwargs, words):
    with pytest.raises(ValueError, match=words):
        render(**kwargs)


# -- nftables -----------------------------------------------------------------------------------

def test_nft_script_replaces_table_atomically():
    lines = render_nft(GRAPH, table="pep_pep1").splitlines()
    body = [x for x in lines if not x.startswith("#")]
    assert body[:3] == ["table inet pep_pep1", "delete table inet pep_pep1", "table inet pep_pep1 {"]


def test_nft_rules():
    text = render_nft(GRAPH, table="pep_pep1", mark=0x10)
    rules = [x.strip() for x in text.splitlines() if x.startswith("\t\t")]
    assert rules[0] == "type filter hook prerouting priority mangle; policy accept;"
    on = 'iifname { "c_in", "s_in" } meta l4proto tcp'
    assert rules[1] == (f'{on} tcp flags & (syn | ack) != syn socket transparent 1 counter name "proxied" '
                        'meta mark set 0x10 accept')
    ports = "tcp dport { 80, 443, 8000-8080 }"
    assert rules[2] == (f'{on} meta nfproto ipv4 {ports} counter name "intercepted_v4" '
                        "tproxy ip to :50080 meta mark set 0x10 accept")
    assert rules[3] == (f'{on} meta nfproto ipv6 {ports} counter name "intercepted_v6" '
                        "tproxy ip6 to :50080 meta mark set 0x10 accept")
    for name in COUNTERS:
        assert f"\tcounter {name} {{ }}" in text


def test_nft_all_ports_and_single_port():
    assert "dport" not in render_nft(graph(ports=None), table="t")
    assert "tcp dport 443 counter" in render_nft(graph(ports=((443, 443),)), table="t")


@pytest.mark.parametrize("kwargs,words", [
    ({"table": "pep-1"}, "table name"),
    ({"table": "1pep"}, "table name"),
    ({"table": "t", "mark": 0}, "mark 0"),
    ({"table": "t", "mark": 1 << 32}, "mark"),
])
def test_nft_refuses_bad_arguments(kwargs, words):
    with pytest.raises(ValueError, match=words):
        render_nft(GRAPH, **kwargs)


@pytest.mark.parametrize("mode", ["route", "bpf"])
def test_nft_refuses_other_modes(mode):
    with pytest.raises(ValueError, match="not nft"):
        render_nft(graph(interception=mode), table="t")


needs_root_nft = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("nft") or not shutil.which("unshare"),
    reason="nft -c needs root (CAP_NET_ADMIN), nft and unshare, for a throwaway network namespace")


def in_new_netns(script: str, *files: str) -> subprocess.CompletedProcess:
    """Run a shell script in a fresh, anonymous network namespace that dies with it."""
    return subprocess.run(["unshare", "-n", "sh", "-ec", script, "sh", *files],
                          capture_output=True, text=True, timeout=30)


def write(workdir: str, name: str, text: str) -> str:
    path = os.path.join(workdir, name)
    with open(path, "w") as f:
        f.write(text)
    return path


@needs_root_nft
@pytest.mark.parametrize("ports", [((80, 80), (443, 443), (8000, 8080)), ((443, 443),), None],
                         ids=["list", "one", "all"])
def test_nft_accepts_script_and_reload_replaces_table(ports, workdir):
    table = f"pcf_{RUN_ID}"
    path = write(workdir, f"{table}-{secrets.token_hex(2)}.nft", render_nft(graph(ports=ports), table=table))
    proc = in_new_netns('nft -c -f "$1"; nft -f "$1"; nft -f "$1"; nft -j list counters', path)
    assert proc.returncode == 0, f"nft rejected the script: {proc.stderr}\n{open(path).read()}"
    objs = json.loads(proc.stdout)["nftables"]
    names = sorted(o["counter"]["name"] for o in objs if "counter" in o and o["counter"]["table"] == table)
    assert names == sorted(COUNTERS), f"counters after two loads: {names}"


@needs_root_nft
def test_nft_check_can_fail(workdir):
    path = write(workdir, "broken.nft", render_nft(GRAPH, table="t").replace("tproxy ip to", "tproxy ipx to"))
    proc = in_new_netns('nft -c -f "$1"', path)
    assert proc.returncode != 0, "nft -c accepted a broken script: the check proves nothing"


def test_threads_cpus_and_the_listeners_descriptors():
    """host.threads lays threads over the NIC's CPUs in turn (0: one per CPU), and the open-file
    budget keeps a descriptor for each listener the render makes: a thread's, per address family."""
    info = HostInfo(nic_exists=True, nic_bus=None, numa_node=None, cpus=(2, 5), cpus_note="test", nofile=20000,
                    available_cc=frozenset(), proxy_user="pep", proxy_uid=None, proxy_gid=None)
    assert info.proxy_cpus() == (2, 5)
    assert info.proxy_cpus(3) == (2, 5, 2)
    for threads in (1, 2, 8):
        listeners = sum(x.strip().startswith("bind ") for x in render(cpus=tuple(range(threads))).splitlines())
        spare = maxconn_for(20000, threads=1) - maxconn_for(20000, threads=threads)
        # 2.5 descriptors a connection: the extra listeners cost their count over 2.5 connections.
        assert abs(spare - (listeners - 2) / 2.5) <= 1, f"{threads} threads, {listeners} listeners: {spare} fewer"
