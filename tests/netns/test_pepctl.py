"""pepctl on a bare host: up, up again, down, plan, bad configs, and a failure halfway.

   [pc<rid>-host]  nic0 <-veth-> peer0        (a stand-in proxy host: its own namespace)
        pepctl up -> pc<rid>-g1 (, pc<rid>-g2), pc<rid>c100/s200..., pins /sys/fs/bpf/pc<rid>, /run/pc<rid>
                     one keeper -> one supervisor -> one HAProxy, whatever the number of graphs

How right is told from wrong: a snapshot of everything pepctl could leave
(BareHost.snapshot: namespaces, links and qdiscs of the host namespace, pins, run
files, the instance's processes; plus here the tc filters on nic0) is taken
before; after `down`, after a rejected config and after a failed `up`, it must
be the same again. While up, the snapshot's process list must hold exactly one
keeper, one supervisor and one HAProxy for two graphs.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile

import pytest

from netns.handle import BASE, PYTHON, SECOND_GRAPH
from pepctl import names


@pytest.fixture(autouse=True)
def no_stray_lock(host):
    """A refused `up` must leave nothing; when it leaves its instance's lock file and run folder anyway
    (the test has failed and said so), remove them so that later runs start clean."""
    yield
    n = names.instance_names(host.inst, f"/run/{host.inst}")    # the run_dir of BASE
    if not os.path.exists(n.journal):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(n.lock)
        with contextlib.suppress(FileNotFoundError, OSError):
            os.rmdir(n.run_dir)


def status(host, conf) -> dict:
    return json.loads(host.pepctl(conf, "status", "--json").stdout)


def nic_filters(host) -> list[dict]:
    """The tc filters on nic0 ingress (the operator's and the instance's), as `tc -j` gives them."""
    out = subprocess.run(["nsenter", f"--net=/run/netns/{host.ns}", "tc", "-j", "filter", "show", "dev", "nic0",
                          "ingress"], capture_output=True, text=True).stdout
    return json.loads(out) if out.strip() else []


def kinds(cmdlines: list[str]) -> list[str]:
    """haproxy / supervisor / exporter / keeper of which unit, for each of the instance's process
    command lines."""
    out = []
    for cmd in cmdlines:
        argv0, padded = cmd.split()[0].rsplit("/", 1)[-1], f" {cmd} "
        out.append("haproxy" if argv0 == "haproxy" else "supervisor" if " supervise " in padded
                   else "exporter" if " exporter " in padded
                   else f"keeper {cmd.split('--unit ')[-1].split('@')[0]}" if " keep " in padded
                   else f"unknown: {cmd}")
    return sorted(out)


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
    assert again.returncode == 0 and "nothing to do" in again.stdout, again.stdout + again.stderr


def check_up_twice(host, conf):
    mid = host.snapshot()
    assert mid["netns"] == [f"{host.inst}-g1", f"{host.inst}-g2"], mid["netns"]
    # One proxy for every graph: one supervisor, one HAProxy for the two graphs; one exporter; a
    # keeper for each of the two services.
    got = kinds(mid["processes"])
    want = ["exporter", "haproxy", "keeper pep-exporter", "keeper pep-supervisor", "supervisor"]
    assert got == want, f"host {host.ns}: processes of a 2-graph instance: expected {want}, got {got}: " \
        f"{mid['processes']}"
    again = host.pepctl(conf, "up")
    assert again.returncode == 0 and "nothing changed" in again.stdout, again.stdout + again.stderr
    after = host.snapshot()
    assert after["links"] == mid["links"], f"second up changed the links: {mid['links']} -> {after['links']}"
    assert after["processes"] == mid["processes"], \
        f"second up changed the processes: {mid['processes']} -> {after['processes']}"
    st = status(host, conf)
    modes = {g["name"]: g["proxy"]["mode"] for g in st["graphs"]}
    assert st["state"] == "up" and modes == {"g1": "proxy", "g2": "proxy"}, \
        f"status: expected up with both graphs in mode proxy, got {st['state']}, {modes}: {st.get('problems')}"
    proxy = st["proxy"]
    assert all(proxy[who]["running"] for who in ("keeper", "supervisor", "haproxy")), \
        f"status proxy: expected keeper, supervisor and haproxy running, got {proxy}"


# Each interception mode: (extra config, text the plan must show, text it must not show).
# {inst} is the instance's name.
PLANS = [
    ("bpf", "", [
        "netns add {inst}-g1", "bpftool prog loadall", "tc filter add dev nic0 ingress",
        "congctl pep_radio initcwnd 32", "congctl cubic", "rule add pref 100 fwmark 1 lookup 100",
        "object-pinned /sys/fs/bpf/{inst}/{inst}/flow/prog/flow_ingress",
        "frontend graph_g1", "bind 0.0.0.0:50080 transparent namespace {inst}-g1",
        "server origin 0.0.0.0 namespace {inst}-g1", "haproxy -c -q -f", "pepctl keep",
    ], ["nft"]),
    ("nft", 'interception = "nft"\n', [
        "nft -f", "tproxy ip to :50080", "tproxy ip6 to :50080", "rule add pref 100 fwmark 1 lookup 100",
        "bind 0.0.0.0:50080 transparent namespace {inst}-g1", "pepctl keep",
    ], []),
    ("route", 'interception = "route"\n', [
        "rule add pref 100 iif c_in ipproto tcp dport 80 lookup 100",
        "rule add pref 100 iif s_in ipproto tcp sport 8000-8080 lookup 100",
        "bind 0.0.0.0:80 transparent namespace {inst}-g1", "bind 0.0.0.0:8000-8080 transparent namespace {inst}-g1",
        "rule add pref 100 fwmark 1 lookup 100", "pepctl keep",
    ], ["nft", ":50080"]),
]


@pytest.mark.parametrize("mode,extra,want,unwanted", PLANS, ids=[p[0] for p in PLANS])
def test_plan_prints_commands_and_changes_nothing(host, mode, extra, want, unwanted):
    conf = host.config(BASE.replace("[graph.proxy]\n", "[graph.proxy]\n" + extra))
    before = host.snapshot()
    plan = host.pepctl(conf, "plan")
    assert plan.returncode == 0, plan.stderr
    for expected in want:
        expected = expected.format(inst=host.inst)
        assert expected in plan.stdout, f"plan ({mode} interception) lacks {expected!r}:\n{plan.stdout}"
    for bad in unwanted:
        assert bad not in plan.stdout, f"plan ({mode} interception) has {bad!r}:\n{plan.stdout}"
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
    ("unknown interception mode", lambda c: c.replace("[graph.proxy]", '[graph.proxy]\ninterception = "xdp"'),
     "graph[0].proxy.interception", "xdp"),
    ("route mode with all ports", lambda c: c.replace('ports = [80, "8000-8080"]',
                                                       'ports = "all"\ninterception = "route"'),
     "graph[0].proxy", "all"),
    ("threads under graph.proxy (moved to host)", lambda c: c.replace("[graph.proxy]", "[graph.proxy]\nthreads = 2"),
     "graph[0].proxy.threads", "[host]"),
    ("unknown supervisor", lambda c: c.replace('supervisor = "pepctl"', 'supervisor = "runit"'),
     "host.supervisor", "runit"),
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


def run_dir_under_a_file(tmp: str):
    """A config whose run_dir cannot be made: under a regular file (a short path: run_dir has a length limit)."""
    fd, path = tempfile.mkstemp(prefix="pc", dir="/tmp")
    os.close(fd)
    return lambda c: c.replace('run_dir = "/run/{inst}"', f'run_dir = "{path}/run"'), lambda: os.unlink(path)


def run_dir_under_proc(tmp: str):
    return lambda c: c.replace('run_dir = "/run/{inst}"', 'run_dir = "/proc/{inst}"'), None


# What only the host can refuse, beside BAD: (description, setup -> (transform, cleanup), field, value).
BAD_HOST = [
    ("run_dir under a regular file", run_dir_under_a_file, "host.run_dir", "is a file, not a folder"),
    ("run_dir under /proc", run_dir_under_proc, "host.run_dir", "a proc filesystem"),
]


def as_host_case(change):
    return lambda tmp: (change, None)


@pytest.mark.parametrize("what,setup,field,value", [(w, as_host_case(c), f, v) for w, c, f, v in BAD] + BAD_HOST,
                         ids=[b[0] for b in BAD + BAD_HOST])
def test_up_refuses_what_plan_refuses_the_same_way(host, what, setup, field, value):
    """Every config `plan` refuses, `up` refuses before it takes the lock or makes anything: exit 2,
    the same lines, naming the field (not "unexpected error ... a bug in pepctl")."""
    change, cleanup = setup(str(host.tmp))
    try:
        conf = host.config(change(BASE))
        before = host.snapshot()
        plan, up = host.pepctl(conf, "plan"), host.pepctl(conf, "up")
        assert plan.returncode == 2 and field in plan.stderr and value in plan.stderr, \
            f"{what}: pepctl plan: expected exit 2 naming {field} and {value!r}, got {plan.returncode}: {plan.stderr}"
        said = up.stderr.replace("pepctl up:", "pepctl plan:")
        assert up.returncode == 2 and said == plan.stderr, \
            f"{what}: pepctl up: expected exit 2 and plan's words:\n{plan.stderr}\ngot {up.returncode}:\n{up.stderr}"
        assert host.snapshot() == before, f"{what}: pepctl up left something behind"
    finally:
        if cleanup:
            cleanup()


def take_link(host):
    """The operator's own link, under the name graph g2's host-side access port would get."""
    subprocess.run(["ip", "-n", host.ns, "link", "add", f"{host.inst}c101", "type", "veth", "peer", "name", "blk1"],
                   check=True)


def take_namespace(host):
    """The operator's own namespace, under the name graph g2's would get."""
    subprocess.run(["ip", "netns", "add", f"{host.inst}-g2"], check=True)
    return lambda: subprocess.run(["ip", "netns", "del", f"{host.inst}-g2"], check=True)


def take_pins(host):
    """A pin folder under the instance's name (another instance's, or a crashed run's)."""
    path = f"/sys/fs/bpf/{host.inst}/{host.inst}"
    os.makedirs(path)
    return lambda: (os.rmdir(path), os.rmdir(os.path.dirname(path)))


