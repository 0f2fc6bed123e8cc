"""pepctl's config file: what loads, what each malformed config says.

Every malformed config is the valid BASE config with a few text edits. The test
checks that the error names the field and shows the value, the way a user
reads it (`graph[0].access.vlan = 4095: ...`), and that the message says what
to do. No root, no files outside a temp folder.
"""

from __future__ import annotations

import ipaddress
import os
import tempfile

import pytest

from pepctl.config import ConfigError, FieldError, load, parse, toml_value

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PATH = "/etc/pep/pep.toml"
CC = {"reno", "bbr", "cubic"}

BASE = """\
[host]
instance = "pep1"
nic = "eth1"

[[graph]]
name = "g1"
[graph.access]
vlan = 100
addresses = ["198.18.0.1/24", "2001:2:0:1::1/64"]
[graph.origin]
vlan = 200
addresses = ["198.19.0.1/24", "2001:2:0:2::1/64"]
[graph.proxy]
ports = [80, 443]
"""

# Appended by cases that need a second graph.
GRAPH2 = """
[[graph]]
name = "g2"
[graph.access]
vlan = 101
addresses = ["198.18.1.1/24"]
[graph.origin]
vlan = 201
addresses = ["198.19.1.1/24"]
"""


def edit(*pairs: tuple[str, str], extra: str = "", base: str = BASE) -> str:
    text = base
    for old, new in pairs:
        assert old in text, f"test bug: {old!r} not in the base config"
        text = text.replace(old, new, 1)
    return text + extra


def errors_of(text: str, available_cc=CC) -> list[FieldError]:
    with pytest.raises(ConfigError) as exc:
        parse(text, PATH, available_cc=available_cc)
    return exc.value.errors


