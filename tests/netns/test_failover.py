"""kill -9 of the proxy under a load of new connections: fail-open at once, no flow lost, back in 2 s.

   client 198.18.0.10 (lab) + 198.18.0.20-23 (one per test)
      | loadgen.py: 4 workers of short connections (GET /1k, Connection: close) back to back;
      | loadgen.py: a new "long" connection every 20 ms (10 keep-alive GETs, 100 ms apart)
   switch == nic0 [proxyhost: keeper -> supervisor -> HAProxy]          kill -9 at T
      == c_in [pep: tc flow_ingress: listener? PROXY (sk_assign / tproxy) : BYPASS_FAILOPEN] s_in
      == ... -- origin nginx 198.19.0.10:80

Each test runs on the default lab (interception `bpf`, every port), on one with
`--interception nft --ports 80` and on one with `--interception route --ports 80`: fail-open is the
tc program's in all three (in modes nft and route the stack would take a fail-open SYN for
HAProxy's listener, and the program forwards it by the main table).

How right is told from wrong. Every connection of the load generator is recorded with its start,
connect and end times and its outcome on CLOCK_MONOTONIC, which every namespace shares, and the
test records T, the moment of the kill -9, on the same clock. A thread inside the graph's
namespace watches the listener through sock_diag every millisecond, so the moment HAProxy's
listener went and came back is on that clock too. The datapath's own record says what each flow
got: the counters (flows_proxied, flows_bypass_failopen) read just before T, the moment the
listener is back, and at the end; and every fail-open flow's entry in the flow tables, whose
first_seen_ns is bpf_ktime_get_ns(), CLOCK_MONOTONIC again. So:
  (a) every connection started 25 ms after T or later must succeed, with no SYN retransmitted
      (a lost SYN costs 1 s), and one started within 25 ms of T must already succeed;
  (b) no connection started after T may fail after its first answer: long ones started in the
      fail-open window live on across HAProxy's return (the flow keeps its verdict);
  (c) the listener is back, and status names a new running HAProxy, within 2 s of T;
  (d) before T flows were proxied and none failed open; between T and the listener's return
      they failed open (the entries' first_seen all fall in that window); after, proxied again.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time

import pytest

from haproxy.supervise import is_our_haproxy, read_state
from netns.addresses import ORIGIN4
from netns.handle import PYTHON, LabHandle
from pepctl import config as configmod
from pepctl import flow_maps, nsutil, status
from pepctl.runner import wait_for

HERE = os.path.dirname(os.path.abspath(__file__))
LOADGEN = os.path.join(HERE, "loadgen.py")
LAB_MODES = {"bpf": [], "nft": ["--interception", "nft", "--ports", "80"],
             "route": ["--interception", "route", "--ports", "80"]}
SOURCES = {"haproxy": "198.18.0.20", "supervisor and haproxy": "198.18.0.21",
           "supervisor, its return, then haproxy": "198.18.0.22", "status": "198.18.0.23"}
NEW_FLOWS_WITHIN = 0.025   # s: new connections succeed again this soon after kill -9 of HAProxy (issue 11);
                           # 10 ms on earlier machines, 10.8-14 ms on a slower one under this load:
                           # still forty times sooner than a lost SYN's retransmission
BACK_WITHIN = 2.0          # s: HAProxy is back this soon (issue 11)
SYN_LOST = 0.9             # s: a connect this slow had its SYN retransmitted (initial RTO: 1 s)
LOAD_BEFORE = 1.0          # s of load before the kill
LOAD_SECONDS = 3.0         # s during which the load generator opens new connections


def lab_setup(handle) -> None:
    """The client addresses of this module's tests (each test's fail-open flows stay remembered; no
    other test meets them)."""
    for addr in SOURCES.values():
        handle.run("client", "ip", "addr", "add", f"{addr}/24", "dev", "eth0")


class Graph:
    """The lab's graph as pepctl names it: flow pins and slot, namespace, the instance's files."""

    def __init__(self, lab: LabHandle):
        cfg = configmod.load(os.path.join(lab.run_dir, "pep.toml"))
        g = cfg.graphs[0]
        self.instance = cfg.instance_names()
        self.netns = cfg.graph_names(g).netns
        self.pins = self.instance.flow_pins
        self.slot = g.index
        self.listen_port = min(status.listen_ports(g))   # listen_port, or route mode's port itself


@pytest.fixture(scope="module")
def graph(lab) -> Graph:
    return Graph(lab)


# -- reading the system -----------------------------------------------------------------------------
def pep_status(lab) -> dict:
    """`pepctl status --json` (it exits 1 while the instance is damaged, e.g. HAProxy down)."""
    proc = lab.pepctl("status", "--json", check=False)
    try:
        return json.loads(proc.stdout)
    except ValueError:
        raise AssertionError(f"pepctl status --json: exit {proc.returncode}, no JSON: {proc.stderr}") from None


def counters(graph: Graph) -> dict[str, int]:
    return flow_maps.read_counters(graph.pins, graph.slot)


def grew(before: dict, after: dict) -> dict:
    return {k: after[k] - before[k] for k in before if after[k] != before[k]}


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def haproxy_pid(lab, graph: Graph) -> int:
    """HAProxy's pid from status, checked to be this instance's before anyone signals it."""
    pid = pep_status(lab)["proxy"]["haproxy"]["pid"]
    assert pid and is_our_haproxy(pid, graph.instance.haproxy_cfg), \
        f"status: haproxy pid {pid} runs {cmdline(pid)!r}, not this instance's HAProxy"
    return pid


def process_pid(lab, graph: Graph, who: str, word: str) -> int:
    """The keeper's or the supervisor's pid from status, checked to run this instance's command."""
    pid = pep_status(lab)["proxy"][who]["pid"]
    cmd = cmdline(pid)
    assert pid and word in cmd and graph.instance.dir in cmd, f"status: {who} pid {pid} runs {cmd!r}"
    return pid


