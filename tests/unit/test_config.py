"""pepctl's config file: what loads, what each malformed config says.

Every malformed config is the valid BASE config with a few text edits. The test
checks that the error names the field and shows the value, the way a user
reads it (`graph[0].access.vlan = 4095: ...`), on the line it is on, in ASCII,
and that the message says what to do. The cases cover issue 13's defects of the
config itself: address kinds (multicast, link-local, zone ids, IPv4-mapped,
loopback, unspecified, reserved), numeric bounds (maxconn's ceiling), ASCII only
(full-width digits), and run_dir/bpf_dir (characters, "..", the length the
stats socket and the systemd unit allow). No root, no files outside a temp folder.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import tempfile

import pytest

from netns.configs import one_graph, second_graph, toml_text
from netns.lab import Lab
from pepctl import names, radio_maps
from pepctl.config import (
    MAXCONN_MAX,
    STATS_SOCKET_MAX,
    ConfigError,
    FieldError,
    load,
    parse,
    run_dir_max,
    stats_socket,
    supervisor_unit_len,
    toml_value,
)
from pepctl.config.schema import ENUMS

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PATH = "/etc/pep/pep.toml"
CC = {"reno", "bbr", "cubic"}

# The one-graph config of netns/configs.py, its lines as numbered below.
BASE = toml_text(one_graph(proxy={"ports": [80, 443]}))
# Appended by cases that need a second graph.
GRAPH2 = "\n" + toml_text({"graph": [second_graph()]})


def edit(*pairs: tuple[str, str], extra: str = "", base: str = BASE) -> str:
    text = base
    for old, new in pairs:
        assert old in text, f"test bug: {old!r} not in the base config"
        text = text.replace(old, new, 1)
    return text + extra


# Where a case adds a line, and the line it lands on: [host] line 4, after the access vlan line 9,
# after the origin vlan line 12, in place of the proxy's ports line 14, a [graph.bypass] line 16.
def in_host(line: str) -> str:
    return edit(('nic = "eth1"', 'nic = "eth1"\n' + line))


def in_access(line: str) -> str:
    return edit(("vlan = 100", "vlan = 100\n" + line))


def in_origin(line: str) -> str:
    return edit(("vlan = 200", "vlan = 200\n" + line))


def in_proxy(line: str) -> str:
    return edit(("ports = [80, 443]", line))


def in_bypass(line: str) -> str:
    return edit(extra="[graph.bypass]\n" + line + "\n")


def access_address(text: str) -> str:
    """The access side's first address replaced (line 9)."""
    return edit(('"198.18.0.1/24", "2001', f'"{text}", "2001'))


def errors_of(text: str, available_cc=CC) -> list[FieldError]:
    with pytest.raises(ConfigError) as exc:
        parse(text, PATH, available_cc=available_cc)
    return exc.value.errors


LONG_RUN = "/run/" + "a" * 59   # 64 bytes: + "/pep1/proxy/haproxy.s999999.sock" makes 96, one more than 95

