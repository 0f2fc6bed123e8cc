"""A Debian bookworm machine with systemd as PID 1, booted by systemd-nspawn in a lab namespace.

The host install of docs/operations.md, "Under systemd" (scripts/setup --host, the units of
etc/systemd/, `systemctl enable --now pep`) runs in it for real (tests/netns/test_systemd.py): this
machine's own PID 1 is not systemd.

   cache, kept between runs:  CACHE_DIR/<key>/            a Debian root from Debian's packages (mmdebstrap)
                                                          with systemd and the packages of `setup --host`;
                                                          <key> hashes what goes into it
   one container:             RUNS_DIR/<name>/root        overlay: the cached root below, upper/ above
                                                          (its disk: it survives a reboot of the container)
                              RUNS_DIR/<name>/bpf         a bpffs of its own, bound on /sys/fs/bpf, new
                                                          at every boot (a real host's is empty at boot)

The cache is outside /run on purpose: it is not a leftover (tests/conftest.py checks RUNS_DIR, not
CACHE_DIR). A root is built once per key (about 35 s and 840 MB); roots of other keys that no run
holds are removed when a new one is built.

The container joins a network namespace made by someone else (--network-namespace-path): the lab's
proxyhost, whose nic0 is the trunk. nspawn would leave that namespace's /proc/sys/net read-only;
SYSTEMD_NSPAWN_API_VFS_WRITABLE=network makes it writable, as --private-network would.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUITE = "bookworm"
CACHE_DIR = os.environ.get("PEP_TEST_CACHE", "/var/cache/pep-tests/roots")
RUNS_DIR = "/var/tmp/pep-nspawn"
# What a systemd host has before the install's commands run: an init, D-Bus, git to clone with.
BOOT_PACKAGES = ("systemd", "systemd-sysv", "dbus", "git")
# What a container host must grant the appliance (docs/operations.md, "In a container"), beyond nspawn's defaults:
# BPF and NET_ADMIN (the datapath, links, nftables); SYS_ADMIN (namespaces, setns) is a default.
CAPABILITIES = ("CAP_BPF", "CAP_NET_ADMIN", "CAP_SYS_ADMIN")
# ... and system calls that nspawn's seccomp filter refuses by default, whatever the capabilities:
# bpf() (loading the datapath, reading its maps).
SYSCALLS = ("bpf",)
RECIPE = 1     # bump when the build below changes what a root holds


def appliance_packages() -> list[str]:
    """The apt packages of a proxy host, as scripts/setup --host installs them."""
    out = subprocess.run([os.path.join(REPO, "scripts", "setup"), "--print-packages", "--host"],
                         capture_output=True, text=True, check=True).stdout
    return out.split()


def root_key(packages: list[str]) -> str:
    recipe = {"suite": SUITE, "variant": "minbase", "packages": sorted(packages), "recipe": RECIPE}
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


class Root:
    """The cached root for these packages, built if missing; held (a shared lock) while in use so
    that no other run removes it."""

    def __init__(self, packages: list[str] | None = None):
        self.packages = [*BOOT_PACKAGES, *(packages if packages is not None else appliance_packages())]
        self.key = root_key(self.packages)
        self.path = os.path.join(CACHE_DIR, self.key)
        self.built = False
        self._hold: int | None = None

    def __enter__(self) -> Root:
        os.makedirs(CACHE_DIR, exist_ok=True)
        self._hold = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self._hold, fcntl.LOCK_SH)
        try:
            with open(os.path.join(CACHE_DIR, ".build.lock"), "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)          # one build at a time; a second run waits for it
                if not os.path.isdir(self.path):
                    self._build()
                    self._prune()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self._hold is not None:
            os.close(self._hold)
            self._hold = None

    def _build(self) -> None:
        tmp = f"{self.path}.tmp{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        proc = subprocess.run(["mmdebstrap", "--quiet", "--variant=minbase", f"--include={','.join(self.packages)}",
                               SUITE, tmp], capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            raise RuntimeError(f"mmdebstrap {SUITE} into {tmp} failed ({proc.returncode}): {proc.stderr[-2000:]}")
        os.rename(tmp, self.path)
        self.built = True

    def _prune(self) -> None:
        """Roots of other keys, and half-built ones, that no run holds."""
        for entry in os.listdir(CACHE_DIR):
            path = os.path.join(CACHE_DIR, entry)
            if entry.startswith(".") or entry.endswith(".lock") or entry == self.key:
                continue
            key = entry.split(".tmp")[0]
            fd = os.open(os.path.join(CACHE_DIR, f"{key}.lock"), os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue       # in use by another run
            finally:
                os.close(fd)
            shutil.rmtree(path, ignore_errors=True)
            if not os.path.isdir(os.path.join(CACHE_DIR, key)):
                _unlink(os.path.join(CACHE_DIR, f"{key}.lock"))


class Container:
    """One container: its disk an overlay on a cached Root, its network a namespace given to it.

    create() makes its folder and disk, boot() starts it and waits until systemd says it has booted,
    run() runs a shell command inside (nsenter into PID 1's namespaces), poweroff() shuts it down
    cleanly, destroy() removes everything (stopping it first if it runs, by its recorded PID)."""

    def __init__(self, name: str, root: Root, netns: str):
        self.name, self.root, self.netns = name, root, netns
        self.dir = os.path.join(RUNS_DIR, name)
        self.disk = os.path.join(self.dir, "root")
        self.bpf = os.path.join(self.dir, "bpf")
        self.console = os.path.join(self.dir, "console.log")
        self.proc: subprocess.Popen | None = None
        self.init_pid: int | None = None
        self.boots = 0

    def create(self) -> Container:
        for sub in ("upper", "work", "root", "bpf"):
            os.makedirs(os.path.join(self.dir, sub))
        subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                        f"lowerdir={self.root.path},upperdir={self.dir}/upper,workdir={self.dir}/work", self.disk],
                       check=True, capture_output=True)
        return self

    def argv(self) -> list[str]:
        return ["systemd-nspawn", "--quiet", "--directory", self.disk, "--boot", f"--machine={self.name}",
                "--register=no", "--keep-unit", f"--network-namespace-path=/run/netns/{self.netns}",
                f"--capability={','.join(CAPABILITIES)}", f"--system-call-filter={' '.join(SYSCALLS)}",
                f"--bind={self.bpf}:/sys/fs/bpf"]

    def boot(self, timeout: float = 90) -> float:
        """Starts the container; returns once systemd inside says the boot is done (the seconds it took)."""
        start = time.monotonic()
        subprocess.run(["mount", "-t", "bpf", "bpf", self.bpf], check=True, capture_output=True)
        env = {**os.environ, "SYSTEMD_NSPAWN_API_VFS_WRITABLE": "network"}
        with open(self.console, "ab") as log:
            self.proc = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                                         start_new_session=True)
        self.boots += 1
        self.init_pid = self._wait_init(start + timeout)
        state = self.run("systemctl is-system-running --wait", check=False,
                         timeout=max(1.0, start + timeout - time.monotonic())).stdout.strip()
        if state not in ("running", "degraded"):
            raise RuntimeError(f"container {self.name}: boot ended {state!r}{self._console_tail()}")
        return time.monotonic() - start

    def _wait_init(self, deadline: float) -> int:
        """PID 1 of the container, as the host sees it: nspawn's child, once it runs systemd."""
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"systemd-nspawn exited {self.proc.returncode}{self._console_tail()}")
            for pid in _children(self.proc.pid):
                if _comm(pid) == "systemd" and os.path.exists(f"/proc/{pid}/root/run/systemd/private"):
                    return pid
            time.sleep(0.05)
        raise RuntimeError(f"container {self.name}: systemd did not start{self._console_tail()}")

    def _console_tail(self) -> str:
        try:
            with open(self.console, errors="replace") as f:
                return f"\n--- {self.console}:\n{f.read()[-2000:]}"
        except OSError:
            return ""

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def run(self, command: str, check: bool = True, timeout: float = 60, input: str | None = None):
        """A shell command inside the container, as root, in all of its namespaces, with a clean
        environment (as from a root login)."""
        if not self.running or not self.init_pid:
            raise AssertionError(f"container {self.name} is not running (to run: {command})")
        argv = ["nsenter", "--target", str(self.init_pid), "--all", "env", "-i",
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LANG=C.UTF-8",
                "SYSTEMD_PAGER=", "SYSTEMD_COLORS=0", "sh", "-c", command]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, input=input)
        if check and proc.returncode != 0:
            raise AssertionError(f"in container {self.name}: `{command}` exited {proc.returncode}:\n"
                                 f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        return proc

    def write(self, path: str, text: str) -> None:
        self.run(f"mkdir -p \"$(dirname {path})\" && cat > {path}", input=text)

    def poweroff(self, timeout: float = 90) -> float:
        """`systemctl poweroff` inside; returns once the container is gone (the seconds it took)."""
        start = time.monotonic()
        self.run("systemctl poweroff --no-block")
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"container {self.name} did not power off within {timeout}s"
                                 f"{self._console_tail()}") from None
        self._after_exit()
        return time.monotonic() - start

    def _after_exit(self) -> None:
        self.init_pid = None
        _umount(self.bpf)
        # nspawn keeps a folder per machine for `machinectl bind`; it cannot remove it from a /run on disk.
        shutil.rmtree(f"/run/systemd/nspawn/propagate/{self.name}", ignore_errors=True)
        for d in ("/run/systemd/nspawn/propagate", "/run/systemd/nspawn/locks", "/run/systemd/nspawn"):
            try:
                os.rmdir(d)
            except OSError:
                pass    # not empty (another container runs) or gone

    def destroy(self) -> None:
        """Stops the container if it runs (poweroff, or a kill if that fails), then removes its disk
        and folder."""
        if self.running:
            try:
                self.poweroff(timeout=30)
            except AssertionError:
                self._kill()
        _umount(self.bpf)
        _umount(self.disk)
        if not os.path.ismount(self.disk) and not os.path.ismount(self.bpf):
            shutil.rmtree(self.dir, ignore_errors=True)
        try:
            os.rmdir(RUNS_DIR)
        except OSError:
            pass

    def _kill(self) -> None:
        """SIGKILL to the container's PID 1, which ends every process of its PID namespace; to nspawn
        itself if the container never got that far. Both by their recorded PIDs."""
        for pid in (self.init_pid, self.proc.pid):
            if not pid:
                continue
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=15)
                break
            except subprocess.TimeoutExpired:
                continue
        self._after_exit()


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def _umount(path: str) -> None:
    if os.path.ismount(path):
        subprocess.run(["umount", path], check=True, capture_output=True)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
