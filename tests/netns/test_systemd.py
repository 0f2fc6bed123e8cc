"""The host install under systemd (docs/operations.md), run for real: a Debian bookworm container with systemd as PID 1.

   client 198.18.0.10 -- switch ==trunk (VLANs 100, 200)== nic0 [container: systemd, PID 1]
                                                                 pep.service: pepctl up / reload / down
   origin 198.19.0.10 (nginx) -- switch                          pep-supervisor@: supervisor, HAProxy
                                                                 pep-exporter@: 127.0.0.1:9101
                                                                 graph pl<rid>-pep (its own /run/netns)

The lab is `pep-lab up --no-pepctl`: its proxyhost namespace has the trunk on nic0 and nothing
else. The container (netns/container.py: a cached Debian root from Debian's packages, an overlay
as its disk, booted by systemd-nspawn in that namespace) is the proxy host. Inside it runs exactly
the commands of the docs' block that ends `systemctl enable --now pep`, with `...` a git bundle
of this checkout's HEAD (commit first: uncommitted changes are not in it), and the lab's pepctl
config (netns/lab.toml.in, supervisor "auto") as the edit of /etc/pep/pep.toml.

How right is told from wrong: the origin's access log names the peer of each request (the client's
own address through a transparent proxy); `pepctl status --json` inside says which HAProxy and
supervisor run and counts the flows the datapath handed to HAProxy (flows_proxied) and the
sessions HAProxy carried; systemd itself says what it restarted (NRestarts, MainPID) and what each
unit logged (journalctl -o json: lines from the unit's own processes, not systemd's). "Nothing
left" compares a snapshot taken inside the container after setup with one after stop.

The tests run in order on one container: each leaves the appliance up for the next, except stop,
after which reboot starts it again by booting.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import secrets
import shutil
import subprocess
import threading
import time

import pytest

from netns.container import Container, Root
from netns.handle import PYTHON, LabHandle
from netns.lab import Lab
from pepctl import congestion, hostinfo, radio_maps
from pepctl.runner import StepError, wait_for

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = "/etc/pep/pep.toml"
PEPCTL = f"/opt/pep/scripts/pepctl -c {CONFIG}"
BUNDLE = "/root/pep.bundle"      # the "..." of `git clone ... /opt/pep`, inside the container
INSTALL_MARK = "systemctl enable --now pep"
HELD_BYTES = 16 << 20      # a download held across a supervisor's death (a range of the origin's sparse /1g)
DOCS = ("README.md", "docs/operations.md")   # where the install and the scores are told
# The client ports of the connections a test needs proxied (request(), the held downloads): one of
# its own each time, below the ephemeral range (32768-60999) that the tests' loads cycle through in
# seconds (wrk, Connection: close). A new flow from a port whose earlier connection the proxy still
# holds may go end to end (bypass_busy, tc/pep_flow.h step 3c): right for the product, and not what
# these tests check (seen: 4 times in about 22 runs of this module).
OWN_PORTS = itertools.count(20000 + secrets.randbelow(10000))

# A download read slowly through a small receive buffer, so that what the client has not read yet
# cannot hide how the connection ended (curl --limit-rate reads a buffered reset only after every
# buffered byte: seen, 11 MB at 200 kB/s, past its own timeout). Prints how it ended.
SLOW_READER = r"""
import json, socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
s.settimeout(float(sys.argv[2]))
s.bind(("", int(sys.argv[3])))
s.connect((sys.argv[1], 80))
s.sendall(b"GET /1g HTTP/1.1\r\nHost: origin\r\n\r\n")
got, end = 0, "timeout"
try:
    while True:
        chunk = s.recv(16384)
        if not chunk:
            end = "eof"
            break
        got += len(chunk)
        time.sleep(0.02)
except ConnectionResetError:
    end = "reset"
except TimeoutError:
    pass
print(json.dumps({"end": end, "bytes": got}), flush=True)
"""

# What could be left of an instance inside the container: compared after setup and after stop.
SNAPSHOT = r"""
import json, os, subprocess
def ls(path):
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []
def tree(path):
    return sorted(os.path.relpath(os.path.join(d, f), path) for d, ds, fs in os.walk(path) for f in ds + fs)
