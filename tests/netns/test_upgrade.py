"""An upgrade in place, under load: an instance that the last release's pepctl brought up is taken
over by this one, and no connection is lost.

   client 198.18.0.10 (lab)  .40: loadgen.py, short connections back to back and long keep-alive ones
      |                      .41: one long keep-alive connection, proxied
      |                      .42: one long keep-alive connection, bypassed by a live rule (`bypass add`)
   switch ==trunk== nic0 [proxyhost: pepctl of OLD_COMMIT brings the instance up; this one upgrades it]
      == c_in [pep: flow_ingress of OLD_COMMIT, then this one's] s_in == origin nginx 198.19.0.10:80

OLD_COMMIT is the last release that landed before upgrades in place (29c448f): a git worktree of it,
its BPF objects built by its own tc/Makefile, its pepctl run from there (stdlib only: this tree's
Python runs it). Its datapath differs from this one's in what an upgrade must carry: the graphs
map's value grew (16 -> 24 bytes: maxconn, host_maxconn), flow_stats has more counters per graph,
flow_egress, flow_conns and five maps are new; the access side's congestion control was BBR and is
pep_radio now; it set tcp_max_tw_buckets = 0 in the graph's namespace, this version leaves it to the
kernel; its HAProxy connected from spare ports, this one from the client's own.

How right is told from wrong. Every connection of the load is timed on CLOCK_MONOTONIC (which every
namespace shares) and the test puts the upgrade on the same line. A first `pepctl upgrade` is
killed (-9) right after it swapped the flow programs; the next command (a `reload`) rolls that
back, and must leave the instance as it was (journal, register, HAProxy's config, pins, the program
on c_in), then refuses; the second upgrade runs to the end. Then:
  (a) no connection failed, before, during or after the upgrades; long ones open across them went
      on answering (their last answers come after the upgrade ended);
  (b) the bypassed connection is still in the flow table as bypassed by rule, and this version's
      datapath forwarded its packets after the upgrade (its entry's last_seen_ns is later than the
      upgrade's end, and pkts_bypassed grew); the counters of the old datapath were carried over;
  (c) the instance is this version's: journal, register and `status --json` of format 2, no
      upgrade needed, routes with pep_radio (the connection open before keeps BBR, a new one takes
      pep_radio), tcp_max_tw_buckets back to a new namespace's value, the graphs map's entry with
      this version's flags;
  (d) fail-open is in the datapath: with HAProxy killed and its supervisor held, a new connection
      succeeds at once, failed open;
  (e) before it, the commands that change an instance refuse, `status` says what to do, and
      `plan --upgrade` changes nothing; after it, `upgrade` has nothing to do and `down` leaves
      nothing (leaves_nothing_behind).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

from netns.addresses import ORIGIN4
from netns.handle import PEPCTL, PYTHON
from pepctl import bpfsys, flow_maps, hostinfo
from pepctl.nsutil import fresh_sysctls, read_sysctls
from pepctl.runner import wait_for

OLD_COMMIT = "29c448f"       # the last release that landed before upgrades in place
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
LOADGEN = os.path.join(HERE, "loadgen.py")
LAB_OPTIONS = ["--no-pepctl"]
SRC = {"load": "198.18.0.40", "proxied": "198.18.0.41", "bypassed": "198.18.0.42", "new": "198.18.0.43"}
LOAD_BEFORE = 1.5            # s of load before the first upgrade
LOAD_SECONDS = 30.0          # s during which the load opens new connections (the upgrades took ~6 s,
                             # and more than 14 on a slower machine: none was left after them)
KILL_AFTER = "swap the flow programs of graph"   # the first upgrade is killed once it printed this


def lab_setup(lab) -> None:
    for addr in SRC.values():
        lab.run("client", "ip", "addr", "add", f"{addr}/24", "dev", "eth0")


# -- the old tree and its instance -------------------------------------------------------------------
@pytest.fixture(scope="module")
def old_tree():
    """A git worktree of OLD_COMMIT with its BPF objects built by its own Makefile. Not under pytest's
    own temporary folder: the proxy's user runs the supervisor from it, and must read it."""
    if subprocess.run(["git", "-C", REPO, "cat-file", "-e", f"{OLD_COMMIT}^{{commit}}"],
                      capture_output=True).returncode != 0:
        pytest.skip(f"commit {OLD_COMMIT} is not in this checkout's history (a shallow clone?): no older "
                    "pepctl to upgrade from")
    top = tempfile.mkdtemp(prefix="pep-upgrade-")
    os.chmod(top, 0o755)
    path = os.path.join(top, OLD_COMMIT)
    try:
        subprocess.run(["git", "-C", REPO, "worktree", "add", "--detach", path, OLD_COMMIT], check=True,
                       capture_output=True)
        subprocess.run(["make", "-s", "-C", os.path.join(path, "tc")], check=True, capture_output=True, timeout=300)
        yield path
    finally:
        subprocess.run(["git", "-C", REPO, "worktree", "remove", "--force", path], capture_output=True)
        shutil.rmtree(top, ignore_errors=True)


