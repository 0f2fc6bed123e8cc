"""`pepctl reload`: apply a changed config without dropping a connection.

What may change live: each graph's [graph.proxy] settings (splice, mode, maxconn, logging, the
intercepted ports, listen_port in modes bpf and nft, source_port, mptcp, handshake) and
[graph.bypass], and HAProxy's own [host] settings (threads, maxconn, metrics). The flow maps and
the nft tables are updated in place; HAProxy gets its new config through its supervisor, which starts a new HAProxy that
takes the listening sockets over and lets the old one finish its connections: no connection
of any graph is touched, changed or not. Anything structural (VLANs, addresses, graphs,
interception mode, NIC, folders) needs `down` then `up`; reload says so and changes nothing.

[routing]: the cluster's hosts and the pinned assignments change live (a host added or taken
out): FRR's prefix lists are replaced and the routers told, so this host announces the shares
it owns now. Its AS, peers, shares and addresses are structural.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys

from . import bypass, drain, flow_maps, routing, service
from . import config as configmod
from .config import Config, ConfigError, FieldError
from .hostinfo import HostInfo
from .names import graph_names, in_netns, instance_names
from .plan import connection_limits, flow_flags, haproxy_check_argv, haproxy_config
from .render_nft import render_nft
from .runner import Journal, StepError, read_pid, run, wait_for, write_file

LIVE_PROXY = {"splice", "mode", "maxconn", "log_connections", "ports", "listen_port", "source_port", "mptcp",
              "handshake"}
LIVE_HOST = {"threads", "maxconn"}
LIVE_ROUTING = {"hosts", "assign"}


def structural_changes(old: Config, new: Config) -> list[FieldError]:
    """Differences reload cannot apply live, each named by its field."""
    found = []
    for f in dataclasses.fields(new.host):
        before, after = getattr(old.host, f.name), getattr(new.host, f.name)
        if before != after and f.name not in LIVE_HOST:
            found.append(FieldError(new.path, f"host.{f.name}", str(after), f"was {before}; cannot change live"))
    if (old.routing is None) != (new.routing is None):
        found.append(FieldError(new.path, "routing", "", "added or removed; cannot change live"))
    elif new.routing is not None:
        for f in dataclasses.fields(new.routing):
            before, after = getattr(old.routing, f.name), getattr(new.routing, f.name)
            if before != after and f.name not in LIVE_ROUTING:
                found.append(FieldError(new.path, f"routing.{f.name}", str(after), f"was {before}; cannot change live"))
    if [g.name for g in old.graphs] != [g.name for g in new.graphs]:
        found.append(FieldError(new.path, "graph[].name", ", ".join(g.name for g in new.graphs),
                                "graphs were added, removed or renamed"))
        return found
    for o, n in zip(old.graphs, new.graphs, strict=True):
        for side in ("access", "origin"):
            if getattr(o, side) != getattr(n, side):
                found.append(FieldError(new.path, f"graph[{n.index}].{side}", "", "changed"))
        for f in dataclasses.fields(n.proxy):
            before, after = getattr(o.proxy, f.name), getattr(n.proxy, f.name)
            if before != after and (f.name not in LIVE_PROXY or
                                    (f.name == "ports" and n.proxy.interception == "route")):
                found.append(FieldError(new.path, f"graph[{n.index}].proxy.{f.name}", str(after),
                                        f"was {before}; cannot change live"))
    return found


def reload(cfg: Config, info: HostInfo, journal: Journal, config_text: str, digest: str, out) -> int:
    n = instance_names(cfg)
    if not (journal.exists and journal.complete):
        print(f"pepctl reload: instance {cfg.host.instance} is not up; run `pepctl up`", file=sys.stderr)
        return 1
    try:
        old = configmod.parse(journal.meta["config_text"], journal.meta["config"])
    except ConfigError as e:
        raise ConfigError([FieldError(cfg.path, "(reload)", "", f"the running instance's config, "
                                      f"{journal.meta['config']}, no longer passes this pepctl's checks "
                                      f"({e.errors[0]}); reload cannot compare with it: take the instance down "
                                      "and up with the new config")]) from None
    problems = structural_changes(old, cfg)
    if problems:
        raise ConfigError(problems + [FieldError(cfg.path, "(reload)", "",
                                                 "these need `pepctl down` then `pepctl up`; nothing was changed")])
    check_routing(cfg, old)
    proxied = [g for g in cfg.graphs if g.proxy.enabled]
    if proxied:
        text = haproxy_config(cfg, info)
        write_file(n.haproxy_cfg + ".new", text, 0o640, info.proxy_gid)
        check = run(haproxy_check_argv(n, n.haproxy_cfg + ".new"), check=False)
        if check.returncode != 0:
            os.unlink(n.haproxy_cfg + ".new")
            print(f"pepctl reload: the new HAProxy config is invalid: {check.stderr.strip()}; nothing was changed",
                  file=sys.stderr)
            return 1
    total, limits = connection_limits(cfg, info)
    for g, o in zip(cfg.graphs, old.graphs, strict=True):
        if not g.proxy.enabled:
            continue
        gn = graph_names(cfg, g)
        if g.proxy.interception == "nft":
            write_file(gn.nft_file, render_nft(g, table=gn.nft_table, mark=flow_maps.LOCAL_MARK))
            run(in_netns(gn.netns, ["nft", "-f", gn.nft_file]))
        flags, listen, control = flow_flags(g)
        # New ports first, then the flags: a port is never left neither intercepted nor routed.
        flow_maps.set_intercept_ports(n.flow_pins, gn.slot, o.proxy.ports or (), g.proxy.ports or ())
        flow_maps.set_flags(n.flow_pins, gn.slot, flags, listen, control, (limits[g.name], total))
        added, removed = bypass.sync(cfg, g, bypass.config_rules(o.bypass))
        print(f"  graph {g.name}: flow maps updated; {added} bypass rule(s) installed, {removed} removed", file=out)
    if cfg.routing is not None and cfg.routing != old.routing:
        print(f"  routing: {reannounce(cfg, old)}", file=out)
    if proxied:
        os.replace(n.haproxy_cfg + ".new", n.haproxy_cfg)
        detail = reload_haproxy(n)
        print(f"  HAProxy reloaded: {detail}", file=out)
    journal.update_meta(config_sha256=digest, config_text=config_text)
    print(f"instance {cfg.host.instance} reloaded", file=out)
    return 0


def check_routing(cfg: Config, old: Config) -> None:
    """A host mid-drain hands flows over by the old owners: its cluster does not change under it."""
    held = drain.state(cfg)
    if cfg.routing != old.routing and held is not None and not held.get("withdrawn"):
        raise StepError("this host is draining: its hand-over follows the old owners; let the drain finish "
                        "or undo it (`pepctl drain --undo`), then reload; nothing was changed")


def reannounce(cfg: Config, old: Config) -> str:
    """The cluster changed: this host announces the shares it owns now (none while drained)."""
    held = drain.state(cfg)
    if held is not None and held.get("withdrawn"):
        drain.announce(cfg, drained=True)        # the config files follow the new cluster
        return "this host is drained: it announces nothing until `pepctl drain --undo`"
    drain.announce(cfg, drained=False)
    before, now = routing.roles(old.routing), routing.roles(cfg.routing)
    moved = [f"{k} ({before.get(k, 'none')} -> {now.get(k, 'none')})"
             for k in sorted(set(before) | set(now)) if before.get(k) != now.get(k)]
    return f"shares {', '.join(moved)} changed" if moved else "this host's shares are unchanged"


def reload_haproxy(n, timeout: float = 60) -> str:
    """SIGHUP to the supervisor; done when its state reports the reload it made."""
    pid = read_pid(n.supervisor_pid)
    if not (pid and service.processes(n)["supervisor"]["running"]):
        raise StepError(f"the proxy supervisor is not running (no live pid in {n.supervisor_pid}); "
                        "`pepctl status` shows why; `pepctl down` then `pepctl up` restarts everything")
    before = service.processes(n)["generation"]
    os.kill(pid, signal.SIGHUP)
    wait_for(lambda: service.processes(n)["generation"] > before, timeout=timeout,
             what="the supervisor to report the reload")
    last = service.processes(n)["last_reload"]
    if not last["ok"]:
        raise StepError(f"HAProxy reload failed: {last['detail']}; the old HAProxy keeps running")
    return last["detail"]
