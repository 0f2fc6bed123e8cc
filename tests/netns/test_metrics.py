"""The metrics endpoint and the control group, on the lab with the experiment on.

   client 198.18.0.10 + CONTROL (a control-group subscriber) + TREATED (a treated one)
   switch == nic0 [proxyhost: HAProxy, exporter 127.0.0.1:9101 (pepctl/exporter.py)]
      == c_in [pep: flow_ingress: control group? BYPASS_CONTROL : PROXY; both measured] s_in
      == origin nginx 198.19.0.10:80

How right is told from wrong: the exporter's own text, scraped where the host's monitoring
scrapes it, must hold exactly pepctl/metrics.py's names, and the figures the datapath and HAProxy
really have (a download from each group moves its verdict's counter; a live proxied connection
appears in both sides' TCP histograms). The control group is computed here independently
(pepctl/experiment.py, itself checked against the header's hash), and each download's record in
the experiment log must carry that group and the object's size.
"""

from __future__ import annotations

import json
import os
import re
import signal

from netns.addresses import ACCESS_GW4, ORIGIN4
from netns.handle import metric_value
from pepctl import config as configmod
from pepctl import experiment
from pepctl.metrics import CATALOGUE
from pepctl.runner import StepError, wait_for

FRACTION = 0.5
LAB_OPTIONS = ["--control-fraction", str(FRACTION)]
CANDIDATES = [f"198.18.0.{i}" for i in range(60, 120)]
CONTROL = next(a for a in CANDIDATES if experiment.group_of(a, FRACTION) == "control")
TREATED = next(a for a in CANDIDATES if experiment.group_of(a, FRACTION) == "treated")
MB = 1 << 20


def lab_setup(handle) -> None:
    for addr in (CONTROL, TREATED):
        handle.run("client", "ip", "addr", "add", f"{addr}/24", "dev", "eth0")


def download(lab, source: str, obj: str) -> None:
    lab.run("client", "curl", "-sS", "-m", "20", "-o", "/dev/null", "--interface", source, f"http://{ORIGIN4}/{obj}")


def test_exporter_serves_exactly_the_catalogue(lab):
    text = lab.scrape_metrics()
    helped = set(re.findall(r"^# HELP (\S+) ", text, re.M))
    typed = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    assert helped == set(CATALOGUE), \
        f"proxyhost exporter: expected {sorted(CATALOGUE)}, missing {sorted(set(CATALOGUE) - helped)}, " \
        f"extra {sorted(helped - set(CATALOGUE))}"
    assert typed == {n: m.type for n, m in CATALOGUE.items()}, typed
    assert metric_value(text, "pep_up") == 1, "pep_up: expected 1 (the lab's instance is up)"
    for side in ("access", "origin"):
        for direction in ("in", "out"):
            got = metric_value(text, "pep_steer_packets_total", graph="pep", side=side, direction=direction)
            assert got is not None, \
                f"pep_steer_packets_total graph=pep side={side} direction={direction}: no sample"


def test_each_group_gets_its_verdict_and_the_endpoint_sees_it(lab):
    before = lab.scrape_metrics()
    download(lab, CONTROL, "100k")
    download(lab, TREATED, "100k")

    def moved():
        text = lab.scrape_metrics()
        got = {v: (metric_value(text, "pep_flows_total", graph="pep", verdict=v) or 0)
               - (metric_value(before, "pep_flows_total", graph="pep", verdict=v) or 0)
               for v in ("bypass_control", "proxied")}
        return got if got["bypass_control"] >= 1 and got["proxied"] >= 1 else None
    wait_for(moved, timeout=10, what=f"pep_flows_total: bypass_control (from {CONTROL}) and proxied (from "
                                       f"{TREATED}) to move")
    def with_failopen():
        text = lab.scrape_metrics()
        return text if metric_value(text, "pep_failopen", graph="pep") is not None else None
    text = wait_for(with_failopen, timeout=5, what="pep_failopen of graph pep")
    assert metric_value(text, "pep_failopen", graph="pep") == 0, "pep_failopen graph=pep: expected 0 (HAProxy is up)"
    assert metric_value(text, "pep_proxy_up") == 1
    assert metric_value(text, "pep_experiment_control_fraction", graph="pep") == FRACTION