# (case id, config text, field, value as shown (None: no value), words the message must contain)
MALFORMED = [
    ("toml syntax", edit(("vlan = 100", "vlan = ")), "", None, "TOML syntax error"),
    ("unknown top-level table", edit(extra='[hots]\nnic = "x"\n'), "hots", '{ nic = "x" }', "'host'"),
    ("unknown host key", edit(('nic = "eth1"', 'nic = "eth1"\nrun_dri = "/run/x"')),
     "host.run_dri", '"/run/x"', "did you mean 'run_dir'"),
    ("unknown side key", edit(("vlan = 100", "vlan = 100\nvlna = 3")), "graph[0].access.vlna", "3",
     "did you mean 'vlan'"),
    ("unknown proxy key", edit(("ports = [80, 443]", 'splcie = "auto"')), "graph[0].proxy.splcie",
     '"auto"', "did you mean 'splice'"),
    ("unknown tuning key", edit(extra='[host.tuning]\nirq = false\n'), "host.tuning.irq", "false",
     "did you mean 'irq_affinity'"),
    ("missing host table", edit(('[host]\ninstance = "pep1"\nnic = "eth1"\n', "")), "host", None,
     "add a [host] table"),
    ("missing nic", edit(('nic = "eth1"\n', "")), "host.nic", None, "add `nic = "),
    ("missing vlan", edit(("vlan = 200\n", "")), "graph[0].origin.vlan", None, "add `vlan = "),
    ("missing addresses", edit(('addresses = ["198.19.0.1/24", "2001:2:0:2::1/64"]\n', "")),
     "graph[0].origin.addresses", None, "missing"),
    ("missing access table", edit(('[graph.access]\nvlan = 100\naddresses = ["198.18.0.1/24", '
                                   '"2001:2:0:1::1/64"]\n', "")),
     "graph[0].access", None, "add a [graph.access] table"),
    ("vlan is a string", edit(("vlan = 100", 'vlan = "100"')), "graph[0].access.vlan", '"100"',
     "must be an integer"),
    ("vlan is a float", edit(("vlan = 100", "vlan = 100.5")), "graph[0].access.vlan", "100.5",
     "must be an integer"),
    ("enabled is a string", edit(("ports = [80, 443]", 'enabled = "yes"')), "graph[0].proxy.enabled",
     '"yes"', "true or false"),
    ("addresses is a string", edit(('addresses = ["198.18.0.1/24", "2001:2:0:1::1/64"]',
                                    'addresses = "198.18.0.1/24"')),
     "graph[0].access.addresses", '"198.18.0.1/24"', "must be a list"),
    ("instance upper case", edit(('instance = "pep1"', 'instance = "Pep1"')), "host.instance", '"Pep1"',
     "a-z"),
    ("instance too long", edit(('instance = "pep1"', 'instance = "pep1234567"')), "host.instance",
     '"pep1234567"', "1-9 characters"),
    ("instance starts with a digit", edit(('instance = "pep1"', 'instance = "1pep"')), "host.instance",
     '"1pep"', "starting with a letter"),
    ("bad nic name", edit(('nic = "eth1"', 'nic = "eth 1"')), "host.nic", '"eth 1"', "interface name"),
    ("relative run_dir", edit(('nic = "eth1"', 'nic = "eth1"\nrun_dir = "run/pep"')), "host.run_dir",
     '"run/pep"', "absolute path"),
    ("vlan 0", edit(("vlan = 100", "vlan = 0")), "graph[0].access.vlan", "0", "use 1-4094"),
    ("vlan 4095", edit(("vlan = 200", "vlan = 4095")), "graph[0].origin.vlan", "4095", "use 1-4094"),
    ("duplicate vlan across graphs", edit(extra=GRAPH2.replace("vlan = 201", "vlan = 100")),
     "graph[1].origin.vlan", "100", "already used by graph[0].access.vlan"),
    ("access vlan == origin vlan", edit(("vlan = 200", "vlan = 100")), "graph[0].origin.vlan", "100",
     "different VLANs"),
    ("bad address", edit(('"198.18.0.1/24", "2001', '"198.18.0.300/24", "2001')),
     "graph[0].access.addresses[0]", '"198.18.0.300/24"', "not an address"),
    ("address without prefix length", edit(('"198.18.0.1/24", "2001', '"198.18.0.1", "2001')),
     "graph[0].access.addresses[0]", '"198.18.0.1"', "prefix length"),
    ("address is the network address", edit(('"198.18.0.1/24", "2001', '"198.18.0.0/24", "2001')),
     "graph[0].access.addresses[0]", '"198.18.0.0/24"', "network address"),
    ("bad prefix", edit(("vlan = 100", 'vlan = 100\nprefixes = ["198.18.0.0/33"]')),
     "graph[0].access.prefixes[0]", '"198.18.0.0/33"', "not a network"),
    ("prefix with host bits", edit(("vlan = 100", 'vlan = 100\nprefixes = ["198.18.0.1/24"]')),
     "graph[0].access.prefixes[0]", '"198.18.0.1/24"', '"198.18.0.0/24"'),
    ("bad gateway", edit(("vlan = 200", 'vlan = 200\ngateways = ["198.19.0.x"]')),
     "graph[0].origin.gateways[0]", '"198.19.0.x"', "not an IP address"),
    ("gateway outside the subnets", edit(("vlan = 200", 'vlan = 200\ngateways = ["198.20.0.1"]')),
     "graph[0].origin.gateways[0]", '"198.20.0.1"', "not inside any subnet"),
    ("gateway is our own address", edit(("vlan = 200", 'vlan = 200\ngateways = ["198.19.0.1"]')),
     "graph[0].origin.gateways[0]", '"198.19.0.1"', "own address"),
    ("two gateways of one family", edit(("vlan = 200", 'vlan = 200\ngateways = ["198.19.0.2", "198.19.0.3"]')),
     "graph[0].origin.gateways[1]", '"198.19.0.3"', "at most one gateway per address family"),
    ("prefix needs a gateway", edit(("vlan = 200", 'vlan = 200\nprefixes = ["0.0.0.0/0"]')),
     "graph[0].origin.prefixes[0]", '"0.0.0.0/0"', "no IPv4 gateway"),
    ("access and origin prefixes overlap", edit(("vlan = 200", 'vlan = 200\nprefixes = ["198.18.0.0/16"]\n'
                                                 'gateways = ["198.19.0.254"]')),
     "graph[0].origin.prefixes[0]", '"198.18.0.0/16"', "overlaps graph[0].access.addresses[0]"),
    ("origin subnet overlaps access", edit(('"198.19.0.1/24", "2001:2:0:2::1/64"', '"198.18.0.200/16"')),
     "graph[0].origin.addresses[0]", '"198.18.0.200/16"', "not both"),
    ("access prefixes of two graphs overlap",
     edit(extra=GRAPH2.replace('"198.18.1.1/24"', '"198.18.0.129/25"')),
     "graph[1].access.addresses[0]", '"198.18.0.129/25"', "overlaps graph[0].access.addresses[0]"),
    ("congctl the kernel lacks", edit(("vlan = 100", 'vlan = 100\ncongctl = "vegas"')),
     "graph[0].access.congctl", '"vegas"', "bbr, cubic, reno"),
    ("initcwnd too large", edit(("vlan = 100", "vlan = 100\ninitcwnd = 1000")), "graph[0].access.initcwnd",
     "1000", "1-256"),
    ("initcwnd negative", edit(("vlan = 200", "vlan = 200\ninitcwnd = -1")), "graph[0].origin.initcwnd",
     "-1", "0 for the kernel's"),
    ("initcwnd not a number", edit(("vlan = 100", 'vlan = 100\ninitcwnd = "big"')), "graph[0].access.initcwnd",
     '"big"', "must be an integer"),
    ("port 0", edit(("ports = [80, 443]", "ports = [80, 0]")), "graph[0].proxy.ports[1]", "0", "1-65535"),
    ("port 65536", edit(("ports = [80, 443]", "ports = [65536]")), "graph[0].proxy.ports[0]", "65536",
     "1-65535"),
    ("backwards range", edit(("ports = [80, 443]", 'ports = ["90-80"]')), "graph[0].proxy.ports[0]",
     '"90-80"', '"80-90"'),
    ("port not a number", edit(("ports = [80, 443]", 'ports = ["x"]')), "graph[0].proxy.ports[0]", '"x"',
     "not a port"),
    ("ports neither all nor list", edit(("ports = [80, 443]", 'ports = "most"')), "graph[0].proxy.ports",
     '"most"', '"all" or a list'),
    ("route mode with all ports", edit(("ports = [80, 443]", 'interception = "route"\nports = "all"')),
     "graph[0].proxy.ports", '"all"', "needs a list of ports"),
    ("listen_port is intercepted", edit(("ports = [80, 443]", 'ports = [80, "50000-50100"]')),
     "graph[0].proxy.listen_port", "50080", "outside ports"),
    ("metrics_port in a graph", edit(("ports = [80, 443]", "metrics_port = 50080")),
     "graph[0].proxy.metrics_port", "50080", "moved to [host]"),
    ("bad metrics address", edit(('nic = "eth1"', 'nic = "eth1"\nmetrics_address = "localhost"')),
     "host.metrics_address", '"localhost"', "not an IP address"),
    ("metrics port out of range", edit(('nic = "eth1"', 'nic = "eth1"\nmetrics_port = 70000')),
     "host.metrics_port", "70000", "1-65535"),
    ("unknown supervisor", edit(('nic = "eth1"', 'nic = "eth1"\nsupervisor = "runit"')),
     "host.supervisor", '"runit"', '"auto", "systemd", "pepctl"'),
    ("unknown splice", edit(("ports = [80, 443]", 'splice = "yes"')), "graph[0].proxy.splice", '"yes"',
     '"both", "auto", "off"'),
    ("unknown mode", edit(("ports = [80, 443]", 'mode = "udp"')), "graph[0].proxy.mode", '"udp"',
     '"tcp", "http"'),
    ("unknown interception", edit(("ports = [80, 443]", 'interception = "ebpf"')),
     "graph[0].proxy.interception", '"ebpf"', '"bpf", "nft", "route"'),
    ("duplicate graph names", edit(extra=GRAPH2.replace('name = "g2"', 'name = "g1"')), "graph[1].name",
     '"g1"', "already the name of graph[0]"),
    ("default name collides", edit(('name = "g1"', 'name = "g1"')) + GRAPH2.replace('name = "g2"\n', ""),
     "graph[1].name", '"g1"', "default name"),
    ("bad graph name", edit(('name = "g1"', 'name = "G_1"')), "graph[0].name", '"G_1"', "a-z, 0-9"),
    ("no graphs", BASE.split("[[graph]]")[0], "graph", None, "add at least one [[graph]]"),
    ("[graph] instead of [[graph]]", BASE.replace("[[graph]]", "[graph]"), "graph", None, "write [[graph]]"),
    ("threads in a graph", edit(("ports = [80, 443]", "threads = 2")), "graph[0].proxy.threads", "2",
     "moved to [host]"),
    ("negative threads", edit(('nic = "eth1"', 'nic = "eth1"\nthreads = -1')), "host.threads", "-1",
     "0 for one per CPU"),
    ("too many threads", edit(('nic = "eth1"', 'nic = "eth1"\nthreads = 65')), "host.threads", "65",
     "1-64"),
    ("negative host maxconn", edit(('nic = "eth1"', 'nic = "eth1"\nmaxconn = -5')), "host.maxconn", "-5",
     "must not be negative"),
    ("bpf listen_port intercepted", edit(("ports = [80, 443]", "ports = [80, 50080]")),
     "graph[0].proxy.listen_port", "50080", "is also an intercepted port"),
    ("negative maxconn", edit(("ports = [80, 443]", "maxconn = -1")), "graph[0].proxy.maxconn", "-1",
     "must not be negative"),
    ("bad default", edit(extra='[defaults.proxy]\nmode = "udp"\n'), "defaults.proxy.mode", '"udp"',
     '"tcp", "http"'),
]