class Watch:
    """A thread inside the graph's namespace that every millisecond asks sock_diag whether the
    proxy's listeners exist (IPv4 and IPv6 both: HAProxy makes them one after the other, and an
    IPv4 SYN failed open 0.2 ms after the IPv6 one was seen back), and reads the supervisor's
    state file (which HAProxy is current, and whether it is ready), noting each change on the
    monotonic clock:
    listener = [(t, present)], state = [(t, haproxy pid, ready)]."""

    def __init__(self, netns: str, port: int, state_path: str):
        self.netns, self.port, self.state_path = netns, port, state_path
        self.listener: list[tuple[float, bool]] = []
        self.state: list[tuple[float, int | None, bool]] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"watch-{netns}", daemon=True)

    def _run(self) -> None:
        try:
            nsutil.join(self.netns)   # this thread only
            while not self._stop.is_set():
                present = all(self.port in {sockid[0] for sockid, _ in nsutil.sock_diag(family, 1 << nsutil.TCP_LISTEN)}
                              for family in (socket.AF_INET, socket.AF_INET6))
                # Read after the query: the listener was already in this state then. Read before
                # it, a listener that came back during the query was stamped early, and a SYN
                # failed open in those last microseconds fell outside the window (CI: +0.3 ms).
                t = time.monotonic()
                if not self.listener or self.listener[-1][1] != present:
                    self.listener.append((t, present))
                st = read_state(self.state_path)
                now = (st.get("haproxy"), bool(st.get("ready")))
                if not self.state or self.state[-1][1:] != now:
                    self.state.append((t, *now))
                time.sleep(0.001)
        except BaseException as e:  # reported by the test's thread
            self.error = e

    def __enter__(self):
        self._thread.start()
        wait_for(lambda: self.listener or self.error, timeout=5, what=f"the listener watch in {self.netns}")
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=5)

    def check(self) -> None:
        if self.error:
            raise AssertionError(f"watch in {self.netns}: {self.error!r}")

    def listener_change(self, present: bool, after: float) -> float | None:
        self.check()
        return next((t for t, p in self.listener if p == present and t >= after), None)

    def ready_other_than(self, victim: int, after: float) -> float | None:
        """When the supervisor's state first named a HAProxy other than victim, ready."""
        self.check()
        return next((t for t, pid, ready in self.state if t >= after and ready and pid and pid != victim), None)


