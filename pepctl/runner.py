"""Plans as data, and the machinery that applies and undoes them.

A plan is a list of Steps. Each step is one real command (argv) plus the
command that undoes it. `plan` prints the commands; `up` runs them in order
and journals each undo *after* its step succeeded (so a failure rolls back
exactly what was made); `down` runs the journal backwards.

Some values are only known while applying (the ifindex of a link created two
steps earlier); such arguments are Deferred objects that print as
`<what>` in the plan and resolve at run time.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field


class StepError(RuntimeError):
    """A step's command failed; says which step, the command and its stderr."""


@dataclass(frozen=True)
class Deferred:
    """An argument resolved at run time, shown as <label> in a plan."""

    label: str
    resolve: Callable[[], list[str]]


Arg = str | Deferred


@dataclass
class Step:
    what: str                               # "create namespace pl1-pep"
    argv: list[Arg]                         # the command
    undo: list[str] | None = None           # the command that reverses it
    done: Callable[[], bool] | None = None  # True: already in place, skip (and own no undo)
    background: dict | None = None          # start as a daemon: {"pidfile", "logfile", "ready"}
    tolerate: tuple[str, ...] = field(default_factory=tuple)  # stderr texts meaning "already so"

    def render(self) -> str:
        if self.argv and self.argv[0] == "@note":
            return f"# notice: {self.argv[1]}"
        if self.argv and self.argv[0] == "@write":
            return f"cat > {self.argv[1]} <<'EOF'\n{self.argv[2].rstrip()}\nEOF"
        words = [a if isinstance(a, str) else f"<{a.label}>" for a in self.argv]
        line = shlex.join(words) if all(isinstance(a, str) for a in self.argv) else " ".join(
            shlex.quote(w) if not w.startswith("<") else w for w in words)
        if self.background:
            line += f" >{self.background['logfile']} 2>&1 &  # pid -> {self.background['pidfile']}"
        return line


def resolve(argv: list[Arg]) -> list[str]:
    out: list[str] = []
    for a in argv:
        out.extend([a] if isinstance(a, str) else a.resolve())
    return out


def run(argv: list[str], *, check: bool = True, input: str | None = None,
        timeout: float = 60) -> subprocess.CompletedProcess:
    """Run a command, capturing output; on failure raise StepError naming it."""
    proc = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise StepError(f"{shlex.join(argv)}: exit {proc.returncode}: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def run_json(argv: list[str]):
    """Run a command whose stdout is JSON (ip -j, tc -j, nft -j, bpftool -j)."""
    out = run(argv).stdout.strip()
    return json.loads(out) if out else []


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


def stop_pid(pid: int, *, grace: float = 5.0) -> None:
    """SIGTERM a recorded PID, wait up to `grace` seconds, then SIGKILL."""
    if not pid_alive(pid):
        return
    os.kill(pid, signal.SIGTERM)
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
    os.kill(pid, signal.SIGKILL)


def stop_pidfile(path: str, *, grace: float = 5.0) -> None:
    try:
        with open(path) as f:
            pid = int(f.read().split()[0])
    except (FileNotFoundError, IndexError, ValueError):
        return
    stop_pid(pid, grace=grace)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def wait_for(cond: Callable[[], bool], *, timeout: float, what: str, interval: float = 0.02) -> None:
    """Poll until cond() is true or raise StepError after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        if cond():
            return
        if time.monotonic() > deadline:
            raise StepError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


# An undo is either an argv, or ["@stop-pidfile", PATH], or ["@rm", PATH...].
def _run_undo(undo: list[str]) -> str | None:
    """Run one undo; return an error text, or None. "Already gone" is success."""
    if undo[0] == "@stop-pidfile":
        stop_pidfile(undo[1])
        return None
    if undo[0] == "@rm":
        for path in undo[1:]:
            _rm_tree(path)
        return None
    proc = run(undo, check=False)
    if proc.returncode == 0:
        return None
    err = (proc.stderr or proc.stdout).strip()
    gone = ("No such file", "Cannot find device", "does not exist", "No such process",
            "not found", "Invalid handle", "No such device", "Cannot find specified qdisc")
    if any(g in err for g in gone):
        return None
    return f"{shlex.join(undo)}: {err}"


def _rm_tree(path: str) -> None:
    """Remove a file or a directory tree (bpffs pins and run folders)."""
    if os.path.isdir(path) and not os.path.islink(path):
        for name in os.listdir(path):
            _rm_tree(os.path.join(path, name))
        os.rmdir(path)
    elif os.path.lexists(path):
        os.unlink(path)


class Journal:
    """The undo list of what `up` made, kept on disk so `down` works from a new process."""

    def __init__(self, path: str):
        self.path = path
        self.data: dict = {"complete": False, "undo": [], "meta": {}}
        if os.path.exists(path):
            with open(path) as f:
                self.data = json.load(f)

    @property
    def exists(self) -> bool:
        return os.path.exists(self.path)

    def save(self) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.data, f, indent=1)
        os.replace(tmp, self.path)

    def add_undo(self, what: str, undo: list[str]) -> None:
        self.data["undo"].append({"what": what, "undo": undo})
        self.save()


def apply(steps: list[Step], journal: Journal, *, log: Callable[[str], None] = print) -> int:
    """Run steps in order, journaling undos; on failure undo everything and re-raise.

    Returns how many steps changed something (0: all were already in place).
    """
    changed = 0
    try:
        for step in steps:
            if step.done is not None and step.done():
                continue
            argv = resolve(step.argv)
            if argv[0] == "@note":
                log(f"  notice: {argv[1]}")
                continue
            if argv[0] == "@write":
                _write_file(argv[1], argv[2])
            elif step.background:
                _start_background(step, argv)
            else:
                proc = run(argv, check=False)
                if proc.returncode != 0:
                    err = (proc.stderr or proc.stdout).strip()
                    if not any(t in err for t in step.tolerate):
                        raise StepError(f"{step.what}: {shlex.join(argv)}: {err}")
            changed += 1
            log(f"  {step.what}")
            if step.undo:
                journal.add_undo(step.what, step.undo)
    except BaseException:
        log("failed: rolling back what was made")
        errors = undo_all(journal, log=log)
        for e in errors:
            log(f"  rollback: {e}")
        raise
    return changed


def undo_all(journal: Journal, *, log: Callable[[str], None] = print) -> list[str]:
    """Run the journal's undos newest first; keep going past errors, return them."""
    errors = []
    while journal.data["undo"]:
        entry = journal.data["undo"].pop()
        err = _run_undo(entry["undo"])
        if err:
            errors.append(err)
        else:
            log(f"  undone: {entry['what']}")
        journal.save()
    return errors


def _write_file(path: str, content: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(content)
    os.replace(tmp, path)


def _start_background(step: Step, argv: list[str]) -> None:
    bg = step.background
    os.makedirs(os.path.dirname(bg["logfile"]), exist_ok=True)
    with open(bg["logfile"], "ab") as logf:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
                                start_new_session=True)
    with open(bg["pidfile"], "w") as f:
        f.write(f"{proc.pid}\n")

    def ready() -> bool:
        if proc.poll() is not None:
            with open(bg["logfile"], errors="replace") as f:
                tail = f.read()[-2000:]
            raise StepError(f"{step.what}: {argv[0]} exited with {proc.returncode}: {tail.strip()}")
        return bg["ready"]()

    try:
        wait_for(ready, timeout=bg.get("timeout", 10), what=step.what)
    except BaseException:
        stop_pid(proc.pid)
        raise
