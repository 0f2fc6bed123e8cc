"""`pepctl upgrade`: this pepctl takes over, in place, an instance that another one (an older
checkout) brought up, and no connection is lost.

Which instances: one whose journal is of an older format (runner.JOURNAL_FORMAT), or whose
datapath was loaded from other objects than this checkout's tc/*.o (plan.datapath_digest): until
it is upgraded, `up`, `reload`, `bypass` and `drain` refuse it and say to run `pepctl upgrade`
(a reload would give HAProxy this version's config over the old datapath), `status` says so and
reads nothing whose layout it cannot know, and `down` works (from the journal). One whose code
alone changed (pepctl, the supervisor, the units: plan.build_digest) is upgraded too, to restart
its processes with it; the other commands take it as it is. A journal of a newer format than this
pepctl knows is refused by every command but `status`: that pepctl brought it up, and takes it down.

The config is the one the instance runs (the file must be unchanged since its up or last reload):
what changes is what this version makes of it. An upgrade is a plan like `up`'s and `reload`'s
(pepctl/runner.py), under the instance's lock, journaled in run_dir/INSTANCE.upgrade.journal and
rolled back if a step fails; `pepctl plan --upgrade` prints it. In order:

  1. the register entry rewritten in this format; HAProxy's next config written and checked;
  2. what this version adds: a congestion control of pepctl's own that the config now selects
     (pep_radio, the access side's default since the last release), registered before any route names
     it, and its parameters per graph;
  3. the new datapath loaded beside the running one (PINS/steer-new, PINS/flow-new), with every
     running map whose layout is the same handed to the new programs, so the flows bypassed keep
     their entries, the rules and counters are where they were, and both programs share them
     while they overlap; a map whose layout changed is carried over entry by entry, or recreated
     when pepctl writes it all again (pepctl/layouts.py); then the graphs' entries as this
     version's config means them (flags, limits, namespaces);
  4. each program swapped on its hook (`tc filter replace`: every packet meets one program or the
     other, never none: fail-open never leaves the datapath), flow_conns attached to the cgroup
     root or swapped there in place (BPF_F_REPLACE);
  5. what the config means now, where the kernel differs: the routes' congestion control and
     initial window (`ip route replace`: connections open keep theirs), the namespaces' sysctls
     (and those an older version set that this one leaves to the kernel, back to a new
     namespace's), interception rules, nft tables;
  6. the units (under systemd) and the supervisor: this checkout's replaces the running one,
     which is killed (told to stop, it would stop HAProxy) and whose HAProxy it adopts; then
     HAProxy's config swapped by a seamless reload, as `reload` does: the old HAProxy finishes
     its connections;
  7. the exporter stopped, the pin folders exchanged in one step each (renameat2
     RENAME_EXCHANGE), the exporter started;
then the instance's journal is rewritten in this format: what the old journal said, with what
this upgrade added where `up` would have put it (what `down` undoes), and the old pins go.

A failure, or a kill, before the journal is rewritten puts back steps 1-5 and 7 (the next command
finishes the rollback of a killed one): the old programs run again with their maps, whose entries
the new programs shared meanwhile. The supervisor and the exporter of this checkout stay: they run
either version's instance. What is not kept: the flows' marks and the honest handshake's state
start empty (the old datapath had none); flow_conns counts connections from the upgrade on, so a
graph's connections open before it are not counted toward its maxconn; flows that expire after
the upgrade but were promoted before are counted by the old program's timers, in its own map.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import time
from dataclasses import dataclass

from . import bpfsys, bypass, congestion, drain, flow_maps, layouts, nsutil, plan, register, reload, routing, service
from .config import Config
from .hostinfo import HostInfo
from .names import in_netns, staged_pins, unit_name
from .runner import (
    JOURNAL_FORMAT,
    Call,
    Journal,
    Step,
    StepError,
    action,
    apply,
    exchange,
    remove_dir,
    remove_file,
    rollback_left,
    run,
    run_json,
    undo_all,
)

# Maps pepctl writes in full from the config and the live rules: recreated when their layout changes.
REFILLED = {"steer": {"vlan_ports", "port_vlans"},
            "flow": {"graph_addrs", "intercept_ports", "netns_slots", "bypass_ports", "bypass_client4",
                     "bypass_server4", "bypass_client6", "bypass_server6"}}
# Arrays whose index means more than a place: how an entry's index moves when their size changes.
REMAPS = {"flow_stats": flow_maps.stats_index}
# A program of each part that every version has: which one the pin folder holds tells which
# version it is (an upgrade killed between its exchanges is put back by it).
MARKERS = {"steer": "trunk_ingress", "flow": flow_maps.PROGRAM}
# Sysctls an older pepctl set in a graph's namespace that this one leaves to the kernel.
RETIRED_SYSCTLS = ("net.ipv4.tcp_max_tw_buckets",)   # was 0 with bpf interception: no TIME_WAIT at all
CODE = ("pepctl", "haproxy")                        # what the processes run (build_digest)


class Refused(StepError):
    """The upgrade cannot be done: says why and what to do; nothing was changed."""


# -- which instances ---------------------------------------------------------------------------------
def build_digest(cfg: Config) -> str:
    """The datapath and the code the instance's processes run (pepctl, the supervisor, the units)."""
    try:
        h = hashlib.sha256(plan.datapath_digest(cfg).encode())
    except OSError:
        h = hashlib.sha256(b"not built")   # the host checks say so
    for top in CODE:
        for folder, _, files in sorted(os.walk(os.path.join(plan.REPO, top))):
            for name in sorted(f for f in files if f.endswith(".py")):
                with open(os.path.join(folder, name), "rb") as f:
                    h.update(name.encode() + hashlib.sha256(f.read()).digest())
    for name, path in sorted(service.unit_files().items()):
        h.update(name.encode() + hashlib.sha256(service.unit_text(path).encode()).digest())
    return h.hexdigest()


