"""bench proxy's nginx-stream and minrelay variants are what they claim: that proxy, transparent
both ways, in the graph (netns/engines.py).

   client 198.18.0.10 -- switch == proxyhost [pepctl up, proxy off] == pep: nft tproxy :50080 -> nginx
   stream (proxy_bind $remote_addr transparent) or minrelay -- origin nginx 198.19.0.10

How right is told from wrong: while a 10 MB download runs through it, the graph's namespace holds
an established socket of the client's connection (origin:80 <- client) owned by the engine and one
toward the origin from the client's address (transparent); the origin's access log names the
client's own address; the nft table's interception counter counted it. minrelay is the project's
own code, so it is also held to what a relay must do: every byte through unchanged, and a client's
half-close passed on (the answer still comes back).
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import socket

import pytest

from netns.addresses import CLIENT4, ORIGIN4, ORIGIN_URL4
from netns.engines import ENGINES, MINRELAY, MODULE
from netns.handle import LabHandle
from pepctl import nsutil
from pepctl.runner import wait_for


@pytest.fixture(scope="module", params=ENGINES)
def lab(request):
    if request.param == "nginx" and not os.path.exists(MODULE):
        pytest.skip("nginx's stream module (Debian libnginx-mod-stream) is not installed: scripts/setup installs it")
    if request.param == "minrelay" and not os.path.exists(MINRELAY):
        pytest.skip(f"{MINRELAY} is not built: make build (scripts/setup runs it)")
    with LabHandle.up(f"t{os.urandom(3).hex()}", ["--proxy-engine", request.param, "--ports", "80"]) as handle:
        handle.engine = request.param
        yield handle


def test_engine_proxies_transparently_both_ways(lab):
    tag = f"engine-{lab.engine}"
    download = lab.popen("client", "curl", "-s", "--limit-rate", "2M", "-o", "/dev/null", "-w", "%{http_code}",
                         f"{ORIGIN_URL4}/10m?{tag}")
    try:
        def both_sockets():
            dump = nsutil.in_netns(lab.netns("pep"), lambda: list(nsutil.sock_diag(socket.AF_INET,
                                                                                    1 << nsutil.TCP_ESTABLISHED)))
            socks = [(str(ipaddress.IPv4Address(src[:4])), sport, str(ipaddress.IPv4Address(dst[:4])), dport)
                     for (sport, dport, src, dst, _, _), _ in dump]
            client_side = [s for s in socks if s[:2] == (ORIGIN4, 80) and s[2] == CLIENT4]
            origin_side = [s for s in socks if s[0] == CLIENT4 and s[2:] == (ORIGIN4, 80)]
            return (client_side, origin_side) if client_side and origin_side else None
        client_side, origin_side = wait_for(both_sockets, timeout=5,
                                            what=f"{lab.engine}'s two sockets of the download")
        # Whose sockets, while the download surely runs: the origin logs the request only once it
        # has sent the whole answer, and the download may end soon after (CI: ss found none).
        ss = lab.run("pep", "ss", "-Htnp", "state", "established", "sport", "=", ":80").stdout
        assert f'"{lab.engine}"' in ss and "haproxy" not in ss, \
            f"pep namespace: the client's connection is not {lab.engine}'s: {ss}"
        assert lab.origin_peer(tag) == CLIENT4, "the origin did not see the client's own address"
        assert intercepted(lab) > 0, "pep namespace: nft intercepted nothing"
    finally:
        download.kill()
        download.wait()


def intercepted(lab) -> int:
    """SYNs the graph's nft table handed to the engine's listener."""
    counters = json.loads(lab.run("pep", "nft", "-j", "list", "counters").stdout)["nftables"]
    found = [c["counter"]["packets"] for c in counters if "counter" in c and c["counter"]["name"] == "intercepted_v4"]
    assert found, f"pep namespace: no counter intercepted_v4 in {counters}"
    return found[0]


def test_engine_relays_every_byte_and_a_half_close(lab):
    with open(os.path.join(lab.run_dir, "www", "1m"), "rb") as f:
        expected = hashlib.sha256(f.read()).hexdigest()
    got = lab.run("client", "sh", "-c", f"curl -s {ORIGIN_URL4}/1m | sha256sum").stdout.split()[0]
    assert got == expected, f"client: 1 MB object through {lab.engine}: expected sha256 {expected}, got {got}"
    # A server that answers only once the client has finished sending (its FIN), with the sha256 of
    # what it got, on a second origin address: the answer comes back only if the engine passed the
    # client's half-close on, and it is right only if every byte of the upload went through.
    lab.run("origin", "ip", "addr", "add", "198.19.0.11/32", "dev", "eth0")
    server = lab.popen("origin", "python3", "-c", (
        "import hashlib, socket; l = socket.create_server(('198.19.0.11', 80)); c, _ = l.accept()\n"
        "h = hashlib.sha256()\n"
        "while (b := c.recv(65536)): h.update(b)\n"
        "c.sendall(h.hexdigest().encode()); c.close()"))
    try:
        wait_for(lambda: "198.19.0.11:80" in lab.run("origin", "ss", "-Htln").stdout, timeout=5,
                 what="origin: the half-close server listening")
        before = intercepted(lab)
        upload = os.urandom(300_000)
        got = lab.run("client", "python3", "-c", (
            "import socket, sys; s = socket.create_connection(('198.19.0.11', 80), timeout=5)\n"
            "s.sendall(sys.stdin.buffer.read()); s.shutdown(socket.SHUT_WR); b = b''\n"
            "while (c := s.recv(100)): b += c\n"   # to the server's FIN
            "print(b.decode())"), input=upload, text=False, timeout=10).stdout.decode().strip()
        want = hashlib.sha256(upload).hexdigest()
        assert got == want, f"client: the server's sha256 of a 300 KB upload after a half-close: expected {want}, " \
                            f"got {got!r}"
        assert intercepted(lab) > before, f"pep namespace: the upload's connection did not go through {lab.engine}"
    finally:
        server.kill()
        server.wait()
