"""Several proxy hosts behind routers: who owns which subscribers, and the FRR config that says so.

A split-TCP proxy must see both directions of a flow: the host that holds the client's socket
must also get the server's answers. Routing keeps it so, with no protocol of our own:

  - the subscriber space (routing.subscribers, IPv4 and IPv6 networks) is split into `shares`:
    share k is the k-th of `shares` equal prefixes of each network;
  - each share has a primary host and a backup: routing.assign, or else a stable hash
    (rendezvous: every host scores every share, the two best scores win), so adding a host moves
    only the shares it now wins, and removing one moves only its own;
  - each host announces over BGP, for every share it is primary or backup of:
      toward the origin-side router: the share's prefixes (that router routes by destination,
        and the answers are addressed to the subscriber);
      toward the access-side router: the share's anchors, a /32 (/128) of routing.anchors per
        family (that router sends a share's traffic, chosen by its source, toward its anchor: a
        route per share and family in a table of its own, resolved through BGP);
    each family over the sessions of its own (an IPv4 and an IPv6 session to each router);
    primary shares plainly, backup shares with the host's AS prepended 3 times, so both routers
    pick the same host for a share, and the backup as soon as the primary is gone;
  - BFD on every session: a dead host's routes go within a second (detect-multiplier x interval).

`pepctl drain` withdraws every announcement: the shares move to their other host.

The FRR config is rendered here from pepctl's own config (one source of truth); `pepctl plan`
shows it and `pepctl up` runs zebra, bfdd and bgpd with it in the graph's namespace.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
from dataclasses import dataclass

BACKUP_PREPEND = 3       # AS path prepends on backup announcements: longer than any primary's path
FRR_DAEMONS = ("zebra", "bfdd", "bgpd")
Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
# FRR's words for a family: its prefix lists, its address family in bgpd.
PREFIX_LIST = {4: "ip prefix-list", 6: "ipv6 prefix-list"}
MATCH = {4: "match ip address prefix-list", 6: "match ipv6 address prefix-list"}
AFI = {4: "ipv4 unicast", 6: "ipv6 unicast"}


@dataclass(frozen=True)
class Peer:
    side: str                              # "access" | "origin": the graph side the router is on
    address: Address                       # its family is the family of the prefixes the session carries
    asn: int


@dataclass(frozen=True)
class Member:
    """A proxy host of the cluster: its name and its graph's addresses toward the two routers, one
    of each family the subscribers have (a draining host sends the new flows of its shares to
    their other host there)."""
    name: str
    access: tuple[Address, ...]
    origin: tuple[Address, ...]

    def address(self, side: str, version: int) -> Address:
        return next(a for a in (self.access if side == "access" else self.origin) if a.version == version)


@dataclass(frozen=True)
class Routing:
    graph: str                             # the graph whose namespace runs FRR: its c_in / s_in face the routers
    asn: int
    router_id: ipaddress.IPv4Address
    host: str                              # this host's name, one of hosts
    hosts: tuple[Member, ...]              # every proxy host of the cluster
    subscribers: tuple[Network, ...]       # the spaces each split into shares, IPv4 and IPv6
    shares: int                            # a power of 2
    anchors: tuple[Network, ...]           # one per family: share k's anchor is the k-th address of it
    peers: tuple[Peer, ...]
    bfd_interval_ms: int
    bfd_multiplier: int
    assign: tuple[tuple[int, str, str], ...] = ()   # (share, primary, backup) given by the config


def families(r: Routing) -> list[int]:
    """The IP versions of the subscriber space, 4 first."""
    return sorted({net.version for net in r.subscribers})


def share_prefixes(r: Routing) -> list[tuple[Network, ...]]:
    """share k -> its prefixes: the k-th of the `shares` equal parts of each subscriber network."""
    bits = (r.shares - 1).bit_length()
    parts = [list(net.subnets(prefixlen_diff=bits)) for net in r.subscribers]
    return [tuple(p[k] for p in parts) for k in range(r.shares)]


def anchors(r: Routing, share: int) -> tuple[Address, ...]:
    """Share k's anchors, one per family."""
    return tuple(anchor_of(net, share) for net in r.anchors)


def anchor_of(anchors: Network, share: int) -> Address:
    return anchors.network_address + share


def host_route(address: Address) -> Network:
    """An anchor as the route announced: a /32 or a /128."""
    return ipaddress.ip_network(address)


