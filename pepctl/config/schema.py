"""The config's schema: every key, its default, and the bounds that need no host to check.

etc/pep.example.toml documents every key.
"""

from __future__ import annotations

import re
from typing import Any

from .. import radio_maps

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
DIR_DEFAULTS = {"run_dir": "/run/pep", "bpf_dir": "/sys/fs/bpf/pep"}
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
    # issue 26: what the split hides (docs/transparency.md)
    "source_port": "kept",  # "any": a spare port (docs/transparency.md)
    "mptcp": "bypass",
    "handshake": None,      # "honest" in mode bpf, which alone can make it; "early" otherwise
}
PROXY_KEYS = tuple(PROXY_DEFAULTS)
# The access side's default is pepctl's own pep_radio: bench responsiveness measured it, BBR and
# end-to-end CUBIC side by side on trace-driven radio links, and it alone kept small requests near
# the idle link's latency under a download (docs/measured.md, congestion/README.md "Why it is the
# default"). Toward origins, CUBIC.
DEFAULT_CONGESTION = {"access": radio_maps.NAME, "origin": "cubic"}
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

# Paths. HAProxy binds its stats socket (pepctl/names.py haproxy_sock)
# by way of "<path>.<pid>.tmp" (its sock_unix.c), and that name must fit sun_path: 108 bytes with
# the NUL. Pids go up to 4194304 (PID_MAX_LIMIT), so the socket path itself may have at most
# 107 - len(".4194304.tmp") = 95 bytes. run_dir_max() is what that leaves run_dir.
UNIX_PATH_MAX = 107
STATS_SOCKET_MAX = UNIX_PATH_MAX - len(".4194304.tmp")
UNIT_NAME_MAX = 255       # systemd's longest unit name: the supervisor's holds run_dir (names.unit_name)
PATH_LEN_MAX = 255        # run_dir, bpf_dir: NAME_MAX, so no pin path (bpf_dir/INSTANCE/flow/maps/NAME) nears PATH_MAX
PATH_CHARS = "letters, digits, '.', '_', '-' and '/'"   # POSIX's portable file name characters
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
