"""pepctl drain: take a proxy host out of the cluster without cutting a connection.

A host cannot simply withdraw its shares: the routers would send its connections' next packets
to another host, which holds no socket for them. So drain goes in three steps:

  1. hand over new flows: every share this host announces gets a live bypass rule (its new flows
     skip this proxy, decided on their SYN as any bypass is), and policy rules in the graph's
     namespace that route that share's traffic to the share's other host on the routers' links:
     from the subscriber (in on c_in) toward that host's access address, to the subscriber (in on
     s_in: the origin's answers to that host's connections) toward its origin address. The
     packets of this host's own connections meet their sockets first (the interception's rules
     come before, names.RULE_PREF) and stay here;
  2. wait until this host's proxied connections have finished (or --timeout);
  3. withdraw every announcement (FRR's prefix lists emptied, the routers told at once): the
     routers now send the shares to their other hosts, which hold every connection made since 1.

`pepctl drain --undo` announces the shares again and removes the rules and the bypass; flows the
other hosts took meanwhile are theirs until they end: undo after they have drained, or accept
that the shares' connections on other hosts are cut. The state is INSTANCE/frr/drained.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import time

from . import bypass, nsutil, routing
from .config import Config
from .config.rules import Rule, parse_rule
from .names import C_IN, RULE_PREF, S_IN
from .runner import Call, StepError, action, pid_alive, read_pid, remove_file, run, write_file

DRAIN_PREF = RULE_PREF + 100       # after the interception's rules: a socket's packets stay here
DRAIN_TABLE_BASE = 200             # share k's hand-over routes: table 200+k
BGP_PORT = 179
# A connection this host still carries, half-closed ones too: every TCP state but LISTEN and the
# two that carry nothing more, TIME_WAIT (6) and CLOSE (7); a TIME_WAIT socket lasts a minute.
HELD_STATES = sum(1 << s for s in range(1, 12) if s not in (nsutil.TCP_LISTEN, 6, 7))


def handover_lines(r: routing.Routing, verb: str, version: int) -> list[str]:
    """`ip -batch` lines ("add" or "del") of the rules and routes that send each share's traffic of
    one family to its other host. `ip rule` takes its family from the command line only: the
    IPv6 lines run in `ip -6 -batch`."""
    lines = []
    default = "0.0.0.0/0" if version == 4 else "::/0"
    for k, nets in enumerate(routing.share_prefixes(r)):
        other = routing.other_host(r, k)
        if k not in routing.roles(r) or other is None:
            continue
        table = DRAIN_TABLE_BASE + k
        nets = [n for n in nets if n.version == version]     # this family's
        if verb == "add" and nets:
            lines.append(f"route replace {default} via {other.address('access', version)} dev {C_IN} table {table}")
            lines += [f"route replace {net} via {other.address('origin', version)} dev {S_IN} table {table}"
                      for net in nets]
        for net in nets:
            lines += [f"rule {verb} pref {DRAIN_PREF} from {net} iif {C_IN} lookup {table}",
                      f"rule {verb} pref {DRAIN_PREF} to {net} iif {S_IN} lookup {table}"]
        if verb == "del" and nets:
            lines.append(f"route flush table {table}")
    return lines


def handover(r: routing.Routing, ns: str, verb: str, check: bool = True) -> None:
    for v in routing.families(r):
        run(["ip", "-n", ns, f"-{v}", "-batch", "-"], input="\n".join(handover_lines(r, verb, v)) + "\n",
            check=check)


def handover_rules(r: routing.Routing) -> set[Rule]:
    """The bypass rules that keep the shares' new flows from this proxy."""
    return {parse_rule("client", str(net)) for k in routing.roles(r) if routing.other_host(r, k) is not None
            for net in routing.share_prefixes(r)[k]}


def held_connections(ns: str) -> int:
    """TCP connections in the graph's namespace, but BGP's: the proxy's, both sides of each."""
    def count() -> int:
        return sum(1 for family in (socket.AF_INET, socket.AF_INET6)
                   for sockid, _ in nsutil.sock_diag(family, HELD_STATES)
                   if BGP_PORT not in (sockid[0], sockid[1]))
    return nsutil.in_netns(ns, count)


def announce_call(cfg: Config, drained: bool) -> Call:
    """What announces this host's shares (none when drained), as an action a journal can name: FRR's
    config files, and bgpd's prefix lists replaced live, the routers told now, not at FRR's next
    route-map timer."""
    r = cfg.routing
    folder = cfg.instance_names().frr_dir
    confs = routing.configs(r, routing.hostname(cfg.host.instance, r), drained)
    commands = ["configure terminal"]
    for name, lines in routing.prefix_lists(r, drained).items():
        commands += [f"no {name}", *lines]
    commands += ["end", *(f"clear bgp {routing.AFI[v]} * soft out" for v in routing.families(r))]
    shown = "\n".join([*(f"cat > {routing.frr_file(folder, d, 'conf')} <<'EOF'\n{t.rstrip()}\nEOF"
                          for d, t in confs.items()), shlex.join(routing.vtysh_argv(folder, *commands))])
    return Call("frr_announce", (folder, confs, commands), shown)