# (case id, config text, field, value as shown (None: no value), line (None: it cannot be known),
#  words the message must contain)
MALFORMED = [
    ("toml syntax", edit(("vlan = 100", "vlan = ")), "", None, 8, "TOML syntax error"),
    ("unknown top-level table", edit(extra='[hots]\nnic = "x"\n'), "hots", '{ nic = "x" }', 15, "'host'"),
    ("unknown host key", edit(('nic = "eth1"', 'nic = "eth1"\nrun_dri = "/run/x"')),
     "host.run_dri", '"/run/x"', 4, "did you mean 'run_dir'"),
    ("unknown side key", edit(("vlan = 100", "vlan = 100\nvlna = 3")), "graph[0].access.vlna", "3", 9,
     "did you mean 'vlan'"),
    ("unknown proxy key", edit(("ports = [80, 443]", 'splcie = "auto"')), "graph[0].proxy.splcie",
     '"auto"', 14, "did you mean 'splice'"),
    ("unknown tuning key", edit(extra='[host.tuning]\nirq = false\n'), "host.tuning.irq", "false", 16,
     "did you mean 'irq_affinity'"),
    ("missing host table", edit(('[host]\ninstance = "pep1"\nnic = "eth1"\n', "")), "host", None, None,
     "add a [host] table"),
    ("missing nic", edit(('nic = "eth1"\n', "")), "host.nic", None, 1, "add `nic = "),
    ("missing vlan", edit(("vlan = 200\n", "")), "graph[0].origin.vlan", None, 10, "add `vlan = "),
    ("missing addresses", edit(('addresses = ["198.19.0.1/24", "2001:2:0:2::1/64"]\n', "")),
     "graph[0].origin.addresses", None, 10, "missing"),
    ("missing access table", edit(('[graph.access]\nvlan = 100\naddresses = ["198.18.0.1/24", '
                                   '"2001:2:0:1::1/64"]\n', "")),
     "graph[0].access", None, 5, "add a [graph.access] table"),
    ("vlan is a string", edit(("vlan = 100", 'vlan = "100"')), "graph[0].access.vlan", '"100"', 8,
     "must be an integer"),
    ("vlan is a float", edit(("vlan = 100", "vlan = 100.5")), "graph[0].access.vlan", "100.5", 8,
     "must be an integer"),
    ("enabled is a string", edit(("ports = [80, 443]", 'enabled = "yes"')), "graph[0].proxy.enabled",
     '"yes"', 14, "true or false"),
    ("addresses is a string", edit(('addresses = ["198.18.0.1/24", "2001:2:0:1::1/64"]',
                                    'addresses = "198.18.0.1/24"')),
     "graph[0].access.addresses", '"198.18.0.1/24"', 9, "must be a list"),
    ("instance upper case", edit(('instance = "pep1"', 'instance = "Pep1"')), "host.instance", '"Pep1"', 2,
     "a-z"),
    ("instance too long", edit(('instance = "pep1"', 'instance = "pep1234567"')), "host.instance",
     '"pep1234567"', 2, "1-9 characters"),
    ("instance starts with a digit", edit(('instance = "pep1"', 'instance = "1pep"')), "host.instance",
     '"1pep"', 2, "starting with a letter"),
    ("bad nic name", edit(('nic = "eth1"', 'nic = "eth 1"')), "host.nic", '"eth 1"', 3, "interface name"),
    ("relative run_dir", edit(('nic = "eth1"', 'nic = "eth1"\nrun_dir = "run/pep"')), "host.run_dir",
     '"run/pep"', 4, "absolute path"),
    ("vlan 0", edit(("vlan = 100", "vlan = 0")), "graph[0].access.vlan", "0", 8, "use 1-4094"),
    ("vlan 4095", edit(("vlan = 200", "vlan = 4095")), "graph[0].origin.vlan", "4095", 11, "use 1-4094"),
    ("duplicate vlan across graphs", edit(extra=GRAPH2.replace("vlan = 201", "vlan = 100")),
     "graph[1].origin.vlan", "100", 22, "already used by graph[0].access.vlan"),
    ("access vlan == origin vlan", edit(("vlan = 200", "vlan = 100")), "graph[0].origin.vlan", "100", 11,
     "different VLANs"),
    ("bad address", edit(('"198.18.0.1/24", "2001', '"198.18.0.300/24", "2001')),
     "graph[0].access.addresses[0]", '"198.18.0.300/24"', 9, "not an address"),
    ("address without prefix length", edit(('"198.18.0.1/24", "2001', '"198.18.0.1", "2001')),
     "graph[0].access.addresses[0]", '"198.18.0.1"', 9, "prefix length"),
    ("address is the network address", edit(('"198.18.0.1/24", "2001', '"198.18.0.0/24", "2001')),
     "graph[0].access.addresses[0]", '"198.18.0.0/24"', 9, "network address"),
    ("bad prefix", edit(("vlan = 100", 'vlan = 100\nprefixes = ["198.18.0.0/33"]')),
     "graph[0].access.prefixes[0]", '"198.18.0.0/33"', 9, "not a network"),
    ("prefix with host bits", edit(("vlan = 100", 'vlan = 100\nprefixes = ["198.18.0.1/24"]')),
     "graph[0].access.prefixes[0]", '"198.18.0.1/24"', 9, '"198.18.0.0/24"'),
    ("bad gateway", edit(("vlan = 200", 'vlan = 200\ngateways = ["198.19.0.x"]')),
     "graph[0].origin.gateways[0]", '"198.19.0.x"', 12, "not an IP address"),
    ("gateway outside the subnets", edit(("vlan = 200", 'vlan = 200\ngateways = ["198.20.0.1"]')),
     "graph[0].origin.gateways[0]", '"198.20.0.1"', 12, "not inside any subnet"),
    ("gateway is our own address", edit(("vlan = 200", 'vlan = 200\ngateways = ["198.19.0.1"]')),
     "graph[0].origin.gateways[0]", '"198.19.0.1"', 12, "own address"),
    ("two gateways of one family", edit(("vlan = 200", 'vlan = 200\ngateways = ["198.19.0.2", "198.19.0.3"]')),
     "graph[0].origin.gateways[1]", '"198.19.0.3"', 12, "at most one gateway per address family"),
    ("prefix needs a gateway", edit(("vlan = 200", 'vlan = 200\nprefixes = ["0.0.0.0/0"]')),
     "graph[0].origin.prefixes[0]", '"0.0.0.0/0"', 12, "no IPv4 gateway"),
    ("access and origin prefixes overlap", edit(("vlan = 200", 'vlan = 200\nprefixes = ["198.18.0.0/16"]\n'
                                                 'gateways = ["198.19.0.254"]')),
     "graph[0].origin.prefixes[0]", '"198.18.0.0/16"', 12, "overlaps graph[0].access.addresses[0]"),
    ("origin subnet overlaps access", edit(('"198.19.0.1/24", "2001:2:0:2::1/64"', '"198.18.0.200/16"')),
     "graph[0].origin.addresses[0]", '"198.18.0.200/16"', 12, "not both"),
    ("access prefixes of two graphs overlap",
     edit(extra=GRAPH2.replace('"198.18.1.1/24"', '"198.18.0.129/25"')),
     "graph[1].access.addresses[0]", '"198.18.0.129/25"', 20, "overlaps graph[0].access.addresses[0]"),
    ("congctl the kernel lacks", edit(("vlan = 100", 'vlan = 100\ncongctl = "vegas"')),
     "graph[0].access.congctl", '"vegas"', 9, "bbr, cubic, reno"),
    ("congestion the kernel lacks", in_access('congestion = "vegas"'), "graph[0].access.congestion", '"vegas"', 9,
     "use one of bbr, cubic, reno, or pep_radio (pepctl's own"),
    ("congestion not a name", in_access('congestion = "BBR!"'), "graph[0].access.congestion", '"BBR!"', 9,
     "not a congestion control name"),
    ("congestion and its old name congctl both", in_access('congestion = "bbr"\ncongctl = "bbr"'),
     "graph[0].access.congctl", '"bbr"', 10, "congctl is the old name of congestion: keep only `congestion`"),
    ("pep_radio toward the origin", in_origin('congestion = "pep_radio"'), "graph[0].origin.congestion",
     '"pep_radio"', 12, "pep_radio is the access side's congestion control"),
    ("queue target without pep_radio", in_access('congestion = "bbr"\nqueue_target_ms = 50'),
     "graph[0].access.queue_target_ms", "50", 10,
     'this side\'s congestion is "bbr": set congestion = "pep_radio" in [graph.access], or remove'),
    ("queue target 0", in_access('congestion = "pep_radio"\nqueue_target_ms = 0'), "graph[0].access.queue_target_ms",
     "0", 10, "use 1-1000 milliseconds"),
    ("queue target above a second", in_access('congestion = "pep_radio"\nqueue_target_ms = 1001'),
     "graph[0].access.queue_target_ms", "1001", 10, "use 1-1000 milliseconds"),
    ("queue target a string", in_access('congestion = "pep_radio"\nqueue_target_ms = "40ms"'),
     "graph[0].access.queue_target_ms", '"40ms"', 10, "must be an integer"),
    ("queue target on the origin side", in_origin("queue_target_ms = 40"), "graph[0].origin.queue_target_ms", "40",
     12, "only the access side runs pep_radio"),
    ("initcwnd too large", edit(("vlan = 100", "vlan = 100\ninitcwnd = 1000")), "graph[0].access.initcwnd",
     "1000", 9, "1-256"),
    ("initcwnd negative", edit(("vlan = 200", "vlan = 200\ninitcwnd = -1")), "graph[0].origin.initcwnd",
     "-1", 12, "0 for the kernel's"),
    ("initcwnd not a number", edit(("vlan = 100", 'vlan = 100\ninitcwnd = "big"')), "graph[0].access.initcwnd",
     '"big"', 9, "must be an integer"),
    ("port 0", edit(("ports = [80, 443]", "ports = [80, 0]")), "graph[0].proxy.ports[1]", "0", 14, "1-65535"),
    ("port 65536", edit(("ports = [80, 443]", "ports = [65536]")), "graph[0].proxy.ports[0]", "65536", 14,
     "1-65535"),
    ("backwards range", edit(("ports = [80, 443]", 'ports = ["90-80"]')), "graph[0].proxy.ports[0]",
     '"90-80"', 14, '"80-90"'),
    ("port not a number", edit(("ports = [80, 443]", 'ports = ["x"]')), "graph[0].proxy.ports[0]", '"x"', 14,
     "not a port"),
    ("ports neither all nor list", edit(("ports = [80, 443]", 'ports = "most"')), "graph[0].proxy.ports",
     '"most"', 14, '"all" or a list'),
    ("route mode with all ports", edit(("ports = [80, 443]", 'interception = "route"\nports = "all"')),
     "graph[0].proxy.ports", '"all"', 15, "needs a list of ports"),
    ("listen_port is intercepted", edit(("ports = [80, 443]", 'ports = [80, "50000-50100"]')),
     "graph[0].proxy.listen_port", "50080", 13, "outside ports"),
    ("metrics_port in a graph", edit(("ports = [80, 443]", "metrics_port = 50080")),
     "graph[0].proxy.metrics_port", "50080", 14, "moved to [host]"),
    ("bad metrics address", edit(('nic = "eth1"', 'nic = "eth1"\nmetrics_address = "localhost"')),
     "host.metrics_address", '"localhost"', 4, "not an IP address"),
    ("metrics port out of range", edit(('nic = "eth1"', 'nic = "eth1"\nmetrics_port = 70000')),
     "host.metrics_port", "70000", 4, "1-65535"),
    ("unknown supervisor", edit(('nic = "eth1"', 'nic = "eth1"\nsupervisor = "runit"')),
     "host.supervisor", '"runit"', 4, '"auto", "systemd", "pepctl"'),
    ("unknown splice", edit(("ports = [80, 443]", 'splice = "yes"')), "graph[0].proxy.splice", '"yes"', 14,
     '"both", "auto", "off"'),
    ("unknown mode", edit(("ports = [80, 443]", 'mode = "udp"')), "graph[0].proxy.mode", '"udp"', 14,
     '"tcp", "http"'),
    ("unknown interception", edit(("ports = [80, 443]", 'interception = "ebpf"')),
     "graph[0].proxy.interception", '"ebpf"', 14, '"bpf", "nft", "route"'),
    ("duplicate graph names", edit(extra=GRAPH2.replace('name = "g2"', 'name = "g1"')), "graph[1].name",
     '"g1"', 17, "already the name of graph[0]"),
    ("default name collides", edit(('name = "g1"', 'name = "g1"')) + GRAPH2.replace('name = "g2"\n', ""),
     "graph[1].name", '"g1"', 16, "default name"),
    ("bad graph name", edit(('name = "g1"', 'name = "G_1"')), "graph[0].name", '"G_1"', 6, "a-z, 0-9"),
    ("no graphs", BASE.split("[[graph]]")[0], "graph", None, None, "add at least one [[graph]]"),
    ("[graph] instead of [[graph]]", BASE.replace("[[graph]]", "[graph]"), "graph", None, 5, "write [[graph]]"),
    ("threads in a graph", edit(("ports = [80, 443]", "threads = 2")), "graph[0].proxy.threads", "2", 14,
     "moved to [host]"),
    ("negative threads", edit(('nic = "eth1"', 'nic = "eth1"\nthreads = -1')), "host.threads", "-1", 4,
     "0 for one per CPU"),
    ("too many threads", edit(('nic = "eth1"', 'nic = "eth1"\nthreads = 65')), "host.threads", "65", 4,
     "1-64"),
    ("negative host maxconn", edit(('nic = "eth1"', 'nic = "eth1"\nmaxconn = -5')), "host.maxconn", "-5", 4,
     "must not be negative"),
    ("bpf listen_port intercepted", edit(("ports = [80, 443]", "ports = [80, 50080]")),
     "graph[0].proxy.listen_port", "50080", 13, "is also an intercepted port"),
    ("negative maxconn", edit(("ports = [80, 443]", "maxconn = -1")), "graph[0].proxy.maxconn", "-1", 14,
     "must not be negative"),
    ("bad default", edit(extra='[defaults.proxy]\nmode = "udp"\n'), "defaults.proxy.mode", '"udp"', 16,
     '"tcp", "http"'),
    # --- address kinds: where an address, gateway, route or bypass rule cannot be of that kind ---
    ("address multicast", access_address("224.0.0.1/24"), "graph[0].access.addresses[0]", '"224.0.0.1/24"', 9,
     "is multicast (224.0.0.0/4)"),
    ("address IPv6 multicast", access_address("ff02::1/64"), "graph[0].access.addresses[0]", '"ff02::1/64"', 9,
     "is multicast (ff00::/8)"),
    ("address IPv4 link-local", access_address("169.254.0.1/16"), "graph[0].access.addresses[0]",
     '"169.254.0.1/16"', 9, "is link-local (169.254.0.0/16)"),
    ("address IPv6 link-local", access_address("fe80::1/64"), "graph[0].access.addresses[0]", '"fe80::1/64"', 9,
     "is link-local (fe80::/10)"),
    ("address with a zone id", access_address("fe80::1%eth0/64"), "graph[0].access.addresses[0]",
     '"fe80::1%eth0/64"', 9, 'write it without "%eth0"'),
    ("address with a zone id, global", access_address("2001:2:0:1::1%1/64"), "graph[0].access.addresses[0]",
     '"2001:2:0:1::1%1/64"', 9, 'has a zone id, "%1"'),
    ("address IPv4-mapped", access_address("::ffff:198.18.0.1/120"), "graph[0].access.addresses[0]",
     '"::ffff:198.18.0.1/120"', 9, 'is IPv4-mapped (::ffff:0:0/96): it stands for an IPv4 address inside a host '
     'and never appears on a link; write it as IPv4, "198.18.0.1/24"'),
    ("address loopback", access_address("127.0.0.1/8"), "graph[0].access.addresses[0]", '"127.0.0.1/8"', 9,
     "is loopback (127.0.0.0/8)"),
    ("address IPv6 loopback", access_address("::1/128"), "graph[0].access.addresses[0]", '"::1/128"', 9,
     "is loopback (::1)"),
    ("address unspecified", access_address("0.0.0.0/32"), "graph[0].access.addresses[0]", '"0.0.0.0/32"', 9,
     "is unspecified (0.0.0.0)"),
    ("address IPv6 unspecified", access_address("::/128"), "graph[0].access.addresses[0]", '"::/128"', 9,
     "is unspecified (::)"),
    ("address reserved", access_address("240.0.0.1/24"), "graph[0].access.addresses[0]", '"240.0.0.1/24"', 9,
     "is reserved (240.0.0.0/4)"),
    ("address broadcast", access_address("255.255.255.255/32"), "graph[0].access.addresses[0]",
     '"255.255.255.255/32"', 9, "is broadcast (255.255.255.255)"),
    ("address with prefix length 0", access_address("198.18.0.1/0"), "graph[0].access.addresses[0]",
     '"198.18.0.1/0"', 9, "prefix length 0"),
    ("gateway multicast", in_origin('gateways = ["224.0.0.2"]'), "graph[0].origin.gateways[0]", '"224.0.0.2"', 12,
     "is multicast"),
    ("gateway link-local", in_origin('gateways = ["fe80::1"]'), "graph[0].origin.gateways[0]", '"fe80::1"', 12,
     "is link-local (fe80::/10)"),
    ("gateway with a zone id", in_origin('gateways = ["fe80::1%eth0"]'), "graph[0].origin.gateways[0]",
     '"fe80::1%eth0"', 12, "has a zone id"),
    ("gateway IPv4-mapped", in_origin('gateways = ["::ffff:198.19.0.254"]'), "graph[0].origin.gateways[0]",
     '"::ffff:198.19.0.254"', 12, 'write it as IPv4, "198.19.0.254"'),
    ("gateway is the broadcast address", in_origin('gateways = ["198.19.0.255"]'), "graph[0].origin.gateways[0]",
     '"198.19.0.255"', 12, "is the broadcast address of 198.19.0.0/24"),
    ("gateway is the network address", in_origin('gateways = ["198.19.0.0"]'), "graph[0].origin.gateways[0]",
     '"198.19.0.0"', 12, "is the network address of 198.19.0.0/24"),
    ("gateway unspecified", in_origin('gateways = ["::"]'), "graph[0].origin.gateways[0]", '"::"', 12,
     "is unspecified"),
    ("prefix multicast", in_origin('prefixes = ["224.0.0.0/4"]'), "graph[0].origin.prefixes[0]", '"224.0.0.0/4"',
     12, "is multicast"),
    ("prefix link-local", in_access('prefixes = ["198.18.0.0/24", "fe80::/64"]'), "graph[0].access.prefixes[1]",
     '"fe80::/64"', 9, "is link-local"),
    ("prefix unspecified host", in_origin('prefixes = ["0.0.0.0/32"]'), "graph[0].origin.prefixes[0]",
     '"0.0.0.0/32"', 12, "a default route is 0.0.0.0/0 or ::/0"),
    ("prefix with a zone id", in_access('prefixes = ["2001:2:0:1::%eth0/64"]'), "graph[0].access.prefixes[0]",
     '"2001:2:0:1::%eth0/64"', 9, "has a zone id"),
    ("prefix loopback", in_origin('prefixes = ["127.0.0.0/8"]'), "graph[0].origin.prefixes[0]", '"127.0.0.0/8"',
     12, "is loopback"),
    ("bypass client multicast", in_bypass('clients = ["224.0.0.0/24"]'), "graph[0].bypass.clients[0]",
     '"224.0.0.0/24"', 16, "no subscriber's TCP flow comes from it"),
    ("bypass server IPv4-mapped", in_bypass('servers = ["::ffff:198.19.0.0/120"]'), "graph[0].bypass.servers[0]",
     '"::ffff:198.19.0.0/120"', 16, 'write it as IPv4, "198.19.0.0/24"'),
    ("bypass client zone id", in_bypass('clients = ["fe80::%eth0/64"]'), "graph[0].bypass.clients[0]",
     '"fe80::%eth0/64"', 16, "has a zone id"),
    ("bypass server link-local", in_bypass('servers = ["169.254.0.0/16"]'), "graph[0].bypass.servers[0]",
     '"169.254.0.0/16"', 16, "no TCP flow goes to it"),
    ("metrics address multicast", in_host('metrics_address = "ff02::1"'), "host.metrics_address", '"ff02::1"', 4,
     "is multicast"),
    ("metrics address zone id", in_host('metrics_address = "fe80::1%eth0"'), "host.metrics_address",
     '"fe80::1%eth0"', 4, "has a zone id"),
    # --- numeric bounds, booleans as integers ---
    ("host maxconn 2^63-1", in_host("maxconn = 9223372036854775807"), "host.maxconn", "9223372036854775807", 4,
     "use at most 800000000"),
    ("host maxconn 10^12", in_host("maxconn = 1_000_000_000_000"), "host.maxconn", "1000000000000", 4,
     "too large"),
    ("graph maxconn 10^12", in_proxy("maxconn = 1000000000000"), "graph[0].proxy.maxconn", "1000000000000", 14,
     "use at most 800000000"),
    ("default maxconn 2^31", edit(extra="[defaults.proxy]\nmaxconn = 2147483648\n"), "defaults.proxy.maxconn",
     "2147483648", 16, "too large"),
    ("maxconn a boolean", in_host("maxconn = true"), "host.maxconn", "true", 4,
     "must be an integer, not true or false"),
    ("threads huge", in_host("threads = 100000000000000000000"), "host.threads", "100000000000000000000", 4,
     "1-64"),
    ("initcwnd a boolean", in_access("initcwnd = true"), "graph[0].access.initcwnd", "true", 9,
     "must be an integer, not true or false"),
    ("listen_port huge", in_proxy("listen_port = 9223372036854775807"), "graph[0].proxy.listen_port",
     "9223372036854775807", 14, "not a TCP port"),
    ("metrics_port negative", in_host("metrics_port = -1"), "host.metrics_port", "-1", 4, "1-65535"),
    ("vlan 2^64", edit(("vlan = 100", "vlan = 18446744073709551616")), "graph[0].access.vlan",
     "18446744073709551616", 8, "use 1-4094"),
    ("port a boolean", in_proxy("ports = [true]"), "graph[0].proxy.ports[0]", "true", 14, "not a port"),
    ("port of 20 digits", in_proxy('ports = ["80-99999999999999999999"]'), "graph[0].proxy.ports[0]",
     '"80-99999999999999999999"', 14, "out of range"),
    ("integer of 5000 digits", edit(("vlan = 200", "vlan = " + "9" * 5000)), "", None, 11,
     "an integer of thousands of digits"),
    ("nested hundreds deep", in_host("maxconn = " + "[" * 2000 + "]" * 2000), "", None, None,
     "nested hundreds deep"),
    # --- ASCII only: keys, names, enums, addresses, ports ---
    ("full-width port", in_proxy('ports = ["\uff18\uff10"]'), "graph[0].proxy.ports[0]", r'"\uff18\uff10"', 14,
     'U+FF18 FULLWIDTH DIGIT EIGHT (character 1); write it in ASCII, "80"'),
    ("full-width address", access_address("\uff11\uff19\uff18.18.0.1/24"), "graph[0].access.addresses[0]",
     r'"\uff11\uff19\uff18.18.0.1/24"', 9, 'non-ASCII character, U+FF11 FULLWIDTH DIGIT ONE (character 1); '
     'write it in ASCII, "198.18.0.1/24"'),
    ("no-break space in an address", access_address("198.18.0.1/24\u00a0"), "graph[0].access.addresses[0]",
     r'"198.18.0.1/24\u00a0"', 9, 'U+00A0 NO-BREAK SPACE (character 14); write it in ASCII, "198.18.0.1/24"'),
    ("full-width key", in_host('"\uff4e\uff49\uff43" = "eth2"'), r'host."\uff4e\uff49\uff43"', '"eth2"', 1,
     'unknown key: it has a non-ASCII character, U+FF4E FULLWIDTH LATIN SMALL LETTER N (character 1); write it in '
     'ASCII, "nic"'),
    ("non-ASCII graph name", edit(('name = "g1"', 'name = "g\u00b9"')), "graph[0].name", r'"g\u00b9"', 6,
     'U+00B9 SUPERSCRIPT ONE'),
    ("non-ASCII instance", edit(('instance = "pep1"', 'instance = "p\u0435p1"')), "host.instance",
     r'"p\u0435p1"', 2, "U+0435 CYRILLIC SMALL LETTER IE"),
    ("full-width enum", in_proxy('mode = "\uff54\uff43\uff50"'), "graph[0].proxy.mode", r'"\uff54\uff43\uff50"',
     14, 'write it in ASCII, "tcp"'),
    ("full-width all", in_proxy('ports = "\uff41\uff4c\uff4c"'), "graph[0].proxy.ports", r'"\uff41\uff4c\uff4c"',
     14, 'write it in ASCII, "all"'),
    ("non-ASCII congctl", in_access('congctl = "bbr\u200b"'), "graph[0].access.congctl", r'"bbr\u200b"', 9,
     "U+200B ZERO WIDTH SPACE"),
    ("non-ASCII nic", edit(('nic = "eth1"', 'nic = "eth\uff11"')), "host.nic", r'"eth\uff11"', 3,
     'write it in ASCII, "eth1"'),
    ("control character in nic", edit(('nic = "eth1"', 'nic = "eth\\u00011"')), "host.nic", r'"eth\u00011"', 3,
     "not a valid interface name"),
    ("full-width bypass port", in_bypass('ports = ["\uff14\uff14\uff13"]'), "graph[0].bypass.ports[0]",
     r'"\uff14\uff14\uff13"', 16, 'write it in ASCII, "443"'),
    # --- run_dir and bpf_dir ---
    ("run_dir with ..", in_host('run_dir = "/run/../pep"'), "host.run_dir", '"/run/../pep"', 4,
     'has a ".." folder in it'),
    ("run_dir with a space", in_host('run_dir = "/run/my pep"'), "host.run_dir", '"/run/my pep"', 4,
     "has a space (character 8)"),
    ("run_dir with a newline", in_host('run_dir = "/run/pep\\n"'), "host.run_dir", r'"/run/pep\n"', 4,
     "has a newline"),
    ("run_dir with a NUL", in_host('run_dir = "/run/p\\u0000ep"'), "host.run_dir", r'"/run/p\u0000ep"', 4,
     "has a NUL"),
    ("run_dir with #", in_host('run_dir = "/run/pep#1"'), "host.run_dir", '"/run/pep#1"', 4,
     "use only letters, digits, '.', '_', '-' and '/'"),
    ("run_dir non-ASCII", in_host('run_dir = "/run/p\u00e9p"'), "host.run_dir", r'"/run/p\u00e9p"', 4,
     "U+00E9 LATIN SMALL LETTER E WITH ACUTE"),
    ("run_dir is /", in_host('run_dir = "/"'), "host.run_dir", '"/"', 4, "is the root folder"),
    ("run_dir too long for the stats socket", in_host(f'run_dir = "{LONG_RUN}"'), "host.run_dir",
     f'"{LONG_RUN}"', 4, "would be 96 bytes, and a socket path can have at most 95"),
    ("run_dir too long for systemd", in_host('run_dir = "/r' + "-" * 60 + '"'), "host.run_dir",
     '"/r' + "-" * 60 + '"', 4, "too long for systemd"),
    ("bpf_dir too long", in_host('bpf_dir = "/sys/fs/bpf/' + "b" * 250 + '"'), "host.bpf_dir",
     '"/sys/fs/bpf/' + "b" * 250 + '"', 4, "use at most 255"),
    ("bpf_dir relative", in_host('bpf_dir = "sys/fs/bpf/pep"'), "host.bpf_dir", '"sys/fs/bpf/pep"', 4,
     "must be an absolute path"),
    ("run_dir is bpf_dir", in_host('run_dir = "/sys/fs/bpf/pep/"'), "host.run_dir", '"/sys/fs/bpf/pep/"', 4,
     "is the same folder as bpf_dir"),
    ("run_dir inside bpf_dir", in_host('run_dir = "/sys/fs/bpf/pep/run"'), "host.run_dir",
     '"/sys/fs/bpf/pep/run"', 4, "is inside bpf_dir"),
]