@pytest.mark.parametrize("text,field,value,words", [c[1:] for c in MALFORMED], ids=[c[0] for c in MALFORMED])
def test_malformed_config_names_field_and_value(text, field, value, words):
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
    assert str(e).startswith(f"{PATH}:"), f"message does not start with the file: {e}"


def test_there_are_enough_malformed_cases():
    assert len(MALFORMED) >= 14


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


def test_congctl_unchecked_without_available_cc():
    cfg = parse(edit(("vlan = 100", 'vlan = 100\ncongctl = "vegas"')), PATH)
    assert cfg.graphs[0].access.congctl == "vegas"


def test_defaults():
    cfg = parse(BASE, PATH, available_cc=CC)
    assert cfg.path == PATH
    h = cfg.host
    assert (h.run_dir, h.bpf_dir) == ("/run/pep", "/sys/fs/bpf/pep")
    assert (h.tuning.irq_affinity, h.tuning.rss_symmetric, h.tuning.sysctls) == (True, True, True)
    g = cfg.graphs[0]
    assert (g.name, g.index) == ("g1", 0)
    assert g.access.prefixes == (ipaddress.ip_network("198.18.0.0/24"), ipaddress.ip_network("2001:2:0:1::/64"))
    assert (g.access.congctl, g.origin.congctl) == ("bbr", "cubic")
    assert (g.access.initcwnd, g.origin.initcwnd) == (32, 0), "initcwnd: 32 toward subscribers, kernel's to origin"
    assert g.access.gateways == ()
    p = g.proxy
    assert (p.enabled, p.interception, p.listen_port, p.splice, p.mode) == (True, "bpf", 50080, "both", "tcp")
    assert (p.maxconn, p.log_connections) == (0, False)
    assert (h.supervisor, h.threads, h.maxconn, h.metrics_address, h.metrics_port) == ("auto", 0, 0, "127.0.0.1", 9101)
    assert p.ports == ((80, 80), (443, 443))


