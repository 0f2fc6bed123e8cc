"""What is running, read from the live system: the maps through bpf(2), the processes by their
recorded PIDs, HAProxy through its stats socket, the listeners through sock_diag.

What new flows of a graph get is not a stored flag: the datapath proxies a new flow when the
graph's listener exists and forwards it (fail-open) when it does not (tc/pep_flow.h). So status
asks the kernel whether the listener exists, in the graph's namespace, and says "proxy" or
"fail-open" from that, the same fact the datapath decides by.

An instance that another pepctl brought up and this one has not taken over (pepctl/upgrade.py)
is reported with what does not depend on the maps' layouts (processes, listeners, HAProxy): the
counters are read by this pepctl's layouts, which may not be the running datapath's, and the
config means what this version makes of it. `upgrade` says why and what to do.

A graph whose access side runs pep_radio gets one more line, from its radio_stats entry
(pepctl/radio_maps.py): subscribers active in the last complete epoch and their mean estimated
rate, the queueing delay held (mean and p95 of every control window since the graph's first
socket), outages and warm starts.
"""

from __future__ import annotations

import os
import socket
import time

from haproxy import stats

from . import bypass, congestion, drain, flow_maps, nsutil, radio_maps, service, steering, upgrade
from .config import Config, Graph
from .names import congestion_pins, netns_path
from .runner import Journal, StepError, run_json

# The format of `status --json` ("format"): 1, before the key existed; 2, with it, "upgrade", and the
# connections flow_conns counts.
STATUS_FORMAT = 2


def problems(cfg: Config, outdated: bool = False) -> list[str]:
    """What is missing from an instance that claims to be up (outdated: one that another pepctl brought
    up, whose congestion controls are those of its own reading of the config)."""
    n = cfg.instance_names()
    found = []
    if os.path.exists(n.upgrade_journal):
        found.append("an `upgrade` was cut short: `pepctl upgrade` finishes it (or rolls it back and upgrades again); "
                     "`pepctl down` rolls it back and takes the instance down")
    if not os.path.isdir(n.pins):
        found.append(f"pins {n.pins} missing")
    links = {name for _, name in socket.if_nameindex()}
    for g in cfg.graphs:
        gn = cfg.graph_names(g)
        if not os.path.exists(netns_path(gn.netns)):
            found.append(f"namespace {gn.netns} missing")
        found += [f"link {dev} missing" for dev in (gn.c_out, gn.s_out) if dev not in links]
        if g.proxy.enabled and g.proxy.interception == "bpf" and os.path.exists(netns_path(gn.netns)):
            # One bound to another device (FRR's bfdd's, which up binds to lo) sees none of the graph's traffic.
            seen = (0, gn.c_in_ifindex, gn.s_in_ifindex)
            found += [f"graph {g.name}: an {p['family']} packet socket is open in {gn.netns}, held by {p['held_by']}: "
                      "the kernel drops the socket the tc program gives each new flow, and resets the flow; close it "
                      "(tcpdump is harmless), bind it to lo, or use interception nft"
                      for p in nsutil.ip_packet_sockets(gn.netns) if p["ifindex"] in seen]
    for cc in congestion.used(cfg) if not outdated else ():
        try:
            state = congestion.registration(cc)
        except OSError as e:
            state = f"unknown ({e})"
        if state != "pepctl":
            found.append(f"congestion control {cc} is not registered by pepctl ({state}): routes that name it "
                         "give new connections the kernel's default instead")
    if any(g.proxy.enabled for g in cfg.graphs):
        procs = service.processes(n)
        if not procs["haproxy"]["running"]:
            found.append("HAProxy not running (new flows fail open)")
        if not procs["supervisor"]["running"]:
            found.append("the proxy supervisor is not running (nothing would restart HAProxy)")
    return found


def listen_ports(g: Graph) -> set[int]:
    """The ports the graph's listeners bind: listen_port (bpf, nft), or each intercepted port (route)."""
    if g.proxy.one_listener:
        return {g.proxy.listen_port}
    return {p for lo, hi in g.proxy.ports or () for p in range(lo, hi + 1)}


