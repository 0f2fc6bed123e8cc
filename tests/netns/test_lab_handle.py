"""A lab comes down when what built it is told to stop: a process that holds one (a benchmark, a test
run), one stopped while its lab is being built, and `pep-lab up` itself.

How right is told from wrong: the test sends SIGTERM, as `kill` and a CI timeout do (to one process, or
to its whole process group), and then looks for what the lab made: its namespaces (pl<rid>-*), its
folder under /run/peplab and its journal. Python dies of SIGTERM without unwinding, and before
pepctl.runner.stop_on_sigterm all of them stayed.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys

import pytest

from netns.handle import PEP_LAB, REPO, LabHandle
from pepctl.names import netns_path
from pepctl.runner import Journal, wait_for

HOLD = """
import sys, time
from netns.handle import LabHandle
with LabHandle.up(sys.argv[1], ["--no-proxy"]):
    time.sleep(120)
"""


def leftovers(name: str, rid: str) -> list[str]:
    """What is left of lab `name`: its namespaces, folder and journal, and its proxy host's pepctl
    instance (pl<rid>: pins, the host's register of instances, its processes)."""
    left = [ns for ns in os.listdir("/run/netns") if ns.startswith(f"pl{rid}-")] if os.path.isdir("/run/netns") else []
    left += [p for p in (f"/run/peplab/{rid}", f"/run/peplab/{name}.json", f"/sys/fs/bpf/pl{rid}",
                         f"/run/pep-instances/pl{rid}.json") if os.path.exists(p)]
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout.splitlines()
    return left + [line.strip() for line in ps if f"/run/peplab/{rid}/" in line]


def assert_gone(name: str, rid: str, when: str) -> None:
    left = leftovers(name, rid)
    if os.path.exists(f"/run/peplab/{name}.json"):
        LabHandle(name).down()      # a failure still leaves the machine as it found it
    assert not left, f"lab {name} (run {rid}) {when}: expected nothing, got {left}"


def lab_up(name: str) -> bool:
    try:     # the journal may be half written
        return Journal(f"/run/peplab/{name}.json").complete
    except (OSError, ValueError):
        return False


# How far a lab's build has gone: its first namespace; its proxy host's `pepctl up` under way (the
# instance registered on the host, pepctl/register.py), whose own rollback is then part of the lab's;
# or the whole lab up.
PHASES = {"namespaces": lambda name, rid: os.path.exists(netns_path(f"pl{rid}-client")),
          "pepctl up": lambda name, rid: os.path.exists(f"/run/pep-instances/pl{rid}.json"),
          "up": lambda name, rid: lab_up(name)}


def building(name: str, phase: str) -> str:
    """Wait until lab `name`'s build is as far as `phase`; its run id."""
    def run_id() -> str | None:
        try:     # the journal's first line names the run; it may be half written
            with open(f"/run/peplab/{name}.json") as f:
                return json.loads(f.readline())["meta"]["rid"]
        except (OSError, ValueError, KeyError):
            return None

    rid = wait_for(run_id, timeout=60, what=f"lab {name}'s journal")
    wait_for(lambda: PHASES[phase](name, rid), timeout=60, what=f"lab {name} at {phase}", interval=0.005)
    return rid


def sigterm(proc: subprocess.Popen) -> list[str]:
    proc.send_signal(signal.SIGTERM)
    return []


def sigterm_to_its_group(proc: subprocess.Popen) -> list[str]:
    """As a shell's job control, systemd and CI runners do: the holder, `pep-lab up` and its `pepctl up`
    all get it at once, and the holder then sends `pep-lab up` its own."""
    os.killpg(proc.pid, signal.SIGTERM)
    return []


def sigterm_again_in_its_rollback(proc: subprocess.Popen) -> list[str]:
    """SIGTERM, and a second one once it says it is rolling back: what `pep-lab up` gets when `kill`
    reaches the benchmark holding the lab too. Cut short by it, a rollback left a lab's namespaces,
    pins and linkem with no journal to take them down (runner.interrupts_held)."""
    proc.send_signal(signal.SIGTERM)
    printed = []
    for line in proc.stdout:
        printed.append(line)
        if "rolling back" in line:
            proc.send_signal(signal.SIGTERM)
            break
    return printed


def stop_while_building(argv: list[str], name: str, phase: str, stop=sigterm) -> tuple[str, int, str]:
    """Run argv, which builds lab `name`, in a session of its own; once the build is as far as `phase`,
    stop(proc) tells it to stop. The lab's run id, the exit status and what it printed."""
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True,
                            env={**os.environ, "PEP_LAB": name, "PYTHONPATH": REPO, "PYTHONUNBUFFERED": "1"})
    try:
        rid = building(name, phase)
        printed = stop(proc)
        printed.append(proc.communicate(timeout=180)[0])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return rid, proc.returncode, "".join(printed)


@pytest.mark.parametrize("phase", ["namespaces", "pepctl up"])     # (once up, `pep-lab up` has ended)
def test_pep_lab_up_told_to_stop_rolls_its_lab_back(phase):
    name = f"t{secrets.token_hex(3)}"
    rid, code, printed = stop_while_building([PEP_LAB, "up"], name, phase)
    assert_gone(name, rid, f"after SIGTERM to `pep-lab up` at {phase} (exit {code}): {printed[-800:]}")


def test_a_second_sigterm_does_not_cut_the_rollback_short():
    name = f"t{secrets.token_hex(3)}"
    rid, code, printed = stop_while_building([PEP_LAB, "up"], name, "pepctl up", sigterm_again_in_its_rollback)
    assert_gone(name, rid, f"after two SIGTERMs to `pep-lab up`, the second in its rollback (exit {code}): "
                f"{printed[-800:]}")
    assert "rolling back" in printed, f"`pep-lab up` did not roll back, so no second SIGTERM was sent: {printed}"


@pytest.mark.parametrize("phase", PHASES)
def test_a_process_that_holds_a_lab_told_to_stop_takes_it_down(phase):
    name = f"t{secrets.token_hex(3)}"
    rid, code, printed = stop_while_building([sys.executable, "-c", HOLD, name], name, phase)
    assert_gone(name, rid, f"after SIGTERM to its holder at {phase} (exit {code}): {printed[-800:]}")


@pytest.mark.parametrize("phase", ["namespaces", "pepctl up"])
def test_a_process_group_told_to_stop_takes_its_lab_down(phase):
    name = f"t{secrets.token_hex(3)}"
    rid, code, printed = stop_while_building([sys.executable, "-c", HOLD, name], name, phase, sigterm_to_its_group)
    assert_gone(name, rid, f"after SIGTERM to its holder's process group at {phase} (exit {code}): {printed[-800:]}")
