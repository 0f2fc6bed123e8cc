"""An idle bypassed connection outlives a flood of 1,000,000 new flows from spoofed sources.

   client 198.18.0.10 ── idle keep-alive connection to nginx, bypassed by a client rule
          (raw socket) ── synflood.py: 1,001,000 SYNs from 198.18.0.2-254 (not .1, the PEP; not .10),
                          every one a new 4-tuple, to 198.19.0.10:80, in about 15 s
   switch == nic0 [proxyhost] == c_in [pep: tc flow_ingress: flows_new (LRU, 262,144) | flows (hash)] s_in
      == ... -- origin nginx 198.19.0.10:80 (answers the SYNs: SYN cookies; the answers go nowhere)

Two floods, by the rule in force: "bypassed" (`bypass add client 198.18.0.0/24`: every spoofed SYN
is a new bypassed flow and churns flows_new, the LRU) and "proxied" (`bypass add client
198.18.0.10/32`: the spoofed SYNs go to HAProxy's listener, as in the flood that evicted idle
bypassed flows before issue 11, when proxied flows had entries too). Each on the default lab
(interception `bpf`), on one with `--interception nft --ports 80` and on one with `--interception
route --ports 80`. A lost entry no longer costs the connection in any mode
(test_a_lost_entry_costs_no_connection): in mode bpf the stack routes a segment no socket owns; in
modes nft and route, where the interception would deliver it locally (nft's tproxy to HAProxy's
listener, which would reset it; route mode's rules the origin's answers too, to no socket), the
datapath forwards it itself (tc/flow.c unowned). The flood test reads the entry itself, so it still
tells a kept entry from a lost one.

How right is told from wrong: the idle connection's entry is read from the flow tables before and
after the flood (table, verdict, ISN, first_seen: the same entry, still in `flows`); the flood's
own SYNs are counted by the datapath (flows_bypass_rule, or flows_proxied, grows by at least
1,000,000: each was a new flow; flows_promoted does not: none completed a handshake). After the
bypassed flood flows_new is full of its flows (the LRU evicted the rest); after the proxied one
it holds no more than before; `flows` gained nothing either way. Last the idle connection is used
again: its answer must come, in full, over the same connection.
"""

from __future__ import annotations

import json
import os

import pytest

from netns.addresses import ACCESS_GW4, ACCESS_NET4, CLIENT4, ORIGIN4
from netns.handle import PYTHON
from pepctl import config as configmod
from pepctl import flow_maps

HERE = os.path.dirname(os.path.abspath(__file__))
SYNFLOOD = os.path.join(HERE, "synflood.py")
LAB_MODES = {"bpf": [], "nft": ["--interception", "nft", "--ports", "80"],
             "route": ["--interception", "route", "--ports", "80"]}
PEP_ACCESS = ACCESS_GW4
FLOOD = 1_000_000
# The lab's veths drop a few frames of a flood this fast (a CPU's backlog overflows: a handful per
# million, /proc/net/softnet_stat's second column): the sender sends this many more, and the
# datapath's own count must reach FLOOD.
MARGIN = 1_000
FLOWS_NEW_MAX = 262144      # tc/pep_flow.h
FLOOD_SECONDS = 50          # the sender stops there, whatever it sent (the test then fails)

# A keep-alive connection that answers on stdin: each line read makes one request (GET /1k) on the
# same connection and prints {"port", "status", "body", "error"}; nginx keeps an idle connection
# for 75 s (keepalive_timeout's default), longer than the flood takes.
IDLE_CLIENT = r"""
import json, socket, sys
src, dst = sys.argv[1], sys.argv[2]
s = socket.create_connection((dst, 80), timeout=5, source_address=(src, 0))
f = s.makefile("rb")
port = s.getsockname()[1]
for line in sys.stdin:
    out = {"port": port, "status": "", "body": 0, "error": ""}
    try:
        s.sendall(b"GET /1k HTTP/1.1\r\nHost: origin\r\n\r\n")
        out["status"] = f.readline().decode().strip()
        length = 0
        while (h := f.readline()) not in (b"\r\n", b""):
            if h.lower().startswith(b"content-length:"):
                length = int(h.split(b":")[1])
        out["body"] = len(f.read(length))
    except OSError as e:
        out["error"] = type(e).__name__
    print(json.dumps(out), flush=True)
"""



