"""Property tests (Hypothesis) of the two grammars a user types: the config (pepctl/config/) and
the bypass rules (pepctl/config/rules.py). Whatever the input, the only exception is the grammar's own
error, which the CLI prints as a message: never a traceback.

How right is told from wrong:
- config.parse of arbitrary text, of TOML documents built from the config's own keys with
  arbitrary values (huge integers, non-ASCII strings, lists, nested tables), and of mutations of
  etc/pep.example.toml either returns a Config or raises ConfigError; a ConfigError holds at
  least one FieldError, and each one's text starts with the file's name. A Config it returns is
  judged by ipaddress and names.py, not by the config's checks (is_sane): every key and string is
  ASCII, no address is multicast, link-local, loopback, unspecified, IPv4-mapped or zoned,
  maxconn fits HAProxy's int, the stats socket fits sun_path;
- parse_rule and parse_rules_file (text, and raw bytes in a file) return rules or raise RuleError,
  and a rule parses only from ASCII (full-width and Arabic-Indic digits are refused);
- a rule that parses is canonical: parsing its value again gives the same rule.

The examples are derandomized (derandomize=True, no example database): every run, here and in CI,
tries the same few hundred inputs per test, so a failure reproduces and CI never fails on a new
example it happened to draw. Exploring further is a local run with more examples
(HYPOTHESIS_EXAMPLES=20000). No root, no files outside a temp folder.
"""

from __future__ import annotations

import datetime
import ipaddress
import math
import os
import re
import tempfile
import tomllib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pepctl import config
from pepctl.config import ConfigError, parse, rules

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PATH = "/etc/pep/fuzz.toml"
with open(os.path.join(REPO, "etc", "pep.example.toml")) as f:
    EXAMPLE = f.read()

# A deprecation warning of ipaddress is a bug of ours (ip_network(True) is 0.0.0.1/32): fail on it.
pytestmark = pytest.mark.filterwarnings("error::DeprecationWarning:ipaddress")

FUZZ = settings(max_examples=int(os.environ.get("HYPOTHESIS_EXAMPLES", "300")), deadline=None, derandomize=True,
                database=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def parses_or_says_why(text: str) -> None:
    """The property of every config test: a Config that is sane, or a ConfigError whose every line
    names the file."""
    try:
        cfg = parse(text, PATH)
    except ConfigError as e:
        assert e.errors, "a ConfigError with no FieldError"
        for err in e.errors:
            assert str(err).startswith(PATH), f"an error that does not name the file: {err}"
        return
    assert isinstance(cfg, config.Config)
    is_sane(cfg, tomllib.loads(text.removeprefix("\ufeff")))


def strings_of(v):
    if isinstance(v, str):
        yield v
    elif isinstance(v, list):
        for x in v:
            yield from strings_of(x)
    elif isinstance(v, dict):
        for k, x in v.items():
            yield k
            yield from strings_of(x)


def is_sane(cfg: config.Config, doc: dict) -> None:
    """What a config that parses never has, judged by ipaddress and names.py, not by the config's own
    checks: a key or a string that is not ASCII, an address of a kind nothing can use, a zone id, a
    maxconn HAProxy cannot hold, a stats socket HAProxy cannot bind."""
    odd = [s for s in strings_of(doc) if not s.isascii()]
    assert not odd, f"accepted non-ASCII: {odd}"
    for g in cfg.graphs:
        nets = [*g.bypass.clients, *g.bypass.servers]
        for side in (g.access, g.origin):
            nets += [a.network for a in side.addresses] + list(side.prefixes)
            for a in [*(i.ip for i in side.addresses), *side.gateways]:
                assert not (a.is_multicast or a.is_link_local or a.is_loopback or a.is_unspecified), f"accepted {a}"
                assert a.version == 4 or not (a.scope_id or a.ipv4_mapped), f"accepted {a}"
        for n in nets:
            if n.prefixlen:
                assert not (n.is_multicast or n.is_link_local or n.is_loopback or n.is_unspecified), f"accepted {n}"
                assert n.version == 4 or not (n.network_address.scope_id or n.network_address.ipv4_mapped), n
        assert g.proxy.maxconn <= 2**31 // 3, f"accepted maxconn {g.proxy.maxconn}"
    assert cfg.host.maxconn <= 2**31 // 3, f"accepted maxconn {cfg.host.maxconn}"
    sock = cfg.instance_names().haproxy_sock_longest
    assert len(sock) + len(".4194304.tmp") <= 107, f"accepted a run_dir too long for {sock}"


# --- values -----------------------------------------------------------------------------------

CHARS = st.characters(exclude_categories=("Cs",))        # anything but lone surrogates (not UTF-8)
# Strings near what the config takes, so the checks past "must be a string" are reached too.
NEAR = st.sampled_from([
    "198.18.0.1/24", "198.18.0.0/24", "2001:2:0:1::1/64", "fe80::1%eth0/64", "fe80::1%eth0", "::ffff:198.18.0.1/120",
    "224.0.0.1", "0.0.0.0", "::", "0.0.0.0/0", "::/0", "255.255.255.255", "169.254.0.1/16", "127.0.0.1/8",
    "198.19.0.254", "80", "8000-8080", "\uff18\uff10", "90-80", "0", "65536", "all", "bpf", "nft", "route", "tcp",
    "http", "both", "auto", "off", "systemd", "pepctl", "bbr", "cubic", "pep1", "g1", "eth1", "/run/pep",
    "/sys/fs/bpf/pep", "/run/../x", "/", "", " ", "\u00a0", "\u3000", "/run/" + "a" * 120, "9" * 30,
    "\uff11\uff19\uff18.18.0.1/24", "p\u0435p1", "eth\x001", "/run/p\x00", "\n",
])
# Digits, ASCII and not (full-width, Arabic-Indic, superscript), as ports and addresses are spelled.
NUMBERS = st.text(st.sampled_from("0123456789-./:af\uff10\uff18\uff11\u0660\u0668\u00b9 \u00a0"), min_size=1,
                  max_size=16)
INTS = st.one_of(st.integers(), st.integers(-(2**70), 2**70),
                 st.sampled_from([0, 1, -1, 100, 4094, 4095, 65535, 65536, 256, 257, 64, 65, 2**31, 2**32, 2**63 - 1,
                                  -(2**63), 10**12, config.MAXCONN_MAX, config.MAXCONN_MAX + 1]))
SCALARS = st.one_of(
    INTS, st.booleans(), st.floats(), NEAR, st.text(CHARS, max_size=30),
    st.datetimes(min_value=datetime.datetime(1, 1, 1), max_value=datetime.datetime(9999, 12, 31)),
    st.dates(), st.times(),
)
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(CHARS, max_size=8), inner, max_size=3)), max_leaves=12)


