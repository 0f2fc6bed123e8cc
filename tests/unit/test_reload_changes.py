"""What `pepctl reload` may change live in the graphs' sides, and how it names what it may not.

The netns half (tests/netns/test_reload.py, tests/netns/test_radio.py) runs reloads for real."""

from __future__ import annotations

from netns.configs import one_graph, toml_text
from pepctl import config as configmod
from pepctl import congestion, reload

BASE = toml_text(one_graph())


def parse(text: str) -> configmod.Config:
    return configmod.parse(text, "pep.toml", available_cc={"bbr", "cubic"})


def with_access(line: str) -> configmod.Config:
    assert "vlan = 100" in BASE, "test bug: the base config's access VLAN moved"
    return parse(BASE.replace("vlan = 100", "vlan = 100\n" + line, 1))


def test_a_side_s_structural_change_is_named_by_its_field():
    old = parse(BASE)
    got = [(e.field, e.value, e.message) for e in reload.structural_changes(old, with_access("initcwnd = 20"))]
    was = old.graphs[0].access.initcwnd
    assert got == [("graph[0].access.initcwnd", "20", f"was {was}; cannot change live")], got


def test_a_side_s_list_is_named_as_the_config_writes_it():
    old = parse(BASE)
    moved = BASE.replace('"198.18.0.1/24"', '"198.18.0.2/24"', 1)
    assert moved != BASE, "test bug: the base's access address moved"
    got = [(e.field, e.value) for e in reload.structural_changes(old, parse(moved))]
    assert got == [("graph[0].access.addresses", "198.18.0.2/24, 2001:2:0:1::1/64")], got


def test_pep_radio_s_queue_target_changes_live():
    old, new = with_access("queue_target_ms = 30"), with_access("queue_target_ms = 60")
    assert old.graphs[0].access.congestion == congestion.radio_maps.NAME, "test bug: the base is not pep_radio"
    assert reload.structural_changes(old, new) == []
    step = congestion.target_step(new, new.graphs[0], old.graphs[0].access.queue_target_ms)
    assert step.what.endswith(": 60 ms (was 30)"), step.what
    assert step.run.args[2] == 60_000 and step.undo.args[2] == 30_000, (step.run.args, step.undo.args)


def test_a_change_of_congestion_control_is_structural():
    fields = [e.field for e in reload.structural_changes(parse(BASE), with_access('congestion = "bbr"'))]
    assert "graph[0].access.congestion" in fields, fields
