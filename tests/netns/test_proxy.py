"""The transparent proxy in the lab: split TCP, BBR to clients, CUBIC to origin.

   client 198.18.0.10 -- switch == nic0 [proxyhost] == c_in [pep: nft TPROXY -> HAProxy] s_in == ... -- origin nginx

How right is told from wrong: the origin's access log names the peer of each
request it served; through a transparent proxy that must be the client's own
address. HAProxy's stats socket counts the sessions it carried, so a request
that went through it moves `stot`, and one that was only routed (ping, UDP,
TCP to a port not intercepted) does not. `ss -tin` inside the pep namespace
shows each socket's congestion control.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import threading
import time

import pytest

from netns.handle import PEP_LAB, PYTHON, wait_until

LAB_OPTIONS: list[str] = []   # the default lab: proxy on, nft interception of port 80


def sessions(lab) -> int:
    return lab.status()["pepctl"]["graphs"][0]["proxy"]["sessions_total"]


@pytest.mark.parametrize("url,client", [("http://198.19.0.10/", "198.18.0.10"),
                                        ("http://[2001:2:0:2::10]/", "2001:2:0:1::10")])
def test_origin_sees_client_address_and_haproxy_counts_it(lab, url, client):
    before = sessions(lab)
    tag = f"t{secrets.token_hex(4)}"
    body = lab.run("client", "curl", "-s", "-m", "5", f"{url}?{tag}").stdout
    assert "PEP lab origin" in body, f"client: curl {url}: {body[:200]!r}"
    peer = lab.origin_peer(tag)
    assert peer == client, f"origin log: expected peer {client}, got {peer}"
    after = wait_until(lambda: sessions(lab) > before and sessions(lab), timeout=3, what="HAProxy stot")
    assert after == before + 1, f"HAProxy sessions_total: expected {before + 1}, got {after}"


def _ss_sockets(lab) -> list[tuple[str, str, str]]:
    """(local, peer, info line) for every established TCP socket in the pep namespace."""
    out = lab.run("pep", "ss", "-tinH", "state", "established").stdout.splitlines()
    found = []
    for head, info in zip(out[::2], out[1::2], strict=False):
        cols = head.split()
        found.append((cols[-2], cols[-1], info))
    return found


def test_bbr_toward_client_and_cubic_toward_origin(lab):
    download = lab.popen("client", "curl", "-s", "-o", "/dev/null", "--limit-rate", "5M", "-m", "8",
                         "http://198.19.0.10/50m")
    try:
        def both_sockets():
            socks = _ss_sockets(lab)
            to_client = [i for local, peer, i in socks if peer.startswith("198.18.0.10:")]
            to_origin = [i for local, peer, i in socks if peer == "198.19.0.10:80"]
            return (to_client, to_origin) if to_client and to_origin else None
        to_client, to_origin = wait_until(both_sockets, timeout=5, what="both halves of the split flow in ss")
        assert re.search(r"\bbbr\b", to_client[0]), f"pep: client-facing socket: expected bbr: {to_client[0]}"
        assert re.search(r"\bcubic\b", to_origin[0]), f"pep: origin-facing socket: expected cubic: {to_origin[0]}"
    finally:
        download.kill()
        download.wait()


def test_side_routes_carry_congctl_and_initial_window(lab):
    """Both are route metrics: every accepted (client-facing) or connecting (origin-facing)
    socket takes the metrics of its route. Defaults: bbr and 32 segments toward the
    subscribers; cubic and the kernel's initial window toward the origin."""
    want = {"198.18.0.0/24": {"congestion": "bbr", "initcwnd": 32},
            "2001:2:0:1::/64": {"congestion": "bbr", "initcwnd": 32},
            "198.19.0.0/24": {"congestion": "cubic"}, "2001:2:0:2::/64": {"congestion": "cubic"}}
    got = {}
    for fam in ("-4", "-6"):
        for route in json.loads(lab.run("pep", "ip", "-j", fam, "route", "show").stdout):
            if route["dst"] in want:
                got[route["dst"]] = {k: v for m in route.get("metrics", []) for k, v in m.items()}
    assert got == want, f"pep namespace: route metrics per prefix: expected {want}, got {got}"


def test_ping_and_udp_are_routed_not_proxied(lab):
    before = sessions(lab)
    for dst in ("198.19.0.10", "2001:2:0:2::10"):
        lab.run("client", "ping", "-c", "2", "-i", "0.1", "-W", "2", dst)
    echo = ("import socket;s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);s.bind(('0.0.0.0',80));"
            "print('ready',flush=True);s.settimeout(5);d,a=s.recvfrom(2048);s.sendto(d.upper(),a)")
    server = lab.popen("origin", PYTHON, "-c", echo)
    assert server.stdout.readline().strip() == "ready"
    ask = ("import socket;s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);s.settimeout(3);"
           "s.sendto(b'udp to port 80',('198.19.0.10',80));print(s.recv(2048).decode())")
    assert lab.run("client", PYTHON, "-c", ask).stdout.strip() == "UDP TO PORT 80"
    server.wait(timeout=5)
    assert sessions(lab) == before, "HAProxy counted a session for ping/UDP"


