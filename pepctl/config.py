"""pepctl's config file: parse the TOML, check everything, return frozen dataclasses.

Checking collects every problem before giving up, so one run of `pepctl plan`
shows all of them. Each problem is a FieldError naming the file, the line when
it can be found, the field as a dotted path with 0-based list indexes
(`graph[1].access.vlan`), the value, and what to do:

    /etc/pep/pep.toml:14: graph[1].access.vlan = 4095: not a usable VLAN id; use 1-4094

Every key and every string value is ASCII: a full-width "80" (U+FF18 U+FF10) or a no-break space
is refused, naming the character, even where int() or ipaddress would take it.
Address kinds that cannot work where they are written (multicast, link-local,
loopback, unspecified, IPv4-mapped, reserved, zone ids) are refused here too,
with the same rules for the bypass rules of the command line (pepctl/bypass.py).

What this module cannot know is left to `plan` (pepctl/checks.py): whether the
NIC exists, the open-file limit, the filesystems of run_dir and bpf_dir, other
instances, and (when the caller does not pass available_cc) which congestion
controls the kernel has. etc/pep.example.toml documents every key.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import re
import tomllib
import unicodedata
from dataclasses import dataclass
from typing import Any

from . import radio_maps
from .routing import Member, Peer, Routing

Iface = ipaddress.IPv4Interface | ipaddress.IPv6Interface
Net = ipaddress.IPv4Network | ipaddress.IPv6Network
Addr = ipaddress.IPv4Address | ipaddress.IPv6Address


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
    source_port: str = "any"                  # "kept" | "any": the proxy connects from the client's port
    mptcp: str = "bypass"                     # "bypass" | "proxy": a subscriber's MPTCP SYN
    handshake: str = "honest"                 # "honest" | "early": who answers a new flow's SYN first

    @property
    def one_listener(self) -> bool:
        """bpf and nft hand every intercepted flow, any port, to one listener on listen_port, and mark
        the packets of the proxy's flows; route listens on each intercepted port."""
        return self.interception in ONE_LISTENER


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


@dataclass(frozen=True)
class FieldError:
    file: str
    field: str            # dotted path; "" for whole-file problems (syntax, unreadable)
    value: Any            # the offending value; None when the field is missing (TOML has no null)
    message: str          # what is wrong; what to do
    line: int | None = None

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        if not self.field:
            return f"{where}: {self.message}"
        what = self.field if self.value is None else f"{self.field} = {toml_value(self.value)}"
        return f"{where}: {what}: {self.message}"


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
        return "{ " + ", ".join(f"{_key_text(k)} = {toml_value(x, depth + 1)}" for k, x in v.items()) + " }"
    return str(v)


def _key_text(key: str) -> str:
    """A key as TOML writes it: bare when it can be, else quoted (and so ASCII)."""
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


# --- the schema -------------------------------------------------------------------------------

TOP_KEYS = ("host", "defaults", "graph", "routing")
ROUTING_KEYS = ("graph", "asn", "router_id", "host", "hosts", "subscribers", "shares", "anchors", "peer", "bfd",
                "assign")
PEER_KEYS = ("side", "address", "asn")
MEMBER_KEYS = ("name", "access", "origin")
BFD_KEYS = ("interval_ms", "multiplier")
HOST_NAME_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")
SHARES_MAX = 256
HOST_KEYS = ("instance", "nic", "run_dir", "bpf_dir", "tuning", "supervisor", "threads", "maxconn",
             "metrics_address", "metrics_port")
HOST_DEFAULTS: dict[str, Any] = {
    "supervisor": "auto",
    "threads": 0,
    "maxconn": 0,
    "metrics_address": "127.0.0.1",
    "metrics_port": 9101,
}
# Keys that moved from [graph.proxy] to [host] when one HAProxy came to serve every graph.
MOVED_TO_HOST = ("threads", "metrics_port")
TUNING_KEYS = ("irq_affinity", "rss_symmetric", "sysctls")
DEFAULTS_KEYS = ("proxy",)
GRAPH_KEYS = ("name", "access", "origin", "proxy", "bypass", "experiment")
EXPERIMENT_KEYS = ("control_fraction", "seed")
CONTROL_FRACTION_MAX = 0.5    # a control group larger than the treated one is a bypass rule
BYPASS_KEYS = ("clients", "servers", "ports")
SIDE_KEYS = ("vlan", "addresses", "prefixes", "gateways", "congestion", "congctl", "initcwnd", "queue_target_ms")
PROXY_DEFAULTS: dict[str, Any] = {
    "enabled": True,
    "interception": "bpf",
    "ports": None,          # "all"
    "listen_port": 50080,
    "splice": "both",
    "mode": "tcp",
    "maxconn": 0,
    "log_connections": False,
    # issue 26: what the split hides (README, "Transparency")
    "source_port": "any",   # "kept": README, "Transparency", says what it gives and risks
    "mptcp": "bypass",
    "handshake": None,      # "honest" in mode bpf, which alone can make it; "early" otherwise
}
PROXY_KEYS = tuple(PROXY_DEFAULTS)
DEFAULT_CONGESTION = {"access": "bbr", "origin": "cubic"}
# Congestion controls pepctl brings itself: no kernel offers them before `up` registers them
# (pepctl/congestion.py). pep_radio keeps its state per subscriber, the access side's peers.
OWN_CONGESTION = (radio_maps.NAME,)
QUEUE_TARGET_MS_MAX = 1000
# BBR paces its start-up; from the kernel's initial window of 10 it needs about two more round
# trips than an unpaced CUBIC slow start to deliver 1 MB (measured in the lab: 0.83 of end-to-end
# goodput at 20 ms RTT). 32 segments, paced, make the split flow start as fast as the flow it
# replaces. The origin side keeps the kernel's (0).
DEFAULT_INITCWND = {"access": 32, "origin": 0}
MAX_INITCWND = 256

INSTANCE_RE = re.compile(r"[a-z][a-z0-9]{0,8}")      # prefixes link names: IFNAMSIZ is 16
GRAPH_NAME_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,11}")
CONGCTL_RE = re.compile(r"[a-z0-9_]{1,15}")
MAX_THREADS = 64          # HAProxy 2.6 is built with MAX_THREADS=64 (`haproxy -vv`)
MAX_ROUTE_PORTS = 1000    # route mode binds one listener per port and family
# HAProxy keeps maxconn, and the descriptors it sizes from it (about 2.5 a connection:
# pepctl/hostinfo.py maxconn_for), in C ints, and Linux caps every open-file limit (fs.nr_open)
# below 2^31: 800 million connections need 2.0e9 descriptors, more than any host allows. plan
# checks maxconn against this host's own limit (pepctl/checks.py); this bound needs no host.
MAXCONN_MAX = 800_000_000

# Paths. HAProxy binds its stats socket (run_dir/INSTANCE/proxy/haproxy.sock, pepctl/names.py)
# by way of "<path>.<pid>.tmp" (its sock_unix.c), and that name must fit sun_path: 108 bytes with
# the NUL. Pids go up to 4194304 (PID_MAX_LIMIT), so the socket path itself may have at most
# 107 - len(".4194304.tmp") = 95 bytes. run_dir_max() is what that leaves run_dir.
UNIX_PATH_MAX = 107
STATS_SOCKET_MAX = UNIX_PATH_MAX - len(".4194304.tmp")
# Under run_dir/INSTANCE: the longest stats socket a HAProxy process binds (haproxy/supervise.py
# socket_name; names.instance_names(...).haproxy_sock_longest).
STATS_SOCKET_TAIL = ("proxy", "haproxy.s999999.sock")
SUPERVISOR_UNIT = "pep-supervisor@.service"     # as pepctl/names.py SUPERVISOR_UNIT (names imports this module)
UNIT_NAME_MAX = 255       # systemd: pep-supervisor@<run_dir/INSTANCE, escaped>.service
PATH_LEN_MAX = 255        # run_dir, bpf_dir: NAME_MAX, so no pin path (bpf_dir/INSTANCE/flow/maps/NAME) nears PATH_MAX
PATH_CHARS = "letters, digits, '.', '_', '-' and '/'"   # POSIX's portable file name characters
_PATH_RE = re.compile(r"[A-Za-z0-9._/-]*")
ONE_LISTENER = ("bpf", "nft")   # interception modes with a single listener: Proxy.one_listener
ENUMS = {
    "interception": ("bpf", "nft", "route"),
    "supervisor": ("auto", "systemd", "pepctl"),
    "splice": ("both", "auto", "off"),
    "mode": ("tcp", "http"),
    "source_port": ("kept", "any"),
    "mptcp": ("bypass", "proxy"),
    "handshake": ("honest", "early"),
}

