"""One instance on a proxy host: its lock, a journal that knows every process, least privilege.

   [<inst>-host]  nic0 <-veth-> peer0          a bare proxy host (tests/netns/conftest.py)
      pepctl up -> keeper (root) -> supervisor (pep) -> HAProxy (pep)
                   namespaces <inst>-g1, <inst>-g2, links <inst>c100..., pins, /run/<inst>

How right is told from wrong:
- the lock: a test holds the instance's lock itself (pepctl/lock.py, the same flock), then runs
  pepctl: --no-wait must exit at once naming the holder's PID and command; a waiting command
  must say whom it waits for and finish once the lock is released;
- kill -9 of `pepctl up`: `up` prints each step as it finishes; the test kills it right after a
  chosen step (or while the supervisor is starting), then runs `pepctl down`: the host's
  snapshot (namespaces, links, qdiscs, pins, run files, the instance's processes) must be the
  one taken before `up`;
- least privilege: /proc/PID/status of the supervisor and HAProxy give Uid and CapEff/CapBnd,
  compared with the documented capabilities (haproxy/README.md).
"""

from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
import threading
import time

import pytest

from netns.handle import BASE, SECOND_GRAPH
from pepctl import config as configmod
from pepctl.lock import InstanceLock
from pepctl.runner import wait_for

# CAP_NET_BIND_SERVICE (10), CAP_NET_ADMIN (12), CAP_SYS_ADMIN (21): haproxy/README.md says why each.
DOCUMENTED_CAPS = (1 << 10) | (1 << 12) | (1 << 21)


def proc_status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def up_ok(host, conf):
    up = host.pepctl(conf, "up")
    assert up.returncode == 0, f"pepctl up: {up.stderr}\n{up.stdout[-2000:]}"


def status(host, conf) -> dict:
    st = host.pepctl(conf, "status", "--json")
    return json.loads(st.stdout)


def test_proxy_runs_as_its_own_user_with_only_the_documented_capabilities(host):
    conf = host.config(BASE)
    up_ok(host, conf)
    proxy = status(host, conf)["proxy"]
    pep = pwd.getpwnam("pep").pw_uid
    for who, want_eff in (("supervisor", 0), ("haproxy", DOCUMENTED_CAPS)):
        pid = proxy[who]["pid"]
        st = proc_status(pid)
        uid = int(st["Uid"].split()[0])
        assert uid == pep, f"{who} (pid {pid}): uid expected {pep} (pep), got {uid}"
        eff, bnd = int(st["CapEff"], 16), int(st["CapBnd"], 16)
        assert eff == want_eff, f"{who} (pid {pid}): CapEff expected {want_eff:016x}, got {eff:016x}"
        assert bnd == DOCUMENTED_CAPS, f"{who} (pid {pid}): CapBnd expected {DOCUMENTED_CAPS:016x}, got {bnd:016x}"
        assert st["NoNewPrivs"].strip() == "1", f"{who} (pid {pid}): NoNewPrivs expected 1, got {st['NoNewPrivs']}"


def hold_lock(host, conf, seconds: float) -> threading.Thread:
    """Holds the instance's lock from this process for `seconds`, as a `pepctl reload` would."""
    cfg = configmod.load(conf)
    got = threading.Event()

    def body():
        with InstanceLock(cfg.instance_names().lock, cfg.host.instance, "reload (held by the test)"):
            got.set()
            time.sleep(seconds)
    t = threading.Thread(target=body)
    t.start()
    assert got.wait(10), "the test could not take the lock"
    return t


def test_second_command_says_who_holds_the_lock_or_waits(host, tmp_path):
    conf = host.config(BASE)
    up_ok(host, conf)
    holder = hold_lock(host, conf, 2.0)
    try:
        busy = host.pepctl(conf, "bypass", "add", "port", "4011", "--no-wait")
        assert busy.returncode == 1, f"--no-wait while locked: expected exit 1, got {busy.returncode}: {busy.stdout}"
        assert f"pid {os.getpid()}" in busy.stderr and "reload (held by the test)" in busy.stderr, busy.stderr
        started = time.monotonic()
        waited = host.pepctl(conf, "bypass", "add", "port", "4011", "--wait", "30")
        took = time.monotonic() - started
    finally:
        holder.join()
    assert waited.returncode == 0, f"a waiting command failed: {waited.stderr}"
    assert "waiting for" in waited.stderr and f"pid {os.getpid()}" in waited.stderr, waited.stderr
    assert took >= 0.5, f"the second command finished in {took:.2f} s: it did not wait for the lock"
    assert "port 4011 added" in waited.stdout, waited.stdout