def graph_mode(cfg: Config, g: Graph) -> dict:
    """What new flows of the graph get now, from the listeners the kernel has in its namespace."""
    want = listen_ports(g)
    try:
        have = nsutil.listening_ports(cfg.graph_names(g).netns) & want
    except OSError as e:
        return {"mode": "unknown", "why": str(e)}
    if have == want:
        return {"mode": "proxy", "why": f"HAProxy listens on {_ports_text(want)}"}
    missing = want - have
    return {"mode": "fail-open", "why": f"no listener on {_ports_text(missing)}: new flows are forwarded"}


def _ports_text(ports: set[int]) -> str:
    s = sorted(ports)
    return ", ".join(map(str, s[:5])) + (f" and {len(s) - 5} more" if len(s) > 5 else "")


def haproxy_report(sock: str) -> dict:
    """Per-proxy rows of HAProxy's `show stat`: {proxy name: sessions and bytes}."""
    try:
        rows = stats.stats(sock)
    except OSError as e:
        return {"error": str(e)}
    out = {}
    for r in rows:
        if r["svname"] == "FRONTEND":
            out[r["pxname"]] = {"sessions_current": int(r["scur"] or 0), "sessions_total": int(r["stot"] or 0),
                                "sessions_limit": int(r["slim"] or 0), "bytes_in": int(r["bin"] or 0),
                                "bytes_out": int(r["bout"] or 0), "denied": int(r["dreq"] or 0),
                                "errors": int(r["ereq"] or 0)}
    return out


def _when(t: float | None) -> str | None:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t)) if t else None


def connections(pins: str, slot: int) -> dict:
    """The graph's connections as the datapath counts them (flow_conns), against the limits at which
    its new flows go end to end (tc/pep_flow.h, step 4b)."""
    maxconn, host_maxconn = flow_maps.read_limits(pins, slot)
    return {"graph": flow_maps.read_conns(pins, slot), "graph_maxconn": maxconn,
            "instance": flow_maps.read_conns(pins), "instance_maxconn": host_maxconn}


def collect(cfg: Config) -> dict:
    n = cfg.instance_names()
    journal = Journal(n.journal)
    report: dict = {"format": STATUS_FORMAT, "instance": cfg.host.instance, "nic": cfg.host.nic, "graphs": []}
    if not journal.exists:
        report["state"] = "down"
        return report
    why = upgrade.outdated(cfg, journal)
    if why is None and journal.complete and journal.meta.get("build") != upgrade.build_digest(cfg):
        report["upgrade"] = {"required": False, "why": "this pepctl's code differs from the one that brought the "
                                                       "instance up: `pepctl upgrade` restarts its processes with it"}
    elif why is not None:
        report["upgrade"] = {"required": True, "why": why + ("" if journal.format > upgrade.JOURNAL_FORMAT else
                                                             ": `pepctl upgrade` takes it over in place")}
    bad = problems(cfg, why is not None)
    report["state"] = "up" if journal.complete and not bad else ("starting" if not journal.complete else "damaged")
    report["problems"] = bad
    any_proxy = any(g.proxy.enabled for g in cfg.graphs)
    if any_proxy:
        procs = service.processes(n)
        if procs.get("last_exit"):
            procs["last_exit"] = {**procs["last_exit"], "at": _when(procs["last_exit"].get("at"))}
        report["proxy"] = procs
        hap = haproxy_report(n.haproxy_sock)
    layout = (lambda fn, *args: {"error": "not read before `pepctl upgrade` (their layout may differ)"}) if why \
        else _safe
    for g in cfg.graphs:
        gn = cfg.graph_names(g)
        entry: dict = {
            "name": g.name, "slot": gn.slot, "netns": gn.netns,
            "access_vlan": g.access.vlan, "origin_vlan": g.origin.vlan,
            "ports": {"access": gn.c_out, "origin": gn.s_out},
            "steering": {side: layout(steering.vlan_counters, n.steer_pins, vid)
                         for side, vid in (("access", g.access.vlan), ("origin", g.origin.vlan))},
            "proxy": {"enabled": g.proxy.enabled, "interception": g.proxy.interception},
        }
        if g.proxy.enabled:
            entry["proxy"].update(graph_mode(cfg, g))
            entry["proxy"]["haproxy"] = hap.get(gn.proxy, {}) if "error" not in hap else hap
            entry["flows"] = layout(bypass.counters, cfg, g)
            entry["connections"] = layout(connections, n.flow_pins, gn.slot)
            entry["experiment"] = {"control_fraction": g.experiment.control_fraction, "seed": g.experiment.seed}
        entry["congestion"] = {"access": g.access.congestion, "origin": g.origin.congestion}
        if g.access.congestion == radio_maps.NAME and not why:
            entry["radio"] = _safe(radio_report, g, gn.netns)
        report["graphs"].append(entry)
    if cfg.routing is not None:
        report["routing"] = _safe(drain.report, cfg)
        daemons = report["routing"].get("daemons", {})
        report["problems"] += [f"FRR's {d} is not running (pid {x['pid']})" for d, x in daemons.items()
                               if not x["running"]]
        if report["problems"] and report["state"] == "up":
            report["state"] = "damaged"
    report["trunk"] = {"nic": _safe(nic_counters, cfg.host.nic),
                       "reasons": layout(steering.reason_counters, n.steer_pins)}
    return report


