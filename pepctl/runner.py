"""Plans as data, and the machinery that applies and undoes them.

A plan is a list of Steps. A step is one real command (argv, with its stdin for the batch
forms `ip -batch -` and `tc -batch -`) or one in-process action (a Call: a bpf(2) map write,
a sysctl, a file), plus what undoes it. `plan` prints them; `up` runs them in order; `down`
runs the undos backwards.

Every undo is in the journal *before* its step runs, so a `up` killed at any point (even
between starting a process and recording its PID) leaves a journal that `down` completes.
Undos therefore tolerate "already gone". A step whose `done` says it is already in place is
skipped and owns no undo: what existed before is never removed. Names are checked free by the
plan before the first step (pepctl/checks.py), so an undo only ever removes what this run made.

In-process actions are registered by name (`@action("name")`), so a journal written by one
pepctl process can be undone by another.
"""

from __future__ import annotations

import ctypes
import json
import os
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any


class StepError(RuntimeError):
    """A step failed; says which step, the command and its stderr."""


ACTIONS: dict[str, Callable] = {}


def action(name: str):
    """Registers an in-process action that journals can name."""
    def register(fn):
        ACTIONS[name] = fn
        return fn
    return register


@dataclass(frozen=True)
class Call:
    """An in-process action: ACTIONS[name](*args). args must be JSON; show is what the plan prints."""

    name: str
    args: tuple
    show: str

    def as_json(self) -> dict:
        return {"call": self.name, "args": list(self.args), "show": self.show}


@dataclass
class Step:
    what: str                                   # "create namespace pl1-pep"
    run: list[str] | Call                       # the command, or an in-process action
    undo: list[str] | Call | None = None        # what reverses it (tolerates "already gone")
    input: str | None = None                    # stdin of the command (batch forms)
    undo_input: str | None = None
    done: Callable[[], bool] | None = None      # True: already in place: skip, and own no undo
    tolerate: tuple[str, ...] = field(default_factory=tuple)  # stderr texts meaning "already so"

    def render(self) -> str:
        if isinstance(self.run, Call):
            return self.run.show
        line = shlex.join(self.run)
        if self.input is not None:
            line += f" <<'EOF'\n{self.input.rstrip()}\nEOF"
        return line

    def undo_entry(self) -> dict | None:
        if self.undo is None:
            return None
        if isinstance(self.undo, Call):
            return {"what": self.what, **self.undo.as_json()}
        return {"what": self.what, "argv": self.undo, "input": self.undo_input}


CHILD_STOP_S = 60   # how long a command cut short gets to end after SIGTERM (a pepctl rolling back)


