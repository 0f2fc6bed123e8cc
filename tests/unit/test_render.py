"""The HAProxy and nftables renderers: the text they write, checked by the real tools.

Each rendered HAProxy config goes through `haproxy -c` (no root needed: the
check binds nothing), and must pass with no warning. Each nft script goes
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

from pepctl.config import Graph, parse
from pepctl.render_haproxy import render_haproxy
from pepctl.render_nft import COUNTERS, render_nft

CONFIG = """\
[host]
instance = "pep1"
nic = "eth1"
[[graph]]
name = "g1"
[graph.access]
vlan = 100
addresses = ["198.18.0.1/24", "2001:2:0:1::1/64"]
[graph.origin]
vlan = 200
addresses = ["198.19.0.1/24", "2001:2:0:2::1/64"]
[graph.proxy]
ports = [80, 443, "8000-8080"]
"""
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


def haproxy_check(text: str, workdir: str) -> subprocess.CompletedProcess:
    path = os.path.join(workdir, f"check-{secrets.token_hex(4)}.cfg")
    with open(path, "w") as f:
        f.write(text)
    return subprocess.run([HAPROXY, "-c", "-f", path], capture_output=True, text=True, timeout=30)


def render(g: Graph, workdir: str = "/run/pep/pep1/g1", cpus=(0, 1), maxconn=7000) -> str:
    return render_haproxy(g, instance="pep1", graph_dir=workdir, cpus=list(cpus), maxconn=maxconn)


def section(text: str, header: str) -> list[str]:
    """The stripped lines of one section (`frontend intercept`), without its header."""
    lines = text.splitlines()
    start = lines.index(header) + 1
    out = []
    for line in lines[start:]:
        if not line.startswith(" "):
            break
        out.append(line.strip())
    return out


COMBOS = list(itertools.product(("tcp", "http"), ("nft", "route"), ("both", "auto", "off")))


@needs_haproxy
@pytest.mark.parametrize("mode,interception,splice", COMBOS, ids=["-".join(c) for c in COMBOS])
def test_haproxy_accepts_rendered_config(mode, interception, splice, workdir):
    text = render(graph(mode=mode, interception=interception, splice=splice, log_connections=mode == "http"),
                  workdir)
    proc = haproxy_check(text, workdir)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"haproxy -c rejected the {mode}/{interception}/{splice} config:\n{out}\n{text}"
    assert "[WARNING]" not in out and "[ALERT]" not in out, f"haproxy -c warned:\n{out}\n{text}"


@needs_haproxy
def test_haproxy_check_can_fail(workdir):
    text = render(GRAPH, workdir).replace(" transparent", " transparnet")
    proc = haproxy_check(text, workdir)
    assert proc.returncode != 0, "haproxy -c accepted a misspelt bind keyword: the check proves nothing"


def test_haproxy_global():
    text = render(graph(log_connections=False), cpus=[3, 1, 2], maxconn=1234)
    g = section(text, "global")
    assert "nbthread 3" in g
    # Thread i runs on cpus[i], in the caller's order.
    assert [x for x in g if x.startswith("cpu-map")] == ["cpu-map 1/1 3", "cpu-map 1/2 1", "cpu-map 1/3 2"]
    assert "maxconn 1234" in g
    assert "stats socket /run/pep/pep1/g1/haproxy.sock mode 600 level admin expose-fd listeners" in g
    assert "log stdout format raw local0 notice" in g
    assert not any("tcplog" in x or "httplog" in x for x in text.splitlines())


@pytest.mark.parametrize("mode,option", [("tcp", "option tcplog"), ("http", "option httplog")])
def test_haproxy_connection_logs(mode, option):
    text = render(graph(mode=mode, log_connections=True))
    assert "log stdout format raw local0 info" in section(text, "global")
    assert option in section(text, "frontend intercept")
    assert f"mode {mode}" in section(text, "defaults")


@pytest.mark.parametrize("splice,want", [
    ("both", ["option splice-request", "option splice-response"]),
    ("auto", ["option splice-auto"]),
    ("off", []),
])
def test_haproxy_splice(splice, want):
    got = [x for x in section(render(graph(splice=splice)), "defaults") if "splice" in x]
    assert got == want, f"splice={splice}: got {got}"


def test_haproxy_nft_mode_binds_listen_port_on_both_families():
    binds = [x for x in section(render(graph(listen_port=50123)), "frontend intercept") if x.startswith("bind")]
    assert binds == ["bind 0.0.0.0:50123 transparent", "bind [::]:50123 transparent v6only"]


def test_haproxy_route_mode_binds_every_port_on_both_families():
    binds = [x for x in section(render(graph(interception="route")), "frontend intercept") if x.startswith("bind")]
    assert binds == [
        "bind 0.0.0.0:80 transparent", "bind [::]:80 transparent v6only",
        "bind 0.0.0.0:443 transparent", "bind [::]:443 transparent v6only",
        "bind 0.0.0.0:8000-8080 transparent", "bind [::]:8000-8080 transparent v6only",
    ]


@pytest.mark.parametrize("mode", ["tcp", "http"])
def test_haproxy_backend_goes_to_original_destination_from_client_address(mode):
    b = section(render(graph(mode=mode)), "backend origin")
    assert "source 0.0.0.0 usesrc clientip" in b
    assert "server origin 0.0.0.0" in b
    assert ("http-reuse never" in b) == (mode == "http")


def test_haproxy_metrics():
    m = section(render(graph(metrics_port=9200)), "frontend metrics")
    assert "bind 127.0.0.1:9200" in m
    assert "http-request use-service prometheus-exporter if { path /metrics }" in m
    assert "frontend metrics" not in render(graph(metrics_port=0))


@pytest.mark.parametrize("kwargs,words", [
    ({"cpus": []}, "need 1-64 CPUs"),
    ({"cpus": list(range(65))}, "need 1-64 CPUs"),
    ({"maxconn": 0}, "maxconn must be positive"),
    ({"workdir": "/run/" + "x" * 100}, "longer than 107 bytes"),
])
def test_haproxy_refuses_impossible_requests(kwargs, words):
    with pytest.raises(ValueError, match=words):
        render(GRAPH, **kwargs)


def test_haproxy_route_mode_needs_ports():
    with pytest.raises(ValueError, match="route interception needs a port list"):
        render(graph(interception="route", ports=None))


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


def test_nft_refuses_route_mode():
    with pytest.raises(ValueError, match="not nft"):
        render_nft(graph(interception="route"), table="t")


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