@action("frr_announce")
def _frr_announce(folder: str, confs: dict, commands: list) -> None:
    # The files say what runs: a restarted daemon announces the same.
    for daemon, text in confs.items():
        write_file(routing.frr_file(folder, daemon, "conf"), text)
    run(routing.vtysh_argv(folder, *commands))


def announce(cfg: Config, drained: bool) -> None:
    _frr_announce(*announce_call(cfg, drained).args)


def state_path(cfg: Config) -> str:
    return os.path.join(cfg.instance_names().frr_dir, "drained")


def drain(cfg: Config, installed: Config, timeout: float, out) -> int:
    r = cfg.routing
    g = next(g for g in cfg.graphs if g.name == r.graph)
    ns = cfg.graph_names(g).netns
    rules = handover_rules(r)
    handover(r, ns, "add")
    bypass.add(cfg, installed, g, sorted(rules))
    bypass.write_live(cfg, g, bypass.read_live(cfg, g) | rules)
    write_file(state_path(cfg), json.dumps({"since": time.time(), "withdrawn": False}) + "\n")
    shares = ", ".join(f"{' '.join(map(str, routing.share_prefixes(r)[k]))} -> {routing.other_host(r, k).name}"
                       for k in sorted(routing.roles(r)) if routing.other_host(r, k))
    print(f"{r.host}: new flows go to the shares' other hosts ({shares})", file=out)
    deadline = time.monotonic() + timeout
    held = held_connections(ns)
    while held and time.monotonic() < deadline:
        print(f"{r.host}: waiting for {held} proxied socket(s) to close", file=out, flush=True)
        time.sleep(min(2.0, max(0.1, deadline - time.monotonic())))
        held = held_connections(ns)
    announce(cfg, drained=True)
    write_file(state_path(cfg), json.dumps({"since": time.time(), "withdrawn": True, "cut": held}) + "\n")
    if held:
        print(f"{r.host}: --timeout {timeout:g} s passed with {held} socket(s) open: withdrawn anyway; "
              "those connections end now", file=out)
    else:
        print(f"{r.host}: drained: no proxied connection left, every share withdrawn", file=out)
    return 0


def undo(cfg: Config, out) -> int:
    r = cfg.routing
    g = next(g for g in cfg.graphs if g.name == r.graph)
    ns = cfg.graph_names(g).netns
    announce(cfg, drained=False)
    handover(r, ns, "del", check=False)
    rules = handover_rules(r) - bypass.config_rules(g.bypass)
    live = bypass.read_live(cfg, g)
    bypass.remove(cfg, g, rules & live)
    bypass.write_live(cfg, g, live - rules)
    remove_file(state_path(cfg))
    print(f"{r.host}: shares announced again; new flows of its shares come here", file=out)
    return 0


def state(cfg: Config) -> dict | None:
    try:
        with open(state_path(cfg)) as f:
            return json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def check_drainable(cfg: Config) -> None:
    if cfg.routing is None:
        raise StepError(f"{cfg.path} has no [routing]: drain moves a cluster host's shares to other hosts, "
                        "and this host has none; take it out with `pepctl down`")
    alone = [k for k in routing.roles(cfg.routing) if routing.other_host(cfg.routing, k) is None]
    if alone:
        raise StepError(f"{cfg.path}: routing.hosts gives shares {', '.join(map(str, alone))} no other host: "
                        "draining would leave their subscribers with no proxy host; add a host to the cluster first")
    if not os.path.exists(routing.frr_file(cfg.instance_names().frr_dir, "bgpd", "vty")):
        raise StepError(f"instance {cfg.host.instance}: FRR's bgpd is not running; bring the instance up first")



def report(cfg: Config) -> dict:
    """[routing] as it runs: FRR's daemons, the sessions to the routers (BGP and BFD), what this
    host announces, and the drain."""
    r = cfg.routing
    folder = cfg.instance_names().frr_dir
    pids = {d: read_pid(routing.frr_file(folder, d, "pid")) for d in routing.FRR_DAEMONS}
    out: dict = {"host": r.host, "daemons": {d: {"pid": pid, "running": bool(pid and pid_alive(pid))}
                                              for d, pid in pids.items()},
                 "shares": {str(k): {"role": role, "prefixes": list(map(str, routing.share_prefixes(r)[k]))}
                            for k, role in sorted(routing.roles(r).items())},
                 "drain": state(cfg)}
    bgp = run(routing.vtysh_argv(folder, "show bgp summary json"), check=False)
    bfd = run(routing.vtysh_argv(folder, "show bfd peers json"), check=False)
    try:
        peers = routing.summary_peers(bgp.stdout)
        bfd_state = {p.get("peer"): p.get("status") for p in json.loads(bfd.stdout or "[]")}
    except ValueError:
        out["error"] = (bgp.stderr or bfd.stderr or bgp.stdout).strip()[:300]
        return out
    out["peers"] = {addr: {"side": next((x.side for x in r.peers if str(x.address) == addr), "?"),
                           "bgp": p.get("state"), "bfd": bfd_state.get(addr), "announced": p.get("pfxSnt"),
                           "up_since": p.get("peerUptime")} for addr, p in peers.items()}
    return out
