"""[routing]: shares, their owners, the FRR config pepctl renders, and the config's errors."""

from __future__ import annotations

import ipaddress
import os

import pytest

from netns.configs import cluster_host, toml_text
from netns.configs import routing_table as routing_section
from pepctl import config as configmod
from pepctl import drain, plan, reload, routing

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The cluster lab's host ph1 without its [routing], which the tests write (routing_table) or leave out.
BASE = toml_text({k: v for k, v in cluster_host(1, 3, proxy={"interception": "nft"}).items() if k != "routing"})


def routing_table(host: int = 1, hosts: int = 3, **extra) -> str:
    return toml_text({"routing": routing_section(host, hosts, **extra)})


def parse(text: str) -> configmod.Config:
    return configmod.parse(text, "pep.toml", available_cc={"bbr", "cubic"})


def errors(text: str) -> list[str]:
    with pytest.raises(configmod.ConfigError) as e:
        parse(text)
    return [str(x) for x in e.value.errors]


def test_shares_split_the_subscriber_space_and_anchors_follow():
    r = parse(BASE + routing_table()).routing
    prefixes = routing.share_prefixes(r)
    assert [tuple(map(str, p)) for p in prefixes[:2]] == [("198.18.0.0/27", "2001:2:0:1::/67"),
                                                         ("198.18.0.32/27", "2001:2:0:1:2000::/67")]
    assert len(prefixes) == 8 and routing.families(r) == [4, 6]
    assert tuple(map(str, routing.anchors(r, 5))) == ("198.18.96.5", "2001:2:0:196::5")
    assert routing.share_of(r, ipaddress.IPv4Address("198.18.0.74")) == 2
    assert routing.share_of(r, ipaddress.IPv6Address("2001:2:0:1:4fff::1")) == 2
    assert routing.share_of(r, ipaddress.IPv6Address("2001:2:0:1:e000::10")) == 7
    assert routing.share_of(r, ipaddress.IPv4Address("198.19.0.1")) is None
    assert routing.share_of(r, ipaddress.IPv6Address("2001:2:0:2::10")) is None


def test_an_ipv4_only_cluster_renders_no_ipv6():
    """A config of one family (a string, as before IPv6) renders nothing of the other."""
    text = (BASE + routing_table()).replace('subscribers = ["198.18.0.0/24", "2001:2:0:1::/64"]',
                                            'subscribers = "198.18.0.0/24"')
    text = text.replace('anchors = ["198.18.96.0/27", "2001:2:0:196::/64"]', 'anchors = "198.18.96.0/27"')
    r = parse(text).routing
    assert routing.families(r) == [4] and all(len(p) == 1 for p in routing.share_prefixes(r))
    conf = routing.bgpd_config(r, "pep1-ph1")
    assert "ipv6 prefix-list" not in conf and "match ipv6" not in conf, conf
    assert drain.handover_lines(r, "add", 6) == []


def test_every_share_has_two_different_hosts_and_every_host_some_share():
    r = parse(BASE + routing_table()).routing
    pairs = routing.owners(r)
    assert all(p != b and b is not None for p, b in pairs), pairs
    assert {p for p, _ in pairs} == {"ph1", "ph2", "ph3"}, f"a host primary for nothing: {pairs}"


def test_adding_a_host_moves_only_the_shares_it_takes():
    """Rendezvous hashing: a share's primary changes only to the new host."""
    before = routing.owners(parse(BASE + routing_table(hosts=3)).routing)
    after = routing.owners(parse(BASE + routing_table(hosts=4)).routing)
    for k, ((p0, _), (p1, _)) in enumerate(zip(before, after, strict=True)):
        assert p1 in (p0, "ph4"), f"share {k}: primary {p0} became {p1}, not the new host"
    assert any(p1 == "ph4" for p1, _ in after), "the new host took no share"


def test_removing_a_host_moves_only_its_shares():
    before = routing.owners(parse(BASE + routing_table(hosts=3)).routing)
    after = routing.owners(parse(BASE + routing_table(hosts=2)).routing)
    for k, ((p0, b0), (p1, _)) in enumerate(zip(before, after, strict=True)):
        assert p1 == (b0 if p0 == "ph3" else p0), f"share {k}: {p0}/{b0} became {p1}"


def test_assign_pins_a_share():
    r = parse(BASE + routing_table(assign={"0": ["ph3", "ph2"]})).routing
    assert routing.owners(r)[0] == ("ph3", "ph2")


