"""pepctl/bypass_maps.py speaks tc/pep_bypass.h: counter and verdict order, struct layouts (as a C
compiler lays them out from the header itself), and the encoders' byte order."""

import ipaddress
import os
import re
import shutil
import subprocess

import pytest

from pepctl import bypass_maps as bm

HEADER = os.path.join(os.path.dirname(__file__), "..", "..", "tc", "pep_bypass.h")


def _enum(name: str, prefix: str) -> list[str]:
    with open(HEADER) as f:
        text = re.sub(r"/\*.*?\*/", "", f.read(), flags=re.S)
    body = re.search(rf"enum {name} \{{(.*?)\}};", text, re.S).group(1)
    return re.findall(rf"^\s*{prefix}([A-Z0-9_]+)", body, re.M)


def test_counters_match_header_enum():
    names = _enum("bypass_counter", "CNT_")
    assert names[-1] == "MAX", f"CNT_MAX must close enum bypass_counter in {HEADER}, got {names[-1]}"
    assert [n.lower() for n in names[:-1]] == list(bm.COUNTERS), \
        f"pepctl/bypass_maps.py COUNTERS {bm.COUNTERS} != header {names[:-1]}"


def test_verdicts_and_sides_match_header():
    with open(HEADER) as f:
        text = f.read()
    for value, name in bm.VERDICTS.items():
        want = f"VERDICT_{name.upper()} = {value},"
        assert want in text, f"{HEADER} has no {want}"
    for want in (f"SIDE_ACCESS = {bm.SIDE_ACCESS},", f"SIDE_ORIGIN = {bm.SIDE_ORIGIN},"):
        assert want in text, f"{HEADER} has no {want}"
    assert re.search(rf"#define BYPASS_PORTS_MAX {bm.BYPASS_PORTS_MAX}\b", text)


LAYOUT_C = r"""
#include <stdio.h>
#include <stddef.h>
#include <linux/types.h>
#include "pep_bypass.h"
#define F(s, f) printf(#s "." #f " %zu %zu\n", offsetof(struct s, f), sizeof(((struct s *)0)->f))
int main(void)
{
    printf("side_config %zu\nlpm4_key %zu\nlpm6_key %zu\nflow_key %zu\nflow_value %zu\nproxy_state %zu\n",
           sizeof(struct side_config), sizeof(struct lpm4_key), sizeof(struct lpm6_key),
           sizeof(struct flow_key), sizeof(struct flow_value), sizeof(struct proxy_state));
    F(flow_key, sub_addr); F(flow_key, org_addr); F(flow_key, sub_port); F(flow_key, org_port);
    F(flow_key, family); F(flow_value, verdict); F(flow_value, syn_seq); F(flow_value, first_seen_ns);
    F(lpm4_key, addr); F(lpm6_key, addr);
    return 0;
}
"""


def test_struct_layouts_match_header(tmp_path):
    """The struct formats of bypass_maps.py have the sizes and offsets gcc gives the header's structs."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc not installed: cannot lay out the header's structs")
    src = tmp_path / "layout.c"
    src.write_text(LAYOUT_C)
    exe = tmp_path / "layout"
    r = subprocess.run(["gcc", "-Wall", "-Werror", "-I", os.path.dirname(HEADER), "-o", str(exe), str(src)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"gcc on {HEADER}: {r.stderr}"
    got = dict(line.split(" ", 1) for line in subprocess.run([str(exe)], capture_output=True, text=True,
                                                               check=True).stdout.splitlines())
    want = {
        "side_config": bm.SIDE_CONFIG.size, "lpm4_key": bm.LPM4_KEY.size, "lpm6_key": bm.LPM6_KEY.size,
        "flow_key": bm.FLOW_KEY.size, "flow_value": bm.FLOW_VALUE.size, "proxy_state": bm.PROXY_STATE.size,
    }
    assert {k: int(got[k]) for k in want} == want
    # "=16s16s2s2sB3x" and "=IIQ": offset size of each field
    fields = {"flow_key.sub_addr": "0 16", "flow_key.org_addr": "16 16", "flow_key.sub_port": "32 2",
              "flow_key.org_port": "34 2", "flow_key.family": "36 1", "flow_value.verdict": "0 4",
              "flow_value.syn_seq": "4 4", "flow_value.first_seen_ns": "8 8", "lpm4_key.addr": "4 4",
              "lpm6_key.addr": "4 16"}
    assert {k: got[k] for k in fields} == fields


def test_lpm_key_byte_order():
    """prefixlen in host order, the address in network order (198.18.0.0 is c6 12 00 00)."""
    assert bm.lpm_key("198.18.0.0/24") == (24).to_bytes(4, "little") + bytes([198, 18, 0, 0])
    assert bm.lpm_key("2001:2::/48") == (48).to_bytes(4, "little") + bytes.fromhex("20010002") + bytes(12)


@pytest.mark.parametrize("text", ["198.18.0.0/24", "198.18.0.11/32", "0.0.0.0/0", "2001:2:0:1::/64",
                                  "2001:2::10/128", "::/0", "::ffff:198.18.0.0/120",
                                  "198.18.0.10", "198.18.0.0/024"])
def test_fast_lpm_key_equals_ipaddress(text):
    """The inet_pton shortcut and ipaddress agree (a bare address is a /32 or /128 for both)."""
    net = ipaddress.ip_network(text)
    assert bm.lpm_key(text) == bm.lpm_key(net)


@pytest.mark.parametrize("text", ["198.18.0.5/24", "198.18.0.0/33", "198.18.0/24", "01.2.3.0/24",
                                  "2001:2::1/48", "2001:2::/129", "example/24", "198.18.0.0/-1"])
def test_bad_networks_say_what(text):
    with pytest.raises(ValueError, match=re.escape(repr(text))):
        bm.lpm_key(text)


def test_flow_key_layout_and_round_trip():
    key = bm.flow_key("198.18.0.10", 4011, "198.19.0.10", 80)
    assert key[:16] == bytes(10) + b"\xff\xff" + bytes([198, 18, 0, 10])   # ::ffff:198.18.0.10
    assert key[32:34] == b"\x0f\xab" and key[34:36] == b"\x00\x50"       # ports in network order
    assert key[36:] == b"\x04\0\0\0"
    value = bm.FLOW_VALUE.pack(2, 1000, 123)
    assert bm.decode_flow(key, value) == {
        "family": 4, "subscriber": "198.18.0.10", "sub_port": 4011, "origin": "198.19.0.10", "org_port": 80,
        "verdict": "bypass_rule", "syn_seq": 1000, "first_seen_ns": 123}
    key6 = bm.flow_key("2001:2:0:1::10", 43791, "2001:2:0:2::10", 443)
    assert bm.decode_flow(key6, value)["subscriber"] == "2001:2:0:1::10"
    with pytest.raises(ValueError, match="different IP versions"):
        bm.flow_key("198.18.0.10", 1, "2001:2::1", 2)


def test_port_ranges_checked():
    with pytest.raises(ValueError, match="70000"):
        bm._port_keys([(1, 70000)])
    assert bm._port_keys([(80, 81), (81, 81)]) == [bm.U32.pack(80), bm.U32.pack(81)]