def run(argv: list[str], *, check: bool = True, input: str | None = None, timeout: float = 120,
        env: dict | None = None) -> subprocess.CompletedProcess:
    """Run a command, capturing output; on failure raise StepError naming it, and so when it does not
    end within `timeout` s. A command cut short, by its timeout or because this process was told to
    stop, gets SIGTERM and CHILD_STOP_S to end before SIGKILL: it may be a `pepctl up` rolling back
    (subprocess.run would SIGKILL it at once, and leave its rollback half done)."""
    child = subprocess.Popen(argv, stdin=subprocess.PIPE if input is not None else None, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
    try:
        out, err = child.communicate(input, timeout=timeout)
    except BaseException as e:
        with interrupts_held():
            stop_child(child, timeout=CHILD_STOP_S)
        if isinstance(e, subprocess.TimeoutExpired):
            raise StepError(f"{shlex.join(argv)}: did not end within {timeout:g} s; stopped") from None
        raise
    proc = subprocess.CompletedProcess(argv, child.returncode, out, err)
    if check and proc.returncode != 0:
        raise StepError(f"{shlex.join(argv)}: exit {proc.returncode}: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def run_json(argv: list[str]):
    """Run a command whose stdout is JSON (ip -j, tc -j, nft -j, bpftool -j)."""
    out = run(argv).stdout.strip()
    return json.loads(out) if out else []


# -- processes ------------------------------------------------------------------------------------
def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); it is dead for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def stop_pid(pid: int, *, grace: float = 5.0, sig: int = signal.SIGTERM) -> None:
    """Signal a recorded PID (SIGTERM), wait up to `grace` seconds, then SIGKILL."""
    if not pid_alive(pid):
        return
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
        except ChildProcessError:
            pass
        if not pid_alive(pid):
            return
        time.sleep(0.02)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def read_pid(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def stop_pidfile(path: str, *, grace: float = 5.0) -> None:
    pid = read_pid(path)
    if pid is not None:
        stop_pid(pid, grace=grace)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def wait_for(cond: Callable[[], Any], *, timeout: float, what: str, interval: float = 0.02) -> Any:
    """Poll until cond() returns something true, and return it; StepError after timeout seconds.
    The one wait of pepctl, the lab, the tests and the benchmarks."""
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise StepError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


def note(what: str, text: str) -> Step:
    """A notice in the plan and in `up`'s output (a tuning step this host cannot take): runs nothing."""
    return Step(what, Call("note", (text,), f"# notice: {text}"))


@action("stop_pidfile")
def _stop_pidfile(path: str) -> None:
    stop_pidfile(path)


@action("start_daemon")
def start_daemon(argv: list[str], pidfile: str, logfile: str, ready: Callable[[], bool], timeout: float = 15) -> None:
    """Starts argv in its own session, its PID in pidfile, output in logfile; waits for ready().
    (A run-only action: its arguments are never journaled, so ready may be any callable.)"""
    with open(logfile, "ab") as logf:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, start_new_session=True)
    with open(pidfile, "w") as f:
        f.write(f"{proc.pid}\n")

    def up() -> bool:
        if proc.poll() is not None:
            with open(logfile, errors="replace") as f:
                tail = f.read()[-2000:]
            raise StepError(f"{argv[0]} exited with {proc.returncode}: {tail.strip()}")
        return ready()

    wait_for(up, timeout=timeout, what=f"{' '.join(argv[:4])} to be ready")


def daemon_step(what: str, argv: list[str], pidfile: str, logfile: str, ready: Callable[[], bool],
                timeout: float = 15) -> Step:
    """A background process a plan starts: its undo (stop by the recorded PID) is journaled first."""
    return Step(what, Call("start_daemon", (argv, pidfile, logfile, ready, timeout),
                           f"{shlex.join(argv)} >{logfile} 2>&1 &   # pid -> {pidfile}"),
                undo=Call("stop_pidfile", (pidfile,), f"stop the process of {pidfile}"))


# -- files ----------------------------------------------------------------------------------------
def write_file(path: str, content: str, mode: int = 0o644, gid: int | None = None) -> None:
    """Writes a whole file by rename: a reader sees the old one or the new one."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(content)
    if gid is not None:
        os.chown(tmp, -1, gid)
    os.replace(tmp, path)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def exchange(a: str, b: str) -> None:
    """Swaps two paths in one step (renameat2 RENAME_EXCHANGE): a reader finds one or the other."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"exchange {a} and {b}: {os.strerror(err)}")


@action("write")
def _write(path: str, content: str, mode: int = 0o644, gid: int | None = None) -> None:
    write_file(path, content, mode, gid)


@action("mkdir")
def _mkdir(path: str, mode: int = 0o755, uid: int = -1, gid: int = -1) -> None:
    os.mkdir(path, mode)
    os.chmod(path, mode)          # not narrowed by the umask
    if uid != -1 or gid != -1:
        os.chown(path, uid, gid)


@action("remove")
def remove_file(path: str) -> None:
    """Removes a file this run wrote; gone already is fine."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


@action("rmdir")
def remove_dir(path: str, ours: list[str] | None = None) -> str | None:
    """Removes a folder this run made. On a bpffs (pins) everything in it is ours; elsewhere only
    the entries named in `ours` (names or suffixes like "*.nft") are removed, then the folder if
    it is empty. Anything else is left, with the folder, and named in the returned notice."""
    if not os.path.lexists(path):
        return None
    if ours == []:
        # A parent folder that others may use too (bpf_dir): removed only when empty, silently.
        try:
            os.rmdir(path)
        except OSError:
            pass
        return None
    if ours is None:
        _rm_tree(path)
        return None
    for name in os.listdir(path):
        full = os.path.join(path, name)
        if any(name == p or (p.startswith("*") and name.endswith(p[1:])) for p in ours):
            if os.path.isdir(full) and not os.path.islink(full):
                continue   # a folder of ours has its own undo
            os.unlink(full)
    left = sorted(os.listdir(path))
    if left:
        return f"left {path}: it holds files pepctl did not make ({', '.join(left[:5])})"
    os.rmdir(path)
    return None


def _rm_tree(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        for name in os.listdir(path):
            _rm_tree(os.path.join(path, name))
        os.rmdir(path)
    elif os.path.lexists(path):
        os.unlink(path)


# -- the journal ----------------------------------------------------------------------------------
# The journal's format, in its meta ("format"): 1, the journals before the key (they are read the
# same); 2, with it and the digest of the datapath the instance runs ("datapath"). A pepctl reads
# journals of its format and older; an instance whose journal is older is taken over by `pepctl
# upgrade` (pepctl/upgrade.py), which rewrites it in this format.
JOURNAL_FORMAT = 2


class Journal:
    """What `up` made, kept on disk as JSON lines so `down` works from another process.

    The first line is {"meta": {...}}; then one {"undo": {...}} per undo in the order the steps
    ran; {"meta": {...}} lines update the meta; {"complete": true} says `up` finished. Appending
    a line per step keeps a journal of thousands of steps cheap; a torn last line (a write cut by
    a kill) is ignored, as the step it would have recorded never ran.
    """

    def __init__(self, path: str):
        self.path = path
        self.meta: dict = {}
        self.undo: list[dict] = []
        self.complete = False
        try:
            with open(path) as f:
                lines = f.read().splitlines()
        except FileNotFoundError:
            return
        for line in lines:
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if "meta" in entry:
                self.meta.update(entry["meta"])
            elif "undo" in entry:
                self.undo.append(entry["undo"])
            elif entry.get("complete"):
                self.complete = True

    @property
    def exists(self) -> bool:
        return os.path.exists(self.path)

    @property
    def format(self) -> int:
        return self.meta.get("format", 1)

    def _append(self, entry: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(entry) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def start(self, meta: dict) -> None:
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        self.meta, self.undo, self.complete = dict(meta), [], False
        self.rewrite()

    def add_undo(self, entry: dict) -> None:
        self.undo.append(entry)
        self._append({"undo": entry})

    def update_meta(self, **changes) -> None:
        self.meta.update(changes)
        self._append({"meta": changes})

    def mark_complete(self) -> None:
        self.complete = True
        self._append({"complete": True})

    def rewrite(self, undo: list[dict] | None = None) -> None:
        """The journal as it is now; `undo` in place of self.undo (undo_all, while it runs)."""
        lines = [{"meta": self.meta}, *({"undo": u} for u in (self.undo if undo is None else undo))]
        if self.complete:
            lines.append({"complete": True})
        write_file(self.path, "".join(json.dumps(x) + "\n" for x in lines), 0o600)

    def remove(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


# Errors that mean "already gone": an undo that finds nothing to undo succeeded.
GONE = ("No such file", "Cannot find device", "does not exist", "No such process", "not found",
        "Invalid handle", "No such device", "Cannot find specified qdisc", "Cannot open network namespace",
        "Parent Qdisc doesn't exist", "Cannot find specified filter chain")
# What ip and tc add to any error: "already gone" only beside one of the lines above.
GENERIC = ("Command failed", "We have an error talking to the kernel")


def _gone_only(err: str) -> bool:
    lines = [x for x in err.splitlines() if x.strip() and not any(g in x for g in GENERIC)]
    return bool(lines) and all(any(g in x for g in GONE) for x in lines)


def run_undo(entry: dict) -> tuple[str | None, str | None]:
    """Run one journal undo; return (an error text or None, a notice or None). "Already gone" is
    success. An action's notice is the text it returns (a folder left because it holds files that
    are not ours; a shared registration kept for others)."""
    if "call" in entry:
        try:
            result = ACTIONS[entry["call"]](*entry["args"])
        except (FileNotFoundError, ProcessLookupError):
            return None, None
        except (OSError, StepError, ValueError, KeyError) as e:
            return f"{entry.get('show', entry['call'])}: {e}", None
        return None, result if isinstance(result, str) else None
    try:
        proc = run(entry["argv"], check=False, input=entry.get("input"))
    except StepError as e:   # it did not end
        return str(e), None
    if proc.returncode == 0:
        return None, None
    err = (proc.stderr or proc.stdout).strip()
    if _gone_only(err):
        return None, None
    return f"{shlex.join(entry['argv'])}: {err}", None


def _do(step: Step) -> str | None:
    """Runs a step; returns the notice an in-process action gave (the text it returned), if any."""
    if isinstance(step.run, Call):
        try:
            result = ACTIONS[step.run.name](*step.run.args)
        except (OSError, ValueError) as e:
            raise StepError(f"{step.what}: {e}") from None
        return result if isinstance(result, str) else None
    try:
        proc = run(step.run, check=False, input=step.input)
    except StepError as e:   # it did not end
        raise StepError(f"{step.what}: {e}") from None
    if proc.returncode != 0:
        err = (proc.stderr or proc.stdout).strip()
        if not any(t in err for t in step.tolerate):
            raise StepError(f"{step.what}: {shlex.join(step.run)}: {err}")
    return None


def apply(steps: list[Step], journal: Journal, *, log: Callable[[str], None] = print) -> int:
    """Run steps in order, journaling each undo first; on failure undo everything and re-raise.

    Returns how many steps ran (0: all were already in place)."""
    ran = 0
    try:
        for step in steps:
            _stop_if_told()
            if step.done is not None and step.done():
                continue
            if isinstance(step.run, Call) and step.run.name == "note":
                log(f"  notice: {step.run.args[0]}")
                continue
            entry = step.undo_entry()
            if entry is not None:
                journal.add_undo(entry)
            notice = _do(step)
            ran += 1
            log(f"  {step.what}")
            if notice:
                log(f"  notice: {notice}")
        _stop_if_told()
    except BaseException:
        log("failed: rolling back what was made")
        for e in undo_all(journal, log=log):    # (it holds SIGTERM and Ctrl-C until it is done)
            log(f"  rollback: {e}")
        raise
    return ran


@contextmanager
def interrupts_held():
    """While a rollback (undo_all) or a teardown runs, SIGINT and SIGTERM wait: the command is unwinding already,
    and a rollback cut short leaves a half-built state whose journal its caller may no longer keep. A
    second signal is common: `kill` of a process group reaches `pep-lab up` and the benchmark that holds
    it, which then sends its own SIGTERM (netns/handle.py), so a lab was left with its namespaces, pins
    and linkem running and no journal to take them down. The signals that came are dropped when it
    ends: the command is on its way out. SIGKILL still stops it. A handler, not SIG_IGN, which the
    rollback's own commands would inherit. Only the main thread handles signals."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = {}
    try:
        for s in (signal.SIGTERM, signal.SIGINT):
            if signal.getsignal(s) is not signal.SIG_IGN:   # (a background job's SIGINT: ignored already)
                held[s] = signal.signal(s, _dropped)
        yield
    finally:
        for s, handler in held.items():
            signal.signal(s, handler)


