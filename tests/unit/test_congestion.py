"""pep_radio in the plan, and what pepctl reads from its statistics, without root or a kernel.

How right is told from wrong: the plan of a config whose access side runs pep_radio must register
it (an in-process, journaled action, undone by a release that every instance journals) after bpffs
is mounted and before any route names it, and set each pep_radio graph's parameters once its
namespace exists; a config without pep_radio has none of that. The epoch rule of "subscribers
active" and the p95 of a map's histogram are computed on made-up statistics whose answer is known
(the quantile as Prometheus's histogram_quantile() interpolates it).
"""

from __future__ import annotations

import json
import os

import pytest

from pepctl import congestion, plan, radio_maps, register, runner
from pepctl.config import parse
from pepctl.hostinfo import HostInfo
from pepctl.names import CONGESTION_DIR, CONGESTION_LOCK, congestion_pins

CC = {"reno", "bbr", "cubic"}
INFO = HostInfo(nic_exists=True, nic_bus=None, numa_node=None, cpus=(0,), cpus_note="test", nofile=20000,
                available_cc=frozenset(CC), proxy_user="pep", proxy_uid=1, proxy_gid=1)
CONFIG = """
[host]
instance = "h2u"
nic = "eth1"
supervisor = "pepctl"
[[graph]]
name = "g1"
[graph.access]
vlan = 100
addresses = ["198.18.0.1/24"]
congestion = "pep_radio"
queue_target_ms = 30
[graph.origin]
vlan = 200
addresses = ["198.19.0.1/24"]
[[graph]]
name = "g2"
[graph.access]
vlan = 101
addresses = ["198.18.1.1/24"]
{g2_access}
[graph.origin]
vlan = 201
addresses = ["198.19.1.1/24"]
"""


BBR = 'congestion = "bbr"'     # g2's access side, where a test does not say otherwise


def steps_of(text: str) -> list[runner.Step]:
    return plan.build(parse(text, "/etc/pep/pep.toml", available_cc=CC), INFO)


def index(steps, what: str) -> int:
    found = [i for i, s in enumerate(steps) if s.what.startswith(what)]
    assert found, f"the plan has no step {what!r}: {[s.what for s in steps]}"
    return found[0]


def test_pep_radio_is_registered_after_bpffs_and_before_any_route():
    steps = steps_of(CONFIG.format(g2_access=BBR))
    order = [index(steps, w) for w in ("register instance", "mount bpffs", "use congestion control pep_radio",
                                       "create 2 graph namespace", "set pep_radio's parameters of graph g1",
                                       "links, addresses and routes of graph g1",
                                       "links, addresses and routes of graph g2")]
    assert order == sorted(order), f"steps out of order: {[steps[i].what for i in order]}"
    assert [s.what for s in steps].count("use congestion control pep_radio") == 1
    assert not [s for s in steps if s.what.startswith("set pep_radio's parameters of graph g2")], \
        "g2 runs bbr: it has no pep_radio parameters"
    g1 = steps[index(steps, "links, addresses and routes of graph g1")].input
    g2 = steps[index(steps, "links, addresses and routes of graph g2")].input
    assert "dev c_in scope link src 198.18.0.1 proto static congctl pep_radio initcwnd 32" in g1, g1
    assert "congctl cubic" in g1 and "congctl pep_radio" not in g2 and "congctl bbr" in g2, g2


def test_the_registration_step_shows_what_it_runs_and_journals_a_shared_release():
    steps = steps_of(CONFIG.format(g2_access=BBR))
    use = steps[index(steps, "use congestion control pep_radio")]
    pins = congestion_pins("pep_radio")
    journal = "/run/pep/h2u.journal"
    assert (use.run.name, use.run.args) == ("congestion_use", ("pep_radio", journal))
    assert (use.undo.name, use.undo.args) == ("congestion_release", ("pep_radio", journal))
    obj, loader = congestion.BUILT["pep_radio"]
    for text in (f"flock {CONGESTION_LOCK}", f"mkdir -p -m 700 {pins}", f"{loader} {obj} {pins}"):
        assert text in use.render(), f"the plan's line for registering pep_radio lacks {text!r}:\n{use.render()}"
    assert "unless another running instance uses pep_radio" in use.undo.show and pins in use.undo.show
    params = steps[index(steps, "set pep_radio's parameters of graph g1")]
    assert params.run.args == (pins, "h2u-g1", 30000), params.run.args
    assert "target_us 30000" in params.render() and "/run/netns/h2u-g1" in params.render()
    assert (params.undo.name, params.undo.args) == ("radio_forget", (pins, "h2u-g1"))
    # Another process (`down`) replays them by name.
    assert {"congestion_use", "congestion_release", "radio_params", "radio_forget"} <= set(runner.ACTIONS)


def test_host_wide_names_carry_the_pep_prefix():
    for path in (CONGESTION_DIR, CONGESTION_LOCK):
        assert os.path.basename(path).startswith("pep"), path
    assert congestion_pins("pep_radio") == os.path.join(CONGESTION_DIR, "pep_radio")
    assert CONGESTION_DIR.startswith("/sys/fs/bpf/"), "pins live on the bpffs `up` mounts"


def test_the_register_names_the_congestion_controls_in_use():
    cfg = parse(CONFIG.format(g2_access=BBR), "/etc/pep/pep.toml", available_cc=CC)
    assert register.register_entry(cfg)["congestion"] == ["bbr", "cubic", "pep_radio"]
    assert congestion.used(cfg) == ["pep_radio"]
    assert [g.name for g in congestion.radio_graphs(cfg)] == ["g1"]


