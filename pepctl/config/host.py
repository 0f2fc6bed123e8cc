"""[host]: the instance, the NIC, its folders, and HAProxy's and the exporter's own settings."""

from __future__ import annotations

import ipaddress
import json
from typing import Any

from .model import Host, Tuning
from .reader import BAD, BOOL, INT, STR, Reader
from .schema import (
    DIR_DEFAULTS,
    ENUMS,
    HOST_DEFAULTS,
    HOST_KEYS,
    INSTANCE_RE,
    MAX_THREADS,
    MAXCONN_MAX,
    STATS_SOCKET_MAX,
    TUNING_KEYS,
    UNIT_NAME_MAX,
    UNIX_PATH_MAX,
)
from .values import (
    clean_path,
    kind_problem,
    nesting,
    path_problem,
    run_dir_max,
    stats_socket,
    supervisor_unit_len,
    valid_ifname,
    zone_problem,
)


def read_host(r: Reader, doc: dict) -> Host | Any:
    raw = r.subtable(doc, "", "host", HOST_KEYS, required=True)
    if raw is BAD:
        return BAD
    instance = r.get(raw, "host", "instance", STR, example='"pep1"')
    if instance is not BAD and not INSTANCE_RE.fullmatch(instance):
        instance = r.error("host.instance", instance,
                           "must be 1-9 characters of a-z and 0-9, starting with a letter "
                           "(it prefixes every name pepctl makes), e.g. \"pep1\"")
    nic = r.get(raw, "host", "nic", STR, example='"eth1"')
    if nic is not BAD and not valid_ifname(nic):
        nic = r.error("host.nic", nic, "not a valid interface name (1-15 printable characters, no '/', "
                      "':' or spaces); give the trunk NIC as `ip link` shows it")
    dirs = []
    for key, default in DIR_DEFAULTS.items():
        d = r.get(raw, "host", key, STR, default)
        if d is not BAD:
            msg = path_problem(d, default)
            d = r.error(f"host.{key}", d, msg) if msg else clean_path(d)
        dirs.append(d)
    if instance is not BAD:
        dirs[0] = run_dir_fits(r, raw, dirs[0], instance)
    if BAD not in dirs:
        run_dir, bpf_dir = dirs
        rel = nesting(run_dir, bpf_dir)
        if rel:
            dirs[0] = r.error("host.run_dir", raw.get("run_dir", run_dir), f"is {rel} bpf_dir "
                              f"({json.dumps(bpf_dir)}); a bpf filesystem holds only pins, and run_dir holds "
                              "files: give them separate folders, e.g. \"/run/pep\" and \"/sys/fs/bpf/pep\"")
    traw = r.subtable(raw, "host", "tuning", TUNING_KEYS)
    tuning: Any = BAD
    if traw is not BAD:
        flags = [r.get(traw, "host.tuning", k, BOOL, True) for k in TUNING_KEYS]
        tuning = BAD if BAD in flags else Tuning(*flags)
    extra = [read_host_value(r, raw, key) for key in HOST_DEFAULTS]
    parts = [instance, nic, *dirs, tuning, *extra]
    return BAD if any(p is BAD for p in parts) else Host(*parts)


def run_dir_fits(r: Reader, raw: dict, run_dir: Any, instance: str) -> Any:
    """run_dir, or BAD when a name made from it would not fit: HAProxy's stats socket, the
    supervisor's systemd unit."""
    if run_dir is BAD:
        return BAD
    shown = raw.get("run_dir", run_dir)
    sock = stats_socket(run_dir, instance)
    if len(sock) > STATS_SOCKET_MAX:
        return r.error("host.run_dir", shown, f"too long: HAProxy's stats socket {sock} would be {len(sock)} "
                       f"bytes, and a socket path can have at most {STATS_SOCKET_MAX} (sun_path's "
                       f"{UNIX_PATH_MAX}, less the \".PID.tmp\" HAProxy adds while it binds); use a run_dir of "
                       f"at most {run_dir_max(instance)} bytes, e.g. \"/run/pep\"")
    unit = supervisor_unit_len(run_dir, instance)
    if unit > UNIT_NAME_MAX:
        return r.error("host.run_dir", shown, f"too long for systemd: the supervisor's unit name would be "
                       f"{unit} bytes, and systemd takes at most {UNIT_NAME_MAX} (it writes each '-' of "
                       "the path as 4: \\x2d); use a shorter run_dir, e.g. \"/run/pep\"")
    return run_dir


def read_host_value(r: Reader, raw: dict, key: str) -> Any:
    """One of the [host] keys with a default (HOST_DEFAULTS), checked."""
    path = f"host.{key}"
    default = HOST_DEFAULTS[key]
    value = r.get(raw, "host", key, STR if isinstance(default, str) else INT, default)
    if value is BAD:
        return BAD
    if key in ENUMS and value not in ENUMS[key]:
        return r.error(path, value, f"must be one of {', '.join(map(json.dumps, ENUMS[key]))}")
    if key == "threads" and not 0 <= value <= MAX_THREADS:
        return r.error(path, value, f"use 1-{MAX_THREADS} threads (HAProxy's limit), "
                       "or 0 for one per CPU of the NIC's NUMA node")
    if key == "maxconn" and value < 0:
        return r.error(path, value, "must not be negative; use 0 to size it from the open-file limit")
    if key == "maxconn" and value > MAXCONN_MAX:
        return r.error(path, value, f"too large: use at most {MAXCONN_MAX} (HAProxy counts connections "
                       "and their descriptors in an int; plan also checks it against this host's open-file "
                       "limit), or 0 to size it from that limit")
    if key == "metrics_port" and not 0 <= value <= 65535:
        return r.error(path, value, "not a TCP port; use 1-65535, or 0 for no metrics")
    if key == "metrics_address":
        msg = zone_problem(value)
        if not msg:
            try:
                msg = kind_problem(ipaddress.ip_address(value), "metrics")
            except ValueError:
                msg = ('not an IP address; the exporter listens on it in the host\'s namespace, e.g. '
                       '"127.0.0.1" or a management address')
        if msg:
            return r.error(path, value, msg)
    return value