# Names `up` would make that exist already: (what, how the test takes the name, the field the message must
# name, the value it must name). `up` must refuse before it makes anything, and leave the operator's thing.
TAKEN = [
    ("link of graph g2", take_link, "graph[1].access.vlan", "c101"),
    ("namespace of graph g2", take_namespace, "graph[1].name", "-g2"),
    ("pin folder", take_pins, "host.bpf_dir", "exists already"),
]


@pytest.mark.parametrize("what,take,field,value", TAKEN, ids=[t[0] for t in TAKEN])
def test_taken_name_is_refused_before_anything_is_made(host, what, take, field, value):
    conf = host.config(BASE + SECOND_GRAPH)
    release = take(host)
    try:
        before = host.snapshot()
        up = host.pepctl(conf, "up")
        assert up.returncode != 0, f"{what} taken: pepctl up succeeded anyway: {up.stdout}"
        assert field in up.stderr and value in up.stderr and conf in up.stderr, \
            f"{what} taken: the message does not name {conf}, {field} and {value!r}: {up.stderr}"
        assert "bringing up" not in up.stdout, f"{what} taken: up started anyway: {up.stdout}"
        assert host.snapshot() == before, f"{what} taken: pepctl up left something behind, or removed the " \
                                          f"operator's {what}"
    finally:
        if release:
            release()