NO_GRAPHS = "no graphs; add at least one [[graph]] table (see etc/pep.example.toml)"
CONFIG_MAX_BYTES = 16 << 20

_INT, _BOOL, _STR, _LIST, _TABLE = "an integer", "true or false", "a string", "a list", "a table"


def _is(v: Any, kind: str) -> bool:
    if kind == _INT:
        return isinstance(v, int) and not isinstance(v, bool)
    return isinstance(v, {_BOOL: bool, _STR: str, _LIST: list, _TABLE: dict}[kind])


def _type_name(v: Any) -> str:
    for kind in (_BOOL, _INT, _STR, _LIST, _TABLE):
        if _is(v, kind):
            return kind
    return "a float" if isinstance(v, float) else "a date/time"


def merge_ranges(ranges) -> tuple[tuple[int, int], ...]:
    """Sort inclusive ranges and merge overlapping or adjacent ones."""
    out: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return tuple((lo, hi) for lo, hi in out)


def in_ranges(port: int, ranges) -> bool:
    return any(lo <= port <= hi for lo, hi in ranges)


# --- ASCII, address kinds, paths: the rules pepctl/bypass.py shares ---------------------------

def ascii_problem(text: str) -> str | None:
    """What is wrong with a string that must be ASCII, naming its first other character; or None.
    The message is ASCII itself, and says how the text reads in ASCII when NFKC can tell
    (full-width "80" -> "80")."""
    if text.isascii():
        return None
    i, ch = next((i, c) for i, c in enumerate(text) if not c.isascii())
    plain = unicodedata.normalize("NFKC", text).strip()   # no value takes a space: "80\u00a0" reads "80"
    hint = f", {json.dumps(plain)}" if plain.isascii() and plain else ""
    return (f"has a non-ASCII character, U+{ord(ch):04X} {unicodedata.name(ch, '(unnamed)')} (character {i + 1}); "
            f"write it in ASCII{hint}")


# Address kinds nothing in a config or a bypass rule can use. An address is of a kind when it lies
# in the range; a network when it lies wholly inside it (0.0.0.0/0 and ::/0 are of no kind).
_KINDS = [(ipaddress.ip_network(net), kind, why) for net, kind, why in (
    ("0.0.0.0/32", "unspecified", 'it means "no address"'),
    ("127.0.0.0/8", "loopback", "it never leaves its host"),
    ("169.254.0.0/16", "link-local", "it is for one link only: no router forwards it"),
    ("224.0.0.0/4", "multicast", "it names a group of hosts, not one"),
    ("255.255.255.255/32", "broadcast", "it reaches every host of a link, not one"),
    ("240.0.0.0/4", "reserved", "it is reserved for future use (RFC 1112) and not routed"),
    ("::/128", "unspecified", 'it means "no address"'),
    ("::1/128", "loopback", "it never leaves its host"),
    ("::ffff:0:0/96", "IPv4-mapped", "it stands for an IPv4 address inside a host and never appears on a link"),
    ("fe80::/10", "link-local", "it is for one link only (the kernel gives every link one): no router "
     "forwards it"),
    ("ff00::/8", "multicast", "it names a group of hosts, not one"),
)]
_KIND_BITS = [(n.version, n.max_prefixlen - n.prefixlen, int(n.network_address) >> (n.max_prefixlen - n.prefixlen),
               n.prefixlen) for n, _, _ in _KINDS]
_EXAMPLE = {4: ("198.18.0.1/24", "198.18.0.0/24"), 6: ("2001:2:0:1::1/64", "2001:2:0:1::/64")}
# What to do, by where the address is written.
_TODO = {
    "address": "give this side a unicast address of its own, e.g. {addr}",
    "gateway": "give the next router's unicast address, in a subnet of this side's addresses",
    "prefix": "list the unicast networks reached through this side (a default route is 0.0.0.0/0 or ::/0)",
    "client": "no subscriber's TCP flow comes from it; give a unicast network, e.g. {net}",
    "server": "no TCP flow goes to it; give a unicast network, e.g. {net}",
    "metrics": 'give an address of this host, e.g. "127.0.0.1"',
}
_ALLOWED = {"metrics": ("unspecified", "loopback")}   # listen on every address, or on 127.0.0.1


# The first bytes of every address of a kind, by IP version: most networks are of no kind, and
# their first byte alone says so.
_KIND_FIRST = {v: {b for n, _, _ in _KINDS if n.version == v
                   for b in range(int(n.network_address) >> (n.max_prefixlen - 8),
                                  (int(n.broadcast_address) >> (n.max_prefixlen - 8)) + 1)} for v in (4, 6)}


def address_kind(version: int, value: int, plen: int) -> int | None:
    """The index in _KINDS of the kind of network value/plen (an address: plen 32 or 128), or None.
    Plain integers, so bypass rules (100,000 of them) need no ipaddress objects."""
    if plen >= 8 and value >> (96 * (version == 6) + 24) not in _KIND_FIRST[version]:
        return None
    for i, (v, shift, top, kplen) in enumerate(_KIND_BITS):
        if v == version and plen >= kplen and value >> shift == top:
            return i
    return None


def kind_problem(x: Addr | Iface | Net, role: str) -> str | None:
    """What is wrong with an address, interface address or network of a kind that cannot serve as
    role (a key of _TODO), or None."""
    if isinstance(x, ipaddress.IPv4Interface | ipaddress.IPv6Interface):
        value, plen = int(x.ip), x.max_prefixlen
    elif isinstance(x, ipaddress.IPv4Network | ipaddress.IPv6Network):
        value, plen = int(x.network_address), x.prefixlen
    else:
        value, plen = int(x), x.max_prefixlen
    i = address_kind(x.version, value, plen)
    return None if i is None else kind_message(i, role, x)


def kind_message(i: int, role: str, x: Any = None) -> str | None:
    """The message for kind _KINDS[i] written as role; None when role may use that kind. x, the
    value as ipaddress has it, lets an IPv4-mapped one be shown in IPv4."""
    net, kind, why = _KINDS[i]
    if kind in _ALLOWED.get(role, ()):
        return None
    where = str(net.network_address) if net.prefixlen == net.max_prefixlen else str(net)
    addr, example = _EXAMPLE[net.version]
    todo = _TODO[role].format(addr=json.dumps(addr), net=example)
    if kind == "IPv4-mapped" and x is not None and _as_ipv4(x):
        todo = f"write it as IPv4, {json.dumps(_as_ipv4(x))}"
    return f"is {kind} ({where}): {why}; {todo}"


def _as_ipv4(x: Any) -> str | None:
    """An IPv4-mapped address, interface or network written as IPv4, or None."""
    if isinstance(x, ipaddress.IPv6Interface):    # before IPv6Address: an interface is one too
        plen = x.network.prefixlen - 96
        return f"{x.ip.ipv4_mapped}/{plen}" if x.ip.ipv4_mapped and plen >= 0 else None
    if isinstance(x, ipaddress.IPv6Address):
        return str(x.ipv4_mapped) if x.ipv4_mapped else None
    if isinstance(x, ipaddress.IPv6Network) and x.prefixlen >= 96:
        return str(ipaddress.ip_network((int(x.network_address) & 0xFFFFFFFF, x.prefixlen - 96)))
    return None


def zone_problem(text: str) -> str | None:
    """An IPv6 zone id ("fe80::1%eth0"): ipaddress takes one, pepctl cannot use one."""
    if "%" not in text:
        return None
    zone = "%" + text.partition("%")[2].partition("/")[0]
    return (f"has a zone id, {json.dumps(zone)}: zone ids pick a link for a link-local address, and pepctl "
            f"names every link itself and takes no link-local addresses; write it without {json.dumps(zone)}")


def run_dir_max(instance: str) -> int:
    """The longest run_dir whose stats sockets (run_dir/INSTANCE/proxy/haproxy.sNNNNNN.sock) HAProxy can bind."""
    return STATS_SOCKET_MAX - len(stats_socket("", instance))


def stats_socket(run_dir: str, instance: str) -> str:
    """HAProxy's longest stats socket, as pepctl/names.py instance_names(...).haproxy_sock_longest."""
    return "/".join((run_dir, instance, *STATS_SOCKET_TAIL))


