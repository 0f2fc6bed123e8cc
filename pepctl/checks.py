"""What `plan` and `up` check before they touch the host, each problem named by file, field and
value, with what to do.

The config's own checks (types, ranges, address kinds, overlaps) are in pepctl/config/; these
need the host: the NIC, the kernel's congestion controls (and for pepctl's own, pep_radio, that it
is built and can be registered: pepctl/congestion.py), the proxy's user, and that every name the
plan would make is free. An undo of `up` removes what its journal names (pepctl/runner.py):
that is safe only because a name that exists already is refused here, before anything is made.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import socket

from . import congestion, routing, service
from .config import OWN_CONGESTION, Config, ConfigError, FieldError
from .hostinfo import HostInfo
from .names import EXPORTER_UNIT, TRUNK_PREF, netns_path, unit_name
from .register import register_entry, running_instances
from .runner import run


def problems(cfg: Config, info: HostInfo) -> list[FieldError]:
    """Everything `plan` checks: the host's problems, then, when there are none, the names the plan
    would make that are taken."""
    return host_problems(cfg, info) or taken(cfg)


def taken(cfg: Config) -> list[FieldError]:
    """Names the plan would make that exist already, or that a running instance holds."""
    return names_taken(cfg) + conflicts(cfg) + nic_taken(cfg)


def host_problems(cfg: Config, info: HostInfo) -> list[FieldError]:
    """What this host lacks for the config, whatever runs on it: the NIC, congestion controls, the
    proxy's user, systemd's units, FRR, the folders, descriptors. `up` checks these before it takes
    the instance's lock (which makes a file in run_dir) or makes anything."""
    out: list[FieldError] = []

    def bad(field: str, value, message: str) -> None:
        out.append(FieldError(cfg.path, field, value, message))

    if not info.nic_exists:
        bad("host.nic", cfg.host.nic, "no such network interface in this namespace; check `ip link`")
    bad_cc = sorted({s.congestion for g in cfg.graphs for s in (g.access, g.origin)} - info.available_cc
                    - set(OWN_CONGESTION))
    if bad_cc and info.available_cc:
        bad("graph[].access/origin.congestion", ",".join(bad_cc),
            f"this kernel offers {' '.join(sorted(info.available_cc))} (and pepctl brings "
            f"{' '.join(OWN_CONGESTION)})")
    out += congestion.problems(cfg)
    if any(g.proxy.enabled for g in cfg.graphs):
        if info.proxy_uid is None:
            bad("graph[].proxy.enabled", True, f"the proxy runs as user {info.proxy_user!r} (User= of "
                f"{service.UNIT_FILE}), which does not exist here; create it with `useradd --system --user-group "
                f"--no-create-home --shell /usr/sbin/nologin {info.proxy_user}` (scripts/setup does)")
        if service.backend(cfg.host.supervisor) == "systemd":
            unit = unit_name(cfg.instance_names())
            if run(["systemctl", "cat", unit], check=False).returncode != 0:
                bad("host.supervisor", cfg.host.supervisor, f"systemd runs this host but has no {unit}: install "
                    f"{service.UNIT_FILE} into /etc/systemd/system and run `systemctl daemon-reload`, or set "
                    "supervisor = \"pepctl\"")
    if cfg.host.metrics_port and service.backend(cfg.host.supervisor) == "systemd":
        unit = unit_name(cfg.instance_names(), EXPORTER_UNIT)
        if run(["systemctl", "cat", unit], check=False).returncode != 0:
            bad("host.metrics_port", cfg.host.metrics_port, f"systemd runs this host but has no {unit}: install "
                f"{service.EXPORTER_UNIT_FILE} into /etc/systemd/system and run `systemctl daemon-reload`, "
                "or set metrics_port = 0 (no metrics)")
    if cfg.routing is not None:
        missing = [d for d in routing.FRR_DAEMONS if not os.access(f"{routing.FRR_BIN}/{d}", os.X_OK)]
        if missing or shutil.which("vtysh") is None:
            bad("routing", "", f"[routing] runs FRR, and this host lacks {', '.join(missing) or 'vtysh'} "
                f"(in {routing.FRR_BIN}); install Debian's frr package (scripts/setup does), or leave [routing] "
                "out on a host that is the only one")
    out += paths(cfg)
    if any(g.proxy.enabled for g in cfg.graphs):
        most = info.proxy_maxconn(cfg)
        if cfg.host.maxconn > most:
            bad("host.maxconn", cfg.host.maxconn, f"HAProxy would need more descriptors than this host's open-file "
                f"limit ({info.nofile}) gives: at most {most} here; raise the limit (LimitNOFILE= in "
                "pep.service) or lower maxconn, or 0 to size it from the limit")
        total = cfg.host.maxconn or most
        for g in cfg.graphs:
            if g.proxy.enabled and g.proxy.maxconn > total:
                bad(f"graph[{g.index}].proxy.maxconn", g.proxy.maxconn, f"more than HAProxy's own maxconn, {total} "
                    "(host.maxconn, or what the open-file limit allows): a graph cannot hold more than the process; "
                    "lower it, or 0 for the host's")
    return out