def old_config(lab) -> str:
    """The lab's instance as the old release's config says it: the access side's congestion control
    left to the default (BBR then, pep_radio now); every port intercepted, mode bpf."""
    return f"""[host]
instance = "pl{lab.rid}"
nic = "nic0"
run_dir = "{lab.run_dir}/pep"
bpf_dir = "/sys/fs/bpf/pl{lab.rid}"
supervisor = "pepctl"
metrics_port = 9101

[host.tuning]
irq_affinity = false
rss_symmetric = false

[[graph]]
name = "pep"

[graph.access]
vlan = 100
addresses = ["198.18.0.1/24", "2001:2:0:1::1/64"]

[graph.origin]
vlan = 200
addresses = ["198.19.0.1/24", "2001:2:0:2::1/64"]

[graph.proxy]
enabled = true
interception = "bpf"
ports = "all"
"""


class Instance:
    def __init__(self, lab, tree: str):
        self.lab, self.tree = lab, tree
        self.conf = os.path.join(lab.run_dir, "pep.toml")
        with open(self.conf, "w") as f:
            f.write(old_config(lab))
        self.inst = f"pl{lab.rid}"
        self.run = f"{lab.run_dir}/pep"
        self.journal = f"{self.run}/{self.inst}.journal"
        self.pins = f"/sys/fs/bpf/pl{lab.rid}/{self.inst}/flow"
        self.netns = f"{self.inst}-pep"
        self.register = f"/run/pep-instances/{self.inst}.json"

    def old(self, *args: str) -> subprocess.CompletedProcess:
        """The old release's pepctl, run from its tree (python -m puts the working folder first)."""
        argv = self.lab.argv("proxyhost", os.path.join(self.tree, "scripts", "pepctl"), "-c", self.conf, *args)
        return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=self.tree)

    def new(self, *args: str, check: bool = False) -> subprocess.CompletedProcess:
        proc = subprocess.run(self.lab.argv("proxyhost", PEPCTL, "-c", self.conf, *args), capture_output=True,
                              text=True, timeout=180)
        assert not check or proc.returncode == 0, f"pepctl {' '.join(args)}: exit {proc.returncode}: {proc.stderr}"
        return proc

    def status(self) -> dict:
        proc = self.new("status", "--json")
        try:
            return json.loads(proc.stdout)
        except ValueError:
            raise AssertionError(f"pepctl status --json: exit {proc.returncode}, no JSON: {proc.stderr}") from None

    def state(self) -> dict:
        """What a refused command or a plan must leave as it was."""
        out = {}
        for path in (self.journal, self.register, f"{self.run}/{self.inst}/haproxy.cfg"):
            with open(path, "rb") as f:
                out[path] = hashlib.sha256(f.read()).hexdigest()
        out["pins"] = sorted(os.listdir(os.path.dirname(self.pins)))
        out["filters"] = subprocess.run(self.lab.argv("pep", "tc", "filter", "show", "dev", "c_in", "ingress"),
                                        capture_output=True, text=True).stdout
        return out