def supervisor_unit_len(run_dir: str, instance: str) -> int:
    """The length of pepctl/names.py unit_name(): pep-supervisor@<run_dir/INSTANCE, as
    systemd-escape --path writes it>.service, for a path that path_problem() passed (its only
    characters systemd escapes are '-', and '.' at the start, each as \\xNN)."""
    esc = f"{run_dir}/{instance}".strip("/")
    return len(SUPERVISOR_UNIT) + len(esc) + 3 * esc.count("-") + 3 * esc.startswith(".")


def path_problem(path: str, example: str) -> str | None:
    """What is wrong with host.run_dir or host.bpf_dir (ASCII already), or None. A path may end
    in "/" and repeat "/": clean_path() removes those."""
    if not path.startswith("/"):
        return f"must be an absolute path, e.g. {json.dumps(example)}"
    m = _PATH_RE.match(path)
    if m.end() < len(path):
        ch = path[m.end()]
        what = {" ": "a space", "\t": "a tab", "\n": "a newline", "\0": "a NUL"}.get(ch) or (
            f"a control character (0x{ord(ch):02x})" if ord(ch) < 32 or ord(ch) == 127 else json.dumps(ch))
        return (f"has {what} (character {m.end() + 1}); use only {PATH_CHARS}: pepctl writes this path into "
                "HAProxy's config, systemd unit names and commands")
    parts = path.split("/")
    for p in (".", ".."):
        if p in parts:
            return (f'has a "{p}" folder in it; write the folder plainly, e.g. {json.dumps(example)} '
                    '(pepctl does not resolve "." and "..")')
    clean = clean_path(path)
    if clean == "/":
        return f"is the root folder; give a folder of pepctl's own, e.g. {json.dumps(example)}"
    if len(clean) > PATH_LEN_MAX:
        return f"is {len(clean)} bytes long; use at most {PATH_LEN_MAX}, e.g. {json.dumps(example)}"
    return None


def _nesting(a: str, b: str) -> str | None:
    """How folder a lies to folder b: "the same folder as", "inside", "around", or None (apart)."""
    if a == b:
        return "the same folder as"
    if (a + "/").startswith(b + "/"):
        return "inside"
    return "around" if (b + "/").startswith(a + "/") else None


def clean_path(path: str) -> str:
    """"/run//pep/" -> "/run/pep"."""
    return "/" + "/".join(p for p in path.split("/") if p)


# --- line numbers -----------------------------------------------------------------------------

# Linear regexes (no two parts can take the same characters): the scanner reads every line,
# also those inside multi-line strings.
_HEADER_RE = re.compile(r"[ \t]*(\[\[?)[ \t]*([A-Za-z0-9_.-]+(?:[ \t]+[A-Za-z0-9_.-]+)*)[ \t]*\]\]?[ \t\r]*(?:#.*)?$")
_KEY_RE = re.compile(r"[ \t]*([A-Za-z0-9_.-]+)[ \t]*=")


def _line_index(text: str) -> dict[str, int]:
    """Map dotted field paths (graph[1].access.vlan) to the line that defines them.

    A cheap line scanner, not a TOML parser: it follows [table] and [[array]]
    headers and `key =` lines, which is how people write this file. Anything
    it cannot place falls back to its enclosing table's line (see _Reader.line).
    """
    index: dict[str, int] = {}
    counts: dict[str, int] = {}
    table = ""
    # split("\n"), as TOML counts lines: splitlines() would also split at U+2028 or U+0085 in a
    # comment or a string, and every line number after it would be wrong.
    for no, line in enumerate(text.split("\n"), 1):
        m = _HEADER_RE.match(line)
        if m:
            name = re.sub(r"[ \t]", "", m.group(2))
            if m.group(1) == "[[":
                counts[name] = counts.get(name, -1) + 1
                table = f"{name}[{counts[name]}]"
            else:
                # [graph.access] belongs to the latest [[graph]].
                head, _, rest = name.partition(".")
                table = f"{head}[{counts[head]}].{rest}" if head in counts and rest else name
            index.setdefault(table, no)
            continue
        m = _KEY_RE.match(line)
        if m and not line.lstrip().startswith("#"):
            index.setdefault(f"{table}.{m.group(1)}" if table else m.group(1), no)
    return index


# --- the reader -------------------------------------------------------------------------------

class _Bad:
    """Marks a value that failed a check; its error is already recorded."""

    def __repr__(self) -> str:
        return "BAD"


BAD: Any = _Bad()
_REQUIRED: Any = object()


