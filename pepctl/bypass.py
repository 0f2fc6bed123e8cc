"""Per-flow bypass rules: the config's [graph.bypass] plus live rules from `pepctl bypass add`.

One grammar, from the config and the command line to the map key (pepctl/config/rules.py): a
Rule (KIND VALUE, checked and made canonical there) becomes entries of the instance's flow maps,
keyed by the graph's slot (pepctl/flow_maps.py). The maps are the datapath's truth. pepctl keeps two records
beside them: the live rules (INSTANCE/GRAPH.bypass.rules, in the format of `bypass add
--from-file`), and the config rules installed by the last up/reload (the journal's config).
Changing a rule changes only new flows: every flow keeps the verdict of its first SYN
(tc/pep_flow.h).
"""

from __future__ import annotations

import os

from . import flow_maps
from .config import Bypass, Config, Graph
from .config.rules import Rule, RuleError, port_text
from .runner import Call, Step, action


def config_rules(b: Bypass) -> set[Rule]:
    rules = {Rule("client", str(n)) for n in b.clients} | {Rule("server", str(n)) for n in b.servers}
    rules |= {Rule("port", port_text(lo, hi)) for lo, hi in b.ports}
    return rules


def pins(cfg: Config) -> str:
    return cfg.instance_names().flow_pins


def live_path(cfg: Config, g: Graph) -> str:
    # In the format of `bypass add --from-file`, so an operator can copy it elsewhere.
    return cfg.graph_names(g).live_rules


def read_live_file(path: str) -> set[Rule]:
    """pepctl wrote this file from checked rules: read it without checking them again (it counts
    at 100,000 rules)."""
    try:
        with open(path) as f:
            return {Rule(*line.split()) for line in f if line.strip() and not line.startswith("#")}
    except FileNotFoundError:
        return set()


def read_live(cfg: Config, g: Graph) -> set[Rule]:
    return read_live_file(live_path(cfg, g))


def write_live(cfg: Config, g: Graph, rules: set[Rule]) -> None:
    path = live_path(cfg, g)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write("# live bypass rules of this graph, written by pepctl bypass add/del\n")
        f.writelines(f"{r.kind} {r.value}\n" for r in sorted(rules))
    os.replace(tmp, path)


def map_args(rules: set[Rule] | list[Rule]) -> dict:
    """Rules -> the keyword arguments of flow_maps.add_rules/del_rules. Networks stay text:
    rule values are canonical, and flow_maps encodes text quickest."""
    out: dict = {"clients": [], "servers": [], "ports": []}
    for r in rules:
        if r.kind == "port":
            lo, _, hi = r.value.partition("-")
            out["ports"].append((int(lo), int(hi or lo)))
        else:
            out[f"{r.kind}s"].append(r.value)
    return out


def install(cfg: Config, g: Graph, rules: set[Rule] | list[Rule]) -> dict:
    """Writes rules to the maps (idempotent: for up and reload); returns flow_maps.add_rules' answer."""
    return flow_maps.add_rules(pins(cfg), g.index, **map_args(rules)) if rules else {"method": "none"}


def add(cfg: Config, installed: Config, g: Graph, rules: list[Rule]) -> dict:
    """`bypass add`: all or nothing. Capacity is checked before the first map write against what
    every graph of the instance holds (its config rules as installed, and its live rules); a write
    that fails anyway is undone, so the maps are exactly as before. Returns add_rules' answer."""
    held = {o.name: config_rules(o.bypass) | read_live(cfg, o) for o in installed.graphs if o.proxy.enabled}
    mine = flow_maps.rule_keys(g.index, **map_args(held.get(g.name, set())))
    want = flow_maps.rule_keys(g.index, **map_args(set(rules)))
    new = {name: sorted(set(keys) - set(mine[name])) for name, keys in want.items()}
    used = dict.fromkeys(new, 0)
    for o in installed.graphs:
        if o.name in held:
            for name, keys in flow_maps.rule_keys(o.index, **map_args(held[o.name])).items():
                used[name] += len(keys)
    for name, keys in new.items():
        if keys:
            with flow_maps.open_map(pins(cfg), name) as m:
                cap = m.max_entries
            if used[name] + len(keys) > cap:
                raise RuleError(f"{name} holds {used[name]:,} entries of at most {cap:,} (all graphs); these "
                                f"rules add {len(keys):,}: remove rules or merge them into wider prefixes; "
                                "nothing was changed")
    done: dict = {"method": "none"}
    try:
        for name, keys in new.items():
            if not keys:
                continue
            with flow_maps.open_map(pins(cfg), name) as m:
                how = flow_maps.write_keys(m, keys, flow_maps.PRESENT)
            done[name] = len(keys)
            if name != "bypass_ports" or done["method"] == "none":
                done["method"] = how
    except OSError as e:
        for name, keys in new.items():
            flow_maps.del_keys(pins(cfg), name, keys)   # only the keys this call added
        raise RuleError(f"writing the rules failed: {e}; the maps are as they were, nothing was changed") from None
    return done


