"""What is running, read from the live system as JSON (ip -j, tc -j, bpftool -j, stats socket)."""

from __future__ import annotations

import json
import os
import time

from . import haproxy_sock
from .config import Config
from .hostinfo import link_exists
from .plan import graph_names, pin_dir
from .runner import Journal, pid_alive, run
from .steering import REASONS


def netns_exists(name: str) -> bool:
    return os.path.exists(f"/run/netns/{name}")


def read_pid(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def problems(cfg: Config) -> list[str]:
    """What is missing from an instance that claims to be up."""
    found = []
    if not os.path.isdir(pin_dir(cfg)):
        found.append(f"pins {pin_dir(cfg)} missing")
    for g in cfg.graphs:
        n = graph_names(cfg, g)
        if not netns_exists(n.netns):
            found.append(f"namespace {n.netns} missing")
        for dev in (n.c_out, n.s_out):
            if not link_exists(dev):
                found.append(f"link {dev} missing")
        if g.proxy.enabled:
            pid = read_pid(n.haproxy_pid)
            if pid is None or not pid_alive(pid):
                found.append(f"HAProxy of graph {g.name} not running")
            wd = read_pid(os.path.join(n.dir, "watchdog.pid"))
            if wd is None or not pid_alive(wd):
                found.append(f"fail-open watchdog of graph {g.name} not running")
    return found


def _percpu_sum(entry: dict) -> dict[str, int] | int:
    """Sum bpftool's per-CPU values (BTF-formatted) into one."""
    total: dict[str, int] | int = 0
    for v in entry.get("values", entry.get("formatted", {}).get("values", [])):
        value = v["value"]
        if isinstance(value, dict):
            total = total or {}
            for k, x in value.items():
                total[k] = total.get(k, 0) + int(x)
        else:
            total = (total or 0) + int(value)
    return total


def map_lookup(path: str, key: int):
    proc = run(["bpftool", "-j", "map", "lookup", "pinned", path, "key", *[str(b) for b in key.to_bytes(4, "little")]],
               check=False)
    if proc.returncode != 0:
        return None
    data = json.loads(proc.stdout)
    return _percpu_sum(data.get("formatted", data))


def steering_counters(cfg: Config, vid: int) -> dict[str, int]:
    got = map_lookup(f"{pin_dir(cfg)}/maps/vlan_stats", vid)
    return got if isinstance(got, dict) else {}


def reason_counters(cfg: Config) -> dict[str, int]:
    out = {}
    for i, name in enumerate(REASONS):
        got = map_lookup(f"{pin_dir(cfg)}/maps/reason_stats", i)
        out[name] = got if isinstance(got, int) else 0
    return out


def haproxy_report(sock: str) -> dict:
    try:
        rows = haproxy_sock.stats(sock)
    except OSError as e:
        return {"answering": False, "error": str(e)}
    fe = [r for r in rows if r["svname"] == "FRONTEND" and r["pxname"] != "metrics"]
    return {
        "answering": True,
        "sessions_total": sum(int(r["stot"] or 0) for r in fe),
        "sessions_current": sum(int(r["scur"] or 0) for r in fe),
        "bytes_in": sum(int(r["bin"] or 0) for r in fe),
        "bytes_out": sum(int(r["bout"] or 0) for r in fe),
    }


def watchdog_report(n) -> dict:
    from .watchdog import read_state
    st = read_state(n)
    pid = read_pid(os.path.join(n.dir, "watchdog.pid"))
    last = st.get("last_switch")
    return {"mode": st.get("mode", "unknown"), "watchdog_running": bool(pid and pid_alive(pid)),
            "last_switch": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(last)) if last else None,
            "last_reason": st.get("reason"), "switches": st.get("switches", 0), "restarts": st.get("restarts", 0)}


def bypass_report(cfg: Config, g) -> dict:
    from .bypass import counters
    try:
        return counters(cfg, g)
    except OSError as e:
        return {"error": str(e)}


def collect(cfg: Config, journal_path: str) -> dict:
    journal = Journal(journal_path)
    report = {"instance": cfg.host.instance, "nic": cfg.host.nic, "graphs": []}
    if not journal.exists:
        report["state"] = "down"
        return report
    bad = problems(cfg)
    report["state"] = "up" if journal.data.get("complete") and not bad else "damaged"
    report["problems"] = bad
    for g in cfg.graphs:
        n = graph_names(cfg, g)
        entry = {
            "name": g.name, "netns": n.netns, "access_vlan": g.access.vlan, "origin_vlan": g.origin.vlan,
            "ports": {"access": n.c_out, "origin": n.s_out},
            "steering": {"access": steering_counters(cfg, g.access.vlan),
                         "origin": steering_counters(cfg, g.origin.vlan)},
            "proxy": {"enabled": g.proxy.enabled, "interception": g.proxy.interception},
        }
        if g.proxy.enabled:
            pid = read_pid(n.haproxy_pid)
            entry["proxy"].update({"pid": pid, "running": bool(pid and pid_alive(pid))})
            entry["proxy"].update(haproxy_report(n.haproxy_sock))
            entry["failopen"] = watchdog_report(n)
            entry["flows"] = bypass_report(cfg, g)
        report["graphs"].append(entry)
    report["drops_and_passes"] = reason_counters(cfg)
    return report


def print_table(report: dict, out) -> None:
    print(f"instance {report['instance']} on {report['nic']}: {report['state']}", file=out)
    for p in report.get("problems", []):
        print(f"  problem: {p}", file=out)
    if not report["graphs"]:
        return
    print(f"  {'graph':<10} {'vlan':>9} {'dir':<7} {'to pep pkts':>12} {'bytes':>14} "
          f"{'to nic pkts':>12} {'bytes':>14}", file=out)
    for g in report["graphs"]:
        for side, vid in (("access", g["access_vlan"]), ("origin", g["origin_vlan"])):
            c = g["steering"][side]
            print(f"  {g['name']:<10} {vid:>9} {side:<7} {c.get('in_packets', 0):>12} {c.get('in_bytes', 0):>14} "
                  f"{c.get('out_packets', 0):>12} {c.get('out_bytes', 0):>14}", file=out)
        p = g["proxy"]
        if p["enabled"]:
            state = "running" if p.get("running") else "NOT RUNNING"
            print(f"  {g['name']:<10} haproxy pid {p.get('pid')} {state}, {p['interception']} interception, "
                  f"sessions {p.get('sessions_current', '?')} now / {p.get('sessions_total', '?')} total",
                  file=out)
            w, f = g["failopen"], g["flows"]
            mode = "PROXY" if w["mode"] == "proxy" else f"FAIL-OPEN ({w['last_reason']})" \
                if w["mode"] == "failopen" else w["mode"]
            print(f"  {g['name']:<10} mode {mode}, last switch {w['last_switch'] or 'never'}, "
                  f"watchdog {'running' if w['watchdog_running'] else 'NOT RUNNING'}", file=out)
            if "error" not in f:
                print(f"  {g['name']:<10} flows proxied {f.get('flows_proxied', 0)}, bypassed by rule "
                      f"{f.get('flows_bypass_rule', 0)}, by fail-open {f.get('flows_bypass_failopen', 0)}", file=out)
        else:
            print(f"  {g['name']:<10} proxy disabled: the namespace routes only", file=out)
    reasons = report.get("drops_and_passes", {})
    if any(reasons.values()):
        print("  trunk: " + ", ".join(f"{k} {v}" for k, v in reasons.items() if v), file=out)
