"""A real Prometheus scrapes the lab's endpoint, and its HTTP API is asked what it saw.

   client 198.18.0.10 -- switch ==trunk== proxyhost: nic0 -- graph "pep" (VLANs 100/200) -- origin 198.19.0.10
                                                         -- graph "g2"  (no hosts)
                          in proxyhost: exporter 127.0.0.1:9101 <-- prometheus 127.0.0.1:PORT (this test's)

Prometheus (Debian's package, started by the test in the proxy host's namespace, where the host's
monitoring would scrape, with a scrape interval of one second and the repo's rules file) stands for
the operator's monitoring. How right is told from wrong: its query API, not the exporter's text, must
hold every graph's steering counters for both sides and directions, flows proxied by graph "pep", and
both sides' RTT histograms while a slow download keeps a proxied connection open; every rule of
monitoring/prometheus/pep-rules.yml must load and evaluate with health "ok"; and `promtool check
metrics` must find nothing to say about the exporter's text.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.parse

import pytest

from netns.addresses import ORIGIN_URL4
from netns.handle import REPO
from pepctl.runner import stop_child, wait_for

LAB_OPTIONS = ["--graphs", "2"]
GRAPHS = ("pep", "g2")
EXPORTER = "127.0.0.1:9101"
ORIGIN = ORIGIN_URL4
RULES = os.path.join(REPO, "monitoring", "prometheus", "pep-rules.yml")
NODE = "proxyhost"


def free_port(lab) -> int:
    """A TCP port nothing listens on in the proxy host's namespace (the kernel picks it)."""
    out = lab.run(NODE, "python3", "-c", "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); "
                  "print(s.getsockname()[1])").stdout
    return int(out)


class Prometheus:
    def __init__(self, lab, port: int):
        self.lab, self.base = lab, f"http://127.0.0.1:{port}"

    def get(self, path: str) -> dict:
        proc = self.lab.run(NODE, "curl", "-sS", "-m", "5", f"{self.base}{path}", check=False)
        assert proc.returncode == 0, f"{NODE}: curl {self.base}{path}: exit {proc.returncode}: {proc.stderr.strip()}"
        got = json.loads(proc.stdout)
        assert got["status"] == "success", f"{NODE}: prometheus {path}: expected status success, got {got}"
        return got["data"]

    def query(self, q: str) -> list[dict]:
        return self.get(f"/api/v1/query?query={urllib.parse.quote(q)}")["result"]

    def ready(self) -> bool:
        return self.lab.run(NODE, "curl", "-sf", "-m", "2", f"{self.base}/-/ready", check=False).returncode == 0


@pytest.fixture(scope="module")
def prometheus(lab, tmp_path_factory):
    exe = shutil.which("prometheus")
    assert exe, "prometheus not found: run scripts/setup (it installs Debian's prometheus package)"
    d = tmp_path_factory.mktemp("prom")
    config = d / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"rule_files: [{json.dumps(RULES)}]\n"
        "scrape_configs:\n"
        f"  - {{job_name: pep, static_configs: [{{targets: [{json.dumps(EXPORTER)}]}}]}}\n")
    port = free_port(lab)
    log_path = d / "prometheus.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(lab.argv(NODE, exe, f"--config.file={config}", f"--storage.tsdb.path={d / 'data'}",
                                         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"),
                                stdout=log, stderr=subprocess.STDOUT)
    try:
        prom = Prometheus(lab, port)
        wait_for(lambda: proc.poll() is not None or prom.ready(), timeout=30, interval=0.2,
                 what=f"{NODE}: prometheus answering {prom.base}/-/ready")
        assert proc.poll() is None, \
            f"{NODE}: prometheus exited {proc.returncode}:\n{log_path.read_text()[-2000:]}"
        yield prom
    finally:
        # `ip netns exec` execs prometheus, so this PID (the one this test started) is prometheus.
        stop_child(proc, timeout=20)


