"""Per-flow bypass rules: the config's [graph.bypass] plus live rules from `pepctl bypass add`.

One grammar, from the config and the command line to the map key: a Rule (KIND VALUE, checked
and made canonical by parse_rule) becomes entries of the instance's flow maps, keyed by the
graph's slot (pepctl/flow_maps.py). The maps are the datapath's truth. pepctl keeps two records
beside them: the live rules (INSTANCE/GRAPH.bypass.rules, in the format of `bypass add
--from-file`), and the config rules installed by the last up/reload (the journal's config).
Changing a rule changes only new flows: every flow keeps the verdict of its first SYN
(tc/pep_flow.h).
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import stat
from typing import NamedTuple

from . import flow_maps
from .config import (
    Bypass,
    Config,
    Graph,
    _port_range,
    address_kind,
    ascii_problem,
    kind_message,
    kind_problem,
    zone_problem,
)
from .runner import Call, Step, action

KINDS = ("client", "server", "port")


class Rule(NamedTuple):
    """A tuple, not a dataclass: made, hashed and sorted in C, which counts at 100,000 rules."""
    kind: str        # client | server | port
    value: str       # "198.18.0.0/24" | "2001:2::/48" | "80" | "8000-8080"

    def as_json(self) -> dict:
        return {"kind": self.kind, "value": self.value}


class RuleError(ValueError):
    pass


def parse_rule(kind: str, value: str) -> Rule:
    """One rule, checked and canonical; RuleError names the value and says what to do. ASCII only
    (int() would read a full-width "80" (U+FF18 U+FF10) as 80), and the address kinds of the config's
    [graph.bypass] (pepctl/config.py kind_problem): no flow has a multicast client."""
    if kind not in KINDS:
        hint = "; write it in ASCII" if not kind.isascii() else ""
        raise RuleError(f"rule kind {kind!r}: use one of {', '.join(KINDS)}{hint}")
    if not value.isascii():
        raise RuleError(f"{kind} {value!r}: {ascii_problem(value)}")
    if kind == "port":
        got = _port_range(value)
        if isinstance(got, str):
            raise RuleError(f"port {value!r}: {got}")
        lo, hi = got
        return Rule("port", str(lo) if lo == hi else f"{lo}-{hi}")
    fast = _canonical_net(value)
    if fast is not None:
        text, version, number, plen = fast
        at = address_kind(version, number, plen)
        msg = kind_message(at, kind) if at is not None else None
        if msg:
            raise RuleError(f"{kind} {value!r}: {msg}")
        return Rule(kind, text)
    if "%" in value:
        raise RuleError(f"{kind} {value!r}: {zone_problem(value)}")
    try:
        net = ipaddress.ip_network(value, strict=True)
    except ValueError as e:
        raise RuleError(f"{kind} {value!r}: {e}; write a network like 198.18.0.0/24 or 2001:2:0:1::/64") from None
    msg = kind_problem(net, kind)
    if msg:
        raise RuleError(f"{kind} {value!r}: {msg}")
    return Rule(kind, str(net))


def _canonical_net(value: str) -> tuple[str, int, int, int] | None:
    """(str(ip_network(value)), IP version, network as an int, prefix length) by inet_pton/inet_ntop,
    several times quicker (it counts at 100,000 rules); None for anything unusual (netmasks, mapped
    IPv6, errors), which ipaddress then judges."""
    got = flow_maps.fast_prefix(value)
    if got is None:
        return None
    family, packed, plen = got
    text = socket.inet_ntop(family, packed)
    if "." in text and family == socket.AF_INET6:
        return None
    return f"{text}/{plen}", 6 if family == socket.AF_INET6 else 4, int.from_bytes(packed, "big"), plen


MAX_SHOWN = 20     # bad lines a file's RuleError names; it counts the rest
_WORD_RE = re.compile(r"[^ \t]+")   # words are apart by spaces or tabs: str.split() would also part at U+3000


def parse_rules_file(path: str) -> list[Rule]:
    """The rules of a file, one `KIND VALUE` a line, words apart by spaces or tabs; `#` starts a
    comment; blank lines and repeated rules are fine. A line may end in LF or CRLF, and the file
    may start with a UTF-8 byte-order mark (a file saved on Windows reads the same); rules are
    ASCII, comments any UTF-8. Every line is checked before any rule is used: one bad line and
    RuleError names every bad line (up to MAX_SHOWN) as FILE:LINE, and says nothing was changed.
    A file that cannot be read, or is not a regular file (a folder, a FIFO, a device), is a
    RuleError too."""
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; a regular file ignores it.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise RuleError(f"{path}: {e.strerror}; give a file of rules, one `KIND VALUE` a line") from None
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        mode = 0
    if not stat.S_ISREG(mode):   # checked before open(): it refuses a folder's fd with its own error
        os.close(fd)
        what = "a folder" if stat.S_ISDIR(mode) else "not a regular file"
        raise RuleError(f"{path}: is {what}; give a file of rules, one `KIND VALUE` a line")
    with open(fd, "rb") as f:
        try:
            return _rules_of_lines(path, f)
        except OSError as e:
            raise RuleError(f"{path}: {e.strerror}; nothing was changed") from None


def _rules_of_lines(path: str, f) -> list[Rule]:
    rules, errors = [], []
    for number, raw in enumerate(f, 1):
        where = f"{path}:{number}"
        if number == 1:
            raw = raw.removeprefix(b"\xef\xbb\xbf")   # a UTF-8 byte-order mark, as some Windows editors write
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            errors.append(f"{where}: byte 0x{raw[e.start]:02x} (column {e.start + 1}) is not UTF-8; write rules "
                          "in ASCII and save the file as UTF-8")
            continue
        line = line.removesuffix("\n").removesuffix("\r")
        words = _WORD_RE.findall(line.partition("#")[0])
        if not words:
            continue
        if len(words) != 2:
            shown = line.strip(" \t")
            errors.append(f"{where}: {shown!r}: write one rule a line: KIND VALUE, KIND one of {', '.join(KINDS)}")
            continue
        try:
            rules.append(parse_rule(*words))
        except RuleError as e:
            errors.append(f"{where}: {e}")
    if errors:
        more = f"\n... and {len(errors) - MAX_SHOWN} more" if len(errors) > MAX_SHOWN else ""
        raise RuleError("\n".join(errors[:MAX_SHOWN]) + more + f"\n{path}: nothing was changed")
    return rules


def config_rules(b: Bypass) -> set[Rule]:
    rules = {Rule("client", str(n)) for n in b.clients} | {Rule("server", str(n)) for n in b.servers}
    rules |= {Rule("port", str(lo) if lo == hi else f"{lo}-{hi}") for lo, hi in b.ports}
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


def install_step(cfg: Config, g: Graph) -> Step:
    rules = sorted(config_rules(g.bypass))
    shown = ", ".join(f"{r.kind} {r.value}" for r in rules[:8]) + (" ..." if len(rules) > 8 else "")
    return Step(f"install the bypass rules of graph {g.name}",
                Call("bypass_install", (pins(cfg), g.index, [list(r) for r in rules], live_path(cfg, g)),
                     f"# bpf(2) {pins(cfg)}/maps: bypass rules of slot {g.index}: {shown or 'none'}"
                     f" (and the live ones of {live_path(cfg, g)}, if any)"))


def counters(cfg: Config, g: Graph) -> dict[str, int]:
    return flow_maps.read_counters(pins(cfg), g.index)
