"""A second instance beside a running one, and the host-side checks of `up` (issue 13).

   client -- switch ==trunk== proxyhost: nic0 -- instance pl<rid> (the lab's, running)
                                         nic9 (a spare NIC made by a test)
   a second pepctl config is brought up in the same proxyhost namespace, in every conflicting way

How right is told from wrong: every conflicting `up` must exit non-zero naming the field, the
value and the running instance, and must leave the running instance exactly as it was: the
same pins, namespaces, links, processes and journal, `status` still "up", and the client
still reaching the origin through the proxy (the origin still logs the client's own address).
The operator's own file in a run folder is still there, byte for byte, after a refused `up`.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import secrets
import shutil
import subprocess
import tempfile

import pytest

from netns.addresses import ACCESS_GW4, CLIENT4, ORIGIN_URL4
from netns.handle import PEPCTL
from pepctl.runner import wait_for

LAB_OPTIONS: list[str] = []


@pytest.fixture
def short_tmp():
    """A folder with a short path: run folders made under it must leave room for HAProxy's sockets."""
    path = tempfile.mkdtemp(dir="/tmp", prefix="p")
    yield pathlib.Path(path)
    shutil.rmtree(path)


def lab_config(lab) -> str:
    with open(os.path.join(lab.run_dir, "pep.toml")) as f:
        return f.read()


def second(lab, tmp_path, text: str) -> subprocess.CompletedProcess:
    path = tmp_path / f"second-{secrets.token_hex(2)}.toml"
    path.write_text(text)
    proc = subprocess.run(["nsenter", f"--net=/run/netns/{lab.netns('proxyhost')}", PEPCTL, "-c", str(path), "up"],
                          capture_output=True, text=True, timeout=120)
    if proc.returncode == 0:   # it should not have come up: take it down so the lab is left as it was
        subprocess.run(["nsenter", f"--net=/run/netns/{lab.netns('proxyhost')}", PEPCTL, "-c", str(path), "down"],
                       capture_output=True, text=True, timeout=120)
    return proc


