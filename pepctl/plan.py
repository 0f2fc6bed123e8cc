"""From a Config and the host's facts to the exact list of Steps `up` runs.

Per host:   bpffs; the pin folder with the steering programs (tc/steer.o) and, when a graph is
            proxied, the flow program (tc/flow.o): one load of each, shared by every graph;
            the instance's folders; clsact on the NIC; host tuning; the congestion controls of
            pepctl's own that a side selects (pep_radio: registered once per host, before any
            route names it, and shared with other instances: pepctl/congestion.py).
Per graph:  namespace INSTANCE-NAME with c_in and s_in (ifindexes of its slot, see
            tc/pep_flow.h), their host ends INSTANCEc<vlan> and INSTANCEs<vlan>; pep_radio's
            parameters for the namespace when its access side runs it; addresses, routes with
            each side's congestion control (congctl) and initcwnd; the VLAN <-> port entries of
            the steering maps and port_ingress on both ports; when proxied, interception (bpf,
            nft or route), the graph's entries in the flow maps, and flow_ingress on c_in and s_in.
Then:       one HAProxy config for every graph, the supervisor that runs HAProxy, and last
            trunk_ingress on the NIC: traffic arrives only when everything is in place.

A thousand graphs must come up in well under a minute, so commands are batched: one
`ip -batch` creates every namespace, one per namespace builds its links, addresses and routes,
one `tc -batch` per side attaches the programs, and map writes and sysctls run in-process.
"""

from __future__ import annotations

import hashlib
import os
import socket

from haproxy.render import STATS_ENV, GraphProxy, Process, render

from . import bpfsys, bypass, congestion, experiment, flow_maps, nsutil, register, routing, service, steering
from .config import Config, Graph, Side
from .hostinfo import HostInfo
from .names import (
    C_IN,
    FLOW_PREF,
    LOCAL_TABLE,
    PORT_PREF,
    REGISTER,
    RULE_PREF,
    S_IN,
    TRUNK_PREF,
    GraphNames,
    in_netns,
    instance_files,
    proxy_files,
)
from .render_nft import render_nft
from .runner import Call, Step, StepError, action, daemon_step, note, remove_file, run, run_json, wait_for, write_file
from .tuning import tuning_steps

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEER_OBJ = os.path.join(REPO, "tc", "steer.o")
FLOW_OBJ = os.path.join(REPO, "tc", "flow.o")

NETNS_SYSCTLS = [
    ("net.ipv4.ip_forward", "1"),
    ("net.ipv6.conf.all.forwarding", "1"),
    # Intercepted packets are addressed to others: reverse-path checks would drop them.
    ("net.ipv4.conf.all.rp_filter", "0"),
    ("net.ipv4.conf.default.rp_filter", "0"),
    ("net.ipv6.conf.all.accept_dad", "0"),
    ("net.ipv6.conf.default.accept_dad", "0"),
    # Many subscribers connect at once; the defaults are sized for a desktop.
    ("net.core.somaxconn", "65535"),
    ("net.ipv4.tcp_max_syn_backlog", "65535"),
    ("net.ipv4.ip_local_port_range", "1024 65535"),
    ("net.ipv4.tcp_rmem", "4096 131072 33554432"),
    ("net.ipv4.tcp_wmem", "4096 65536 33554432"),
    # Splicing one flow into two: keep the window right after idle periods.
    ("net.ipv4.tcp_slow_start_after_idle", "0"),
]
# A proxied graph: the proxy's sockets to the origin ask for ECN, and flow_egress takes the request
# off the SYN of a flow whose subscriber did not ask (tc/flow_marks.h). Accepted sockets answer as
# with the kernel's default (2): ECN when the subscriber's SYN asks for it.
PROXY_SYSCTLS = [("net.ipv4.tcp_ecn", "1")]


# -- pieces the lab uses too ---------------------------------------------------------------------
def loadall_argv(obj: str, pins: str) -> list[str]:
    """Loads obj's programs under PINS/prog and its maps under PINS/maps. Each program's type is its
    section's (SEC("tc"): a classifier; SEC("sockops"))."""
    return ["bpftool", "prog", "loadall", obj, f"{pins}/prog", "pinmaps", f"{pins}/maps"]


