"""pepctl/flow_maps.py speaks tc/pep_flow.h: counter, verdict, side and state order, flags and
constants, struct layouts (as a C compiler lays them out from the header itself), and the
encoders' byte order."""

import ipaddress
import os
import re
import shutil
import subprocess

import pytest

from pepctl import experiment
from pepctl import flow_maps as fm

HEADER = os.path.join(os.path.dirname(__file__), "..", "..", "tc", "pep_flow.h")


def _text(strip_comments: bool = True) -> str:
    with open(HEADER) as f:
        text = f.read()
    return re.sub(r"/\*.*?\*/", "", text, flags=re.S) if strip_comments else text


def _enum(name: str) -> dict[str, int]:
    """The members of enum name with their values (implicit ones counted on from the last)."""
    body = re.search(rf"enum {name} \{{(.*?)\}};", _text(), re.S).group(1)
    out, value = {}, -1
    for member in (m.strip() for m in body.split(",")):
        if not member:
            continue
        ident, _, explicit = member.partition("=")
        value = int(explicit.strip(), 0) if explicit else value + 1
        out[ident.strip()] = value
    return out


def _define(name: str) -> int:
    m = re.search(rf"^#define {name}\s+(.+?)\s*$", _text(), re.M)
    assert m, f"{HEADER} defines no {name}"
    return int(m.group(1), 0)


def test_counters_match_header_enum():
    members = _enum("flow_counter")
    names = list(members)
    assert names[-1] == "CNT_MAX", f"CNT_MAX must close enum flow_counter in {HEADER}, got {names[-1]}"
    assert list(members.values()) == list(range(len(names))), f"enum flow_counter must count from 0: {members}"
    assert [n.removeprefix("CNT_").lower() for n in names[:-1]] == list(fm.COUNTERS), \
        f"pepctl/flow_maps.py COUNTERS {fm.COUNTERS} != header {names[:-1]}"


def test_verdicts_sides_states_match_header():
    assert {v: k.removeprefix("VERDICT_").lower() for k, v in _enum("flow_verdict").items()} == fm.VERDICTS
    assert {v: k.removeprefix("FLOW_").lower() for k, v in _enum("flow_state").items()} == fm.STATES
    assert {v: k.removeprefix("SYN_").lower() for k, v in _enum("syn_state").items()} == fm.SYN_STATES
    assert _enum("flow_side") == {"SIDE_ACCESS": fm.SIDE_ACCESS, "SIDE_ORIGIN": fm.SIDE_ORIGIN}


def test_flags_and_constants_match_header():
    for name in ("GRAPH_F_ENABLED", "GRAPH_F_ASSIGN", "GRAPH_F_ALL_PORTS", "GRAPH_F_ORIGIN_SYNS", "GRAPH_F_MEASURE",
                 "GRAPH_F_PROXY_MPTCP", "GRAPH_F_KEEP_PORT", "GRAPH_F_HONEST", "MARK_F_SUB_ECN", "MARK_F_ORG_RESET",
                 "MARK_F_SUB_SACK", "MARK_F_SUB_TS", "MARK_F_ORG_SACK", "MARK_F_ORG_TS", "MARK_F_SUB_OPTS",
                 "MARK_F_ORG_OPTS", "MARK_S_SUB_DATA", "MARK_S_FIN_HELD", "MARK_S_KEPT"):
        assert _define(name) == getattr(fm, name), f"{name}: header {_define(name):#x}, pepctl {getattr(fm, name):#x}"
    assert _define("PEP_GRAPHS_MAX") == fm.GRAPHS_MAX
    assert _define("PEP_IFINDEX_BASE") == fm.IFINDEX_BASE
    assert _define("PEP_LOCAL_MARK") == fm.LOCAL_MARK
    assert _define("PEP_RETRY_MARK") == fm.RETRY_MARK
    assert _define("PEP_PORT_RETRY_MARK") == fm.PORT_RETRY_MARK
    # A slot's two interfaces, and the last slot's origin side still an ifindex (a positive int).
    assert fm.ifindexes(0) == (fm.IFINDEX_BASE, fm.IFINDEX_BASE + 1)
    assert fm.ifindexes(fm.GRAPHS_MAX - 1)[1] < 2 ** 31
    with pytest.raises(ValueError, match="slot 2048"):
        fm.ifindexes(fm.GRAPHS_MAX)


