"""The proxy half of a graph's plan: interception and HAProxy.

Two interception modes (the Netdev talk measured netfilter's cost, so both
exist to compare):
  nft    an nftables table of our own, loaded atomically: `socket transparent`
         marks packets of flows HAProxy already owns, `tproxy` hands new SYNs
         on the intercepted ports to HAProxy's single listen port. The mark
         routes them to the local table.
  route  no netfilter at all: policy rules send the intercepted ports to the
         local table, where HAProxy listens transparently on each port.
         Flows are intercepted when initiated from the access side only:
         matching replies by source port on the origin side is exact, but
         matching origin-initiated flows by destination port would also catch
         replies to clients' ephemeral ports.
"""

from __future__ import annotations

from . import haproxy_sock
from .config import Config, Graph
from .hostinfo import HostInfo, maxconn_for
from .plan import (
    C_IN,
    REPO,
    S_IN,
    TPROXY_MARK,
    TPROXY_TABLE,
    GraphNames,
    _has_clsact,
    ifindex_bytes,
    in_netns,
    pin_dir,
    u32_bytes,
    write_step,
)
from .render_haproxy import render_haproxy
from .render_nft import render_nft
from .runner import Step

RULE_PREF = 100


def local_table_steps(ns: str) -> list[Step]:
    """Table 100 delivers everything locally: where intercepted packets are routed."""
    return [
        Step(f"local delivery table {TPROXY_TABLE} ({fam}) in {ns}",
             ["ip", fam, "-n", ns, "route", "replace", "local", default, "dev", "lo", "table", str(TPROXY_TABLE)])
        for fam, default in (("-4", "0.0.0.0/0"), ("-6", "::/0"))
    ]


def port_arg(lo: int, hi: int) -> str:
    return str(lo) if lo == hi else f"{lo}-{hi}"


def interception_steps(cfg: Config, g: Graph, n: GraphNames) -> list[Step]:
    ns = n.netns
    steps = local_table_steps(ns)
    if g.proxy.interception == "nft":
        steps += [
            Step(f"policy rule fwmark {TPROXY_MARK} -> table {TPROXY_TABLE} ({fam}) in {ns}",
                 ["ip", fam, "-n", ns, "rule", "add", "pref", str(RULE_PREF), "fwmark", str(TPROXY_MARK),
                  "lookup", str(TPROXY_TABLE)])
            for fam in ("-4", "-6")
        ]
        steps.append(write_step(n.nft_file, render_nft(g, table=n.nft_table, mark=TPROXY_MARK),
                                f"write nftables interception table {n.nft_table}"))
        steps.append(Step(f"load nftables table {n.nft_table} in {ns}",
                          ["ip", "netns", "exec", ns, "nft", "-f", n.nft_file]))
    else:
        for lo, hi in g.proxy.ports or ():
            p = port_arg(lo, hi)
            for fam in ("-4", "-6"):
                steps += [
                    Step(f"intercept TCP to port {p} from the access side ({fam}) in {ns}",
                         ["ip", fam, "-n", ns, "rule", "add", "pref", str(RULE_PREF), "iif", C_IN,
                          "ipproto", "tcp", "dport", p, "lookup", str(TPROXY_TABLE)]),
                    Step(f"deliver origin replies from port {p} to the proxy ({fam}) in {ns}",
                         ["ip", fam, "-n", ns, "rule", "add", "pref", str(RULE_PREF), "iif", S_IN,
                          "ipproto", "tcp", "sport", p, "lookup", str(TPROXY_TABLE)]),
                ]
    return steps


def haproxy_config(cfg: Config, g: Graph, n: GraphNames, info: HostInfo) -> str:
    cpus = list(info.cpus)
    if g.proxy.threads:
        cpus = [cpus[i % len(cpus)] for i in range(g.proxy.threads)]
    maxconn = g.proxy.maxconn or maxconn_for(info.nofile)
    return render_haproxy(g, instance=cfg.host.instance, graph_dir=n.dir, cpus=cpus, maxconn=maxconn)


