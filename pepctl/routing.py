"""Several proxy hosts behind routers: who owns which subscribers, and the FRR config that says so.

A split-TCP proxy must see both directions of a flow: the host that holds the client's socket
must also get the server's answers. Routing keeps it so, with no protocol of our own:

  - the subscriber space (routing.subscribers) is split into `shares` equal prefixes;
  - each share has a primary host and a backup: routing.assign, or else a stable hash
    (rendezvous: every host scores every share, the two best scores win), so adding a host moves
    only the shares it now wins, and removing one moves only its own;
  - each host announces over BGP, for every share it is primary or backup of:
      toward the origin-side router: the share's prefix (that router routes by destination,
        and the answers are addressed to the subscriber);
      toward the access-side router: the share's anchor, one /32 of routing.anchors (that router
        sends a share's traffic, chosen by its source, toward its anchor: a route per share in a
        table of its own, resolved through BGP);
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
from dataclasses import dataclass

BACKUP_PREPEND = 3       # AS path prepends on backup announcements: longer than any primary's path
FRR_DAEMONS = ("zebra", "bfdd", "bgpd")


@dataclass(frozen=True)
class Peer:
    side: str                              # "access" | "origin": the graph side the router is on
    address: ipaddress.IPv4Address
    asn: int


@dataclass(frozen=True)
class Member:
    """A proxy host of the cluster: its name and its graph's addresses toward the two routers (a
    draining host sends the new flows of its shares to their other host there)."""
    name: str
    access: ipaddress.IPv4Address
    origin: ipaddress.IPv4Address


@dataclass(frozen=True)
class Routing:
    graph: str                             # the graph whose namespace runs FRR: its c_in / s_in face the routers
    asn: int
    router_id: ipaddress.IPv4Address
    host: str                              # this host's name, one of hosts
    hosts: tuple[Member, ...]              # every proxy host of the cluster
    subscribers: ipaddress.IPv4Network     # the space split into shares
    shares: int                            # a power of 2
    anchors: ipaddress.IPv4Network         # share k's anchor: the k-th address of it
    peers: tuple[Peer, ...]
    bfd_interval_ms: int
    bfd_multiplier: int
    assign: tuple[tuple[int, str, str], ...] = ()   # (share, primary, backup) given by the config


def share_prefixes(r: Routing) -> list[ipaddress.IPv4Network]:
    bits = (r.shares - 1).bit_length()
    return list(r.subscribers.subnets(prefixlen_diff=bits))


def anchor(r: Routing, share: int) -> ipaddress.IPv4Address:
    return anchor_of(r.anchors, share)


def anchor_of(anchors: ipaddress.IPv4Network, share: int) -> ipaddress.IPv4Address:
    return anchors.network_address + share


def share_of(r: Routing, address: ipaddress.IPv4Address) -> int | None:
    """The share an address falls in, None outside the subscriber space."""
    if address not in r.subscribers:
        return None
    bits = (r.shares - 1).bit_length()
    return (int(address) - int(r.subscribers.network_address)) >> (32 - r.subscribers.prefixlen - bits)


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


def _prefix_list(name: str, nets: list) -> list[str]:
    if not nets:
        return [f"ip prefix-list {name} seq 5 deny any"]
    return [f"ip prefix-list {name} seq {5 * (i + 1)} permit {net}" for i, net in enumerate(nets)]


def announced(r: Routing, drained: bool = False) -> dict[str, dict[str, list]]:
    """side -> role -> the networks announced to that side's routers."""
    mine = {} if drained else roles(r)
    prefixes = share_prefixes(r)
    return {side: {role: [prefixes[k] if side == "origin" else ipaddress.ip_network(f"{anchor(r, k)}/32")
                          for k, got in sorted(mine.items()) if got == role]
                   for role in ("primary", "backup")}
            for side in ("access", "origin")}


def prefix_lists(r: Routing, drained: bool = False) -> dict[str, list[str]]:
    """The prefix lists that say what this host announces: pep-SIDE-ROLE -> its lines."""
    routes = announced(r, drained)
    return {f"pep-{side}-{role}": _prefix_list(f"pep-{side}-{role}", routes[side][role])
            for side in ("access", "origin") for role in ("primary", "backup")}


def bgpd_config(r: Routing, hostname: str, drained: bool = False) -> str:
    """bgpd's config: sessions to the routers (BFD on each), this host's shares out, nothing in.
    drained: every announcement withdrawn (the prefix lists permit nothing)."""
    lines = ["frr defaults datacenter", f"hostname {hostname}", "!"]
    for pl in prefix_lists(r, drained).values():
        lines += pl
    for side in ("access", "origin"):
        lines += [f"route-map pep-to-{side} permit 10", f" match ip address prefix-list pep-{side}-primary",
                  f"route-map pep-to-{side} permit 20", f" match ip address prefix-list pep-{side}-backup",
                  f" set as-path prepend {' '.join([str(r.asn)] * BACKUP_PREPEND)}",
                  f"route-map pep-to-{side} deny 100"]
    lines += ["route-map pep-nothing deny 10", "!",
              f"router bgp {r.asn}", f" bgp router-id {r.router_id}",
              # Announcements are exactly the prefix lists above: no best-path needed in a RIB.
              " no bgp network import-check", " no bgp ebgp-requires-policy"]
    for p in r.peers:
        lines += [f" neighbor {p.address} remote-as {p.asn}", f" neighbor {p.address} bfd",
                  f" neighbor {p.address} bfd profile pep", f" neighbor {p.address} description {p.side} router"]
    # Every share is a network of every host; the prefix lists choose what goes out, so a change of
    # owners (a host added, a drain) is a change of prefix lists only.
    lines.append(" address-family ipv4 unicast")
    for k, net in enumerate(share_prefixes(r)):
        lines += [f"  network {net}", f"  network {anchor(r, k)}/32"]
    for p in r.peers:
        lines += [f"  neighbor {p.address} route-map pep-nothing in",
                  f"  neighbor {p.address} route-map pep-to-{p.side} out"]
    lines += [" exit-address-family", "!"]
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


def vtysh_argv(folder: str, *commands: str) -> list[str]:
    return ["vtysh", "--vty_socket", folder, *[a for c in commands for a in ("-c", c)]]