def outdated(cfg: Config, journal: Journal) -> str | None:
    """Why the running instance is not this pepctl's to change (`pepctl upgrade` makes it so), or None."""
    inst = cfg.host.instance
    if journal.format > JOURNAL_FORMAT:
        return (f"instance {inst} was brought up by a newer pepctl (journal format {journal.format}; this one "
                f"knows {JOURNAL_FORMAT} and older): use that pepctl")
    if journal.format < JOURNAL_FORMAT:
        return f"instance {inst} was brought up by an older pepctl (journal format {journal.format})"
    try:
        digest = plan.datapath_digest(cfg)
    except OSError:
        return None    # this checkout is not built: the host checks say so
    if journal.meta.get("datapath") != digest:
        return f"instance {inst} runs a datapath loaded from other objects than this checkout's tc/*.o"
    return None


def refusal(cfg: Config, journal: Journal, command: str) -> str | None:
    """The message of a command that changes an instance (up, reload, bypass, drain) when the
    instance is not this pepctl's to change, or None."""
    why = outdated(cfg, journal)
    if why is None:
        return None
    if journal.format > JOURNAL_FORMAT:
        return f"{why}; nothing was changed"
    return (f"{why}: `pepctl upgrade` takes it over in place, losing no connection (`pepctl plan --upgrade` shows "
            f"how); run {command} after it. Nothing was changed")


# -- the parts of the datapath ---------------------------------------------------------------------
@dataclass
class Part:
    name: str                         # steer | flow
    obj: str                          # this checkout's object
    live: str                         # its pin folder
    staged: str                       # where the new one is loaded first
    decisions: dict                   # map name -> layouts.Decision
    programs: list[str]               # the programs pinned in live
    dropped: list[str]                # maps the new object no longer has
    marker_id: int                    # the kernel's id of MARKERS[name] in live