def test_bgpd_config_announces_primary_shares_plainly_and_backup_shares_prepended():
    r = parse(BASE + routing_table()).routing
    text = routing.bgpd_config(r, "pep1-ph1")
    roles = routing.roles(r)
    prefixes = routing.share_prefixes(r)
    assert roles, "ph1 announces nothing"
    for k, role in roles.items():
        v4, v6 = prefixes[k]
        a4, a6 = routing.anchors(r, k)
        assert f"ip prefix-list pep-origin-{role} seq" in text and f"permit {v4}\n" in text
        assert f"ipv6 prefix-list pep-origin-{role} seq" in text and f"permit {v6}\n" in text
        assert f"permit {a4}/32\n" in text and f"permit {a6}/128\n" in text
    for k in set(range(8)) - set(roles):
        for net in prefixes[k]:
            assert f"permit {net}\n" not in text, f"share {k} is not ph1's but its prefix lists permit {net}"
    assert "set as-path prepend 65011 65011 65011" in text
    assert "match ipv6 address prefix-list pep-access-backup" in text
    assert "neighbor 198.18.64.1 bfd profile pep" in text and "neighbor 198.19.64.1 remote-as 65002" in text
    assert "neighbor 2001:2:0:164::1 bfd profile pep" in text
    assert "route-map pep-nothing in" in text, "a host must take no routes from the routers"


def test_each_session_carries_its_own_family():
    """An IPv4 session carries IPv4 prefixes and an IPv6 one IPv6 prefixes: no session is activated
    in the other family (FRR would activate IPv4 on every session by default)."""
    text = routing.bgpd_config(parse(BASE + routing_table()).routing, "pep1-ph1")
    assert " no bgp default ipv4-unicast\n" in text
    v4 = text[text.index(" address-family ipv4 unicast"):text.index(" address-family ipv6 unicast")]
    v6 = text[text.index(" address-family ipv6 unicast"):]
    assert "neighbor 198.18.64.1 activate" in v4 and "neighbor 198.19.64.1 activate" in v4 and "2001:" not in \
        v4.replace("network 2001", ""), v4
    assert "neighbor 2001:2:0:164::1 activate" in v6 and "neighbor 2001:2:0:264::1 activate" in v6, v6
    assert "neighbor 198." not in v6 and "network 198." not in v6, v6


def test_drained_config_announces_nothing():
    r = parse(BASE + routing_table()).routing
    lists = routing.prefix_lists(r, drained=True)
    assert len(lists) == 8 and all(lines == [f"{head} seq 5 deny any"] for head, lines in lists.items()), lists
    assert sum(head.startswith("ipv6 ") for head in lists) == 4


def test_drain_hands_each_share_to_its_other_host():
    r = parse(BASE + routing_table()).routing
    lines = {v: drain.handover_lines(r, "add", v) for v in (4, 6)}
    for k in routing.roles(r):
        other = routing.other_host(r, k)
        assert other is not None and other.name != "ph1"
        table = drain.DRAIN_TABLE_BASE + k
        v4, v6 = routing.share_prefixes(r)[k]
        assert f"route replace 0.0.0.0/0 via {other.address('access', 4)} dev c_in table {table}" in lines[4]
        assert f"route replace {v4} via {other.address('origin', 4)} dev s_in table {table}" in lines[4]
        assert f"route replace ::/0 via {other.address('access', 6)} dev c_in table {table}" in lines[6]
        assert f"route replace {v6} via {other.address('origin', 6)} dev s_in table {table}" in lines[6]
        assert f"rule add pref {drain.DRAIN_PREF} from {v6} iif c_in lookup {table}" in lines[6]
    assert not any("2001:" in line for line in lines[4]) and not any("198." in line for line in lines[6])
    rules = drain.handover_rules(r)
    assert all(x.kind == "client" for x in rules) and len(rules) == 2 * len(routing.roles(r))


def test_bfd_profile():
    assert "detect-multiplier 3" in routing.bfdd_config("h", 100, 3)
    assert "transmit-interval 100" in routing.bfdd_config("h", 100, 3)


def test_defaults():
    r = parse(BASE + routing_table()).routing
    assert r.graph == "g1" and r.bfd_interval_ms == 100 and r.bfd_multiplier == 3
    assert str(r.router_id) == "198.18.64.11"