class _Reader:
    def __init__(self, path: str, text: str, available_cc: set[str] | None):
        self.path = path
        self.lines = _line_index(text)
        self.available_cc = available_cc
        self.errors: list[FieldError] = []
        self.notices: list[str] = []

    def line(self, field: str) -> int | None:
        # graph[1].access.addresses[2] -> graph[1].access.addresses -> graph[1].access -> graph[1]
        f = field
        while f:
            if f in self.lines:
                return self.lines[f]
            f = f[: f.rfind("[")] if f.endswith("]") else f.rpartition(".")[0]
        return None

    def error(self, field: str, value: Any, message: str) -> Any:
        self.errors.append(FieldError(self.path, field, value, message, self.line(field)))
        return BAD

    # -- generic shape checks --

    def unknown_keys(self, table: dict, where: str, known: tuple[str, ...]) -> None:
        for key in table:
            if key in known:
                continue
            if key in MOVED_TO_HOST and where.endswith("proxy"):
                self.error(_join(where, key), table[key], f"moved to [host] (one HAProxy serves every graph): "
                           f"write `{key} = {toml_value(table[key])}` under [host]")
                continue
            listed = f"known keys here: {', '.join(known)}"
            if not key.isascii():   # a full-width "nic": ascii_problem spells it in ASCII
                hint = "" if unicodedata.normalize("NFKC", key) in known else f"; {listed}"
                self.error(_join(where, key), table[key], f"unknown key: it {ascii_problem(key)}{hint}")
                continue
            close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
            if not close and key:  # an abbreviation: irq -> irq_affinity
                close = [k for k in known if k.startswith(key)][:1]
            hint = f"did you mean {close[0]!r}?" if close else listed
            self.error(_join(where, key), table[key], f"unknown key; {hint}")

    def get(self, table: dict, where: str, key: str, kind: str, default: Any = _REQUIRED,
            example: str = "") -> Any:
        path = _join(where, key)
        if key not in table:
            if default is _REQUIRED:
                header = f"[{_header(where)}]" if where else "the top level"
                return self.error(path, None, f"missing; add `{key} = {example}` to {header}")
            return default
        value = table[key]
        if not _is(value, kind):
            return self.error(path, value, f"must be {kind}, not {_type_name(value)}")
        if kind == _STR and ascii_problem(value):
            return self.error(path, value, ascii_problem(value))
        return value

    def subtable(self, table: dict, where: str, key: str, known: tuple[str, ...],
                 required: bool = False) -> dict | Any:
        path = _join(where, key)
        if key not in table:
            if required:
                return self.error(path, None, f"missing; add a [{_header(path)}] table")
            return {}
        value = table[key]
        if not isinstance(value, dict):
            return self.error(path, value, f"must be a table ([{_header(path)}]), not {_type_name(value)}")
        self.unknown_keys(value, path, known)
        return value

    # -- host --

    def host(self, doc: dict) -> Host | Any:
        raw = self.subtable(doc, "", "host", HOST_KEYS, required=True)
        if raw is BAD:
            return BAD
        instance = self.get(raw, "host", "instance", _STR, example='"pep1"')
        if instance is not BAD and not INSTANCE_RE.fullmatch(instance):
            instance = self.error("host.instance", instance,
                                  "must be 1-9 characters of a-z and 0-9, starting with a letter "
                                  "(it prefixes every name pepctl makes), e.g. \"pep1\"")
        nic = self.get(raw, "host", "nic", _STR, example='"eth1"')
        if nic is not BAD and not _valid_ifname(nic):
            nic = self.error("host.nic", nic, "not a valid interface name (1-15 printable characters, no '/', "
                             "':' or spaces); give the trunk NIC as `ip link` shows it")
        dirs = []
        for key, default in (("run_dir", "/run/pep"), ("bpf_dir", "/sys/fs/bpf/pep")):
            d = self.get(raw, "host", key, _STR, default)
            if d is not BAD:
                msg = path_problem(d, default)
                d = self.error(f"host.{key}", d, msg) if msg else clean_path(d)
            dirs.append(d)
        if instance is not BAD:
            dirs[0] = self.run_dir_fits(raw, dirs[0], instance)
        if BAD not in dirs:
            run_dir, bpf_dir = dirs
            rel = _nesting(run_dir, bpf_dir)
            if rel:
                dirs[0] = self.error("host.run_dir", raw.get("run_dir", run_dir), f"is {rel} bpf_dir "
                                     f"({json.dumps(bpf_dir)}); a bpf filesystem holds only pins, and run_dir holds "
                                     "files: give them separate folders, e.g. \"/run/pep\" and \"/sys/fs/bpf/pep\"")
        traw = self.subtable(raw, "host", "tuning", TUNING_KEYS)
        tuning: Any = BAD
        if traw is not BAD:
            flags = [self.get(traw, "host.tuning", k, _BOOL, True) for k in TUNING_KEYS]
            tuning = BAD if BAD in flags else Tuning(*flags)
        extra = [self.host_value(raw, key) for key in HOST_DEFAULTS]
        parts = [instance, nic, *dirs, tuning, *extra]
        return BAD if any(p is BAD for p in parts) else Host(*parts)

    def run_dir_fits(self, raw: dict, run_dir: Any, instance: str) -> Any:
        """run_dir, or BAD when a name made from it would not fit: HAProxy's stats socket, the
        supervisor's systemd unit."""
        if run_dir is BAD:
            return BAD
        shown = raw.get("run_dir", run_dir)
        sock = stats_socket(run_dir, instance)
        if len(sock) > STATS_SOCKET_MAX:
            return self.error("host.run_dir", shown, f"too long: HAProxy's stats socket {sock} would be {len(sock)} "
                              f"bytes, and a socket path can have at most {STATS_SOCKET_MAX} (sun_path's "
                              f"{UNIX_PATH_MAX}, less the \".PID.tmp\" HAProxy adds while it binds); use a run_dir of "
                              f"at most {run_dir_max(instance)} bytes, e.g. \"/run/pep\"")
        unit = supervisor_unit_len(run_dir, instance)
        if unit > UNIT_NAME_MAX:
            return self.error("host.run_dir", shown, f"too long for systemd: the supervisor's unit name would be "
                              f"{unit} bytes, and systemd takes at most {UNIT_NAME_MAX} (it writes each '-' of "
                              "the path as 4: \\x2d); use a shorter run_dir, e.g. \"/run/pep\"")
        return run_dir

    def host_value(self, raw: dict, key: str) -> Any:
        """One of the [host] keys with a default (HOST_DEFAULTS), checked."""
        path = f"host.{key}"
        default = HOST_DEFAULTS[key]
        value = self.get(raw, "host", key, _STR if isinstance(default, str) else _INT, default)
        if value is BAD:
            return BAD
        if key in ENUMS and value not in ENUMS[key]:
            return self.error(path, value, f"must be one of {', '.join(map(json.dumps, ENUMS[key]))}")
        if key == "threads" and not 0 <= value <= MAX_THREADS:
            return self.error(path, value, f"use 1-{MAX_THREADS} threads (HAProxy's limit), "
                              "or 0 for one per CPU of the NIC's NUMA node")
        if key == "maxconn" and value < 0:
            return self.error(path, value, "must not be negative; use 0 to size it from the open-file limit")
        if key == "maxconn" and value > MAXCONN_MAX:
            return self.error(path, value, f"too large: use at most {MAXCONN_MAX} (HAProxy counts connections "
                              "and their descriptors in an int; plan also checks it against this host's open-file "
                              "limit), or 0 to size it from that limit")
        if key == "metrics_port" and not 0 <= value <= 65535:
            return self.error(path, value, "not a TCP port; use 1-65535, or 0 for no metrics")
        if key == "metrics_address":
            msg = zone_problem(value)
            if not msg:
                try:
                    msg = kind_problem(ipaddress.ip_address(value), "metrics")
                except ValueError:
                    msg = ('not an IP address; the exporter listens on it in the host\'s namespace, e.g. '
                           '"127.0.0.1" or a management address')
            if msg:
                return self.error(path, value, msg)
        return value

    # -- proxy --

    def proxy_value(self, key: str, value: Any, path: str) -> Any:
        """Check one proxy key on its own; cross-key checks are in proxy()."""
        if key in ("enabled", "log_connections"):
            return value if _is(value, _BOOL) else self.error(path, value, f"must be {_BOOL}")
        if key in ENUMS:
            choices = ENUMS[key]
            if _is(value, _STR) and ascii_problem(value):
                return self.error(path, value, ascii_problem(value))
            if not _is(value, _STR) or value not in choices:
                return self.error(path, value, f"must be one of {', '.join(map(json.dumps, choices))}")
            return value
        if key == "ports":
            return self.ports(value, path)
        if not _is(value, _INT):
            return self.error(path, value, f"must be {_INT}, not {_type_name(value)}")
        if key == "listen_port" and not 1 <= value <= 65535:
            return self.error(path, value, "not a TCP port; use 1-65535 (default 50080)")
        if key == "maxconn" and value < 0:
            return self.error(path, value, "must not be negative; use 0 for the host's maxconn")
        if key == "maxconn" and value > MAXCONN_MAX:
            return self.error(path, value, f"too large: use at most {MAXCONN_MAX} (HAProxy counts connections in "
                              "an int), or 0 for the host's maxconn")
        return value

    def ports(self, value: Any, path: str) -> Any:
        """"all" -> None; [80, "8000-8080"] -> ((80, 80), (8000, 8080))."""
        if value == "all":
            return None
        if _is(value, _STR) and ascii_problem(value):
            return self.error(path, value, ascii_problem(value))
        if not _is(value, _LIST):
            return self.error(path, value, 'must be "all" or a list like [80, 443, "8000-8080"]')
        if not value:
            return self.error(path, value, 'empty; list at least one port, or use "all"')
        ranges = []
        for i, item in enumerate(value):
            r = _port_range(item)
            if isinstance(r, str):
                self.error(f"{path}[{i}]", item, r)
            else:
                ranges.append(r)
        return merge_ranges(ranges) if len(ranges) == len(value) else BAD

    def defaults_proxy(self, doc: dict) -> dict[str, Any]:
        """[defaults.proxy]: checked once here, so a bad default is reported once, not per graph."""
        draw = self.subtable(doc, "", "defaults", DEFAULTS_KEYS)
        if draw is BAD:
            return {}
        praw = self.subtable(draw, "defaults", "proxy", PROXY_KEYS)
        if praw is BAD:
            return {}
        return {k: self.proxy_value(k, v, f"defaults.proxy.{k}") for k, v in praw.items() if k in PROXY_KEYS}

    def proxy(self, graw: dict, where: str, defaults: dict[str, Any]) -> Proxy | Any:
        path = f"{where}.proxy"
        praw = self.subtable(graw, where, "proxy", PROXY_KEYS)
        if praw is BAD:
            return BAD
        v: dict[str, Any] = {}
        origin: dict[str, str] = {}  # where each value came from, for error paths
        for key in PROXY_KEYS:
            if key in praw:
                v[key] = self.proxy_value(key, praw[key], f"{path}.{key}")
            else:
                v[key] = defaults.get(key, PROXY_DEFAULTS[key])
            origin[key] = f"{path}.{key}" if key in praw or key not in defaults else f"defaults.proxy.{key}"

        def fail(key: str, msg: str) -> None:
            # Report at this graph's path even if the value came from [defaults.proxy]: the
            # conflict is between keys of this graph. Name where the value came from.
            src = "" if origin[key].startswith(where) else f" (from {origin[key]})"
            shown = "all" if key == "ports" and v[key] is None else v[key]
            if key == "ports" and v[key] is not None:
                shown = [lo if lo == hi else f"{lo}-{hi}" for lo, hi in v[key]]
            self.error(f"{path}.{key}", shown, msg + src)
            v[key] = BAD

        mode, ports, listen = v["interception"], v["ports"], v["listen_port"]
        if mode == "route" and ports is None:
            fail("ports", 'interception = "route" needs a list of ports (HAProxy binds each one); '
                 'set ports = [80, 443] or use interception = "nft"')
        elif mode == "route" and ports is not BAD and _count(ports) > MAX_ROUTE_PORTS:
            fail("ports", f'interception = "route" binds one listener per port: at most {MAX_ROUTE_PORTS} '
                 'ports; use interception = "nft" for large port sets')
        if mode in ONE_LISTENER and ports not in (None, BAD) and listen is not BAD and in_ranges(listen, ports):
            fail("listen_port", f"is also an intercepted port (ports); the proxy's listener needs a port of "
                 f"its own: pick one outside ports (default {PROXY_DEFAULTS['listen_port']})")
        self.proxy_handshake(v, fail)
        values = [v[k] for k in PROXY_KEYS]
        return BAD if any(x is BAD for x in values) else Proxy(*values)

    @staticmethod
    def proxy_handshake(v: dict, fail) -> None:
        """handshake: "honest" (the origin answers a new flow's SYN before the proxy does) needs the
        datapath's own interception; the default is honest there and early elsewhere."""
        mode = v["interception"]
        if v["handshake"] is None:
            v["handshake"] = "honest" if mode == "bpf" else "early"
        elif v["handshake"] == "honest" and mode not in ("bpf", BAD):
            fail("handshake", f'"honest" needs interception = "bpf" (the datapath sends the SYN to the origin '
                 f'and hands it to the listener itself; interception is "{mode}"): use handshake = "early" or '
                 'interception = "bpf"')

    # -- sides --

    def side(self, graw: dict, where: str, name: str) -> Side | Any:
        path = f"{where}.{name}"
        raw = self.subtable(graw, where, name, SIDE_KEYS, required=True)
        if raw is BAD:
            return BAD
        vlan = self.get(raw, path, "vlan", _INT, example="100")
        if vlan is not BAD and not 1 <= vlan <= 4094:
            vlan = self.error(f"{path}.vlan", vlan, "not a usable VLAN id; use 1-4094")
        addresses = self.addresses(raw, path)
        prefixes = self.prefixes(raw, path, addresses)
        gateways = self.gateways(raw, path, addresses)
        if BAD not in (prefixes, gateways, addresses):
            self.unreachable_prefixes(path, addresses, prefixes, gateways)
        congestion = self.congestion(raw, path, name)
        initcwnd = self.get(raw, path, "initcwnd", _INT, DEFAULT_INITCWND[name])
        if initcwnd is not BAD and not 0 <= initcwnd <= MAX_INITCWND:
            initcwnd = self.error(f"{path}.initcwnd", initcwnd, f"use 0 for the kernel's initial window (10 "
                                  f"segments), or 1-{MAX_INITCWND}")
        target = self.queue_target(raw, path, name, congestion)
        parts = [vlan, addresses, prefixes, gateways, congestion, initcwnd, target]
        return BAD if any(p is BAD for p in parts) else Side(*parts)

    def congestion(self, raw: dict, path: str, side: str) -> str | Any:
        """The side's congestion control: `congestion`, or its old name `congctl` (with a notice)."""
        key = "congestion"
        if "congctl" in raw:
            if "congestion" in raw:
                return self.error(f"{path}.congctl", raw["congctl"], f"given with {path}.congestion = "
                                  f"{toml_value(raw['congestion'])}; congctl is the old name of congestion: keep only "
                                  "`congestion`")
            key = "congctl"
            line = self.line(f"{path}.congctl")
            self.notices.append(f"{self.path}{f':{line}' if line else ''}: {path}.congctl is deprecated: rename it to "
                                f"`congestion` (same values)")
        field = f"{path}.{key}"
        cc = self.get(raw, path, key, _STR, DEFAULT_CONGESTION[side])
        if cc is BAD:
            return BAD
        if not CONGCTL_RE.fullmatch(cc):
            return self.error(field, cc, "not a congestion control name; see "
                              "/proc/sys/net/ipv4/tcp_available_congestion_control")
        if cc == radio_maps.NAME and side != "access":
            return self.error(field, cc, f"{cc} is the access side's congestion control: it keeps its state per "
                              "subscriber (a socket's peer), and toward the origin the peers are servers; use "
                              f"\"{DEFAULT_CONGESTION[side]}\" (the default) or \"bbr\" here")
        if cc not in OWN_CONGESTION and self.available_cc is not None and cc not in self.available_cc:
            return self.error(field, cc, f"this kernel does not offer it; use one of "
                              f"{', '.join(sorted(self.available_cc))}, or {' '.join(OWN_CONGESTION)} "
                              "(pepctl's own, registered by `up`)")
        return cc

    def queue_target(self, raw: dict, path: str, side: str, congestion: Any) -> int | Any:
        """[graph.access] queue_target_ms: pep_radio's target; 0 (unused) for any other."""
        field = f"{path}.queue_target_ms"
        default = radio_maps.TARGET_US // 1000
        value = self.get(raw, path, "queue_target_ms", _INT, default)
        if value is BAD:
            return BAD
        given = "queue_target_ms" in raw
        if given and side != "access":
            return self.error(field, value, "only the access side runs pep_radio, which holds a queue delay target; "
                              "remove queue_target_ms here (put it under [graph.access])")
        if given and congestion is not BAD and congestion != radio_maps.NAME:
            return self.error(field, value, f"only pep_radio holds a queue delay target, and this side's congestion "
                              f"is {toml_value(congestion)}: set congestion = \"{radio_maps.NAME}\" in "
                              f"[{_header(path)}], or remove queue_target_ms")
        if not 1 <= value <= QUEUE_TARGET_MS_MAX:
            return self.error(field, value, f"use 1-{QUEUE_TARGET_MS_MAX} milliseconds of queueing delay for "
                              f"pep_radio to hold in the radio's buffer (default {default})")
        return value if congestion == radio_maps.NAME else 0

    def strings(self, raw: dict, path: str, key: str, default: Any) -> list[tuple[str, Any]] | Any:
        """A list of strings as (field path, value) pairs; bad items are reported and left out."""
        items = self.get(raw, path, key, _LIST, default, example='["198.18.0.1/24", "2001:2:0:1::1/64"]')
        if items is BAD or items is default:
            return items
        out = []
        for i, item in enumerate(items):
            if not _is(item, _STR):
                self.error(f"{path}.{key}[{i}]", item, f"must be a string, not {_type_name(item)}")
            elif ascii_problem(item):
                self.error(f"{path}.{key}[{i}]", item, ascii_problem(item))
            else:
                out.append((f"{path}.{key}[{i}]", item))
        return out if len(out) == len(items) else BAD

    def addresses(self, raw: dict, path: str) -> tuple[Iface, ...] | Any:
        items = self.strings(raw, path, "addresses", _REQUIRED)
        if items is BAD:
            return BAD
        if not items:
            return self.error(f"{path}.addresses", [], "empty; give this side's own address with its "
                              'prefix length, e.g. ["198.18.0.1/24"]')
        out: list[Iface] = []
        for field, text in items:
            msg = _address_problem(text)
            if not msg and ipaddress.ip_interface(text) in out:
                msg = "listed twice; remove one"
            if msg:
                self.error(field, text, msg)
            else:
                out.append(ipaddress.ip_interface(text))
        return tuple(out) if len(out) == len(items) else BAD

    def prefixes(self, raw: dict, path: str, addresses: Any) -> tuple[Net, ...] | Any:
        items = self.strings(raw, path, "prefixes", None)
        if items is BAD:
            return BAD
        if items is None:  # default: the subnets of the addresses (directly connected)
            return BAD if addresses is BAD else tuple(dict.fromkeys(a.network for a in addresses))
        if not items:
            return self.error(f"{path}.prefixes", [], "empty; leave prefixes out to route just the "
                              "subnets of addresses, or list the networks on this side")
        out: list[Net] = []
        for field, text in items:
            msg = zone_problem(text)
            if not msg:
                try:
                    net = ipaddress.ip_network(text)
                    msg = kind_problem(net, "prefix")
                except ValueError:
                    try:
                        msg = f'has host bits set; write the network, "{ipaddress.ip_network(text, strict=False)}"'
                    except ValueError:
                        msg = 'not a network; write it like "198.18.0.0/16" or "2001:2::/48"'
            if msg:
                self.error(field, text, msg)
            else:
                out.append(net)
        return tuple(dict.fromkeys(out)) if len(out) == len(items) else BAD

    def gateways(self, raw: dict, path: str, addresses: Any) -> tuple[Addr, ...] | Any:
        items = self.strings(raw, path, "gateways", [])
        if items is BAD:
            return BAD
        out: list[Addr] = []
        seen: dict[int, str] = {}
        for field, text in items:
            try:
                gw = ipaddress.ip_address(text)
                msg = zone_problem(text) or kind_problem(gw, "gateway")
            except ValueError:
                msg = zone_problem(text) or "not an IP address; write a router's address like \"198.19.0.254\""
            if msg:
                self.error(field, text, msg)
                continue
            if addresses is not BAD:
                if any(gw == a.ip for a in addresses):
                    self.error(field, text, "is this side's own address; give the next router's address")
                    continue
                nets = [a.network for a in addresses if a.version == gw.version and gw in a.network]
                if not nets:
                    self.error(field, text, "not inside any subnet of this side's addresses; a gateway must "
                               "be directly reachable: fix it or add an address in its subnet")
                    continue
                net = nets[0]
                if net.num_addresses > 2 and gw == net.network_address:
                    self.error(field, text, f"is the network address of {net}; give the next router's address")
                    continue
                if net.num_addresses > 2 and gw.version == 4 and gw == net.broadcast_address:
                    self.error(field, text, f"is the broadcast address of {net}; give the next router's address")
                    continue
            if gw.version in seen:
                self.error(field, text, f"second IPv{gw.version} gateway (first is {seen[gw.version]}); "
                           "give at most one gateway per address family")
                continue
            seen[gw.version] = field
            out.append(gw)
        return tuple(out) if len(out) == len(items) else BAD

    def unreachable_prefixes(self, path: str, addresses, prefixes, gateways) -> None:
        """A prefix outside the connected subnets needs a gateway of its family to route to."""
        families = {gw.version for gw in gateways}
        for i, net in enumerate(prefixes):
            onlink = any(net.subnet_of(a.network) for a in addresses if a.version == net.version)
            if not onlink and net.version not in families:
                self.error(f"{path}.prefixes[{i}]", str(net), f"not inside this side's subnets and there is "
                           f"no IPv{net.version} gateway to route it to; add one to {path}.gateways")

    # -- the control group --

    def experiment(self, graw: dict, where: str) -> Experiment | Any:
        path = f"{where}.experiment"
        raw = self.subtable(graw, where, "experiment", EXPERIMENT_KEYS)
        if raw is BAD:
            return BAD
        fraction = raw.get("control_fraction", 0.0)
        if isinstance(fraction, bool) or not isinstance(fraction, int | float):
            fraction = self.error(f"{path}.control_fraction", fraction,
                                  f"must be a number, not {_type_name(fraction)}; e.g. 0.05 for 5% of subscribers")
        elif not 0 <= fraction <= CONTROL_FRACTION_MAX:
            fraction = self.error(f"{path}.control_fraction", fraction,
                                  f"use 0 (no experiment) to {CONTROL_FRACTION_MAX}: the share of subscribers "
                                  "left unproxied; to bypass more, write a bypass rule")
        seed = self.get(raw, path, "seed", _INT, 0)
        if seed is not BAD and not 0 <= seed < 1 << 32:
            seed = self.error(f"{path}.seed", seed, "use 0-4294967295")
        return BAD if BAD in (fraction, seed) else Experiment(float(fraction), seed)

    # -- several hosts behind routers --

    def routing(self, doc: dict, graphs: list) -> Routing | Any:
        raw = self.subtable(doc, "", "routing", ROUTING_KEYS)
        if raw is BAD:
            return BAD
        good = [g for g in graphs if g is not BAD]
        name = self.get(raw, "routing", "graph", _STR, good[0].name if len(good) == 1 else _REQUIRED,
                        example='"g1"')
        graph = next((g for g in good if g.name == name), None) if name is not BAD else None
        if name is not BAD and graph is None and len(good) == len(graphs):
            self.error("routing.graph", name, "no graph has this name; give the graph whose namespace faces "
                       f"the routers: {', '.join(g.name for g in good)}")
        if graph is not None and graph.proxy.enabled and graph.proxy.interception == "bpf":
            self.error(f"graph[{graph.index}].proxy.interception", "bpf", "[routing] runs FRR's bfdd in this graph's "
                       "namespace, and bfdd opens an IPv4 packet socket (BFD echo): with one there the kernel hands "
                       "IPv4 packets on shared, clones them, and the socket the tc program gave a SYN is lost; every "
                       'new flow would be reset. Use interception = "nft" (or "route") on the graph that faces '
                       "the routers")
        asn = self.asn(raw, "routing", "asn")
        hosts = self.members(raw, graph)
        me = self.get(raw, "routing", "host", _STR, example='"ph1"')
        names = [m.name for m in hosts] if hosts is not BAD else []
        if me is not BAD and hosts is not BAD and me not in names:
            me = self.error("routing.host", me, f"not in routing.hosts ({', '.join(names)}); name this host as "
                            "hosts does")
        elif me is not BAD and hosts is not BAD and graph is not None:
            mine = next(m for m in hosts if m.name == me)
            for side, addr in (("access", mine.access), ("origin", mine.origin)):
                own = [a.ip for a in (graph.access if side == "access" else graph.origin).addresses]
                if addr not in own:
                    self.error(f"routing.hosts[{names.index(me)}].{side}", str(addr), f"this host's entry: give "
                               f"its graph's {side} address ({', '.join(map(str, own))})")
        subscribers = self.ipv4_net(raw, "routing", "subscribers", '"198.18.0.0/24"')
        shares = self.get(raw, "routing", "shares", _INT, 8)
        if shares is not BAD and (shares < 1 or shares > SHARES_MAX or shares & (shares - 1)):
            shares = self.error("routing.shares", shares, f"use a power of 2 from 1 to {SHARES_MAX}: the subscriber "
                                "space splits into equal prefixes")
        elif shares is not BAD and subscribers is not BAD and \
                subscribers.prefixlen + (shares - 1).bit_length() > 32:
            shares = self.error("routing.shares", shares, f"{subscribers} has too few addresses for {shares} "
                                "shares; give fewer shares or a larger routing.subscribers")
        anchors = self.ipv4_net(raw, "routing", "anchors", '"198.18.96.0/27"')
        if anchors is not BAD and shares is not BAD and anchors.num_addresses < shares:
            anchors = self.error("routing.anchors", str(anchors), f"{anchors.num_addresses} addresses for {shares} "
                                 "shares: every share needs an anchor address; give a larger network")
        if BAD not in (anchors, subscribers) and anchors.overlaps(subscribers):
            anchors = self.error("routing.anchors", str(anchors), "overlaps routing.subscribers: anchors are "
                                 "addresses of their own, announced to the access-side router; take them elsewhere")
        peers = self.peers(raw, graph)
        bfd = self.subtable(raw, "routing", "bfd", BFD_KEYS)
        interval = multiplier = BAD
        if bfd is not BAD:
            interval = self.get(bfd, "routing.bfd", "interval_ms", _INT, 100)
            if interval is not BAD and not 10 <= interval <= 60000:
                interval = self.error("routing.bfd.interval_ms", interval, "use 10-60000 ms (FRR's range)")
            multiplier = self.get(bfd, "routing.bfd", "multiplier", _INT, 3)
            if multiplier is not BAD and not 2 <= multiplier <= 255:
                multiplier = self.error("routing.bfd.multiplier", multiplier, "use 2-255 (FRR's range)")
        router_id = self.get(raw, "routing", "router_id", _STR, "")
        if router_id == "" and graph is not None:
            router_id = str(next((a.ip for a in graph.access.addresses if a.version == 4), ""))
        if router_id is not BAD:
            try:
                router_id = ipaddress.IPv4Address(router_id)
            except ValueError:
                router_id = self.error("routing.router_id", router_id, "not an IPv4 address; BGP names a router by "
                                       "one (default: the graph's first IPv4 access address)")
        assign = self.assign(raw, hosts, shares)
        parts = [graph, asn, router_id, me, hosts, subscribers, shares, anchors, peers, interval, multiplier, assign]
        if any(p is BAD or p is None for p in parts):
            return BAD
        return Routing(graph.name, asn, router_id, me, tuple(hosts), subscribers, shares, anchors, peers,
                       interval, multiplier, assign)

    def table_items(self, raw: dict, key: str, keys: tuple, example: str) -> list[tuple[str, dict]] | Any:
        """routing.KEY, a list of tables: (path, table) of each, unknown keys named."""
        items = self.get(raw, "routing", key, _LIST, example=example)
        if items is BAD:
            return BAD
        out = []
        for i, item in enumerate(items):
            path = f"routing.{key}[{i}]"
            if not _is(item, _TABLE):
                self.error(path, item, f"must be a table with {', '.join(keys)}, e.g. {example}")
                continue
            self.unknown_keys(item, path, keys)
            out.append((path, item))
        return out if len(out) == len(items) else BAD

    def link_address(self, item: dict, path: str, key: str, graph: Graph | None, side: str,
                     whose: str) -> ipaddress.IPv4Address | Any:
        """An IPv4 address on the graph's link to the side's router (whose: the host's, the router's)."""
        text = self.get(item, path, key, _STR, example='"198.18.64.11"')
        if text is BAD:
            return BAD
        try:
            address = ipaddress.IPv4Address(text)
        except ValueError:
            return self.error(f"{path}.{key}", text, f"not an IPv4 address: {whose}, on the {side} routers' link")
        if graph is not None:
            nets = [a.network for a in (graph.access if side == "access" else graph.origin).addresses]
            if not any(address in n for n in nets):
                return self.error(f"{path}.{key}", text, f"not in graph {graph.name}'s {side} subnets "
                                  f"({', '.join(map(str, nets))}): {whose}, on the link the routers share")
        return address

    def members(self, raw: dict, graph: Graph | None) -> tuple[Member, ...] | Any:
        """routing.hosts: every host of the cluster, this one too: name, access, origin."""
        items = self.table_items(raw, "hosts", MEMBER_KEYS,
                                 '[{ name = "ph1", access = "198.18.64.11", origin = "198.19.64.11" }, ...]')
        if items is BAD:
            return BAD
        out = []
        for path, item in items:
            name = self.get(item, path, "name", _STR, example='"ph1"')
            if name is not BAD and not HOST_NAME_RE.fullmatch(name):
                name = self.error(f"{path}.name", name, "1-32 characters of a-z, 0-9 and '-', starting with a letter "
                                  "or digit, e.g. \"ph1\"")
            addrs = [self.link_address(item, path, side, graph, side, "the host's") for side in ("access", "origin")]
            if BAD not in (name, *addrs):
                out.append(Member(name, *addrs))
        if len(out) != len(items):
            return BAD
        names = [m.name for m in out]
        if not out or len(set(names)) != len(names):
            return self.error("routing.hosts", names, "list every proxy host of the cluster once, this one too")
        return tuple(out)

    def asn(self, raw: dict, path: str, key: str) -> int | Any:
        value = self.get(raw, path, key, _INT, example="65011")
        if value is not BAD and not 1 <= value <= 4294967294:
            return self.error(f"{path}.{key}", value, "not an AS number; use 1-4294967294 (private: 64512-65534 or "
                              "4200000000-4294967294)")
        return value

    def ipv4_net(self, raw: dict, path: str, key: str, example: str) -> ipaddress.IPv4Network | Any:
        text = self.get(raw, path, key, _STR, example=example)
        if text is BAD:
            return BAD
        try:
            return ipaddress.IPv4Network(text)
        except ValueError:
            return self.error(f"{path}.{key}", text, f"not an IPv4 network (with no host bits), e.g. {example}")

    def peers(self, raw: dict, graph: Graph | None) -> tuple[Peer, ...] | Any:
        items = self.table_items(raw, "peer", PEER_KEYS, '[{ side = "access", address = "...", asn = 65001 }]')
        if items is BAD:
            return BAD
        out = []
        for path, item in items:
            side = self.get(item, path, "side", _STR, example='"access"')
            if side is not BAD and side not in ("access", "origin"):
                side = self.error(f"{path}.side", side, 'must be "access" or "origin": the graph side the router is on')
            address = BAD if side is BAD else self.link_address(item, path, "address", graph, side, "the router's")
            asn = self.asn(item, path, "asn")
            if BAD not in (side, address, asn):
                out.append(Peer(side, address, asn))
        if len(out) != len(items):
            return BAD
        for side in ("access", "origin"):
            if not any(p.side == side for p in out):
                self.error("routing.peer", None, f"no {side}-side router; add a [[routing.peer]] with "
                           f"side = \"{side}\": both routers must learn this host's shares")
                return BAD
        return tuple(out)

    def assign(self, raw: dict, hosts: Any, shares: Any) -> tuple | Any:
        """routing.assign: { "3" = ["ph1", "ph2"] } pins share 3's primary and backup."""
        table = self.get(raw, "routing", "assign", _TABLE, {})
        if table is BAD or not table:
            return () if table is not BAD else BAD
        out = []
        for key, pair in table.items():
            path = f"routing.assign.{_key_text(key)}"
            if not key.isdigit() or (shares is not BAD and int(key) >= shares):
                last = "shares - 1" if shares is BAD else shares - 1
                self.error(path, pair, f"the key is a share number, 0 to {last}")
                continue
            if not _is(pair, _LIST) or len(pair) != 2 or pair[0] == pair[1] or \
                    (hosts is not BAD and any(h not in [m.name for m in hosts] for h in pair)):
                self.error(path, pair, "give [primary, backup]: two different hosts of routing.hosts")
                continue
            out.append((int(key), pair[0], pair[1]))
        return tuple(sorted(out)) if len(out) == len(table) else BAD

    # -- bypass --

    def bypass(self, graw: dict, where: str) -> Bypass | Any:
        path = f"{where}.bypass"
        raw = self.subtable(graw, where, "bypass", BYPASS_KEYS)
        if raw is BAD:
            return BAD
        nets: dict[str, Any] = {}
        for key in ("clients", "servers"):
            items = self.strings(raw, path, key, [])
            if items is BAD:
                nets[key] = BAD
                continue
            out = []
            for field, text in items:
                msg = zone_problem(text)
                if not msg:
                    try:
                        net = ipaddress.ip_network(text, strict=True)
                        msg = kind_problem(net, key[:-1])
                    except ValueError as e:
                        msg = "host bits set: write the network, e.g. \"198.18.0.0/24\"" if "host bits" in str(e) \
                            else "not a network; write it like \"198.18.0.0/24\" or \"2001:2:0:1::/64\""
                if msg:
                    self.error(field, text, msg)
                else:
                    out.append(net)
            nets[key] = tuple(out) if len(out) == len(items) else BAD
        ports: Any = ()
        praw = self.get(raw, path, "ports", _LIST, [])
        if praw is not BAD:
            ranges = []
            for i, item in enumerate(praw):
                got = _port_range(item)
                if isinstance(got, str):
                    self.error(f"{path}.ports[{i}]", item, got)
                else:
                    ranges.append(got)
            ports = merge_ranges(ranges) if len(ranges) == len(praw) else BAD
        else:
            ports = BAD
        parts = [nets["clients"], nets["servers"], ports]
        return BAD if any(p is BAD for p in parts) else Bypass(*parts)

    # -- graphs --

    def graphs(self, doc: dict, defaults: dict[str, Any]) -> list[Graph | Any]:
        if "graph" not in doc:
            self.error("graph", None, NO_GRAPHS)
            return []
        raw = doc["graph"]
        if isinstance(raw, dict):
            self.error("graph", raw, "must be an array of tables: write [[graph]], not [graph]")
            return []
        if not isinstance(raw, list) or not all(isinstance(g, dict) for g in raw):
            self.error("graph", raw, "must be an array of [[graph]] tables")
            return []
        if not raw:
            self.error("graph", raw, NO_GRAPHS)
            return []
        out = []
        for i, graw in enumerate(raw):
            where = f"graph[{i}]"
            self.unknown_keys(graw, where, GRAPH_KEYS)
            name = self.get(graw, where, "name", _STR, f"g{i}")
            if name is not BAD and not GRAPH_NAME_RE.fullmatch(name):
                name = self.error(f"{where}.name", name, "must be 1-12 characters of a-z, 0-9 and '-', "
                                  "starting with a letter or digit, e.g. \"g1\"")
            access = self.side(graw, where, "access")
            origin = self.side(graw, where, "origin")
            proxy = self.proxy(graw, where, defaults)
            bypass = self.bypass(graw, where)
            experiment = self.experiment(graw, where)
            parts = [name, i, access, origin, proxy, bypass, experiment]
            out.append(BAD if any(p is BAD for p in parts) else Graph(*parts))
        self.cross_checks(raw)
        return out

    def cross_checks(self, raw: list[dict]) -> None:
        """Checks across sides and graphs; they use the raw values that passed their own checks."""
        names: dict[str, str] = {}
        vlans: dict[int, str] = {}
        access_nets: list[tuple[Net, str, str]] = []   # of every graph's access side, see _side_nets
        for i, graw in enumerate(raw):
            where = f"graph[{i}]"
            name = graw.get("name", f"g{i}")
            if isinstance(name, str):
                if name in names:
                    implicit = "" if "name" in graw else f" (the default name of {where}: give it a name)"
                    self.error(f"{where}.name", name, f"already the name of {names[name]}; graph names must "
                               f"be unique{implicit}")
                else:
                    names[name] = where
            sides = {s: graw.get(s) for s in ("access", "origin")}
            for s, sraw in sides.items():
                vlan = sraw.get("vlan") if isinstance(sraw, dict) else None
                if not (_is(vlan, _INT) and 1 <= vlan <= 4094):
                    continue
                field = f"{where}.{s}.vlan"
                if vlan in vlans:
                    first = vlans[vlan]
                    if first == f"{where}.access.vlan":
                        self.error(field, vlan, "same VLAN as the access side; access and origin must be "
                                   "different VLANs")
                    else:
                        self.error(field, vlan, f"already used by {first}; every side of every graph needs "
                                   "a VLAN of its own")
                else:
                    vlans[vlan] = field
            nets = {s: _side_nets(sraw, f"{where}.{s}") for s, sraw in sides.items()}
            for anet, afield, atext in nets["access"]:
                for onet, ofield, otext in nets["origin"]:
                    # The origin side is usually the default route (0.0.0.0/0, ::/0): it contains
                    # the access prefixes on purpose, and the longer access prefix wins.
                    if onet.prefixlen == 0 and anet.prefixlen > 0:
                        continue
                    if anet.version == onet.version and anet.overlaps(onet):
                        self.error(ofield, otext, f'overlaps {afield} = "{atext}"; a network is on the '
                                   "access side or the origin side, not both")
                for other, ofield, otext in access_nets:
                    if anet.version == other.version and anet.overlaps(other):
                        self.error(afield, atext, f'overlaps {ofield} = "{otext}"; subscribers of two '
                                   "graphs cannot share a network")
            access_nets += nets["access"]