def test_all_ports_and_default_name():
    cfg = parse(edit(('name = "g1"\n', ""), ("ports = [80, 443]", 'ports = "all"')), PATH)
    assert cfg.graphs[0].name == "g0"
    assert cfg.graphs[0].proxy.ports is None


def test_ports_are_sorted_and_merged():
    cfg = parse(edit(("ports = [80, 443]", 'ports = [443, 80, "80", "79-81", "1000-2000", "2001-2002"]')), PATH)
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
    cfg = load(os.path.join(REPO, "etc", "pep.example.toml"), available_cc=CC)
    assert cfg.host.instance == "pep1"
    (g,) = cfg.graphs
    assert (g.access.vlan, g.origin.vlan) == (100, 200)
    assert g.proxy.ports == ((80, 80), (443, 443), (8000, 8080))


def test_lab_template_loads():
    """The lab's own config (netns/lab.toml.in) with its placeholders filled in."""
    with open(os.path.join(REPO, "netns", "lab.toml.in")) as f:
        text = f.read()
    for k, v in {"$rid": "t1a2b3c", "$run_dir": "/run/peplab/x", "$proxy": "true", "$interception": "nft",
                 "$ports": '"all"', "$splice": "auto", "$mode": "tcp"}.items():
        text = text.replace(k, v)
    cfg = parse(text, "lab.toml", available_cc=CC)
    assert cfg.host.instance == "plt1a2b3c"


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
