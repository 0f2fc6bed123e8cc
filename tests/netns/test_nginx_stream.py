"""bench proxy's nginx-stream variant is what it claims: nginx, transparent both ways, in the graph.

   client 198.18.0.10 -- switch == proxyhost [pepctl up, proxy off] == pep: nft tproxy :50080 -> nginx
   stream (proxy_bind $remote_addr transparent) -- origin nginx 198.19.0.10

How right is told from wrong: while a 10 MB download runs through it, the graph's namespace holds
an established socket of the client's connection (origin:80 <- client) owned by nginx and one toward
the origin from the client's address (transparent); the origin's access log names the client's own
address; the nft table's interception counter counted it.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket

import pytest

from netns.handle import LabHandle, wait_until
from pepctl import nsutil


@pytest.fixture(scope="module")
def lab():
    if not os.path.exists("/usr/lib/nginx/modules/ngx_stream_module.so"):
        pytest.skip("nginx's stream module (Debian libnginx-mod-stream) is not installed: scripts/setup installs it")
    with LabHandle.up(f"t{os.urandom(3).hex()}", ["--proxy-engine", "nginx", "--ports", "80"]) as handle:
        yield handle


def test_nginx_stream_proxies_transparently_both_ways(lab):
    download = lab.popen("client", "curl", "-s", "--limit-rate", "2M", "-o", "/dev/null", "-w", "%{http_code}",
                         "http://198.19.0.10/10m?nginx-stream")
    try:
        def both_sockets():
            dump = nsutil.in_netns(lab.netns("pep"), lambda: list(nsutil.sock_diag(socket.AF_INET,
                                                                                    1 << nsutil.TCP_ESTABLISHED)))
            socks = [(str(ipaddress.IPv4Address(src[:4])), sport, str(ipaddress.IPv4Address(dst[:4])), dport)
                     for (sport, dport, src, dst, _, _), _ in dump]
            client_side = [s for s in socks if s[:2] == ("198.19.0.10", 80) and s[2] == "198.18.0.10"]
            origin_side = [s for s in socks if s[0] == "198.18.0.10" and s[2:] == ("198.19.0.10", 80)]
            return (client_side, origin_side) if client_side and origin_side else None
        client_side, origin_side = wait_until(both_sockets, timeout=5, what="nginx's two sockets of the download")
        assert lab.origin_peer("nginx-stream") == "198.18.0.10", "the origin did not see the client's own address"
        ss = lab.run("pep", "ss", "-Htnp", "state", "established", "sport", "=", ":80").stdout
        assert '"nginx"' in ss and "haproxy" not in ss, f"pep namespace: the client's connection is not nginx's: {ss}"
        counters = json.loads(lab.run("pep", "nft", "-j", "list", "counters").stdout)["nftables"]
        intercepted = [c["counter"]["packets"] for c in counters
                       if "counter" in c and c["counter"]["name"] == "intercepted_v4"]
        assert intercepted and intercepted[0] > 0, f"pep namespace: nft intercepted nothing: {counters}"
    finally:
        download.kill()
        download.wait()