def j(*cmd):
    out = subprocess.run(cmd, capture_output=True, text=True).stdout
    return json.loads(out) if out.strip() else []
def nft_tables():
    out = j("nft", "-j", "list", "tables")
    return sorted(t["table"]["name"] for t in (out or {}).get("nftables", []) if "table" in t)
procs = []
for pid in ls("/proc"):
    if not pid.isdigit() or int(pid) == os.getpid():
        continue
    try:
        argv = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode().strip()
        uid = open(f"/proc/{pid}/status").read().split("Uid:")[1].split()[0]
    except (OSError, IndexError):
        continue
    if "haproxy" in argv or "pepctl" in argv or uid == os.environ["PEP_UID"]:
        procs.append(argv)
print(json.dumps({
    "processes": sorted(procs),
    "netns": ls("/run/netns"),
    "run": [p for p in ls("/run") if p.startswith("pep")] + tree("/run/pep") + tree("/run/pep-instances"),
    "pins": tree("/sys/fs/bpf"),
    "links": sorted(link["ifname"] for link in j("ip", "-j", "link")),
    "nic0 qdiscs": sorted(q["kind"] for q in j("tc", "-j", "qdisc", "show", "dev", "nic0")),
    "nft tables": nft_tables(),
    "units": subprocess.run(["systemctl", "list-units", "pep*", "--state=active", "--plain", "--no-legend"],
                            capture_output=True, text=True).stdout.split("\n")[:-1],
}))
"""


def docs_text() -> str:
    text = ""
    for name in DOCS:
        with open(os.path.join(REPO, name)) as f:
            text += f.read()
    return text


def install_commands() -> list[str]:
    """The documented host install under systemd: the shell block holding INSTALL_MARK, one command
    a line (continuations joined)."""
    blocks = re.findall(r"```sh\n(.*?)```", docs_text(), re.S)
    found = [b for b in blocks if INSTALL_MARK in b]
    assert len(found) == 1, f"{' and '.join(DOCS)}: expected one ```sh block with `{INSTALL_MARK}`, found {len(found)}"
    return [c.strip() for c in found[0].replace("\\\n", " ").splitlines() if c.strip()]


def documented_scores() -> dict[str, tuple[float, str]]:
    """The documented table of `systemd-analyze security` scores: unit template -> (exposure, word)."""
    rows = re.findall(r"^\| `(pep[\w@.-]*\.service)` \| ([\d.]+) (\w+) \|$", docs_text(), re.M)
    return {unit: (float(score), word) for unit, score, word in rows}


class Appliance:
    """The lab around the container, and what the tests ask of the appliance inside."""

    def __init__(self, lab: LabHandle, box: Container):
        self.lab, self.box = lab, box
        self.instance = f"pl{lab.rid}"
        self.supervisor = f"pep-supervisor@run-pep-{self.instance}.service"
        self.exporter = f"pep-exporter@run-pep-{self.instance}.service"
        self.baseline: dict = {}
        self.congestion = ""      # the access side's, as install() wrote it

    def status(self) -> dict:
        """pepctl status --json inside; it exits 1 while the instance has a problem (a supervisor
        being restarted), and still says everything."""
        proc = self.box.run(f"{PEPCTL} status --json", check=False)
        try:
            return json.loads(proc.stdout)
        except ValueError:
            raise AssertionError(f"container: pepctl status --json exited {proc.returncode}: {proc.stderr}") from None

    def unit(self, unit: str, *props: str) -> dict[str, str]:
        out = self.box.run(f"systemctl show {unit} -p {','.join(props)}").stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def snapshot(self) -> dict:
        uid = self.box.run("id -u pep").stdout.strip()
        return json.loads(self.box.run(f"PEP_UID={uid} python3 -", input=SNAPSHOT).stdout)

    def request(self, url: str = "http://198.19.0.10/", client: str = "198.18.0.10") -> None:
        """One request from the lab's client, proxied by the container: the origin sees the client's
        address, and the datapath and HAProxy each count one more."""
        before = self.status()["graphs"][0]
        tag = f"t{secrets.token_hex(4)}"
        port = next(OWN_PORTS)
        body = self.lab.run("client", "curl", "-s", "-m", "5", "--local-port", str(port), f"{url}?{tag}", check=False)
        assert "PEP lab origin" in body.stdout, \
            f"client: curl --local-port {port} {url}: exit {body.returncode}, {body.stdout[:200]!r} " \
            f"{body.stderr[:200]}"
        peer = self.lab.origin_peer(tag)
        assert peer == client, f"origin log: expected peer {client} (the client's own address), got {peer}"
        seen = {}

        def counted():
            # `pepctl status` takes a while on a busy machine: one call per poll, kept for the message.
            seen["after"] = g = self.status()["graphs"][0]
            return g["proxy"]["haproxy"]["sessions_total"] > before["proxy"]["haproxy"]["sessions_total"]

        try:
            wait_for(counted, timeout=10, what="HAProxy's sessions_total to count the request")
        except StepError as e:
            after = seen["after"]
            moved = {k: (v, after["flows"][k]) for k, v in before["flows"].items() if after["flows"].get(k) != v}
            raise AssertionError(f"container: {e} (client port {port}); HAProxy {before['proxy']['haproxy']} -> "
                                 f"{after['proxy']['haproxy']}; the datapath's counters that moved: {moved}") from None
        after = seen["after"]
        assert after["flows"]["flows_proxied"] == before["flows"]["flows_proxied"] + 1, \
            f"container: flows_proxied expected {before['flows']['flows_proxied'] + 1} (the datapath handed the " \
            f"flow to HAProxy), got {after['flows']['flows_proxied']}"

    def proxied_sockets(self) -> int:
        """Established TCP sockets in the graph's namespace: HAProxy's own (a proxied connection has
        two there, a bypassed flow none). ss, not pepctl status: it answers fast on a busy machine."""
        return len(self.box.run(f"ss -Htn -N {self.instance}-pep state established").stdout.splitlines())

    def ensure_up(self) -> None:
        if self.unit("pep.service", "ActiveState")["ActiveState"] != "active":
            self.box.run("systemctl start pep", timeout=180)

    def journal(self, unit: str, since: str = "") -> list[dict]:
        out = self.box.run(f"journalctl -u {unit} -o json --no-pager {since}").stdout
        return [json.loads(line) for line in out.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def appliance():
    for tool in ("mmdebstrap", "systemd-nspawn", "git"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} not found: run scripts/setup (it installs mmdebstrap and systemd-container)")
    with Root() as root:
        lab = LabHandle.up(f"t{secrets.token_hex(3)}", ["--no-pepctl"])
        box = Container(f"pl{lab.rid}-ph", root, lab.netns("proxyhost"))
        try:
            box.create()
            subprocess.run(["git", "-C", REPO, "bundle", "create", os.path.join(box.disk, BUNDLE.lstrip("/")), "HEAD"],
                           check=True, capture_output=True)
            box.boot()
            app = Appliance(lab, box)
            install(app)
            yield app
        finally:
            try:
                box.destroy()
            finally:
                lab.down()


def install(app: Appliance) -> None:
    """Exactly the documented commands; the edit of /etc/pep/pep.toml is the lab's own config."""
    lab = Lab(app.lab.name)
    opts = argparse.Namespace(**lab.journal.meta["options"])
    # A congestion control is the kernel's, one for every namespace and bpffs: pep_radio registered
    # by another run on this machine (a lab beside the test) cannot be shared with the container's
    # pepctl, whose bpffs holds none of its pins, and it would rightly refuse it. The default is then
    # left out (test_the_access_side_runs_the_default says so), and the rest runs with bbr.
    if opts.congestion == radio_maps.NAME and congestion.registration(radio_maps.NAME) != "none":
        opts.congestion = "bbr"
    app.congestion = opts.congestion
    config = lab.render_pep(opts, run_dir="/run", supervisor="auto")
    commands = install_commands()
    assert any(CONFIG in c for c in commands), f"{' and '.join(DOCS)}: no command of the install block writes {CONFIG}"
    for command in commands:
        if command.startswith("systemctl") and "enable" in command:
            app.baseline = app.snapshot()      # what the host has before the instance
        app.box.run(command.replace("...", BUNDLE), timeout=300)
        if CONFIG in command:
            app.box.write(CONFIG, config)


