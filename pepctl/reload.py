"""`pepctl reload`: apply a changed config without dropping a connection, as a plan.

What may change live: each graph's [graph.proxy] settings (splice, mode, maxconn, logging, the
intercepted ports, listen_port in modes bpf and nft, source_port, mptcp, handshake),
[graph.bypass] and [graph.experiment], pep_radio's queue_target_ms in [graph.access] (connections
that start after the reload take it), and HAProxy's own [host] settings (threads, maxconn,
metrics). Anything structural (VLANs, addresses, graphs, interception mode, NIC, folders) needs
`down` then `up`; reload says so and changes nothing.

[routing]: the cluster's hosts and the pinned assignments change live (a host added or taken
out): FRR's prefix lists are replaced and the routers told, so this host announces the shares
it owns now. Its AS, peers, shares and addresses are structural.

A reload is a plan like `up`'s (pepctl/runner.py): Steps computed from the running config (the
journal's) and the new one, only for what changes, each with the undo that puts back what it
changed. `pepctl plan --reload` prints them. In order:

  1. HAProxy's new config, written beside the running one and checked (`haproxy -c`);
  2. graph by graph: its nft table (mode nft, replaced in one transaction), the ports it
     intercepts (new ones first: a port is never neither intercepted nor routed), its flags and
     listener, its bypass rules;
  3. [routing]: the shares this host announces;
  4. HAProxy's config replaced, and HAProxy reloaded through its supervisor, which starts a new
     HAProxy that takes the listening sockets over and lets the old one finish its connections.

Each undo is journaled before its step runs, in run_dir/INSTANCE.reload.journal: a step that
fails, at any graph, rolls back every step before it, and every graph is as it was before the
reload. A reload cut short (killed, the host down) is rolled back by the next reload or `down`
(recover). Once every step has run, the instance's journal takes the new config, and the
reload journal goes.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys

from . import bypass, congestion, drain, flow_maps, routing, service
from . import config as configmod
from .config import Config, ConfigError, FieldError
from .hostinfo import HostInfo
from .names import folder_names, in_netns
from .plan import connection_limits, flow_flags, haproxy_check_argv, haproxy_config
from .render_nft import render_nft
from .runner import (
    Call,
    Journal,
    Step,
    StepError,
    action,
    apply,
    read_pid,
    remove_file,
    rollback_left,
    run,
    undo_all,
    wait_for,
    write_file,
)

LIVE_PROXY = {"splice", "mode", "maxconn", "log_connections", "ports", "listen_port", "source_port", "mptcp",
              "handshake"}
LIVE_HOST = {"threads", "maxconn"}
LIVE_ROUTING = {"hosts", "assign"}
LIVE_SIDE = {"queue_target_ms"}   # pep_radio's, in its parameters map (the congestion control itself is structural)


def structural_changes(old: Config, new: Config) -> list[FieldError]:
    """Differences reload cannot apply live, each named by its field."""
    found = field_changes(new.path, "host", old.host, new.host, LIVE_HOST)
    if (old.routing is None) != (new.routing is None):
        found.append(FieldError(new.path, "routing", "", "added or removed; cannot change live"))
    elif new.routing is not None:
        found += field_changes(new.path, "routing", old.routing, new.routing, LIVE_ROUTING)
    if [g.name for g in old.graphs] != [g.name for g in new.graphs]:
        found.append(FieldError(new.path, "graph[].name", ", ".join(g.name for g in new.graphs),
                                "graphs were added, removed or renamed"))
        return found
    for o, n in zip(old.graphs, new.graphs, strict=True):
        for side in ("access", "origin"):
            found += field_changes(new.path, f"graph[{n.index}].{side}", getattr(o, side), getattr(n, side), LIVE_SIDE)
        live_proxy = LIVE_PROXY - {"ports"} if n.proxy.interception == "route" else LIVE_PROXY
        found += field_changes(new.path, f"graph[{n.index}].proxy", o.proxy, n.proxy, live_proxy)
    return found


def field_changes(path: str, where: str, old, new, live: set[str]) -> list[FieldError]:
    """The fields of one config table (a dataclass) that differ and are not in `live`."""
    return [FieldError(path, f"{where}.{f.name}", shown(getattr(new, f.name)),
                       f"was {shown(getattr(old, f.name))}; cannot change live")
            for f in dataclasses.fields(new) if getattr(old, f.name) != getattr(new, f.name) and f.name not in live]


def shown(value) -> str:
    """A value as the config writes it: a list's items, not a tuple's repr."""
    if isinstance(value, tuple):
        return ", ".join(str(v) for v in value) or "none"
    return str(value)


def running_config(cfg: Config, journal: Journal) -> Config:
    """The config the instance runs (its journal's), to compare the new one with."""
    try:
        return configmod.parse(journal.meta["config_text"], journal.meta["config"])
    except ConfigError as e:
        raise ConfigError([FieldError(cfg.path, "(reload)", "", f"the running instance's config, "
                                      f"{journal.meta['config']}, no longer passes this pepctl's checks "
                                      f"({e.errors[0]}); reload cannot compare with it: take the instance down "
                                      "and up with the new config")]) from None


def steps(cfg: Config, old: Config, info: HostInfo) -> list[Step]:
    """What a reload from old to cfg does, only what changes; refuses structural changes."""
    problems = structural_changes(old, cfg)
    if problems:
        raise ConfigError(problems + [FieldError(cfg.path, "(reload)", "",
                                                 "these need `pepctl down` then `pepctl up`; nothing was changed")])
    check_routing(cfg, old)
    n = cfg.instance_names()
    proxied = any(g.proxy.enabled for g in cfg.graphs)
    out = []
    if proxied:
        out += haproxy_prepare_steps(n, haproxy_config(cfg, info), info.proxy_gid)
    limits = graph_limits(cfg, info), graph_limits(old, info)
    for g, o in zip(cfg.graphs, old.graphs, strict=True):
        if g.proxy.enabled:
            out += graph_steps(cfg, g, o, limits[0][g.name], limits[1][o.name])
        if g.access.queue_target_ms != o.access.queue_target_ms:
            out.append(congestion.target_step(cfg, g, o.access.queue_target_ms))
    if cfg.routing is not None and cfg.routing != old.routing:
        out.append(routing_step(cfg, old))
    if proxied:
        out.append(haproxy_swap_step(n, info.proxy_gid))
    return out


def haproxy_prepare_steps(n, text: str, gid: int | None) -> list[Step]:
    """HAProxy's next config written beside the running one, and checked."""
    return [Step(f"write {n.haproxy_cfg_new}", Call("write", (n.haproxy_cfg_new, text, 0o640, gid),
                                                    f"cat > {n.haproxy_cfg_new} <<'EOF'\n{text.rstrip()}\nEOF"),
                 undo=Call("remove", (n.haproxy_cfg_new,), f"rm {n.haproxy_cfg_new}")),
            Step(f"check {n.haproxy_cfg_new}", haproxy_check_argv(n, n.haproxy_cfg_new))]


def haproxy_swap_step(n, gid: int | None) -> Step:
    """The checked config in place of the running one, and HAProxy reloaded with it through its
    supervisor; undone by the running config and another reload."""
    with open(n.haproxy_cfg) as f:
        running = f.read()
    return Step("replace HAProxy's config and reload HAProxy (its supervisor starts a new one; the old one finishes "
                "its connections)",
                Call("haproxy_reload", (n.dir, n.haproxy_cfg_new),
                     f"mv {n.haproxy_cfg_new} {n.haproxy_cfg}; kill -HUP $(cat {n.supervisor_pid})"),
                undo=Call("haproxy_restore", (n.dir, running, gid),
                          f"put back {n.haproxy_cfg} as it was; kill -HUP $(cat {n.supervisor_pid})"))


def graph_limits(cfg: Config, info: HostInfo) -> dict[str, tuple[int, int]]:
    """Each proxied graph's (maxconn, host_maxconn): where the datapath sends its new flows end to end."""
    total, limits = connection_limits(cfg, info)
    return {name: (maxconn, total) for name, maxconn in limits.items()}


def graph_steps(cfg: Config, g, o, limits: tuple[int, int], old_limits: tuple[int, int]) -> list[Step]:
    """A proxied graph's changes: nft table, intercepted ports, flags (source_port, mptcp and
    handshake among them), listener and connection limits, bypass rules."""
    gn = cfg.graph_names(g)
    pins = cfg.instance_names().flow_pins
    out = []
    if g.proxy.interception == "nft":
        out += nft_steps(g, gn)
    old_ports, new_ports = [list(r) for r in o.proxy.ports or ()], [list(r) for r in g.proxy.ports or ()]
    if old_ports != new_ports:
        out.append(Step(f"intercepted ports of graph {g.name}: {ports_text(new_ports)} (were {ports_text(old_ports)})",
                        Call("intercept_ports", (pins, gn.slot, old_ports, new_ports),
                             f"# bpf(2) {pins}/maps: intercept_ports of slot {gn.slot}: {ports_text(new_ports)}"),
                        undo=Call("intercept_ports", (pins, gn.slot, new_ports, old_ports),
                                  f"intercepted ports of slot {gn.slot} back to {ports_text(old_ports)}")))
    before, after = [*flow_flags(o), list(old_limits)], [*flow_flags(g), list(limits)]
    if before != after:
        flags, listen, control, _ = after
        out.append(Step(f"flags of graph {g.name}: {flags:#x}, listener port {listen}, maxconn {limits[0]} "
                        f"(the instance's {limits[1]})",
                        Call("graph_flags", (pins, gn.slot, *after),
                             f"# bpf(2) {pins}/maps: graphs[{gn.slot}] = {{flags {flags:#x}, listen_port {listen}, "
                             f"control {list(control)}, maxconn {limits[0]}, host_maxconn {limits[1]}}}"),
                        undo=Call("graph_flags", (pins, gn.slot, *before), f"graphs[{gn.slot}] back as it was")))
    live = bypass.read_live(cfg, g)
    rules_before, rules_after = bypass.config_rules(o.bypass) | live, bypass.config_rules(g.bypass) | live
    if rules_before != rules_after:
        out.append(bypass.change_step(cfg, g, rules_before, rules_after))
    return out


def nft_steps(g, gn) -> list[Step]:
    """A graph's nft table as the config renders it now, if the running one differs: replaced in
    one transaction, undone by the running one."""
    new = render_nft(g, table=gn.nft_table, mark=flow_maps.LOCAL_MARK)
    with open(gn.nft_file) as f:
        running = f.read()
    if new == running:
        return []
    return [Step(f"replace the nftables table {gn.nft_table} of graph {g.name} in {gn.netns}",
                 Call("nft_table", (gn.netns, gn.nft_file, new),
                      f"cat > {gn.nft_file} <<'EOF'\n{new.rstrip()}\nEOF\n"
                      + " ".join(in_netns(gn.netns, ["nft", "-f", gn.nft_file]))),
                 undo=Call("nft_table", (gn.netns, gn.nft_file, running),
                           f"load {gn.nft_table} of graph {g.name} as it was"))]


def ports_text(ranges: list) -> str:
    return ", ".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in ranges) or "all"