def parts(cfg: Config) -> list[Part]:
    """The datapath's parts, each with what happens to every map; Refused if a map cannot be carried."""
    out, btf, refused = [], {}, []
    for name, (obj, live) in plan.datapath(cfg).items():
        staged = staged_pins(live)
        if not os.path.isdir(os.path.join(live, "maps")):
            raise Refused(f"{live} holds no maps: the instance is damaged; `pepctl down` then `pepctl up`")
        if os.path.lexists(staged):
            raise Refused(f"{staged} exists, and no upgrade of this instance is under way (no upgrade journal): "
                          "a run that crashed left it; remove it (rm -r) and try again")
        old = {m: layouts.pinned_map(os.path.join(live, "maps", m), btf)
               for m in sorted(os.listdir(os.path.join(live, "maps")))}
        new = layouts.object_maps(obj)
        decisions = {m: layouts.decide(m, old.get(m), d, refilled=REFILLED[name], remap=REMAPS)
                     for m, d in new.items()}
        refused += [f"map {live}/maps/{d.name}: {d.why}" for d in decisions.values() if d.action == "refuse"]
        try:
            with bpfsys.Prog(os.path.join(live, "prog", MARKERS[name])) as marker:
                marker_id = marker.id
        except (OSError, ValueError) as e:
            raise Refused(f"{live}/prog/{MARKERS[name]}: {e}: the instance is damaged; `pepctl down` then "
                          "`pepctl up`") from None
        out.append(Part(name, obj, live, staged, decisions, sorted(os.listdir(os.path.join(live, "prog"))),
                        sorted(set(old) - set(new)), marker_id))
    if refused:
        raise Refused("this pepctl cannot carry these maps of the running instance over to its datapath:\n  "
                      + "\n  ".join(refused) + "\ntake the instance down with the pepctl that brought it up, and up "
                      "with this one (its connections are reset); nothing was changed")
    return out


# -- the journal --------------------------------------------------------------------------------------
def _strict(entry: dict) -> str:
    return json.dumps({k: v for k, v in entry.items() if k not in ("what", "show")}, sort_keys=True)


# How many leading arguments name what an action acts on: one, but for the actions whose first is a
# folder every graph shares (radio_forget's pins; the graph's namespace follows).
_NAMING_ARGS = {"radio_params": 2, "radio_forget": 2}


def _loose(entry: dict) -> str | None:
    """The same thing undone in another version's words: one action on the same thing."""
    if "call" not in entry:
        return None
    return json.dumps([entry["call"], entry["args"][:_NAMING_ARGS.get(entry["call"], 1)]])


def _find(entry: dict, entries: list[dict], start: int = 0) -> int | None:
    strict, loose = _strict(entry), _loose(entry)
    for i in range(start, len(entries)):
        if _strict(entries[i]) == strict:
            return i
    hits = [i for i in range(start, len(entries)) if loose is not None and _loose(entries[i]) == loose]
    return hits[0] if len(hits) == 1 else None


def journaled(entry: dict, entries: list[dict]) -> bool:
    return _find(entry, entries) is not None


def merge(old: list[dict], build: list[dict], made: list[dict]) -> list[dict]:
    """The undo list of the upgraded instance: the old journal's entries, each in this version's words
    where `up` would have written it otherwise, with what the upgrade made (made: entries of `up`'s
    plan, build) where `up` would have put it. Entries of the old journal that `up` no longer makes
    (a host setting changed then) keep their place."""
    made_keys = {_strict(e) for e in made}
    matched = {i for b in build if (i := _find(b, old)) is not None}
    out: list[dict] = []
    at = 0

    def orphans() -> int:
        """The old entries from `at` that `up` no longer plans: they stay after the one before them."""
        n = at
        while n < len(old) and n not in matched:
            out.append(old[n])
            n += 1
        return n

    at = orphans()
    for b in build:
        i = _find(b, old, at)
        if i is not None:
            out += old[at:i]
            out.append(b)
            at = i + 1
            at = orphans()
        elif _strict(b) in made_keys:
            out.append(b)
    return out + old[at:]


# -- the steps ----------------------------------------------------------------------------------------
def _stage_argv(p: Part) -> list[str]:
    reused = [m for m, d in p.decisions.items() if d.action == "reuse"]
    argv = ["bpftool", "prog", "loadall", p.obj, f"{p.staged}/prog"]
    for m in reused:
        argv += ["map", "name", m, "pinned", f"{p.live}/maps/{m}"]
    return argv + ["pinmaps", f"{p.staged}/maps"]


@action("upgrade_stage")
def _stage(staged: str, argv: list[str]) -> None:
    """The new programs and maps loaded and pinned in staged, the running maps of the same layout
    among them."""
    os.mkdir(staged, 0o700)
    run(argv)