# -- the checks, in order -------------------------------------------------------------------------
def test_install_brings_the_proxy_up_and_the_origin_sees_the_client(appliance):
    states = {u: appliance.unit(u, "ActiveState", "SubState")
              for u in ("pep.service", appliance.supervisor, appliance.exporter)}
    assert states["pep.service"] == {"ActiveState": "active", "SubState": "exited"}, states
    assert all(s["ActiveState"] == "active" for s in states.values()), f"container: units after install: {states}"
    assert appliance.box.run("systemctl is-enabled pep").stdout.strip() == "enabled"
    appliance.request()
    appliance.request("http://[2001:2:0:2::10]/", "2001:2:0:1::10")


def test_the_access_side_runs_the_default_congestion_control(appliance):
    """The default toward subscribers is pepctl's own pep_radio: `up` under systemd registers it (the
    unit's capabilities and the container's bpffs suffice) and the access side's routes name it."""
    if appliance.congestion != radio_maps.NAME:
        pytest.skip(f"{radio_maps.NAME} is registered on this machine by another run (a congestion control is "
                    "the kernel's, and the container's bpffs cannot hold that run's pins): the appliance ran "
                    f"with {appliance.congestion} instead")
    appliance.ensure_up()
    graph = appliance.status()["graphs"][0]
    assert graph["congestion"]["access"] == radio_maps.NAME, f"container: pepctl status: {graph['congestion']}"
    available = appliance.box.run("cat /proc/sys/net/ipv4/tcp_available_congestion_control").stdout.split()
    assert radio_maps.NAME in available, f"container: the kernel offers {available}"
    pins = appliance.box.run(f"ls /sys/fs/bpf/pep-congestion/{radio_maps.NAME}").stdout.split()
    assert radio_maps.PARAMS_MAP in pins, f"container: pepctl's pins of {radio_maps.NAME}: {pins}"