def routing_step(cfg: Config, old: Config) -> Step:
    """The cluster changed: this host announces the shares it owns now (none while drained)."""
    held = drain.state(cfg)
    drained = bool(held and held.get("withdrawn"))
    before, now = routing.roles(old.routing), routing.roles(cfg.routing)
    moved = [f"{k} ({before.get(k, 'none')} -> {now.get(k, 'none')})"
             for k in sorted(set(before) | set(now)) if before.get(k) != now.get(k)]
    what = "this host is drained: it announces nothing until `pepctl drain --undo`" if drained else \
        f"shares {', '.join(moved)} changed" if moved else "this host's shares are unchanged"
    undo = drain.announce_call(old, drained)
    return Step(f"routing: {what}", drain.announce_call(cfg, drained),
                undo=Call(undo.name, undo.args, "announce the shares as before the reload"))


def check_routing(cfg: Config, old: Config) -> None:
    """A host mid-drain hands flows over by the old owners: its cluster does not change under it."""
    held = drain.state(cfg)
    if cfg.routing != old.routing and held is not None and not held.get("withdrawn"):
        raise StepError("this host is draining: its hand-over follows the old owners; let the drain finish "
                        "or undo it (`pepctl drain --undo`), then reload; nothing was changed")


@action("nft_table")
def _nft_table(ns: str, path: str, text: str) -> None:
    """A graph's nft table from text (the script replaces the table in one transaction), and its file."""
    write_file(path, text)
    run(in_netns(ns, ["nft", "-f", path]))


