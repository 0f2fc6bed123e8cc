"""Fixtures for BPF unit tests: probe what the kernel offers, give each run its own bpffs
folder, and run BPF_PROG_TEST_RUN inside a private network namespace.

Names carry the prefix "pst" (or the module's NAME_PREFIX) and a random run id; everything is
removed at teardown, also after a failure.
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from pepctl import bpfsys, nsutil  # noqa: E402

BPFFS = Path("/sys/fs/bpf")
PREFIX = "pst"


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="session")
def run_id() -> str:
    return secrets.token_hex(3)


@pytest.fixture(scope="session")
def bpf_ready() -> None:
    """Skips unless we are root, bpf(2) answers, bpffs is mounted (mounted here if not) and
    bpftool is installed."""
    if os.geteuid() != 0:
        pytest.skip("BPF tests need root (bpf(2), bpffs, namespaces)")
    try:
        bpfsys.obj_get("/nonexistent-pst-probe")
    except OSError as e:
        if e.errno != errno.ENOENT:
            pytest.skip(f"bpf(2) syscall unavailable: {e}")
    if not os.path.ismount(BPFFS):
        # Like scripts/setup, mount it and leave it: bpffs is host state others rely on.
        r = _run(["mount", "-t", "bpf", "bpf", str(BPFFS)])
        if r.returncode != 0:
            pytest.skip(f"bpffs not mounted at {BPFFS} and mount failed: {r.stderr.strip()}")
    if shutil.which("bpftool") is None:
        pytest.skip("bpftool not installed (apt install bpftool)")


def _prefix(request) -> str:
    """The name prefix of the requesting module (NAME_PREFIX), "pst" if it sets none."""
    return getattr(request.module, "NAME_PREFIX", PREFIX)


@pytest.fixture(scope="module")
def pin_dir(request, bpf_ready, run_id):
    """A fresh bpffs folder /sys/fs/bpf/<prefix>-<runid>-<n>, removed with all its pins."""
    path = BPFFS / f"{_prefix(request)}-{run_id}-{secrets.token_hex(2)}"
    path.mkdir()
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=False)


class NetnsRunner:
    """Runs callables on one worker thread that has joined a network namespace.

    setns(CLONE_NEWNET) moves only the calling thread, so the test process itself stays in
    its namespace. BPF_PROG_TEST_RUN resolves a ctx ifindex in the caller's namespace, so
    the ifindexes a test needs can be made there without touching the host's links.
    """

    def __init__(self, name: str):
        self.name = name
        self._pool = ThreadPoolExecutor(max_workers=1, initializer=self._enter)

    def _enter(self) -> None:
        nsutil.join(self.name)

    def __call__(self, fn, *args, **kwargs):
        return self._pool.submit(fn, *args, **kwargs).result(timeout=30)

    def close(self) -> None:
        self._pool.shutdown(wait=True)


@pytest.fixture(scope="module")
def netns(request, bpf_ready, run_id):
    """A private namespace <prefix>-<runid>-<n>; yields (name, NetnsRunner). Deleted at teardown."""
    name = f"{_prefix(request)}-{run_id}-{secrets.token_hex(2)}"
    r = _run(["ip", "netns", "add", name])
    if r.returncode != 0:
        pytest.skip(f"network namespaces unavailable (ip netns add {name}): {r.stderr.strip()}")
    runner = None
    try:
        runner = NetnsRunner(name)
        yield name, runner
    finally:
        if runner is not None:
            runner.close()
        r = _run(["ip", "netns", "del", name])
        if r.returncode != 0:
            raise AssertionError(f"ip netns del {name}: {r.stderr.strip()}")


@pytest.fixture(scope="session")
def tc_built(bpf_ready) -> Path:
    """Builds the tc datapath objects once per session (make -C tc); yields the tc folder."""
    tc = REPO / "tc"
    r = subprocess.run(["make", "-s", "-C", str(tc)], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        pytest.fail(f"make -C {tc}: exit {r.returncode}\n{r.stdout}{r.stderr}")
    return tc


def loadall(obj: Path, pin: Path) -> None:
    """Loads every program of obj (each of its section's type) under pin/prog, its maps under pin/maps."""
    r = _run(["bpftool", "prog", "loadall", str(obj), str(pin / "prog"), "pinmaps", str(pin / "maps")])
    if r.returncode != 0:
        pytest.fail(f"bpftool prog loadall {obj} {pin}: exit {r.returncode}\n{r.stderr}")


@pytest.fixture(scope="session")
def bpf_loadall(tc_built):
    """loadall(obj, pin) of the freshly built objects, as a fixture (conftest is not importable)."""
    return loadall
