"""Starting and stopping an instance's services, under systemd or under pepctl's keeper.

Two services per instance, each described once by its systemd unit: the proxy's supervisor
(haproxy/supervise.py, etc/systemd/pep-supervisor@.service) and the metrics exporter
(pepctl/exporter.py, etc/systemd/pep-exporter@.service): who each runs as, with which
capabilities, how it is restarted. On a host run by systemd, `up` starts that unit and systemd does the rest. Where
there is no systemd (the lab, containers), `up` starts pepctl's keeper, which reads the same
unit and does what systemd would for it:

  - ExecStart, with %f the instance's folder and /opt/pep this checkout;
  - User, Group, AmbientCapabilities, CapabilityBoundingSet, NoNewPrivileges, applied with
    setpriv(1) (util-linux);
  - Restart=always after RestartSec: a dead supervisor is started again, and adopts the
    HAProxy that kept running;
  - a child subreaper, so an orphaned HAProxy is reaped, as systemd's cgroup would.

One keeper per service. The keeper exits when the instance's journal is gone (the instance was taken down), so a
keeper that `down` could not find stops by itself at its next restart.
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import subprocess
import sys
import time

from haproxy.supervise import haproxy_pids, is_our_haproxy, read_state

from .names import EXPORTER_UNIT, SUPERVISOR_UNIT, InstanceNames, folder_names, unit_name
from .runner import Call, StepError, action, pid_alive, read_pid, remove_file, run, stop_pid, wait_for, write_file

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UNITS_DIR = os.path.join(REPO, "etc", "systemd")
UNIT_FILE = os.path.join(UNITS_DIR, SUPERVISOR_UNIT)
EXPORTER_UNIT_FILE = os.path.join(UNITS_DIR, EXPORTER_UNIT)
MAIN_UNIT = "pep.service"        # runs pepctl up, reload and down at boot and by systemctl
EXPORTER_READY_TIMEOUT = 30.0
INSTALLED_AT = "/opt/pep"        # where the unit files expect the checkout
PEPCTL = os.path.join(REPO, "scripts", "pepctl")
PR_SET_CHILD_SUBREAPER = 36
READY_TIMEOUT = 60.0


def read_unit(path: str = UNIT_FILE) -> dict[str, list[str]]:
    """The [Service] section of a unit: key -> its values, in order (keys may repeat)."""
    out: dict[str, list[str]] = {}
    section = None
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line[0] in "#;":
                continue
            if line.startswith("["):
                section = line.strip("[]")
            elif section == "Service" and "=" in line:
                key, _, value = line.partition("=")
                out.setdefault(key.strip(), []).append(value.strip())
    return out


def unit_value(unit: dict[str, list[str]], key: str, default: str = "") -> str:
    return unit.get(key, [default])[-1]


def unit_user(unit: dict[str, list[str]] | None = None) -> str:
    return unit_value(unit or read_unit(), "User", "root")


def _seconds(text: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(ms|s|min)?", text)
    if not m:
        raise ValueError(f"{UNIT_FILE}: RestartSec={text}: not a time span this keeper reads (e.g. 100ms, 1s)")
    return float(m.group(1)) * {"ms": 0.001, "s": 1, None: 1, "min": 60}[m.group(2)]


def unit_argv(unit: dict[str, list[str]], instance_dir: str) -> list[str]:
    """A unit's ExecStart for this instance, run under its user and capabilities by setpriv."""
    exec_start = unit_value(unit, "ExecStart").replace("%f", instance_dir).replace(INSTALLED_AT, REPO).split()
    caps = ",".join(f"+{c.lower().removeprefix('cap_')}" for c in unit_value(unit, "AmbientCapabilities").split())
    bounding = ",".join(f"+{c.lower().removeprefix('cap_')}" for c in
                        unit_value(unit, "CapabilityBoundingSet").split())
    user, group = unit_user(unit), unit_value(unit, "Group", unit_user(unit))
    argv = ["setpriv", f"--reuid={user}", f"--regid={group}", "--init-groups"]
    if caps:
        argv += [f"--inh-caps=-all,{caps}", f"--ambient-caps=-all,{caps}"]
    if bounding:
        argv.append(f"--bounding-set=-all,{bounding}")
    if unit_value(unit, "NoNewPrivileges") in ("yes", "true", "1"):
        argv.append("--no-new-privs")
    return [*argv, "--", *exec_start]


