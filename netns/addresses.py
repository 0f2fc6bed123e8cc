"""The lab's address plan, in one place: the lab, its tests and the benchmarks take it from here.

198.18.0.0/15 and 2001:2::/48 are the benchmarking ranges (RFC 2544, RFC 5180); every host lives
in a namespace the lab made, and no traffic leaves the machine.

    access side  198.18.0.0/24  2001:2:0:1::/64   gateway (the graph's c_in) .1 / ::1, client .10 / ::10
    origin side  198.19.0.0/24  2001:2:0:2::/64   gateway (the graph's s_in) .1 / ::1, origin (nginx :80) .10 / ::10
    VLANs        access 100, origin 200

The cluster lab (netns/cluster.py) puts its proxy hosts on a segment per side, behind a router:
access 198.18.64.0/24 and 2001:2:0:164::/64 (router ra .1 and ::1, host I .10+I and ::1I), origin
198.19.64.0/24 and 2001:2:0:264::/64 (router ro, the same); the subscribers 198.18.0.0/24 and
2001:2:0:1::/64 split into 8 shares (a /27 and a /67 each), with anchors in 198.18.96.0/27 and
2001:2:0:196::/64; the client has one address of each family in every share. AS numbers: ra
65001, ro 65002, host I 65010+I.
"""

from __future__ import annotations

import ipaddress

ACCESS_VLAN, ORIGIN_VLAN = 100, 200

ACCESS_NET4, ACCESS_NET6 = "198.18.0.0/24", "2001:2:0:1::/64"
ORIGIN_NET4, ORIGIN_NET6 = "198.19.0.0/24", "2001:2:0:2::/64"
ACCESS_GW4, ACCESS_GW6 = "198.18.0.1", "2001:2:0:1::1"          # the graph's c_in
ORIGIN_GW4, ORIGIN_GW6 = "198.19.0.1", "2001:2:0:2::1"          # the graph's s_in
CLIENT4, CLIENT6 = "198.18.0.10", "2001:2:0:1::10"
ORIGIN4, ORIGIN6 = "198.19.0.10", "2001:2:0:2::10"

# The graph's own addresses, with their subnets' prefix lengths, as a config writes them.
ACCESS_ADDRESSES = [f"{ACCESS_GW4}/24", f"{ACCESS_GW6}/64"]
ORIGIN_ADDRESSES = [f"{ORIGIN_GW4}/24", f"{ORIGIN_GW6}/64"]
# The end hosts' own: (IPv4 address/len, IPv6 address/len, IPv4 gateway, IPv6 gateway).
CLIENT = (f"{CLIENT4}/24", f"{CLIENT6}/64", ACCESS_GW4, ACCESS_GW6)
ORIGIN = (f"{ORIGIN4}/24", f"{ORIGIN6}/64", ORIGIN_GW4, ORIGIN_GW6)

ORIGIN_URL4, ORIGIN_URL6 = f"http://{ORIGIN4}", f"http://[{ORIGIN6}]"

# -- the cluster lab ------------------------------------------------------------------------------
SHARES = 8
SUBSCRIBERS = ipaddress.IPv4Network(ACCESS_NET4)
SUBSCRIBERS6 = ipaddress.IPv6Network(ACCESS_NET6)
ANCHORS = ipaddress.IPv4Network("198.18.96.0/27")
ANCHORS6 = ipaddress.IPv6Network("2001:2:0:196::/64")
ROUTER_ASN = {"ra": 65001, "ro": 65002}
HOST_ASN_BASE = 65010
SEGMENT = {"access": ipaddress.IPv4Network("198.18.64.0/24"), "origin": ipaddress.IPv4Network("198.19.64.0/24")}
SEGMENT6 = {"access": ipaddress.IPv6Network("2001:2:0:164::/64"),
            "origin": ipaddress.IPv6Network("2001:2:0:264::/64")}


def segment(side: str, version: int = 4) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    return (SEGMENT if version == 4 else SEGMENT6)[side]


def router_address(side: str, version: int = 4) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return segment(side, version).network_address + 1


def host_address(side: str, host: int, version: int = 4) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """Host I's address on a router's segment: .10+I, or ::1I (the same digits, in hex)."""
    return segment(side, version).network_address + (10 + host if version == 4 else int(str(10 + host), 16))


def host_name(i: int) -> str:
    return f"ph{i}"


def client_address(share: int, version: int = 4) -> str:
    """The client's address in share k: the share's first address + 10 (hex 10 in IPv6)."""
    net = SUBSCRIBERS if version == 4 else SUBSCRIBERS6
    size = net.num_addresses // SHARES
    return str(net.network_address + size * share + (10 if version == 4 else 0x10))