def test_experiment_records_each_flow_with_its_group_and_size(lab):
    cfg = configmod.load(os.path.join(lab.run_dir, "pep.toml"))
    log = cfg.instance_names().experiment_log
    for source in (CONTROL, TREATED):
        download(lab, source, "1m")

    def records():
        try:
            with open(log) as f:
                rows = [json.loads(line) for line in f if line.strip()]
        except FileNotFoundError:
            return None
        mine = {r["client"]: r for r in rows if r["client"] in (CONTROL, TREATED) and r["bytes_down"] >= MB}
        return mine if len(mine) == 2 else None
    got = wait_for(records, timeout=10, what=f"records of the 1 MB downloads from {CONTROL} and {TREATED} in {log}")
    assert {c: r["group"] for c, r in got.items()} == {CONTROL: "control", TREATED: "treated"}, got
    for r in got.values():
        # the response: the object, its headers, and the FIN's sequence number
        assert MB <= r["bytes_down"] < MB + 1024, \
            f"{r['client']}: bytes_down {r['bytes_down']}, expected 1 MB and the headers"
        assert 50 < r["bytes_up"] < 1024, f"{r['client']}: bytes_up {r['bytes_up']}: expected one GET request"
        assert 0 < r["seconds"] < 20, r
    text = lab.scrape_metrics()
    for group in ("control", "treated"):
        assert (metric_value(text, "pep_experiment_flows_total", graph="pep", group=group, size="1M-10M") or 0) >= 1, \
            f"pep_experiment_flows_total group={group} size=1M-10M: expected >= 1"
    rep = lab.pepctl("report", "--json", "/dev/stdout")
    assert "control" in rep.stdout and "treated" in rep.stdout, rep.stdout[-1500:]


def test_tcp_health_of_both_sides_is_sampled(lab):
    """A live proxied download: the sampler sees its socket toward the subscriber and toward the origin."""
    slow = lab.popen("client", "curl", "-sS", "-o", "/dev/null", "-w", "%{http_code} %{size_download}", "-m", "15",
                     "--limit-rate", "300k", "--interface", TREATED, f"http://{ORIGIN4}/50m")
    try:
        def both_sides():
            text = lab.scrape_metrics()
            got = {side: metric_value(text, "pep_tcp_rtt_seconds_count", graph="pep", side=side) or 0
                   for side in ("access", "origin")}
            return got if all(got.values()) else None
        try:
            got = wait_for(both_sides, timeout=14, interval=0.5,
                           what="pep_tcp_rtt_seconds_count for sides access and origin of graph pep")
        except StepError as e:
            seen = [ln for ln in lab.scrape_metrics().splitlines()
                    if ln.startswith(("pep_tcp_sampled", "pep_proxy_sessions"))]
            raise AssertionError(f"{e}; the download: {slow.poll() if slow.poll() is None else slow.communicate()}; "
                                 f"the exporter: {seen}") from None
    finally:
        slow.kill()
        slow.wait()
    assert all(v >= 1 for v in got.values()), got


def test_failopen_and_its_switches_are_seen(lab):
    """HAProxy killed while its supervisor is held (SIGSTOP): the endpoint says the graph fails open;
    released, the supervisor restarts HAProxy and the endpoint says proxy again, two switches later."""
    st = json.loads(lab.pepctl("status", "--json").stdout)["proxy"]
    before = metric_value(lab.scrape_metrics(), "pep_failopen_switches_total", graph="pep")
    held = [st["keeper"]["pid"], st["supervisor"]["pid"]]
    for pid in held:
        os.kill(pid, signal.SIGSTOP)
    try:
        os.kill(st["haproxy"]["pid"], signal.SIGKILL)
        wait_for(lambda: metric_value(lab.scrape_metrics(), "pep_failopen", graph="pep") == 1, timeout=5,
                 interval=0.2, what="pep_failopen{graph=pep} 1 with HAProxy killed")
    finally:
        for pid in reversed(held):
            os.kill(pid, signal.SIGCONT)
    wait_for(lambda: metric_value(lab.scrape_metrics(), "pep_failopen", graph="pep") == 0, timeout=10, interval=0.2,
             what="pep_failopen{graph=pep} 0 once the supervisor restarted HAProxy")
    after = metric_value(lab.scrape_metrics(), "pep_failopen_switches_total", graph="pep")
    assert after - before == 2, f"pep_failopen_switches_total graph=pep: expected +2, got {before} -> {after}"


def test_endpoint_is_not_reachable_from_a_data_vlan(lab):
    """A subscriber trying the exporter's port on the PEP's address gets nothing."""
    proc = lab.run("client", "curl", "-sS", "-m", "3", f"http://{ACCESS_GW4}:9101/metrics", check=False)
    assert proc.returncode != 0 and "pep_" not in proc.stdout, \
        f"client: curl http://{ACCESS_GW4}:9101/metrics answered: {proc.stdout[:200]!r}"
