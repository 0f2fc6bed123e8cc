"""What `pepctl upgrade` decides without touching a host: which maps it keeps, converts, recreates
or refuses (pepctl/layouts.py), how an entry is rebuilt in a new layout, where a counter goes, and
the journal it writes (pepctl/upgrade.py merge).

How right is told from wrong: the layouts are real BTF, from small BPF objects compiled here by
clang (two versions of one map definition, as a header change makes them), read as pepctl reads
tc/*.o; the entries are bytes packed by hand for the old layout and unpacked by hand from the new.
The journal cases are a journal of the last release's shape against `up`'s plan of this one.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess

import pytest

from pepctl import flow_maps, layouts, upgrade

HEADER = """
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
"""

OLD = HEADER + """
struct cfg { __u32 flags; __u16 port; __u16 pad; __u32 below; __u32 seed; };
struct est { __u32 verdict; __u32 seq; struct bpf_timer timer; };
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, 16); __type(key, __u32); __type(value, struct cfg); }
    graphs SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, 64); __type(key, __u32); __type(value, struct est); }
    flows SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, 64); __type(key, __u32); __type(value, __u32); }
    same SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, 64); __type(key, __u32); __type(value, __u16); }
    retyped SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, 64); __type(key, __u32); __type(value, __u16); }
    addrs SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY); __uint(max_entries, 16 * 3); __type(key, __u32);
         __type(value, __u64); } flow_stats SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_QUEUE); __uint(max_entries, 8); __type(value, struct cfg); } records SEC(".maps");
