"""From a Config and the host's facts to the exact list of Steps `up` runs.

Per host:   bpffs, run folder, the steering programs and maps (pinned under
            bpf_dir/instance), clsact + trunk_ingress on the NIC, host tuning.
Per graph:  namespace INSTANCE-NAME; veths c_out/c_in and s_out/s_in; the
            VLAN <-> port entries in the steering maps; port_ingress on both
            ports; addresses and per-side routes with their congctl; and when
            the proxy is enabled, interception (nft or route) and HAProxy.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from . import hostinfo
from .config import Config, ConfigError, FieldError, Graph, Side
from .hostinfo import HostInfo
from .runner import Deferred, Step, run_json
from .tuning import tuning_steps

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEER_OBJ = os.path.join(REPO, "tc", "steer.o")
TPROXY_MARK = 1
TPROXY_TABLE = 100
TRUNK_PREF = 10   # tc filter preference of trunk_ingress on the NIC
PORT_PREF = 10


@dataclass(frozen=True)
class GraphNames:
    netns: str
    c_out: str
    s_out: str
    dir: str          # run folder of the graph
    haproxy_cfg: str
    haproxy_pid: str
    haproxy_log: str
    haproxy_sock: str
    nft_file: str
    nft_table: str


C_IN, S_IN = "c_in", "s_in"


def instance_dir(cfg: Config) -> str:
    return os.path.join(cfg.host.run_dir, cfg.host.instance)


def pin_dir(cfg: Config) -> str:
    return os.path.join(cfg.host.bpf_dir, cfg.host.instance)


def graph_names(cfg: Config, g: Graph) -> GraphNames:
    inst = cfg.host.instance
    d = os.path.join(instance_dir(cfg), g.name)
    return GraphNames(
        netns=f"{inst}-{g.name}",
        c_out=f"{inst}c{g.access.vlan}",
        s_out=f"{inst}s{g.origin.vlan}",
        dir=d,
        haproxy_cfg=os.path.join(d, "haproxy.cfg"),
        haproxy_pid=os.path.join(d, "haproxy.pid"),
        haproxy_log=os.path.join(d, "haproxy.log"),
        haproxy_sock=os.path.join(d, "haproxy.sock"),
        nft_file=os.path.join(d, "intercept.nft"),
        nft_table=f"pep_{inst}",
    )


def u32_bytes(value: int) -> list[str]:
    """bpftool takes keys/values as bytes, little-endian on this host."""
    return [str(b) for b in int(value).to_bytes(4, "little")]


def in_netns(ns: str | None, argv: list) -> list:
    """Run argv in network namespace ns (None: here). nsenter --net, not `ip netns
    exec`: the latter remounts /sys and hides the pins under /sys/fs/bpf."""
    return argv if ns is None else ["nsenter", f"--net=/run/netns/{ns}", *argv]


def ifindex_bytes(name: str, ns: str | None = None) -> Deferred:
    where = f"{ns}/{name}" if ns else name
    return Deferred(f"ifindex of {where}, 4 bytes LE", lambda: u32_bytes(hostinfo.ifindex(name, ns)))


def steering_load_steps(pins: str, trunk: str, ns: str | None = None) -> list[Step]:
    """Pin the steering programs and maps under pins/, and a clsact qdisc on the trunk."""
    where = f"{ns}/{trunk}" if ns else trunk
    return [
        Step(f"create pin folder {pins}", ["mkdir", "-p", pins], undo=["@rm", pins]),
        Step("load steering programs and maps",
             ["bpftool", "prog", "loadall", STEER_OBJ, f"{pins}/prog", "type", "classifier",
              "pinmaps", f"{pins}/maps"]),
        Step(f"add clsact qdisc on {where}", in_netns(ns, ["tc", "qdisc", "add", "dev", trunk, "clsact"]),
             undo=in_netns(ns, ["tc", "qdisc", "del", "dev", trunk, "clsact"]),
             done=lambda: _has_clsact(trunk, ns)),
    ]


def trunk_attach_step(pins: str, trunk: str, ns: str | None = None) -> Step:
    where = f"{ns}/{trunk}" if ns else trunk
    return Step(f"attach trunk_ingress to {where} ingress",
                in_netns(ns, ["tc", "filter", "add", "dev", trunk, "ingress", "pref", str(TRUNK_PREF),
                              "handle", "1", "bpf", "direct-action", "object-pinned",
                              f"{pins}/prog/trunk_ingress"]),
                undo=in_netns(ns, ["tc", "filter", "del", "dev", trunk, "ingress", "pref", str(TRUNK_PREF)]))


def steering_port_steps(pins: str, port: str, vid: int, trunk: str, ns: str | None = None) -> list[Step]:
    """VLAN vid <-> port: untagged frames of vid leave by port; frames from port get tagged vid."""
    maps = f"{pins}/maps"
    where = f"{ns}/{port}" if ns else port
    return [
        Step(f"steer VLAN {vid} to {where}",
             ["bpftool", "map", "update", "pinned", f"{maps}/vlan_ports", "key", *u32_bytes(vid),
              "value", ifindex_bytes(port, ns), "0", "0", "0", "0"],
             undo=["bpftool", "map", "update", "pinned", f"{maps}/vlan_ports", "key", *u32_bytes(vid),
                   "value", *(["0"] * 8)]),
        Step(f"tag frames from {where} with VLAN {vid}",
             ["bpftool", "map", "update", "pinned", f"{maps}/port_vlans", "key", ifindex_bytes(port, ns),
              "value", *u32_bytes(vid), ifindex_bytes(trunk, ns)]),
        Step(f"add clsact qdisc on {where}", in_netns(ns, ["tc", "qdisc", "add", "dev", port, "clsact"])),
        Step(f"attach port_ingress to {where} ingress",
             in_netns(ns, ["tc", "filter", "add", "dev", port, "ingress", "pref", str(PORT_PREF), "handle", "1",
                           "bpf", "direct-action", "object-pinned", f"{pins}/prog/port_ingress"])),
    ]


def write_step(path: str, content: str, what: str) -> Step:
    """A file written by `up`: shown in the plan as a heredoc."""
    return Step(what, ["@write", path, content])


def _mounted_bpffs() -> bool:
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == "/sys/fs/bpf" and line.split()[2] == "bpf" for line in f)


def _has_clsact(dev: str, ns: str | None = None) -> bool:
    return any(q.get("kind") == "clsact" for q in run_json(in_netns(ns, ["tc", "-j", "qdisc", "show", "dev", dev])))


def host_steps(cfg: Config, info: HostInfo) -> list[Step]:
    rundir = instance_dir(cfg)
    return [
        Step("mount bpffs at /sys/fs/bpf", ["mount", "-t", "bpf", "bpf", "/sys/fs/bpf"], done=_mounted_bpffs),
        Step(f"create run folder {rundir}", ["mkdir", "-p", "-m", "0750", rundir], undo=["@rm", rundir]),
        *steering_load_steps(pin_dir(cfg), cfg.host.nic),
        *tuning_steps(cfg, info),
    ]


def _onlink(side: Side, net) -> bool:
    return any(net.subnet_of(a.network) for a in side.addresses if a.version == net.version)


def _gateway(side: Side, version: int):
    return next((gw for gw in side.gateways if gw.version == version), None)


def route_steps(cfg: Config, g: Graph, n: GraphNames) -> list[Step]:
    """Addresses without kernel prefix routes, then one route per prefix with its side's congctl
    and initial congestion window (both route metrics: every connection on that side takes them)."""
    steps = []
    errors = []
    for side_name, side, dev in (("access", g.access, C_IN), ("origin", g.origin, S_IN)):
        for addr in side.addresses:
            extra = ["nodad"] if addr.version == 6 else []
            steps.append(Step(f"address {addr} on {n.netns}/{dev}",
                              ["ip", "-n", n.netns, "addr", "add", str(addr), "dev", dev, "noprefixroute",
                               *extra]))
        for i, net in enumerate(side.prefixes):
            fam = "-4" if net.version == 4 else "-6"
            if _onlink(side, net):
                src = next(a.ip for a in side.addresses if a.version == net.version and net.subnet_of(a.network))
                via = ["dev", dev, "scope", "link", "src", str(src)]
            else:
                gw = _gateway(side, net.version)
                if gw is None:
                    errors.append(FieldError(cfg.path, f"graph[{g.index}].{side_name}.prefixes[{i}]", str(net),
                                             f"not on-link and no IPv{net.version} gateway on the {side_name} "
                                             f"side; add one to graph[{g.index}].{side_name}.gateways"))
                    continue
                via = ["via", str(gw), "dev", dev]
            window = ["initcwnd", str(side.initcwnd)] if side.initcwnd else []
            steps.append(Step(f"route {net} via {side_name} side, congctl {side.congctl}"
                              + (f", initcwnd {side.initcwnd}" if side.initcwnd else ""),
                              ["ip", fam, "-n", n.netns, "route", "replace", str(net), *via,
                               "proto", "static", "congctl", side.congctl, *window]))
    if errors:
        raise ConfigError(errors)
    return steps


def _sysctl(ns: str, key: str, value: str) -> Step:
    return Step(f"sysctl {key}={value} in {ns}",
                ["ip", "netns", "exec", ns, "sysctl", "-q", "-w", f"{key}={value}"])


NETNS_SYSCTLS = [
    ("net.ipv4.ip_forward", "1"),
    ("net.ipv6.conf.all.forwarding", "1"),
    # TPROXY answers for addresses that are not local: reverse-path checks would drop them.
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


def graph_steps(cfg: Config, g: Graph, info: HostInfo) -> list[Step]:
    n = graph_names(cfg, g)
    ns = n.netns
    nic = cfg.host.nic
    steps = [
        Step(f"create namespace {ns}", ["ip", "netns", "add", ns], undo=["ip", "netns", "del", ns]),
        Step(f"create run folder {n.dir}", ["mkdir", "-p", n.dir]),
    ]
    for out, inn, vid in ((n.c_out, C_IN, g.access.vlan), (n.s_out, S_IN, g.origin.vlan)):
        steps += [
            Step(f"create veth {out} <-> {ns}/{inn}",
                 ["ip", "link", "add", out, "type", "veth", "peer", "name", inn, "netns", ns],
                 undo=["ip", "link", "del", out]),
            # The host side of a port carries only redirected frames: no addresses of its own.
            Step(f"no IPv6 on {out}", ["sysctl", "-q", "-w", f"net.ipv6.conf.{out}.disable_ipv6=1"]),
            Step(f"bring up {out}", ["ip", "link", "set", out, "up"]),
            Step(f"bring up {ns}/{inn}", ["ip", "-n", ns, "link", "set", inn, "up"]),
            *steering_port_steps(pin_dir(cfg), out, vid, nic),
        ]
    steps.append(Step(f"bring up {ns}/lo", ["ip", "-n", ns, "link", "set", "lo", "up"]))
    steps += [_sysctl(ns, k, v) for k, v in NETNS_SYSCTLS]
    steps += route_steps(cfg, g, n)
    if g.proxy.enabled:
        from .proxy_plan import proxy_steps  # the proxy half lives with its renderers
        steps += proxy_steps(cfg, g, n, info)
    return steps


def build(cfg: Config, info: HostInfo) -> list[Step]:
    if not info.nic_exists:
        raise ConfigError([FieldError(cfg.path, "host.nic", cfg.host.nic,
                                      "no such network interface in this namespace; check `ip link`")])
    bad_cc = sorted({s.congctl for g in cfg.graphs for s in (g.access, g.origin)} - info.available_cc)
    if bad_cc and info.available_cc:
        raise ConfigError([FieldError(cfg.path, "graph[].access/origin.congctl", ",".join(bad_cc),
                                      f"this kernel offers {' '.join(sorted(info.available_cc))}")])
    steps = host_steps(cfg, info)
    for g in cfg.graphs:
        steps += graph_steps(cfg, g, info)
    steps.append(trunk_attach_step(pin_dir(cfg), cfg.host.nic))
    return steps

