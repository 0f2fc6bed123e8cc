"""Every name an instance makes, in one place: namespaces, links, ifindexes, files, pins, units.

Whatever `up` creates is named here and nowhere else, so `down`, `status`, the supervisor and
the lab all find the same things. Every name carries the instance name, so two instances
(or two labs, or two test runs) on one host never share one. Names are derived from plain
values (the instance, run_dir, bpf_dir, a graph's name, slot and VLANs): the config's checks
use them too (pepctl/config/), so this module knows nothing of the config. The supervisor's
own files are named where it runs (haproxy/supervise.py) and taken from there.

    run_dir/INSTANCE.journal        what `up` made, newest last (pepctl/runner.py Journal)
    run_dir/INSTANCE.reload.journal what a `reload` changed, while it runs: how to put it back
    run_dir/INSTANCE.upgrade.journal what an `upgrade` changed, while it runs (pepctl/upgrade.py)
    run_dir/INSTANCE.lock           held by up, down, reload and bypass (pepctl/lock.py)
    run_dir/INSTANCE/               the instance's folder (root, group of the proxy's user)
        haproxy.cfg                 HAProxy's config, every graph in it (haproxy.cfg.new: a reload's, checked)
        GRAPH.nft                   nft interception table of a graph (mode nft)
        GRAPH.bypass.rules          live bypass rules of a graph (`pepctl bypass add`)
        keeper.pid, keeper.log      the supervisor's keeper (hosts without systemd, the lab)
        exporter-keeper.pid, exporter.log   the exporter's keeper, and the exporter's output
        exporter.pid                the exporter, written once it listens
        experiment.jsonl[.1]        the experiment's flow records (pepctl/exporter.py)
        frr/                        [routing]: zebra, bfdd, bgpd: DAEMON.conf, .pid, .out, .log, .vty
        proxy/                      owned by the proxy's user: what the supervisor and HAProxy write
            supervisor.pid, supervisor.json, supervisor.log
            haproxy.sock, haproxy.log
    bpf_dir/INSTANCE/steer/{prog,maps}   tc/steer.o: VLAN steering on the NIC
    bpf_dir/INSTANCE/flow/{prog,maps}    tc/flow.o: interception, bypass and fail-open in the graphs
    bpf_dir/INSTANCE/{steer,flow}-new    while `pepctl upgrade` runs: the next version's programs and maps
    namespace INSTANCE-GRAPH        a graph; inside it c_in (access side), s_in (origin side)
    host links INSTANCEc<vlan>, INSTANCEs<vlan>   the host's ends of c_in and s_in
    nft table pep_INSTANCE          inside a graph's namespace (mode nft)
    systemd units pep-supervisor@<run folder, escaped>.service, pep-exporter@<the same>.service
    /run/pep-instances/INSTANCE.json   the host's register of running instances (pepctl/register.py)
    /var/log/pep/pepctl-errors.log  the tracebacks of errors pepctl did not expect (the message names it)

Host-wide, shared by every instance that uses them (pepctl/congestion.py):
    /sys/fs/bpf/pep-congestion/NAME/   a congestion control pepctl registered (pep_radio): its maps
                                    and its struct_ops map, pinned; removed by the last user's `down`
    /run/pep-congestion.lock        held while one registers or unregisters one
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

from haproxy.supervise import SERIALS, socket_name
from haproxy.supervise import paths as supervisor_files

from .flow_maps import ifindexes

C_IN, S_IN = "c_in", "s_in"
LOCAL_TABLE = 100      # routing table that delivers everything locally: where intercepted packets go
RULE_PREF = 100        # preference of the policy rules that send packets there
TRUNK_PREF = 10        # tc filter preference of trunk_ingress on the NIC
PORT_PREF = 10         # ... of port_ingress on c_out / s_out
FLOW_PREF = 20         # ... of flow_ingress and flow_egress on c_in / s_in
SUPERVISOR_UNIT = "pep-supervisor@.service"
EXPORTER_UNIT = "pep-exporter@.service"
REGISTER = "/run/pep-instances"   # one file per instance that is up (or coming up), whatever its run_dir
CRASH_LOG = "/var/log/pep/pepctl-errors.log"   # what pepctl knows of an error it did not expect (pepctl/cli.py)
NFT_SUFFIX = ".nft"               # GRAPH.nft
RULES_SUFFIX = ".bypass.rules"    # GRAPH.bypass.rules
TMP_SUFFIX = ".tmp"               # a file being written, renamed into place when whole (pepctl/runner.py)
NEW_SUFFIX = ".new"               # haproxy.cfg.new: a reload's config, checked before it replaces the running one
OLD_SUFFIX = ".1"                 # experiment.jsonl.1: the log's previous part, kept when it grows too long
STAGED_SUFFIX = "-new"            # flow-new: pins' next version while an upgrade runs (bpffs refuses "." in names)
# Congestion controls are host-wide: their pins and lock are the host's, not an instance's (whose
# bpf_dir may differ), so every instance finds the one registration.
CONGESTION_DIR = "/sys/fs/bpf/pep-congestion"
CONGESTION_LOCK = "/run/pep-congestion.lock"


@dataclass(frozen=True)
class InstanceNames:
    instance: str
    run_dir: str          # host.run_dir: holds the journal and the lock beside the folder
    dir: str              # the instance's folder
    proxy_dir: str        # the proxy user's folder inside it
    journal: str
    reload_journal: str   # the undo of a reload that runs (or was cut short): pepctl/reload.py
    upgrade_journal: str  # the same of an upgrade: pepctl/upgrade.py
    lock: str
    pins: str | None      # bpf_dir/INSTANCE (None: names from the folder alone, folder_names)
    steer_pins: str | None
    flow_pins: str | None
    haproxy_cfg: str
    haproxy_cfg_new: str  # a reload's config, checked before it replaces haproxy_cfg
    haproxy_sock: str     # a link to the current HAProxy's own socket (haproxy/supervise.py)
    haproxy_sock_longest: str   # the longest name a HAProxy process's socket takes: it must fit sun_path
    haproxy_log: str
    keeper_pid: str
    keeper_log: str
    supervisor_pid: str
    supervisor_state: str
    supervisor_log: str
    register: str         # REGISTER/INSTANCE.json
    exporter_keeper_pid: str
    exporter_pid: str     # written by the exporter once it listens: its readiness
    exporter_failed: str  # written by the exporter when it cannot listen: why (`up` fails at once)
    exporter_log: str
    experiment_log: str   # the experiment's flow records, JSON lines (pepctl/experiment.py)
    frr_dir: str          # FRR's configs, pids, logs and sockets ([routing]: pepctl/routing.py)


@dataclass(frozen=True)
class GraphNames:
    graph: str
    slot: int             # the graph's place in the config: its slot in the flow maps
    netns: str
    c_out: str
    s_out: str
    c_in_ifindex: int
    s_in_ifindex: int
    proxy: str            # HAProxy frontend and backend
    nft_table: str
    nft_file: str
    live_rules: str
    macs: dict            # c_in, s_in, c_out, s_out -> MAC address, stable across down and up


def instance_names(instance: str, run_dir: str, bpf_dir: str | None = None) -> InstanceNames:
    """An instance's names. bpf_dir None: its files only (a process that knows just its folder,
    run_dir/INSTANCE: the exporter, the keeper); the pin fields are then None."""
    d = os.path.join(run_dir, instance)
    sup = supervisor_files(d)   # the supervisor's files: named where it runs, taken from there
    proxy = os.path.dirname(sup["sock"])
    pins = os.path.join(bpf_dir, instance) if bpf_dir is not None else None
    return InstanceNames(
        instance=instance, run_dir=run_dir, dir=d, proxy_dir=proxy,
        journal=os.path.join(run_dir, f"{instance}.journal"),
        reload_journal=os.path.join(run_dir, f"{instance}.reload.journal"),
        upgrade_journal=os.path.join(run_dir, f"{instance}.upgrade.journal"),
        lock=os.path.join(run_dir, f"{instance}.lock"),
        pins=pins, steer_pins=pins and os.path.join(pins, "steer"), flow_pins=pins and os.path.join(pins, "flow"),
        haproxy_cfg=sup["cfg"],
        haproxy_cfg_new=sup["cfg"] + NEW_SUFFIX,
        haproxy_sock=sup["sock"],
        haproxy_sock_longest=os.path.join(proxy, socket_name(SERIALS - 1)),
        haproxy_log=sup["log"],
        keeper_pid=os.path.join(d, "keeper.pid"),
        keeper_log=os.path.join(d, "keeper.log"),
        supervisor_pid=sup["pid"],
        supervisor_state=sup["state"],
        supervisor_log=sup["supervisor_log"],
        register=os.path.join(REGISTER, f"{instance}.json"),
        exporter_keeper_pid=os.path.join(d, "exporter-keeper.pid"),
        exporter_pid=os.path.join(d, "exporter.pid"),
        exporter_failed=os.path.join(d, "exporter.failed"),
        exporter_log=os.path.join(d, "exporter.log"),
        experiment_log=os.path.join(d, "experiment.jsonl"),
        frr_dir=os.path.join(d, "frr"),
    )


def folder_names(instance_dir: str) -> InstanceNames:
    """The names of the instance whose folder is instance_dir (run_dir/INSTANCE), files only."""
    return instance_names(os.path.basename(instance_dir), os.path.dirname(instance_dir))


def previous_log(path: str) -> str:
    """Where a log's previous part goes when it grows too long (one is kept)."""
    return path + OLD_SUFFIX