def test_open_file_limit_of_the_unit_reaches_haproxy_and_its_maxconn(appliance):
    """LimitNOFILE= of the units sizes HAProxy's maxconn. systemd cannot raise a hard limit past the
    container's own without CAP_SYS_RESOURCE: it sets the nearest it can, and so does this check."""
    appliance.ensure_up()
    def hard_nofile(pid: str) -> int:
        line = next(ln for ln in appliance.box.run(f"cat /proc/{pid}/limits").stdout.splitlines()
                    if ln.startswith("Max open files"))
        return int(line.split()[4])
    unit = int(appliance.unit(appliance.supervisor, "LimitNOFILE")["LimitNOFILE"])
    ceiling = hard_nofile("1")
    status = appliance.status()
    got = hard_nofile(str(status["proxy"]["haproxy"]["pid"]))
    assert got == min(unit, ceiling), f"HAProxy's open-file limit: {got}; expected the unit's {unit} or, " \
                                      f"below it, the container's hard limit {ceiling}"
    maxconn = status["graphs"][0]["proxy"]["haproxy"]["sessions_limit"]
    pid = status["proxy"]["haproxy"]["pid"]
    threads = len(appliance.box.run(f"ls /proc/{pid}/task").stdout.split())   # each has its own listeners
    want = hostinfo.maxconn_for(got, (1,), threads)
    assert maxconn == want, f"HAProxy's maxconn {maxconn}; expected {want} for {got} open files and {threads} threads"
    if ceiling < unit:
        pytest.skip(f"LimitNOFILE={unit} itself cannot take effect here: the container's hard limit is {ceiling} "
                    f"(this machine's), and nspawn gets no CAP_SYS_RESOURCE to raise it; HAProxy got {got} "
                    f"and maxconn {maxconn}, sized from it")