def radio_report(g: Graph, netns: str) -> dict:
    """pep_radio in a graph: what its statistics say since the graph's first socket."""
    st = radio_maps.read_stats(congestion_pins(radio_maps.NAME), netns_path(netns))
    if st is None:
        st = radio_maps.STATS.zero()   # no socket yet
    active, rate = radio_maps.active(st)
    qdelay = radio_maps.buckets(radio_maps.QDELAY_BOUNDS_US, st["qdelay_bucket"], 1e6)
    return {"queue_target_seconds": g.access.queue_target_ms / 1000, "subscribers_active": active,
            "rate_mean_bytes_per_second": rate, "control_windows": st["windows"],
            "queue_delay_mean_seconds": st["qdelay_sum_us"] / 1e6 / st["windows"] if st["windows"] else None,
            "queue_delay_p95_seconds": radio_maps.quantile(0.95, qdelay),
            "outages": st["outages"], "outage_seconds": st["outage_us"] / 1e6, "flows_started": st["flows_started"],
            "flows_warm": st["flows_warm"], "subscribers_new": st["subscribers_new"]}


def nic_counters(nic: str) -> dict[str, int]:
    """What the NIC received, and what the kernel dropped before tc saw it (ip -s -s link)."""
    rx = run_json(["ip", "-j", "-s", "-s", "link", "show", "dev", nic])[0]["stats64"]["rx"]
    return {k: rx.get(k, 0) for k in ("packets", "bytes", "dropped", "errors", "length_errors", "crc_errors",
                                      "frame_errors", "over_errors", "fifo_errors", "missed_errors")}


def _safe(fn, *args) -> dict:
    try:
        return fn(*args)
    except (OSError, ValueError, StepError) as e:
        return {"error": str(e)}