def test_prometheus_sees_every_graphs_steering_and_proxied_flows(lab, prometheus):
    for _ in range(3):
        lab.run("client", "curl", "-sS", "-m", "5", "-o", "/dev/null", f"{ORIGIN}/")
    want = {(g, side, d) for g in GRAPHS for side in ("access", "origin") for d in ("in", "out")}

    def steering():
        got = {(r["metric"]["graph"], r["metric"]["side"], r["metric"]["direction"])
               for r in prometheus.query("pep_steer_packets_total")}
        return want <= got
    wait_for(steering, timeout=20, interval=0.5,
             what=f"{NODE}: prometheus holding pep_steer_packets_total for (graph, side, direction) {sorted(want)}")

    def proxied():
        return prometheus.query('pep_flows_total{graph="pep", verdict="proxied"} > 0')
    wait_for(proxied, timeout=10, interval=0.5,
             what=f'{NODE}: prometheus: pep_flows_total{{graph="pep", verdict="proxied"}} expected > 0')

    def failopen():
        got = {r["metric"]["graph"]: r["value"][1] for r in prometheus.query("pep_failopen")}
        return got if set(got) == set(GRAPHS) else None
    got = wait_for(failopen, timeout=10, interval=0.5, what=f"{NODE}: prometheus: pep_failopen for {GRAPHS}")
    want_fo = {g: "0" for g in GRAPHS}
    assert got == want_fo, f"{NODE}: prometheus pep_failopen: expected {want_fo}, got {got}"


def test_prometheus_sees_both_sides_rtt_histograms_of_a_live_download(lab, prometheus):
    # The sampler reads the proxy's established sockets every few seconds: keep a pair open with a
    # slow download. 50 MB, not 10: socket buffers on the way (several MB each) would take in all of
    # 10 MB at once, and the origin side would close (the access side leaving ESTABLISHED for
    # FIN_WAIT1) within a second, between two sampling rounds.
    slow = lab.popen("client", "curl", "-s", "-o", "/dev/null", "-m", "20", "--limit-rate", "300k", f"{ORIGIN}/50m")
    try:
        def sides():
            got = {r["metric"]["side"] for r in prometheus.query(
                'sum by (side) (pep_tcp_rtt_seconds_bucket{graph="pep", le="+Inf"}) > 0')}
            return got if got == {"access", "origin"} else None
        wait_for(sides, timeout=18, interval=0.5,
                 what=f'{NODE}: prometheus: pep_tcp_rtt_seconds_bucket{{graph="pep"}} > 0 '
                 "for sides access and origin")
        got = {r["metric"]["side"] for r in prometheus.query('pep_tcp_min_rtt_seconds_count{graph="pep"} > 0')}
        assert got == {"access", "origin"}, \
            f'{NODE}: prometheus: pep_tcp_min_rtt_seconds_count{{graph="pep"}} > 0: ' \
            f"expected sides access and origin, got {sorted(got)}"
    finally:
        slow.kill()   # the curl this test started, by its PID
        slow.wait()


def test_rules_load_and_evaluate_healthy(prometheus):
    with open(RULES) as f:
        text = f.read()
    want = {line.split(":", 1)[1].strip() for line in text.splitlines()
            if line.strip().startswith(("- record:", "- alert:"))}

    def evaluated():
        rules = [r for g in prometheus.get("/api/v1/rules")["groups"] for r in g["rules"]]
        return rules if {r["name"] for r in rules} == want and all(r["health"] != "unknown" for r in rules) else None
    rules = wait_for(evaluated, timeout=20, interval=0.5,
                     what=f"{NODE}: prometheus: every rule of {RULES} loaded and evaluated once")
    bad = [(r["name"], r["health"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    assert not bad, f"{NODE}: prometheus rules: expected health ok for all, got {bad}"


def test_promtool_finds_nothing_wrong_in_the_exposition(lab):
    proc = lab.run(NODE, "curl", "-sS", "-m", "5", f"http://{EXPORTER}/metrics", check=False)
    assert proc.returncode == 0, f"{NODE}: curl http://{EXPORTER}/metrics: exit {proc.returncode}: {proc.stderr}"
    exe = shutil.which("promtool")
    assert exe, "promtool not found: run scripts/setup (it installs Debian's prometheus package)"
    r = subprocess.run([exe, "check", "metrics"], input=proc.stdout, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and not (r.stdout + r.stderr).strip(), \
        f"{NODE}: promtool check metrics on the exporter's text: expected exit 0 and nothing said, " \
        f"got exit {r.returncode}:\n{r.stdout}{r.stderr}"