def test_tcp_port_not_intercepted_is_routed(lab):
    before = sessions(lab)
    srv = ("import socket;s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);"
           "s.bind(('0.0.0.0',8081));s.listen();print('ready',flush=True);s.settimeout(5);c,a=s.accept();"
           "c.sendall(a[0].encode());c.close()")
    server = lab.popen("origin", PYTHON, "-c", srv)
    assert server.stdout.readline().strip() == "ready"
    got = lab.run("client", PYTHON, "-c", "import socket;c=socket.create_connection(('198.19.0.10',8081),3);"
                  "print(c.recv(100).decode())").stdout.strip()
    server.wait(timeout=5)
    assert got == "198.18.0.10", f"origin saw {got!r} on port 8081"
    assert sessions(lab) == before, "HAProxy counted a session for a port it does not intercept"


def test_pepctl_up_twice_changes_nothing(lab):
    proc = lab.pepctl("up")
    assert "nothing changed" in proc.stdout, proc.stdout


def test_reload_during_load_loses_no_transaction(lab):
    conf = os.path.join(lab.run_dir, "pep.toml")
    with open(conf) as f:
        original = f.read()
    results = {}

    def load():
        results["wrk"] = lab.run("client", "wrk", "-t1", "-c8", "-d4s", "-H", "Connection: close",
                                 "http://198.19.0.10/1k", timeout=30).stdout
    t = threading.Thread(target=load)
    t.start()
    try:
        time.sleep(1.0)
        for splice in ("auto", "off", "both"):
            with open(conf, "w") as f:
                f.write(re.sub(r'splice = "\w+"', f'splice = "{splice}"', original))
            proc = lab.pepctl("reload")
            assert "reloaded" in proc.stdout
            time.sleep(0.5)
    finally:
        t.join()
        with open(conf, "w") as f:
            f.write(original)
        lab.pepctl("reload")
    out = results["wrk"]
    done = int(re.search(r"(\d+) requests in", out).group(1))
    assert done > 100, f"wrk made only {done} requests: {out}"
    assert "Socket errors" not in out and "Non-2xx" not in out, f"transactions lost during reload:\n{out}"


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
    assert "PEP lab origin" in lab.run("client", "curl", "-s", "-m", "5", "http://198.19.0.10/").stdout


def test_client_reusing_its_port_is_not_delayed_by_time_wait(lab):
    """A client reusing a source port whose previous connection sits in TIME_WAIT in the proxy
    namespace: its new SYN must reach HAProxy's listener at once (tproxy), not the TIME_WAIT socket,
    which would answer with a stale ACK and make the client retransmit its SYN."""
    def syn_retransmits() -> int:
        out = lab.run("client", "nstat", "-az", "TcpExtTCPSynRetrans").stdout
        return int(re.search(r"TcpExtTCPSynRetrans\s+(\d+)", out).group(1))
    # Read to EOF before closing: the proxy closes first, so TIME_WAIT is on its side, not ours.
    get = ("import socket;s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);"
           "s.bind(('198.18.0.10',40999));s.settimeout(5);s.connect(('198.19.0.10',80));"
           "s.sendall(b'GET / HTTP/1.1\\r\\nHost: o\\r\\nConnection: close\\r\\n\\r\\n');d=b''\n"
           "while (c:=s.recv(65536)): d+=c\nprint(d.decode().split('\\r\\n')[0])")
    before = syn_retransmits()
    for _ in range(4):
        status = lab.run("client", PYTHON, "-c", get).stdout.strip()
        assert status == "HTTP/1.1 200 OK", f"client: GET from port 40999: {status!r}"
    tw = lab.run("pep", "ss", "-Htan", "state", "time-wait", "sport = :80", "dport = :40999").stdout
    assert tw.strip(), "pep: no TIME_WAIT socket for port 40999: the test did not set up the case"
    assert syn_retransmits() == before, "client: SYNs were retransmitted: a SYN hit a TIME_WAIT socket"


def test_prometheus_exporter_counts_sessions(lab):
    lab.run("client", "curl", "-s", "-m", "5", "-o", "/dev/null", "http://198.19.0.10/")
    text = lab.run("pep", "curl", "-s", "-m", "5", "http://127.0.0.1:9101/metrics").stdout
    m = re.search(r'^haproxy_frontend_sessions_total\{proxy="intercept"\} (\d+)', text, re.M)
    assert m and int(m.group(1)) >= 1, f"pep: /metrics has no intercept sessions: {text[:300]!r}"


def test_lab_status_is_up(lab):
    proc = subprocess.run([PEP_LAB, "status"], env=lab.env, capture_output=True, text=True)
    assert proc.returncode == 0 and "up" in proc.stdout and "haproxy pid" in proc.stdout, proc.stdout