def mkdir_step(path: str, mode: int = 0o755, *, uid: int = -1, gid: int = -1, ours: list[str] | None = None,
               what: str | None = None) -> Step:
    """A folder this run makes, and on undo removes: all of it if ours is None (a pin folder on
    bpffs), else just the entries named in ours, and the folder if that empties it. A folder that
    exists already is left alone, now and at undo."""
    owner = f" owned by {uid}:{gid}" if uid != -1 else (f" group {gid}" if gid != -1 else "")
    return Step(what or f"create folder {path}",
                Call("mkdir", (path, mode, uid, gid), f"mkdir -m {mode:o} {path}{owner}"),
                undo=Call("rmdir", (path, ours), f"remove {path}"),
                done=lambda: os.path.isdir(path))


def _has_clsact(dev: str, ns: str | None = None) -> bool:
    return any(q.get("kind") == "clsact" for q in run_json(in_netns(ns, ["tc", "-j", "qdisc", "show", "dev", dev])))


def steering_load_steps(pins: str, trunk: str, ns: str | None = None) -> list[Step]:
    """Pins the steering programs and maps under pins/, and a clsact qdisc on the trunk."""
    where = f"{ns}/{trunk}" if ns else trunk
    return [
        mkdir_step(pins, 0o700, what=f"create pin folder {pins}"),
        Step("load the steering programs and maps", loadall_argv(STEER_OBJ, pins)),
        Step(f"add clsact qdisc on {where}", in_netns(ns, ["tc", "qdisc", "add", "dev", trunk, "clsact"]),
             undo=in_netns(ns, ["tc", "qdisc", "del", "dev", trunk, "clsact"]),
             done=lambda: _has_clsact(trunk, ns)),
    ]


def filter_words(verb: str, dev: str, hook: str, pref: int, prog: str) -> list[str]:
    """A tc filter running the program pinned at prog, direct-action, on dev's hook: every program of
    the datapath is attached so (verb add by `up`, replace by `upgrade`: the program swapped in place)."""
    return ["filter", verb, "dev", dev, hook, "pref", str(pref), "handle", "1", "bpf", "direct-action",
            "object-pinned", prog]


# Where each program runs: (device, hook, tc preference, program). A program keeps its name and its
# hook from one version to the next: `pepctl upgrade` swaps each in place, by name (tc/pep_flow.h).
def trunk_attachments(trunk: str) -> list[tuple[str, str, int, str]]:
    return [(trunk, "ingress", TRUNK_PREF, "trunk_ingress")]


def port_attachments(ports: list[str]) -> list[tuple[str, str, int, str]]:
    return [(port, "ingress", PORT_PREF, "port_ingress") for port in ports]


def flow_attachments() -> list[tuple[str, str, int, str]]:
    return [(dev, hook, FLOW_PREF, prog) for dev in (C_IN, S_IN)
            for hook, prog in (("ingress", flow_maps.PROGRAM), ("egress", flow_maps.EGRESS_PROGRAM))]


def trunk_attach_step(pins: str, trunk: str, ns: str | None = None) -> Step:
    where = f"{ns}/{trunk}" if ns else trunk
    [(dev, hook, pref, prog)] = trunk_attachments(trunk)
    return Step(f"attach trunk_ingress to {where} ingress",
                in_netns(ns, ["tc", *filter_words("add", dev, hook, pref, f"{pins}/prog/{prog}")]),
                undo=in_netns(ns, ["tc", "filter", "del", "dev", trunk, "ingress", "pref", str(TRUNK_PREF)]))


def _ifindex(name: str, ns: str | None) -> int:
    return nsutil.in_netns(ns, socket.if_nametoindex, name)


@action("steer_ports")
def _steer_ports(pins: str, ports: list, trunk: str, ns: str | None = None) -> None:
    """ports: [[vid, port name], ...]; each VLAN to its port and back, in ns (None: here)."""
    trunk_index = _ifindex(trunk, ns)
    for vid, port in ports:
        steering.set_port(pins, vid, _ifindex(port, ns), trunk_index)


def steer_ports_step(pins: str, ports: list[tuple[int, str]], trunk: str, ns: str | None = None) -> Step:
    where = f"nsenter --net=/run/netns/{ns} " if ns else ""
    shown = "\n".join(f"# bpf(2) {pins}/maps: vlan_ports[{vid}] = ifindex({port}); port_vlans[ifindex({port})] = "
                      f"{{{vid}, ifindex({trunk})}}" for vid, port in ports)
    return Step(f"steer VLANs {', '.join(str(v) for v, _ in ports[:6])}{' ...' if len(ports) > 6 else ''} "
                f"to their ports{' in ' + ns if ns else ''}",
                Call("steer_ports", (pins, [list(p) for p in ports], trunk, ns), where + shown if ns else shown))


