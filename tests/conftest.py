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

from netns import configs
from netns.container import RUNS_DIR
from netns.handle import LabHandle
from netns.lab import STATE_DIR
from pepctl import congestion, hostinfo
from pepctl.config.schema import DIR_DEFAULTS
from pepctl.names import CONGESTION_DIR, CONGESTION_LOCK, CRASH_LOG, REGISTER, congestion_pins
from pepctl.register import users_of

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def pytest_collection_modifyitems(config, items):
    if os.geteuid() == 0:
        return
    skip = pytest.mark.skip(reason="needs root: namespaces, BPF and nftables")
    for item in items:
        if "/tests/unit/" not in str(item.fspath):
            item.add_marker(skip)


# -- configs -------------------------------------------------------------------
@pytest.fixture
def config_doc() -> dict:
    """A fresh one-graph pepctl config, as a dict (netns/configs.py one_graph): a test changes what it
    needs and writes it with configs.toml_text."""
    return configs.one_graph()


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
    folders = (DIR_DEFAULTS["run_dir"], STATE_DIR, REGISTER)
    return {"netns": listdir("/run/netns"), "bpf pins": listdir("/sys/fs/bpf"),
            "run dirs": set().union(*(listdir(d) for d in folders)),
            # Folders pepctl makes on the host, and its crash log: none may appear during a test run.
            "host folders": {d for d in (*folders, os.path.dirname(CRASH_LOG)) if os.path.exists(d)},
            "congestion controls": _own_congestion(),
            # Containers (netns/container.py): each run's disk and bpffs, and nspawn's folder per machine.
            # Their cached Debian roots (CACHE_DIR, under /var/cache) are kept between runs on purpose.
            "containers": listdir(RUNS_DIR) | listdir("/run/systemd/nspawn/propagate"),
            "cgroup programs": _cgroup_programs(),
            "processes": procs, "links": links}


def _cgroup_programs() -> set[str]:
    """BPF programs attached to the root of the cgroup v2 hierarchy (an instance's flow_conns), by id."""
    root = hostinfo.cgroup2_root()
    if root is None:
        return set()
    out = subprocess.run(["bpftool", "-j", "cgroup", "show", root], capture_output=True, text=True).stdout
    return {f"{p['id']}:{p.get('name', '?')}" for p in json.loads(out.strip() or "[]")}


def _own_congestion() -> set[str]:
    """pepctl's own congestion controls (pep_radio) registered or pinned, and their host-wide folder
    and lock, while no running instance uses them (what another run on this host uses is theirs to
    remove)."""
    used = {cc for cc in congestion.BUILT if users_of(cc)}
    out = set()
    registered = congestion.available()
    for cc in set(congestion.BUILT) - used:
        if cc in registered:
            out.add(f"{cc} registered")
        if os.path.lexists(congestion_pins(cc)):
            out.add(f"{congestion_pins(cc)}: {', '.join(sorted(os.listdir(congestion_pins(cc))))}")
    if not used:
        out |= {path for path in (CONGESTION_DIR, CONGESTION_LOCK) if os.path.lexists(path)}
    return out


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
# A module's lab: LAB_OPTIONS (pep-lab up options; default: the proxied lab), or LAB_MODES, a dict
# of interception mode -> options, to run every test of the module on a lab of each mode in turn
# (lab.interception says which). A module's lab_setup(handle), if it has one, runs once the lab is up.
_broken_labs: dict[str, str] = {}


def pytest_generate_tests(metafunc):
    modes = getattr(metafunc.module, "LAB_MODES", None)
    if modes and "lab" in metafunc.fixturenames:
        metafunc.parametrize("lab", list(modes), indirect=True, scope="module")


def make_lab(request, options: list[str], mode: str | None = None):
    key = f"{request.module.__name__}:{options}"
    if key in _broken_labs:
        pytest.skip(f"the lab of this module{f' ({mode})' if mode else ''} failed to build: {_broken_labs[key]}")
    try:
        handle = LabHandle.up(f"t{secrets.token_hex(3)}", options)
    except RuntimeError as e:
        _broken_labs[key] = str(e)[-500:]
        pytest.fail(str(e))
    handle.interception = mode
    try:
        setup = getattr(request.module, "lab_setup", None)
        if setup is not None:
            setup(handle)
        yield handle
    finally:
        handle.down()


@pytest.fixture(scope="module")
def lab(request):
    """The module's lab (see above); one that fails to build makes the module's remaining tests skip."""
    modes = getattr(request.module, "LAB_MODES", None)
    if modes:
        yield from make_lab(request, list(modes[request.param]), request.param)
    else:
        yield from make_lab(request, list(getattr(request.module, "LAB_OPTIONS", [])))
