"""The supervisor of an instance's HAProxy: start it, restart it the moment it dies, reload it.

One supervisor per instance, whatever the number of graphs. It runs as the proxy's own user
with CAP_NET_ADMIN, CAP_SYS_ADMIN and CAP_NET_BIND_SERVICE in its ambient set (from its
systemd unit, etc/systemd/pep-supervisor@.service, or pepctl's keeper, which reads the same
unit), clears them from its own effective set at once (it uses none), and hands them on to
HAProxy, which needs them (haproxy/README.md says why each).

It does not decide fail-open: the datapath does. When HAProxy dies its listening sockets go
with it, and tc's flow_ingress forwards new flows the moment no listener answers its lookup
(tc/pep_flow.h). The supervisor only brings HAProxy back: it watches HAProxy's PID through a
pidfd, so it learns of the death at once, not at its next poll, and restarts it at once (a
HAProxy that keeps dying is retried with a backoff of up to RESTART_MAX_DELAY).

    SIGHUP   reload: check the config, start a new HAProxy that takes the listening sockets
             over (-x), then drain the old one: it stops accepting (maxconn 0 on each of its
             frontends), and after DRAIN_DELAY, once the connections it had just accepted have
             reached their origin, it is told to finish its connections (SIGUSR1). Told at once,
             as -sf does, it closed a few just-accepted connections at every reload (measured:
             read errors in wrk); drained first, none. The result is in the state file
             (generation, last_reload)
    SIGTERM  stop HAProxy (every process it started) and exit

A supervisor started while a HAProxy of this instance runs (it was restarted itself) adopts
that HAProxy instead of starting a second one. Everything it knows is in proxy/supervisor.json,
written on every change; `pepctl status` reads it.

Run as `pepctl supervise INSTANCE_DIR`.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import subprocess
import sys
import time

from . import stats
from .render import STATS_ENV

RESTART_MAX_DELAY = 1.0   # seconds: back-off ceiling for a HAProxy that will not stay up
DRAIN_DELAY = 0.3         # seconds between an old HAProxy's last accept and its soft stop
READY_TIMEOUT = 30.0      # seconds a new HAProxy has to answer on its stats socket
STOP_GRACE = 5.0
DEFAULT_STATE = {"pid": None, "haproxy": None, "draining": [], "starting": None, "sockets": {}, "serial": 0,
                 "ready": False, "restarts": 0, "last_exit": None, "generation": 0, "last_reload": None,
                 "started": None}
SERIALS = 1_000_000            # socket names haproxy.s<serial>.sock: at most 6 digits


def paths(instance_dir: str) -> dict[str, str]:
    """The supervisor's files under an instance's folder (pepctl/names.py takes them from here)."""
    proxy = os.path.join(instance_dir, "proxy")
    return {"cfg": os.path.join(instance_dir, "haproxy.cfg"), "sock": os.path.join(proxy, "haproxy.sock"),
            "supervisor_log": os.path.join(proxy, "supervisor.log"),
            "log": os.path.join(proxy, "haproxy.log"), "state": os.path.join(proxy, "supervisor.json"),
            "pid": os.path.join(proxy, "supervisor.pid")}


def read_state(path: str) -> dict:
    try:
        with open(path) as f:
            return {**DEFAULT_STATE, **json.load(f)}
    except (OSError, ValueError):
        return dict(DEFAULT_STATE)


def haproxy_pids(state: dict) -> list[int]:
    """Every HAProxy the supervisor has started and not seen exit: the current one, one starting,
    those finishing their connections, and any other it gave a stats socket (one that a restarted
    supervisor could not adopt: stopping the instance must stop it too)."""
    return list(dict.fromkeys(p for p in [state.get("haproxy"), state.get("starting"), *state.get("draining", []),
                                          *map(int, state.get("sockets", {}))] if p))


def socket_name(serial: int) -> str:
    """A HAProxy process's own stats socket: every process binds one of its own, so the supervisor
    can tell an old process from a new one (the stable haproxy.sock is a link to the current)."""
    return f"haproxy.s{serial % SERIALS}.sock"


def is_our_haproxy(pid: int, cfg: str) -> bool:
    """pid is a live HAProxy started with cfg (a recorded PID may have been reused since)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
        with open(f"/proc/{pid}/stat") as f:
            zombie = f.read().split(") ", 1)[1][0] == "Z"
    except OSError:
        return False
    return not zombie and os.path.basename(argv[0]) == b"haproxy" and cfg.encode() in argv