@action("upgrade_convert")
def _convert(old_path: str, new_path: str, remap: str | None) -> None:
    layouts.convert(old_path, new_path, layouts.pinned_map(old_path), layouts.pinned_map(new_path),
                    REMAPS.get(remap) if remap else None)


def _which_id(live: str, marker: str) -> int | None:
    path = os.path.join(live, "prog", marker)
    if not os.path.exists(path):
        return None
    with bpfsys.Prog(path) as p:
        return p.id


@action("pins_commit")
def _commit(live: str, staged: str, marker: str, old_id: int) -> None:
    """The new pins become the instance's, the old ones go where the new were: one rename
    (RENAME_EXCHANGE), so a reader meets one folder or the other. Done already: nothing."""
    if _which_id(live, marker) == old_id:
        exchange(live, staged)


@action("pins_restore")
def _restore(live: str, staged: str, marker: str, old_id: int) -> None:
    """The old pins the instance's again, if the exchange was made."""
    if os.path.isdir(staged) and _which_id(live, marker) != old_id and _which_id(staged, marker) == old_id:
        exchange(live, staged)


def datapath_steps(cfg: Config, info: HostInfo, ps: list[Part], made: list[dict], old: list[dict]) -> list[Step]:
    """Load, carry over, fill and attach: steps 3 and 4 of the module's docstring."""
    n = cfg.instance_names()
    out = []
    for p in ps:
        argv = _stage_argv(p)
        out.append(Step(f"load the new {p.name} programs and maps in {p.staged}: {_summary(p)}",
                        Call("upgrade_stage", (p.staged, argv), " ".join(argv)),
                        undo=Call("rmdir", (p.staged, None), f"rm -r {p.staged}")))
        for name, d in p.decisions.items():
            if d.action == "convert":
                out.append(Step(f"carry map {name} over: {d.why}",
                                Call("upgrade_convert", (f"{p.live}/maps/{name}", f"{p.staged}/maps/{name}",
                                                         name if name in REMAPS else None),
                                     f"# bpf(2): every entry of {p.live}/maps/{name}, rebuilt, into {p.staged}"
                                     f"/maps/{name}")))
    parts_by = {p.name: p for p in ps}
    steer, flow = parts_by["steer"], parts_by.get("flow")
    ports = [(v, pt) for g in cfg.graphs for v, pt in ((g.access.vlan, cfg.graph_names(g).c_out),
                                                        (g.origin.vlan, cfg.graph_names(g).s_out))]
    if steer.decisions.get("vlan_ports", layouts.Decision("", "", "")).action == "recreate" or \
            steer.decisions.get("port_vlans", layouts.Decision("", "", "")).action == "recreate":
        out.append(plan.steer_ports_step(steer.staged, ports, cfg.host.nic))
    total, limits = plan.connection_limits(cfg, info)
    if flow is not None:
        rebypass = any(flow.decisions[m].action == "recreate" for m in REFILLED["flow"] if m.startswith("bypass"))
        for g in plan.proxied(cfg):
            out.append(plan.flow_graph_step(cfg, g, cfg.graph_names(g), (limits[g.name], total), pins=flow.staged))
            if rebypass:
                out.append(bypass.install_step(cfg, g, flow.staged))
    # The programs, graph by graph, then the cgroup's, then the NIC's: as `up` attaches them.
    if flow is not None:
        for g in plan.proxied(cfg):
            ns = cfg.graph_names(g).netns
            to = [[dev, hook, pref, f"{flow.staged}/prog/{prog}"] for dev, hook, pref, prog in plan.flow_attachments()]
            back = [[dev, hook, pref, f"{flow.live}/prog/{prog}" if prog in flow.programs else None]
                    for dev, hook, pref, prog in plan.flow_attachments()]
            out.append(Step(f"swap the flow programs of graph {g.name} in {ns} (tc filter replace)",
                            Call("tc_swap", (ns, to), _tc_shown(ns, to)),
                            undo=Call("tc_swap", (ns, back), f"the programs of {ns} back as they were")))
        if info.cgroup2 is not None:
            new_prog = f"{flow.staged}/prog/{flow_maps.CONNS_PROGRAM}"
            old_prog = f"{flow.live}/prog/{flow_maps.CONNS_PROGRAM}" if flow_maps.CONNS_PROGRAM in flow.programs \
                else None
            out.append(Step(f"{'swap' if old_prog else 'attach'} {flow_maps.CONNS_PROGRAM} on the cgroup v2 root "
                            f"{info.cgroup2}" + (" (BPF_F_REPLACE: in place)" if old_prog else ""),
                            Call("cgroup_swap", (info.cgroup2, new_prog, old_prog),
                                 f"bpftool cgroup attach {info.cgroup2} sock_ops pinned {new_prog} multi"
                                 + (f"  # replacing {old_prog}" if old_prog else "")),
                            undo=Call("cgroup_swap", (info.cgroup2, old_prog, new_prog),
                                      f"{flow_maps.CONNS_PROGRAM} on {info.cgroup2} back as it was")))
            entry = plan.conns_attach_step(n.flow_pins, info).undo_entry()
            if entry is not None and not journaled(entry, old):
                made.append(entry)
    ends = [cfg.graph_names(g) for g in cfg.graphs]
    attach = plan.port_attachments([x for gn in ends for x in (gn.c_out, gn.s_out)]) + \
        plan.trunk_attachments(cfg.host.nic)
    to = [[dev, hook, pref, f"{steer.staged}/prog/{prog}"] for dev, hook, pref, prog in attach]
    back = [[dev, hook, pref, f"{steer.live}/prog/{prog}" if prog in steer.programs else None]
            for dev, hook, pref, prog in attach]
    out.append(Step(f"swap the steering programs on {cfg.host.nic} and the graphs' host ends (tc filter replace)",
                    Call("tc_swap", (None, to), _tc_shown(None, to)),
                    undo=Call("tc_swap", (None, back), "the steering programs back as they were")))
    return out