def maybe(keys: tuple[str, ...], values, extra=VALUES) -> st.SearchStrategy[dict]:
    """A table with any of keys (each value drawn from values), and sometimes an unknown key."""
    return st.builds(lambda known, unknown: {**known, **unknown},
                     st.fixed_dictionaries({}, optional={k: values for k in keys}),
                     st.dictionaries(st.sampled_from(("vlna", "irq", "x", "\uff4e\uff49\uff43", "a.b", "")), extra,
                                     max_size=1))


NETS = st.lists(st.one_of(NEAR, st.text(CHARS, max_size=20), INTS), max_size=3)
SIDE = maybe(config.SIDE_KEYS, st.one_of(VALUES, NETS, st.integers(0, 5000)))
PROXY = maybe(config.PROXY_KEYS, st.one_of(VALUES, NETS, st.sampled_from(["all", "route", "nft", "bpf"])))
BYPASS = maybe(config.BYPASS_KEYS, st.one_of(NETS, VALUES))
GRAPH = st.builds(lambda g, sides: {**g, **sides},
                  maybe(("name",), st.one_of(NEAR, st.text(CHARS, max_size=14), INTS)),
                  st.fixed_dictionaries({}, optional={"access": st.one_of(SIDE, VALUES), "origin": SIDE,
                                                      "proxy": st.one_of(PROXY, VALUES), "bypass": BYPASS}))
HOST = maybe(config.HOST_KEYS, st.one_of(NEAR, INTS, VALUES, maybe(config.TUNING_KEYS, st.one_of(st.booleans(),
                                                                                                VALUES))))
DOC = st.fixed_dictionaries({}, optional={
    "host": st.one_of(HOST, VALUES), "graph": st.one_of(st.lists(GRAPH, max_size=3), GRAPH, VALUES),
    "defaults": st.one_of(st.fixed_dictionaries({}, optional={"proxy": PROXY}), VALUES),
    "hots": VALUES,
})


# --- a small TOML writer, so the documents above reach the reader, not only the TOML parser ------

def toml_str(s: str) -> str:
    out = []
    for ch in s:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def toml_key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else toml_str(k)


def toml_val(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return toml_str(v)
    if isinstance(v, datetime.date | datetime.time):
        return v.isoformat()
    if isinstance(v, list):
        return "[" + ", ".join(toml_val(x) for x in v) + "]"
    return "{" + ", ".join(f"{toml_key(k)} = {toml_val(x)}" for k, x in v.items()) + "}"


def is_table_array(v) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)