def on_journal() -> bool:
    """stdout is systemd's journal stream: JOURNAL_STREAM names its device and inode (systemd.exec(5)).
    A process that merely inherited the variable (a keeper started by pep.service) writes elsewhere."""
    dev, _, ino = os.environ.get("JOURNAL_STREAM", "").partition(":")
    try:
        st = os.fstat(sys.stdout.fileno())
    except (OSError, ValueError):
        return False
    return f"{st.st_dev}:{st.st_ino}" == f"{dev}:{ino}"


# -- capabilities ---------------------------------------------------------------------------------
class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


_LINUX_CAPABILITY_VERSION_3 = 0x20080522


def drop_effective_caps() -> None:
    """Empties this process's effective capability set; permitted, inheritable and ambient stay,
    so the programs it starts still get the ambient ones (capabilities(7))."""
    libc = ctypes.CDLL(None, use_errno=True)
    hdr = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    if libc.capget(ctypes.byref(hdr), data) != 0:
        return
    for d in data:
        d.effective = 0
    libc.capset(ctypes.byref(hdr), data)


# -- the supervisor -------------------------------------------------------------------------------
class Supervisor:
    def __init__(self, instance_dir: str, out=None):
        self.dir = instance_dir
        self.p = paths(instance_dir)
        self.out = out or open(self.p["supervisor_log"], "a")  # noqa: SIM115
        # Under systemd its lines go to the journal too (journalctl -u pep-supervisor@...), not only
        # to the file that `pepctl status` and the keeper's users read.
        self.journal = out is None and on_journal()
        self.state = read_state(self.p["state"])
        self.state.update(pid=os.getpid(), ready=False, started=time.time())
        self.pidfds: dict[int, int] = {}        # haproxy pid -> pidfd
        self.children: dict[int, subprocess.Popen] = {}
        self.fails = 0
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.signals: list[int] = []

    def log(self, msg: str) -> None:
        print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} supervisor: {msg}", file=self.out, flush=True)
        if self.journal:
            print(f"supervisor: {msg}", flush=True)

    def save(self) -> None:
        tmp = self.p["state"] + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.state, f)
        os.replace(tmp, self.p["state"])

    # -- HAProxy processes --
    def watch(self, pid: int) -> bool:
        try:
            self.pidfds[pid] = os.pidfd_open(pid)
            return True
        except ProcessLookupError:
            return False

    def adopt(self) -> None:
        """Keep the HAProxy processes of a supervisor that was restarted (recorded and still ours)."""
        current = self.state.get("haproxy")
        draining = [p for p in self.state.get("draining", []) if is_our_haproxy(p, self.p["cfg"]) and self.watch(p)]
        self.state["draining"] = draining
        if current and is_our_haproxy(current, self.p["cfg"]) and self.watch(current):
            self.log(f"adopted running HAProxy pid {current}")
        else:
            self.state["haproxy"] = None

    def sock_of(self, pid: int) -> str:
        return os.path.join(os.path.dirname(self.p["sock"]), self.state["sockets"].get(str(pid), "none"))

    def spawn(self, extra: list[str]) -> subprocess.Popen:
        """Starts a HAProxy with a stats socket of its own; it is in the state before it runs."""
        self.state["serial"] += 1
        name = socket_name(self.state["serial"])
        env = {**os.environ, STATS_ENV: os.path.join(os.path.dirname(self.p["sock"]), name)}
        with open(self.p["log"], "ab") as logf:
            proc = subprocess.Popen(["haproxy", "-db", "-f", self.p["cfg"], *extra], stdin=subprocess.DEVNULL,
                                    stdout=logf, stderr=logf, env=env)
        self.children[proc.pid] = proc
        self.watch(proc.pid)
        self.state["sockets"][str(proc.pid)] = name
        self.state["starting"] = proc.pid
        self.save()
        return proc

    def answers(self, pid: int) -> bool:
        try:
            return int(stats.info(self.sock_of(pid), timeout=0.5).get("Pid", 0)) == pid
        except (OSError, ValueError):
            return False

    def wait_ready(self, proc: subprocess.Popen) -> str | None:
        """None once proc answers on its stats socket; else why not (a stop request included)."""
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return f"HAProxy exited with {proc.returncode} (see {self.p['log']})"
            if any(sig != signal.SIGHUP for sig in self.signals):
                return "told to stop meanwhile"
            if self.answers(proc.pid):
                return None
            time.sleep(0.02)
        return f"HAProxy did not answer on {self.sock_of(proc.pid)} within {READY_TIMEOUT:g}s"

    def make_current(self, pid: int) -> None:
        """pid is the HAProxy that new connections go to: haproxy.sock now leads to its socket."""
        tmp = self.p["sock"] + ".tmp"
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        os.symlink(self.state["sockets"][str(pid)], tmp)
        os.replace(tmp, self.p["sock"])
        self.state.update(haproxy=pid, starting=None, ready=True)

    def start(self) -> None:
        if not os.path.exists(self.p["cfg"]):
            raise SystemExit(f"{self.p['cfg']} is gone: the instance was taken down; exiting")
        proc = self.spawn([])
        self.state.update(haproxy=None, ready=False)
        why = self.wait_ready(proc)
        if why:
            self.fails += 1
            self.log(f"HAProxy pid {proc.pid} did not come up: {why}")
            self.stop_pid(proc.pid)
            self.state.update(last_exit={"pid": proc.pid, "at": time.time(), "why": why})
        else:
            self.fails = 0
            self.make_current(proc.pid)
            self.log(f"HAProxy pid {proc.pid} is up")
        self.save()

    def stop_pid(self, pid: int, sig: int = signal.SIGTERM) -> None:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + STOP_GRACE
        while time.monotonic() < deadline and is_our_haproxy(pid, self.p["cfg"]):
            self.reap()
            time.sleep(0.02)
        if is_our_haproxy(pid, self.p["cfg"]):
            os.kill(pid, signal.SIGKILL)
        self.forget(pid)

    def forget(self, pid: int) -> None:
        """pid has exited: drop its watch, its socket, and its place in the state."""
        fd = self.pidfds.pop(pid, None)
        if fd is not None:
            os.close(fd)
        proc = self.children.pop(pid, None)
        if proc is not None:
            proc.poll()
        name = self.state["sockets"].pop(str(pid), None)
        if name:
            try:
                os.unlink(os.path.join(os.path.dirname(self.p["sock"]), name))
            except FileNotFoundError:
                pass
        if self.state.get("starting") == pid:
            self.state["starting"] = None

    def reap(self) -> None:
        for pid, proc in list(self.children.items()):
            proc.poll()
            if proc.returncode is not None and pid not in self.pidfds:
                self.children.pop(pid)

    def exited(self, pid: int) -> None:
        proc = self.children.get(pid)
        code = proc.wait() if proc else None
        self.forget(pid)
        if pid in self.state["draining"]:
            self.state["draining"].remove(pid)
            self.log(f"old HAProxy pid {pid} finished its connections")
        elif pid == self.state["haproxy"]:
            self.state.update(haproxy=None, ready=False, restarts=self.state["restarts"] + 1,
                              last_exit={"pid": pid, "at": time.time(), "code": code})
            self.log(f"HAProxy pid {pid} died (exit {code}): new flows fail open until it is back")
        self.save()

    # -- reload --
    def reload(self) -> None:
        gen = self.state["generation"] + 1
        check = subprocess.run(["haproxy", "-c", "-f", self.p["cfg"]], capture_output=True, text=True,
                               env={**os.environ, STATS_ENV: self.p["sock"]})
        if check.returncode != 0:
            alerts = [x for x in (check.stdout + check.stderr).splitlines() if "ALERT" in x]
            self.finish_reload(gen, False, "config check failed: " + " | ".join(alerts[:5]))
            return
        old = self.state["haproxy"]
        # The new process takes the listening sockets over the old one's stats socket (-x).
        proc = self.spawn(["-x", self.sock_of(old)] if old else [])
        why = self.wait_ready(proc)
        if why:
            self.stop_pid(proc.pid)
            self.save()
            self.finish_reload(gen, False, why)
            return
        self.make_current(proc.pid)
        if old:
            self.state["draining"].append(old)
            self.save()
            self.drain(old)
        self.finish_reload(gen, True, f"HAProxy pid {proc.pid} took over from {old or 'none'}")

    def drain(self, pid: int) -> None:
        """The old HAProxy stops accepting, then finishes the connections it has, and exits."""
        sock = self.sock_of(pid)
        try:
            frontends = [r["pxname"] for r in stats.stats(sock) if r["svname"] == "FRONTEND"]
            stats.query(sock, ";".join(f"set maxconn frontend {f} 0" for f in frontends), timeout=5)
        except OSError as e:
            self.log(f"could not drain HAProxy pid {pid} ({e}); stopping it as it is")
        time.sleep(DRAIN_DELAY)
        try:
            os.kill(pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass

    def finish_reload(self, gen: int, ok: bool, detail: str) -> None:
        self.state.update(generation=gen, last_reload={"ok": ok, "at": time.time(), "detail": detail})
        self.log(f"reload {gen}: {'done' if ok else 'FAILED'}: {detail}")
        self.save()

    # -- the loop --
    def on_signal(self, signum, _frame) -> None:
        self.signals.append(signum)
        try:
            os.write(self.wake_w, b"!")
        except BlockingIOError:
            pass

    def run(self) -> int:
        drop_effective_caps()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self.on_signal)
        with open(self.p["pid"] + ".tmp", "w") as f:
            f.write(f"{os.getpid()}\n")
        os.replace(self.p["pid"] + ".tmp", self.p["pid"])
        self.log(f"started (pid {os.getpid()})")
        self.adopt()
        self.state["ready"] = bool(self.state["haproxy"])
        self.save()
        while True:
            if self.signals:
                sig = self.signals.pop(0)
                if sig == signal.SIGHUP:
                    self.reload()
                    continue
                return self.shutdown()
            if not self.state["haproxy"]:
                delay = min(RESTART_MAX_DELAY, 0.05 * (2 ** self.fails)) if self.fails else 0
                if delay and self.sleep(delay):
                    continue
                self.start()
                continue
            ready, _, _ = select.select([self.wake_r, *self.pidfds.values()], [], [], 5.0)
            if self.wake_r in ready:
                while True:
                    try:
                        os.read(self.wake_r, 64)
                    except BlockingIOError:
                        break
            for pid, fd in list(self.pidfds.items()):
                if fd in ready:
                    self.exited(pid)
            self.reap()

    def sleep(self, seconds: float) -> bool:
        """Waits seconds; True if a signal came meanwhile."""
        ready, _, _ = select.select([self.wake_r], [], [], seconds)
        return bool(ready) or bool(self.signals)

    def shutdown(self) -> int:
        self.log("stopping HAProxy and exiting")
        for pid in haproxy_pids(self.state):
            self.stop_pid(pid)
        self.state.update(haproxy=None, draining=[], ready=False)
        self.save()
        return 0


def main(instance_dir: str) -> int:
    if not os.path.isdir(os.path.join(instance_dir, "proxy")):
        print(f"pepctl supervise: {instance_dir}/proxy is no folder: is the instance up?", file=sys.stderr)
        return 2
    return Supervisor(instance_dir).run()