@pytest.mark.parametrize("text,field,value,line,words", [c[1:] for c in MALFORMED], ids=[c[0] for c in MALFORMED])
def test_malformed_config_names_field_and_value(text, field, value, line, words):
    errors = errors_of(text)
    shown = [str(e) for e in errors]
    match = [e for e in errors if e.field == field]
    assert match, f"no error on field {field!r}; got:\n" + "\n".join(shown)
    e = match[0]
    if value is None:
        assert e.value is None or field == "graph", f"{field}: expected no value, got {e.value!r}"
    else:
        assert toml_value(e.value) == value, f"{field}: value shown {toml_value(e.value)}, expected {value}"
        assert f"{field} = {value}: " in str(e), f"message does not show field and value: {e}"
    assert words in e.message, f"{field}: message {e.message!r} lacks {words!r}"
    assert e.line == line, f"{field}: line {e.line}, expected {line}: {e}"
    where = f"{PATH}:{line}: " if line else f"{PATH}: "
    assert str(e).startswith(where), f"message does not start with {where!r}: {e}"
    assert str(e).isascii(), f"message is not ASCII (a terminal may not show it): {e!r}"


def test_there_are_enough_malformed_cases():
    assert len(MALFORMED) >= 60, f"{len(MALFORMED)} malformed configs; issue 13 asks for at least 60"
    ids = [c[0] for c in MALFORMED]
    assert len(set(ids)) == len(ids), "two cases share an id"


