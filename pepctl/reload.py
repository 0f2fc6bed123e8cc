"""`pepctl reload`: apply a changed config without dropping a connection.

What may change live: each graph's [graph.proxy] settings (splice, mode, maxconn, logging, the
intercepted ports, listen_port in modes bpf and nft) and [graph.bypass], and HAProxy's own
[host] settings (threads, maxconn, metrics). The flow maps and the nft tables are updated in
place; HAProxy gets its new config through its supervisor, which starts a new HAProxy that
takes the listening sockets over and lets the old one finish its connections: no connection
of any graph is touched, changed or not. Anything structural (VLANs, addresses, graphs,
interception mode, NIC, folders) needs `down` then `up`; reload says so and changes nothing.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys

from . import bypass, flow_maps, service
from . import config as configmod
from .config import Config, ConfigError, FieldError
from .hostinfo import HostInfo
from .names import graph_names, in_netns, instance_names
from .plan import flow_flags, haproxy_check_argv, haproxy_config
from .render_nft import render_nft
from .runner import Journal, StepError, read_pid, run, wait_for, write_file

LIVE_PROXY = {"splice", "mode", "maxconn", "log_connections", "ports", "listen_port"}
LIVE_HOST = {"threads", "maxconn"}


def structural_changes(old: Config, new: Config) -> list[FieldError]:
    """Differences reload cannot apply live, each named by its field."""
    found = []
    for f in dataclasses.fields(new.host):
        before, after = getattr(old.host, f.name), getattr(new.host, f.name)
        if before != after and f.name not in LIVE_HOST:
            found.append(FieldError(new.path, f"host.{f.name}", str(after), f"was {before}; cannot change live"))
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
        flow_maps.set_flags(n.flow_pins, gn.slot, flags, listen, control)
        added, removed = bypass.sync(cfg, g, bypass.config_rules(o.bypass))
        print(f"  graph {g.name}: flow maps updated; {added} bypass rule(s) installed, {removed} removed", file=out)
    if proxied:
        os.replace(n.haproxy_cfg + ".new", n.haproxy_cfg)
        detail = reload_haproxy(n)
        print(f"  HAProxy reloaded: {detail}", file=out)
    journal.update_meta(config_sha256=digest, config_text=config_text)
    print(f"instance {cfg.host.instance} reloaded", file=out)
    return 0


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