def test_kill_9_of_haproxy_the_supervisor_brings_it_back(appliance):
    appliance.ensure_up()
    old = appliance.status()["proxy"]
    appliance.box.run(f"kill -9 {old['haproxy']['pid']}")
    new = wait_for(lambda: (p := appliance.status()["proxy"])["haproxy"]["running"]
                     and p["haproxy"]["pid"] != old["haproxy"]["pid"] and p, timeout=10,
                     what="the supervisor to start HAProxy again")
    assert new["supervisor"]["pid"] == old["supervisor"]["pid"], "the supervisor itself should not have restarted"
    assert new["restarts"] == old["restarts"] + 1, f"supervisor restarts: {old['restarts']} -> {new['restarts']}"
    appliance.request()


def test_kill_9_of_the_supervisor_systemd_restarts_it_and_haproxy_carries_on(appliance):
    appliance.ensure_up()
    before = appliance.unit(appliance.supervisor, "MainPID", "NRestarts")
    haproxy = appliance.status()["proxy"]["haproxy"]["pid"]
    # A download through HAProxy across the supervisor's death: 16 MB at 4 MB/s.
    held = appliance.lab.popen("client", "curl", "-s", "-o", "/dev/null", "--limit-rate", "4M", "-m", "30",
                               "--local-port", str(next(OWN_PORTS)), "-r", f"0-{HELD_BYTES - 1}",
                               "-w", "%{size_download}", "http://198.19.0.10/1g")
    wait_for(lambda: appliance.proxied_sockets() >= 2, timeout=10, what="the download's two sockets in HAProxy")
    appliance.box.run(f"kill -9 {before['MainPID']}")
    after = wait_for(lambda: (u := appliance.unit(appliance.supervisor, "MainPID", "NRestarts", "ActiveState"))
                       ["ActiveState"] == "active" and u["MainPID"] not in ("0", before["MainPID"]) and u,
                       timeout=10, what=f"systemd to restart {appliance.supervisor}")
    assert int(after["NRestarts"]) == int(before["NRestarts"]) + 1, f"{appliance.supervisor}: {before} -> {after}"
    proxy = wait_for(lambda: (p := appliance.status()["proxy"])["supervisor"]["running"] and p, timeout=10,
                       what="the new supervisor to record itself")
    assert proxy["haproxy"]["pid"] == haproxy, \
        f"HAProxy pid {haproxy} should have been adopted by the new supervisor; now {proxy['haproxy']}"
    lines = appliance.box.run(f"journalctl -u {appliance.supervisor} --no-pager -n 20").stdout
    assert f"adopted running HAProxy pid {haproxy}" in lines, lines[-1500:]
    out, err = held.communicate(timeout=30)
    assert held.returncode == 0 and out == str(HELD_BYTES), \
        f"client: the download across the supervisor's death: curl exit {held.returncode}, {out} bytes {err}"
    appliance.request()


def test_reload_under_load_loses_no_connection(appliance):
    """wrk makes new connections (`Connection: close`) for 5 s; a changed setting is reloaded in the middle."""
    appliance.ensure_up()
    before = appliance.status()["proxy"]
    out = {}
    load = threading.Thread(target=lambda: out.update(wrk=appliance.lab.run(
        "client", "wrk", "-t1", "-c8", "-d5s", "-H", "Connection: close", "http://198.19.0.10/1k", timeout=40).stdout))
    load.start()
    try:
        time.sleep(1.5)
        appliance.box.run(f"sed -i 's/^splice = .*/splice = \"auto\"/' {CONFIG} && systemctl reload pep")
    finally:
        load.join()
    after = appliance.status()["proxy"]
    assert after["generation"] == before["generation"] + 1 and after["last_reload"]["ok"], after["last_reload"]
    assert after["haproxy"]["pid"] != before["haproxy"]["pid"], "reload should have started a new HAProxy"
    wrk = out["wrk"]
    done = re.search(r"(\d+) requests in", wrk)
    assert done and int(done.group(1)) > 100, f"client: wrk made too few requests to tell:\n{wrk}"
    assert "Socket errors" not in wrk and "Non-2xx" not in wrk, f"client: connections lost across reload:\n{wrk}"