def test_message_format_with_line_number():
    text = edit(("vlan = 100", "vlan = 4095"))
    (e,) = errors_of(text)
    assert str(e) == f"{PATH}:8: graph[0].access.vlan = 4095: not a usable VLAN id; use 1-4094"


def test_syntax_error_names_the_line():
    (e,) = errors_of(edit(("vlan = 200", "vlan = = 200")))
    assert e.line == 11, str(e)
    assert str(e).startswith(f"{PATH}:11: TOML syntax error: "), str(e)


def test_lines_of_second_graph_and_list_items():
    text = edit(extra=GRAPH2.replace('"198.18.1.1/24"', '"198.18.1.300/24"').replace("vlan = 201", "vlan = 0"))
    lines = {e.field: e.line for e in errors_of(text)}
    want = {"graph[1].access.addresses[0]": 20, "graph[1].origin.vlan": 22}
    assert lines == want, f"lines: got {lines}, expected {want}"


def test_all_errors_are_collected_in_file_order():
    text = edit(('instance = "pep1"', 'instance = "P"'), ("vlan = 100", "vlan = 0"),
                ("ports = [80, 443]", 'splice = "fast"'))
    errors = errors_of(text)
    assert [e.field for e in errors] == ["host.instance", "graph[0].access.vlan", "graph[0].proxy.splice"]
    assert str(ConfigError(errors)).count("\n") == 2