def timeline(conns: list[dict], since: float, until: float | None = None, limit: int = 40) -> str:
    """Connections started in [since, until), for an assertion message: +0.004 short ok, ..."""
    rows = [c for c in conns if c["start"] >= since and (until is None or c["start"] < until)]
    text = ", ".join(f"+{(c['start'] - since) * 1000:.1f}ms {c['kind']} {'ok' if c['ok'] else c['error']}"
                     for c in rows[:limit])
    return text + (f", ... ({len(rows) - limit} more)" if len(rows) > limit else "")


# -- the experiment -------------------------------------------------------------------------------
def run_kill(lab, graph: Graph, src: str, kill) -> dict:
    """Runs the load from src, calls kill() after LOAD_BEFORE seconds (it kills and returns T0 and
    T, the monotonic time just before and just after HAProxy's kill -9, and HAProxy's pid), and
    returns what happened on one time line."""
    c0 = counters(graph)
    # Two load generators, so that the burst of resets that the kill brings to the long connections
    # under way (about fifty) does not hold up the short ones' event loop.
    common = ["--dst", ORIGIN4, "--src", src, "--duration", str(LOAD_SECONDS)]
    loads = {"short": lab.popen("client", PYTHON, LOADGEN, *common, "--workers", "4", "--long-every", "0"),
             "long": lab.popen("client", PYTHON, LOADGEN, *common, "--workers", "0", "--long-every", "0.02")}
    results = {}
    try:
        with Watch(graph.netns, graph.listen_port, graph.instance.supervisor_state) as watch:
            ready = []
            for kind, load in loads.items():
                line = load.stdout.readline()
                assert line, f"client: loadgen ({kind}) did not start: {load.communicate(timeout=5)[1][-2000:]}"
                ready.append(json.loads(line)["ready"])
            time.sleep(max(0.0, max(ready) + LOAD_BEFORE - time.monotonic()))
            c_kill = counters(graph)
            killing, killed, victim = kill()
            gone = wait_for(lambda: watch.listener_change(False, killed - 1), timeout=5,
                            what=f"HAProxy's listener on {graph.listen_port} to go after kill -9")
            back = wait_for(lambda: watch.listener_change(True, gone), timeout=10,
                            what=f"HAProxy's listener on {graph.listen_port} to come back")
            c_back = counters(graph)
            ready = wait_for(lambda: watch.ready_other_than(victim, killed), timeout=10,
                             what="the supervisor's state to name a new HAProxy, ready")
            for kind, load in loads.items():
                out, err = load.communicate(timeout=LOAD_SECONDS + 20)
                assert load.returncode == 0, f"client: loadgen ({kind}) exited {load.returncode}: {err[-2000:]}"
                results[kind] = json.loads(out.splitlines()[-1])["connections"]
    finally:
        for load in loads.values():
            if load.poll() is None:
                load.kill()
                load.wait()
    conns = sorted(results["short"] + results["long"], key=lambda c: c["start"])
    entries = [f for f in flow_maps.flows(graph.pins, graph=graph.slot) if f["subscriber"] == src]
    return {"T0": killing, "T": killed, "gone": gone, "back": back, "ready": ready, "c0": c0, "c_kill": c_kill,
            "c_back": c_back, "c_end": counters(graph), "conns": conns, "entries": entries}