def haproxy_start_step(n: GraphNames) -> Step:
    return Step(f"start HAProxy in {n.netns}",
                ["ip", "netns", "exec", n.netns, "haproxy", "-W", "-f", n.haproxy_cfg],
                undo=["@stop-pidfile", n.haproxy_pid],
                background={"pidfile": n.haproxy_pid, "logfile": n.haproxy_log,
                            "ready": lambda: haproxy_sock.answers(n.haproxy_sock), "timeout": 15})


BYPASS_OBJ = f"{REPO}/tc/bypass.o"
FLOW_PREF = 20      # tc filter preference of flow_ingress on c_in / s_in
SIDE_ACCESS, SIDE_ORIGIN = 1, 2   # enum bypass_side in tc/pep_bypass.h
PEPCTL = f"{REPO}/scripts/pepctl"


def bypass_load_argv(pins: str) -> list[str]:
    """Loads tc/bypass.o: its program under PINS/prog, its own maps under PINS/maps."""
    return ["bpftool", "prog", "loadall", BYPASS_OBJ, f"{pins}/prog", "type", "classifier", "pinmaps", f"{pins}/maps"]


def bypass_steps(cfg: Config, g: Graph, n: GraphNames) -> list[Step]:
    """The per-flow bypass program on both sides of the namespace, with the config's rules.

    It starts in fail-open (proxy_state.up = 0): flows arriving before HAProxy
    answers are forwarded, not black-holed; the watchdog marks the proxy up."""
    pins = f"{pin_dir(cfg)}/{g.name}"
    ns = n.netns
    steps = [
        Step(f"create pin folder {pins}", ["mkdir", "-p", pins]),
        Step(f"load the bypass program and maps of graph {g.name}", bypass_load_argv(pins)),
    ]
    for dev, side, peer in ((C_IN, SIDE_ACCESS, S_IN), (S_IN, SIDE_ORIGIN, C_IN)):
        steps.append(Step(f"{ns}/{dev} is the {'access' if side == SIDE_ACCESS else 'origin'} side",
                          ["bpftool", "map", "update", "pinned", f"{pins}/maps/side_config", "key",
                           ifindex_bytes(dev, ns), "value", *u32_bytes(side), ifindex_bytes(peer, ns)]))
    steps.append(Step(f"install the bypass rules of graph {g.name}",
                      [PEPCTL, "-c", cfg.path, "bypass", "sync", "--graph", g.name]))
    for dev in (C_IN, S_IN):
        steps += [
            Step(f"add clsact qdisc on {ns}/{dev}", in_netns(ns, ["tc", "qdisc", "add", "dev", dev, "clsact"]),
                 done=lambda dev=dev: _has_clsact(dev, ns)),
            Step(f"attach flow_ingress to {ns}/{dev} ingress",
                 in_netns(ns, ["tc", "filter", "add", "dev", dev, "ingress", "pref", str(FLOW_PREF), "handle", "1",
                               "bpf", "direct-action", "object-pinned", f"{pins}/prog/flow_ingress"])),
        ]
    return steps


def watchdog_step(cfg: Config, g: Graph, n: GraphNames) -> Step:
    from .watchdog import read_state
    return Step(f"start the fail-open watchdog of graph {g.name}",
                [PEPCTL, "-c", cfg.path, "watchdog", g.name],
                undo=["@stop-pidfile", f"{n.dir}/watchdog.pid"],
                background={"pidfile": f"{n.dir}/watchdog.pid", "logfile": f"{n.dir}/watchdog.log",
                            "ready": lambda: read_state(n).get("mode") == "proxy", "timeout": 10})


def proxy_steps(cfg: Config, g: Graph, n: GraphNames, info: HostInfo) -> list[Step]:
    steps = interception_steps(cfg, g, n)
    steps += bypass_steps(cfg, g, n)
    steps.append(write_step(n.haproxy_cfg, haproxy_config(cfg, g, n, info), f"write {n.haproxy_cfg}"))
    steps.append(Step(f"check {n.haproxy_cfg}", ["haproxy", "-c", "-q", "-f", n.haproxy_cfg]))
    steps.append(haproxy_start_step(n))
    steps.append(watchdog_step(cfg, g, n))
    return steps