def share_of(r: Routing, address: Address) -> int | None:
    """The share an address falls in, None outside the subscriber space."""
    net = next((n for n in r.subscribers if n.version == address.version and address in n), None)
    if net is None:
        return None
    bits = (r.shares - 1).bit_length()
    return (int(address) - int(net.network_address)) >> (net.max_prefixlen - net.prefixlen - bits)


def score(share: int, host: str) -> int:
    return int.from_bytes(hashlib.sha256(f"pep-share/{share}/{host}".encode()).digest()[:8], "big")


def owners(r: Routing) -> list[tuple[str, str | None]]:
    """(primary, backup) of every share: the config's assign, else the two best scores."""
    given = {share: (primary, backup) for share, primary, backup in r.assign}
    out = []
    for k in range(r.shares):
        if k in given:
            out.append(given[k])
            continue
        ranked = sorted((m.name for m in r.hosts), key=lambda h: score(k, h), reverse=True)
        out.append((ranked[0], ranked[1] if len(ranked) > 1 else None))
    return out


def roles(r: Routing, host: str | None = None) -> dict[int, str]:
    """share -> "primary" | "backup" for the shares a host (default this one) announces."""
    host = host or r.host
    out = {}
    for k, (primary, backup) in enumerate(owners(r)):
        if primary == host:
            out[k] = "primary"
        elif backup == host:
            out[k] = "backup"
    return out


def member(r: Routing, name: str) -> Member:
    return next(m for m in r.hosts if m.name == name)


def other_host(r: Routing, share: int) -> Member | None:
    """Where this host sends a share's new flows while it drains: the share's other host."""
    primary, backup = owners(r)[share]
    other = backup if primary == r.host else primary
    return member(r, other) if other and other != r.host else None


def announced(r: Routing, drained: bool = False) -> dict[str, dict[str, list[Network]]]:
    """side -> role -> the networks announced to that side's routers, both families."""
    mine = {} if drained else roles(r)
    prefixes = share_prefixes(r)
    return {side: {role: [net for k, got in sorted(mine.items()) if got == role
                          for net in (prefixes[k] if side == "origin" else map(host_route, anchors(r, k)))]
                   for role in ("primary", "backup")}
            for side in ("access", "origin")}


def prefix_lists(r: Routing, drained: bool = False) -> dict[str, list[str]]:
    """The prefix lists that say what this host announces, one per side, role and family of the
    subscribers: "ip prefix-list pep-SIDE-ROLE" (or "ipv6 ...") -> its lines."""
    routes = announced(r, drained)
    out = {}
    for side in ("access", "origin"):
        for role in ("primary", "backup"):
            for v in families(r):
                head = f"{PREFIX_LIST[v]} pep-{side}-{role}"
                nets = [n for n in routes[side][role] if n.version == v]
                out[head] = [f"{head} seq {5 * (i + 1)} permit {net}" for i, net in enumerate(nets)] or \
                    [f"{head} seq 5 deny any"]
    return out


def bgpd_config(r: Routing, hostname: str, drained: bool = False) -> str:
    """bgpd's config: sessions to the routers (BFD on each), this host's shares out, nothing in.
    A session carries the family of its peer's address (an IPv4 session IPv4 prefixes, an IPv6 one
    IPv6 prefixes), as two sessions per router are usual for dual stack. drained: every
    announcement withdrawn (the prefix lists permit nothing)."""
    lines = ["frr defaults datacenter", f"hostname {hostname}", "!"]
    for pl in prefix_lists(r, drained).values():
        lines += pl
    for side in ("access", "origin"):
        # A match of one family's prefix list never matches a route of the other family.
        for i, v in enumerate(families(r)):
            lines += [f"route-map pep-to-{side} permit {10 + 20 * i}", f" {MATCH[v]} pep-{side}-primary",
                      f"route-map pep-to-{side} permit {20 + 20 * i}", f" {MATCH[v]} pep-{side}-backup",
                      f" set as-path prepend {' '.join([str(r.asn)] * BACKUP_PREPEND)}"]
        lines.append(f"route-map pep-to-{side} deny 100")
    lines += ["route-map pep-nothing deny 10", "!",
              f"router bgp {r.asn}", f" bgp router-id {r.router_id}",
              # Announcements are exactly the prefix lists above: no best-path needed in a RIB.
              " no bgp network import-check", " no bgp ebgp-requires-policy",
              # Each session carries its own family only (activated below).
              " no bgp default ipv4-unicast"]
    for p in r.peers:
        lines += [f" neighbor {p.address} remote-as {p.asn}", f" neighbor {p.address} bfd",
                  f" neighbor {p.address} bfd profile pep", f" neighbor {p.address} description {p.side} router"]
    # Every share is a network of every host; the prefix lists choose what goes out, so a change of
    # owners (a host added, a drain) is a change of prefix lists only.
    prefixes = share_prefixes(r)
    for v in sorted(set(families(r)) | {p.address.version for p in r.peers}):
        lines.append(f" address-family {AFI[v]}")
        for k in range(r.shares):
            lines += [f"  network {net}" for net in prefixes[k] if net.version == v]
            lines += [f"  network {host_route(a)}" for a in anchors(r, k) if a.version == v]
        for p in (p for p in r.peers if p.address.version == v):
            lines += [f"  neighbor {p.address} activate", f"  neighbor {p.address} route-map pep-nothing in",
                      f"  neighbor {p.address} route-map pep-to-{p.side} out"]
        lines += [" exit-address-family"]
    lines.append("!")
    return "\n".join(lines) + "\n"