@pytest.fixture(scope="module")
def pins(lab) -> str:
    cfg = configmod.load(os.path.join(lab.run_dir, "pep.toml"))
    assert cfg.graphs[0].index == 0
    return cfg.instance_names().flow_pins


@pytest.fixture
def bypass_rule(lab, request):
    """A bypass rule while the test runs (new flows only): the test's parameter, or the whole access
    subnet."""
    rule = getattr(request, "param", ACCESS_NET4)
    lab.pepctl("bypass", "add", "client", rule)
    try:
        yield rule
    finally:
        lab.pepctl("bypass", "del", "client", rule)


class IdleConnection:
    """IDLE_CLIENT in the client namespace: ask() makes one request on its one connection."""

    def __init__(self, lab):
        self.proc = lab.popen("client", PYTHON, "-c", IDLE_CLIENT, CLIENT4, ORIGIN4, stdin=-1)

    def ask(self) -> dict:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(timeout=5)
            raise AssertionError(f"client: the idle connection's process exited {self.proc.returncode}: "
                                 f"{self.proc.stderr.read()[-1000:]}")
        return json.loads(line)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def answered(a: dict) -> bool:
    return a["status"] == "HTTP/1.1 200 OK" and a["body"] == 1024 and not a["error"]


def entry(pins: str, port: int) -> dict | None:
    """The idle connection's entry in the flow tables (flows first: where it must be)."""
    key = flow_maps.flow_key(CLIENT4, port, ORIGIN4, 80)
    for table in ("flows", "flows_new"):
        with flow_maps.open_map(pins, table) as m:
            value = m.lookup(key)
        if value is not None:
            return flow_maps.decode_flow(key, value)
    return None


def table_size(pins: str, table: str) -> int:
    with flow_maps.open_map(pins, table) as m:
        return sum(1 for _ in m.keys())


def grew(before: dict, after: dict) -> dict:
    return {k: after[k] - before[k] for k in before if after[k] != before[k]}


def open_idle(lab, pins) -> tuple[IdleConnection, dict]:
    idle = IdleConnection(lab)
    first = idle.ask()
    assert answered(first), f"client {CLIENT4}: first request on the keep-alive connection: {first}"
    e = entry(pins, first["port"])
    assert e and e["table"] == "flows" and e["verdict"] == "bypass_rule" and e["state"] == "established", \
        f"pep flow tables: {CLIENT4} port {first['port']}: expected an established bypass_rule entry in flows, " \
        f"got {e}"
    return idle, e


# What the flood is, by the rule in force: "bypassed" (the whole access subnet: every spoofed SYN is
# a new bypassed flow, remembered in flows_new) or "proxied" (only the idle client: the spoofed SYNs
# go to HAProxy's listener, as in the flood that evicted bypassed flows before issue 11).
FLOODS = {"bypassed": ACCESS_NET4, "proxied": f"{CLIENT4}/32"}