def test_congestion_unchecked_without_available_cc():
    cfg = parse(in_access('congestion = "vegas"'), PATH)
    assert cfg.graphs[0].access.congestion == "vegas"


def test_old_name_congctl_still_works_with_a_notice():
    """congctl is read as congestion; the notice (plan and up print it) names file, line and field."""
    cfg = parse(in_access('congctl = "cubic"'), PATH, available_cc=CC)
    assert cfg.graphs[0].access.congestion == "cubic"
    assert cfg.notices == (f"{PATH}:9: graph[0].access.congctl is deprecated: rename it to `congestion` "
                           "(same values)",), cfg.notices
    assert parse(BASE, PATH, available_cc=CC).notices == (), "a config without congctl has no notice"


def test_pep_radio_is_taken_though_the_kernel_does_not_offer_it_yet():
    """pepctl registers pep_radio itself at `up`: the kernel's list (here without it) does not refuse it.
    Its queue target defaults to radio.h's RADIO_TARGET_US; other sides keep 0 (unused)."""
    cfg = parse(in_access('congestion = "pep_radio"') + GRAPH2.replace("vlan = 101", 'vlan = 101\ncongestion = "bbr"'),
                PATH, available_cc=CC)
    g1, g2 = cfg.graphs
    assert (g1.access.congestion, g1.access.queue_target_ms) == ("pep_radio", radio_maps.TARGET_US // 1000)
    assert (g1.origin.congestion, g1.origin.queue_target_ms) == ("cubic", 0)
    assert (g2.access.congestion, g2.access.queue_target_ms) == ("bbr", 0)
    cfg = parse(in_access('congestion = "pep_radio"\nqueue_target_ms = 25'), PATH, available_cc=CC)
    assert cfg.graphs[0].access.queue_target_ms == 25


def test_defaults():
    cfg = parse(BASE, PATH, available_cc=CC)
    assert cfg.path == PATH
    h = cfg.host
    assert (h.run_dir, h.bpf_dir) == ("/run/pep", "/sys/fs/bpf/pep")
    assert (h.tuning.irq_affinity, h.tuning.rss_symmetric, h.tuning.sysctls) == (True, True, True)
    g = cfg.graphs[0]
    assert (g.name, g.index) == ("g1", 0)
    assert g.access.prefixes == (ipaddress.ip_network("198.18.0.0/24"), ipaddress.ip_network("2001:2:0:1::/64"))
    assert (g.access.congestion, g.origin.congestion) == ("pep_radio", "cubic"), "pepctl's own toward subscribers"
    assert g.access.queue_target_ms == radio_maps.TARGET_US // 1000
    assert (g.access.initcwnd, g.origin.initcwnd) == (32, 0), "initcwnd: 32 toward subscribers, kernel's to origin"
    assert g.access.gateways == ()
    p = g.proxy
    assert (p.enabled, p.interception, p.listen_port, p.splice, p.mode) == (True, "bpf", 50080, "both", "tcp")
    assert (p.maxconn, p.log_connections) == (0, False)
    assert (p.source_port, p.mptcp, p.handshake) == ("kept", "bypass", "honest"), \
        "the client's own port (docs/transparency.md), MPTCP end to end, the origin answers first"
    assert (h.supervisor, h.threads, h.maxconn, h.metrics_address, h.metrics_port) == ("auto", 0, 0, "127.0.0.1", 9101)
    assert p.ports == ((80, 80), (443, 443))


@pytest.mark.parametrize("key,good,bad", [("source_port", "kept", "client"), ("mptcp", "proxy", "terminate"),
                                          ("handshake", "early", "late")])
def test_transparency_keys(key, good, bad):
    """Each key of issue 26 takes its choices and names them when given another."""
    cfg = parse(edit(("ports = [80, 443]", f'ports = [80, 443]\n{key} = "{good}"')), PATH)
    assert getattr(cfg.graphs[0].proxy, key) == good
    (e,) = errors_of(edit(("ports = [80, 443]", f'ports = [80, 443]\n{key} = "{bad}"')))
    assert (e.field, e.line) == (f"graph[0].proxy.{key}", 15), e
    assert all(f'"{c}"' in e.message for c in ENUMS[key]), e.message


def test_honest_handshake_needs_bpf():
    """handshake defaults to honest in mode bpf and early in the others; honest elsewhere is an error."""
    nft = parse(edit(("ports = [80, 443]", 'ports = [80, 443]\ninterception = "nft"')), PATH)
    assert nft.graphs[0].proxy.handshake == "early"
    (e,) = errors_of(edit(("ports = [80, 443]", 'ports = [80, 443]\ninterception = "nft"\nhandshake = "honest"')))
    assert e.field == "graph[0].proxy.handshake" and 'interception = "bpf"' in e.message, e


def test_all_ports_and_default_name(config_doc):
    del config_doc["graph"][0]["name"]
    config_doc["graph"][0]["proxy"] = {"ports": "all"}
    cfg = parse(toml_text(config_doc), PATH)
    assert cfg.graphs[0].name == "g0"
    assert cfg.graphs[0].proxy.ports is None


def test_ports_are_sorted_and_merged(config_doc):
    config_doc["graph"][0]["proxy"] = {"ports": [443, 80, "80", "79-81", "1000-2000", "2001-2002"]}
    cfg = parse(toml_text(config_doc), PATH)
    assert cfg.graphs[0].proxy.ports == ((79, 81), (443, 443), (1000, 2002))


def test_defaults_proxy_apply_and_graph_wins():
    text = edit(("ports = [80, 443]", 'ports = [80]\nmode = "tcp"'),
                extra='[defaults.proxy]\nmode = "http"\nsplice = "off"\nlisten_port = 50099\n' + GRAPH2)
    a, b = parse(text, PATH).graphs
    assert (a.proxy.mode, a.proxy.splice, a.proxy.listen_port) == ("tcp", "off", 50099)
    assert (b.proxy.mode, b.proxy.splice, b.proxy.ports) == ("http", "off", None)


def test_conflict_with_a_default_names_where_it_came_from():
    text = edit(("ports = [80, 443]", 'ports = [80, "50000-50100"]'), extra="[defaults.proxy]\nlisten_port = 50050\n")
    (e,) = errors_of(text)
    assert (e.field, e.value) == ("graph[0].proxy.listen_port", 50050)
    assert "(from defaults.proxy.listen_port)" in e.message


def test_origin_default_route_may_contain_access_prefixes():
    text = edit(("vlan = 200", 'vlan = 200\nprefixes = ["0.0.0.0/0", "::/0"]\n'
                 'gateways = ["198.19.0.254", "2001:2:0:2::fe"]'))
    o = parse(text, PATH).graphs[0].origin
    assert o.prefixes == (ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0"))
    assert [str(g) for g in o.gateways] == ["198.19.0.254", "2001:2:0:2::fe"]


def test_example_config_loads():
    path = os.path.join(REPO, "etc", "pep.example.toml")
    cfg = load(path, available_cc=CC)
    assert cfg.host.instance == "pep1"
    (g,) = cfg.graphs
    assert (g.access.vlan, g.origin.vlan) == (100, 200)
    assert g.proxy.ports == ((80, 80), (443, 443), (8000, 8080))
    assert cfg.notices == (), f"the example uses a deprecated key: {cfg.notices}"
    with open(path) as f:
        text = f.read()
    # Commented out (its default), with the default the header has today.
    default = f"# queue_target_ms = {radio_maps.TARGET_US // 1000} "
    assert default in text, f"{path}: expected the line {default!r}, pep_radio's default (congestion/radio.h)"
    assert g.access.congestion == "pep_radio", f"{path}: the example shows the default toward subscribers"
    uncommented = text.replace("# queue_target_ms", "queue_target_ms")
    assert parse(uncommented, path, available_cc=CC).graphs[0].access.queue_target_ms == radio_maps.TARGET_US // 1000


def test_lab_template_loads():
    """The lab's own config (netns/lab.toml.in) with its placeholders filled in."""
    with open(os.path.join(REPO, "netns", "lab.toml.in")) as f:
        text = f.read()
    for k, v in {"$rid": "t1a2b3c", "$run_dir": "/run/peplab/x", "$supervisor": "pepctl", "$proxy": "true",
                 "$interception": "nft", "$ports": '"all"', "$splice": "auto", "$mode": "tcp", "$metrics_port": "9101",
                 "$threads": "1", "$congestion": "pep_radio", "$queue_target": "", "$source_port": "any",
                 "$handshake": 'handshake = "early"',
                 "$experiment": "[graph.experiment]\ncontrol_fraction = 0.2"}.items():
        text = text.replace(k, v)
    cfg = parse(text, "lab.toml", available_cc=CC)
    assert (cfg.graphs[0].proxy.source_port, cfg.graphs[0].proxy.handshake) == ("any", "early")
    assert cfg.host.instance == "plt1a2b3c"
    assert cfg.host.threads == 1
    assert cfg.host.supervisor == "pepctl"
    assert cfg.graphs[0].experiment.control_fraction == 0.2
    assert (cfg.graphs[0].access.congestion, cfg.graphs[0].origin.congestion) == ("pep_radio", "cubic")
    assert cfg.notices == (), f"the lab's template uses a deprecated key: {cfg.notices}"


@pytest.mark.parametrize("target, want", [(50, 50), (None, radio_maps.TARGET_US // 1000)])
def test_lab_queue_target_reaches_every_graph(target, want):
    """pep-lab up --queue-target MS (bench responsiveness --queue-target) sets queue_target_ms on every
    graph's access side; without it, the config's default holds."""
    opts = argparse.Namespace(ports="80", interception="bpf", no_proxy=False, splice="both", mode="tcp",
                              congestion="pep_radio", queue_target=target, graphs=2)
    text = Lab("unit-queue-target", rid="abc123").render_pep(opts, run_dir="/run/peplab/abc123")
    cfg = parse(text, "lab.toml", available_cc=CC)
    got = [g.access.queue_target_ms for g in cfg.graphs]
    assert got == [want, want], f"pep-lab up --queue-target {target}: graphs' queue_target_ms {got}, want {want}"


@pytest.mark.parametrize("table, field, value, words", [
    ("control_fraction = 0.7", "control_fraction", "0.7", "0 (no experiment) to 0.5"),
    ("control_fraction = -0.1", "control_fraction", "-0.1", "0 (no experiment) to 0.5"),
    ('control_fraction = "5%"', "control_fraction", '"5%"', "must be a number"),
    ("seed = 4294967296", "seed", "4294967296", "0-4294967295"),
    ("fraction = 0.1", "fraction", "0.1", "unknown key"),
])
def test_experiment_errors_name_the_field(table, field, value, words):
    text = BASE + f"\n[graph.experiment]\n{table}\n"
    with pytest.raises(ConfigError) as e:
        parse(text, "pep.toml", available_cc=CC)
    msg = str(e.value)
    assert f"graph[0].experiment.{field} = {value}" in msg and words in msg, msg


def test_experiment_needs_the_exporter():
    text = (BASE.replace('nic = "eth1"', 'nic = "eth1"\nmetrics_port = 0')
            + "\n[graph.experiment]\ncontrol_fraction = 0.1\n")
    with pytest.raises(ConfigError) as e:
        parse(text, "pep.toml", available_cc=CC)
    assert "graph[0].experiment.control_fraction = 0.1" in str(e.value) and "metrics exporter" in str(e.value), \
        str(e.value)


def test_experiment_defaults_off():
    g = parse(BASE, "pep.toml", available_cc=CC).graphs[0]
    assert (g.experiment.control_fraction, g.experiment.seed, g.experiment.on) == (0.0, 0, False)


def test_load_missing_unreadable_and_not_utf8():
    with tempfile.TemporaryDirectory(prefix="pcf-unit-") as d:
        with pytest.raises(FileNotFoundError):
            load(os.path.join(d, "nope.toml"))
        with pytest.raises(ConfigError, match="cannot read"):
            load(d)  # a folder
        bad = os.path.join(d, "latin1.toml")
        with open(bad, "wb") as f:
            f.write(b'[host]\ninstance = "p\xe9p"\n')
        with pytest.raises(ConfigError, match=r"latin1.toml:2: not UTF-8"):
            load(bad)


def test_run_dir_at_its_longest_is_taken_and_the_names_fit():
    """run_dir_max() bytes: taken, and the stats socket names.py makes is exactly STATS_SOCKET_MAX long (so
    config.stats_socket and names agree); one byte more is refused. The unit name's length is the one names.py
    makes, also for a path full of '-' (systemd writes each as \\x2d)."""
    longest = "/run/" + "x-" * ((run_dir_max("pep1") - 5) // 2)
    longest += "y" * (run_dir_max("pep1") - len(longest))
    cfg = parse(edit(('nic = "eth1"', f'nic = "eth1"\nrun_dir = "{longest}"')), PATH)
    n = cfg.instance_names()
    assert n.haproxy_sock_longest == stats_socket(cfg.host.run_dir, "pep1")
    assert len(n.haproxy_sock_longest) == STATS_SOCKET_MAX, n.haproxy_sock_longest
    assert len(names.unit_name(n)) == supervisor_unit_len(cfg.host.run_dir, "pep1"), names.unit_name(n)
    (e,) = errors_of(edit(('nic = "eth1"', f'nic = "eth1"\nrun_dir = "{longest}z"')))
    assert (e.field, e.line) == ("host.run_dir", 4) and "stats socket" in e.message, str(e)


def test_paths_are_cleaned():
    cfg = parse(edit(('nic = "eth1"', 'nic = "eth1"\nrun_dir = "/run//pep/"\nbpf_dir = "/sys/fs/bpf/pep//"')), PATH)
    assert (cfg.host.run_dir, cfg.host.bpf_dir) == ("/run/pep", "/sys/fs/bpf/pep")


def test_maxconn_ceiling_is_inclusive():
    cfg = parse(edit(('nic = "eth1"', f'nic = "eth1"\nmaxconn = {MAXCONN_MAX}'),
                     ("ports = [80, 443]", f"maxconn = {MAXCONN_MAX}")), PATH)
    assert cfg.host.maxconn == cfg.graphs[0].proxy.maxconn == MAXCONN_MAX
    fields = {e.field for e in errors_of(edit(('nic = "eth1"', f'nic = "eth1"\nmaxconn = {MAXCONN_MAX + 1}')))}
    assert fields == {"host.maxconn"}, fields


@pytest.mark.parametrize("where,line", [
    ("metrics_address", 'metrics_address = "0.0.0.0"'),          # every address of the host: fine
    ("metrics_address", 'metrics_address = "::1"'),
    ("bypass", '[graph.bypass]\nclients = ["0.0.0.0/0", "::/0"]\nservers = ["198.19.0.0/24"]'),
    ("origin prefixes", '[graph.origin]\nvlan = 200\naddresses = ["198.19.0.1/24"]\nprefixes = ["0.0.0.0/0"]\n'
     'gateways = ["198.19.0.254"]'),
])
def test_address_kinds_that_stay_legal(where, line):
    if where == "metrics_address":
        text = edit(('nic = "eth1"', 'nic = "eth1"\n' + line))
    elif where == "bypass":
        text = edit(extra=line + "\n")
    else:
        text = edit(('[graph.origin]\nvlan = 200\naddresses = ["198.19.0.1/24", "2001:2:0:2::1/64"]', line))
    parse(text, PATH)


def test_line_numbers_survive_unicode_line_separators_in_comments():
    """U+2028 and U+0085 end a line for str.splitlines(), not for TOML: the line of the error stays right."""
    text = edit(("[host]", "[host]\n# a note\u2028with a line separator\u0085and a NEL"), ("vlan = 100", "vlan = 0"))
    (e,) = errors_of(text)
    assert (e.field, e.line) == ("graph[0].access.vlan", 9), str(e)


def test_byte_order_mark_is_skipped():
    cfg = parse("\ufeff" + BASE, PATH)
    assert cfg.host.instance == "pep1"
    (e,) = errors_of("\ufeff" + edit(("vlan = 100", "vlan = 0")))
    assert e.line == 8, str(e)


def test_load_names_the_line_of_a_byte_that_is_not_utf8(tmp_path):
    bad = tmp_path / "pep.toml"
    bad.write_bytes(BASE.encode().replace(b'"eth1"', b'"eth\xff"'))
    with pytest.raises(ConfigError, match=r"pep.toml:3: not UTF-8"):
        load(str(bad))


def test_a_number_for_an_address_is_one_error():
    """ipaddress reads the integer 3323068417 as 198.18.0.1: the overlap checks must not, or the one
    mistake would also be reported as an overlap with the access side."""
    errors = errors_of(edit(('addresses = ["198.19.0.1/24", "2001:2:0:2::1/64"]', "addresses = [3323068417]")))
    got = [(e.field, e.message) for e in errors]
    assert got == [("graph[0].origin.addresses[0]", "must be a string, not an integer")], got


def test_load_of_an_endless_file_stops_and_says_so():
    """/dev/zero never ends: load reads a bounded amount and says it is no config."""
    with pytest.raises(ConfigError, match=r"^/dev/zero: more than 16 MiB: not a pepctl config"):
        load("/dev/zero")
