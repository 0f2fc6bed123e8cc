"""One graph's HAProxy 2.6 config: a transparent TCP (or HTTP) relay to the original destination.

HAProxy runs inside the graph's namespace as `haproxy -W -f FILE` (master-worker,
foreground, logs on stdout) and reloads seamlessly on SIGUSR2 to the master.

How the original destination is reached (HAProxy 2.6 configuration manual, "server"
and "source"): a server address of 0.0.0.0 means "the address the client connected
to", and a server without a port means "the port the client connected to" (the
manual's set-dst section writes the same as 0.0.0.0:0). With tproxy that is the
original destination, not the listen port. The family is taken from the client's
connection, so one `server origin 0.0.0.0` serves IPv4 and IPv6 clients alike.
`source 0.0.0.0 usesrc clientip` binds the outgoing socket to the client's address
(a spare port) with IP_TRANSPARENT; Linux accepts that option on IPv6 sockets too
(SOL_IP options fall through to the IPv4 code), so IPv6 needs nothing extra either.
Both were checked end to end in namespaces: the origin saw the client's IPv4 and
IPv6 addresses, on its own port, with HAProxy listening on listen_port.
"""

from __future__ import annotations

from .config import Graph

MAX_THREADS = 64           # HAProxy 2.6 on Debian: MAX_THREADS=64 (`haproxy -vv`)
UNIX_PATH_MAX = 107        # sun_path is 108 bytes with its NUL

# A transparent proxy should not be less patient than the path it replaces:
# idle subscriber connections (push channels, SSH) live for long.
TIMEOUTS = (
    ("connect", "10s"),     # the kernel retries SYNs within this
    ("client", "1h"),
    ("server", "1h"),
    ("client-fin", "30s"),  # half-closed connections
    ("server-fin", "30s"),
)


def _ports(lo: int, hi: int) -> str:
    return str(lo) if lo == hi else f"{lo}-{hi}"


def render_haproxy(graph: Graph, *, instance: str, graph_dir: str, cpus: list[int], maxconn: int) -> str:
    """The config text for graph; thread i is pinned to cpus[i]; graph_dir holds haproxy.sock."""
    p = graph.proxy
    if not 1 <= len(cpus) <= MAX_THREADS:
        raise ValueError(f"render_haproxy: need 1-{MAX_THREADS} CPUs for as many threads, got {len(cpus)}")
    if maxconn < 1:
        raise ValueError(f"render_haproxy: maxconn must be positive, got {maxconn}")
    sock = f"{graph_dir.rstrip('/')}/haproxy.sock"
    if len(sock.encode()) > UNIX_PATH_MAX:
        raise ValueError(f"render_haproxy: stats socket path {sock} is longer than {UNIX_PATH_MAX} bytes; "
                         "use a shorter run_dir")
    if p.interception == "route" and p.ports is None:
        raise ValueError("render_haproxy: route interception needs a port list")

    out = [
        f"# HAProxy config of graph {graph.name} (instance {instance}), written by pepctl: do not edit,",
        "# change the pepctl config and run `pepctl reload`.",
        "",
        "global",
        f"    nbthread {len(cpus)}",
        # One line per thread: "cpu-map auto:" would sort the CPUs, and the order is the caller's.
        *(f"    cpu-map 1/{i} {cpu}" for i, cpu in enumerate(cpus, 1)),
        f"    maxconn {maxconn}",
        # expose-fd listeners: another HAProxy started by hand with -x can take over the sockets.
        # (The master passes them to new workers on reload by itself.)
        f"    stats socket {sock} mode 600 level admin expose-fd listeners",
        f"    log stdout format raw local0 {'info' if p.log_connections else 'notice'}",
        "",
        "defaults",
        f"    mode {p.mode}",
        "    log global",
        # A refused connection to the origin will be refused again: fail fast, as without a proxy.
        "    retries 0",
        *(f"    timeout {name} {value}" for name, value in TIMEOUTS),
    ]
    if p.mode == "http":
        # Upgraded connections (WebSocket) become tunnels: same patience as plain TCP.
        out.append("    timeout tunnel 1h")
    out += {
        "both": ["    option splice-request", "    option splice-response"],
        "auto": ["    option splice-auto"],
        "off": [],
    }[p.splice]

    out += ["", "frontend intercept"]
    if p.log_connections:
        out.append(f"    option {'httplog' if p.mode == 'http' else 'tcplog'}")
    if p.interception == "nft":
        # tproxy hands every intercepted flow to this one port, any destination address.
        ports = [str(p.listen_port)]
    else:
        # Policy routing delivers the intercepted ports locally: listen on each of them.
        ports = [_ports(lo, hi) for lo, hi in p.ports or ()]
    for port in ports:
        out.append(f"    bind 0.0.0.0:{port} transparent")
        out.append(f"    bind [::]:{port} transparent v6only")
    out.append("    default_backend origin")

    out += ["", "backend origin"]
    if p.mode == "http":
        # Keep one server connection per client connection, as without a proxy: never hand a
        # request to a connection opened for another client flow.
        out.append("    http-reuse never")
    out += [
        # Connect from the client's address (a spare port) to the original destination:
        # 0.0.0.0 = the address the client connected to; no port = the port it connected to.
        "    source 0.0.0.0 usesrc clientip",
        "    server origin 0.0.0.0",
    ]

    if p.metrics_port:
        out += [
            "",
            "frontend metrics",
            "    mode http",
            "    no log",
            f"    bind 127.0.0.1:{p.metrics_port}",
            "    http-request use-service prometheus-exporter if { path /metrics }",
            "    http-request return status 404 content-type text/plain string \"try /metrics\\n\"",
        ]
    return "\n".join(out) + "\n"