def _summary(p: Part) -> str:
    """What happens to the part's maps, in a line: the plan's, and the upgrade's output."""
    said = {"reuse": "kept (same layout)", "convert": "carried over", "recreate": "recreated (pepctl writes them "
            "again)", "new": "new (empty)"}
    out = []
    for what, words in said.items():
        names = [m for m, d in p.decisions.items() if d.action == what]
        if names:
            out.append(f"{len(names)} {words}: {', '.join(names)}" if what != "reuse" else f"{len(names)} {words}")
    if p.dropped:
        out.append(f"{len(p.dropped)} no longer used: {', '.join(p.dropped)}")
    return "; ".join(out)


def _tc_shown(ns: str | None, attachments: list) -> str:
    lines = "\n".join(" ".join(plan.filter_words("replace", *a)) for a in attachments)
    return " ".join(in_netns(ns, ["tc", "-batch", "-"])) + f" <<'EOF'\n{lines}\nEOF"


# -- what the config means now -----------------------------------------------------------------------
def _net(dst: str, family: int) -> str:
    if dst == "default":
        return "0.0.0.0/0" if family == 4 else "::/0"
    return str(ipaddress.ip_network(dst, strict=False))


def kernel_routes(ns: str) -> dict[str, tuple[str | None, int]]:
    """The namespace's routes of pepctl's (proto static), by destination: (congestion control, initcwnd)."""
    out = {}
    for family in (4, 6):
        for r in run_json(["ip", "-j", "-n", ns, f"-{family}", "route", "show", "proto", "static"]):
            metrics = {k: v for m in r.get("metrics", []) for k, v in m.items()}
            out[_net(r["dst"], family)] = (metrics.get("congestion"), int(metrics.get("initcwnd", 0)))
    return out


