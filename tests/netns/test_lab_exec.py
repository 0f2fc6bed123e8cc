"""`pep-lab exec NODE -- CMD` runs CMD in the node's network namespace and nothing else.

   pl<rid>-proxyhost   ./scripts/pepctl -c CONF down, run through `pep-lab exec proxyhost --`
        graphs:        pl<rid>-pep, pl<rid>-g2, pl<rid>-g3  (pep-lab up --graphs 3)

How right is told from wrong: `pepctl down` deletes the graphs' namespaces with `ip netns del`,
which unmounts /run/netns/NAME in the mount namespace it runs in. Under `ip netns exec` (a mount
namespace of its own) every namespace stayed for everyone else, and down reported "setns into
namespace ...: Invalid argument". The test looks at /run/netns from its own, the host's, mount
namespace, and for the instance's pins and files, which down removes too: under `ip netns exec`'s
private /sys, /sys/fs/bpf is empty and the pins stay behind.
"""

from __future__ import annotations

import os
import subprocess

from netns.handle import PEP_LAB, REPO
from pepctl.names import netns_path

LAB_OPTIONS = ["--graphs", "3"]


def pep_lab_exec(lab, node: str, *cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run([PEP_LAB, "exec", node, "--", *cmd], env=lab.env, cwd=REPO, capture_output=True,
                          text=True, timeout=180)


def test_exec_sees_the_pins(lab):
    pins = lab.config().instance_names().pins
    proc = pep_lab_exec(lab, "proxyhost", "ls", pins)
    assert proc.returncode == 0 and "flow" in proc.stdout.split(), \
        f"proxyhost: `ls {pins}` through pep-lab exec: expected the flow pins, got exit {proc.returncode}: " \
        f"{proc.stdout}{proc.stderr}"


def test_pepctl_down_through_exec_removes_every_graph_namespace(lab):
    cfg = lab.config()
    spaces = [cfg.graph_names(g).netns for g in cfg.graphs]
    assert len(spaces) == 3 and all(os.path.exists(netns_path(ns)) for ns in spaces), \
        f"the lab's graph namespaces are not all there before the test: {spaces}"
    conf = os.path.join(lab.run_dir, "pep.toml")
    proc = pep_lab_exec(lab, "proxyhost", "./scripts/pepctl", "-c", conf, "down")
    assert proc.returncode == 0, f"proxyhost: pepctl down through pep-lab exec: exit {proc.returncode}: {proc.stderr}"
    n = cfg.instance_names()
    left = [ns for ns in spaces if os.path.exists(netns_path(ns))] + \
        [path for path in (n.pins, n.journal, n.dir) if os.path.lexists(path)]
    assert not left, f"pepctl down through pep-lab exec left these behind: {left}; {proc.stdout}"