char _license[] SEC("license") = "GPL";
"""

# The next version of the same file: fields added (graphs' cfg, and flows' est beside a timer), a
# value type widened (retyped, addrs), counters added (flow_stats), a queue's value changed, a map added.
NEW = (OLD.replace("__u32 seed; };", "__u32 seed; __u32 maxconn; __u32 host_maxconn; };")
       .replace("__u32 seq; struct bpf_timer", "__u32 seq; __u32 more; struct bpf_timer")
       .replace("__type(value, __u16)", "__type(value, __u32)")
       .replace("16 * 3", "16 * 5")
       .replace("__type(value, struct cfg); } records", "__type(value, __u64); } records")
       .replace("char _license", "struct { __uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, 8); "
                "__type(key, __u32); __type(value, __u32); } fresh SEC(\".maps\");\nchar _license"))


def build(tmp_path, name: str, source: str) -> str:
    if shutil.which("clang") is None or shutil.which("bpftool") is None:
        pytest.skip("clang or bpftool not installed: no BPF object to read layouts from (scripts/setup installs them)")
    src, obj = tmp_path / f"{name}.c", tmp_path / f"{name}.o"
    src.write_text(source)
    subprocess.run(["clang", "-O2", "-g", "-target", "bpf", "-I/usr/include/x86_64-linux-gnu", "-c", str(src),
                    "-o", str(obj)], check=True, capture_output=True)
    return str(obj)


@pytest.fixture(scope="module")
def defs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("layouts")
    return layouts.object_maps(build(tmp, "old", OLD)), layouts.object_maps(build(tmp, "new", NEW))


def decide(defs, name: str) -> layouts.Decision:
    old, new = defs
    return layouts.decide(name, old.get(name), new[name], refilled={"addrs"},
                          remap={"flow_stats": flow_maps.stats_index})


def test_each_map_gets_what_its_change_allows(defs):
    got = {name: decide(defs, name).action for name in defs[1]}
    assert got == {"graphs": "convert", "flows": "refuse", "same": "reuse", "retyped": "refuse", "addrs": "recreate",
                   "flow_stats": "convert", "records": "refuse", "fresh": "new"}, got
    assert "maxconn" in decide(defs, "graphs").why and "host_maxconn" in decide(defs, "graphs").why
    assert "bpf_timer" in decide(defs, "flows").why, decide(defs, "flows")
    assert "entries 48 -> 80" in decide(defs, "flow_stats").why, decide(defs, "flow_stats")


def test_an_entry_is_rebuilt_field_by_field(defs):
    old, new = defs[0]["graphs"], defs[1]["graphs"]
    plan = layouts.copies(old.value, new.value)
    entry = struct.pack("=IHHII", 0xCF, 50080, 0, 7, 4011)
    got = struct.unpack("=IHHIIII", layouts.rebuild(entry, plan, new.value.size))
    assert got == (0xCF, 50080, 0, 7, 4011, 0, 0), f"graphs' entry rebuilt as {got}"
    back = layouts.copies(new.value, old.value)
    again = layouts.rebuild(struct.pack("=IHHIIII", 1, 2, 0, 3, 4, 5, 6), back, old.value.size)
    assert struct.unpack("=IHHII", again) == (1, 2, 0, 3, 4), "fields removed are dropped, the others kept"


def test_a_changed_type_or_a_timer_is_not_carried(defs):
    old, new = defs
    with pytest.raises(layouts.NotConvertible, match="bpf_timer"):
        layouts.copies(old["flows"].value, new["flows"].value)
    same = old["flows"].value
    assert layouts.copies(same, same) == [(0, 0, same.size)], "an unchanged layout, timer and all, is copied whole"


def test_counters_keep_their_number_per_graph():
    old, new = flow_maps.GRAPHS_MAX * 21, flow_maps.GRAPHS_MAX * 34
    assert flow_maps.stats_index(0, old, new) == 0
    assert flow_maps.stats_index(20, old, new) == 20
    assert flow_maps.stats_index(21, old, new) == 34, "graph 1's first counter"
    assert flow_maps.stats_index(21 * 5 + 3, old, new) == 34 * 5 + 3
    assert flow_maps.stats_index(33, new, old) is None, "a counter the older layout lacks has nowhere to go"


def test_flow_stats_of_this_tree_is_carried_from_the_last_release_by_index():
    """The real objects: tc/flow.o's flow_stats against the last release's size (21 counters)."""
    path = os.path.join(os.path.dirname(__file__), "..", "..", "tc", "flow.o")
    if not os.path.exists(path):
        pytest.skip("tc/flow.o not built: run scripts/setup")
    new = layouts.object_maps(path)
    old = layouts.MapDef("flow_stats", layouts.PERCPU_ARRAY, flow_maps.GRAPHS_MAX * 21, 0, new["flow_stats"].key,
                         new["flow_stats"].value)
    d = layouts.decide("flow_stats", old, new["flow_stats"], remap=upgrade.REMAPS)
    assert d.action == "convert" and "carried by index" in d.why, d
    assert new["flow_stats"].max_entries == flow_maps.GRAPHS_MAX * len(flow_maps.COUNTERS)
    assert new["graphs"].value.size == flow_maps.GRAPH_CONFIG.size, "graphs' value in BTF and in flow_maps"


# -- the journal ----------------------------------------------------------------------------------
def call(name: str, *args, what: str = "") -> dict:
    return {"what": what or name, "call": name, "args": list(args), "show": f"{name} {args}"}


def argv(*words: str, what: str = "") -> dict:
    return {"what": what or " ".join(words), "argv": list(words), "input": None}


REG = call("unregister", "/run/pep-instances/p.json")
BPF_DIR = call("rmdir", "/sys/fs/bpf/p", [])
CLSACT = argv("tc", "qdisc", "del", "dev", "nic0", "clsact")
FLOW_PINS = call("rmdir", "/sys/fs/bpf/p/p/flow", None)
CONNS = call("cgroup_detach", "/sys/fs/cgroup", "/sys/fs/bpf/p/p/flow/prog/flow_conns")
RUN_OLD = call("rmdir", "/run/pep/p", ["haproxy.cfg", "*.nft"])
RUN_NEW = call("rmdir", "/run/pep/p", ["*.nft", "haproxy.cfg", "upgrade.thing"])
TUNED = argv("sysctl", "-q", "-w", "net.core.rmem_max=4194304")
CC = call("congestion_release", "pep_radio", "/run/pep/p.journal")
SPACES = call("remove_namespaces", ["p-g"], ["pc100", "ps200"])
RADIO = call("radio_forget", "/sys/fs/bpf/pep-congestion/pep_radio", "p-g")
SUP = call("stop_supervisor", "pepctl", "/run/pep/p")
TRUNK = argv("tc", "filter", "del", "dev", "nic0", "ingress", "pref", "10")


def test_the_upgraded_journal_is_ups_with_the_old_host_settings():
    """The old journal (the last release's up) holds a tuned sysctl this up no longer plans (the host
    is tuned now) and made bpf_dir, which this up's plan has too; the plan adds flow_conns, pep_radio
    and its parameters, which the upgrade made, and a clsact it skipped (made before): not owned."""
    old = [REG, BPF_DIR, FLOW_PINS, RUN_OLD, TUNED, SPACES, SUP, TRUNK]
    build = [REG, BPF_DIR, CLSACT, FLOW_PINS, CONNS, RUN_NEW, CC, SPACES, RADIO, SUP, TRUNK]
    got = upgrade.merge(old, build, [CONNS, CC, RADIO])
    assert got == [REG, BPF_DIR, FLOW_PINS, CONNS, RUN_NEW, TUNED, CC, SPACES, RADIO, SUP, TRUNK], \
        "\n".join(e["what"] for e in got)


def test_a_second_graph_s_parameters_are_not_taken_for_the_first_s():
    """A graph that now runs pep_radio beside one that already did: its radio_forget shares the first
    argument (the pins folder) with the other graph's, and must still be journaled, as its own."""
    second = call("radio_forget", "/sys/fs/bpf/pep-congestion/pep_radio", "p-g2")
    old = [REG, CC, SPACES, RADIO, SUP]
    assert not upgrade.journaled(second, old), "graph p-g2's undo taken for p-g's"
    got = upgrade.merge(old, [REG, CC, SPACES, RADIO, second, SUP], [second])
    assert got == [REG, CC, SPACES, RADIO, second, SUP], "\n".join(e["what"] for e in got)