def stop_on_sigterm() -> None:
    """Make SIGTERM unwind this process as Ctrl-C does (KeyboardInterrupt), so `apply` rolls back what it
    made and `with` blocks run their exits; SIGTERMs after the first are dropped while it does. Python
    dies of SIGTERM without either: an `up` stopped by systemd's start timeout, or by `kill`, left its
    half-built instance for the next `up` or `down` to undo. A handler someone else installed is kept;
    only the main thread can install one."""
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _interrupt)


def stop_child(proc: subprocess.Popen, timeout: float) -> None:
    """SIGTERM a child this process started (by its Popen, never by name), give it `timeout` s to end,
    reading its pipes so a full one cannot hold it, then SIGKILL it; reaped either way."""
    proc.terminate()
    try:
        proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()        # (not communicate: a grandchild may hold its pipes open)


def rollback_left(journal: Journal, retry: str) -> str:
    """What a command says when its rollback could not undo everything: the journal keeps what is left,
    and `retry` (a command, in backquotes) tries it again."""
    return f"the rollback left {len(journal.undo)} undo step(s) in {journal.path}: run {retry} to retry them"


# The signal that told this process to stop (stop_on_sigterm), once one has.
_told_to_stop: int | None = None


def _interrupt(signum: int, frame) -> None:
    # Told once: the process unwinds (rollbacks, `with` exits), and a second SIGTERM must not cut that
    # short before undo_all holds it (interrupts_held). SIGKILL still stops it.
    global _told_to_stop
    _told_to_stop = signum
    signal.signal(signal.SIGTERM, _dropped)
    raise KeyboardInterrupt(f"stopped by signal {signum}")