def test_down_waits_for_a_running_reload(host):
    conf = host.config(BASE)
    up_ok(host, conf)
    before_down = time.monotonic()
    holder = hold_lock(host, conf, 1.5)
    down = host.pepctl(conf, "down")
    holder.join()
    assert down.returncode == 0, down.stderr
    assert time.monotonic() - before_down >= 1.0, "down did not wait for the lock"
    assert "waiting for" in down.stderr, down.stderr


# Steps of `up`, in order; the test kills `up` right after the line of each has appeared.
KILL_AFTER = [
    "create pin folder",
    "load the flow program",
    "create 2 graph namespace",
    "links, addresses and routes of graph g1",
    "links, addresses and routes of graph g2",
    "attach port_ingress",
    "register graph g1",
    "attach flow_ingress and flow_egress to c_in and s_in of",
    "check /run/",
]


def kill_up_after(host, conf, line_start: str | None, delay: float = 0.0, sig: int = signal.SIGKILL) -> str:
    """Runs `pepctl up`, sends it sig (SIGKILL) delay s after it prints a line starting with line_start
    (None: delay s after it starts); returns what it printed, to its end."""
    proc = subprocess.Popen(host.argv(conf, "up"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = []
    try:
        if line_start is None:
            time.sleep(delay)
        else:
            for line in proc.stdout:
                out.append(line)
                if line.strip().startswith(line_start):
                    time.sleep(delay)
                    break
            else:
                pytest.fail(f"`up` ended before printing {line_start!r}: {''.join(out)[-2000:]}")
    finally:
        proc.send_signal(sig)
        out.append(proc.communicate()[0])
    return "".join(out)


@pytest.mark.parametrize("line_start,delay", [(x, 0.0) for x in KILL_AFTER] + [
    ("check /run/", 0.05),    # while the keeper, supervisor and HAProxy are starting
    ("check /run/", 0.3),
    (None, 0.4),
])
def test_kill_9_of_up_then_down_leaves_nothing(host, line_start, delay):
    conf = host.config(BASE + SECOND_GRAPH)
    before = host.snapshot()
    printed = kill_up_after(host, conf, line_start, delay)
    down = host.pepctl(conf, "down")
    assert down.returncode == 0, f"down after a killed up: {down.stderr}\n(up printed: {printed[-1500:]})"
    # The kernel destroys a deleted namespace's links in the background: poll.
    wait_for(lambda: host.snapshot() == before, timeout=10,
             what=f"the host as before `up` (got {host.snapshot()}, expected {before})")


@pytest.mark.parametrize("line_start", ["load the flow program", "links, addresses and routes of graph g2",
                                        "attach flow_ingress and flow_egress to c_in and s_in of"])
def test_sigterm_of_up_rolls_back_by_itself(host, line_start):
    """SIGTERM (systemd's start timeout, `kill`) stops `up` as Ctrl-C does: it undoes what it made and
    says so, with no `down` needed (before, it died at once and left the half-built instance)."""
    conf = host.config(BASE + SECOND_GRAPH)
    before = host.snapshot()
    printed = kill_up_after(host, conf, line_start, sig=signal.SIGTERM)
    assert "rolling back what was made" in printed and "interrupted" in printed, \
        f"up, SIGTERM after {line_start!r}: expected a rollback and `interrupted`, got: {printed[-1500:]}"
    wait_for(lambda: host.snapshot() == before, timeout=10,
             what=f"the host as before `up`, with no `down` (got {host.snapshot()}, expected {before})")


def test_up_after_a_killed_up_undoes_it_first_and_comes_up(host):
    conf = host.config(BASE + SECOND_GRAPH)
    kill_up_after(host, conf, "links, addresses and routes of graph g1")
    up = host.pepctl(conf, "up")
    assert up.returncode == 0, up.stderr
    assert "did not finish: undoing it first" in up.stdout, up.stdout
    st = status(host, conf)
    assert st["state"] == "up" and [g["proxy"]["mode"] for g in st["graphs"]] == ["proxy", "proxy"], st
    assert host.pepctl(conf, "down").returncode == 0