@pytest.mark.parametrize("change, field, words", [
    (('host = "ph1"', 'host = "ph9"'), "routing.host", "not in routing.hosts"),
    (("shares = 8", "shares = 6"), "routing.shares", "power of 2"),
    (("shares = 8", "shares = 512"), "routing.shares", "power of 2"),
    (('"198.18.96.0/27"', '"198.18.96.0/30"'), "routing.anchors", "every share needs"),
    (('"198.18.96.0/27"', '"198.18.0.0/27"'), "routing.anchors", "overlaps"),
    (('"2001:2:0:196::/64"', '"2001:2:0:1:8000::/66"'), "routing.anchors", "overlaps"),
    ((', "2001:2:0:196::/64"]', ']'), "routing.anchors", "give one IPv6 network"),
    (('subscribers = ["198.18.0.0/24", "2001:2:0:1::/64"]', 'subscribers = ["198.18.0.0/24", "2001:2:0:1::/126"]'),
     "routing.shares", "too few addresses"),
    (('subscribers = ["198.18.0.0/24", ', 'subscribers = ["198.18.0.0/24", "198.18.0.128/25", '),
     "routing.subscribers[1]", "overlaps 198.18.0.0/24"),
    (('subscribers = ["198.18.0.0/24"', 'subscribers = ["198.18.0.0/33"'), "routing.subscribers[0]",
     "not an IPv4 or IPv6 network"),
    (("asn = 65011", "asn = 0"), "routing.asn", "not an AS number"),
    (("asn = 65011", 'asn = 65011\nrouter_id = "2001:2:0:164::11"'), "routing.router_id", "not an IPv4 address"),
    (('address = "198.18.64.1"', 'address = "198.19.64.1"'), "routing.peer[0].address", "not in graph g1's access"),
    (('address = "2001:2:0:164::1"', 'address = "2001:2:0:264::1"'), "routing.peer[1].address",
     "not in graph g1's access"),
    (('side = "origin"', 'side = "inside"'), "routing.peer[2].side", "must be"),
    (('"198.18.64.12"', '"10.0.0.1"'), "routing.hosts[1].access[0]", "not in graph g1's access"),
    (('"2001:2:0:164::12"', '"2001:2:0:164::12", "198.18.64.13"'), "routing.hosts[1].access",
     "one address of each family"),
    ((', "2001:2:0:264::12"]', ']'), "routing.hosts[1].origin", "one address of each family"),
    (('"198.18.64.11"', '"198.18.64.99"'), "routing.hosts[0].access", "this host's entry"),
])
def test_bad_routing_is_named(change, field, words):
    old, new = change
    text = BASE + routing_table()
    assert old in text
    got = errors(text.replace(old, new, 1))
    assert any(f"{field} " in e and words in e for e in got), f"want {field}: {words}; got {got}"


def test_routing_needs_a_router_on_each_side_of_each_family():
    text = BASE + routing_table()
    last = text[:text.rindex("[[routing.peer]]")]
    assert any("no IPv6 origin-side router" in e for e in errors(last)), errors(last)
    first = text.replace('[[routing.peer]]\nside = "access"\naddress = "198.18.64.1"\nasn = 65001\n', "")
    assert any("no IPv4 access-side router" in e for e in errors(first)), errors(first)


def test_reload_takes_a_new_cluster_live_but_not_a_new_address_plan():
    from_three = parse(BASE + routing_table(hosts=3))
    assert reload.structural_changes(from_three, parse(BASE + routing_table(hosts=4))) == []
    moved = reload.structural_changes(from_three, parse(BASE + routing_table(hosts=3).replace("shares = 8",
                                                                                               "shares = 16")))
    assert [e.field for e in moved] == ["routing.shares"], moved
    assert [e.field for e in reload.structural_changes(from_three, parse(BASE))] == ["routing"]


def test_frr_packet_sockets_are_pinned_before_bgpd_starts():
    """bfdd opens an IPv4 packet socket on every device; in a bpf graph's namespace it would make the
    kernel drop the socket bpf_sk_assign gives each new flow (tests/netns/test_interception.py). `up`
    binds it to lo after bfdd starts and before bgpd, which is what brings a router's traffic."""
    cfg = parse(BASE.replace('interception = "nft"', 'interception = "bpf"') + routing_table())
    whats = [s.what for s in plan.routing_steps(cfg)]
    pin = next(i for i, w in enumerate(whats) if "packet sockets" in w)
    assert whats.index(f"start FRR bfdd in {cfg.graph_names(cfg.graphs[0]).netns}") < pin < \
        whats.index(f"start FRR bgpd in {cfg.graph_names(cfg.graphs[0]).netns}"), whats


def test_a_transit_link_subnet_is_on_link():
    """Addresses go in without prefix routes (each route carries its side's congctl): a subnet that
    no prefix covers (the link to a router) gets its own on-link route, or its gateway and the
    other hosts there would be unreachable."""
    cfg = parse(BASE + routing_table())
    lines = plan.route_lines(cfg.graphs[0])
    on_link = "route replace 198.18.64.0/24 dev c_in scope link src 198.18.64.11 proto static congctl pep_radio " \
              "initcwnd 32"
    assert on_link in lines, lines
    assert any(x.startswith("route replace 198.19.64.0/24 dev s_in scope link") for x in lines), lines
    via = "route replace 198.18.0.0/24 via 198.18.64.1 dev c_in proto static congctl pep_radio initcwnd 32"
    assert lines.index(via) > lines.index(on_link), "the gateway's route must come before the route through it"


def test_the_examples_routing_table_loads():
    """etc/pep.example.toml's [routing] (commented out), on the cluster lab's host ph1 graph, which
    has the addresses it names."""
    with open(os.path.join(REPO, "etc", "pep.example.toml")) as f:
        text = f.read()
    block = text[text.index("# [routing]\n"):]
    lines = [line[2:] for line in block.splitlines() if line.startswith("# ") and not line.startswith("# #")]
    r = parse(BASE + "\n".join(lines) + "\n").routing
    assert routing.families(r) == [4, 6] and len(r.peers) == 4 and r.assign == ((0, "ph1", "ph2"),)