def route_steps(cfg: Config) -> list[Step]:
    """Routes whose congestion control or initial window this version's config means otherwise."""
    out = []
    for g in cfg.graphs:
        ns = cfg.graph_names(g).netns
        have = kernel_routes(ns)
        to, back, said = [], [], []
        for dst, via, side in plan.routes(g):
            now = have.get(_net(dst, ipaddress.ip_network(dst).version))
            if now == (side.congestion, side.initcwnd or 0):
                continue
            to.append(plan.route_line(dst, via, side.congestion, side.initcwnd))
            back.append(plan.route_line(dst, via, now[0], now[1]) if now and now[0] else f"route del {dst} {via}")
            said.append(f"{dst} congctl {now[0] if now else 'none'} -> {side.congestion}"
                        + (f", initcwnd {now[1] if now else 0} -> {side.initcwnd or 0}"
                           if not now or now[1] != (side.initcwnd or 0) else ""))
        if to:
            out.append(Step(f"routes of graph {g.name}: {'; '.join(said)} (connections open keep theirs)",
                            ["ip", "-n", ns, "-batch", "-"], input="\n".join(to) + "\n",
                            undo=["ip", "-n", ns, "-batch", "-"], undo_input="\n".join(back) + "\n"))
    return out


def sysctl_steps(cfg: Config) -> list[Step]:
    """Each namespace's sysctls as this version sets them, and those an older one set and this one
    leaves to the kernel back to a new namespace's values."""
    fresh = nsutil.fresh_sysctls(list(RETIRED_SYSCTLS))
    out = []
    for g in cfg.graphs:
        ns = cfg.graph_names(g).netns
        want = [(k, " ".join(v.split())) for k, v in plan.graph_sysctls(g)]
        want += [(k, fresh[k]) for k in RETIRED_SYSCTLS if fresh[k] is not None and k not in dict(want)]
        have = nsutil.read_sysctls(ns, [k for k, _ in want])
        change = [(k, v) for k, v in want if have[k] is not None and have[k] != v]
        if change:
            out.append(Step(f"sysctls of {ns}: " + ", ".join(f"{k} {have[k]} -> {v}" for k, v in change),
                            nsutil.sysctls_step_call(ns, change),
                            undo=nsutil.sysctls_step_call(ns, [(k, have[k]) for k, _ in change])))
    return out


def rule_key(spec: dict) -> tuple:
    return tuple(sorted((k, str(v)) for k, v in spec.items()))


def rule_of_line(line: str) -> dict:
    """`rule add pref 100 fwmark 1 lookup 100` as ip -j prints it."""
    words = line.split()[2:]
    pairs = dict(zip(words[::2], words[1::2], strict=True))
    names = {"pref": "priority", "lookup": "table"}
    out = {names.get(k, k): v for k, v in pairs.items()}
    if "fwmark" in out:
        out["fwmark"] = hex(int(out["fwmark"], 0))
    return out


def rule_of_json(r: dict) -> dict:
    keep = ("priority", "fwmark", "iif", "ipproto", "dport", "sport", "table")
    out = {k: r[k] for k in keep if k in r}
    if "fwmark" in out:
        out["fwmark"] = hex(int(str(out["fwmark"]), 0))
    for k in ("dport", "sport"):
        if k in out and isinstance(out[k], dict):
            out[k] = f"{out[k]['start']}-{out[k]['end']}"
    return out


def rule_steps(cfg: Config) -> list[Step]:
    """Interception rules this version adds that the namespace lacks (route mode's mark rule)."""
    out = []
    for g in plan.proxied(cfg):
        ns = cfg.graph_names(g).netns
        for family in (4, 6):
            have = {rule_key(rule_of_json(r)) for r in run_json(["ip", "-j", "-n", ns, f"-{family}", "rule", "show"])}
            lines = [x for x in plan.interception_lines(g, family)
                     if x.startswith("rule add") and rule_key(rule_of_line(x)) not in have]
            if lines:
                argv = ["ip", "-n", ns, f"-{family}", "-batch", "-"]
                out.append(Step(f"IPv{family} interception rules of graph {g.name}: {len(lines)} added", argv,
                                input="\n".join(lines) + "\n", undo=argv,
                                undo_input="\n".join(x.replace("rule add", "rule del", 1) for x in lines) + "\n"))
    return out