def port_attach_batch(pins: str, ports: list[str]) -> str:
    """tc batch: port_ingress on each port (tags its frames, sends them to the trunk)."""
    lines = []
    for dev, hook, pref, prog in port_attachments(ports):
        lines += [f"qdisc add dev {dev} clsact", " ".join(filter_words("add", dev, hook, pref, f"{pins}/prog/{prog}"))]
    return "\n".join(lines) + "\n"


# -- the instance ----------------------------------------------------------------------------------
def conns_attach_step(pins: str, info: HostInfo) -> Step:
    """flow_conns on the root of the cgroup v2 hierarchy, where every socket of the host runs it: it
    counts each graph's connections, so that a graph at its maxconn fails open (tc/pep_flow.h, step
    4b). Every instance attaches its own (multi). Without cgroup v2 only a full accept queue does."""
    if info.cgroup2 is None:
        return note("flow_conns", "no cgroup v2 hierarchy is mounted: a graph at its maxconn is not seen by "
                    "the datapath (only a full accept queue makes new flows bypass); mount cgroup2 to have it")
    prog = f"{pins}/prog/{flow_maps.CONNS_PROGRAM}"
    return Step(f"attach {flow_maps.CONNS_PROGRAM} to the cgroup v2 root {info.cgroup2} (sock_ops: each graph's "
                "connections, for the fail-open at maxconn)",
                ["bpftool", "cgroup", "attach", info.cgroup2, "sock_ops", "pinned", prog, "multi"],
                undo=Call("cgroup_detach", (info.cgroup2, prog),
                          f"bpftool cgroup detach {info.cgroup2} sock_ops pinned {prog}"))


@action("cgroup_detach")
def _cgroup_detach(root: str, prog: str) -> None:
    """Detaches the sock_ops program pinned at prog from the cgroup root, if it is attached there (an
    `up` killed before the attach journaled its undo all the same)."""
    if not os.path.exists(prog):
        return
    pid = run_json(["bpftool", "-j", "prog", "show", "pinned", prog])["id"]
    if pid in {p["id"] for p in run_json(["bpftool", "-j", "cgroup", "show", root])}:
        run(["bpftool", "cgroup", "detach", root, "sock_ops", "pinned", prog])


@action("cgroup_swap")
def cgroup_swap(root: str, new: str | None, old: str | None) -> None:
    """The sock_ops program pinned at new in place of the one pinned at old on the cgroup root: with
    both, swapped by BPF_F_REPLACE (never both attached: each would count a connection); with no
    old (or old not attached there), attached; with no new, old detached. Done already: nothing."""
    attached = {p["id"] for p in run_json(["bpftool", "-j", "cgroup", "show", root])}
    if new is None:
        if old is not None:
            _cgroup_detach(root, old)
        return
    with bpfsys.Prog(new) as prog:
        if prog.id in attached:
            return
        if old is not None and os.path.exists(old):
            with bpfsys.Prog(old) as before:
                if before.id in attached:
                    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
                    try:
                        bpfsys.prog_attach(fd, prog.fd, bpfsys.BPF_CGROUP_SOCK_OPS,
                                           bpfsys.BPF_F_ALLOW_MULTI | bpfsys.BPF_F_REPLACE, before.fd, name=root)
                    finally:
                        os.close(fd)
                    return
    run(["bpftool", "cgroup", "attach", root, "sock_ops", "pinned", new, "multi"])


@action("tc_swap")
def tc_swap(ns: str | None, attachments: list) -> None:
    """Each [device, hook, preference, program pin] made to run that program, in place of whatever
    ran there (`tc filter replace`: every packet meets one program or the other); a pin of None
    removes what runs there, if anything does."""
    lines = [" ".join(filter_words("replace", dev, hook, pref, prog)) for dev, hook, pref, prog in attachments if prog]
    if lines:
        run(in_netns(ns, ["tc", "-batch", "-"]), input="\n".join(lines) + "\n")
    for dev, hook, pref, prog in attachments:
        if prog is None and run_json(in_netns(ns, ["tc", "-j", "filter", "show", "dev", dev, hook, "pref", str(pref)])):
            run(in_netns(ns, ["tc", "filter", "del", "dev", dev, hook, "pref", str(pref)]))


def connection_limits(cfg: Config, info: HostInfo) -> tuple[int, dict[str, int]]:
    """HAProxy's maxconn: the process's (the host's maxconn, or what the open-file limit allows) and
    each proxied graph's (its own, at most the process's). The datapath bypasses at the same."""
    total = cfg.host.maxconn or info.proxy_maxconn(cfg)
    return total, {g.name: min(g.proxy.maxconn or total, total) for g in proxied(cfg)}