def test_upgrade_after_a_new_checkout_swaps_units_and_supervisor_under_load(appliance):
    """A checkout whose code and units changed (here: a comment in the supervisor and in its unit):
    `pepctl upgrade` installs the unit, has systemd run this code's supervisor (which adopts the
    running HAProxy: a download held across it completes) and exporter, and loses no connection."""
    appliance.ensure_up()
    before = appliance.status()["proxy"]
    units = {u: appliance.unit(u, "MainPID") for u in (appliance.supervisor, appliance.exporter)}
    mark = f"# upgraded {secrets.token_hex(4)}"
    appliance.box.run(f"echo '{mark}' >> /opt/pep/haproxy/supervise.py && "
                      f"echo '{mark}' >> /opt/pep/etc/systemd/pep-supervisor@.service")
    held = appliance.lab.popen("client", "curl", "-s", "-o", "/dev/null", "--limit-rate", "4M", "-m", "30",
                               "--local-port", str(next(OWN_PORTS)), "-r", f"0-{HELD_BYTES - 1}",
                               "-w", "%{size_download}", "http://198.19.0.10/1g")
    out = {}
    load = threading.Thread(target=lambda: out.update(wrk=appliance.lab.run(
        "client", "wrk", "-t1", "-c8", "-d5s", "-H", "Connection: close", "http://198.19.0.10/1k", timeout=40).stdout))
    try:
        wait_for(lambda: appliance.proxied_sockets() >= 2, timeout=10, what="the download's two sockets in HAProxy")
        assert appliance.status()["upgrade"]["required"] is False, appliance.status().get("upgrade")
        load.start()
        time.sleep(1.5)
        upgrade = appliance.box.run(f"{PEPCTL} upgrade", timeout=120)
        load.join()
        got, err = held.communicate(timeout=30)
    finally:
        if held.poll() is None:
            held.kill()
            held.wait()
    assert "install /opt/pep/etc/systemd/pep-supervisor@.service as /etc/systemd/system/pep-supervisor@.service" \
        in upgrade.stdout and f"HAProxy pid {before['haproxy']['pid']} adopted" in upgrade.stdout, upgrade.stdout
    assert mark in appliance.box.run("cat /etc/systemd/system/pep-supervisor@.service").stdout
    after = {u: appliance.unit(u, "MainPID") for u in units}
    assert all(after[u]["MainPID"] not in ("0", units[u]["MainPID"]) for u in units), \
        f"the supervisor's and exporter's units should run new processes: {units} -> {after}"
    assert held.returncode == 0 and got == str(HELD_BYTES), \
        f"client: the download across the upgrade: curl exit {held.returncode}, {got} bytes {err}"
    wrk = out["wrk"]
    done = re.search(r"(\d+) requests in", wrk)
    assert done and int(done.group(1)) > 100, f"client: wrk made too few requests to tell:\n{wrk}"
    assert "Socket errors" not in wrk and "Non-2xx" not in wrk, f"client: connections lost across upgrade:\n{wrk}"
    status = appliance.status()
    assert status["format"] == 2 and "upgrade" not in status and status["state"] == "up", status
    again = appliance.box.run(f"{PEPCTL} upgrade")
    assert "runs this pepctl already" in again.stdout, again.stdout
    appliance.request()


def test_journal_shows_each_units_lines(appliance):
    appliance.ensure_up()
    expect = {"pep.service": f"instance {appliance.instance} is", appliance.supervisor: "supervisor: HAProxy pid",
              appliance.exporter: "exporter: serving"}
    for unit, words in expect.items():
        own = [e.get("MESSAGE", "") for e in appliance.journal(unit) if e.get("_PID") != "1"]
        assert any(words in line for line in own), \
            f"container: journalctl -u {unit}: no line of its own saying {words!r}; got {own[-10:]}"