def instance_files(n: InstanceNames) -> list[str]:
    """What the instance's folder may hold, as names and "*SUFFIX" patterns (pepctl/runner.py
    remove_dir): its undo removes these and nothing else."""
    files = [n.haproxy_cfg, n.haproxy_cfg_new, n.keeper_pid, n.keeper_log, n.exporter_keeper_pid, n.exporter_pid,
             n.exporter_failed, n.exporter_log, n.experiment_log, previous_log(n.experiment_log)]
    return [os.path.basename(f) for f in files] + [f"*{s}" for s in (TMP_SUFFIX, NFT_SUFFIX, RULES_SUFFIX)]


def proxy_files(n: InstanceNames) -> list[str]:
    """What the proxy's folder may hold: the supervisor's files, and HAProxy's sockets."""
    files = [n.haproxy_log, n.supervisor_pid, n.supervisor_state, n.supervisor_log]
    return [os.path.basename(f) for f in files] + ["*.sock", f"*{TMP_SUFFIX}"]


def graph_names(instance: str, run_dir: str, graph: str, slot: int, access_vlan: int, origin_vlan: int) -> GraphNames:
    """A graph's names: graph is its name, slot its 0-based place among the config's graphs."""
    d = os.path.join(run_dir, instance)
    c_in, s_in = ifindexes(slot)
    return GraphNames(
        graph=graph, slot=slot,
        netns=f"{instance}-{graph}",
        c_out=f"{instance}c{access_vlan}",
        s_out=f"{instance}s{origin_vlan}",
        c_in_ifindex=c_in, s_in_ifindex=s_in,
        proxy=f"graph_{graph}",
        nft_table=f"pep_{instance}",
        nft_file=os.path.join(d, graph + NFT_SUFFIX),
        live_rules=os.path.join(d, graph + RULES_SUFFIX),
        macs={link: stable_mac(instance, graph, link) for link in (C_IN, S_IN, "c_out", "s_out")},
    )