def datapath(cfg: Config) -> dict[str, tuple[str, str]]:
    """The instance's BPF objects and where each is pinned: {part: (object, pin folder)}: the
    steering programs always, the flow program when a graph is proxied."""
    n = cfg.instance_names()
    parts = {"steer": (STEER_OBJ, n.steer_pins)}
    if proxied(cfg):
        parts["flow"] = (FLOW_OBJ, n.flow_pins)
    return parts


def datapath_digest(cfg: Config) -> str:
    """What the journal records of the datapath `up` loaded (sha256 of its objects): `pepctl upgrade`
    swaps it when this checkout's differs."""
    h = hashlib.sha256()
    for part, (obj, _) in sorted(datapath(cfg).items()):
        with open(obj, "rb") as f:
            h.update(part.encode() + b"\0" + hashlib.sha256(f.read()).digest())
    return h.hexdigest()


def _mounted_bpffs() -> bool:
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == "/sys/fs/bpf" and line.split()[2] == "bpf" for line in f)


def proxied(cfg: Config) -> list[Graph]:
    return [g for g in cfg.graphs if g.proxy.enabled]


def host_steps(cfg: Config, info: HostInfo) -> list[Step]:
    n = cfg.instance_names()
    steps = [
        Step("mount bpffs at /sys/fs/bpf", ["mount", "-t", "bpf", "bpf", "/sys/fs/bpf"], done=_mounted_bpffs),
        mkdir_step(cfg.host.bpf_dir, 0o700, ours=[], what=f"create {cfg.host.bpf_dir}"),
        mkdir_step(n.pins, 0o700, what=f"create pin folder {n.pins}"),
        *steering_load_steps(n.steer_pins, cfg.host.nic),
    ]
    if proxied(cfg):
        steps += [mkdir_step(n.flow_pins, 0o700, what=f"create pin folder {n.flow_pins}"),
                  Step("load the flow program and maps (interception, bypass, fail-open)",
                       loadall_argv(FLOW_OBJ, n.flow_pins)),
                  conns_attach_step(n.flow_pins, info)]
    steps += [
        mkdir_step(n.dir, 0o750, gid=info.proxy_gid, ours=instance_files(n), what=f"create run folder {n.dir}"),
        mkdir_step(n.proxy_dir, 0o750, uid=info.proxy_uid, gid=info.proxy_gid, ours=proxy_files(n),
                   what=f"create the proxy's folder {n.proxy_dir}"),
        *tuning_steps(cfg, info),
    ]
    return steps


def _onlink(side: Side, net) -> bool:
    return any(net.subnet_of(a.network) for a in side.addresses if a.version == net.version)


def _gateway(side: Side, version: int):
    return next((gw for gw in side.gateways if gw.version == version), None)


def routes(g: Graph) -> list[tuple[str, str, Side]]:
    """The graph's routes: (destination, how it is reached, its side). The link's own subnet, where
    no prefix covers it (a transit link to a router): its gateway, and the routers and other proxy
    hosts there, are reached on the link. Then one route per prefix. A prefix off every subnet of
    its side has a gateway of its family: the config refused it otherwise (config/sides.py
    unreachable_prefixes)."""
    out = []
    for side, dev in ((g.access, C_IN), (g.origin, S_IN)):
        for addr in side.addresses:
            if not any(addr.network.subnet_of(net) and _onlink(side, net) for net in side.prefixes
                       if net.version == addr.version):
                out.append((str(addr.network), f"dev {dev} scope link src {addr.ip}", side))
        for net in side.prefixes:
            if _onlink(side, net):
                src = next(a.ip for a in side.addresses if a.version == net.version and net.subnet_of(a.network))
                out.append((str(net), f"dev {dev} scope link src {src}", side))
            else:
                out.append((str(net), f"via {_gateway(side, net.version)} dev {dev}", side))
    return out


def route_line(dst: str, via: str, congestion: str, initcwnd: int) -> str:
    """A route with its side's congestion control and initial congestion window: route metrics
    (congctl, initcwnd), so every connection on that side takes them."""
    window = f" initcwnd {initcwnd}" if initcwnd else ""
    return f"route replace {dst} {via} proto static congctl {congestion}{window}"


def route_lines(g: Graph) -> list[str]:
    """Addresses without kernel prefix routes, then the routes."""
    lines = []
    for side, dev in ((g.access, C_IN), (g.origin, S_IN)):
        lines += [f"addr add {addr} dev {dev} noprefixroute" + (" nodad" if addr.version == 6 else "")
                  for addr in side.addresses]
        lines += [route_line(dst, via, s.congestion, s.initcwnd) for dst, via, s in routes(g) if s is side]
    return lines