@action("intercept_ports")
def _intercept_ports(pins: str, slot: int, old: list, new: list) -> None:
    flow_maps.set_intercept_ports(pins, slot, [tuple(r) for r in old], [tuple(r) for r in new])


@action("graph_flags")
def _graph_flags(pins: str, slot: int, flags: int, listen_port: int, control: list,
                 limits: list | None = None) -> None:
    flow_maps.set_flags(pins, slot, flags, listen_port, tuple(control), tuple(limits or (0, 0)))


@action("haproxy_reload")
def _haproxy_reload(instance_dir: str, new: str) -> None:
    n = folder_names(instance_dir)
    os.replace(new, n.haproxy_cfg)
    reload_haproxy(n)


@action("haproxy_restore")
def _haproxy_restore(instance_dir: str, text: str, gid: int | None) -> None:
    """HAProxy's config as it was, and HAProxy reloaded with it if the config had changed."""
    n = folder_names(instance_dir)
    try:
        with open(n.haproxy_cfg) as f:
            same = f.read() == text
    except FileNotFoundError:
        same = False
    if not same:
        write_file(n.haproxy_cfg, text, 0o640, gid)
        reload_haproxy(n)


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


# -- running it ------------------------------------------------------------------------------------
def recover(cfg: Config, journal: Journal, out) -> list[str]:
    """A reload cut short: finished if all its steps ran (the instance's journal takes its config),
    else rolled back. Returns the undos that failed (kept in the reload journal, for the next try)."""
    rj = Journal(cfg.instance_names().reload_journal)
    if not rj.exists:
        return []
    if rj.complete:
        if journal.exists and journal.meta.get("config_sha256") != rj.meta.get("config_sha256"):
            journal.update_meta(config_sha256=rj.meta["config_sha256"], config_text=rj.meta["config_text"])
        rj.remove()
        return []
    print(f"a previous `reload` of {cfg.host.instance} did not finish: rolling it back", file=out)
    errors = undo_all(rj, log=lambda m: print(m, file=out))
    if not errors:
        rj.remove()
    return errors