def _side_nets(sraw: Any, path: str) -> list[tuple[Net, str, str]]:
    """The networks a side owns, as (network, field, text in the file): its prefixes, and the
    subnets of its addresses that no prefix but a default route covers (they get connected
    routes). Unparsable ones are left out: their own check reported them."""
    if not isinstance(sraw, dict):
        return []
    out: list[tuple[Net, str, str]] = []
    for key in ("prefixes", "addresses"):
        items = sraw.get(key)
        for i, text in enumerate(items if isinstance(items, list) else []):
            if not isinstance(text, str):   # ip_network(1) is 0.0.0.1/32: its own check reported it
                continue
            try:
                net = ipaddress.ip_network(text, strict=key == "prefixes")
            except (ValueError, TypeError):
                continue
            if not any(net.version == n.version and n.prefixlen and net.subnet_of(n) for n, _, _ in out):
                out.append((net, f"{path}.{key}[{i}]", text))
    return out


def _join(where: str, key: str) -> str:
    return f"{where}.{_key_text(key)}" if where else _key_text(key)


def _header(path: str) -> str:
    """graph[1].access -> graph.access: how the table header is written in the file."""
    return re.sub(r"\[\d+\]", "", path)


def _valid_ifname(name: str) -> bool:
    """As the kernel's dev_valid_name, and printable ASCII (no control characters)."""
    return 0 < len(name) < 16 and name not in (".", "..") and re.fullmatch(r"[!-~]+", name) is not None \
        and not re.search(r"[/:]", name)