def _port_arg(lo: int, hi: int) -> str:
    return str(lo) if lo == hi else f"{lo}-{hi}"


def interception_lines(g: Graph, family: int) -> list[str]:
    """Policy rules and the local table that deliver intercepted packets to local sockets.
    `ip rule` takes its family from the command line only: the IPv6 lines run in `ip -6 -batch`."""
    if not g.proxy.enabled:
        return []
    default = "0.0.0.0/0" if family == 4 else "::/0"
    # The mark is set on packets for local sockets by flow_ingress (bpf), by the nft table (nft), and
    # in every mode on the RSTs the datapath makes to end a socket of the proxy's (source_port = "kept").
    lines = [f"route replace local {default} dev lo table {LOCAL_TABLE}",
             f"rule add pref {RULE_PREF} fwmark {flow_maps.LOCAL_MARK} lookup {LOCAL_TABLE}"]
    if g.proxy.one_listener:
        return lines
    # route: the intercepted ports from the access side, and the origin's replies from those ports.
    for lo, hi in g.proxy.ports or ():
        p = _port_arg(lo, hi)
        lines += [f"rule add pref {RULE_PREF} iif {C_IN} ipproto tcp dport {p} lookup {LOCAL_TABLE}",
                  f"rule add pref {RULE_PREF} iif {S_IN} ipproto tcp sport {p} lookup {LOCAL_TABLE}"]
    return lines


def graph_batch(cfg: Config, g: Graph, n: GraphNames) -> str:
    """`ip -n NS -batch`: the graph's two links (host ends created in pepctl's own namespace,
    given by its PID), loopback, addresses, routes, and the IPv4 interception rules."""
    pid = os.getpid()
    lines = [f"# netns {pid}: this pepctl's own process, i.e. the host's namespace",
             f"link add {C_IN} index {n.c_in_ifindex} address {n.macs[C_IN]} type veth "
             f"peer name {n.c_out} address {n.macs['c_out']} netns {pid}",
             f"link add {S_IN} index {n.s_in_ifindex} address {n.macs[S_IN]} type veth "
             f"peer name {n.s_out} address {n.macs['s_out']} netns {pid}",
             "link set lo up", f"link set {C_IN} up", f"link set {S_IN} up",
             *route_lines(g), *interception_lines(g, 4)]
    return "\n".join(lines) + "\n"


def flow_flags(g: Graph) -> tuple[int, int, tuple[int, int]]:
    """graph_config of a proxied graph: (flags, listen_port, (control_below, control_seed)),
    tc/pep_flow.h."""
    p = g.proxy
    flags = flow_maps.GRAPH_F_ENABLED
    if p.interception == "bpf":
        flags |= flow_maps.GRAPH_F_ASSIGN
    if p.ports is None:
        flags |= flow_maps.GRAPH_F_ALL_PORTS
    if p.one_listener:
        # route mode cannot tell an origin's new flow from a reply by port: access side only.
        flags |= flow_maps.GRAPH_F_ORIGIN_SYNS
    if p.source_port == "kept":
        flags |= flow_maps.GRAPH_F_KEEP_PORT
    if p.mptcp == "proxy":
        flags |= flow_maps.GRAPH_F_PROXY_MPTCP
    if p.handshake == "honest":
        flags |= flow_maps.GRAPH_F_HONEST
    control = (0, 0)
    if g.experiment.on:
        flags |= flow_maps.GRAPH_F_MEASURE
        control = (experiment.control_below(g.experiment.control_fraction), g.experiment.seed)
    return flags, (p.listen_port if p.one_listener else 0), control


@action("flow_graph")
def _flow_graph(pins: str, slot: int, flags: int, listen_port: int, addrs: list, ports: list,
                control: list | None = None, limits: list | None = None, netns: str | None = None) -> None:
    flow_maps.set_graph(pins, slot, flags, listen_port, addrs, [tuple(r) for r in ports], tuple(control or (0, 0)),
                        tuple(limits or (0, 0)), nsutil.netns_cookie(netns) if netns else None)