def mount_of(path: str) -> tuple[str, str]:
    """(mount point, filesystem type) of the mount that holds path (or would, once created)."""
    best = ("/", "rootfs")
    with open("/proc/self/mounts") as f:
        for line in f:
            _, point, fstype = line.split()[:3]
            point = point.replace("\\040", " ")
            if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) >= len(best[0]):
                best = (point, fstype)
    return best


def paths(cfg: Config) -> list[FieldError]:
    """The folders pepctl would write: bpf_dir on a bpffs, run_dir a folder it can make and use."""
    out = []
    point, fstype = mount_of(cfg.host.bpf_dir)
    # /sys/fs/bpf itself is mounted by `up` when it is not yet (its first step).
    mounted_by_up = point in ("/", "/sys") and (cfg.host.bpf_dir + "/").startswith("/sys/fs/bpf/")
    if fstype != "bpf" and not mounted_by_up:
        out.append(FieldError(cfg.path, "host.bpf_dir", cfg.host.bpf_dir, f"is on {point} ({fstype}), not on a "
                              "bpf filesystem: pins live only there; use a folder under /sys/fs/bpf"))
    run = cfg.host.run_dir
    point, fstype = mount_of(run)
    if fstype in ("proc", "sysfs", "bpf", "cgroup2", "devpts", "debugfs", "tracefs"):
        out.append(FieldError(cfg.path, "host.run_dir", run, f"is on {point}, a {fstype} filesystem, which holds no "
                              "files of ours; use a folder under /run"))
        return out
    probe = run
    while not os.path.lexists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        out.append(FieldError(cfg.path, "host.run_dir", run, f"{probe} is a file, not a folder; choose another "
                              "run_dir"))
    elif not os.access(probe, os.W_OK | os.X_OK):
        out.append(FieldError(cfg.path, "host.run_dir", run, f"{probe} is not writable; choose another run_dir"))
    return out


def nic_taken(cfg: Config) -> list[FieldError]:
    """A trunk program on the NIC that the register does not explain (a crashed or foreign run)."""
    proc = run(["tc", "-j", "filter", "show", "dev", cfg.host.nic, "ingress"], check=False)
    try:
        filters = json.loads(proc.stdout) if proc.returncode == 0 and proc.stdout.strip() else []
    except ValueError:
        filters = []
    if any(f.get("pref") == TRUNK_PREF for f in filters):
        return [FieldError(cfg.path, "host.nic", cfg.host.nic, f"already has a tc ingress filter at preference "
                           f"{TRUNK_PREF} that no running instance registered (`tc filter show dev {cfg.host.nic} "
                           "ingress`): remove it if a crashed run left it, or use another NIC")]
    return []