def toml_doc(doc: dict, path: tuple[str, ...] = ()) -> str:
    """[table] and [[array]] headers for tables, as people write this file; key = value inside."""
    lines = [f"{toml_key(k)} = {toml_val(v)}" for k, v in doc.items() if not isinstance(v, dict)
             and not is_table_array(v)]
    for k, v in doc.items():
        name = ".".join(toml_key(p) for p in (*path, k))
        if isinstance(v, dict):
            lines.append(f"[{name}]")
            lines.append(toml_doc(v, (*path, k)))
        elif is_table_array(v):
            for item in v:
                lines.append(f"[[{name}]]")
                lines.append(toml_doc(item, (*path, k)))
    return "\n".join(lines)


def same(a, b) -> bool:
    """Equal, with nan equal to nan."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b and type(a) is type(b)


# --- (a) the config ---------------------------------------------------------------------------

@FUZZ
@given(st.text(CHARS, max_size=300))
def test_config_of_any_text_is_a_config_or_a_config_error(text):
    parses_or_says_why(text)


@FUZZ
@given(DOC)
def test_config_of_any_document_of_its_keys_is_a_config_or_a_config_error(doc):
    text = toml_doc(doc)
    assert same(tomllib.loads(text), doc), f"test bug: the TOML writer lost something:\n{text}"
    parses_or_says_why(text)


LINES = EXAMPLE.split("\n")
KEY_LINES = [i for i, line in enumerate(LINES) if re.match(r"[a-z_]+ = ", line)]


# Values as TOML text that no writer of values makes: what tomllib itself chokes on (an integer
# beyond int()'s 4,300 digits, nesting deeper than its recursion), and odd spellings.
RAW_VALUES = [
    "9" * 5000, "-" + "1" * 4301, "[" * 3000 + "]" * 3000, "{a = " * 1000 + "1" + "}" * 1000, "[" * 60 + "]" * 60,
    "0x7fffffffffffffff", "0o777", "0b1", "1_000", "+80", "1e3", "2024-01-01", "'literal'", "'''multi\nline'''",
    '"""\n[graph\n"""',
]
RAW = st.sampled_from(RAW_VALUES)


@st.composite
def mutated_example(draw) -> str:
    """etc/pep.example.toml with a few edits: a value replaced, an item of a list of addresses or
    ports replaced, a [graph.bypass] added, a line dropped or doubled, text put in at any place, or
    the second graph uncommented."""
    lines = list(LINES)
    for _ in range(draw(st.integers(1, 4))):
        how = draw(st.sampled_from(("value", "value", "item", "item", "drop", "double", "insert", "chars", "graph2",
                                    "bypass")))
        i = draw(st.integers(0, len(lines) - 1))
        if how == "value" and KEY_LINES:
            j = draw(st.sampled_from(KEY_LINES))
            if j < len(lines) and " = " in lines[j]:
                key = lines[j].split(" = ")[0]
                lines[j] = f"{key} = {draw(st.one_of(RAW, st.one_of(SCALARS, NETS, VALUES).map(toml_val)))}"
        elif how == "item":      # one item of a list of addresses, networks or ports
            lists = [j for j, line in enumerate(lines) if re.match(r"(addresses|prefixes|gateways|ports) = \[.", line)]
            if lists:
                j = draw(st.sampled_from(lists))
                items = lines[j].split("[", 1)[1].split("]", 1)[0].split(", ")
                items[draw(st.integers(0, len(items) - 1))] = toml_val(draw(st.one_of(NEAR, NUMBERS, INTS)))
                lines[j] = lines[j].split("[", 1)[0] + "[" + ", ".join(items) + "]"
        elif how == "bypass":
            key = draw(st.sampled_from(config.BYPASS_KEYS))
            lines += ["[graph.bypass]", f"{key} = {toml_val(draw(st.lists(st.one_of(NEAR, NUMBERS), max_size=3)))}"]
        elif how == "drop":
            del lines[i]
        elif how == "double":
            lines.insert(i, lines[i])
        elif how == "insert":
            lines.insert(i, draw(st.text(CHARS, max_size=40)))
        elif how == "chars":
            at = draw(st.integers(0, len(lines[i])))
            lines[i] = lines[i][:at] + draw(st.text(CHARS, min_size=1, max_size=5)) + lines[i][at:]
        elif how == "graph2":
            lines += [line[2:] for line in LINES[LINES.index("# [[graph]]"):] if line.startswith("# ")]
    return "\n".join(lines)


@FUZZ
@given(mutated_example())
def test_config_of_the_example_mutated_is_a_config_or_a_config_error(text):
    parses_or_says_why(text)


@pytest.mark.parametrize("raw", RAW_VALUES, ids=[f"{i}:{raw[:8]}" for i, raw in enumerate(RAW_VALUES)])
def test_config_of_the_example_with_an_odd_value_at_every_key(raw):
    """Every RAW value at every key of the example, not left to chance: Hypothesis draws the first
    elements of a list far more often than the others."""
    for j in KEY_LINES:
        lines = list(LINES)
        lines[j] = f"{lines[j].split(' = ')[0]} = {raw}"
        parses_or_says_why("\n".join(lines))


def test_the_example_itself_parses():
    """The mutations start from a config that is good: an error in one is the mutation's."""
    parse(EXAMPLE, PATH)


# --- (b) the rule grammar ---------------------------------------------------------------------

RULE_TEXT = st.one_of(st.text(CHARS, max_size=40), NEAR, NUMBERS, st.from_regex(r"[0-9a-f:./%-]{1,45}", fullmatch=True))


@FUZZ
@given(st.one_of(st.sampled_from(rules.KINDS), st.text(CHARS, max_size=10)), RULE_TEXT)
def test_parse_rule_of_any_text_is_a_rule_or_a_rule_error(kind, value):
    try:
        rule = rules.parse_rule(kind, value)
    except rules.RuleError as e:
        assert str(e), "an empty RuleError"
        return
    assert rule.kind == kind and value.isascii(), f"accepted non-ASCII: {kind} {value!r} -> {rule}"


@FUZZ
@given(st.sampled_from(rules.KINDS), NUMBERS)
def test_a_rule_of_digits_parses_only_when_they_are_ascii(kind, value):
    """int() reads "\uff18\uff10" (full-width) as 80: a rule must not."""
    try:
        rule = rules.parse_rule(kind, value)
    except rules.RuleError:
        return
    assert value.isascii(), f"accepted non-ASCII: {kind} {value!r} -> {rule}"


@pytest.fixture(scope="module")
def rules_dir():
    with tempfile.TemporaryDirectory(prefix="pep-fuzz-") as d:
        yield d


@FUZZ
@given(data=st.one_of(
    st.binary(max_size=400),
    st.lists(st.one_of(st.tuples(st.sampled_from(rules.KINDS), RULE_TEXT).map(" ".join), st.text(CHARS, max_size=30)),
             max_size=8).map(lambda lines: "\n".join(lines).encode("utf-8", "surrogatepass")),
))
def test_parse_rules_file_of_any_bytes_is_rules_or_a_rule_error(rules_dir, data):
    path = os.path.join(rules_dir, "rules.txt")
    with open(path, "wb") as f:
        f.write(data)
    try:
        got = rules.parse_rules_file(path)
    except rules.RuleError as e:
        msg = str(e)
        assert msg.startswith(f"{path}:") and msg.endswith(f"{path}: nothing was changed"), msg
        return
    assert all(isinstance(r, rules.Rule) for r in got)


# --- (c) a rule that parses is canonical --------------------------------------------------------

@st.composite
def rule_spelling(draw) -> tuple[str, str]:
    """A rule as a user might write it: networks compressed, exploded, with a netmask or a
    zero-padded length, ports with leading zeros; often of a kind no rule may have."""
    kind = draw(st.sampled_from(rules.KINDS))
    if kind == "port":
        lo = draw(st.integers(0, 70000))
        hi = draw(st.one_of(st.none(), st.integers(0, 70000)))
        pad = "0" * draw(st.integers(0, 2))
        return kind, f"{pad}{lo}" if hi is None else f"{pad}{lo}-{hi}"
    addr = draw(st.one_of(st.ip_addresses(v=4), st.ip_addresses(v=6)))
    plen = draw(st.integers(0, addr.max_prefixlen))
    net = ipaddress.ip_network((addr, plen), strict=False)
    how = draw(st.sampled_from(("str", "exploded", "netmask", "padded", "address")))
    value = {
        "str": str(net),
        "exploded": f"{net.network_address.exploded}/{plen}",
        "netmask": net.with_netmask,
        "padded": f"{net.network_address}/0{plen}",
        "address": str(net.network_address),
    }[how]
    return kind, value


@FUZZ
@given(st.one_of(rule_spelling(), st.tuples(st.sampled_from(rules.KINDS), RULE_TEXT)))
def test_a_rule_that_parses_is_canonical(spelled):
    kind, value = spelled
    try:
        rule = rules.parse_rule(kind, value)
    except rules.RuleError:
        return
    again = rules.parse_rule(rule.kind, rule.value)
    assert again == rule, f"{kind} {value!r} -> {rule}, which parses as {again}"
    if kind != "port":
        assert rule.value == str(ipaddress.ip_network(rule.value)), f"{rule.value} is not ipaddress's spelling"
