"""The exclusive lock of an instance: one command at a time changes it.

`up`, `down`, `reload` and `bypass add|del|sync` hold it; `plan` and `status` change nothing
and do not. A second command waits, saying who holds the lock (PID, command, since when), or
with --no-wait (wait 0) exits at once saying the same. The lock is flock(2) on
run_dir/INSTANCE.lock: the kernel releases it when its holder dies, so a killed command never
leaves the instance locked. `down` removes the file while holding it; a waiter that then gets
the lock of a removed file opens the path again.

The same lock, on another file, serializes what instances share on a host: registering and
unregistering a congestion control of pepctl's own (pepctl/congestion.py, names.CONGESTION_LOCK).
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time


class LockBusy(RuntimeError):
    """The lock is held and the caller would not wait (longer)."""


def _holder(fd: int) -> str:
    try:
        raw = os.pread(fd, 4096, 0)
        h = json.loads(raw) if raw else {}
    except (OSError, ValueError):
        h = {}
    if not h:
        return "another pepctl command"
    since = time.strftime("%H:%M:%S", time.localtime(h.get("since", 0)))
    return f"`pepctl {h.get('command', '?')}` (pid {h.get('pid', '?')}, since {since})"


class InstanceLock:
    def __init__(self, path: str, instance: str, command: str, *, wait: float = 600, out=sys.stderr,
                 what: str | None = None):
        self.path, self.instance, self.command, self.wait, self.out = path, instance, command, wait, out
        self.what = what or f"instance {instance}"     # what the lock guards, as messages name it
        self.fd: int | None = None

    def __enter__(self) -> InstanceLock:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        deadline = time.monotonic() + self.wait
        told = False
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                who = _holder(fd)
                os.close(fd)
                if time.monotonic() >= deadline:
                    raise LockBusy(f"{self.what} is locked by {who}; try again when it "
                                   f"has finished (lock file {self.path})") from None
                if not told:
                    print(f"pepctl {self.command}: waiting for {who} to finish with {self.what}", file=self.out)
                    told = True
                time.sleep(0.1)
                continue
            # Got it, but `down` may have removed this file meanwhile: then take the new one.
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            self.fd = fd
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps({"pid": os.getpid(), "command": self.command,
                                      "since": time.time()}).encode(), 0)
            return self

    def remove(self) -> None:
        """Removes the lock file (the instance is gone); the lock stays held until exit."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