def flow_graph_step(cfg: Config, g: Graph, n: GraphNames, limits: tuple[int, int], pins: str | None = None) -> Step:
    """The graph's entries in the flow maps pinned in pins (default the instance's)."""
    pins = pins or cfg.instance_names().flow_pins
    flags, listen, control = flow_flags(g)
    addrs = [str(a.ip) for s in (g.access, g.origin) for a in s.addresses]
    ports = [list(r) for r in g.proxy.ports or ()]
    shown = (f"# bpf(2) {pins}/maps: graphs[{n.slot}] = {{flags {flags:#x}, listen_port {listen}"
             + (f", control_below {control[0]}, control_seed {control[1]}" if g.experiment.on else "")
             + f", maxconn {limits[0]}, host_maxconn {limits[1]}}}; graph_addrs += {addrs}; intercept_ports += "
             f"{ports or 'none (all ports)'}; netns_slots[cookie of {n.netns}] = {n.slot}")
    return Step(f"register graph {g.name} (slot {n.slot}) in the flow maps",
                Call("flow_graph", (pins, n.slot, flags, listen, addrs, ports, list(control), list(limits), n.netns),
                     shown))


def flow_attach_batch(pins: str) -> str:
    lines = [f"qdisc add dev {dev} clsact" for dev in (C_IN, S_IN)]
    lines += [" ".join(filter_words("add", dev, hook, pref, f"{pins}/prog/{prog}"))
              for dev, hook, pref, prog in flow_attachments()]
    return "\n".join(lines) + "\n"


# Mode bpf hands a new flow's SYN to the listener itself, past the kernel's TIME_WAIT handling: a
# TIME_WAIT socket left on the same 4-tuple by the proxy's previous connection would make the
# listener drop the SYN as a duplicate. The datapath ends such a socket with a RST first, as nft's
# tproxy does (tc/flow.c past_time_wait), which needs RFC 1337's "ignore RSTs in TIME_WAIT" off:
# the kernel's default, made sure of here. TIME_WAIT itself is kept (tcp_max_tw_buckets as the
# kernel sizes it): late segments of a closed connection reach its socket, not the origin.
BPF_SYSCTLS = [("net.ipv4.tcp_rfc1337", "0")]


def graph_sysctls(g: Graph) -> list[tuple[str, str]]:
    return NETNS_SYSCTLS + (PROXY_SYSCTLS if g.proxy.enabled else []) + \
        (BPF_SYSCTLS if g.proxy.enabled and g.proxy.interception == "bpf" else [])


def graph_steps(cfg: Config, g: Graph) -> list[Step]:
    """The graph's namespace: links, addresses, routes, sysctls."""
    n = cfg.graph_names(g)
    return [Step(f"links, addresses and routes of graph {g.name} in {n.netns}", ["ip", "-n", n.netns, "-batch", "-"],
                 input=graph_batch(cfg, g, n)),
            Step(f"sysctls of {n.netns}", nsutil.sysctls_step_call(n.netns, graph_sysctls(g)))]


def graph_proxy_steps(cfg: Config, g: Graph, limits: tuple[int, int]) -> list[Step]:
    """A proxied graph's interception: policy rules, nft table (mode nft), its flow map entries
    and bypass rules, and flow_ingress and flow_egress on both links."""
    n = cfg.graph_names(g)
    ns = n.netns
    inst = cfg.instance_names()
    steps = []
    steps.append(Step(f"IPv6 interception rules of graph {g.name}", ["ip", "-n", ns, "-6", "-batch", "-"],
                      input="\n".join(interception_lines(g, 6)) + "\n"))
    if g.proxy.interception == "nft":
        steps += [Step(f"write nftables interception table of graph {g.name}",
                       Call("write", (n.nft_file, render_nft(g, table=n.nft_table, mark=flow_maps.LOCAL_MARK)),
                            f"cat > {n.nft_file} <<'EOF'\n"
                            f"{render_nft(g, table=n.nft_table, mark=flow_maps.LOCAL_MARK).rstrip()}\nEOF")),
                  Step(f"load nftables table {n.nft_table} in {ns}", in_netns(ns, ["nft", "-f", n.nft_file]))]
    steps += [flow_graph_step(cfg, g, n, limits),
              bypass.install_step(cfg, g),
              Step(f"attach flow_ingress and flow_egress to c_in and s_in of {ns}", in_netns(ns, ["tc", "-batch", "-"]),
                   input=flow_attach_batch(inst.flow_pins))]
    return steps


def namespaces_step(cfg: Config) -> Step:
    """Every graph's namespace in one `ip -batch`; the undo removes them with their links."""
    make, spaces, links = [], [], []
    for g in cfg.graphs:
        n = cfg.graph_names(g)
        make.append(f"netns add {n.netns}")
        spaces.append(n.netns)
        links += [n.c_out, n.s_out]
    shown = "ip -force -batch - <<'EOF'\n" + "\n".join(f"netns del {ns}" for ns in spaces) + "\nEOF"
    return Step(f"create {len(cfg.graphs)} graph namespace(s)", ["ip", "-batch", "-"], input="\n".join(make) + "\n",
                undo=Call("remove_namespaces", (spaces, links), shown))