def remove(cfg: Config, g: Graph, rules: set[Rule]) -> None:
    if rules:
        flow_maps.del_rules(pins(cfg), g.index, **map_args(rules))


def sync(cfg: Config, g: Graph, old_config_rules: set[Rule]) -> tuple[int, int]:
    """Make the maps hold exactly config rules + live rules; return (added, removed)."""
    want = config_rules(g.bypass) | read_live(cfg, g)
    gone = old_config_rules - want
    remove(cfg, g, gone)
    install(cfg, g, want)   # idempotent: updating a present key changes nothing
    return len(want), len(gone)


@action("bypass_install")
def _install(pin_dir: str, slot: int, rules: list, live_file: str) -> None:
    """The config's rules of a graph, and its live rules if any (a graph brought up again)."""
    want = {Rule(*r) for r in rules} | read_live_file(live_file)
    if want:
        flow_maps.add_rules(pin_dir, slot, **map_args(want))


def install_step(cfg: Config, g: Graph, pin_dir: str | None = None) -> Step:
    """The graph's config and live rules into the maps pinned in pin_dir (default the instance's)."""
    rules = sorted(config_rules(g.bypass))
    shown = ", ".join(f"{r.kind} {r.value}" for r in rules[:8]) + (" ..." if len(rules) > 8 else "")
    where = pin_dir or pins(cfg)
    return Step(f"install the bypass rules of graph {g.name}",
                Call("bypass_install", (where, g.index, [list(r) for r in rules], live_path(cfg, g)),
                     f"# bpf(2) {where}/maps: bypass rules of slot {g.index}: {shown or 'none'}"
                     f" (and the live ones of {live_path(cfg, g)}, if any)"))


@action("bypass_change")
def _change(pin_dir: str, slot: int, added: list, removed: list, kept_ports: list) -> None:
    """A graph's entries in the maps, for rules added and removed (of its config and live rules):
    the added ones' first, then those of the removed ones that no rule left needs. Networks are an
    entry each; port ranges share the entries of the ports they both name, so the port rules kept
    come along. Its own undo is the same with added and removed swapped."""
    adding, removing = map_args([Rule(*r) for r in added]), map_args([Rule(*r) for r in removed])
    if any(adding.values()):
        flow_maps.add_rules(pin_dir, slot, **adding)
    staying = adding["ports"] + map_args([Rule(*r) for r in kept_ports])["ports"]
    removing["ports"] = _ports_left(removing["ports"], staying)
    if any(removing.values()):
        flow_maps.del_rules(pin_dir, slot, **removing)


def _ports_left(gone: list[tuple[int, int]], staying: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The ports of ranges gone that no range staying names, as ranges."""
    ports = {p for lo, hi in gone for p in range(lo, hi + 1)} - {p for lo, hi in staying for p in range(lo, hi + 1)}
    return [(p, p) for p in sorted(ports)]


def change_step(cfg: Config, g: Graph, before: set[Rule], after: set[Rule]) -> Step:
    """A reload's change of a graph's bypass rules (config rules and live ones together). The journal
    holds what changes, not every rule: live rules may be 100,000s."""
    def listed(rules: set[Rule]) -> str:
        shown = ", ".join(f"{r.kind} {r.value}" for r in sorted(rules)[:8])
        return (shown + (" ..." if len(rules) > 8 else "")) or "none"
    added, removed = after - before, before - after
    kept = [list(r) for r in sorted(before & after) if r.kind == "port"]
    add_, remove_ = [list(r) for r in sorted(added)], [list(r) for r in sorted(removed)]
    return Step(f"bypass rules of graph {g.name}: {len(added)} added, {len(removed)} removed",
                Call("bypass_change", (pins(cfg), g.index, add_, remove_, kept),
                     f"# bpf(2) {pins(cfg)}/maps: bypass rules of slot {g.index}: add {listed(added)}; "
                     f"remove {listed(removed)}"),
                undo=Call("bypass_change", (pins(cfg), g.index, remove_, add_, kept),
                          f"bypass rules of slot {g.index} back as before the reload"))


def counters(cfg: Config, g: Graph) -> dict[str, int]:
    return flow_maps.read_counters(pins(cfg), g.index)