def _count(ranges) -> int:
    return sum(hi - lo + 1 for lo, hi in ranges)


def _port_range(item: Any) -> tuple[int, int] | str:
    """80, "80" or "8000-8080" -> (lo, hi); otherwise the message saying what is wrong. ASCII digits
    only: int() would read a full-width "80" (U+FF18 U+FF10) as 80."""
    usage = 'use a port 1-65535 or a range like "8000-8080"'
    if _is(item, _STR) and ascii_problem(item):
        return ascii_problem(item)
    m = re.fullmatch(r"[ \t]*([0-9]+)[ \t]*(?:-[ \t]*([0-9]+)[ \t]*)?", item) if _is(item, _STR) else None
    if _is(item, _INT):
        lo = hi = item
    elif m:
        # int() of thousands of digits raises (sys.get_int_max_str_digits): no port has more than 5.
        lo_s, hi_s = m.group(1).lstrip("0") or "0", (m.group(2) or m.group(1)).lstrip("0") or "0"
        if len(lo_s) > 5 or len(hi_s) > 5:
            return f"out of range; {usage}"
        lo, hi = int(lo_s), int(hi_s)
    else:
        return f"not a port; {usage}"
    if not (1 <= lo <= 65535 and 1 <= hi <= 65535):
        return f"out of range; {usage}"
    if lo > hi:
        return f"range runs backwards; write it low-high, \"{hi}-{lo}\""
    return (lo, hi)


