"""Shared fixtures: the lab as a pytest fixture, and the check that a run leaves nothing behind.

tests/unit needs no root. tests/bpf and tests/netns need root; without it
they skip, saying so.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
PEP_LAB = os.path.join(REPO, "scripts", "pep-lab")
PEPCTL = os.path.join(REPO, "scripts", "pepctl")
PYTHON = os.path.join(REPO, ".venv", "bin", "python")
if not os.path.exists(PYTHON):
    PYTHON = sys.executable


def pytest_collection_modifyitems(config, items):
    if os.geteuid() == 0:
        return
    skip = pytest.mark.skip(reason="needs root: namespaces, BPF and nftables")
    for item in items:
        if "/tests/unit/" not in str(item.fspath):
            item.add_marker(skip)


# -- nothing left behind ------------------------------------------------------
def _snapshot() -> dict[str, set[str]]:
    def listdir(path):
        try:
            return set(os.listdir(path))
        except FileNotFoundError:
            return set()
    procs = set()
    for pid in listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/comm") as f:
                    comm = f.read().strip()
            except OSError:
                continue
            if comm in ("haproxy", "nginx", "linkem", "pep-replay", "iperf3", "wrk"):
                procs.add(f"{pid}:{comm}")
    links = {ln["ifname"] for ln in json.loads(subprocess.run(["ip", "-j", "link"], capture_output=True,
                                                              text=True).stdout or "[]")}
    return {"netns": listdir("/run/netns"), "bpf pins": listdir("/sys/fs/bpf"),
            "run dirs": listdir("/run/peplab") | listdir("/run/pep"), "processes": procs, "links": links}


@pytest.fixture(scope="session", autouse=True)
def leaves_nothing_behind():
    if os.geteuid() != 0:
        yield
        return
    before = _snapshot()
    yield
    # Processes stopped by SIGTERM may take a moment to be reaped.
    deadline = time.monotonic() + 5
    while True:
        after = _snapshot()
        left = {k: sorted(after[k] - before[k]) for k in after if after[k] - before[k]}
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not left, f"the test run left these behind: {left}"


# -- the lab ------------------------------------------------------------------
class LabHandle:
    """A running lab: run commands in its nodes, read its status."""

    def __init__(self, name: str):
        self.name = name
        self.env = {**os.environ, "PEP_LAB": name}
        with open(f"/run/peplab/{name}.json") as f:
            self.rid = json.load(f)["meta"]["rid"]
        self.run_dir = f"/run/peplab/{self.rid}"

    def netns(self, node: str) -> str:
        return f"pl{self.rid}-{node}"

    def argv(self, node: str, *cmd: str) -> list[str]:
        return ["ip", "netns", "exec", self.netns(node), *cmd]

    def run(self, node: str, *cmd: str, check: bool = True, timeout: float = 30, text: bool = True, **kw):
        proc = subprocess.run(self.argv(node, *cmd), capture_output=True, text=text, timeout=timeout, **kw)
        if check and proc.returncode != 0:
            err = proc.stderr if text else proc.stderr.decode(errors="replace")
            raise AssertionError(f"on {node}: {' '.join(cmd)} exited {proc.returncode}: {err.strip()}")
        return proc

    def popen(self, node: str, *cmd: str, **kw) -> subprocess.Popen:
        return subprocess.Popen(self.argv(node, *cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, **kw)

    def status(self) -> dict:
        proc = subprocess.run([PEP_LAB, "status", "--json"], env=self.env, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    def pepctl(self, *args: str, check: bool = True):
        cmd = ["nsenter", f"--net=/run/netns/{self.netns('proxyhost')}", PEPCTL, "-c",
               os.path.join(self.run_dir, "pep.toml"), *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        if check and proc.returncode != 0:
            raise AssertionError(f"pepctl {' '.join(args)} exited {proc.returncode}: {proc.stderr}")
        return proc


_broken_labs: dict[str, str] = {}


def make_lab(request, options: list[str]):
    key = f"{request.module.__name__}:{options}"
    if key in _broken_labs:
        pytest.skip(f"the lab of this module failed to build: {_broken_labs[key]}")
    name = f"t{secrets.token_hex(3)}"
    env = {**os.environ, "PEP_LAB": name}
    up = subprocess.run([PEP_LAB, "up", *options], env=env, capture_output=True, text=True, timeout=180)
    if up.returncode != 0:
        _broken_labs[key] = up.stderr.strip()[-500:]
        pytest.fail(f"pep-lab up {' '.join(options)} failed: {up.stderr}\n{up.stdout[-2000:]}")
    handle = LabHandle(name)
    yield handle
    down = subprocess.run([PEP_LAB, "down"], env=env, capture_output=True, text=True, timeout=120)
    assert down.returncode == 0, f"pep-lab down failed: {down.stderr}"


@pytest.fixture(scope="module")
def lab(request):
    """The lab with the options of the module's LAB_OPTIONS (default: the proxied lab)."""
    yield from make_lab(request, list(getattr(request.module, "LAB_OPTIONS", [])))


def wait_until(cond, *, timeout: float, what: str, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