def test_an_upgrade_that_adds_nothing_keeps_the_journal():
    old = [REG, BPF_DIR, FLOW_PINS, CONNS, RUN_NEW, CC, SPACES, RADIO, SUP, TRUNK]
    assert upgrade.merge(old, old, []) == old
    assert upgrade.merge(old, [REG, SUP], []) == old, "entries up no longer plans keep their place"


def test_a_rule_the_namespace_has_is_not_added_again():
    """Route mode's rules as `ip -j rule` prints them, against the lines this version's plan has:
    only its new mark rule is missing (rule add of one that exists fails, or doubles it)."""
    have = [{"priority": 0, "src": "all", "table": "local"},
            {"priority": 100, "src": "all", "iif": "c_in", "ipproto": "tcp", "dport": 80, "table": "100"},
            {"priority": 100, "src": "all", "iif": "s_in", "ipproto": "tcp", "sport": 80, "table": "100"},
            {"priority": 32766, "src": "all", "table": "main"}]
    lines = ["rule add pref 100 fwmark 1 lookup 100", "rule add pref 100 iif c_in ipproto tcp dport 80 lookup 100",
             "rule add pref 100 iif s_in ipproto tcp sport 80 lookup 100"]
    keys = {upgrade.rule_key(upgrade.rule_of_json(r)) for r in have}
    assert [x for x in lines if upgrade.rule_key(upgrade.rule_of_line(x)) not in keys] == [lines[0]]
    marked = {"priority": 100, "src": "all", "fwmark": "0x1", "table": "100"}
    assert upgrade.rule_key(upgrade.rule_of_json(marked)) == upgrade.rule_key(upgrade.rule_of_line(lines[0]))