def reload(cfg: Config, info: HostInfo, journal: Journal, config_text: str, digest: str, out) -> int:
    n = cfg.instance_names()
    if not (journal.exists and journal.complete):
        print(f"pepctl reload: instance {cfg.host.instance} is not up; run `pepctl up`", file=sys.stderr)
        return 1
    errors = recover(cfg, journal, out)
    if errors:
        print("pepctl reload: could not roll back the previous reload:\n  " + "\n  ".join(errors)
              + "\nrun `pepctl reload` again to retry, or `pepctl down`", file=sys.stderr)
        return 1
    plan = steps(cfg, running_config(cfg, journal), info)
    rj = Journal(n.reload_journal)
    rj.start({"config": cfg.path, "config_sha256": digest, "config_text": config_text, "pid": os.getpid()})
    try:
        apply(plan, rj, log=lambda m: print(m, file=out))
    except (StepError, OSError) as e:
        left = rj.undo
        if not left:
            rj.remove()
        print(f"pepctl reload: {e}\n" + ("rolled back: the instance runs its previous config, every graph as it was"
                                          if not left else rollback_left(rj, "`pepctl reload` again")),
              file=sys.stderr)
        return 1
    rj.mark_complete()
    journal.update_meta(config_sha256=digest, config_text=config_text)
    rj.remove()
    remove_file(n.haproxy_cfg_new)
    print(f"instance {cfg.host.instance} reloaded", file=out)
    return 0
