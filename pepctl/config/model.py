"""The config's model: what `parse` returns, frozen, and the errors it raises.

[routing]'s dataclasses (Routing, Member, Peer) live beside the functions that use them, in
pepctl/routing.py, which imports nothing of pepctl's: this package can import it, and it needs
nothing from here.
"""

from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import dataclass
from typing import Any

from .. import names
from ..routing import Routing

Iface = ipaddress.IPv4Interface | ipaddress.IPv6Interface
Net = ipaddress.IPv4Network | ipaddress.IPv6Network
Addr = ipaddress.IPv4Address | ipaddress.IPv6Address
ONE_LISTENER = ("bpf", "nft")   # interception modes with a single listener: Proxy.one_listener


@dataclass(frozen=True)
class Side:
    vlan: int
    addresses: tuple[Iface, ...]
    prefixes: tuple[Net, ...]
    gateways: tuple[Addr, ...]
    congestion: str                           # the routes' congctl: every connection on this side runs it
    initcwnd: int                             # initial congestion window (segments); 0 = the kernel's (10)
    queue_target_ms: int = 0                  # pep_radio's queueing delay target; 0 when not pep_radio


@dataclass(frozen=True)
class Proxy:
    enabled: bool
    interception: str                         # "bpf" | "nft" | "route"
    ports: tuple[tuple[int, int], ...] | None  # sorted, disjoint inclusive ranges; None = all (bpf, nft)
    listen_port: int                          # bpf, nft: the port of the one listener new flows go to
    splice: str                               # "both" | "auto" | "off"
    mode: str                                 # "tcp" | "http"
    maxconn: int                              # 0 = the host's maxconn (no limit of its own)
    log_connections: bool
    source_port: str = "kept"                 # "kept" | "any": the proxy connects from the client's port
    mptcp: str = "bypass"                     # "bypass" | "proxy": a subscriber's MPTCP SYN
    handshake: str = "honest"                 # "honest" | "early": who answers a new flow's SYN first

    @property
    def one_listener(self) -> bool:
        """bpf and nft hand every intercepted flow, any port, to one listener on listen_port, and mark
        the packets of the proxy's flows; route listens on each intercepted port."""
        return self.interception in ONE_LISTENER

    @property
    def bound_ports(self) -> int:
        """How many ports HAProxy binds for this graph: listen_port alone, or in route each
        intercepted port (HAProxy binds a range as a socket per port)."""
        return 1 if self.one_listener else sum(hi - lo + 1 for lo, hi in self.ports or ())


@dataclass(frozen=True)
class Bypass:
    """Flows that skip the proxy: forwarded at L3 by tc, decided on each flow's first SYN."""
    clients: tuple[Net, ...] = ()               # subscribers' (access side) addresses
    servers: tuple[Net, ...] = ()               # origin-side addresses
    ports: tuple[tuple[int, int], ...] = ()     # the port a SYN is addressed to


@dataclass(frozen=True)
class Experiment:
    """The control group (pepctl/experiment.py): a stable, hash-chosen share of subscribers whose
    flows are bypassed, and the measurement of both groups' flows."""
    control_fraction: float = 0.0               # 0: no experiment
    seed: int = 0                               # another seed draws another share of subscribers

    @property
    def on(self) -> bool:
        return self.control_fraction > 0


@dataclass(frozen=True)
class Graph:
    name: str
    index: int          # 0-based position among the [[graph]] tables, as in graph[i] error paths
    access: Side
    origin: Side
    proxy: Proxy
    bypass: Bypass = Bypass()
    experiment: Experiment = Experiment()


@dataclass(frozen=True)
class Tuning:
    irq_affinity: bool
    rss_symmetric: bool
    sysctls: bool


@dataclass(frozen=True)
class Host:
    instance: str
    nic: str
    run_dir: str
    bpf_dir: str
    tuning: Tuning
    supervisor: str        # "auto" | "systemd" | "pepctl": what restarts the supervisor
    threads: int           # HAProxy threads; 0 = one per CPU of the NIC's NUMA node
    maxconn: int           # HAProxy's connections, all graphs; 0 = sized from the open-file limit
    metrics_address: str   # the Prometheus exporter's address, in the host's namespace
    metrics_port: int      # 0 = no exporter


@dataclass(frozen=True)
class Config:
    path: str
    host: Host
    graphs: tuple[Graph, ...]
    routing: Routing | None = None      # several hosts behind routers (pepctl/routing.py); None: one host
    notices: tuple[str, ...] = ()       # what the config should change but still works (deprecated keys)

    def instance_names(self) -> names.InstanceNames:
        return names.instance_names(self.host.instance, self.host.run_dir, self.host.bpf_dir)

    def graph_names(self, g: Graph) -> names.GraphNames:
        return names.graph_names(self.host.instance, self.host.run_dir, g.name, g.index, g.access.vlan, g.origin.vlan)


@dataclass(frozen=True)
class FieldError:
    file: str
    field: str            # dotted path; "" for whole-file problems (syntax, unreadable)
    value: Any            # the offending value; None when the field is missing (TOML has no null)
    message: str          # what is wrong; what to do
    line: int | None = None

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        where = f"{where}: " if where else ""     # no file: a rule of the command line (config/rules.py)
        if not self.field:
            return f"{where}{self.message}"
        what = self.field if self.value is None else f"{self.field} = {toml_value(self.value)}"
        return f"{where}{what}: {self.message}"


class ConfigError(Exception):
    def __init__(self, errors: list[FieldError]):
        self.errors = list(errors)
        super().__init__("\n".join(str(e) for e in self.errors))


def toml_value(v: Any, depth: int = 0) -> str:
    """A value written back the way it looks in the file, so the user can find it. ASCII (json
    escapes the rest as \\uXXXX, as TOML does); nesting deeper than 8 is shown as "..."."""
    if depth > 8:
        return "..."
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(toml_value(x, depth + 1) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{key_text(k)} = {toml_value(x, depth + 1)}" for k, x in v.items()) + " }"
    return str(v)


def key_text(key: str) -> str:
    """A key as TOML writes it: bare when it can be, else quoted (and so ASCII)."""
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)