def _runs(pid: int, *words: str) -> bool:
    """pid is alive and its command line holds every word: a recorded PID not reused since."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().decode(errors="replace")
    except OSError:
        return False
    return pid_alive(pid) and all(w in argv for w in words)


# -- the keeper -----------------------------------------------------------------------------------
def keep(instance_dir: str, journal: str, go_fd: int | None = None, unit_name: str = SUPERVISOR_UNIT) -> int:
    """Run the unit's service (the supervisor, or the exporter) as its unit says, and again whenever
    it exits, until told to stop.

    go_fd: `up` writes one byte on it once it has recorded this keeper's PID; if `up` dies first,
    the pipe closes empty and the keeper exits before starting anything: every process `up`
    starts is in its journal before it does anything."""
    if go_fd is not None:
        go = os.read(go_fd, 1)
        os.close(go_fd)
        if not go:
            print("keeper: `pepctl up` died before recording this keeper; exiting", flush=True)
            return 0
    if unit_name not in (SUPERVISOR_UNIT, EXPORTER_UNIT):
        print(f"keeper: unknown unit {unit_name}; use {SUPERVISOR_UNIT} or {EXPORTER_UNIT}", flush=True)
        return 2
    unit = read_unit(os.path.join(UNITS_DIR, unit_name))
    argv = unit_argv(unit, instance_dir)
    delay = _seconds(unit_value(unit, "RestartSec", "100ms"))
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    stopping: list[int] = []
    child: subprocess.Popen | None = None

    def on_term(signum, _frame):
        stopping.append(signum)
        if child is not None and child.returncode is None:
            try:
                child.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)

    def log(msg: str) -> None:
        print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} keeper: {msg}", flush=True)

    log(f"keeping {' '.join(argv)}")
    while not stopping:
        if not os.path.exists(journal):
            log(f"{journal} is gone: the instance was taken down; exiting")
            break
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
        while True:
            pid, status = os.waitpid(-1, 0)    # also reaps orphaned HAProxy processes
            if pid == child.pid:
                child.returncode = os.waitstatus_to_exitcode(status)
                break
        if stopping:
            break
        log(f"{unit_name} pid {child.pid} exited ({child.returncode}); restarting in {delay:g}s")
        time.sleep(delay)
    # Reap what is left (a HAProxy the stopped supervisor was stopping).
    try:
        while os.waitpid(-1, 0)[0] > 0:
            pass
    except ChildProcessError:
        pass
    log("stopped")
    return 0


# -- start and stop, as plan actions --------------------------------------------------------------
def backend(choice: str) -> str:
    """"systemd" or "pepctl": what keeps the supervisor running on this host."""
    if choice != "auto":
        return choice
    return "systemd" if os.path.isdir("/run/systemd/system") else "pepctl"


def start_call(n: InstanceNames, how: str) -> tuple[Call, Call]:
    unit = unit_name(n)
    shown = f"systemctl start {unit}" if how == "systemd" else \
        f"{PEPCTL} keep {n.dir} {n.journal} >{n.keeper_log} 2>&1 &   # pid -> {n.keeper_pid}"
    start = Call("start_supervisor", (how, n.dir, n.journal, n.keeper_pid, n.keeper_log, n.supervisor_state,
                                      n.haproxy_log, unit), shown)
    stop = Call("stop_supervisor", (how, n.dir, n.keeper_pid, n.supervisor_pid, n.supervisor_state, unit),
                f"stop {unit if how == 'systemd' else 'the keeper'}, the supervisor and HAProxy")
    return start, stop


def exporter_calls(n: InstanceNames, how: str, address: str, port: int) -> tuple[Call, Call]:
    unit = unit_name(n, EXPORTER_UNIT)
    shown = f"systemctl start {unit}" if how == "systemd" else \
        f"{PEPCTL} keep {n.dir} {n.journal} --unit {EXPORTER_UNIT} >{n.exporter_log} 2>&1 &   # pid -> " \
        f"{n.exporter_keeper_pid}"
    start = Call("start_exporter", (how, n.dir, n.journal, n.exporter_keeper_pid, n.exporter_pid, n.exporter_log, unit,
                                    address, port), shown)
    stop = Call("stop_exporter", (how, n.dir, n.exporter_keeper_pid, n.exporter_pid, unit), f"stop {unit}")
    return start, stop


def _start_keeper(instance_dir: str, journal: str, pid_file: str, log_file: str, unit_name: str) -> None:
    """A keeper of unit_name, its PID recorded before it may start anything."""
    go_r, go_w = os.pipe()
    with open(log_file, "ab") as logf:
        proc = subprocess.Popen([PEPCTL, "keep", instance_dir, journal, "--go-fd", str(go_r), "--unit", unit_name],
                                stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, start_new_session=True,
                                pass_fds=(go_r,))
    os.close(go_r)
    with open(pid_file, "w") as f:
        f.write(f"{proc.pid}\n")
    os.write(go_w, b"!")   # recorded: the keeper may start its service
    os.close(go_w)


def _tail(*paths: str) -> str:
    out = ""
    for path in paths:
        try:
            with open(path, errors="replace") as f:
                out += f"\n--- {path}:\n" + f.read()[-1500:]
        except OSError:
            pass
    return out


def _stop_keeper(how: str, unit: str, keeper_pid: str, instance_dir: str, unit_name: str, grace: float) -> None:
    """systemctl stop the unit, or stop its keeper by its recorded PID if that PID still runs it."""
    if how == "systemd":
        run(["systemctl", "stop", unit], check=False)
        return
    pid = read_pid(keeper_pid)
    if pid and _runs(pid, "keep", instance_dir, unit_name):
        stop_pid(pid, grace=grace)


@action("start_exporter")
def start_exporter(how: str, instance_dir: str, journal: str, keeper_pid: str, exporter_pid: str, log_file: str,
                   unit: str, address: str, port: int) -> None:
    """Starts the exporter and waits until it says it listens: it writes its PID once bound, or why it
    cannot (a port taken: restarting it would not help, so `up` fails at once and rolls back)."""
    failed = folder_names(instance_dir).exporter_failed   # (not an argument: journals name the call as before)
    remove_file(exporter_pid)
    remove_file(failed)
    if how == "systemd":
        run(["systemctl", "start", unit])
    else:
        _start_keeper(instance_dir, journal, keeper_pid, log_file, EXPORTER_UNIT)
    deadline = time.monotonic() + EXPORTER_READY_TIMEOUT
    while not ((pid := read_pid(exporter_pid)) and _runs(pid, "exporter", instance_dir)):
        if os.path.exists(failed):
            with open(failed, errors="replace") as f:
                raise StepError(f"the metrics exporter did not start: {f.read().strip()}{_tail(log_file)}")
        if time.monotonic() > deadline:
            raise StepError(f"the metrics exporter did not listen on {address} port {port} within "
                            f"{EXPORTER_READY_TIMEOUT:g}s (its log follows); change [host] metrics_port, or set it "
                            f"to 0 for no exporter{_tail(log_file)}")
        time.sleep(0.05)


@action("stop_exporter")
def stop_exporter(how: str, instance_dir: str, keeper_pid: str, exporter_pid: str, unit: str) -> None:
    """Stops the keeper (or the unit), then the exporter if it is still there, each by its recorded PID."""
    _stop_keeper(how, unit, keeper_pid, instance_dir, EXPORTER_UNIT, grace=10)
    pid = read_pid(exporter_pid)
    if pid and _runs(pid, "exporter", instance_dir):
        stop_pid(pid, grace=5)
    remove_file(keeper_pid)
    remove_file(folder_names(instance_dir).exporter_failed)
    remove_file(exporter_pid)


@action("start_supervisor")
def start_supervisor(how: str, instance_dir: str, journal: str, keeper_pid: str, keeper_log: str,
                     state_path: str, haproxy_log: str, unit: str) -> None:
    if how == "systemd":
        run(["systemctl", "start", unit])
    else:
        _start_keeper(instance_dir, journal, keeper_pid, keeper_log, SUPERVISOR_UNIT)

    def ready() -> bool:
        state = read_state(state_path)
        return bool(state.get("ready") and state.get("haproxy") and pid_alive(state["haproxy"]))

    deadline = time.monotonic() + READY_TIMEOUT
    while not ready():
        if time.monotonic() > deadline:
            raise StepError(f"the proxy supervisor did not report HAProxy up within {READY_TIMEOUT:g}s"
                            f"{_tail(keeper_log, haproxy_log)}")
        time.sleep(0.05)


@action("stop_supervisor")
def stop_supervisor(how: str, instance_dir: str, keeper_pid: str, supervisor_pid: str, state_path: str,
                    unit: str) -> None:
    """Stops the keeper (or the unit), then whatever of the supervisor and HAProxy is left, each by
    its recorded PID and only if that PID still runs what we started."""
    _stop_keeper(how, unit, keeper_pid, instance_dir, SUPERVISOR_UNIT, grace=15)
    pid = read_pid(supervisor_pid)
    if pid and _runs(pid, "supervise", instance_dir):
        stop_pid(pid, grace=10)
    cfg = folder_names(instance_dir).haproxy_cfg
    for pid in haproxy_pids(read_state(state_path)):
        if is_our_haproxy(pid, cfg):
            stop_pid(pid, grace=5)
    remove_file(keeper_pid)


@action("supervisor_swap")
def swap_supervisor(how: str, instance_dir: str, journal: str, keeper_pid: str, keeper_log: str,
                    supervisor_pid: str, state_path: str, unit: str) -> str:
    """This checkout's supervisor in place of the running one, HAProxy left running: the old one
    (and its keeper) are killed with SIGKILL, since told to stop a supervisor stops HAProxy, and
    the new one adopts the HAProxy that runs, as after a crash (haproxy/supervise.py adopt). Under
    systemd the unit starts it again by itself (Restart=always), from the unit as installed now.
    Returns what happened, for the log."""
    before = read_state(state_path).get("haproxy")
    old = read_pid(supervisor_pid)
    if how == "systemd":
        run(["systemctl", "kill", "--kill-whom=main", "--signal=SIGKILL", unit])
    else:
        for pid, words in ((read_pid(keeper_pid), ("keep", instance_dir, SUPERVISOR_UNIT)),
                           (old, ("supervise", instance_dir))):
            if pid and _runs(pid, *words):
                os.kill(pid, signal.SIGKILL)
                wait_for(lambda pid=pid: not pid_alive(pid), timeout=10, what=f"pid {pid} to die of SIGKILL")
        _start_keeper(instance_dir, journal, keeper_pid, keeper_log, SUPERVISOR_UNIT)

    def adopted() -> int | None:
        pid = read_pid(supervisor_pid)
        if not pid or pid == old or not _runs(pid, "supervise", instance_dir):
            return None
        st = read_state(state_path)
        ok = st.get("pid") == pid and st.get("ready") and st.get("haproxy") and pid_alive(st["haproxy"])
        return pid if ok else None

    try:
        new = wait_for(adopted, timeout=READY_TIMEOUT, what="the new proxy supervisor to report HAProxy up")
    except StepError as e:
        raise StepError(f"{e}{_tail(keeper_log, folder_names(instance_dir).supervisor_log)}") from None
    now = read_state(state_path).get("haproxy")
    return (f"supervisor pid {new} took over from {old}; HAProxy pid {now} "
            + ("adopted: its connections carry on" if now == before else f"started (pid {before} was not adopted)"))


def unit_files() -> dict[str, str]:
    """The units this checkout ships, by name: where each comes from."""
    return {name: os.path.join(UNITS_DIR, name) for name in (MAIN_UNIT, SUPERVISOR_UNIT, EXPORTER_UNIT)}


def unit_text(path: str) -> str:
    """A unit of this checkout as installed: its paths those of this checkout (they name /opt/pep)."""
    with open(path) as f:
        return f.read().replace(INSTALLED_AT + "/", REPO + "/")


def installed_unit(unit: str) -> str | None:
    """The file systemd loaded unit from (for an instance of a template, the template's), or None."""
    proc = run(["systemctl", "show", "--property=FragmentPath", "--value", unit], check=False)
    path = proc.stdout.strip()
    return path if proc.returncode == 0 and path and os.path.exists(path) else None


@action("install_unit")
def install_unit(path: str, text: str) -> None:
    """A unit file written in place, and systemd told (daemon-reload)."""
    write_file(path, text)
    run(["systemctl", "daemon-reload"])


def processes(n: InstanceNames) -> dict:
    """Who is running: keeper, supervisor, HAProxy (current and draining), from the recorded PIDs."""
    state = read_state(n.supervisor_state)
    keeper = read_pid(n.keeper_pid)
    sup = read_pid(n.supervisor_pid)
    cfg = n.haproxy_cfg
    return {
        "keeper": {"pid": keeper, "running": bool(keeper and _runs(keeper, "keep", n.dir, SUPERVISOR_UNIT))},
        "supervisor": {"pid": sup, "running": bool(sup and _runs(sup, "supervise", n.dir))},
        "haproxy": {"pid": state.get("haproxy"),
                    "running": bool(state.get("haproxy") and is_our_haproxy(state["haproxy"], cfg)),
                    "draining": [p for p in state.get("draining", []) if is_our_haproxy(p, cfg)]},
        "restarts": state.get("restarts", 0), "last_exit": state.get("last_exit"),
        "generation": state.get("generation", 0), "last_reload": state.get("last_reload"),
    }


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: pepctl keep INSTANCE_DIR JOURNAL (started by `pepctl up`)", file=sys.stderr)
        return 2
    return keep(*argv)
