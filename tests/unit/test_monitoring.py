"""The monitoring assets (monitoring/) speak the exporter's language.

How right is told from wrong: Prometheus's own tool (promtool, Debian's `prometheus` package,
installed by scripts/setup) checks the rules and the example config and runs the rules' unit tests,
which fire every alert on made-up series and check a healthy host fires none; and those tests must
fail when a rule is broken on purpose (a threshold moved, a guard removed). Every metric name in
a PromQL expression of the rules and the dashboard must be one pepctl/metrics.py's CATALOGUE
holds (which tests/netns/test_metrics.py checks against what the exporter really serves), with
labels that metric has.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest

from pepctl.metrics import CATALOGUE

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROM = os.path.join(REPO, "monitoring", "prometheus")
RULES = os.path.join(PROM, "pep-rules.yml")
DASHBOARD = os.path.join(REPO, "monitoring", "grafana", "pep-dashboard.json")
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
CHECKED_LABELS = {"graph", "side", "group", "size", "reason", "verdict", "kind", "direction", "event"}


def promtool(*args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("promtool")
    assert exe, "promtool not found: run scripts/setup (it installs Debian's prometheus package)"
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=120, cwd=PROM)


def test_rules_pass_promtool_check():
    r = promtool("check", "rules", RULES)
    assert r.returncode == 0, f"promtool check rules {RULES}:\n{r.stdout}{r.stderr}"


def test_rules_unit_tests_pass():
    r = promtool("test", "rules", "pep-rules.test.yml")
    assert r.returncode == 0, f"promtool test rules pep-rules.test.yml:\n{r.stdout}{r.stderr}"


def test_example_scrape_config_passes_promtool_check():
    r = promtool("check", "config", "prometheus.example.yml")
    assert r.returncode == 0, f"promtool check config prometheus.example.yml:\n{r.stdout}{r.stderr}"


def rule_exprs() -> list[str]:
    """The `expr:` of every rule (YAML read as text: each is one line, or a folded `>-` block)."""
    with open(RULES) as f:
        lines = f.read().splitlines()
    out, i = [], 0
    while i < len(lines):
        m = re.match(r"^(\s*)expr:\s*(.*)$", lines[i])
        if m:
            indent, first = len(m.group(1)), m.group(2)
            if first.startswith(">"):
                block = []
                i += 1
                while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > indent):
                    block.append(lines[i].strip())
                    i += 1
                out.append(" ".join(block))
                continue
            out.append(first)
        i += 1
    return out


def dashboard() -> dict:
    with open(DASHBOARD) as f:
        return json.load(f)


def dashboard_exprs() -> list[str]:
    d = dashboard()
    exprs = [t["expr"] for p in d["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in d["templating"]["list"] if isinstance(v.get("query"), dict)]
    return exprs


def metric_uses(expr: str) -> list[tuple[str, set[str]]]:
    """(metric, labels named in its matchers) for every pep_ metric of a PromQL expression, histogram
    suffixes stripped; recording rules (names with ':') are left out."""
    out = []
    for m in re.finditer(r"(?<![\w:])(pep_[a-z0-9_]+)(\{[^}]*\})?", expr):
        name = m.group(1)
        if name not in CATALOGUE and name.endswith(HISTOGRAM_SUFFIXES):
            name = name.rsplit("_", 1)[0]
        labels = set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", m.group(2) or ""))
        out.append((name, labels))
    return out


def by_labels(expr: str) -> set[str]:
    return {lab.strip() for group in re.findall(r"\bby\s*\(([^)]*)\)", expr) for lab in group.split(",")}


def test_every_rule_expression_is_read():
    """The text reader of rule_exprs() finds one expression per rule, so the checks below see them all."""
    with open(RULES) as f:
        rules = re.findall(r"^\s*- (?:record|alert):", f.read(), re.M)
    exprs = rule_exprs()
    assert len(exprs) == len(rules) and all(exprs), \
        f"{RULES}: expected {len(rules)} expressions (one per rule), got {len(exprs)}: {exprs}"


@pytest.mark.parametrize("where,exprs", [("rules", rule_exprs), ("dashboard", dashboard_exprs)])
def test_every_metric_is_one_the_exporter_serves_with_its_labels(where, exprs):
    found = exprs()
    assert found, f"{where}: no expressions found"
    bad = []
    for expr in found:
        uses = metric_uses(expr)
        for name, labels in uses:
            if name not in CATALOGUE:
                bad.append(f"{name}: not in pepctl/metrics.py ({expr})")
                continue
            has = set(CATALOGUE[name].labels) | {"le", "instance", "job"}
            wrong = (labels & CHECKED_LABELS) - has
            if wrong:
                bad.append(f"{name}{{{', '.join(sorted(wrong))}}}: labels it does not have ({expr})")
        grouped = by_labels(expr) & CHECKED_LABELS
        if uses and "pep:" not in expr and not any(grouped <= set(CATALOGUE[n].labels) | {"le"}
                                                    for n, _ in uses if n in CATALOGUE):
            bad.append(f"by ({', '.join(sorted(grouped))}): no metric of the expression has these labels ({expr})")
    assert not bad, f"{where}:\n" + "\n".join(bad)


def test_dashboard_is_provisionable_and_shows_what_operators_watch():
    d = dashboard()
    assert d["uid"] == "pep-overview" and d["schemaVersion"] >= 30, (d.get("uid"), d.get("schemaVersion"))
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids)), f"panel ids repeat: {ids}"
    for p in d["panels"]:
        if p["type"] != "row":
            assert p.get("datasource") and p.get("targets"), f"panel {p['title']!r}: no data source or no query"
    variables = {v["name"] for v in d["templating"]["list"]}
    assert {"datasource", "instance", "graph"} <= variables, variables
    used = {name for e in dashboard_exprs() for name, _ in metric_uses(e)}
    want = {"pep_failopen", "pep_flows_total", "pep_steer_packets_total", "pep_steer_trunk_packets_total",
            "pep_proxy_sessions", "pep_proxy_errors_total", "pep_tcp_rtt_seconds", "pep_tcp_min_rtt_seconds",
            "pep_tcp_retransmit_ratio", "pep_tcp_delivery_rate_bytes_per_second", "pep_experiment_flows_total",
            "pep_experiment_bytes_total", "pep_radio_queue_delay_seconds", "pep_radio_queue_target_seconds",
            "pep_radio_subscribers_active", "pep_radio_subscriber_rate_mean_bytes_per_second",
            "pep_radio_outages_total"}
    assert want <= used, f"the dashboard does not show {sorted(want - used)}"
    recorded = set(re.findall(r"record:\s*(\S+)", open(RULES).read()))
    from_rules = {n for e in dashboard_exprs() for n in re.findall(r"pep:[a-z0-9_:]+", e)}
    assert from_rules <= recorded, f"the dashboard uses recording rules the rules file lacks: {from_rules - recorded}"


def test_every_alert_is_tested_firing_and_quiet_and_explained():
    with open(RULES) as f:
        alerts = re.findall(r"^\s*- alert:\s*(\S+)", f.read(), re.M)
    with open(os.path.join(PROM, "pep-rules.test.yml")) as f:
        tests = f.read()
    with open(os.path.join(REPO, "monitoring", "README.md")) as f:
        readme = f.read()
    fires = set(re.findall(r"alertname:\s*(\w+)\s*\n\s*exp_alerts:\s*\n\s*- exp_labels", tests))
    quiet = set(re.findall(r"alertname:\s*(\w+)\s*[,\n]\s*exp_alerts:\s*\[\]", tests))
    assert alerts, f"{RULES}: no alerts found"
    assert not set(alerts) - fires, f"pep-rules.test.yml: alerts never expected to fire: {sorted(set(alerts) - fires)}"
    assert not set(alerts) - quiet, f"pep-rules.test.yml: alerts never expected quiet: {sorted(set(alerts) - quiet)}"
    unknown = sorted((fires | quiet) - set(alerts))
    assert not unknown, f"pep-rules.test.yml: tests of alerts the rules do not have: {unknown}"
    missing = [a for a in alerts if f"`{a}`" not in readme]
    assert not missing, f"monitoring/README.md: alerts it does not explain: {missing}"


# Each (alert, text of pep-rules.yml, what it becomes): a broken rule that `promtool test rules` must
# catch, so the rules' tests can fail (a test file that checks nothing would pass them all).
MUTATIONS = [
    ("PepFailOpen", "expr: pep_failopen == 1", "expr: pep_failopen == 0"),
    ("PepFailOpenFlapping", "[15m]) > 4", "[15m]) > 10"),
    ("PepSteeringDropsRising", 'reason=~"drop_.*"', 'reason=~".*"'),
    ("PepProxyErrors", "pep:proxy_errors:rate5m > 1", "pep:proxy_errors:rate5m > 0.01"),
    ("PepProxyQueueing", "expr: pep_proxy_queue > 0", "expr: pep_proxy_queue >= 0"),
    ("PepProxySessionsNearLimit", "> 0.9 and pep_proxy_sessions_limit > 0", "> 0.9"),
    ("PepProxyDown", "expr: pep_proxy_up == 0", "expr: pep_proxy_up == 1"),
    ("PepInstanceDown", 'up{job="pep"} == 0 or pep_up == 0', 'up{job="pep"} == 0'),
    ("PepControlGroupGainLow", '{group="control"} >= 20', '{group="control"} >= 5'),
    ("PepControlGroupGainLow", '10M\\\\+"} < 1', '10M\\\\+"} < 3'),
    ("PepRadioQueueDelayHigh", "(2 * pep_radio_queue_target_seconds)", "(8 * pep_radio_queue_target_seconds)"),
    ("PepRadioQueueDelayHigh", "[10m])) > 1)", "[10m])) > 0)"),
    ("PepOverloadBypass", '{verdict="bypass_overload"} > 0', '{verdict="bypass_overload"} > 1'),
]


@pytest.mark.parametrize("alert,old,new", MUTATIONS, ids=[f"{m[0]}-{i}" for i, m in enumerate(MUTATIONS)])
def test_rules_tests_catch_a_broken_rule(alert, old, new, tmp_path):
    with open(RULES) as f:
        text = f.read()
    assert text.count(old) == 1, f"{RULES}: expected {old!r} once (to break {alert}), found it {text.count(old)} times"
    (tmp_path / "pep-rules.yml").write_text(text.replace(old, new))
    shutil.copy(os.path.join(PROM, "pep-rules.test.yml"), tmp_path)
    exe = shutil.which("promtool")
    assert exe, "promtool not found: run scripts/setup (it installs Debian's prometheus package)"
    r = subprocess.run([exe, "test", "rules", "pep-rules.test.yml"], capture_output=True, text=True, timeout=120,
                       cwd=tmp_path)
    assert r.returncode != 0 and f"alertname: {alert}" in r.stdout + r.stderr, \
        f"promtool test rules with {alert} broken ({old!r} -> {new!r}): expected a failure naming {alert}, " \
        f"got exit {r.returncode}:\n{r.stdout}{r.stderr}"