def bfdd_config(hostname: str, interval_ms: int, multiplier: int) -> str:
    """bfdd's profile "pep", which every BGP session names: a peer is gone after multiplier missed
    packets, interval_ms apart."""
    return "\n".join([f"hostname {hostname}", "bfd", " profile pep", f"  detect-multiplier {multiplier}",
                      f"  receive-interval {interval_ms}", f"  transmit-interval {interval_ms}", " exit", "exit", ""])


def zebra_config(hostname: str) -> str:
    return f"hostname {hostname}\n"


def hostname(instance: str, r: Routing) -> str:
    """What FRR calls itself on this host: the instance's name and the cluster's name of the host."""
    return f"{instance}-{r.host}"


def configs(r: Routing, hostname: str, drained: bool = False) -> dict[str, str]:
    """daemon -> its config file's text."""
    return {"zebra": zebra_config(hostname), "bfdd": bfdd_config(hostname, r.bfd_interval_ms, r.bfd_multiplier),
            "bgpd": bgpd_config(r, hostname, drained)}


# -- FRR's daemons: one folder holds each one's config, pid, log and vty socket -------------------

FRR_BIN = "/usr/lib/frr"


def frr_file(folder: str, daemon: str, kind: str) -> str:
    """kind: "conf"; "pid" (pepctl's record: it stops the daemon by it) and "frr.pid" (the daemon's
    own); "out" (its output) and "log" (its log); "vty" (the socket vtysh talks to)."""
    return f"{folder}/{daemon}.{kind}"


def daemon_argv(daemon: str, folder: str) -> list[str]:
    """One FRR daemon, in the foreground, everything it makes inside folder. As root (its files are
    in a folder of ours, which the frr user cannot enter), with the group frrvty: FRR refuses a user
    outside its vty group, and the group given here counts as the user's."""
    argv = [f"{FRR_BIN}/{daemon}", "-f", frr_file(folder, daemon, "conf"), "-i", frr_file(folder, daemon, "frr.pid"),
            "-z", f"{folder}/zserv.api", "--vty_socket", folder, "-u", "root", "-g", "frrvty", "-P", "0",
            "--log", f"file:{frr_file(folder, daemon, 'log')}"]
    if daemon == "bfdd":
        argv += ["--bfdctl", f"{folder}/bfdd.sock"]
    return argv


FRR_FILES = ["*.conf", "*.pid", "*.out", "*.log", "*.vty", "zserv.api", "bfdd.sock", "*.tmp", "drained"]


def summary_peers(text: str) -> dict[str, dict]:
    """The sessions in `show bgp summary json`, by peer address: it has a table per address family
    ("ipv4Unicast", "ipv6Unicast"), and a session carries one. ValueError if it is not JSON."""
    return {addr: p for family in json.loads(text or "{}").values() if isinstance(family, dict)
            for addr, p in family.get("peers", {}).items()}


def vtysh_argv(folder: str, *commands: str) -> list[str]:
    return ["vtysh", "--vty_socket", folder, *[a for c in commands for a in ("-c", c)]]
