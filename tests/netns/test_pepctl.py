"""pepctl on a bare host: up, up again, down, bad configs, and a failure halfway.

   [pc<rid>-host]  nic0 <-veth-> peer0        (a stand-in proxy host: its own namespace)
        pepctl up -> pc<rid>-g1 (, pc<rid>-g2), pc<rid>c100/s200..., pins /sys/fs/bpf/pc<rid>, /run/pc<rid>

How right is told from wrong: a snapshot of everything pepctl could leave
(namespaces, links in the host namespace, nft tables and ip rules, pins, run
files, HAProxy processes) is taken before; after `down`, after a rejected
config and after a failed `up`, the snapshot must be the same again.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess

import pytest

from netns.handle import PEPCTL

BASE = """
[host]
instance = "{inst}"
nic = "nic0"
run_dir = "/run/{inst}"
bpf_dir = "/sys/fs/bpf/{inst}"
[host.tuning]
irq_affinity = true
rss_symmetric = true
[[graph]]
name = "g1"
[graph.access]
vlan = 100
addresses = ["198.18.0.1/24", "2001:2:0:1::1/64"]
[graph.origin]
vlan = 200
addresses = ["198.19.0.1/24", "2001:2:0:2::1/64"]
[graph.proxy]
ports = [80, "8000-8080"]
"""

SECOND_GRAPH = """
[[graph]]
name = "g2"
[graph.access]
vlan = 101
addresses = ["198.18.1.1/24"]
[graph.origin]
vlan = 201
addresses = ["198.19.1.1/24"]
"""


@pytest.fixture
def host(tmp_path):
    rid = secrets.token_hex(3)
    inst = f"pc{rid}"
    ns = f"{inst}-host"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "-n", ns, "link", "add", "nic0", "type", "veth", "peer", "name", "peer0"], check=True)
        subprocess.run(["ip", "-n", ns, "link", "set", "nic0", "up"], check=True)
        yield Host(inst, ns, tmp_path)
    finally:
        subprocess.run(["ip", "netns", "del", ns])


class Host:
    def __init__(self, inst, ns, tmp):
        self.inst, self.ns, self.tmp = inst, ns, tmp

    def config(self, text: str, name="pep.toml") -> str:
        path = os.path.join(self.tmp, name)
        with open(path, "w") as f:
            f.write(text.format(inst=self.inst))
        return path

    def pepctl(self, conf: str, *args: str):
        return subprocess.run(["nsenter", f"--net=/run/netns/{self.ns}", PEPCTL, "-c", conf, *args],
                              capture_output=True, text=True, timeout=120)

    def snapshot(self) -> dict:
        def ls(path):
            try:
                return sorted(os.listdir(path))
            except FileNotFoundError:
                return []

        def j(*cmd):
            out = subprocess.run(["nsenter", f"--net=/run/netns/{self.ns}", *cmd], capture_output=True,
                                 text=True).stdout
            return json.loads(out) if out.strip() else []
        haproxies = []
        for pid in ls("/proc"):
            if pid.isdigit():
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        cmd = f.read().replace(b"\0", b" ").decode()
                except OSError:
                    continue
                if "haproxy" in cmd and self.inst in cmd:
                    haproxies.append(cmd)
        return {
            "netns": [n for n in ls("/run/netns") if n.startswith(self.inst) and n != self.ns],
            "links": sorted(ln["ifname"] for ln in j("ip", "-j", "link")),
            "qdiscs": sorted(q["kind"] for q in j("tc", "-j", "qdisc", "show", "dev", "nic0")),
            "pins": [p for p in ls("/sys/fs/bpf") if p.startswith(self.inst)],
            "run": [p for p in ls("/run") if p.startswith(self.inst)],
            "haproxy": haproxies,
        }


def test_up_twice_then_down_leaves_nothing(host):
    conf = host.config(BASE + SECOND_GRAPH)
    before = host.snapshot()
    up = host.pepctl(conf, "up")
    assert up.returncode == 0, up.stderr
    try:
        check_up_twice(host, conf)
    finally:
        down = host.pepctl(conf, "down")
    assert down.returncode == 0, down.stderr
    assert host.snapshot() == before
    again = host.pepctl(conf, "down")
    assert again.returncode == 0 and "nothing to do" in again.stdout


def check_up_twice(host, conf):
    mid = host.snapshot()
    assert mid["netns"] == [f"{host.inst}-g1", f"{host.inst}-g2"], mid["netns"]
    assert len(mid["haproxy"]) >= 2, f"expected 2 HAProxy masters, got {mid['haproxy']}"
    again = host.pepctl(conf, "up")
    assert again.returncode == 0 and "nothing changed" in again.stdout, again.stdout + again.stderr
    assert host.snapshot()["links"] == mid["links"]
    status = json.loads(host.pepctl(conf, "status", "--json").stdout)
    assert status["state"] == "up" and all(g["proxy"]["running"] for g in status["graphs"]), status


def test_plan_prints_commands_and_changes_nothing(host):
    conf = host.config(BASE)
    before = host.snapshot()
    plan = host.pepctl(conf, "plan")
    assert plan.returncode == 0, plan.stderr
    for expected in ("ip netns add", "bpftool prog loadall", "tc filter add dev nic0 ingress",
                     "congctl bbr initcwnd 32", "congctl cubic", "nft -f", "haproxy -W -f", "tproxy ip to :50080"):
        assert expected in plan.stdout, f"plan lacks {expected!r}"
    # nic0 is a veth: no IRQs, no RSS. Tuning says so instead of failing or pretending.
    assert "# notice: nic0 has no interrupts of its own" in plan.stdout, plan.stdout
    assert "# notice: nic0 has no RSS" in plan.stdout, plan.stdout
    assert host.snapshot() == before


BAD = [
    # (description, transform of the good config, field the message must name, value it must name)
    ("unknown key", lambda c: c.replace('nic = "nic0"', 'nic = "nic0"\nnics = 2'), "host.nics", "2"),
    ("VLAN 0", lambda c: c.replace("vlan = 100", "vlan = 0"), "graph[0].access.vlan", "0"),
    ("VLAN 4095", lambda c: c.replace("vlan = 200", "vlan = 4095"), "graph[0].origin.vlan", "4095"),
    ("duplicate VLAN", lambda c: c + SECOND_GRAPH.replace("vlan = 101", "vlan = 100"),
     "graph[1].access.vlan", "100"),
    ("overlapping prefixes", lambda c: c + SECOND_GRAPH.replace('"198.18.1.1/24"', '"198.18.0.129/25"'),
     "graph[1].access", "198.18.0"),
    ("unknown congestion control", lambda c: c.replace("vlan = 100", 'vlan = 100\ncongctl = "vegas"'),
     "congctl", "vegas"),
    ("missing NIC", lambda c: c.replace('nic = "nic0"', 'nic = "nic9"'), "host.nic", "nic9"),
    ("bad port", lambda c: c.replace('ports = [80, "8000-8080"]', "ports = [80, 70000]"),
     "graph[0].proxy.ports", "70000"),
    ("reversed port range", lambda c: c.replace('"8000-8080"', '"8080-8000"'), "graph[0].proxy.ports",
     "8080-8000"),
    ("bad address", lambda c: c.replace('"198.18.0.1/24"', '"198.18.0.300/24"'), "graph[0].access.addresses",
     "198.18.0.300"),
    ("bad instance name", lambda c: c.replace('instance = "{inst}"', 'instance = "Bad_Name!"'),
     "host.instance", "Bad_Name!"),
    ("unknown splice mode", lambda c: c.replace("[graph.proxy]", '[graph.proxy]\nsplice = "sometimes"'),
     "graph[0].proxy.splice", "sometimes"),
    ("route mode with all ports", lambda c: c.replace('ports = [80, "8000-8080"]',
                                                       'ports = "all"\ninterception = "route"'),
     "graph[0].proxy", "all"),
]


@pytest.mark.parametrize("what,change,field,value", BAD, ids=[b[0] for b in BAD])
def test_bad_config_is_refused_with_field_and_value_and_leaves_nothing(host, what, change, field, value):
    conf = host.config(change(BASE))
    before = host.snapshot()
    up = host.pepctl(conf, "up")
    assert up.returncode != 0, f"{what}: pepctl up accepted it: {up.stdout}"
    assert field in up.stderr, f"{what}: message does not name {field}: {up.stderr}"
    assert value in up.stderr, f"{what}: message does not name the value {value}: {up.stderr}"
    assert conf in up.stderr, f"{what}: message does not name the file: {up.stderr}"
    assert host.snapshot() == before, f"{what}: pepctl up left something behind"


def test_failure_halfway_rolls_back_everything_it_made_and_nothing_else(host):
    conf = host.config(BASE + SECOND_GRAPH)
    # Graph g2's host-side port name is taken: g1 is built completely (HAProxy
    # included) before g2's veth fails.
    blocker = f"{host.inst}c101"
    subprocess.run(["ip", "-n", host.ns, "link", "add", blocker, "type", "veth", "peer", "name", "blk1"], check=True)
    before = host.snapshot()
    up = host.pepctl(conf, "up")
    assert up.returncode != 0, "pepctl up succeeded despite the taken link name"
    assert blocker in up.stderr, up.stderr
    assert "start HAProxy" in up.stdout, f"the failure came too early to test a rollback: {up.stdout}"
    assert host.snapshot() == before, "rollback left something behind (or removed the operator's link)"