# Every struct of the header, and each field's offset and size.
STRUCTS = {
    "graph_config": ("flags", "listen_port", "pad", "control_below", "control_seed", "maxconn", "host_maxconn"),
    "conn_tag": ("slot1",),
    "port_key": ("graph", "port"),
    "addr_key": ("graph", "addr"),
    "lpm4_key": ("prefixlen", "graph", "addr"),
    "lpm6_key": ("prefixlen", "graph", "addr"),
    "flow_key": ("sub_addr", "org_addr", "sub_port", "org_port", "graph", "family", "pad"),
    "flow_new": ("verdict", "syn_seq", "synack_seq", "opener", "state", "pad", "first_seen_ns"),
    "flow_est": ("verdict", "syn_seq", "first_seen_ns", "last_seen_ns", "fins", "closing", "pad", "timer"),
    "flow_marks": ("sub_dscp", "org_dscp", "flags", "seen", "sub_mss", "org_mss"),
    "flow_syn": ("syn_seq", "state", "opener", "tcp_flags", "opt_len", "window", "ttl", "tos", "ip_word", "macs",
                 "opts", "pad", "first_seen_ns"),
    "flow_record": ("key", "start_ns", "last_ack_ns", "bytes_down", "bytes_up", "group", "closed_by", "pad"),
}
FORMATS = {"graph_config": fm.GRAPH_CONFIG, "conn_tag": fm.CONN_TAG, "port_key": fm.PORT_KEY, "addr_key": fm.ADDR_KEY,
           "lpm4_key": fm.LPM4_KEY, "lpm6_key": fm.LPM6_KEY, "flow_key": fm.FLOW_KEY, "flow_new": fm.FLOW_NEW,
           "flow_est": fm.FLOW_EST, "flow_marks": fm.FLOW_MARKS, "flow_syn": fm.FLOW_SYN,
           "flow_record": experiment.FLOW_RECORD}


def _layout_c() -> str:
    lines = [f'printf("{s} %zu\\n", sizeof(struct {s}));' for s in STRUCTS]
    lines += [f"F({s}, {f});" for s, fields in STRUCTS.items() for f in fields]
    return "\n".join([
        "#include <stdio.h>", "#include <stddef.h>", "#include <linux/types.h>",
        "#include <linux/bpf.h>   /* struct bpf_timer */", '#include "pep_flow.h"',
        '#define F(s, f) printf(#s "." #f " %zu %zu\\n", offsetof(struct s, f), sizeof(((struct s *)0)->f))',
        "int main(void)", "{", *lines, "return 0;", "}", ""])


def _fields_of(fmt) -> list[tuple[int, int]]:
    """(offset, size) of each field of a struct format; a run of padding ("x", "xx", "6x") is one field."""
    out, off, pad = [], 0, False
    for count, code in re.findall(r"(\d*)([a-zA-Z])", fmt.format.lstrip("=<>!@")):
        n = int(count or 1)
        if code == "x" and pad:
            out[-1] = (out[-1][0], out[-1][1] + n)
            off += n
        elif code in "xs":
            out.append((off, n))
            off += n
        else:
            size = {"B": 1, "H": 2, "I": 4, "Q": 8}[code]
            for _ in range(n):
                out.append((off, size))
                off += size
        pad = code == "x"
    return out


