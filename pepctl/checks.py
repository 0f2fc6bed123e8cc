"""What `plan` and `up` check before they touch the host, each problem named by file, field and
value, with what to do.

The config's own checks (types, ranges, address kinds, overlaps) are in pepctl/config.py; these
need the host: the NIC, the kernel's congestion controls, the proxy's user, and that every name
the plan would make is free. An undo of `up` removes what its journal names (pepctl/runner.py):
that is safe only because a name that exists already is refused here, before anything is made.
"""

from __future__ import annotations

import os
import socket

from . import service
from .config import Config, ConfigError, FieldError
from .hostinfo import HostInfo
from .names import graph_names, instance_names, netns_path, supervisor_unit
from .runner import run


def problems(cfg: Config, info: HostInfo) -> list[FieldError]:
    out: list[FieldError] = []

    def bad(field: str, value, message: str) -> None:
        out.append(FieldError(cfg.path, field, value, message))

    if not info.nic_exists:
        bad("host.nic", cfg.host.nic, "no such network interface in this namespace; check `ip link`")
    bad_cc = sorted({s.congctl for g in cfg.graphs for s in (g.access, g.origin)} - info.available_cc)
    if bad_cc and info.available_cc:
        bad("graph[].access/origin.congctl", ",".join(bad_cc),
            f"this kernel offers {' '.join(sorted(info.available_cc))}")
    if any(g.proxy.enabled for g in cfg.graphs):
        if info.proxy_uid is None:
            bad("graph[].proxy.enabled", True, f"the proxy runs as user {info.proxy_user!r} (User= of "
                f"{service.UNIT_FILE}), which does not exist here; create it with `useradd --system --user-group "
                f"--no-create-home --shell /usr/sbin/nologin {info.proxy_user}` (scripts/setup does)")
        if service.backend(cfg.host.supervisor) == "systemd":
            unit = supervisor_unit(instance_names(cfg))
            if run(["systemctl", "cat", unit], check=False).returncode != 0:
                bad("host.supervisor", cfg.host.supervisor, f"systemd runs this host but has no {unit}: install "
                    f"{service.UNIT_FILE} into /etc/systemd/system and run `systemctl daemon-reload`, or set "
                    "supervisor = \"pepctl\"")
    out += names_taken(cfg)
    return out


def names_taken(cfg: Config) -> list[FieldError]:
    """Names the plan would make that exist already."""
    n = instance_names(cfg)
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
        gn = graph_names(cfg, g)
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
    found = problems(cfg, info)
    if found:
        raise ConfigError(found)