def unit_steps(cfg: Config) -> list[Step]:
    """Under systemd, this checkout's units installed where systemd found the running ones."""
    if service.backend(cfg.host.supervisor) != "systemd":
        return []
    n = cfg.instance_names()
    names = {service.MAIN_UNIT: service.MAIN_UNIT, service.SUPERVISOR_UNIT: unit_name(n),
             service.EXPORTER_UNIT: unit_name(n, service.EXPORTER_UNIT)}
    out = []
    for template, path in service.unit_files().items():
        installed = service.installed_unit(names[template])
        if installed is None:
            continue
        with open(installed) as f:
            running = f.read()
        text = service.unit_text(path)
        if text != running:
            out.append(Step(f"install {path} as {installed} (systemctl daemon-reload)",
                            Call("install_unit", (installed, text),
                                 f"cp {path} {installed} && systemctl daemon-reload"),
                            undo=Call("install_unit", (installed, running), f"put back {installed}; daemon-reload")))
    return out


# -- the whole plan ----------------------------------------------------------------------------------
@dataclass
class Upgrade:
    steps: list[Step]
    made: list[dict]          # entries of `up`'s plan that the upgrade makes: the journal takes them
    parts: list[Part]         # the datapath's, when it is swapped


def build(cfg: Config, info: HostInfo, journal: Journal) -> Upgrade:
    """The steps of an upgrade of the running instance to this pepctl (none: nothing to do)."""
    n = cfg.instance_names()
    old = journal.undo
    made: list[dict] = []
    steps: list[Step] = []
    if cfg.routing is not None:
        held = drain.state(cfg)
        rendered = routing.configs(cfg.routing, routing.hostname(cfg.host.instance, cfg.routing),
                                   bool(held and held.get("withdrawn")))
        changed = [routing.frr_file(n.frr_dir, d, "conf") for d, text in rendered.items()
                   if _read(routing.frr_file(n.frr_dir, d, "conf")) != text]
        if changed:
            raise Refused(f"FRR's config of this version differs ({', '.join(changed)}): an upgrade in place keeps "
                          "FRR as it runs. Drain the host (`pepctl drain`), take it down and up with this pepctl; "
                          "nothing was changed")
    try:
        with open(n.register) as f:
            registered = f.read()
    except FileNotFoundError:
        registered = None
    text = register.register_text(cfg)
    if registered != text:
        steps.append(Step(f"rewrite the register entry {n.register} (format {register.REGISTER_FORMAT})",
                          Call("register", (n.register, text), f"cat > {n.register} <<'EOF'\n{text.rstrip()}\nEOF"),
                          undo=Call("register", (n.register, registered), f"put back {n.register}")
                          if registered is not None else Call("unregister", (n.register,), f"rm {n.register}")))
    proxied = bool(plan.proxied(cfg))
    if proxied:
        with open(n.haproxy_cfg) as f:
            haproxy_changed = f.read() != plan.haproxy_config(cfg, info)
        if haproxy_changed:
            steps += reload.haproxy_prepare_steps(n, plan.haproxy_config(cfg, info), info.proxy_gid)
    for step in congestion.steps(cfg) + [s for g in cfg.graphs for s in congestion.graph_steps(cfg, g)]:
        if not journaled(step.undo_entry(), old):
            steps.append(step)
            made.append(step.undo_entry())
    ps = parts(cfg) if journal.meta.get("datapath") != plan.datapath_digest(cfg) else []
    if ps:
        steps += datapath_steps(cfg, info, ps, made, old)
    steps += route_steps(cfg) + sysctl_steps(cfg) + rule_steps(cfg)
    for g in plan.proxied(cfg):
        if g.proxy.interception == "nft":
            steps += reload.nft_steps(g, cfg.graph_names(g))
    how = service.backend(cfg.host.supervisor)
    steps += unit_steps(cfg)
    if proxied:
        steps.append(Step("replace the proxy supervisor with this pepctl's: the running one is killed (SIGKILL: told "
                          "to stop, it would stop HAProxy), the new one adopts the running HAProxy",
                          Call("supervisor_swap", (how, n.dir, n.journal, n.keeper_pid, n.keeper_log, n.supervisor_pid,
                                                   n.supervisor_state, unit_name(n)),
                               f"kill -KILL $(cat {n.keeper_pid}) $(cat {n.supervisor_pid}); " + (
                                   f"systemd starts {unit_name(n)} again" if how == "systemd" else
                                   f"{service.PEPCTL} keep {n.dir} {n.journal} >{n.keeper_log} 2>&1 &"))))
        if haproxy_changed:
            steps.append(reload.haproxy_swap_step(n, info.proxy_gid))
    exporter = []
    if cfg.host.metrics_port:
        start, stop = service.exporter_calls(n, how, cfg.host.metrics_address, cfg.host.metrics_port)
        exporter = [Step("stop the metrics exporter (it reads the maps by their layout)", stop, undo=start),
                    Step("start this pepctl's metrics exporter", start, undo=stop)]
        steps.append(exporter[0])
    for p in ps:
        marker = MARKERS[p.name]
        steps.append(Step(f"make the new {p.name} pins the instance's: exchange {p.live} and {p.staged}",
                          Call("pins_commit", (p.live, p.staged, marker, p.marker_id),
                               f"renameat2({p.live}, {p.staged}, RENAME_EXCHANGE)"),
                          undo=Call("pins_restore", (p.live, p.staged, marker, p.marker_id),
                                    f"renameat2({p.staged}, {p.live}, RENAME_EXCHANGE) if made")))
    steps += exporter[1:]
    return Upgrade(steps, made, ps)


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return None


