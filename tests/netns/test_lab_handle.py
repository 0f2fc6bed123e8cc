"""A process that holds a lab (a benchmark, a test run) takes it down when it is told to stop.

How right is told from wrong: a child process brings a lab up through LabHandle, says so, and
sleeps; the test sends it SIGTERM, as `kill` and a CI timeout do, and then looks for what the lab
made: its namespaces (pl<rid>-*), its folder under /run/peplab and its journal. Python dies of
SIGTERM without unwinding, and before netns.handle.stop_on_sigterm all of them stayed.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys

from netns.handle import REPO, LabHandle
from pepctl.names import netns_path

HOLD = """
import sys, time
from netns.handle import LabHandle
with LabHandle.up(sys.argv[1], ["--no-proxy"]) as lab:
    print(lab.rid, flush=True)
    time.sleep(120)
"""


def test_a_process_told_to_stop_takes_its_lab_down():
    name = f"t{secrets.token_hex(3)}"
    proc = subprocess.Popen([sys.executable, "-c", HOLD, name], cwd=REPO, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": REPO})
    try:
        rid = proc.stdout.readline().strip()
        assert rid, f"the lab holder exited before its lab was up: exit {proc.wait(timeout=60)}"
        spaces = [f"pl{rid}-client", f"pl{rid}-origin"]
        assert all(os.path.exists(netns_path(ns)) for ns in spaces), f"lab {name}: expected {spaces} while it is up"
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            LabHandle(name).down()
    left = [ns for ns in os.listdir("/run/netns") if ns.startswith(f"pl{rid}-")] if os.path.isdir("/run/netns") else []
    left += [p for p in (f"/run/peplab/{rid}", f"/run/peplab/{name}.json") if os.path.exists(p)]
    if os.path.exists(f"/run/peplab/{name}.json"):
        LabHandle(name).down()      # a failure still leaves the machine as it found it
    assert not left, f"lab {name} (run {rid}) after SIGTERM to its holder (exit {code}): expected nothing, " \
                     f"got {left}"
