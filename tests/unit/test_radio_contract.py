"""pepctl/radio_maps.py speaks congestion/radio.h: pep_radio's name, constants, histogram bounds, and
the layouts of struct radio_params and struct radio_graph_stats as a C compiler lays them out from
the header itself; and the map names and key/value types congestion/radio.bpf.c declares.

How right is told from wrong: gcc compiles a program that includes the header and prints every
constant, every bound, and the offset and size of every field the mirror names; the header's own
list of members (parsed) must be the mirror's, in order. A field added, removed, resized or moved
in the header fails here, so the exporter never reads one struct as another.
"""

import os
import re
import shutil
import struct
import subprocess

import pytest

from pepctl import radio_maps as rm

CONGESTION = os.path.join(os.path.dirname(__file__), "..", "..", "congestion")
HEADER = os.path.join(CONGESTION, "radio.h")
PROGRAM = os.path.join(CONGESTION, "radio.bpf.c")
LAYOUTS = (rm.PARAMS, rm.STATS, rm.SUB_KEY, rm.SUB)
# #define -> the mirror's value.
CONSTANTS = {"RADIO_GRAPHS_MAX": rm.GRAPHS_MAX, "RADIO_SUBSCRIBERS_MAX": rm.SUBSCRIBERS_MAX,
             "RADIO_TARGET_US": rm.TARGET_US, "RADIO_EPOCH_US": rm.EPOCH_US, "RADIO_STALE_US": rm.STALE_US,
             "RADIO_OUTAGE_US": rm.OUTAGE_US, "RADIO_RTO_MAX_MS": rm.RTO_MAX_MS, "RADIO_RTO_MAX_RTTS": rm.RTO_MAX_RTTS,
             "RADIO_FAST_RETRIES": rm.FAST_RETRIES,
             "RADIO_QDELAY_BUCKETS": rm.QDELAY_BUCKETS,
             "RADIO_RATE_BUCKETS": rm.RATE_BUCKETS,
             **{f"RADIO_TS_{'MS' if word == 'ms' else word.upper()}": value for value, word in rm.TS_CLOCKS.items()}}
BOUNDS = {"RADIO_QDELAY_BOUNDS_US": rm.QDELAY_BOUNDS_US, "RADIO_RATE_BOUNDS": rm.RATE_BOUNDS}


def _text(path: str) -> str:
    with open(path) as f:
        return re.sub(r"/\*.*?\*/|//[^\n]*", "", f.read(), flags=re.S)


def _program() -> str:
    lines = ['printf("RADIO_NAME %s\\n", RADIO_NAME);']
    lines += [f'printf("{c} %llu\\n", (unsigned long long)({c}));' for c in CONSTANTS]
    for name in BOUNDS:
        lines += [f"{{ static const unsigned long long b[] = {name};",
                  f'printf("{name}"); for (unsigned i = 0; i < sizeof(b) / sizeof(b[0]); i++) printf(" %llu", b[i]);',
                  'printf("\\n"); }']
    for layout in LAYOUTS:
        s = layout.c_name
        lines.append(f'printf("{s} %zu\\n", sizeof(struct {s}));')
        lines += [f'printf("{s}.{f} %zu %zu\\n", offsetof(struct {s}, {f}), sizeof(((struct {s} *)0)->{f}));'
                  for f, _ in layout.fields]
    return "\n".join(["#include <stdio.h>", "#include <stddef.h>", "#include <linux/types.h>", '#include "radio.h"',
                      "int main(void)", "{", *lines, "return 0;", "}", ""])


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> dict[str, str]:
    """What gcc makes of the header: name -> the rest of its printed line."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc not installed: cannot lay out the header's structs")
    d = tmp_path_factory.mktemp("radio")
    (d / "contract.c").write_text(_program())
    r = subprocess.run(["gcc", "-Wall", "-Werror", "-I", CONGESTION, "-o", str(d / "contract"), str(d / "contract.c")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"gcc on {HEADER}: {r.stderr}"
    out = subprocess.run([str(d / "contract")], capture_output=True, text=True, check=True).stdout
    return dict(line.split(" ", 1) for line in out.splitlines())


def test_name_and_constants_match_header(compiled):
    assert compiled["RADIO_NAME"] == rm.NAME, f"RADIO_NAME: header {compiled['RADIO_NAME']!r}, pepctl {rm.NAME!r}"
    for name, mine in CONSTANTS.items():
        assert int(compiled[name]) == mine, f"{name}: header {compiled[name]}, pepctl/radio_maps.py {mine}"


def test_bucket_bounds_match_header(compiled):
    for name, mine in BOUNDS.items():
        got = tuple(int(x) for x in compiled[name].split())
        assert got == mine, f"{name}: header {got}, pepctl/radio_maps.py {mine}"
        # The exporter's histograms: rising finite bounds, then one 0 (+Inf) that closes the list.
        assert got[-1] == 0 and 0 not in got[:-1], f"{name}: the last bound, and only it, must be 0 (+Inf): {got}"
        assert list(got[:-1]) == sorted(set(got[:-1])), f"{name}: bounds must rise: {got}"
    assert len(rm.QDELAY_BOUNDS_US) == rm.QDELAY_BUCKETS and len(rm.RATE_BOUNDS) == rm.RATE_BUCKETS


def test_struct_layouts_match_header(compiled):
    """Size and (offset, size) of every field, as gcc lays the header's structs out."""
    for layout in LAYOUTS:
        s = layout.c_name
        assert int(compiled[s]) == layout.size, f"struct {s}: gcc says {compiled[s]} bytes, radio_maps.py {layout.size}"
        off = 0
        for field, code in layout.fields:
            size = struct.calcsize("=" + code)
            got = tuple(int(x) for x in compiled[f"{s}.{field}"].split())
            assert got == (off, size), f"struct {s}.{field}: gcc (offset, size) {got}, radio_maps.py {(off, size)}"
            off += size