# -- running it ---------------------------------------------------------------------------------------
def finish(cfg: Config, uj: Journal) -> None:
    """The upgrade ran: the instance's journal in this format (its meta and undos are in the upgrade
    journal's meta, so a kill here is finished by the next command), the old pins gone."""
    n = cfg.instance_names()
    j = Journal(n.journal)
    j.meta, j.undo, j.complete = uj.meta["instance_meta"], uj.meta["instance_undo"], True
    j.rewrite()
    for staged in uj.meta.get("staged", []):
        remove_dir(staged)
    remove_file(n.haproxy_cfg_new)
    uj.remove()


def recover(cfg: Config, out) -> list[str]:
    """An upgrade cut short: finished if all its steps ran, else rolled back. Returns the undos that
    failed (kept in the upgrade journal, for the next try)."""
    uj = Journal(cfg.instance_names().upgrade_journal)
    if not uj.exists:
        return []
    if uj.complete:
        finish(cfg, uj)
        return []
    print(f"a previous `upgrade` of {cfg.host.instance} did not finish: rolling it back", file=out)
    errors = undo_all(uj, log=lambda m: print(m, file=out))
    if not errors:
        uj.remove()
    return errors


def upgrade(cfg: Config, info: HostInfo, journal: Journal, out) -> int:
    """Runs the upgrade (the caller holds the lock, and recovered what was cut short)."""
    n = cfg.instance_names()
    before = journal.format
    u = build(cfg, info, journal)
    uj = Journal(n.upgrade_journal)
    uj.start({"config": cfg.path, "from_format": before, "pid": os.getpid(), "started": time.time()})
    print(f"upgrading instance {cfg.host.instance} (journal format {before} -> {JOURNAL_FORMAT}): "
          f"{len(u.steps)} step(s)", file=out)
    try:
        apply(u.steps, uj, log=lambda m: print(m, file=out))
    except (StepError, OSError) as e:
        left = uj.undo
        if not left:
            uj.remove()
        raise StepError(f"{e}\n" + ("rolled back: the instance runs as before the upgrade (its datapath, routes, "
                                     "sysctls and HAProxy's config; the supervisor and exporter of this pepctl "
                                     "stay)" if not left else rollback_left(uj, "`pepctl upgrade` again"))) from None
    build_entries = [e for e in (s.undo_entry() for s in plan.build(cfg, info)) if e is not None]
    meta = {**journal.meta, "format": JOURNAL_FORMAT, "datapath": plan.datapath_digest(cfg),
            "build": build_digest(cfg),
            "upgraded": {"at": time.time(), "from_format": before, "pid": os.getpid()}}
    uj.update_meta(instance_meta=meta, instance_undo=merge(journal.undo, build_entries, u.made),
                   staged=[p.staged for p in u.parts])
    uj.mark_complete()
    finish(cfg, uj)
    print(f"instance {cfg.host.instance} upgraded: it runs this pepctl's datapath, HAProxy config and processes",
          file=out)
    return 0