def test_struct_layouts_match_header(tmp_path):
    """The struct formats of flow_maps.py have the sizes and field offsets gcc gives the header's
    structs ("=" formats have no implicit padding, so every pad is a field on both sides)."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc not installed: cannot lay out the header's structs")
    src = tmp_path / "layout.c"
    src.write_text(_layout_c())
    exe = tmp_path / "layout"
    r = subprocess.run(["gcc", "-Wall", "-Werror", "-I", os.path.dirname(HEADER), "-o", str(exe), str(src)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"gcc on {HEADER}: {r.stderr}"
    got = dict(line.split(" ", 1) for line in subprocess.run([str(exe)], capture_output=True, text=True,
                                                               check=True).stdout.splitlines())
    for name, fields in STRUCTS.items():
        fmt = FORMATS[name]
        assert int(got[name]) == fmt.size, f"struct {name}: gcc says {got[name]} bytes, flow_maps.py {fmt.size}"
        c_fields = [tuple(int(x) for x in got[f"{name}.{f}"].split()) for f in fields]
        assert c_fields == _fields_of(fmt), \
            f"struct {name} (offset, size) of {fields}: gcc {c_fields}, flow_maps.py {fmt.format}"


def test_lpm_key_byte_order():
    """prefixlen in host order counting the graph's 32 bits, the graph and the address in network
    order (graph 1 is 00 00 00 01, 198.18.0.0 is c6 12 00 00)."""
    assert fm.lpm_key("198.18.0.0/24", 1) == (56).to_bytes(4, "little") + bytes([0, 0, 0, 1, 198, 18, 0, 0])
    assert fm.lpm_key("2001:2::/48", 0x0FAB) == ((80).to_bytes(4, "little") + bytes([0, 0, 0x0F, 0xAB])
                                                 + bytes.fromhex("20010002") + bytes(12))


@pytest.mark.parametrize("text", ["198.18.0.0/24", "198.18.0.11/32", "0.0.0.0/0", "2001:2:0:1::/64",
                                  "2001:2::10/128", "::/0", "::ffff:198.18.0.0/120",
                                  "198.18.0.10", "198.18.0.0/024"])
def test_fast_lpm_key_equals_ipaddress(text):
    """The inet_pton shortcut and ipaddress agree (a bare address is a /32 or /128 for both)."""
    net = ipaddress.ip_network(text)
    assert fm.lpm_key(text, 7) == fm.lpm_key(net, 7)


@pytest.mark.parametrize("text", ["198.18.0.5/24", "198.18.0.0/33", "198.18.0/24", "01.2.3.0/24",
                                  "2001:2::1/48", "2001:2::/129", "example/24", "198.18.0.0/-1"])
def test_bad_networks_say_what(text):
    with pytest.raises(ValueError, match=re.escape(repr(text))):
        fm.lpm_key(text, 0)


def test_addr_key_and_port_key():
    assert fm.ADDR_KEY.pack(3, fm.addr16("198.18.0.1")) == (
        (3).to_bytes(4, "little") + bytes(10) + b"\xff\xff" + bytes([198, 18, 0, 1]))
    assert fm.addr16("2001:2:0:1::1") == ipaddress.IPv6Address("2001:2:0:1::1").packed
    assert fm.port_keys([(4011, 4011)], 2) == [(2).to_bytes(4, "little") + (4011).to_bytes(4, "little")]


def test_flow_key_layout_and_round_trip():
    key = fm.flow_key("198.18.0.10", 4011, "198.19.0.10", 80, graph=0x0102)
    assert key[:16] == bytes(10) + b"\xff\xff" + bytes([198, 18, 0, 10])   # ::ffff:198.18.0.10
    assert key[32:34] == b"\x0f\xab" and key[34:36] == b"\x00\x50"       # ports in network order
    assert key[36:] == b"\x02\x01\x04\x00"                                 # graph host order, family, pad
    new = fm.FLOW_NEW.pack(2, 1000, 5000, fm.SIDE_ORIGIN, 2, 123)
    assert fm.decode_flow(key, new) == {
        "graph": 0x0102, "family": 4, "subscriber": "198.18.0.10", "sub_port": 4011, "origin": "198.19.0.10",
        "org_port": 80, "table": "flows_new", "state": "synack_seen", "opener": fm.SIDE_ORIGIN,
        "synack_seq": 5000, "verdict": "bypass_rule", "syn_seq": 1000, "first_seen_ns": 123}
    est = fm.FLOW_EST.pack(3, 1000, 123, 456, 3, 1, bytes(16))
    assert fm.decode_flow(key, est) == {
        "graph": 0x0102, "family": 4, "subscriber": "198.18.0.10", "sub_port": 4011, "origin": "198.19.0.10",
        "org_port": 80, "table": "flows", "state": "closing", "fins": 3, "last_seen_ns": 456,
        "verdict": "bypass_failopen", "syn_seq": 1000, "first_seen_ns": 123}
    key6 = fm.flow_key("2001:2:0:1::10", 43791, "2001:2:0:2::10", 443)
    assert fm.decode_flow(key6, new)["subscriber"] == "2001:2:0:1::10"
    with pytest.raises(ValueError, match="different IP versions"):
        fm.flow_key("198.18.0.10", 1, "2001:2::1", 2)


CLIENTS = ("198.18.0.10", "198.18.0.250", "0.0.0.1", "2001:2:0:1::10", "2001:2:0:1:ffff::1")


def test_client_hash_matches_header(tmp_path):
    """The control group's draw: pepctl/experiment.py's client_hash() gives what the header's
    gives, on the datapath's own key bytes (IPv4 as ::ffff:a.b.c.d)."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc not installed: cannot run the header's client_hash")
    rows = []
    for addr in CLIENTS:
        for seed in (0, 1, 0xFFFFFFFF):
            packed = fm.addr16(addr)
            rows.append("{" + ",".join(str(b) for b in packed) + f"}}, {seed}u")
    src = tmp_path / "hash.c"
    src.write_text("\n".join([
        "#include <stdio.h>", "#include <linux/types.h>", "#include <linux/bpf.h>",
        '#include "pep_flow.h"',
        "struct row { __u8 a[16]; __u32 seed; };",
        "static const struct row rows[] = {" + ",".join("{" + r + "}" for r in rows) + "};",
        "int main(void)", "{", "for (unsigned i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)",
        '\tprintf("%u\\n", client_hash(rows[i].a, rows[i].seed));', "return 0;", "}", ""]))
    exe = tmp_path / "hash"
    r = subprocess.run(["gcc", "-Wall", "-Werror", "-I", os.path.dirname(HEADER), "-o", str(exe), str(src)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"gcc on {HEADER}: {r.stderr}"
    got = [int(x) for x in subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()]
    want = [experiment.client_hash(a, seed) for a in CLIENTS for seed in (0, 1, 0xFFFFFFFF)]
    assert got == want, f"client_hash: header {got}, pepctl/experiment.py {want}"


def test_control_share_is_close_to_the_fraction():
    clients = [f"198.18.{i >> 8}.{i & 255}" for i in range(20000)]
    share = sum(experiment.group_of(c, 0.2) == "control" for c in clients) / len(clients)
    assert 0.18 < share < 0.22, f"control share of 20000 clients at fraction 0.2: {share}"
    assert all(experiment.group_of(c, 0.0) == "treated" for c in clients[:1000])


def test_graph_config_encoding():
    assert fm.graph_config(fm.GRAPH_F_ENABLED | fm.GRAPH_F_ASSIGN, 50080, 7, 9, 4011, 70000) == (
        (3).to_bytes(4, "little") + (50080).to_bytes(2, "little") + bytes(2) + (7).to_bytes(4, "little")
        + (9).to_bytes(4, "little") + (4011).to_bytes(4, "little") + (70000).to_bytes(4, "little"))
    with pytest.raises(ValueError, match="70000"):
        fm.graph_config(fm.GRAPH_F_ENABLED, 70000)


def test_port_ranges_checked():
    with pytest.raises(ValueError, match="70000"):
        fm.port_keys([(1, 70000)], 0)
    assert fm.port_keys([(80, 81), (81, 81)], 1) == [fm.PORT_KEY.pack(1, 80), fm.PORT_KEY.pack(1, 81)]