def _address_problem(text: str) -> str | None:
    """What is wrong with an interface address like "198.18.0.1/24", or None."""
    if zone_problem(text):
        return zone_problem(text)
    if "/" not in text:
        return "needs its prefix length, e.g. \"198.18.0.1/24\" or \"2001:2:0:1::1/64\""
    try:
        iface = ipaddress.ip_interface(text)
    except ValueError:
        return "not an address with prefix length; write it like \"198.18.0.1/24\" or \"2001:2:0:1::1/64\""
    if kind_problem(iface, "address"):
        return kind_problem(iface, "address")
    net = iface.network
    if net.prefixlen == 0:
        return ("has prefix length 0, which makes every address of its family this side's subnet; give "
                "the length of the subnet it is in, e.g. \"198.18.0.1/24\"")
    # /31, /32, /127 and /128 have no network or broadcast address to avoid.
    if net.num_addresses > 2:
        if iface.ip == net.network_address:
            return f"is the network address of {net}; use a host address in it"
        if iface.version == 4 and iface.ip == net.broadcast_address:
            return f"is the broadcast address of {net}; use a host address in it"
    return None


# --- entry points -----------------------------------------------------------------------------

def parse(text: str, path: str, *, available_cc: set[str] | None = None, host_only: bool = False) -> Config:
    """Check a config's text; path is only used in messages and Config.path. host_only: [host] alone
    (no graphs): enough to find an instance's journal, for a `down` whose config this pepctl no
    longer takes whole."""
    if text.startswith("\ufeff"):   # a byte-order mark, as some Windows editors write: not TOML, harmless
        text = text[1:]
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        msg = str(e)
        m = re.search(r"\s*\(at line (\d+), column (\d+)\)$", msg)
        line = int(m.group(1)) if m else None
        if m:
            msg = f"{msg[: m.start()]} (column {m.group(2)})"
        err = FieldError(path, "", None, f"TOML syntax error: {msg}; fix the syntax", line)
        raise ConfigError([err]) from None
    except ValueError:
        # tomllib's int() of an integer of more than 4,300 digits (sys.get_int_max_str_digits).
        m = re.search(r"[0-9_]{4300}", text)
        line = text.count("\n", 0, m.start()) + 1 if m else None
        err = FieldError(path, "", None, "an integer of thousands of digits; no key takes one: fix the value", line)
        raise ConfigError([err]) from None
    except RecursionError:
        err = FieldError(path, "", None, "arrays or tables nested hundreds deep; no key takes that: fix the value")
        raise ConfigError([err]) from None
    r = _Reader(path, text, available_cc)
    if host_only:
        host = r.host(doc)
        if r.errors:
            raise ConfigError(r.errors)
        return Config(path, host, ())
    r.unknown_keys(doc, "", TOP_KEYS)
    host = r.host(doc)
    defaults = r.defaults_proxy(doc)
    graphs = r.graphs(doc, defaults)
    routing = r.routing(doc, graphs) if "routing" in doc else None
    if host is not BAD and host.metrics_port == 0:
        for g in graphs:
            if g is not BAD and g.experiment.on:
                r.error(f"graph[{g.index}].experiment.control_fraction", g.experiment.control_fraction,
                        "the experiment's flow records are collected by the metrics exporter, which "
                        "host.metrics_port = 0 turns off: give it a port, or set control_fraction = 0")
    if r.errors:
        # In file order, so they read alongside the file; unplaceable ones first.
        raise ConfigError(sorted(r.errors, key=lambda e: e.line or 0))
    return Config(path, host, tuple(graphs), routing, tuple(r.notices))


def load(path: str, *, available_cc: set[str] | None = None, host_only: bool = False) -> Config:
    """Read and check a config file. A missing file raises FileNotFoundError (the CLI says so)."""
    try:
        with open(path, "rb") as f:
            data = f.read(CONFIG_MAX_BYTES + 1)   # -c /dev/zero must not read forever
    except FileNotFoundError:
        raise
    except OSError as e:
        raise ConfigError([FieldError(path, "", None, f"cannot read: {e.strerror}; check the path and "
                                      "its permissions")]) from None
    if len(data) > CONFIG_MAX_BYTES:
        raise ConfigError([FieldError(path, "", None, f"more than {CONFIG_MAX_BYTES >> 20} MiB: not a pepctl config "
                                      "(2,047 graphs, the most there can be, take well under 1 MiB); give the "
                                      "config with -c FILE")])
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise ConfigError([FieldError(path, "", None, "not UTF-8 text; save the file as UTF-8",
                                      line)]) from None
    return parse(text, path, available_cc=available_cc, host_only=host_only)