def _stop_if_told() -> None:
    """Raise the stop again if it was swallowed. Python runs a signal's handler in whatever Python code
    runs then, and the KeyboardInterrupt of one that lands in a __del__ (a Popen's, as run() drops it)
    or a finalizer is only printed: `pep-lab up` built its whole lab after a SIGTERM, and exited 0.
    So apply() looks again between steps."""
    if _told_to_stop is not None:
        raise KeyboardInterrupt(f"stopped by signal {_told_to_stop}")


def _dropped(signum: int, frame) -> None:
    pass


def undo_all(journal: Journal, *, log: Callable[[str], None] = print) -> list[str]:
    """Run the journal's undos newest first; keep going past errors and return them. An undo that
    failed stays in the journal, so running `down` again retries it; so does every undo not yet done
    when something unexpected ends it (the journal on disk and in memory keeps them). Once begun it
    runs to its end: SIGTERM and Ctrl-C wait for it (interrupts_held; SIGKILL still stops it).
    Notices (a folder left because it holds files that are not ours, a registration others still
    use) are logged, not errors."""
    errors, failed = [], []
    done = 0
    with interrupts_held():
        try:
            while journal.undo:
                entry = journal.undo[-1]         # popped once done: whatever ends this keeps it
                err, notice = run_undo(entry)
                journal.undo.pop()
                if err:
                    errors.append(err)
                    failed.append(entry)
                else:
                    log(f"  undone: {entry['what']}")
                if notice:
                    log(f"  notice: {notice}")
                done += 1
                if done % 64 == 0 and journal.exists:
                    journal.rewrite(journal.undo + failed[::-1])
        finally:
            journal.undo += failed[::-1]
            if journal.exists:
                journal.rewrite()
    return errors