def test_an_instance_whose_release_ran_no_longer_counts_as_a_user(tmp_path, monkeypatch):
    """Two instances use pep_radio. Each one's release takes pep_radio out of its own entry before it
    asks who else uses it: so of two last users going down at once, the second release unregisters
    it, and an instance whose `down` failed after its release (entry and journal kept) does not keep
    it registered for good."""
    monkeypatch.setattr(register, "REGISTER", str(tmp_path / "register"))
    os.mkdir(register.REGISTER)
    journals = {}
    for name in ("a", "b"):
        journals[name] = str(tmp_path / f"{name}.journal")
        open(journals[name], "w").close()
        entry = {"instance": name, "journal": journals[name], "congestion": ["cubic", "pep_radio"]}
        runner.write_file(os.path.join(register.REGISTER, f"{name}.json"), json.dumps(entry))
    assert [e["instance"] for e in register.users_of("pep_radio", besides=journals["a"])] == ["b"]
    register.stop_using("pep_radio", journals["a"])
    assert [e["instance"] for e in register.running_instances()] == ["a", "b"], "the entry itself stays"
    assert [e["instance"] for e in register.users_of("pep_radio")] == ["b"]
    assert register.users_of("pep_radio", besides=journals["b"]) == [], "b's release would keep pep_radio"
    assert [e["instance"] for e in register.users_of("cubic")] == ["a", "b"], "only pep_radio was taken out"
    register.stop_using("pep_radio", journals["a"])   # a second time: nothing to take out
    assert [e["instance"] for e in register.users_of("pep_radio")] == ["b"]


def test_no_pep_radio_no_registration():
    text = CONFIG.format(g2_access=BBR).replace('congestion = "pep_radio"\nqueue_target_ms = 30\n', BBR + "\n")
    steps = steps_of(text)
    assert not [s for s in steps if "pep_radio" in s.what or "pep_radio" in s.render()], \
        [s.what for s in steps if "pep_radio" in s.what]


def test_the_old_key_congctl_gets_a_notice_in_plan_and_up():
    steps = steps_of(CONFIG.format(g2_access='congctl = "bbr"'))
    first = steps[0]
    assert first.run.name == "note" and "graph[1].access.congctl is deprecated: rename it to `congestion`" \
        in first.render(), first.render()
    logged = []
    runner.apply([first], runner.Journal("/nonexistent/journal"), log=logged.append)
    assert logged == [f"  notice: {first.run.args[0]}"], logged


@runner.action("test_notice")
def _notice(text: str) -> str:
    return text


def test_an_action_s_text_is_a_notice_in_up_and_down(tmp_path):
    journal = runner.Journal(str(tmp_path / "j"))
    journal.start({})
    step = runner.Step("shared thing", runner.Call("test_notice", ("made it",), "make"),
                       undo=runner.Call("test_notice", ("kept for others",), "unmake"))
    logged = []
    runner.apply([step], journal, log=logged.append)
    assert logged == ["  shared thing", "  notice: made it"], logged
    logged.clear()
    assert runner.undo_all(journal, log=logged.append) == []
    assert logged == ["  undone: shared thing", "  notice: kept for others"], logged


# -- reading radio_stats ---------------------------------------------------------------------------
def stats(**changes) -> dict:
    st = radio_maps.STATS.zero()
    st.update(changes)
    return st


def test_subscribers_active_are_those_of_the_last_complete_epoch():
    e = radio_maps.EPOCH_US
    now = 1001 * e + 3       # epoch 1001 is under way; 1000 is the last complete one (slot 0)
    st = stats(**{"active[0].epoch": 1000, "active[0].subscribers": 4, "active[0].rate_sum": 4_000_000,
                  "active[1].epoch": 1001, "active[1].subscribers": 1, "active[1].rate_sum": 9})
    assert radio_maps.active(st, now) == (4, 1_000_000.0)
    # Nobody heard in epoch 1000: slot 0 still holds 998's count, which must not show.
    st["active[0].epoch"] = 998
    assert radio_maps.active(st, now) == (0, 0.0)
    assert radio_maps.active(stats(), now) == (0, 0.0)


def test_histogram_is_cumulative_with_inf_last_and_its_quantile_interpolates():
    counts = [0] * radio_maps.QDELAY_BUCKETS
    counts[1], counts[2], counts[-1] = 50, 50, 0      # (5, 10] ms and (10, 20] ms
    cum = radio_maps.buckets(radio_maps.QDELAY_BOUNDS_US, tuple(counts), 1e6)
    assert cum[0] == (0.005, 0) and cum[1] == (0.01, 50) and cum[-1] == (float("inf"), 100), cum
    assert radio_maps.quantile(0.5, cum) == pytest.approx(0.01)
    assert radio_maps.quantile(0.95, cum) == pytest.approx(0.019)          # 90% of the way through (10, 20]
    counts[-1] = 900                                                     # most above the last finite bound
    cum = radio_maps.buckets(radio_maps.QDELAY_BOUNDS_US, tuple(counts), 1e6)
    assert radio_maps.quantile(0.95, cum) == radio_maps.QDELAY_BOUNDS_US[-2] / 1e6
    assert radio_maps.quantile(0.95, radio_maps.buckets(radio_maps.QDELAY_BOUNDS_US,
                                                        (0,) * radio_maps.QDELAY_BUCKETS)) is None