def test_security_scores_are_the_readmes(appliance):
    appliance.ensure_up()
    claims = documented_scores()
    units = {"pep.service": "pep.service", "pep-supervisor@.service": appliance.supervisor,
             "pep-exporter@.service": appliance.exporter}
    assert set(claims) == set(units), f"{' and '.join(DOCS)}: a score for each unit expected, got {sorted(claims)}"
    got = {}
    for template, unit in units.items():
        out = appliance.box.run(f"systemd-analyze security {unit} --no-pager", check=False).stdout
        m = re.search(r"Overall exposure level for \S+: ([\d.]+) (\w+)", out)
        assert m, f"container: systemd-analyze security {unit} printed no score: {out[-500:]}"
        got[template] = (float(m.group(1)), m.group(2))
    assert got == claims, f"systemd-analyze security: the docs say {claims}, systemd says {got}"


def test_restart_takes_the_instance_down_and_up(appliance):
    """The docs: restart is down then up; connections in progress are reset."""
    appliance.ensure_up()
    before = appliance.status()["proxy"]
    since = appliance.box.run("date '+%Y-%m-%d %H:%M:%S'").stdout.strip()
    held = appliance.lab.popen("client", PYTHON, "-c", SLOW_READER, "198.19.0.10", "30", str(next(OWN_PORTS)))
    try:
        wait_for(lambda: appliance.proxied_sockets() >= 2, timeout=10,
                   what="the download's two sockets in HAProxy")
        appliance.box.run("systemctl restart pep", timeout=180)
        out, err = held.communicate(timeout=40)
    finally:
        if held.poll() is None:
            held.kill()
            held.wait()
    ended = json.loads(out or "{}")
    assert ended.get("end") == "reset", \
        f"client: a download in progress should be reset by restart; it ended {ended or err}"
    after = appliance.status()["proxy"]
    assert after["haproxy"]["pid"] != before["haproxy"]["pid"] and after["supervisor"]["pid"] != \
        before["supervisor"]["pid"], f"restart should start a new supervisor and HAProxy: {before} -> {after}"
    said = [e["MESSAGE"] for e in appliance.journal("pep.service", f"--since '{since}'") if e.get("_PID") != "1"]
    # --since is to the second: the up before the restart may be in it too. An up after the down.
    down = next((i for i, m in enumerate(said) if m == f"instance {appliance.instance} is down"), len(said))
    up = next((i for i, m in enumerate(said[down:]) if m.startswith(f"instance {appliance.instance} is up")), None)
    assert up is not None, f"pep.service's journal since restart: {said[-8:]}"
    appliance.request()


def test_stop_leaves_nothing_of_the_instance(appliance):
    appliance.ensure_up()
    appliance.box.run("systemctl stop pep", timeout=180)
    for unit in ("pep.service", appliance.supervisor, appliance.exporter):
        state = appliance.unit(unit, "ActiveState")["ActiveState"]
        assert state == "inactive", f"container: {unit} is {state} after systemctl stop pep"
    left = appliance.snapshot()
    diff = {k: {"before": appliance.baseline[k], "after": left[k]} for k in left if left[k] != appliance.baseline[k]}
    assert not diff, f"container: systemctl stop pep left this behind: {diff}"
    # Nothing forwards between the VLANs any more (the docs).
    proc = appliance.lab.run("client", "curl", "-s", "-m", "2", "http://198.19.0.10/", check=False)
    assert proc.returncode != 0, "client: a request reached the origin with the instance stopped"


def test_reboot_brings_the_appliance_up_by_itself(appliance):
    appliance.ensure_up()
    box = appliance.box
    box.poweroff()
    box.boot()
    for unit in ("pep.service", appliance.supervisor, appliance.exporter):
        state = appliance.unit(unit, "ActiveState")["ActiveState"]
        assert state == "active", f"container: {unit} is {state} after the reboot"
    shutdown = box.run("journalctl -b -1 -u pep --no-pager -o cat").stdout
    assert f"instance {appliance.instance} is down" in shutdown, \
        f"the shutdown should have taken the instance down (pepctl down): {shutdown[-800:]}"
    appliance.request()