@action("remove_namespaces")
def remove_namespaces(spaces: list[str], links: list[str], timeout: float = 120) -> None:
    """Resets what TCP connections are left in the namespaces (nsutil.destroy_tcp_sockets), deletes
    them, and waits until the kernel has destroyed their links with them.

    Deleting a namespace destroys its devices in one batch, in the background; deleting the
    host ends one by one instead costs a network-wide synchronisation each (a thousand graphs:
    ninety seconds against a few)."""
    for ns in spaces:
        if os.path.lexists(f"/run/netns/{ns}"):
            nsutil.destroy_tcp_sockets(ns)
    run(["ip", "-force", "-batch", "-"], check=False, input="".join(f"netns del {ns}\n" for ns in spaces))
    left = [ns for ns in spaces if os.path.lexists(f"/run/netns/{ns}")]
    if left:
        raise StepError(f"namespaces still there after `ip netns del`: {', '.join(left[:5])}")
    wait_for(lambda: not set(links) & {name for _, name in socket.if_nameindex()}, timeout=timeout,
             what="the kernel to destroy the graphs' links", interval=0.05)


def ports_up_step(cfg: Config) -> Step:
    """The host ends carry only redirected frames: no IPv6 address of their own, then up."""
    lines = []
    for g in cfg.graphs:
        n = cfg.graph_names(g)
        for port in (n.c_out, n.s_out):
            lines += [f"link set {port} addrgenmode none", f"link set {port} up"]
    return Step("bring up the host ends of every graph", ["ip", "-batch", "-"], input="\n".join(lines) + "\n")


def haproxy_steps(cfg: Config, info: HostInfo) -> list[Step]:
    n = cfg.instance_names()
    text = haproxy_config(cfg, info)
    how = service.backend(cfg.host.supervisor)
    start, stop = service.start_call(n, how)
    return [
        Step(f"write {n.haproxy_cfg}", Call("write", (n.haproxy_cfg, text, 0o640, info.proxy_gid),
                                            f"cat > {n.haproxy_cfg} <<'EOF'\n{text.rstrip()}\nEOF")),
        Step(f"check {n.haproxy_cfg}", haproxy_check_argv(n, n.haproxy_cfg)),
        Step(f"start the proxy supervisor ({'systemd' if how == 'systemd' else 'pepctl keeper'}), "
             "which starts HAProxy", start, undo=stop),
    ]


def exporter_steps(cfg: Config) -> list[Step]:
    """The metrics endpoint (pepctl/exporter.py), unless metrics_port is 0."""
    if not cfg.host.metrics_port:
        return []
    how = service.backend(cfg.host.supervisor)
    start, stop = service.exporter_calls(cfg.instance_names(), how, cfg.host.metrics_address, cfg.host.metrics_port)
    return [Step(f"start the metrics exporter on {_host_port(cfg.host.metrics_address, cfg.host.metrics_port)} "
                 f"({'systemd' if how == 'systemd' else 'pepctl keeper'})", start, undo=stop)]


def _host_port(addr: str, port: int) -> str:
    return f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"


def haproxy_check_argv(n, path: str) -> list[str]:
    """`haproxy -c` of a config: it names its stats socket through the environment (the supervisor
    gives each process one of its own), so the check gets the longest such name."""
    return ["env", f"{STATS_ENV}={n.haproxy_sock_longest}", "haproxy", "-c", "-q", "-f", path]


def haproxy_config(cfg: Config, info: HostInfo) -> str:
    graphs = proxied(cfg)
    total, limits = connection_limits(cfg, info)
    proxies = []
    for g in graphs:
        p = g.proxy
        ports = (str(p.listen_port),) if p.one_listener else \
            tuple(_port_arg(lo, hi) for lo, hi in p.ports or ())
        proxies.append(GraphProxy(name=cfg.graph_names(g).proxy, netns=cfg.graph_names(g).netns, ports=ports,
                                  mode=p.mode, splice=p.splice, maxconn=limits[g.name],
                                  log_connections=p.log_connections, keep_port=p.source_port == "kept"))
    return render(Process(title=f"instance {cfg.host.instance}", cpus=info.proxy_cpus(cfg.host.threads), maxconn=total),
                  proxies)