def stable_mac(instance: str, graph: str, link: str) -> str:
    """A locally administered unicast MAC derived from the names: `down` then `up` gives c_in and s_in
    the MACs they had, so the subscribers' and routers' neighbour caches stay right (a new random
    MAC stops traffic until their entries expire: 9 to 42 s measured)."""
    digest = hashlib.sha256(f"pep/{instance}/{graph}/{link}".encode()).digest()
    octets = bytes([(digest[0] & 0xFC) | 0x02]) + digest[1:6]
    return ":".join(f"{b:02x}" for b in octets)


def unit_name(n: InstanceNames, template: str = SUPERVISOR_UNIT) -> str:
    """The instance's unit of a template (pep-supervisor@.service, pep-exporter@.service):
    TEMPLATE@<escaped instance folder>.service, `systemd-escape --path` of the folder, which the
    unit gets back unescaped as %f."""
    return template.replace("@", "@" + systemd_escape_path(n.dir))


def systemd_escape_path(path: str) -> str:
    """systemd-escape --path: strip slashes at both ends, "/" -> "-", other specials -> \\xNN."""
    out = []
    for i, ch in enumerate(path.strip("/")):
        if ch == "/":
            out.append("-")
        elif ch.isascii() and (ch.isalnum() or ch in "_:" or (ch == "." and i > 0)):
            out.append(ch)
        else:
            out.extend(f"\\x{b:02x}" for b in ch.encode())
    return "".join(out) or "-"


def staged_pins(pins: str) -> str:
    """Where `pepctl upgrade` loads the next version of the programs and maps pinned in pins."""
    return pins + STAGED_SUFFIX


def congestion_pins(cc: str) -> str:
    """Where the congestion control cc (one pepctl registers) pins its maps."""
    return os.path.join(CONGESTION_DIR, cc)


def netns_path(ns: str) -> str:
    return f"/run/netns/{ns}"


def in_netns(ns: str | None, argv: list[str]) -> list[str]:
    """Run argv in network namespace ns (None: here). nsenter --net, not `ip netns exec`: the
    latter remounts /sys and hides the pins under /sys/fs/bpf."""
    return argv if ns is None else ["nsenter", f"--net={netns_path(ns)}", *argv]
