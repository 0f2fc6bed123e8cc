"""docs/measured.md and the README's headline figures: made from docs/measured/*.json, never by hand.

How right is told from wrong: bench/measured.py makes both pages again from the JSON files, their
index and the templates, and the committed pages must be exactly that (`./scripts/bench measured`
rewrites them). Every JSON must be cited on the page; and the rules that keep a figure traceable
are each shown to refuse what they exist to refuse: a figure whose section does not name its JSON,
a figure typed by hand, a figure the JSON lacks, a command that disagrees with its JSON, a JSON the
index does not know.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil

import pytest

from bench import measured, responsiveness


@pytest.fixture(scope="module")
def runs() -> measured.Runs:
    return measured.Runs()


def test_pages_are_what_the_json_makes():
    for path, want in measured.outputs().items():
        with open(path) as f:
            have = f.read()
        assert have == want, (f"{os.path.relpath(path, measured.REPO)} is not what docs/measured/ makes: run "
                              "./scripts/bench measured (edit docs/measured/*.md.in, not the page)")


def test_every_json_is_cited(runs):
    with open(measured.PAGE_TEMPLATE) as f:
        cited = set(re.findall(r"\{\{source ([\w.-]+)\}\}", f.read()))
    assert set(runs.data) - cited == set(), "JSON files docs/measured.md never cites"


def test_a_figure_names_its_json_and_command(runs):
    with pytest.raises(measured.MeasuredError, match=r"x\.md:4: .*steering\.json.*no \{\{source steering\}\}"):
        measured.expand(runs, "## A\n{{source steering}}\n## B\nratio {{steering:results[tcp_gbps][ratio]:.2f}}\n",
                        "", "x.md")
    page = measured.expand(runs, "## A\nratio {{steering:results[tcp_gbps][ratio]:.2f}}\n{{source steering}}\n",
                           "measured/", "x.md")
    ratio = runs.data["steering"]["results"]["tcp_gbps"]["ratio"]
    assert f"ratio {ratio:.2f}" in page and "`./scripts/bench steering`" in page, page


def test_a_figure_typed_by_hand_is_refused(runs):
    with pytest.raises(measured.MeasuredError, match="8,033 typed by hand"):
        measured.expand(runs, "## A\n{{source steering}}\nnginx ran at 8,033 tx/s\n", "", "x.md")
    with pytest.raises(measured.MeasuredError, match=r"1\.3 typed by hand"):
        measured.expand(runs, "## A\n{{source steering}}\n1.3x nginx\n", "", "x.md")
    declared = "<!-- constants: 1.3 -->\n## A\n{{source steering}}\n1.3 times nginx, 802.1Q, 50 ms, `0.05`\n"
    assert "1.3 times nginx" in measured.expand(runs, declared, "", "x.md")


def test_a_figure_the_json_lacks_is_refused(runs):
    with pytest.raises(measured.MeasuredError, match="proxy.json has no such figure"):
        measured.expand(runs, "## A\n{{source proxy}}\n{{proxy:medians[nginx-stream][tps]:.0f}}\n", "", "x.md")
    with pytest.raises(measured.MeasuredError, match="no docs/measured/nope.json"):
        measured.expand(runs, "## A\n{{table nope}}\n", "", "x.md")


@pytest.mark.parametrize("command,why", [
    ("./scripts/bench proxy --variants bpf,nft --reps 5", "--variants bpf,nft, but the JSON holds bpf,nft,nginx"),
    ("./scripts/bench proxy --variants bpf,nft,nginx-stream,minrelay,endpoints --reps 3", "--reps 3, but .* 5"),
    ("./scripts/bench proxy-tuning --reps 5", "give the command that wrote proxy-nginx.json"),
    ("./scripts/bench proxy --variants bpf,nft,nginx-stream,minrelay,endpoints --name proxy", "--name proxy"),
])
def test_a_command_must_agree_with_its_json(runs, command, why):
    with pytest.raises(measured.MeasuredError, match=why):
        measured.check_command("proxy-nginx", command, runs.data["proxy-nginx"], "index.toml")


def test_the_index_names_every_json(tmp_path, runs):
    shutil.copy(os.path.join(measured.FOLDER, "steering.json"), tmp_path / "steering.json")
    (tmp_path / "index.toml").write_text("")
    with pytest.raises(measured.MeasuredError, match="no entry for steering.json"):
        measured.Runs(str(tmp_path), str(tmp_path / "index.toml"))
    (tmp_path / "index.toml").write_text('[steering]\ncommand = "./scripts/bench steering"\n[gone]\ncommand = "x"\n')
    with pytest.raises(measured.MeasuredError, match=r"\[gone\] names no JSON"):
        measured.Runs(str(tmp_path), str(tmp_path / "index.toml"))


def test_a_new_json_of_any_shape_makes_a_table(tmp_path):
    """What adding a run takes: the JSON, its index entry, and a section; kind generic for a JSON no
    table knows yet."""
    run = {"benchmark": "cc-compare", "command": "./scripts/bench cc-compare",
           "medians": {"bbr": {"p95_ms": 412.5, "mbps": 16.3}, "pep_radio": {"p95_ms": 180.25, "mbps": 15.9}}}
    (tmp_path / "cc.json").write_text(json.dumps(run))
    (tmp_path / "index.toml").write_text('[cc]\ncommand = "./scripts/bench cc-compare --reps 3"\nkind = "generic"\n')
    runs = measured.Runs(str(tmp_path), str(tmp_path / "index.toml"))
    template = "## CC\n{{table cc medians}}\n\n{{source cc}}\np95 {{cc:medians[pep_radio][p95_ms]:.0f}} ms\n"
    page = measured.expand(runs, template, "measured/", "x.md")
    assert "| pep_radio | 180.25 | 15.90 |" in page and "p95 180 ms" in page and "--reps 3" in page, page


def test_a_run_of_todays_responsiveness_makes_its_table(tmp_path):
    """bench responsiveness now runs transports side by side (pep_radio, bbr, e2e, idle): a run of
    it renders with the bench's own table. The run here is made by the bench's own summary
    functions from made-up samples, so it has the shape a real run writes."""
    def sample(bulk, p50, page):
        return {"bulk_mbps": bulk, "page_s": page, "small_failed": 0,
                "small_series": [[i * 0.2, (p50 + i) / 1000] for i in range(20)]}
    samples = {"idle": [sample(0, 60, 0)], "pep_radio": [sample(15.5, 90, 3.1)], "bbr": [sample(16.0, 400, 4.2)],
               "e2e": [sample(17.0, 450, 5.9)]}
    med = {m: responsiveness.summarize(s) for m, s in samples.items()}
    profile = {"profile": "lte-trace", "seconds": 20, "offered_mbps": 23.6, "samples": samples, "medians": med,
               "verdicts": responsiveness.verdicts("lte-trace", med, 23.6)}
    run = {"benchmark": "cc", "command": "./scripts/bench responsiveness --name cc", "reps": 1,
           "transports": ["pep_radio", "bbr", "e2e"], "profiles": [profile]}
    (tmp_path / "cc.json").write_text(json.dumps(run))
    (tmp_path / "index.toml").write_text('[cc]\ncommand = "./scripts/bench responsiveness --name cc"\n'
                                         'kind = "responsiveness"\n')
    runs = measured.Runs(str(tmp_path), str(tmp_path / "index.toml"))
    page = measured.expand(runs, "## CC\n{{table cc}}\n{{source cc}}\npage {{cc:profile[lte-trace][medians][pep_radio]"
                           "[page_s]:.1f}} s\n", "measured/", "x.md")
    rows = [line for line in page.splitlines() if line.startswith("| lte-trace |")]
    assert [r.split(" | ")[1] for r in rows] == ["idle", "pep_radio", "bbr", "e2e"], page
    assert "page 3.1 s" in page, page


def test_responsiveness_without_e2e_leaves_its_bars_unjudged():
    """`bench responsiveness --transports pep_radio` (a quick look at one transport): the bars that
    compare with end-to-end CUBIC are not judged, and the run still summarizes (it raised KeyError)."""
    def sample(bulk, p50):
        return {"bulk_mbps": bulk, "page_s": 1.0, "small_failed": 0,
                "small_series": [[i * 0.2, (p50 + i) / 1000] for i in range(20)]}
    med = {m: responsiveness.summarize([s]) for m, s in {"idle": sample(0, 60), "pep_radio": sample(15, 90)}.items()}
    got = responsiveness.verdicts("lte-trace", med, 23.6)["pep_radio"]
    assert got["p95_within_bar"] is True and got["goodput_bar"] is None and got["meets_all"] is None, got
    assert responsiveness.bars_text(got) == "yes/-/-"
    assert responsiveness.favoured([{"verdicts": {"pep_radio": got}}], ["pep_radio"]) == "pep_radio"


def test_a_page_that_did_not_load_counts_as_the_slowest():
    """One of end-to-end's five pages did not load (NaN): its median is the third of the others and
    the failure, not NaN, and a transport whose pages all loaded faster is not worse than it (with
    NaN, every comparison failed). Pages loaded by none: NaN (the idle floor's)."""
    def sample(page):
        return {"bulk_mbps": 3.0, "page_s": page, "small_failed": 0,
                "small_series": [[i * 0.2, (100 + i) / 1000] for i in range(20)]}
    runs = {"idle": [sample(float("nan"))] * 5, "pep_radio": [sample(p) for p in (8.8, 8.5, 9.9, 8.7, 8.6)],
            "e2e": [sample(p) for p in (11.1, 9.9, float("nan"), 11.9, 30.1)]}
    med = {m: responsiveness.summarize(s) for m, s in runs.items()}
    assert med["e2e"]["page_s"] == 11.9 and math.isnan(med["idle"]["page_s"]), med
    assert responsiveness.verdicts("drive-trace", med, 6.9)["pep_radio"]["never_worse_than_e2e"] is True
    assert responsiveness.page_median([float("nan"), float("nan"), 5.0]) == math.inf


@pytest.mark.parametrize("profiles, named", [("lte-trace,nope", "'nope'"),
                                             ("trace:/nonexistent/rec", "/nonexistent/rec.down")])
def test_responsiveness_refuses_an_unknown_profile_before_any_lab(profiles, named, capsys):
    """A profile that is neither in linkem/profiles.toml nor a recording that exists is refused at
    once, naming it (and no lab comes up: main exits in argument parsing, before labs())."""
    with pytest.raises(SystemExit) as e:
        responsiveness.main(["--profiles", profiles])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--profiles" in err and named in err, err
