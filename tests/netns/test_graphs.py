"""Many graphs, one proxy: the lab with 16 graphs on its proxy host.

   client -- switch ==trunk== proxyhost: nic0 -- graph "pep" (VLANs 100/200, the lab's hosts)
                                              -- graphs g2..g16 (VLANs 300/301 ..., no hosts)
                              one HAProxy (user pep) serves all 16, from the proxyhost namespace

How right is told from wrong: the instance must run one HAProxy and one supervisor whatever the
number of graphs, with a frontend per graph in HAProxy's own stats and a listener in every
graph's namespace (sock_diag, as `status` reads it); a reload that changes graph g2 (its
maxconn, which HAProxy's stats then show) must not cost one transaction of a load running on
graph "pep" meanwhile (wrk counts socket errors and non-2xx answers).
"""

from __future__ import annotations

import json
import os
import re

from haproxy import stats
from pepctl import nsutil

LAB_OPTIONS = ["--graphs", "16"]
GRAPHS = ["pep", *(f"g{i}" for i in range(2, 17))]


def pep_status(lab) -> dict:
    return json.loads(lab.pepctl("status", "--json").stdout)


def haproxy_sock(lab) -> str:
    return lab.config().instance_names().haproxy_sock


def test_one_proxy_serves_every_graph(lab):
    st = pep_status(lab)
    assert st["state"] == "up", st.get("problems")
    assert [g["name"] for g in st["graphs"]] == GRAPHS
    modes = {g["name"]: g["proxy"]["mode"] for g in st["graphs"]}
    assert set(modes.values()) == {"proxy"}, f"every graph's new flows should be proxied: {modes}"
    procs = st["proxy"]
    assert procs["haproxy"]["running"] and procs["supervisor"]["running"], procs
    frontends = sorted(r["pxname"] for r in stats.stats(haproxy_sock(lab)) if r["svname"] == "FRONTEND")
    want = sorted(f"graph_{g}" for g in GRAPHS)
    assert frontends == want, f"HAProxy frontends: expected {want}, got {frontends}"
    for g in GRAPHS:
        ports = nsutil.listening_ports(f"pl{lab.rid}-{g}")
        assert 50080 in ports, f"graph {g}: no listener on 50080 in its namespace (listening: {sorted(ports)})"


def test_reload_changing_one_graph_loses_no_transaction_on_another(lab):
    conf = os.path.join(lab.run_dir, "pep.toml")
    with open(conf) as f:
        original = f.read()
    # g2's [graph.proxy] is the second one in the file: give it a maxconn of its own.
    first = original.index("[graph.proxy]")
    second = original.index("[graph.proxy]", first + 1)
    changed = original[:second] + "[graph.proxy]\nmaxconn = 77\n" + original[second + len("[graph.proxy]\n"):]
    out, slim = lab.reload_under_load(
        [changed, original, changed], seconds=5, pause=0.7,
        inspect=lambda: {r["pxname"]: r["slim"] for r in stats.stats(haproxy_sock(lab)) if r["svname"] == "FRONTEND"})
    assert slim["graph_g2"] == "77", f"graph g2's maxconn after the reload: expected 77, got {slim['graph_g2']}"
    assert slim["graph_pep"] != "77", f"graph pep's maxconn changed too: {slim['graph_pep']}"
    done = int(re.search(r"(\d+) requests in", out).group(1))
    assert done > 100, f"wrk made only {done} requests: {out}"
    assert "Socket errors" not in out and "Non-2xx" not in out, f"graph pep lost transactions:\n{out}"