def _members(struct_name: str) -> list[str]:
    body = re.search(rf"struct {struct_name} \{{(.*?)\}};", _text(HEADER), re.S)
    assert body, f"{HEADER} has no struct {struct_name}"
    return [re.match(r"\s*(\w+)", m.split()[-1]).group(1) for m in body.group(1).split(";") if m.strip()]


def test_the_mirror_names_every_member_in_order():
    """A member the mirror does not name (added, renamed, reordered) fails here, even at the same size."""
    for layout in LAYOUTS:
        mine = list(dict.fromkeys(name.split("[")[0].split(".")[0] for name, _ in layout.fields))
        assert mine == _members(layout.c_name), \
            f"struct {layout.c_name}: header members {_members(layout.c_name)}, radio_maps.py {mine}"
    rise = ["drain_ms", "least_us", "before_us"]
    assert _members("radio_rise") == rise, _members("radio_rise")
    assert [n.split(".")[1] for n, _ in rm.SUB.fields if n.startswith("rtt_rise.")] == rise
    slot = ["epoch", "subscribers", "rate_sum"]
    assert _members("radio_epoch_count") == slot, _members("radio_epoch_count")
    assert [n.split(".")[1] for n, _ in rm.STATS.fields if n.startswith("active[0].")] == slot


def test_maps_of_the_program_are_the_mirror_s():
    """radio.bpf.c declares the maps pepctl opens by name, with the mirror's key and value types."""
    maps = {name: body for body, name in re.findall(r"struct \{(.*?)\} (\w+) SEC\(\"\.maps\"\);", _text(PROGRAM),
                                                    re.S)}
    for name, value, entries in ((rm.PARAMS_MAP, "struct radio_params", "RADIO_GRAPHS_MAX"),
                                 (rm.STATS_MAP, "struct radio_graph_stats", "RADIO_GRAPHS_MAX"),
                                 (rm.SUBS_MAP, "struct radio_sub", "RADIO_SUBSCRIBERS_MAX")):
        assert name in maps, f"{PROGRAM} declares no map {name} (it has {sorted(maps)})"
        assert f"__type(value, {value})" in maps[name], f"map {name}: value is not {value}: {maps[name]}"
        assert f"__uint(max_entries, {entries})" in maps[name], f"map {name}: max_entries is not {entries}"
    for name in (rm.PARAMS_MAP, rm.STATS_MAP):
        assert "__type(key, __u32)" in maps[name], f"map {name}: key is not __u32 (the namespace's inode)"
    assert "__type(key, struct radio_sub_key)" in maps[rm.SUBS_MAP], \
        f"map {rm.SUBS_MAP}: key is not struct radio_sub_key"
    assert re.search(r"\.name = RADIO_NAME,", _text(PROGRAM)), f"{PROGRAM}: the struct_ops is not named RADIO_NAME"


def test_a_wrong_size_is_refused_not_misread():
    with pytest.raises(ValueError, match="radio_graph_stats is 8 bytes there, pepctl/radio_maps.py expects"):
        rm.STATS.unpack(bytes(8), "radio_stats")
    values = len(rm.STATS.struct.unpack(bytes(rm.STATS.size)))     # every number, array items one by one
    got = rm.STATS.unpack(rm.STATS.struct.pack(*range(values)))
    assert got["flows_started"] == 0 and got["qdelay_bucket"] == tuple(range(9, 9 + rm.QDELAY_BUCKETS))
    assert got["active[1].rate_sum"] == values - 1