def check_failover(lab, graph: Graph, r: dict, src: str) -> dict:
    """The assertions (a)-(d) of the module's docstring; returns figures for the report."""
    T, back, conns = r["T"], r["back"], r["conns"]
    ok_before = [c for c in conns if c["end"] < T and c["ok"]]
    assert len(ok_before) >= 200, f"client {src}: only {len(ok_before)} connections succeeded before the kill " \
                                  f"(expected 200 or more in {LOAD_BEFORE} s): the load is too thin to judge"
    after = [c for c in conns if c["start"] >= T]
    assert len([c for c in after if c["start"] < back]) >= 5, \
        f"client {src}: fewer than 5 connections started between the kill and the listener's return " \
        f"({(back - T) * 1000:.1f} ms): {timeline(conns, T, back)}"

    # (a) new connections succeed again within 25 ms, and at once (no SYN lost on the way).
    late = [c for c in after if c["start"] >= T + NEW_FLOWS_WITHIN and not c["ok"]]
    assert not late, \
        f"client {src}: {len(late)} connection(s) started {NEW_FLOWS_WITHIN * 1000:g} ms or more after kill -9 " \
        f"of HAProxy failed, expected none; errors {sorted({c['error'] for c in late})}; " \
        f"from T: {timeline(conns, T)}"
    # A load generator on two busy cores may start nothing for a few ms after the kill: then the first
    # connection it started at all is the first that must succeed (CI once saw its first at +12.3 ms).
    first_ok = min((c["start"] for c in after if c["ok"]), default=None)
    failed_before = [c for c in after if not c["ok"] and (first_ok is None or c["start"] < first_ok)]
    assert first_ok is not None and (first_ok - T <= NEW_FLOWS_WITHIN or not failed_before), \
        f"client {src}: first connection after kill -9 that succeeded started at " \
        f"{'never' if first_ok is None else f'+{(first_ok - T) * 1000:.1f} ms'}, expected within " \
        f"{NEW_FLOWS_WITHIN * 1000:g} ms ({len(failed_before)} failed before it); from T: {timeline(conns, T)}"
    slow = [c for c in after if c["start"] >= T + NEW_FLOWS_WITHIN and c["connected"] - c["start"] > SYN_LOST]
    assert not slow, \
        f"client {src}: {len(slow)} connection(s) after the kill took over {SYN_LOST} s to connect (a SYN lost " \
        f"and retransmitted), expected none: " + \
        ", ".join(f"+{(c['start'] - T) * 1000:.1f}ms took {c['connected'] - c['start']:.3f}s" for c in slow[:10]) + \
        f"; the listener went at +{(r['gone'] - T) * 1000:.1f} ms and was back at +{(back - T) * 1000:.1f} ms; " \
        f"pep counters from the kill to the return {grew(r['c_kill'], r['c_back'])}, from there to the end " \
        f"{grew(r['c_back'], r['c_end'])}"

    # (b) no connection started after the kill fails after its first answer; long fail-open ones live on.
    broke = [c for c in after if c["done"] >= 1 and not c["ok"]]
    assert not broke, \
        f"client {src}: {len(broke)} connection(s) started after the kill failed after being answered, expected " \
        f"none: " + ", ".join(f"+{(c['start'] - T) * 1000:.1f}ms {c['kind']} {c['done']}/{c['want']} {c['error']}"
                              for c in broke[:10])
    failopen = {e["sub_port"]: e for e in r["entries"] if e["verdict"] == "bypass_failopen"}
    across = [c for c in after if c["kind"] == "long" and c["ok"] and c["port"] in failopen
              and c["start"] - 0.001 <= failopen[c["port"]]["first_seen_ns"] / 1e9 <= c["connected"] + 0.001
              and c["answers"][-1] > back]
    assert across, \
        f"client {src}: no long connection bypassed by fail-open lived on after HAProxy's listener came back " \
        f"(+{(back - T) * 1000:.1f} ms): the test proves nothing; long ones after T: " + \
        ", ".join(f"+{(c['start'] - T) * 1000:.1f}ms port {c['port']} "
                  f"{failopen.get(c['port'], {}).get('verdict', 'no entry')}"
                  for c in after if c["kind"] == "long")[:1500]

    # (c) HAProxy is back within 2 s: its listener, and the supervisor's word that a new one is ready.
    assert back - T <= BACK_WITHIN and r["ready"] - T <= BACK_WITHIN, \
        f"pep {graph.netns}: after kill -9 HAProxy's listener on {graph.listen_port} came back in {back - T:.3f} s " \
        f"and the supervisor named a new HAProxy ready in {r['ready'] - T:.3f} s, expected both within " \
        f"{BACK_WITHIN} s"

    # (d) proxied before T, fail-open between T and the listener's return, proxied after.
    c0, ck, cb, ce = r["c0"], r["c_kill"], r["c_back"], r["c_end"]
    before = {k: ck[k] - c0[k] for k in ("flows_proxied", "flows_bypass_failopen")}
    assert before["flows_proxied"] >= len(ok_before) and before["flows_bypass_failopen"] == 0, \
        f"pep flow counters before the kill: expected flows_proxied >= {len(ok_before)} (the connections that " \
        f"succeeded) and flows_bypass_failopen 0, got {before}"
    during = cb["flows_bypass_failopen"] - ck["flows_bypass_failopen"]
    assert during >= 1, f"pep flow counters between the kill and the listener's return: expected " \
                        f"flows_bypass_failopen to grow, got {grew(ck, cb)}"
    after_back = {k: ce[k] - cb[k] for k in ce if ce[k] != cb[k]}
    n_after = len([c for c in conns if c["start"] > back + 0.05 and c["ok"]])
    # The client's clock and the counters' reads are not one instant: a connection or two at either
    # edge may fall on the other side (seen once in nft mode: 4,363 counted for 4,365 started). A
    # client reusing its port at once finds the proxy's previous connection from it ended first
    # (source_port = "kept": port_freed) and is proxied; none is held (port_held: a SYN lost).
    slack = max(2, n_after // 1000)
    assert after_back.get("flows_bypass_failopen", 0) == 0 and after_back.get("flows_proxied", 0) >= n_after - slack \
        and not after_back.get("port_held"), \
        f"pep flow counters after the listener came back: expected flows_bypass_failopen 0, port_held 0 and " \
        f"flows_proxied >= {n_after} (the connections started since), got {after_back}"
    seen = sorted(e["first_seen_ns"] / 1e9 for e in failopen.values() if e["first_seen_ns"] / 1e9 >= r["c0_t"])
    outside = [round(t - T, 4) for t in seen if not r["T0"] <= t <= back]
    assert seen and not outside, \
        f"pep flow tables: fail-open flows of {src} must have first_seen in [T - {(T - r['T0']) * 1000:.3f} ms, " \
        f"T + {back - T:.4f} s] (kill to " \
        f"listener back); got {len(seen)} entries, outside the window (s from T): {outside[:20]}"
    return {"gone_ms": round((r["gone"] - T) * 1000, 1), "listener_back_ms": round((back - T) * 1000, 1),
            "ready_ms": round((r["ready"] - T) * 1000, 1),
            "first_ok_ms": round((first_ok - T) * 1000, 2), "first_failopen_ms": round((seen[0] - T) * 1000, 2),
            "failopen_flows": during, "failed_at_kill": len([c for c in conns if not c["ok"]]),
            "connections": len(conns), "long_across_return": len(across)}


def report(lab, which: str, figures: dict) -> None:
    print(f"\n[{lab.interception}] kill -9 of {which}: " + ", ".join(f"{k} {v}" for k, v in figures.items()))


def wait_proxy_back(lab, victim: int, T: float) -> tuple[dict, float]:
    """Status once it names a new running HAProxy and mode proxy; and how long after T it did."""
    def back():
        st = pep_status(lab)
        h = st["proxy"]["haproxy"]
        ok = h["running"] and h["pid"] != victim and st["graphs"][0]["proxy"]["mode"] == "proxy"
        return st if ok else None
    st = wait_for(back, timeout=10, what="status to name a new running HAProxy and mode proxy", interval=0.02)
    return st, time.monotonic() - T


@pytest.mark.parametrize("which", ["haproxy", "supervisor and haproxy", "supervisor, its return, then haproxy"])
def test_kill_under_load_fails_open_at_once_and_loses_no_flow(lab, graph, which):
    src = SOURCES[which]
    st0 = pep_status(lab)
    assert st0["state"] == "up" and st0["graphs"][0]["proxy"]["mode"] == "proxy", \
        f"status before the test: expected up and mode proxy, got {st0['state']}, {st0['graphs'][0]['proxy']}"
    keeper = process_pid(lab, graph, "keeper", " keep ")
    sup = process_pid(lab, graph, "supervisor", "supervise")
    if which == "supervisor, its return, then haproxy":
        # The keeper restarts the supervisor, which adopts the running HAProxy.
        hap = haproxy_pid(lab, graph)
        os.kill(sup, signal.SIGKILL)
        st = wait_for(lambda: (s := pep_status(lab))["proxy"]["supervisor"]["running"] and
                      s["proxy"]["supervisor"]["pid"] != sup and s, timeout=BACK_WITHIN,
                      what=f"the keeper to restart the supervisor (pid {sup} killed)")
        assert st["proxy"]["haproxy"]["pid"] == hap and st["proxy"]["haproxy"]["running"], \
            f"the restarted supervisor did not adopt HAProxy pid {hap}: {st['proxy']['haproxy']}"
        sup = process_pid(lab, graph, "supervisor", "supervise")
    victim = haproxy_pid(lab, graph)
    restarts0 = pep_status(lab)["proxy"]["restarts"]

    def kill() -> tuple[float, float, int]:
        if which == "supervisor and haproxy":
            os.kill(sup, signal.SIGKILL)   # then HAProxy at once: no supervisor sees it die
        # The clock read on both sides of the kill: this process may be preempted between a read and
        # the kill, either way. Read before only, a connection started 0.7 ms after it was answered by
        # HAProxy and then cut; read after only, flows failed open 0.8 ms before it. T, after, is the
        # kill for every check but the fail-open window's start, which is T0, before.
        before = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        return before, time.monotonic(), victim

    c0_t = time.monotonic()
    r = run_kill(lab, graph, src, kill)
    r["c0_t"] = c0_t
    st, _ = wait_proxy_back(lab, victim, r["T"])
    report(lab, which, check_failover(lab, graph, r, src))
    p = st["proxy"]
    assert p["keeper"]["pid"] == keeper and p["keeper"]["running"], f"status: the keeper changed: {p['keeper']}"
    if which == "supervisor and haproxy":
        # HAProxy died with no supervisor to see it: the keeper's new supervisor found none and
        # started one.
        assert p["supervisor"]["running"] and p["supervisor"]["pid"] != sup, \
            f"status: expected a new running supervisor (pid {sup} was killed), got {p['supervisor']}"
    else:
        # The supervisor (the adopting one, after its own kill) saw HAProxy die and restarted it.
        assert p["supervisor"]["pid"] == sup and p["supervisor"]["running"], \
            f"status: expected supervisor pid {sup} running, got {p['supervisor']}"
        assert p["restarts"] == restarts0 + 1 and p["last_exit"]["pid"] == victim, \
            f"status: expected restarts {restarts0 + 1} with last exit of pid {victim}, got restarts " \
            f"{p['restarts']}, last exit {p['last_exit']}"
    assert st["state"] == "up" and not st["problems"], f"status after: {st['state']}, problems {st['problems']}"


def test_status_tells_fail_open_while_nothing_restarts_haproxy(lab, graph):
    """The keeper is stopped (SIGSTOP: it stays the parent that reaps its children), the supervisor
    and HAProxy are killed: nothing brings HAProxy back. Status must say fail-open and name both dead
    processes, and a new flow must be forwarded (fail-open). Once the keeper goes on, it restarts the
    supervisor, which starts HAProxy: status says proxy again and a new flow is proxied."""
    src = SOURCES["status"]
    keeper = process_pid(lab, graph, "keeper", " keep ")
    sup = process_pid(lab, graph, "supervisor", "supervise")
    victim = haproxy_pid(lab, graph)
    os.kill(keeper, signal.SIGSTOP)
    try:
        os.kill(sup, signal.SIGKILL)
        os.kill(victim, signal.SIGKILL)
        T = time.monotonic()
        st = wait_for(lambda: (s := pep_status(lab))["graphs"][0]["proxy"]["mode"] != "proxy" and s,
                      timeout=2, what="status to leave mode proxy after kill -9 of the supervisor and HAProxy")
        g, p = st["graphs"][0]["proxy"], st["proxy"]
        assert g["mode"] == "fail-open" and f"no listener on {graph.listen_port}" in g["why"], \
            f"status --json: expected mode fail-open (no listener on {graph.listen_port}), got {g}"
        assert not p["haproxy"]["running"] and not p["supervisor"]["running"] and p["keeper"]["running"], \
            f"status --json: expected HAProxy and supervisor not running, keeper running: {p}"
        problems = " | ".join(st["problems"])
        assert st["state"] == "damaged" and "HAProxy not running" in problems and \
            "supervisor is not running" in problems, \
            f"status --json: expected state damaged naming HAProxy and the supervisor, got {st['state']}: {problems}"
        text = lab.pepctl("status", check=False).stdout
        assert "new flows: FAIL-OPEN" in text and "NOT RUNNING" in text, f"pepctl status:\n{text}"
        # What status says is what new flows get: forwarded, and remembered as fail-open.
        c0 = counters(graph)
        got = lab.run("client", "curl", "-sS", "-m", "3", "--interface", src, "-o", "/dev/null",
                      "-w", "%{http_code} %{local_port}", f"http://{ORIGIN4}/1k").stdout.split()
        assert got[0] == "200", f"client {src}: a new connection while HAProxy is down: HTTP {got[0]}"
        verdicts = [f["verdict"] for f in flow_maps.flows(graph.pins, graph=graph.slot)
                    if f["subscriber"] == src and f["sub_port"] == int(got[1])]
        c1 = counters(graph)
        assert verdicts == ["bypass_failopen"] and c1["flows_bypass_failopen"] == c0["flows_bypass_failopen"] + 1, \
            f"pep flows of {src} port {got[1]}: expected one bypass_failopen entry and flows_bypass_failopen +1, " \
            f"got {verdicts} and {grew(c0, c1)}"
        still = pep_status(lab)["graphs"][0]["proxy"]["mode"]
        assert still == "fail-open", f"status: mode {still} {time.monotonic() - T:.1f} s later with nothing to " \
                                     f"restart HAProxy"
    finally:
        os.kill(keeper, signal.SIGCONT)
    st, took = wait_proxy_back(lab, victim, time.monotonic())
    assert st["state"] == "up" and not st["problems"] and st["proxy"]["supervisor"]["pid"] != sup, \
        f"status once the keeper went on: expected up with a new supervisor, got {st['state']}, " \
        f"{st['problems']}, {st['proxy']}"
    assert took <= BACK_WITHIN, f"the keeper brought the supervisor and HAProxy back in {took:.2f} s, " \
                                f"expected within {BACK_WITHIN} s"
    text = lab.pepctl("status").stdout
    assert "new flows: PROXY" in text, f"pepctl status after recovery:\n{text}"
    c0 = counters(graph)
    got = lab.run("client", "curl", "-sS", "-m", "3", "--interface", src, "-o", "/dev/null",
                  "-w", "%{http_code} %{local_port}", f"http://{ORIGIN4}/1k").stdout.split()
    c1 = counters(graph)
    assert got[0] == "200" and c1["flows_proxied"] == c0["flows_proxied"] + 1 and \
        c1["flows_bypass_failopen"] == c0["flows_bypass_failopen"], \
        f"client {src}: after recovery expected HTTP 200 and one flow proxied, got HTTP {got[0]} and " \
        f"{grew(c0, c1)}"