@pytest.fixture(scope="module")
def inst(lab, old_tree):
    i = Instance(lab, old_tree)
    proc = i.old("up")
    assert proc.returncode == 0, f"pepctl up of {OLD_COMMIT}: exit {proc.returncode}: {proc.stderr}{proc.stdout}"
    assert "flow_egress" not in proc.stdout, f"pepctl up ran this tree's code, not {OLD_COMMIT}'s: {proc.stdout}"
    try:
        yield i
    finally:
        if os.path.exists(i.journal):
            down = i.new("down")
            if down.returncode != 0:
                i.old("down")
            assert down.returncode == 0, f"pepctl down after the upgrade: {down.stderr}"


# -- before: refused, and a plan that changes nothing --------------------------------------------------
def test_an_older_instance_is_refused_until_upgraded(inst):
    before = inst.state()
    for args in (("reload",), ("up",), ("bypass", "add", "client", "198.18.0.99/32")):
        proc = inst.new(*args)
        assert proc.returncode == 1 and "brought up by an older pepctl (journal format 1)" in proc.stderr \
            and "`pepctl upgrade`" in proc.stderr, f"pepctl {' '.join(args)} on {OLD_COMMIT}'s instance: exit " \
                                                   f"{proc.returncode}: {proc.stderr}{proc.stdout}"
        assert "Traceback" not in proc.stderr, proc.stderr
    st = inst.status()
    said = {k: st.get(k) for k in ("format", "state", "upgrade")}
    assert st["format"] == 2 and st["state"] == "up" and st["upgrade"]["required"], \
        f"status --json of {OLD_COMMIT}'s instance: {json.dumps(said)}"
    assert "error" in st["graphs"][0]["flows"], f"status read the old flow maps by this version's layout: {st}"
    plan = inst.new("plan", "--upgrade", check=True)
    for words in ("journal format 1 -> 2", "carry map graphs over: value 16 -> 24 bytes",
                  "carry map flow_stats over", "congctl bbr -> pep_radio", "use congestion control pep_radio",
                  "tcp_max_tw_buckets 0 -> ", "replace the proxy supervisor", "reload HAProxy",
                  "RENAME_EXCHANGE"):
        assert words in plan.stdout, f"plan --upgrade does not say {words!r}:\n{plan.stdout}"
    assert inst.state() == before, "a refused command or plan --upgrade changed the instance"


# -- the upgrade under load -----------------------------------------------------------------------------
def loadgen(lab, src: str, *args: str) -> subprocess.Popen:
    return lab.popen("client", PYTHON, LOADGEN, "--dst", ORIGIN4, "--src", src, *args)


def results(lab, proc: subprocess.Popen, timeout: float) -> list[dict]:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"client: loadgen exited {proc.returncode}: {err[-2000:]}"
    return json.loads(out.splitlines()[-1])["connections"]


def prog_id(path: str) -> int:
    with bpfsys.Prog(path) as p:
        return p.id


def kill_after(proc: subprocess.Popen, line: str) -> str:
    """Reads the upgrade's output until line appears, then kill -9: what it had printed."""
    seen = ""
    for text in proc.stdout:
        seen += text
        if line in text:
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(timeout=10)
    return seen


def cc_of(lab, src: str) -> set[str]:
    """The congestion controls of the proxy's sockets toward client address src (ss -ti)."""
    out = subprocess.run(lab.argv("pep", "ss", "-tin", "dst", src), capture_output=True, text=True).stdout
    names = {"bbr", "cubic", "pep_radio", "reno"}
    return {w for line in out.splitlines()[1:] if line.startswith(("\t", " ")) for w in line.split()[:1]} & names


