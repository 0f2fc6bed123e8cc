"""The proxies the project is measured against, in the lab's graph: nginx stream and minrelay.

pep-lab up --proxy-engine ENGINE builds the same lab with pepctl's proxy off (the graph's
namespace, its routes and each side's congestion control as ever: BBR toward the client, CUBIC
toward the origin), then, in that namespace, the same nft interception table pepctl writes in mode
nft (pepctl/render_nft.py: packets of flows a transparent socket owns are marked for local
delivery; other TCP to the intercepted ports is handed by tproxy to the listener on 50080) and the
same policy rule and local table, and the engine:
  - nginx: the proxy an operator might pick instead, Debian's libnginx-mod-stream, with one
    `server`: `proxy_bind $remote_addr transparent` (the origin sees the client's address, as with
    HAProxy's `usesrc clientip`) and `proxy_pass $server_addr:$server_port` (tproxy keeps the
    original destination as the accepted socket's local address), and `proxy_half_close on`, as a
    PEP must: nginx's default ends the session at the first FIN (`tests/netns/test_engines.py`).
    nginx 1.22 cannot make a stream listener transparent, and tproxy hands connections only to
    transparent listeners. nginx does take listening sockets over from its environment
    (NGINX="fd;", how its binary upgrade hands them on): `python3 -m netns.engines exec` opens the
    transparent listener, leaves it open across exec, and becomes nginx.
  - minrelay: the least a transparent split-TCP proxy does (minrelay/minrelay.c), the yardstick of
    what a proxy's own work costs on this kernel.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys

from pepctl import config as configmod
from pepctl.names import in_netns
from pepctl.plan import interception_lines
from pepctl.render_nft import render_nft
from pepctl.runner import Call, Step, daemon_step

ENGINES = ("nginx", "minrelay")
MODULE = "/usr/lib/nginx/modules/ngx_stream_module.so"
MINRELAY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "minrelay", "minrelay")
LISTEN_PORT = 50080
IP_TRANSPARENT = 19

CONF = """# nginx stream, transparent, in the lab's graph namespace (netns/engines.py).
load_module {module};
user root;                       # proxy_bind ... transparent needs CAP_NET_ADMIN in the workers
worker_processes {workers};
worker_rlimit_nofile 200000;
daemon off;
pid {run}/nginx-stream.nginx.pid;
error_log {run}/nginx-stream.err warn;
events {{ worker_connections 65536; }}
stream {{
    server {{
        listen 0.0.0.0:{port};   # inherited from the environment: transparent
        proxy_bind $remote_addr transparent;
        proxy_pass $server_addr:$server_port;
        proxy_half_close on;         # off (the default) ends both ways at the first FIN: the answer
                                     # to a client that half-closed after its request would be lost
        proxy_connect_timeout 5s;
    }}
}}
"""


def intercepting(g: configmod.Graph, ports: tuple) -> configmod.Graph:
    """The lab's graph as if pepctl intercepted with nft on ports for a listener on LISTEN_PORT."""
    return dataclasses.replace(g, proxy=dataclasses.replace(g.proxy, enabled=True, interception="nft",
                                                            ports=ports, listen_port=LISTEN_PORT))


def steps(engine: str, config_text: str, config: str, run_dir: str, workers: int,
          ports: tuple = ((80, 80),)) -> list[Step]:
    """After pepctl up with the proxy off: interception and the engine in the graph's namespace.
    config is where pepctl's config will be, config_text what it will say."""
    cfg = configmod.parse(config_text, config)
    g = intercepting(cfg.graphs[0], ports)
    ns = cfg.graph_names(cfg.graphs[0]).netns
    table = f"{engine}_{cfg.instance_names().instance}"
    nft = render_nft(g, table=table)
    return [
        Step(f"nft interception table {table} in {ns}", in_netns(ns, ["nft", "-f", "-"]), input=nft),
        Step(f"local delivery of intercepted packets in {ns}", ["ip", "-n", ns, "-batch", "-"],
             input="\n".join(interception_lines(g, 4)) + "\n"),
        Step(f"local delivery of intercepted packets in {ns} (IPv6)", ["ip", "-6", "-n", ns, "-batch", "-"],
             input="\n".join(interception_lines(g, 6)) + "\n"),
        *(nginx_steps if engine == "nginx" else minrelay_steps)(ns, run_dir, workers),
    ]


def nginx_steps(ns: str, run_dir: str, workers: int) -> list[Step]:
    conf = os.path.join(run_dir, "nginx-stream.conf")
    text = CONF.format(module=MODULE, workers=workers, run=run_dir, port=LISTEN_PORT)
    argv = in_netns(ns, [sys.executable, "-m", "netns.engines", "exec", conf])

    def ready() -> bool:   # nginx writes its pid once its workers run
        return os.path.exists(os.path.join(run_dir, "nginx-stream.nginx.pid"))

    return [
        Step("write nginx stream config", Call("write", (conf, text), conf)),
        daemon_step(f"start nginx stream in {ns}", argv, os.path.join(run_dir, "nginx-stream.pid"),
                    os.path.join(run_dir, "nginx-stream.out"), ready),
    ]


def listening(ns: str) -> str:
    """What listens on LISTEN_PORT in ns (`ss -p` lines: the owner's name is in them), or ""."""
    probe = in_netns(ns, ["ss", "-Htlnp", f"sport = :{LISTEN_PORT}"])
    return subprocess.run(probe, capture_output=True, text=True).stdout.strip()


def minrelay_steps(ns: str, run_dir: str, workers: int) -> list[Step]:
    def ready() -> bool:
        return "minrelay" in listening(ns)

    return [daemon_step(f"start minrelay in {ns}", in_netns(ns, [MINRELAY, str(LISTEN_PORT), str(workers)]),
                        os.path.join(run_dir, "minrelay.pid"), os.path.join(run_dir, "minrelay.out"), ready)]


def exec_nginx(conf: str) -> None:
    """Open the transparent listener, keep it open across exec, and become nginx with it."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_IP, IP_TRANSPARENT, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", LISTEN_PORT))
    s.listen(65535)
    s.set_inheritable(True)
    env = {**os.environ, "NGINX": f"{s.fileno()};"}
    os.execvpe("nginx", ["nginx", "-c", conf], env)


if __name__ == "__main__":
    if sys.argv[1:2] != ["exec"] or len(sys.argv) != 3:
        sys.exit("usage: python3 -m netns.engines exec NGINX.CONF")
    exec_nginx(sys.argv[2])