def register_steps(cfg: Config) -> list[Step]:
    """The host's register of running instances: what checks.conflicts reads. The folder is shared
    by the instances of the host: whichever leaves it empty removes it."""
    n = cfg.instance_names()
    text = register.register_text(cfg)
    return [Step(f"register instance {cfg.host.instance} in {REGISTER}",
                 Call("register", (n.register, text), f"mkdir -p {REGISTER} && cat > {n.register} <<'EOF'\n"
                      f"{text.rstrip()}\nEOF"),
                 undo=Call("unregister", (n.register,), f"rm {n.register}; rmdir {REGISTER} if empty"))]


@action("register")
def _register(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_file(path, text)


@action("unregister")
def _unregister(path: str) -> None:
    remove_file(path)
    try:
        os.rmdir(os.path.dirname(path))
    except OSError:
        pass   # another instance is registered there


def build(cfg: Config, info: HostInfo) -> list[Step]:
    n = cfg.instance_names()
    steps = [note("the config", text) for text in cfg.notices]
    steps += register_steps(cfg) + host_steps(cfg, info)
    # Before any route names it (the kernel refuses `congctl` of a name it lacks).
    steps += congestion.steps(cfg)
    steps.append(namespaces_step(cfg))
    for g in cfg.graphs:
        steps += congestion.graph_steps(cfg, g)
    for g in cfg.graphs:
        steps += graph_steps(cfg, g)
    steps.append(ports_up_step(cfg))
    ports = [(v, p) for g in cfg.graphs for v, p in ((g.access.vlan, cfg.graph_names(g).c_out),
                                                      (g.origin.vlan, cfg.graph_names(g).s_out))]
    steps.append(steer_ports_step(n.steer_pins, ports, cfg.host.nic))
    steps.append(Step("attach port_ingress to the host end of every graph", ["tc", "-batch", "-"],
                      input=port_attach_batch(n.steer_pins, [p for _, p in ports])))
    total, limits = connection_limits(cfg, info)
    for g in proxied(cfg):
        steps += graph_proxy_steps(cfg, g, (limits[g.name], total))
    if proxied(cfg):
        steps += haproxy_steps(cfg, info)
    steps += exporter_steps(cfg)
    steps.append(trunk_attach_step(n.steer_pins, cfg.host.nic))
    # Last: the routers send this host its shares only once everything behind the NIC is ready.
    steps += routing_steps(cfg)
    return steps


def routing_graph(cfg: Config) -> Graph:
    return next(g for g in cfg.graphs if g.name == cfg.routing.graph)


def routing_steps(cfg: Config) -> list[Step]:
    """[routing]: FRR's zebra, bfdd and bgpd in the graph's namespace, announcing this host's shares
    (pepctl/routing.py renders their configs)."""
    if cfg.routing is None:
        return []
    n = cfg.instance_names()
    ns = cfg.graph_names(routing_graph(cfg)).netns
    folder = n.frr_dir
    steps = [mkdir_step(folder, 0o750, ours=routing.FRR_FILES, what=f"create FRR's folder {folder}")]
    for daemon, text in routing.configs(cfg.routing, routing.hostname(cfg.host.instance, cfg.routing)).items():
        path = routing.frr_file(folder, daemon, "conf")
        steps.append(Step(f"write {path}", Call("write", (path, text), f"cat > {path} <<'EOF'\n{text.rstrip()}\nEOF")))
    for daemon in routing.FRR_DAEMONS:
        vty = routing.frr_file(folder, daemon, "vty")
        steps.append(daemon_step(f"start FRR {daemon} in {ns}", in_netns(ns, routing.daemon_argv(daemon, folder)),
                                 routing.frr_file(folder, daemon, "pid"), routing.frr_file(folder, daemon, "out"),
                                 lambda vty=vty: os.path.exists(vty)))
        if daemon == "bfdd":
            steps.append(pin_step(ns, [routing.frr_file(folder, d, "pid") for d in ("zebra", "bfdd")]))
    return steps


def pin_step(ns: str, pidfiles: list[str]) -> Step:
    """bfdd opens an IPv4 packet socket on every device (for BFD echo, which pepctl does not
    configure) as it starts, before its vty. In the graph's namespace it would make the kernel hand
    every IPv4 packet to ip_rcv shared, which drops the socket bpf_sk_assign gave a new flow
    (docs/routing.md). So it is bound to lo before bgpd starts: before any router sends this host
    a subscriber's packet."""
    shown = f"# pepctl: bind the IP packet sockets of {', '.join(pidfiles)} to lo (pidfd_getfd(2), bind(2))"
    return Step(f"keep FRR's packet sockets off {ns}'s traffic", Call("pin_packet_sockets", (ns, pidfiles), shown))