@pytest.fixture(scope="module")
def upgraded(lab, inst):
    """The upgrades under load (see the module's docstring); what happened, on one time line."""
    proc = inst.old("bypass", "add", "client", f"{SRC['bypassed']}/32")
    assert proc.returncode == 0, f"bypass add with {OLD_COMMIT}'s pepctl: {proc.stderr}"
    loads = {"load": loadgen(lab, SRC["load"], "--workers", "4", "--long-every", "0.05",
                             "--duration", str(LOAD_SECONDS)),
             "proxied": loadgen(lab, SRC["proxied"], "--workers", "0", "--long-every", "1", "--duration", "0.5",
                                "--long-requests", "220", "--long-interval", "0.1"),
             "bypassed": loadgen(lab, SRC["bypassed"], "--workers", "0", "--long-every", "1", "--duration", "0.5",
                                 "--long-requests", "220", "--long-interval", "0.1")}
    out: dict = {}
    try:
        ready = [json.loads(p.stdout.readline())["ready"] for p in loads.values()]
        time.sleep(max(0.0, max(ready) + LOAD_BEFORE - time.monotonic()))
        out["cc before"] = cc_of(lab, SRC["proxied"])
        out["state before"] = inst.state()
        out["T0"] = time.monotonic()
        first = subprocess.Popen(lab.argv("proxyhost", PEPCTL, "-c", inst.conf, "upgrade"), stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        out["killed output"] = kill_after(first, KILL_AFTER)
        out["killed"] = time.monotonic()
        out["status after kill"] = inst.status()
        out["reload after kill"] = inst.new("reload")
        out["state after rollback"] = inst.state()
        second = inst.new("upgrade")
        out["T1"] = time.monotonic()
        out["upgrade"] = second
        out["counters at T1"] = flow_maps.read_counters(inst.pins, 0)
        newcomer = loadgen(lab, SRC["new"], "--workers", "0", "--long-every", "1", "--duration", "0.5",
                           "--long-requests", "15", "--long-interval", "0.1")
        newcomer.stdout.readline()
        time.sleep(0.5)
        out["cc new"], out["cc old"] = cc_of(lab, SRC["new"]), cc_of(lab, SRC["proxied"])
        results(lab, newcomer, 30)
        out["flows"] = flow_maps.flows(inst.pins, graph=0)
        for name, p in loads.items():
            out[name] = results(lab, p, LOAD_SECONDS + 60)
        out["end"] = time.monotonic()
        out["counters at end"] = flow_maps.read_counters(inst.pins, 0)
    finally:
        for p in loads.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


def split(conns: list[dict], t0: float, t1: float) -> str:
    before = [c for c in conns if c["end"] < t0]
    during = [c for c in conns if c["start"] <= t1 and c["end"] >= t0]
    after = [c for c in conns if c["start"] > t1]
    return (f"{len(before)} before ({sum(not c['ok'] for c in before)} failed), {len(during)} open during "
            f"({sum(not c['ok'] for c in during)} failed), {len(after)} after ({sum(not c['ok'] for c in after)} "
            "failed)")


def test_no_connection_is_lost(upgraded):
    u = upgraded
    assert u["upgrade"].returncode == 0, f"pepctl upgrade: exit {u['upgrade'].returncode}: {u['upgrade'].stderr}"
    assert "upgraded" in u["upgrade"].stdout, u["upgrade"].stdout
    assert KILL_AFTER in u["killed output"], u["killed output"]
    assert any("upgrade` was cut short" in p for p in u["status after kill"]["problems"]), \
        f"status after the kill: {u['status after kill'].get('problems')}"
    reload = u["reload after kill"]
    assert "did not finish: rolling it back" in reload.stdout and reload.returncode == 1 and \
        "brought up by an older pepctl" in reload.stderr, \
        f"reload after the killed upgrade: exit {reload.returncode}: {reload.stdout}{reload.stderr}"
    changed = {k for k in u["state before"] if u["state before"][k] != u["state after rollback"][k]}
    assert not changed, f"the rollback of the killed upgrade left these changed: {changed}: " \
                        f"{[(u['state before'][k], u['state after rollback'][k]) for k in changed]}"
    conns = u["load"] + u["proxied"] + u["bypassed"]
    failed = [c for c in conns if not c["ok"]]
    figures = split(u["load"], u["T0"], u["T1"])
    print(f"\nupgrade of {OLD_COMMIT}'s instance under load: killed at +{u['killed'] - u['T0']:.2f} s, done at "
          f"+{u['T1'] - u['T0']:.2f} s; short and long connections: {figures}")
    assert not failed, f"{len(failed)} connection(s) failed across the upgrade: " + ", ".join(
        f"{c['kind']} from {c['start'] - u['T0']:+.3f} s: {c['error']}" for c in failed[:10]) + f"; {figures}"
    during = [c for c in u["load"] if c["start"] <= u["T1"] and c["end"] >= u["T0"]]
    after = [c for c in u["load"] if c["start"] > u["T1"]]
    assert len(during) >= 50 and len(after) >= 50, f"the load is too thin to judge: {figures}"
    for kind in ("proxied", "bypassed"):
        [c] = u[kind]
        assert c["start"] < u["T0"] and c["answers"] and c["answers"][-1] > u["T1"] + 1, \
            f"the {kind} long connection did not live across the upgrade: started {c['start'] - u['T0']:+.2f} s, " \
            f"last answer {c['answers'][-1] - u['T0'] if c['answers'] else None} s"


def test_bypassed_flow_stays_bypassed_in_the_new_datapath(upgraded):
    u = upgraded
    [c] = u["bypassed"]
    entry = [f for f in u["flows"] if f["subscriber"] == SRC["bypassed"] and f["sub_port"] == c["port"]]
    assert entry and entry[0]["verdict"] == "bypass_rule" and entry[0]["table"] == "flows", \
        f"the rule-bypassed connection from {SRC['bypassed']}:{c['port']}: entries {entry}"
    assert entry[0]["last_seen_ns"] / 1e9 > u["T1"], \
        f"its entry was last touched {entry[0]['last_seen_ns'] / 1e9 - u['T1']:+.2f} s from the upgrade's end: " \
        "this version's datapath never saw its packets"
    grew = u["counters at end"]["pkts_bypassed"] - u["counters at T1"]["pkts_bypassed"]
    assert grew > 0, "pkts_bypassed did not grow after the upgrade"
    assert u["counters at T1"]["flows_bypass_rule"] >= 1, \
        f"the old datapath's counters were not carried over: {u['counters at T1']}"
    proxied = [f for f in u["flows"] if f["subscriber"] == SRC["proxied"]]
    assert not proxied, f"the proxied connection is in the bypass tables: {proxied}"


def test_the_instance_is_this_versions(lab, inst, upgraded):
    st = inst.status()
    assert st["format"] == 2 and st["state"] == "up" and "upgrade" not in st and not st["problems"], \
        f"status after the upgrade: {json.dumps({k: st.get(k) for k in ('format', 'state', 'upgrade', 'problems')})}"
    with open(inst.journal) as f:
        meta = json.loads(f.readline())["meta"]
    with open(inst.register) as f:
        entry = json.load(f)
    assert meta["format"] == 2 and entry["format"] == 2 and "pep_radio" in entry["congestion"], (meta, entry)
    routes = json.loads(subprocess.run(lab.argv("pep", "ip", "-j", "route", "show", "proto", "static"),
                                       capture_output=True, text=True).stdout)
    access = [r for r in routes if r["dst"] == "198.18.0.0/24"]
    assert access and {"congestion": "pep_radio"}.items() <= access[0]["metrics"][0].items(), access
    assert upgraded["cc before"] == {"bbr"} and upgraded["cc old"] == {"bbr"} and upgraded["cc new"] == {"pep_radio"}, \
        f"congestion controls toward subscribers: the connection open before {upgraded['cc before']} -> " \
        f"{upgraded['cc old']}, one made after {upgraded['cc new']}"
    key = "net.ipv4.tcp_max_tw_buckets"
    assert read_sysctls(inst.netns, [key]) == fresh_sysctls([key]), "tcp_max_tw_buckets was not given back"
    with flow_maps.open_map(inst.pins, "graphs") as m:
        flags = flow_maps.GRAPH_CONFIG.unpack(m.lookup(flow_maps.U32.pack(0)))[0]
    assert flags & flow_maps.GRAPH_F_KEEP_PORT and flags & flow_maps.GRAPH_F_HONEST, f"graph flags {flags:#x}"
    again = inst.new("upgrade", check=True)
    assert "runs this pepctl already" in again.stdout, again.stdout


def test_fail_open_is_in_the_datapath_after(lab, inst, upgraded):
    st = inst.status()
    sup = st["proxy"]["supervisor"]["pid"]
    victims = [st["proxy"]["haproxy"]["pid"], *st["proxy"]["haproxy"]["draining"]]
    before = flow_maps.read_counters(inst.pins, 0)
    os.kill(sup, signal.SIGSTOP)
    try:
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        wait_for(lambda: inst.status()["graphs"][0]["proxy"]["mode"] == "fail-open", timeout=5,
                 what="the listener to go with HAProxy")
        proc = lab.run("client", "curl", "-s", "-o", "/dev/null", "-w", "%{http_code} %{time_connect}", "-m", "2",
                       "--interface", SRC["new"], f"http://{ORIGIN4}/1k", check=False)
        assert proc.stdout.split()[:1] == ["200"] and float(proc.stdout.split()[1]) < 0.5, \
            f"a new connection with HAProxy dead: {proc.stdout} {proc.stderr}"
        after = flow_maps.read_counters(inst.pins, 0)
        assert after["flows_bypass_failopen"] == before["flows_bypass_failopen"] + 1, \
            f"flows_bypass_failopen {before['flows_bypass_failopen']} -> {after['flows_bypass_failopen']}"
    finally:
        os.kill(sup, signal.SIGCONT)
    wait_for(lambda: inst.status()["state"] == "up", timeout=10, what="HAProxy back after SIGCONT")


def test_a_rebuilt_datapath_is_swapped_with_every_map_kept(lab, inst, upgraded):
    """The same format, another datapath (tc/*.o rebuilt since up: here the journal is made to say
    so): upgrade swaps the programs again, every map kept, and flow_conns in place (BPF_F_REPLACE:
    never two counting, never none), so the count of a connection open across it stays right and
    comes back to zero when it closes."""
    root = hostinfo.cgroup2_root()
    if root is None:
        pytest.skip("no cgroup v2 hierarchy is mounted: flow_conns is not attached anywhere")
    conns = os.path.join(inst.pins, "prog", flow_maps.CONNS_PROGRAM)
    long = loadgen(lab, SRC["new"], "--workers", "0", "--long-every", "1", "--duration", "0.5",
                   "--long-requests", "40", "--long-interval", "0.1")
    try:
        long.stdout.readline()
        wait_for(lambda: flow_maps.read_conns(inst.pins, 0) >= 1, timeout=5, what="flow_conns to count the connection")
        counted = flow_maps.read_conns(inst.pins, 0)
        with open(inst.journal, "a") as f:
            f.write(json.dumps({"meta": {"datapath": "a build of another checkout"}}) + "\n")
        old_id = prog_id(conns)
        proc = inst.new("upgrade", check=True)
        [c] = results(lab, long, 30)
    finally:
        if long.poll() is None:
            long.kill()
            long.wait()
    assert "kept (same layout)" in proc.stdout and "carry map" not in proc.stdout and "new (empty)" not in \
        proc.stdout, proc.stdout
    assert f"swap {flow_maps.CONNS_PROGRAM}" in proc.stdout and "BPF_F_REPLACE" in proc.stdout, proc.stdout
    assert c["ok"], f"the connection across the swap: {c['error']}"
    new_id = prog_id(conns)
    attached = [p["id"] for p in json.loads(subprocess.run(["bpftool", "-j", "cgroup", "show", root],
                                                           capture_output=True, text=True).stdout)]
    assert new_id != old_id and new_id in attached and old_id not in attached, \
        f"flow_conns on {root}: old {old_id}, new {new_id}, attached {attached}"
    assert counted >= 1 and wait_for(lambda: flow_maps.read_conns(inst.pins, 0) == 0, timeout=5,
                                     what="the count to come back to 0") is not None