@pytest.mark.slow
@pytest.mark.parametrize("bypass_rule", list(FLOODS.values()), ids=list(FLOODS), indirect=True)
def test_idle_bypassed_connection_outlives_a_million_new_flows(lab, pins, bypass_rule):
    kind = "bypassed" if bypass_rule == ACCESS_NET4 else "proxied"
    idle, before = open_idle(lab, pins)
    try:
        c0, new0, flows0 = flow_maps.read_counters(pins, 0), table_size(pins, "flows_new"), table_size(pins, "flows")
        proc = lab.run("client", PYTHON, SYNFLOOD, "--count", str(FLOOD + MARGIN), "--net", ACCESS_NET4,
                       "--exclude", PEP_ACCESS, "--exclude", CLIENT4, "--dst", ORIGIN4, "--dport", "80",
                       "--max-seconds", str(FLOOD_SECONDS), timeout=FLOOD_SECONDS + 30)
        flood = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"\n[{lab.interception}, {kind} flood] sender: {flood}")
        assert flood["sent"] == FLOOD + MARGIN, \
            f"client: synflood sent {flood['sent']} of {FLOOD + MARGIN} SYNs in {flood['seconds']} s " \
            f"(errors {flood['errors']})"
        c1 = flow_maps.read_counters(pins, 0)
        new1, flows1 = table_size(pins, "flows_new"), table_size(pins, "flows")
        after = entry(pins, before["sub_port"])
        second = idle.ask()
    finally:
        idle.close()
    moved = grew(c0, c1)
    print(f"[{lab.interception}, {kind} flood] counters moved: {moved}; flows_new {new0} -> {new1} entries, "
          f"flows {flows0} -> {flows1}")
    # Where the flood went: every SYN a new flow, of the verdict the rule gives; none promoted.
    counted, other = ("flows_bypass_rule", "flows_proxied") if kind == "bypassed" else \
        ("flows_proxied", "flows_bypass_rule")
    assert moved.get(counted, 0) >= FLOOD and moved.get(other, 0) == 0 and \
        moved.get("flows_bypass_failopen", 0) == 0 and moved.get("flows_promoted", 0) == 0 and \
        moved.get("flows_table_full", 0) == 0, \
        f"pep flow counters ({kind} flood): expected {counted} +{FLOOD} or more; {other}, flows_bypass_failopen, " \
        f"flows_promoted and flows_table_full +0; got {moved}"
    if kind == "bypassed":
        # flows_new churned: full of the flood's flows (the LRU evicted the rest); flows gained nothing.
        assert new1 >= FLOWS_NEW_MAX * 0.9 and flows1 <= flows0, \
            f"pep flow tables after the bypassed flood: expected flows_new near full ({FLOWS_NEW_MAX}) and flows " \
            f"not grown ({flows0}), got flows_new {new1}, flows {flows1}"
    else:
        # Proxied flows are known by their sockets: the flood left no entry at all.
        assert new1 <= new0 and flows1 <= flows0, \
            f"pep flow tables after the proxied flood: expected no new entries, got flows_new {new0} -> {new1}, " \
            f"flows {flows0} -> {flows1}"
    # The idle connection's entry is the same one, still in flows; and the connection works.
    same = ("table", "verdict", "syn_seq", "first_seen_ns", "state")
    assert after and {k: after[k] for k in same} == {k: before[k] for k in same}, \
        f"pep flow tables: {CLIENT4} port {before['sub_port']}: entry before the flood " \
        f"{ {k: before[k] for k in same} }, after {after and {k: after[k] for k in same}}"
    assert answered(second), f"client {CLIENT4}: the idle connection after {FLOOD} new flows " \
                             f"({lab.interception}, {kind} flood): expected HTTP/1.1 200 OK and 1024 bytes, " \
                             f"got {second}"


def test_a_lost_entry_costs_no_connection(lab, pins, bypass_rule):
    """With its entry gone (as an eviction would do) but its rule still in force, the idle bypassed
    connection's next request is forwarded all the same (a segment of no flow that a rule names and
    no socket owns: tc/flow.c no_flow), in every mode. With the rule gone too: in mode bpf it finds no
    socket of HAProxy's and the stack routes it on (pkts_no_flow); in modes nft and route, where the
    interception would deliver it locally (to HAProxy's listener, which would reset it), the datapath
    forwards it as nobody's here (pkts_unowned). The counters tell the two ways apart, so the test
    fails if either is lost."""
    idle, e = open_idle(lab, pins)
    try:
        assert flow_maps.del_keys(pins, "flows", [flow_maps.flow_key(CLIENT4, e["sub_port"], ORIGIN4, 80)]) == 1
        ruled = idle.ask()
        lab.pepctl("bypass", "del", "client", bypass_rule)
        try:
            c0 = flow_maps.read_counters(pins, 0)
            second = idle.ask()
            moved = grew(c0, flow_maps.read_counters(pins, 0))
        finally:
            lab.pepctl("bypass", "add", "client", bypass_rule)
    finally:
        idle.close()
    assert answered(ruled), f"client {CLIENT4}: with its entry lost and its rule in force, the idle connection " \
                            f"must still be forwarded and answer ({lab.interception}); got {ruled}"
    assert answered(second), f"client {CLIENT4}: with its entry and its rule gone, the idle connection must still " \
                             f"answer ({lab.interception}); got {second}"
    # The client's segments of the request (the request itself, the ACK of the answer) took the way of
    # their mode: forwarded by the datapath as nobody's (nft, route), or passed to the stack, which routes
    # them (bpf: nothing is unowned there).
    if lab.interception in ("nft", "route"):
        assert moved.get("pkts_unowned", 0) >= 2, \
            f"pep flow counters ({lab.interception}): the lost connection's request: expected pkts_unowned +2 " \
            f"or more, got {moved}"
    else:
        assert moved.get("pkts_unowned", 0) == 0 and moved.get("pkts_no_flow", 0) >= 2, \
            f"pep flow counters (bpf): the lost connection's request: expected pkts_no_flow +2 or more and " \
            f"pkts_unowned +0, got {moved}"
