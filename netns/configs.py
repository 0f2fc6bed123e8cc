"""pepctl configs for the lab and the tests: a dict, made into TOML.

one_graph() is the config of one graph on the lab's address plan (netns/addresses.py); callers
change what they need in the dict (or pass it in), and toml_text() writes it the way people
write the file: [host] first, then each [[graph]] with its [graph.access], [graph.origin] and
[graph.proxy], a blank line before each top-level table. tests/unit/test_config.py counts the
lines of that layout.
"""

from __future__ import annotations

from pepctl.config.model import key_text, toml_value

from .addresses import ACCESS_ADDRESSES, ACCESS_VLAN, ORIGIN_ADDRESSES, ORIGIN_VLAN


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