def print_table(report: dict, out) -> None:
    print(f"instance {report['instance']} on {report['nic']}: {report['state']}", file=out)
    for p in report.get("problems", []):
        print(f"  problem: {p}", file=out)
    if report.get("upgrade"):
        u = report["upgrade"]
        print(f"  upgrade {'needed' if u['required'] else 'available'}: {u['why']}", file=out)
    proxy = report.get("proxy")
    if proxy:
        h = proxy["haproxy"]
        sup = proxy["supervisor"]
        print(f"  HAProxy pid {h['pid']} {'running' if h['running'] else 'NOT RUNNING'}"
              f"{', finishing old connections: ' + str(h['draining']) if h['draining'] else ''}; "
              f"supervisor pid {sup['pid']} {'running' if sup['running'] else 'NOT RUNNING'}; "
              f"restarts {proxy['restarts']}" + (f", last exit {proxy['last_exit']['at']}"
                                                 if proxy["last_exit"] else ""), file=out)
    if not report["graphs"]:
        return
    print(f"  {'graph':<12} {'vlan':>5} {'side':<7} {'to pep pkts':>12} {'bytes':>14} "
          f"{'to nic pkts':>12} {'bytes':>14}", file=out)
    for g in report["graphs"]:
        for side, vid in (("access", g["access_vlan"]), ("origin", g["origin_vlan"])):
            c = g["steering"][side]
            if "error" in c:
                print(f"  {g['name']:<12} {vid:>5} {side:<7} counters {c['error'][:60]}", file=out)
                continue
            print(f"  {g['name']:<12} {vid:>5} {side:<7} {c.get('in_packets', 0):>12} {c.get('in_bytes', 0):>14} "
                  f"{c.get('out_packets', 0):>12} {c.get('out_bytes', 0):>14}", file=out)
        if "radio" in g:
            print(f"  {g['name']:<12} {radio_line(g['radio'])}", file=out)
        p = g["proxy"]
        if not p["enabled"]:
            print(f"  {g['name']:<12} proxy disabled: the namespace routes only", file=out)
            continue
        mode = "PROXY" if p["mode"] == "proxy" else p["mode"].upper()
        h = p.get("haproxy", {})
        print(f"  {g['name']:<12} new flows: {mode} ({p['why']}); {p['interception']} interception; "
              f"sessions {h.get('sessions_current', '?')} now / {h.get('sessions_total', '?')} total", file=out)
        f = g["flows"]
        if "error" not in f:
            print(f"  {g['name']:<12} flows proxied {f['flows_proxied']}, bypassed by rule {f['flows_bypass_rule']}, "
                  f"by fail-open {f['flows_bypass_failopen']}, not intercepted {f['flows_not_intercepted']}, "
                  f"to the PEP itself (dropped) {f['syn_to_self']}; bypassed as MPTCP {f['flows_bypass_mptcp']}, "
                  f"client's port taken {f['flows_bypass_busy']}", file=out)
            print(f"  {g['name']:<12} handshakes sent to the origin first {f['syns_probed']}: accepted "
                  f"{f['origin_accepted']}, refused {f['origin_refused']}, answers not rewritten "
                  f"{f['probe_failed']}; TIME_WAIT sockets reset for a new SYN {f['tw_reset']}, client ports freed "
                  f"{f['port_freed']} (held {f['port_held']}); RSTs passed on to clients {f['resets_to_sub']}",
                  file=out)
            c = g.get("connections", {})
            if "error" not in c:
                print(f"  {g['name']:<12} connections {c['graph']} of maxconn {c['graph_maxconn']} (instance "
                      f"{c['instance']} of {c['instance_maxconn']}); new flows bypassed as overload "
                      f"{f['flows_bypass_overload']}", file=out)
            x = g["experiment"]
            if x["control_fraction"]:
                print(f"  {g['name']:<12} experiment: control group {x['control_fraction']:.0%} of subscribers; flows "
                      f"bypassed as control {f['flows_bypass_control']}, measured {f['flows_measured']}, records "
                      f"lost {f['records_dropped']} (pepctl report)", file=out)
    rt = report.get("routing")
    if rt and "error" not in rt:
        d = rt.get("drain")
        drained = "" if not d else (" DRAINED: announces nothing" if d.get("withdrawn") else " DRAINING")
        roles = [x["role"] for x in rt["shares"].values()]
        print(f"  routing: host {rt['host']}, primary of {roles.count('primary')} shares, backup of "
              f"{roles.count('backup')}{drained}", file=out)
        for addr, p in rt.get("peers", {}).items():
            print(f"  routing: {p['side']} router {addr}: BGP {p['bgp']}, BFD {p['bfd']}, announced {p['announced']}",
                  file=out)
    elif rt:
        print(f"  routing: {rt['error']}", file=out)
    trunk = report.get("trunk", {})
    nic, reasons = trunk.get("nic", {}), trunk.get("reasons", {})
    if "error" not in nic:
        lost = {k: v for k, v in nic.items() if k not in ("packets", "bytes") and v}
        print(f"  {report['nic']}: received {nic['packets']} frames; dropped by the kernel before tc: "
              + (", ".join(f"{k} {v}" for k, v in lost.items()) or "none"), file=out)
    if any(v for k, v in reasons.items() if k != "error"):
        print("  trunk_ingress: " + ", ".join(f"{k} {v}" for k, v in reasons.items() if v), file=out)


def radio_line(r: dict) -> str:
    if "error" in r:
        return f"pep_radio: {r['error']}"
    return (f"pep_radio: {r['subscribers_active']} subscribers active, {r['rate_mean_bytes_per_second'] * 8 / 1e6:.1f} "
            f"Mbit/s mean estimated rate; queue delay held {_ms(r['queue_delay_mean_seconds'])} mean, "
            f"{_ms(r['queue_delay_p95_seconds'])} p95 (target {_ms(r['queue_target_seconds'])}, "
            f"{r['control_windows']} windows); outages {r['outages']} ({r['outage_seconds']:.1f} s); "
            f"warm starts {r['flows_warm']} of {r['flows_started']} flows")


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"
