"""Facts about the host that the plan depends on, read once before planning.

pepctl may run inside a network namespace entered with `nsenter --net` (the
lab's proxy host). /sys/class/net there still shows the namespace that
mounted /sys, so links are looked up over netlink (`ip -j`), and the NIC's
NUMA node through its bus address, which does not depend on the namespace.
"""

from __future__ import annotations

import grp
import os
import pwd
import resource
from collections.abc import Sequence
from dataclasses import dataclass

from .config import Config
from .runner import run, run_json


@dataclass(frozen=True)
class HostInfo:
    nic_exists: bool
    nic_bus: str | None          # PCI address, None for virtual NICs (veth)
    numa_node: int | None        # None: the NIC reports no locality
    cpus: tuple[int, ...]        # CPUs HAProxy threads are pinned to
    cpus_note: str               # why these CPUs
    nofile: int                  # the hard open-file limit HAProxy can raise to
    available_cc: frozenset[str]
    proxy_user: str              # the proxy's own user (User= of its systemd unit)
    proxy_uid: int | None        # None: no such user on this host
    proxy_gid: int | None
    cgroup2: str | None = None   # the root of the cgroup v2 hierarchy; None: none mounted

    def proxy_cpus(self, threads: int = 0) -> tuple[int, ...]:
        """The CPU of each HAProxy thread: one thread per CPU near the NIC, or `threads` of them
        (host.threads) laid over those CPUs in turn."""
        if not threads:
            return self.cpus
        return tuple(self.cpus[i % len(self.cpus)] for i in range(threads))

    def proxy_maxconn(self, cfg: Config) -> int:
        """The most connections HAProxy can hold within this host's open-file limit, for cfg's
        proxied graphs and its threads (maxconn_for)."""
        bound = [g.proxy.bound_ports for g in cfg.graphs if g.proxy.enabled]
        return maxconn_for(self.nofile, bound, len(self.proxy_cpus(cfg.host.threads)))


def parse_cpulist(text: str) -> list[int]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11]"""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def _ip(ns: str | None) -> list[str]:
    return ["ip", "-j"] if ns is None else ["ip", "-j", "-n", ns]


def link_exists(name: str, ns: str | None = None) -> bool:
    return run([*_ip(ns), "link", "show", "dev", name], check=False).returncode == 0


def ifindex(name: str, ns: str | None = None) -> int:
    return int(run_json([*_ip(ns), "link", "show", "dev", name])[0]["ifindex"])


def nic_bus_address(nic: str) -> str | None:
    proc = run(["ethtool", "-i", nic], check=False)
    for line in proc.stdout.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "bus-info":
            value = value.strip()
            return value if value and value != "N/A" else None
    return None


def read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def user_ids(user: str) -> tuple[int | None, int | None]:
    """(uid, gid of its group of the same name, or its primary group); (None, None) if unknown."""
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        return None, None
    try:
        return pw.pw_uid, grp.getgrnam(user).gr_gid
    except KeyError:
        return pw.pw_uid, pw.pw_gid


def gather(nic: str, proxy_user: str = "pep") -> HostInfo:
    exists = link_exists(nic)
    bus = nic_bus_address(nic) if exists else None
    node = None
    if bus:
        raw = read(f"/sys/bus/pci/devices/{bus}/numa_node")
        if raw is not None and int(raw) >= 0:
            node = int(raw)
    allowed = sorted(os.sched_getaffinity(0))
    if node is not None:
        local = parse_cpulist(read(f"/sys/devices/system/node/node{node}/cpulist") or "")
        cpus = [c for c in local if c in allowed] or allowed
        note = f"NIC {nic} is on NUMA node {node}: CPUs {cpus}"
    else:
        cpus = allowed
        note = f"NIC {nic} reports no NUMA locality (virtual NIC or single node): using all CPUs {cpus}"
    cc = frozenset((read("/proc/sys/net/ipv4/tcp_available_congestion_control") or "").split())
    return HostInfo(exists, bus, node, tuple(cpus), note,
                    resource.getrlimit(resource.RLIMIT_NOFILE)[1], cc, proxy_user, *user_ids(proxy_user),
                    cgroup2_root())


def cgroup2_root() -> str | None:
    """Where the cgroup v2 hierarchy is mounted: /sys/fs/cgroup on a unified host (systemd's default
    since v247), /sys/fs/cgroup/unified on a hybrid one; the shortest path if several; None if none."""
    with open("/proc/self/mounts") as f:
        found = [line.split()[1] for line in f if line.split()[2:3] == ["cgroup2"]]
    return min(found, key=len) if found else None


def maxconn_for(nofile: int, bound_ports: Sequence[int] = (1,), threads: int = 1) -> int:
    """Connections one HAProxy process of `threads` threads can hold within the open-file limit.

    Each proxied connection costs two sockets, and with splice HAProxy keeps
    up to maxconn/4 pipes of two fds each: about 2.5 fds a connection. Keep
    200 fds for logs and the stats socket, and per proxied graph (bound_ports:
    the ports each binds, Proxy.bound_ports) its listeners, one per port,
    thread and address family (haproxy/render.py), and the open namespace
    HAProxy keeps for them.
    """
    listeners = sum(2 * threads * ports + 1 for ports in bound_ports)
    return max(int((nofile - 200 - listeners) / 2.5), 25)