def conflicts(cfg: Config) -> list[FieldError]:
    """A running instance this one would collide with: its name, pins, NIC (in this namespace).
    One instance per NIC: its trunk program owns every VLAN of that NIC."""
    me = register_entry(cfg)
    out = []
    for other in running_instances():
        if other["journal"] == me["journal"]:
            continue   # this very instance (its own `up` run again)
        who = f"instance {other['instance']!r} (config {other['config']}, run_dir {other['run_dir']})"
        if other["instance"] == me["instance"]:
            out.append(FieldError(cfg.path, "host.instance", cfg.host.instance, f"{who} is up with this name: names "
                                  "of namespaces, links and pins would collide; choose another name or take it down"))
        elif other["pins"] == me["pins"]:
            out.append(FieldError(cfg.path, "host.bpf_dir", cfg.host.bpf_dir, f"{who} pins its programs in "
                                  f"{other['pins']}; choose another bpf_dir"))
        if other["netns"] == me["netns"] and other["nic"] == me["nic"]:
            shared = sorted(set(other["vlans"]) & set(me["vlans"]))
            also = f", VLAN(s) {', '.join(map(str, shared))} among them" if shared else ""
            out.append(FieldError(cfg.path, "host.nic", cfg.host.nic, f"{who} steers the VLANs of this NIC{also}; "
                                  "one instance per NIC: add these graphs to that instance, or use another NIC"))
        if other["netns"] == me["netns"] and _same_listener(other.get("metrics"), me["metrics"]):
            out.append(FieldError(cfg.path, "host.metrics_port", cfg.host.metrics_port, f"{who} serves its metrics on "
                                  f"{other['metrics'][0]} port {other['metrics'][1]}; give this instance another "
                                  "metrics_port (or 0 for none)"))
    return out


def _same_listener(a: list | None, b: list) -> bool:
    """Two metrics endpoints that cannot both bind: one port, and one address or a wildcard."""
    if not a or not a[1] or not b[1] or a[1] != b[1]:
        return False
    return a[0] == b[0] or any(ipaddress.ip_address(x).is_unspecified for x in (a[0], b[0]))


def names_taken(cfg: Config) -> list[FieldError]:
    """Names the plan would make that exist already."""
    n = cfg.instance_names()
    links = {name for _, name in socket.if_nameindex()}
    out = []
    if os.path.lexists(n.pins):
        out.append(FieldError(cfg.path, "host.bpf_dir", cfg.host.bpf_dir, f"{n.pins} exists already: another "
                              f"instance named {cfg.host.instance!r} pins there, or a crashed run left it; take that "
                              "instance down, or remove the folder if nothing uses it"))
    if os.path.isdir(n.dir) and os.listdir(n.dir):
        out.append(FieldError(cfg.path, "host.run_dir", cfg.host.run_dir, f"{n.dir} exists and is not empty "
                              f"({', '.join(sorted(os.listdir(n.dir))[:4])}): it is not this instance's; move its "
                              "files away or choose another run_dir or instance name"))
    for g in cfg.graphs:
        gn = cfg.graph_names(g)
        if os.path.lexists(netns_path(gn.netns)):
            out.append(FieldError(cfg.path, f"graph[{g.index}].name", g.name, f"namespace {gn.netns} exists "
                                  "already; take down the instance that made it, or rename the graph"))
        for field, port in ((f"graph[{g.index}].access.vlan", gn.c_out), (f"graph[{g.index}].origin.vlan",
                                                                          gn.s_out)):
            if port in links:
                out.append(FieldError(cfg.path, field, port[len(cfg.host.instance) + 1:],
                                      f"link {port} exists already; take down the instance that made it"))
    return out


def check(cfg: Config, info: HostInfo) -> None:
    refuse(problems(cfg, info))


def refuse(found: list[FieldError]) -> None:
    """The problems found, as the ConfigError the CLI prints (exit 2); none: nothing."""
    if found:
        raise ConfigError(found)
