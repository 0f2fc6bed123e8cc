"""pep-lab up --hosts N (1-4), pep-lab add-host: proxy hosts behind two routers, FRR (BGP, BFD) everywhere.

                         +-- h1 -- sw1 ==trunk== ph1  (pepctl up; graph pl<rid>1-pep: HAProxy, FRR)
  client -- eth0 -- ra --+-- h2 -- sw2 ==trunk== ph2  ...
  (access router, FRR)   +-- hN ...                        each swI: p-client (VLAN 100) from ra,
                                                                     p-origin (VLAN 200) from ro
  origin -- eth0 -- ro --+-- h1 -- sw1, h2 -- sw2, ...
  (origin router, FRR)

Subscribers 198.18.0.0/24 and 2001:2:0:1::/64 are split into 8 shares (a /27 and a /67 each);
each has a primary host and a backup (rendezvous hash, pepctl/routing.py). Every host's pepctl
config names the whole cluster in its [routing] table; pepctl renders its FRR config from it and
starts FRR with `up`. Every link is dual stack, and each family has its own BGP sessions.

  ra  sends a subscriber's traffic by its source: a policy rule per share and family (from
      198.18.0.32k/27 or 2001:2:0:1:(2000k)::/67, in from the clients) looks up table 100+k,
      where FRR keeps a default route of each family toward the share's anchor, 198.18.96.k or
      2001:2:0:196::k, a /32 or /128 that the share's hosts announce over BGP;
  ro  sends the answers by their destination: the share prefixes the hosts announce.
The routers wait for the hosts' sessions (passive): a graph's addresses take no connections.

Each router has one segment for the hosts (a bridge, "hosts", over its links hI): access
198.18.64.0/24 and 2001:2:0:164::/64 (ra .1 and ::1, host I's c_in .10+I and ::1I), origin
198.19.64.0/24 and 2001:2:0:264::/64 (ro and host I's s_in, the same). On it a draining host
hands new flows to another host directly. The client has one address of each family in every
share, 198.18.0.(32k+10) and 2001:2:0:1:(2000k)::10. ASNs: ra 65001, ro 65002, host I 65010+I.
The hosts intercept with bpf unless --interception says otherwise (pepctl binds bfdd's packet
socket to lo: docs/routing.md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from pepctl import config as configmod
from pepctl import routing, runner
from pepctl.names import in_netns
from pepctl.plan import mkdir_step
from pepctl.runner import Call, Journal, Step, action, daemon_step, wait_for

from .addresses import (
    ANCHORS,
    ANCHORS6,
    CLIENT,
    CLIENT4,
    CLIENT6,
    HOST_ASN_BASE,
    ORIGIN,
    ORIGIN4,
    ORIGIN6,
    ORIGIN_URL4,
    ROUTER_ASN,
    SHARES,
    SUBSCRIBERS,
    SUBSCRIBERS6,
    client_address,
    host_address,
    router_address,
    segment,
)
from .configs import cluster_host, toml_text
from .lab import (
    DEFAULT_CONGESTION,
    END_HOST_SYSCTLS,
    PEPCTL,
    STATE_DIR,
    Lab,
    node_netns,
    pepctl_up_step,
    quiet_port_steps,
    switch_steps,
    sysctl_step,
)

HOSTS_MAX = 4
SHARE_TABLE_BASE = 100     # ra: share k's routes are in table 100+k
SHARE_RULE_PREF = 1000     # ... looked up by rule 1000+k
BFD_INTERVAL_MS, BFD_MULTIPLIER = 100, 3
ANCHOR_FOLLOW = os.path.join(os.path.dirname(os.path.abspath(__file__)), "anchor_follow.py")


def pep_config(prefix: str, run_dir: str, i: int, hosts: int, opts: argparse.Namespace) -> str:
    """Host I's pepctl config: the lab's one graph on transit links, and the cluster in [routing]."""
    doc = cluster_host(i, hosts, instance=f"{prefix}{i}", nic="nic0", name="pep",
                       host={"run_dir": f"{run_dir}/pep", "bpf_dir": f"/sys/fs/bpf/{prefix}{i}", "supervisor": "pepctl",
                             "metrics_port": 0 if opts.no_metrics else 9101,
                             "tuning": {"irq_affinity": False, "rss_symmetric": False}},
                       congestion=getattr(opts, "congestion", DEFAULT_CONGESTION),
                       proxy={"interception": opts.interception, "splice": opts.splice},
                       routing={"bfd": {"interval_ms": BFD_INTERVAL_MS, "multiplier": BFD_MULTIPLIER}})
    return f"# Proxy host {i} of the lab's cluster. Written by pep-lab up --hosts {hosts}.\n" + toml_text(doc)


def router_bgpd(router: str, router_id: str) -> str:
    """A router's bgpd: sessions with BFD to whichever host of the segment opens one, IPv4 and IPv6
    (a peer group each); from them, anchors (ra) or share prefixes (ro); to them, nothing."""
    side = "access" if router == "ra" else "origin"
    wanted = {4: f"{ANCHORS} ge 32", 6: f"{ANCHORS6} ge 128"} if router == "ra" else \
        {4: f"{SUBSCRIBERS} ge {SUBSCRIBERS.prefixlen + 1}", 6: f"{SUBSCRIBERS6} ge {SUBSCRIBERS6.prefixlen + 1}"}
    lines = ["frr defaults datacenter", f"hostname {router}", "!",
             f"ip prefix-list pep-shares seq 5 permit {wanted[4]}",
             f"ipv6 prefix-list pep-shares seq 5 permit {wanted[6]}",
             "route-map from-hosts permit 10", " match ip address prefix-list pep-shares",
             "route-map from-hosts permit 20", " match ipv6 address prefix-list pep-shares",
             "route-map nothing deny 10", "!",
             f"router bgp {ROUTER_ASN[router]}", f" bgp router-id {router_id}", " no bgp ebgp-requires-policy",
             " no bgp default ipv4-unicast"]
    for v in (4, 6):
        group = f"hosts{v}"
        lines += [f" neighbor {group} peer-group", f" neighbor {group} remote-as external",
                  f" neighbor {group} bfd", f" neighbor {group} bfd profile pep",
                  # Any host on the segment may open a session: adding one changes nothing here.
                  f" bgp listen range {segment(side, v)} peer-group {group}"]
    for v in (4, 6):
        group = f"hosts{v}"
        # One path per prefix: FRR's datacenter defaults would spread a prefix two hosts announce
        # alike over both (ECMP), and the two routers would not hash a flow to the same one.
        lines += [f" address-family {routing.AFI[v]}", "  maximum-paths 1", f"  neighbor {group} activate",
                  f"  neighbor {group} route-map from-hosts in", f"  neighbor {group} route-map nothing out",
                  " exit-address-family"]
    return "\n".join(lines + ["!"]) + "\n"


def ra_staticd() -> str:
    """Share k's table: an IPv4 default route toward the share's anchor, which FRR resolves through
    BGP. (IPv6: netns/anchor_follow.py, as FRR 8.4 does not follow an IPv6 anchor's route.)"""
    return "hostname ra\n" + "".join(f"ip route 0.0.0.0/0 {routing.anchor_of(ANCHORS, k)} table "
                                     f"{SHARE_TABLE_BASE + k}\n" for k in range(SHARES))


def share_nets(version: int) -> list:
    net = SUBSCRIBERS if version == 4 else SUBSCRIBERS6
    return list(net.subnets(prefixlen_diff=(SHARES - 1).bit_length()))


def share_rules(version: int) -> str:
    """ra's policy rules of one family (ip -batch, -6 for IPv6): a share's traffic from the clients
    looks up the share's table."""
    return "".join(f"rule add pref {SHARE_RULE_PREF + k} from {net} iif eth0 lookup {SHARE_TABLE_BASE + k}\n"
                   for k, net in enumerate(share_nets(version)))


def best_hosts(folder: str, router: str, version: int) -> dict[str, int]:
    """The host a router sends each share to, by its BGP best paths of one family: prefix (ro) or
    anchor (ra) -> host number."""
    out = subprocess.run(routing.vtysh_argv(os.path.join(folder, router), f"show bgp {routing.AFI[version]} json"),
                         capture_output=True, text=True)
    try:
        routes = json.loads(out.stdout).get("routes", {})
    except json.JSONDecodeError:
        return {}
    side = "access" if router == "ra" else "origin"
    by_address = {str(host_address(side, i, version)): i for i in range(1, HOSTS_MAX + 1)}
    best = {}
    for prefix, paths in routes.items():
        chosen = [p for p in paths if p.get("bestpath")]
        if chosen:
            # An IPv6 path has the host's global address and its link-local one.
            hops = [h["ip"] for h in chosen[0]["nexthops"]]
            best[prefix] = next((by_address[h] for h in hops if h in by_address), 0)
    return best


def share_hosts(folder: str, version: int = 4) -> dict[int, tuple[int | None, int | None]]:
    """share -> (the host ra sends it to, the host ro sends it to), for one family."""
    ra, ro = best_hosts(folder, "ra", version), best_hosts(folder, "ro", version)
    anchors = ANCHORS if version == 4 else ANCHORS6
    return {k: (ra.get(str(routing.host_route(routing.anchor_of(anchors, k)))), ro.get(str(net)))
            for k, net in enumerate(share_nets(version))}


def primaries(config: str) -> dict[int, tuple[int, int]]:
    """share -> (its primary, its primary): where both routers should send it, by a host's config."""
    owners = routing.owners(configmod.load(config).routing)
    return {k: (int(p.removeprefix("ph")),) * 2 for k, (p, _) in enumerate(owners)}


@action("cluster_converged")
def converged(folder: str, config: str, timeout: float = 60) -> None:
    """Waits until both routers send every share of both families to its primary host."""
    want = primaries(config)
    wait_for(lambda: all(share_hosts(folder, v) == want for v in (4, 6)), timeout=timeout, interval=0.2,
             what=f"both routers to send every share to its primary, IPv4 and IPv6 ({want})")


class ClusterLab(Lab):
    """The lab with N proxy hosts behind routers (pep-lab up --hosts N, pep-lab add-host)."""

    _hosts = 0

    @property
    def hosts(self) -> int:
        """How many hosts the lab has: up's --hosts, and those add-host added since."""
        meta = self.journal.meta
        return int(meta.get("hosts") or meta.get("options", {}).get("hosts") or 0) or self._hosts

    def netns(self, node: str) -> str:
        """Any host's nodes (swN, phN, pepN), not only those up now: add-host names the next one's."""
        if node.rstrip("0123456789") in ("sw", "ph", "pep") and node[-1].isdigit():
            return node_netns(self.prefix, node)
        return super().netns(node)

    @property
    def nodes(self) -> tuple[str, ...]:
        per_host = [n for i in range(1, self.hosts + 1) for n in (f"sw{i}", f"ph{i}", f"pep{i}")]
        return ("client", "origin", "ra", "ro", *per_host)

    def host_config(self, i: int) -> str:
        return os.path.join(self.run_dir, f"pep{i}.toml")

    def host_journal(self, i: int) -> Journal:
        """What add-host made for host I: undone by down, before the lab's own journal."""
        return Journal(os.path.join(STATE_DIR, f"{self.name}.host{i}.json"))

    def frr_folder(self, router: str) -> str:
        return os.path.join(self.run_dir, "frr", router)

    def steps(self, opts: argparse.Namespace) -> list[Step]:
        self._hosts = opts.hosts
        n = {node: self.netns(node) for node in ("client", "origin", "ra", "ro")}
        steps = [mkdir_step(self.run_dir, 0o755, what=f"create lab folder {self.run_dir}")]
        steps += [Step(f"create namespace {ns}", ["ip", "netns", "add", ns], undo=["ip", "netns", "del", ns])
                  for ns in n.values()]
        steps += self.end_host_steps(n)
        for router, side, lan in (("ra", "access", CLIENT), ("ro", "origin", ORIGIN)):
            r = n[router]
            steps += [Step(f"bring up {r}/lo", ["ip", "-n", r, "link", "set", "lo", "up"]),
                      Step(f"address {lan[2]}/24 on {r}/eth0", ["ip", "-n", r, "addr", "add", f"{lan[2]}/24",
                                                                "dev", "eth0"]),
                      Step(f"address {lan[3]}/64 on {r}/eth0", ["ip", "-n", r, "addr", "add", f"{lan[3]}/64",
                                                                "dev", "eth0", "nodad"]),
                      Step(f"bring up {r}/eth0", ["ip", "-n", r, "link", "set", "eth0", "up"]),
                      sysctl_step(r, "net.ipv4.ip_forward=1", f"forwarding in {r}"),
                      sysctl_step(r, "net.ipv6.conf.all.forwarding=1", f"IPv6 forwarding in {r}"),
                      Step(f"bridge {r}/hosts", ["ip", "-n", r, "link", "add", "hosts", "type", "bridge"])]
            for v in (4, 6):
                addr = f"{router_address(side, v)}/{segment(side, v).prefixlen}"
                steps.append(Step(f"address {addr} on {r}/hosts", ["ip", "-n", r, "addr", "add", addr, "dev", "hosts",
                                                                  *(["nodad"] if v == 6 else [])]))
            steps.append(Step(f"bring up {r}/hosts", ["ip", "-n", r, "link", "set", "hosts", "up"]))
        for v in (4, 6):
            steps.append(Step(f"IPv{v} share rules of {n['ra']}", ["ip", "-n", n["ra"], f"-{v}", "-batch", "-"],
                              input=share_rules(v)))
        steps += self.router_frr_steps(n)
        for i in range(1, self.hosts + 1):
            steps += self.host_steps(i, self.hosts, opts)
        steps.append(self.converged_step())
        steps += self.origin_steps()
        return steps

    def host_steps(self, i: int, hosts: int, opts: argparse.Namespace) -> list[Step]:
        """Proxy host I of a cluster of hosts: its switch on both routers' segments, and pepctl up."""
        sw, ph = self.netns(f"sw{i}"), self.netns(f"ph{i}")
        steps = [Step(f"create namespace {ns}", ["ip", "netns", "add", ns], undo=["ip", "netns", "del", ns])
                 for ns in (sw, ph)]
        for router, port in (("ra", "p-client"), ("ro", "p-origin")):
            r = self.netns(router)
            steps += [Step(f"cable {r}/h{i} <-> {sw}/{port}", ["ip", "-n", r, "link", "add", f"h{i}", "type", "veth",
                                                               "peer", "name", port, "netns", sw],
                           undo=["ip", "-n", r, "link", "del", f"h{i}"]),
                      Step(f"{r}/h{i} into the bridge", ["ip", "-n", r, "link", "set", f"h{i}", "master", "hosts"]),
                      Step(f"bring up {r}/h{i}", ["ip", "-n", r, "link", "set", f"h{i}", "up"])]
            steps += quiet_port_steps(((sw, port),))
        steps += switch_steps(sw, ph, f"/sys/fs/bpf/{self.prefix}sw{i}")
        steps.append(Step(f"write proxy host {i}'s pepctl config",
                          Call("write", (self.host_config(i), pep_config(self.prefix, self.run_dir, i, hosts, opts)),
                               self.host_config(i))))
        steps.append(pepctl_up_step(ph, self.host_config(i)))
        return steps

    def converged_step(self) -> Step:
        folder, config = os.path.join(self.run_dir, "frr"), self.host_config(1)
        return Step("both routers send every share to its primary", Call("cluster_converged", (folder, config),
                                                                         "wait for BGP on ra and ro"))

    def add_host(self) -> int:
        """One more proxy host: it comes up announcing its shares, then every other host is told
        of it (pepctl reload), and gives up the shares it took. A failed add rolls back that host
        only."""
        if not (self.journal.exists and self.journal.complete):
            print(f"pep-lab add-host: lab {self.name} is not up (pep-lab up --hosts N)", file=sys.stderr)
            return 1
        i = self.hosts + 1
        if i > HOSTS_MAX:
            print(f"pep-lab add-host: lab {self.name} has {self.hosts} hosts, the most it takes is {HOSTS_MAX}",
                  file=sys.stderr)
            return 1
        opts = argparse.Namespace(**self.journal.meta["options"])
        journal = self.host_journal(i)
        if not self.undo_previous(journal, "add-host"):
            return 1
        journal.start({"rid": self.rid, "host": i})
        print(f"lab {self.name}: adding proxy host {i}")
        try:
            runner.apply(self.host_steps(i, i, opts), journal)
        except Exception as e:
            if journal.undo:
                print(f"pep-lab add-host: {e}\n{self.rollback_left(journal)}", file=sys.stderr)
                return 1
            journal.remove()
            print(f"pep-lab add-host: {e}\nhost {i} was rolled back; the lab is as it was", file=sys.stderr)
            return 1
        journal.mark_complete()
        self.journal.update_meta(hosts=i)
        for h in range(1, i):
            runner.write_file(self.host_config(h), pep_config(self.prefix, self.run_dir, h, i, opts))
            pepctl = [PEPCTL, "-c", self.host_config(h), "reload"]
            out = subprocess.run(in_netns(self.netns(f"ph{h}"), pepctl), capture_output=True, text=True)
            for line in (out.stdout + out.stderr).strip().splitlines():
                print(f"  host {h}: {line}")
            if out.returncode != 0:
                print(f"pep-lab add-host: host {h} did not take the new cluster; see above", file=sys.stderr)
                return 1
        converged(os.path.join(self.run_dir, "frr"), self.host_config(1))
        print(f"lab {self.name}: {i} hosts; both routers send every share to its primary")
        return 0

    def down(self) -> int:
        for i in range(HOSTS_MAX, 0, -1):
            journal = self.host_journal(i)
            if journal.exists:
                errors = runner.undo_all(journal, log=lambda m: None)
                for e in errors:
                    print(f"pep-lab down: {e}", file=sys.stderr)
                if errors:
                    return 1
                journal.remove()
        return super().down()

    def end_host_steps(self, n: dict) -> list[Step]:
        steps = []
        for host, router, (a4, a6, gw4, gw6) in (("client", "ra", CLIENT), ("origin", "ro", ORIGIN)):
            ns = n[host]
            steps += [Step(f"cable {ns} <-> {n[router]}", ["ip", "-n", ns, "link", "add", "eth0", "type", "veth",
                                                           "peer", "name", "eth0", "netns", n[router]]),
                      Step(f"bring up {ns}/lo", ["ip", "-n", ns, "link", "set", "lo", "up"]),
                      Step(f"address {a4} on {ns}/eth0", ["ip", "-n", ns, "addr", "add", a4, "dev", "eth0"]),
                      Step(f"address {a6} on {ns}/eth0", ["ip", "-n", ns, "addr", "add", a6, "dev", "eth0",
                                                          "nodad"]),
                      Step(f"bring up {ns}/eth0", ["ip", "-n", ns, "link", "set", "eth0", "up"]),
                      Step(f"default route of {ns}", ["ip", "-n", ns, "route", "add", "default", "via", gw4,
                                                      "congctl", "cubic"]),
                      Step(f"IPv6 default route of {ns}", ["ip", "-n", ns, "-6", "route", "add", "default", "via",
                                                           gw6, "congctl", "cubic"])]
            steps += [sysctl_step(ns, f"{key}={value}") for key, value in END_HOST_SYSCTLS]
        # One client address of each family in every share: a test picks a share by its source address.
        steps += [Step(f"client address {client_address(k, v)}", ["ip", "-n", n["client"], "addr", "add",
                                                                  f"{client_address(k, v)}/{24 if v == 4 else 64}",
                                                                  "dev", "eth0", *(["nodad"] if v == 6 else [])])
                  for v in (4, 6) for k in range(1, SHARES)]
        return steps

    def router_frr_steps(self, n: dict) -> list[Step]:
        steps = []
        for router, lan in (("ra", CLIENT), ("ro", ORIGIN)):
            folder = self.frr_folder(router)
            confs = {"zebra": routing.zebra_config(router),
                     "bfdd": routing.bfdd_config(router, BFD_INTERVAL_MS, BFD_MULTIPLIER),
                     "bgpd": router_bgpd(router, lan[2])}
            if router == "ra":
                confs["staticd"] = ra_staticd()
            steps.append(Step(f"FRR folder of {router}", ["mkdir", "-p", folder]))   # in the lab's folder
            for daemon, text in confs.items():
                path = routing.frr_file(folder, daemon, "conf")
                steps.append(Step(f"write {path}", Call("write", (path, text), path)))
            for daemon in ("zebra", "staticd", "bfdd", "bgpd"):
                if daemon in confs:
                    vty = routing.frr_file(folder, daemon, "vty")
                    steps.append(daemon_step(f"start FRR {daemon} in {n[router]}",
                                             in_netns(n[router], [*routing.daemon_argv(daemon, folder)]),
                                             routing.frr_file(folder, daemon, "pid"),
                                             routing.frr_file(folder, daemon, "out"),
                                             lambda vty=vty: os.path.exists(vty)))
        folder, ready = self.frr_folder("ra"), os.path.join(self.frr_folder("ra"), "anchor_follow.ready")
        steps.append(daemon_step(f"start the IPv6 anchor follower in {n['ra']}",
                                 in_netns(n["ra"], [sys.executable, ANCHOR_FOLLOW, "--anchors",
                                                    str(ANCHORS6), "--shares", str(SHARES), "--table-base",
                                                    str(SHARE_TABLE_BASE), "--ready", ready]),
                                 os.path.join(folder, "anchor_follow.pid"), os.path.join(folder, "anchor_follow.out"),
                                 lambda: os.path.exists(ready)))
        return steps

    def status(self, as_json: bool) -> int:
        if not self.journal.exists:
            print(json.dumps({"lab": self.name, "state": "down"}) if as_json else f"lab {self.name}: down")
            return 0
        present = {node: os.path.exists(f"/run/netns/{self.netns(node)}") for node in self.nodes}
        routers = {}
        for router in ("ra", "ro"):
            out = subprocess.run(routing.vtysh_argv(self.frr_folder(router), "show bgp summary json"),
                                 capture_output=True, text=True)
            try:
                peers = routing.summary_peers(out.stdout)
                routers[router] = {addr: {"state": p.get("state"), "prefixes": p.get("pfxRcd")}
                                   for addr, p in peers.items()}
            except json.JSONDecodeError:
                routers[router] = {"error": (out.stderr or out.stdout).strip()[:200]}
        report = {"lab": self.name, "run_id": self.rid, "hosts": self.hosts,
                  "state": "up" if self.journal.complete and all(present.values()) else "damaged",
                  "namespaces": {node: {"name": self.netns(node), "present": ok} for node, ok in present.items()},
                  "routers": routers}
        if as_json:
            print(json.dumps(report, indent=2))
            return 0
        print(f"lab {self.name} (run {self.rid}, {self.hosts} hosts): {report['state']}")
        for router, peers in routers.items():
            for addr, p in peers.items():
                print(f"  {router} -- {addr}: {p}")
        return 0

    def print_topology(self) -> None:
        p = self.prefix
        print(f"\n  {p}-client {CLIENT4} {CLIENT6} (+ .42 :2000::10 ... one per share) -- {p}-ra (access router) --+")
        for i in range(1, self.hosts + 1):
            print(f"      h{i} -- {p}-sw{i} == {p}-ph{i} [pepctl {p}{i}: graph {p}{i}-pep, FRR AS "
                  f"{HOST_ASN_BASE + i}]")
        print(f"  {p}-origin {ORIGIN4} {ORIGIN6} nginx :80 -- {p}-ro (origin router) -- h1..h{self.hosts}")
        print(f"\n  try: ./scripts/pep-lab exec client -- curl -s --interface {client_address(3)} "
              f"{ORIGIN_URL4}/\n       ./scripts/pep-lab exec ro -- vtysh --vty_socket "
              f"{self.frr_folder('ro')} -c 'show ip bgp'")