def take_trunk_filter(host):
    """The operator's own filter on nic0 ingress at the preference and handle trunk_ingress would get
    (a classic-BPF `ret 0`: cls_bpf needs no object for it), on the operator's own clsact qdisc."""
    for cmd in (["tc", "qdisc", "add", "dev", "nic0", "clsact"],
                ["tc", "filter", "add", "dev", "nic0", "ingress", "pref", "10", "handle", "1", "bpf", "bytecode",
                 "1,6 0 0 0,"]):
        subprocess.run(["nsenter", f"--net=/run/netns/{host.ns}", *cmd], check=True)


def take_metrics_port(host):
    """The operator's own listener on 127.0.0.1:9101 of the host namespace, where the instance's metrics
    exporter binds: the exporter cannot start."""
    subprocess.run(["ip", "-n", host.ns, "link", "set", "lo", "up"], check=True)
    listen = ("import socket,sys;s=socket.socket();s.bind(('127.0.0.1',9101));s.listen();print('ready',flush=True);"
              "sys.stdin.read()")
    proc = subprocess.Popen(["nsenter", f"--net=/run/netns/{host.ns}", PYTHON, "-c", listen], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready", "the test's listener on 127.0.0.1:9101 did not start"

    def release():
        proc.stdin.close()   # it exits at EOF
        proc.wait(timeout=5)
    return release


# Where `up` fails: (what, how the test makes it fail, what stderr must name, the last step `up` must have
# finished before failing: what the rollback has to undo; None: refusing up front is right too).
FAILURES = [
    # The exporter cannot listen, after HAProxy came up (`up` fails at once, not after its wait for
    # the exporter): both keepers, the supervisor and HAProxy run and must be stopped.
    ("metrics port taken", take_metrics_port, "cannot listen on 127.0.0.1 port 9101", "start the proxy supervisor"),
    # trunk_ingress's place on the NIC is taken: refused up front, or the very last step fails after
    # HAProxy came up. Either way the operator's filter must survive.
    ("trunk filter taken", take_trunk_filter, "nic0", None),
]


@pytest.mark.parametrize("what,block,names,reached", FAILURES, ids=[f[0] for f in FAILURES])
def test_failure_halfway_rolls_back_everything_it_made_and_nothing_else(host, what, block, names, reached):
    conf = host.config(BASE + SECOND_GRAPH)
    release = block(host)
    try:
        before, filters = host.snapshot(), nic_filters(host)
        up = host.pepctl(conf, "up")
        assert up.returncode != 0, f"{what}: pepctl up succeeded anyway: {up.stdout}"
        assert names in up.stderr, f"{what}: the error does not name {names!r}: {up.stderr}"
        if reached:
            assert reached in up.stdout, f"{what}: the failure came before {reached!r}, too early to test the " \
                                         f"rollback: {up.stdout}"
        assert host.snapshot() == before, f"{what}: rollback left something behind, or removed the operator's things"
        got = nic_filters(host)
        assert got == filters, f"{what}: host {host.ns} nic0 ingress filters: expected the operator's {filters}, " \
                               f"got {got}"
    finally:
        if release:
            release()
