"""The HAProxy 2.6 config of an instance: one process for every graph, in the host's namespace.

Each graph gets a frontend and a backend of its own (`graph_NAME`): its own maxconn, its own
stats, its own log setting. `namespace NS` on the binds and on the server makes HAProxy open
those sockets inside the graph's namespace (setns around socket(), which is why HAProxy needs
CAP_SYS_ADMIN), so one process and one set of threads serve every graph; a graph costs a few
config lines, not a process.

How the original destination is reached (HAProxy 2.6 manual, "server" and "source"): a server
address of 0.0.0.0 means "the address the client connected to", and no port means "the port it
connected to": with transparent interception that is the original destination. The family is
the client's, so one `server origin 0.0.0.0` serves IPv4 and IPv6. `source 0.0.0.0 usesrc
client` binds the outgoing socket to the client's address and port with IP_TRANSPARENT
(CAP_NET_ADMIN), so the origin sees the subscriber's own 4-tuple (source_port = "kept", the
default; `usesrc clientip` with "any": its address and a spare port). Checked end to end: the
origin's log shows the client's IPv4 and IPv6 addresses and ports.

Each thread has listening sockets of its own (`bind ... thread N`, one per thread for each address
and port, SO_REUSEPORT): the kernel spreads new connections over them by their 4-tuple, whether
they come by bpf_skc_lookup_tcp, nft tproxy or a route, and each is accepted and served by the
thread that owns its socket. One socket shared by every thread wakes them all for each connection,
and one thread accepts what another may serve: sequential new connections reached their first
byte in 250 us against 190 us with a socket per thread (2 threads, bench proxy's lab, curl).

HAProxy runs in the foreground (`-db`, one process, no master): its supervisor
(haproxy/supervise.py) starts it, restarts it, and reloads it seamlessly with `-x SOCK -sf
PID`: the new process takes the listening sockets over the stats socket (`expose-fd
listeners`), the old one finishes its connections.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_THREADS = 64           # HAProxy 2.6 on Debian: MAX_THREADS=64 (`haproxy -vv`)
STATS_ENV = "PEP_STATS_SOCK"   # the stats socket's path, set by the supervisor for each process

# A transparent proxy should not be less patient than the path it replaces:
# idle subscriber connections (push channels, SSH) live for long.
TIMEOUTS = (
    ("connect", "10s"),     # the kernel retries SYNs within this
    ("client", "1h"),
    ("server", "1h"),
    ("client-fin", "30s"),  # half-closed connections
    ("server-fin", "30s"),
)
SPLICE = {
    "both": ["option splice-request", "option splice-response"],
    "auto": ["option splice-auto"],
    "off": [],
}


@dataclass(frozen=True)
class GraphProxy:
    """What HAProxy needs to know of one graph."""
    name: str                # HAProxy's frontend and backend name
    netns: str               # the graph's namespace
    ports: tuple[str, ...]   # listening ports ("50080", or "80", "8000-8080" in route mode)
    mode: str                # "tcp" | "http"
    splice: str              # "both" | "auto" | "off"
    maxconn: int
    log_connections: bool
    keep_port: bool = True   # connect from the client's own port (usesrc client), else any free one


@dataclass(frozen=True)
class Process:
    """What HAProxy needs to know of the process as a whole."""
    title: str               # who wrote it, in the first comment line
    cpus: tuple[int, ...]    # thread i is pinned to cpus[i]
    maxconn: int


def render(proc: Process, graphs: list[GraphProxy]) -> str:
    if not 1 <= len(proc.cpus) <= MAX_THREADS:
        raise ValueError(f"haproxy render: need 1-{MAX_THREADS} CPUs for as many threads, got {len(proc.cpus)}")
    if proc.maxconn < 1:
        raise ValueError(f"haproxy render: maxconn must be positive, got {proc.maxconn}")
    logs = any(g.log_connections for g in graphs)
    out = [
        f"# HAProxy config of {proc.title}, written by pepctl: do not edit,",
        "# change the pepctl config and run `pepctl reload`.",
        "",
        "global",
        f"    nbthread {len(proc.cpus)}",
        # One line per thread: "cpu-map auto:" would sort the CPUs, and the order is the caller's.
        *(f"    cpu-map 1/{i} {cpu}" for i, cpu in enumerate(proc.cpus, 1)),
        f"    maxconn {proc.maxconn}",
        # Each process binds a stats socket of its own, named by its supervisor in the environment
        # (haproxy/supervise.py): a reloaded HAProxy (-x) takes the listening sockets over the old
        # one's (expose-fd listeners), and the supervisor still reaches the old one to drain it.
        f'    stats socket "${{{STATS_ENV}}}" mode 660 level admin expose-fd listeners',
        f"    log stdout format raw local0 {'info' if logs else 'notice'}",
        "",
        "defaults",
        "    log global",
        # A refused connection to the origin will be refused again: fail fast, as without a proxy.
        "    retries 0",
        *(f"    timeout {name} {value}" for name, value in TIMEOUTS),
        # Upgraded connections (WebSocket) in HTTP mode become tunnels: as patient as plain TCP.
        "    timeout tunnel 1h",
    ]
    for g in graphs:
        out += _graph(g, len(proc.cpus))
    # No Prometheus frontend: pepctl's exporter serves the proxy's figures with the datapath's,
    # from this process's stats socket (pepctl/exporter.py).
    return "\n".join(out) + "\n"


def _graph(g: GraphProxy, threads: int) -> list[str]:
    ns = f"namespace {g.netns}"
    out = ["", f"frontend {g.name}", f"    mode {g.mode}", f"    maxconn {g.maxconn}"]
    out.append(f"    option {'httplog' if g.mode == 'http' else 'tcplog'}" if g.log_connections else "    no log")
    owners = [f" thread {t}" for t in range(1, threads + 1)] if threads > 1 else [""]
    for port in g.ports:
        for address in (f"0.0.0.0:{port} transparent", f"[::]:{port} transparent v6only"):
            out += [f"    bind {address} {ns}{owner}" for owner in owners]
    out += [*(f"    {o}" for o in SPLICE[g.splice]), f"    default_backend {g.name}"]
    out += ["", f"backend {g.name}", f"    mode {g.mode}"]
    if g.mode == "http":
        # One server connection per client connection, as without a proxy: never hand a request
        # to a connection opened for another client flow.
        out.append("    http-reuse never")
    out += [
        *(f"    {o}" for o in SPLICE[g.splice]),
        # Connect from the client's address to the original destination: 0.0.0.0 = the address the
        # client connected to; no port = the port it connected to. From the client's own port
        # (usesrc client), so the origin sees the client's 4-tuple and the datapath finds a flow's
        # two sockets by it; when that port is still taken on this side the datapath ends what holds
        # it, or bypasses the flow, before HAProxy could fail (tc/pep_flow.h, step 3c). Else a spare
        # port (clientip).
        f"    source 0.0.0.0 usesrc {'client' if g.keep_port else 'clientip'}",
        f"    server origin 0.0.0.0 {ns}",
    ]
    return out