def fingerprint(lab) -> dict:
    """What of the running instance a refused second `up` must not touch."""
    n = lab.config().instance_names()
    st = json.loads(lab.pepctl("status", "--json").stdout)
    with open(n.journal, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    return {"pins": sorted(os.listdir(n.pins)), "state": st["state"], "journal": digest,
            "processes": {k: st["proxy"][k]["pid"] for k in ("keeper", "supervisor", "haproxy")},
            "netns": sorted(ns for ns in os.listdir("/run/netns") if ns.startswith(n.instance)),
            "mode": [g["proxy"]["mode"] for g in st["graphs"]]}


def still_serving(lab) -> None:
    tag = secrets.token_hex(4)
    got = lab.run("client", "curl", "-s", "-m", "5", f"{ORIGIN_URL4}/?{tag}").stdout
    assert "PEP lab origin" in got, f"client: the origin did not answer after the refused up: {got!r}"
    assert lab.origin_peer(tag) == CLIENT4, "the origin no longer sees the client's own address"


def renamed(text: str, prefix: str, tmp) -> str:
    """The lab's config as another instance (prefix instead of "pl"), with run and pin folders of its own."""
    return (text.replace('instance = "pl', f'instance = "{prefix}', 1)
            .replace('run_dir = "', f'run_dir = "{tmp}/{prefix}', 1)
            .replace('bpf_dir = "/sys/fs/bpf/pl', f'bpf_dir = "/sys/fs/bpf/{prefix}'))


CONFLICTS = [
    # (id, how the second config differs from the lab's, field the refusal names, words it must say)
    ("same-name-own-run-dir", lambda t, tmp: t.replace('run_dir = "', f'run_dir = "{tmp}/x', 1),
     "host.instance", "is up with this name"),
    ("same-nic-other-name", lambda t, tmp: renamed(t, "px", tmp), "host.nic", "one instance per NIC"),
    ("same-vlan-same-nic", lambda t, tmp: renamed(t, "pv", tmp).replace("vlan = 200", "vlan = 201"),
     "host.nic", "VLAN(s) 100"),
    ("same-metrics-port", lambda t, tmp: renamed(t, "pm", tmp), "host.metrics_port",
     "serves its metrics on 127.0.0.1 port 9101"),
]


@pytest.mark.parametrize("case,change,field,words", CONFLICTS, ids=[c[0] for c in CONFLICTS])
def test_second_instance_is_refused_and_the_running_one_is_untouched(lab, short_tmp, case, change, field, words):
    before = fingerprint(lab)
    proc = second(lab, short_tmp, change(lab_config(lab), short_tmp))
    assert proc.returncode != 0, f"{case}: the second instance came up: {proc.stdout[-1000:]}"
    assert field in proc.stderr and words in proc.stderr, f"{case}: expected {field!r} and {words!r} in: {proc.stderr}"
    assert f"pl{lab.rid}" in proc.stderr, f"{case}: the message does not name the running instance: {proc.stderr}"
    assert fingerprint(lab) == before, f"{case}: the running instance changed"
    still_serving(lab)


def test_operators_file_in_the_run_folder_is_never_removed(lab, short_tmp):
    """A run folder that holds a file of the operator's: refused before anything is made."""
    text = lab_config(lab).replace('instance = "pl', 'instance = "pw', 1).replace('nic = "nic0"', 'nic = "nic9"')
    text = text.replace('run_dir = "', f'run_dir = "{short_tmp}/r', 1).replace('bpf_dir = "/sys/fs/bpf/pl',
                                                                             'bpf_dir = "/sys/fs/bpf/pw')
    inst = "pw" + lab.rid
    folder = short_tmp / f"r{lab.run_dir}" / "pep" / inst
    folder.mkdir(parents=True)
    mine = folder / "notes.txt"
    mine.write_text("the operator's own notes\n")
    spare = lab.run("proxyhost", "ip", "link", "add", "nic9", "type", "veth", "peer", "name", "nic9p")
    assert spare.returncode == 0
    try:
        proc = second(lab, short_tmp, text)
    finally:
        lab.run("proxyhost", "ip", "link", "del", "nic9")
    assert proc.returncode != 0, proc.stdout
    assert "host.run_dir" in proc.stderr and "notes.txt" in proc.stderr, proc.stderr
    assert mine.read_text() == "the operator's own notes\n", "the operator's file was changed or removed"
    still_serving(lab)


@pytest.mark.parametrize("what,edit,field,words", [
    ("bpf_dir not on a bpffs", lambda t, tmp: t.replace('bpf_dir = "/sys/fs/bpf/pl', f'bpf_dir = "{tmp}/pl'),
     "host.bpf_dir", "not on a bpf filesystem"),
    ("run_dir under a file", lambda t, tmp: t.replace('run_dir = "', f'run_dir = "{tmp}/afile/', 1),
     "host.run_dir", "is a file, not a folder"),
    ("run_dir under /proc", lambda t, tmp: t.replace('run_dir = "', 'run_dir = "/proc/pep', 1),
     "host.run_dir", "a proc filesystem"),
    ("maxconn over the open-file limit", lambda t, tmp: t.replace("[host.tuning]", "maxconn = 900000\n[host.tuning]"),
     "host.maxconn", "open-file limit"),
])
def test_host_side_problems_are_refused_by_plan_naming_the_field(lab, short_tmp, what, edit, field, words):
    (short_tmp / "afile").write_text("x")
    text = edit(lab_config(lab).replace('instance = "pl', 'instance = "pq', 1), str(short_tmp))
    path = short_tmp / "p.toml"
    path.write_text(text)
    plan = subprocess.run(["nsenter", f"--net=/run/netns/{lab.netns('proxyhost')}", PEPCTL, "-c", str(path), "plan"],
                          capture_output=True, text=True, timeout=60)
    assert plan.returncode == 2, f"{what}: plan exit {plan.returncode}: {plan.stdout[-500:]}{plan.stderr}"
    assert field in plan.stderr and words in plan.stderr, f"{what}: {plan.stderr}"
    assert "Traceback" not in plan.stderr


def test_down_and_up_keep_the_macs_so_traffic_resumes_at_once(lab):
    """c_in and s_in get MACs derived from their names: the client's neighbour entry stays right."""
    lab.run("client", "curl", "-s", "-m", "5", "-o", "/dev/null", f"{ORIGIN_URL4}/")
    neigh = lab.run("client", "ip", "-j", "neigh", "show", ACCESS_GW4).stdout
    mac = json.loads(neigh)[0]["lladdr"]
    lab.pepctl("down")
    lab.pepctl("up")
    wait_for(lambda: json.loads(lab.pepctl("status", "--json").stdout)["graphs"][0]["proxy"].get("mode") == "proxy",
             timeout=10, what="the graph proxying again")
    after = json.loads(lab.run("client", "ip", "-j", "neigh", "show", ACCESS_GW4).stdout)[0]["lladdr"]
    assert after == mac, f"client's neighbour entry for {ACCESS_GW4}: expected {mac}, got {after}"
    got = lab.run("client", "curl", "-s", "-m", "1", f"{ORIGIN_URL4}/", check=False)
    assert got.returncode == 0 and "PEP lab origin" in got.stdout, \
        f"no answer within 1 s of `up` (curl exit {got.returncode}): {got.stderr}"
    ns_mac = json.loads(lab.run("pep", "ip", "-j", "link", "show", "c_in").stdout)[0]["address"]
    assert ns_mac == mac, f"c_in's MAC after up: expected {mac}, got {ns_mac}"
