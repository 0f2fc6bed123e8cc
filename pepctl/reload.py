"""`pepctl reload`: apply a changed proxy config without dropping a connection.

What may change live is each graph's [graph.proxy] section (splice, mode,
threads, maxconn, logging, metrics, and the intercepted ports in nft mode).
The nft table is replaced in one transaction; HAProxy is reloaded through
its master (SIGUSR2): the new worker takes the listening sockets over from
the old one (`expose-fd listeners`), and the old worker finishes the
connections it holds. Anything structural (VLANs, addresses, graphs,
interception mode) needs `down` then `up`, and reload says so, changing
nothing.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys

from . import config as configmod
from . import haproxy_sock
from .config import Config, ConfigError, FieldError
from .hostinfo import HostInfo
from .plan import graph_names
from .proxy_plan import haproxy_config
from .render_nft import render_nft
from .runner import Journal, StepError, run, wait_for
from .status import read_pid

LIVE_FIELDS = {"splice", "mode", "threads", "maxconn", "log_connections", "metrics_port", "ports",
               "listen_port"}


def structural_changes(old: Config, new: Config) -> list[FieldError]:
    """Differences reload cannot apply live, each named by its field."""
    found = []
    if old.host != new.host:
        found.append(FieldError(new.path, "host", "", "the [host] section changed"))
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
            if before != after and (f.name not in LIVE_FIELDS or
                                    (f.name in ("ports", "listen_port") and n.proxy.interception == "route")):
                found.append(FieldError(new.path, f"graph[{n.index}].proxy.{f.name}", str(after),
                                        f"was {before}; cannot change live"))
    return found


def _write(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def reload(cfg: Config, info: HostInfo, journal: Journal, digest: str, out) -> int:
    if not (journal.exists and journal.data.get("complete")):
        print(f"pepctl reload: instance {cfg.host.instance} is not up; run `pepctl up`", file=sys.stderr)
        return 1
    old = configmod.parse(journal.data["meta"]["config_text"], journal.data["meta"]["config"])
    problems = structural_changes(old, cfg)
    if problems:
        raise ConfigError(problems + [FieldError(cfg.path, "(reload)", "",
                                                 "these need `pepctl down` then `pepctl up`; nothing was changed")])
    for g in cfg.graphs:
        if not g.proxy.enabled:
            continue
        n = graph_names(cfg, g)
        text = haproxy_config(cfg, g, n, info)
        _write(n.haproxy_cfg + ".new", text)
        check = run(["haproxy", "-c", "-q", "-f", n.haproxy_cfg + ".new"], check=False)
        if check.returncode != 0:
            os.unlink(n.haproxy_cfg + ".new")
            print(f"pepctl reload: the new HAProxy config of graph {g.name} is invalid: {check.stderr.strip()}",
                  file=sys.stderr)
            return 1
    for g in cfg.graphs:
        if not g.proxy.enabled:
            continue
        n = graph_names(cfg, g)
        if g.proxy.interception == "nft":
            _write(n.nft_file, render_nft(g, table=n.nft_table))
            run(["ip", "netns", "exec", n.netns, "nft", "-f", n.nft_file])
        os.replace(n.haproxy_cfg + ".new", n.haproxy_cfg)
        reload_haproxy(n)
        print(f"  graph {g.name}: HAProxy reloaded", file=out)
    from .bypass import config_rules, sync
    for g, o in zip(cfg.graphs, old.graphs, strict=True):
        if g.proxy.enabled:
            added, removed = sync(cfg, g, config_rules(o.bypass))
            print(f"  graph {g.name}: {added} bypass rule(s) installed, {removed} removed", file=out)
    with open(cfg.path) as f:
        journal.data["meta"].update(config_sha256=digest, config_text=f.read())
    journal.save()
    print(f"instance {cfg.host.instance} reloaded", file=out)
    return 0


def reload_haproxy(n) -> None:
    """SIGUSR2 to the master; done when a new worker answers on the stats socket."""
    master = read_pid(n.haproxy_pid)
    if master is None:
        raise StepError(f"no HAProxy master pid in {n.haproxy_pid}")
    old_worker = haproxy_sock.info(n.haproxy_sock).get("Pid")
    os.kill(master, signal.SIGUSR2)

    def new_worker() -> bool:
        try:
            return haproxy_sock.info(n.haproxy_sock).get("Pid") not in (None, old_worker)
        except OSError:
            return False
    wait_for(new_worker, timeout=15, what=f"a new HAProxy worker in {n.netns}")
