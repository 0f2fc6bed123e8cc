"""pepctl configs for the lab and the tests: a dict, made into TOML.

one_graph() is the config of one graph on the lab's address plan (netns/addresses.py); callers
change what they need in the dict (or pass it in), and toml_text() writes it the way people
write the file: [host] first, then each [[graph]] with its [graph.access], [graph.origin] and
[graph.proxy], a blank line before each top-level table. tests/unit/test_config.py counts the
lines of that layout.
"""

from __future__ import annotations

from pepctl.config.model import key_text, toml_value

from .addresses import (
    ACCESS_ADDRESSES,
    ACCESS_VLAN,
    ANCHORS,
    ANCHORS6,
    HOST_ASN_BASE,
    ORIGIN_ADDRESSES,
    ORIGIN_VLAN,
    ROUTER_ASN,
    SHARES,
    SUBSCRIBERS,
    SUBSCRIBERS6,
    host_address,
    host_name,
    router_address,
    segment,
)


def one_graph(instance: str = "pep1", nic: str = "eth1", *, host: dict | None = None, access: dict | None = None,
              origin: dict | None = None, proxy: dict | None = None, name: str = "g1", **graph) -> dict:
    """A config of one graph, VLANs 100 and 200, the gateways' addresses of the lab's two subnets.
    host, access, origin: keys added to (or replacing) those tables; proxy: the [graph.proxy] table;
    graph: more tables of the graph ([graph.bypass], [graph.experiment])."""
    g = {"name": name,
         "access": {"vlan": ACCESS_VLAN, "addresses": list(ACCESS_ADDRESSES), **(access or {})},
         "origin": {"vlan": ORIGIN_VLAN, "addresses": list(ORIGIN_ADDRESSES), **(origin or {})}}
    if proxy is not None:
        g["proxy"] = proxy
    return {"host": {"instance": instance, "nic": nic, **(host or {})}, "graph": [{**g, **graph}]}


def second_graph(name: str = "g2") -> dict:
    """A second graph beside one_graph()'s: VLANs 101 and 201, the next /24 of each side."""
    return {"name": name, "access": {"vlan": ACCESS_VLAN + 1, "addresses": ["198.18.1.1/24"]},
            "origin": {"vlan": ORIGIN_VLAN + 1, "addresses": ["198.19.1.1/24"]}}


def routing_table(i: int, hosts: int, **extra) -> dict:
    """[routing] of the cluster lab's host I among hosts 1..hosts (netns/addresses.py), IPv4 and
    IPv6; extra: more keys (bfd, assign)."""
    members = [{"name": host_name(h), **{side: [str(host_address(side, h, v)) for v in (4, 6)]
                                         for side in ("access", "origin")}}
               for h in range(1, hosts + 1)]
    peers = [{"side": side, "address": str(router_address(side, v)), "asn": ROUTER_ASN[router]}
             for side, router in (("access", "ra"), ("origin", "ro")) for v in (4, 6)]
    return {"asn": HOST_ASN_BASE + i, "host": host_name(i), "subscribers": [str(SUBSCRIBERS), str(SUBSCRIBERS6)],
            "shares": SHARES, "anchors": [str(ANCHORS), str(ANCHORS6)], "hosts": members, **extra, "peer": peers}


def cluster_host(i: int, hosts: int, *, congestion: str | None = None, routing: dict | None = None, **kw) -> dict:
    """The cluster lab's host I: one graph on the routers' segments (its subscribers behind ra, the
    origin behind ro), IPv4 and IPv6, and [routing]. kw: one_graph's (instance, nic, host, proxy,
    name...)."""
    def side(name: str, prefixes: list[str]) -> dict:
        return {"addresses": [f"{host_address(name, i, v)}/{segment(name, v).prefixlen}" for v in (4, 6)],
                "prefixes": prefixes, "gateways": [str(router_address(name, v)) for v in (4, 6)]}
    access = side("access", [str(SUBSCRIBERS), str(SUBSCRIBERS6)])
    if congestion:
        access["congestion"] = congestion
    origin = side("origin", ["0.0.0.0/0", "::/0"])
    return {**one_graph(access=access, origin=origin, **kw), "routing": routing_table(i, hosts, **(routing or {}))}


def toml_text(doc: dict) -> str:
    """doc as TOML: a table's plain keys, then its tables ([name]) and arrays of tables ([[name]])."""
    lines: list[str] = []

    def table(d: dict, prefix: str) -> None:
        for k, v in d.items():
            if not _is_table(v) and not _is_tables(v):
                lines.append(f"{key_text(k)} = {toml_value(v)}")
        for k, v in d.items():
            name = f"{prefix}.{key_text(k)}" if prefix else key_text(k)
            for item, head in ([(v, f"[{name}]")] if _is_table(v) else
                               [(x, f"[[{name}]]") for x in v] if _is_tables(v) else []):
                if not prefix and lines:
                    lines.append("")
                lines.append(head)
                table(item, name)

    table(doc, "")
    return "\n".join(lines) + "\n"


def _is_table(v) -> bool:
    return isinstance(v, dict)


def _is_tables(v) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)
