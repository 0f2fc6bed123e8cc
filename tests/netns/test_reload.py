"""A reload is a plan: when one of its steps fails, at any graph, every graph is as it was.

   client -- switch ==trunk== proxyhost (nic0) -- graphs pep, g2, g3 (pep-lab up --graphs 3),
                                                  interception bpf, then nft

How right is told from wrong: the test fills bypass_client6 to its capacity with live rules of
graph pep (1,048,576 entries, all graphs together), as an operator's rules can. A new config then
changes every graph (the ports it intercepts and its MPTCP choice, so its flags and, in mode nft, its
table) and gives
graph k one more IPv6 bypass rule: graph k's step that writes it fails for real (the map is full),
after the steps of the graphs before it and graph k's own first steps ran. Before and after
each failed reload the test records what a reload may change: each graph's entry in the graphs
map, the intercept_ports and bypass maps (a digest of every key), each graph's nft table (mode
nft), HAProxy's config, and the instance's journal; they must be equal, for k = each graph in
turn. The same reload without graph k's new rule passes and changes them: the comparison can fail.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import subprocess
import tomllib

from netns.configs import toml_text
from netns.handle import PEPCTL
from pepctl import flow_maps
from pepctl.names import in_netns
from pepctl.runner import Journal

LAB_MODES = {"bpf": ["--graphs", "3"], "nft": ["--graphs", "3", "--interception", "nft"]}
KEYED_MAPS = ("intercept_ports", "bypass_client4", "bypass_client6", "bypass_server4", "bypass_server6",
              "bypass_ports")
FILL_NET = ipaddress.IPv6Network("2001:2:0:8000::/64")     # /128s of the live rules that fill the map


def lab_setup(lab) -> None:
    """bypass_client6 full: live rules of graph pep, as many as there is room for."""
    cfg = lab.config()
    with flow_maps.open_map(cfg.instance_names().flow_pins, "bypass_client6") as m:
        room = m.max_entries - sum(1 for _ in m.keys())
    path = os.path.join(lab.run_dir, "fill.rules")
    base = int(FILL_NET.network_address)
    with open(path, "w") as f:
        f.writelines(f"client {ipaddress.IPv6Address(base + i)}/128\n" for i in range(room))
    lab.pepctl("bypass", "add", "--graph", "pep", "--from-file", path, timeout=600)
    os.unlink(path)


def state(lab) -> dict:
    cfg = lab.config()
    n = cfg.instance_names()
    out: dict = {}
    with flow_maps.open_map(n.flow_pins, "graphs") as m:
        out["graphs"] = {g.name: m.lookup(flow_maps.U32.pack(g.index)) for g in cfg.graphs}
    for name in KEYED_MAPS:
        with flow_maps.open_map(n.flow_pins, name) as m:
            keys = sorted(m.keys())
        out[name] = (len(keys), hashlib.sha256(b"".join(keys)).hexdigest())
    for g in cfg.graphs:
        gn = cfg.graph_names(g)
        if g.proxy.interception == "nft":
            out[f"nft {g.name}"] = subprocess.run(in_netns(gn.netns, ["nft", "list", "table", "inet", gn.nft_table]),
                                                  capture_output=True, text=True).stdout
    with open(n.haproxy_cfg) as f:
        out["haproxy.cfg"] = f.read()
    out["running config"] = Journal(n.journal).meta["config_sha256"]
    out["left"] = [p for p in (n.haproxy_cfg_new, n.reload_journal) if os.path.exists(p)]
    return out


def new_config(lab, failing: str | None) -> str:
    """Every graph intercepts 80 and 443 (the lab's: all ports) and proxies MPTCP SYNs (the lab's:
    bypass); graph `failing` gets one more bypass rule."""
    with open(os.path.join(lab.run_dir, "pep.toml"), "rb") as f:
        doc = tomllib.load(f)
    for g in doc["graph"]:
        g["proxy"]["ports"] = [80, 443]
        g["proxy"]["mptcp"] = "proxy"
        if g["name"] == failing:
            g["bypass"] = {"clients": ["2001:2:0:9000::/64"]}
    return toml_text(doc)


def lab_config_text(lab) -> str:
    with open(os.path.join(lab.run_dir, "pep.toml")) as f:
        return f.read()


def reload_with(lab, text: str):
    conf = os.path.join(lab.run_dir, "pep.toml")
    original = lab_config_text(lab)
    with open(conf, "w") as f:
        f.write(text)
    try:
        return lab.pepctl("reload", check=False)
    finally:
        with open(conf, "w") as f:
            f.write(original)


def test_plan_reload_shows_the_steps_and_changes_nothing(lab):
    before = state(lab)
    conf = os.path.join(lab.run_dir, "new.toml")
    with open(conf, "w") as f:
        f.write(new_config(lab, "g2"))
    proc = subprocess.run(lab.argv("proxyhost", PEPCTL, "-c", conf, "plan", "--reload"),
                          capture_output=True, text=True, timeout=60)
    os.unlink(conf)
    assert proc.returncode == 0, proc.stderr
    for graph in ("pep", "g2", "g3"):
        assert f"intercepted ports of graph {graph}: 80, 443 (were all)" in proc.stdout, proc.stdout
        assert f"flags of graph {graph}: " in proc.stdout, proc.stdout
    assert "bypass rules of graph g2: 1 added, 0 removed" in proc.stdout, proc.stdout
    assert "reload HAProxy" in proc.stdout and "haproxy -c" in proc.stdout, proc.stdout
    if lab.interception == "nft":
        assert "replace the nftables table" in proc.stdout, proc.stdout
    assert state(lab) == before, "plan --reload changed the instance"


def test_a_failure_at_any_graph_leaves_every_graph_as_it_was(lab):
    before = state(lab)
    for failing in ("pep", "g2", "g3"):
        proc = reload_with(lab, new_config(lab, failing))
        assert proc.returncode == 1, f"reload with a full bypass_client6 at graph {failing}: exit {proc.returncode}: " \
                                     f"{proc.stdout}{proc.stderr}"
        assert f"bypass rules of graph {failing}" in proc.stderr and "rolled back" in proc.stderr, proc.stderr
        after = state(lab)
        changed = {k: (before[k], after[k]) for k in before if before[k] != after[k]}
        assert not changed, f"a reload that failed at graph {failing} ({lab.interception}) changed: {changed}"
        assert f"intercepted ports of graph {failing}" in proc.stdout, \
            f"the reload failed before graph {failing}'s first steps: nothing to roll back there: {proc.stdout}"


def test_the_same_reload_without_the_full_map_changes_the_graphs(lab):
    before = state(lab)
    proc = reload_with(lab, new_config(lab, None))
    assert proc.returncode == 0 and "reloaded" in proc.stdout, proc.stdout + proc.stderr
    after = state(lab)
    assert after["graphs"] != before["graphs"] and after["intercept_ports"] != before["intercept_ports"] \
        and after["haproxy.cfg"] == before["haproxy.cfg"] and not after["left"], \
        f"a reload to ports 80, 443 did not change what the test compares: {before['intercept_ports']} -> " \
        f"{after['intercept_ports']}"
    proc = reload_with(lab, lab_config_text(lab))
    assert proc.returncode == 0, proc.stderr
    assert state(lab) == before, "reloading the lab's own config again did not give back its state"
