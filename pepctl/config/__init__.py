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
with the same rules for the bypass rules of the command line (one grammar: config/rules.py).

What this package cannot know is left to `plan` (pepctl/checks.py): whether the
NIC exists, the open-file limit, the filesystems of run_dir and bpf_dir, other
instances, and (when the caller does not pass available_cc) which congestion
controls the kernel has. etc/pep.example.toml documents every key.

The package, along its seams (no module imports a private name of another):

    model.py    the dataclasses parse() returns, FieldError and ConfigError
    schema.py   every key, its default and the bounds that need no host
    values.py   value rules: ASCII, address kinds, ports, paths, names that must fit
    rules.py    the bypass rules' grammar, shared with `pepctl bypass`
    reader.py   the generic reader: line index, typed getters, unknown keys
    host.py     [host]
    sides.py    [graph.access], [graph.origin]
    graphs.py   [[graph]], [defaults.proxy], and the checks across graphs
    routing.py  [routing] (its dataclasses: pepctl/routing.py)
    entry.py    parse() and load()
"""

from .entry import load, parse
from .model import (
    Addr,
    Bypass,
    Config,
    ConfigError,
    Experiment,
    FieldError,
    Graph,
    Host,
    Iface,
    Net,
    Proxy,
    Side,
    Tuning,
    toml_value,
)
from .schema import (
    BYPASS_KEYS,
    HOST_KEYS,
    MAXCONN_MAX,
    OWN_CONGESTION,
    PROXY_KEYS,
    SIDE_KEYS,
    STATS_SOCKET_MAX,
    TUNING_KEYS,
)
from .values import run_dir_max, stats_socket, supervisor_unit_len

__all__ = ["BYPASS_KEYS", "HOST_KEYS", "MAXCONN_MAX", "OWN_CONGESTION", "PROXY_KEYS", "SIDE_KEYS",
           "STATS_SOCKET_MAX", "TUNING_KEYS", "Addr", "Bypass", "Config", "ConfigError", "Experiment", "FieldError",
           "Graph", "Host", "Iface", "Net", "Proxy", "Side", "Tuning", "load", "parse", "run_dir_max", "stats_socket",
           "supervisor_unit_len", "toml_value"]
