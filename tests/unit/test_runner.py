"""pepctl.runner's rollback: what `up` made is undone to the end, whatever signals come meanwhile, and
what could not be undone stays in the journal for `down`.

Real commands (true, false, touch, kill), no root: the steps make files in a temporary folder.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from pepctl import runner


@pytest.fixture
def sigterm_unwinds():
    """SIGTERM raises KeyboardInterrupt here, as in pepctl and pep-lab (runner.stop_on_sigterm)."""
    before = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    runner.stop_on_sigterm()
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)
        runner._told_to_stop = None     # (this test process goes on: its next apply() is not stopped)


def journal_in(tmp_path) -> runner.Journal:
    journal = runner.Journal(str(tmp_path / "journal"))
    journal.start({})
    return journal


def test_a_rollback_runs_to_its_end_through_sigterm_and_ctrl_c(tmp_path, sigterm_unwinds):
    # The second step's undo signals this process, as `kill` of a process group does while the rollback
    # runs (and then the benchmark holding the lab sends its own SIGTERM): the undo after it must still
    # run, and the step's failure is what the caller sees.
    made = tmp_path / "made"
    steps = [runner.Step("make a file", ["touch", str(made)], undo=["rm", str(made)]),
             runner.Step("signal the rollback", ["true"],
                         undo=["sh", "-c", f"kill -TERM {os.getpid()}; kill -INT {os.getpid()}; sleep 0.2"]),
             runner.Step("fail", ["false"])]
    journal = journal_in(tmp_path)
    logged: list[str] = []
    sigint_before = signal.getsignal(signal.SIGINT)   # (SIG_IGN in a job started in the background)
    try:
        runner.apply(steps, journal, log=logged.append)
        got: BaseException | None = None
    except (runner.StepError, KeyboardInterrupt) as e:   # (a KeyboardInterrupt let out would end the run)
        got = e
    assert isinstance(got, runner.StepError) and "fail" in str(got), \
        f"expected the failed step's error, got {got!r}: the rollback was cut short ({logged})"
    assert not made.exists(), f"expected the first step undone after the signals, got {logged}"
    assert journal.undo == [] and runner.Journal(journal.path).undo == [], runner.Journal(journal.path).undo
    assert signal.getsignal(signal.SIGTERM) is runner._interrupt, "the SIGTERM handler was not put back"
    assert signal.getsignal(signal.SIGINT) == sigint_before, "the SIGINT handler was not put back"


def test_an_interrupted_up_rolls_back_and_stays_interrupted(tmp_path, sigterm_unwinds):
    made = tmp_path / "made"
    steps = [runner.Step("make a file", ["touch", str(made)], undo=["rm", str(made)]),
             runner.Step("stopped here", ["sh", "-c", f"kill -TERM {os.getpid()}; exec sleep 5"])]
    with pytest.raises(KeyboardInterrupt):
        runner.apply(steps, journal_in(tmp_path), log=lambda m: None)
    assert not made.exists(), "the step before the interrupt was not undone"
    # Told once, the process is on its way out: a second SIGTERM does not interrupt what is left of it
    # (the `with` exits of a benchmark holding labs).
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.05)


class SignalledInItsDel:
    """Sends this process SIGTERM as it is dropped, so the handler's KeyboardInterrupt is raised in
    __del__, where Python only prints it: as a SIGTERM that lands while run() drops its Popen."""

    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.01)


SWALLOWED = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")   # (what __del__ printed)


@SWALLOWED
def test_a_stop_swallowed_in_a_del_still_stops_the_up(tmp_path, sigterm_unwinds, monkeypatch):
    made, after = tmp_path / "made", tmp_path / "after"
    monkeypatch.setitem(runner.ACTIONS, "swallowed_stop", lambda: SignalledInItsDel() and None)
    steps = [runner.Step("make a file", ["touch", str(made)], undo=["rm", str(made)]),
             runner.Step("told to stop in a __del__", runner.Call("swallowed_stop", (), "")),
             runner.Step("a step after the stop", ["touch", str(after)])]
    with pytest.raises(KeyboardInterrupt):
        runner.apply(steps, journal_in(tmp_path), log=lambda m: None)
    assert not after.exists(), "a step ran after SIGTERM: the stop was lost in a __del__"
    assert not made.exists(), "the step before the stop was not undone"


@SWALLOWED
def test_a_stop_swallowed_in_the_last_step_still_rolls_it_back(tmp_path, sigterm_unwinds, monkeypatch):
    made = tmp_path / "made"
    monkeypatch.setitem(runner.ACTIONS, "swallowed_stop", lambda: SignalledInItsDel() and None)
    steps = [runner.Step("make a file", ["touch", str(made)], undo=["rm", str(made)]),
             runner.Step("told to stop in a __del__", runner.Call("swallowed_stop", (), ""))]
    with pytest.raises(KeyboardInterrupt):
        runner.apply(steps, journal_in(tmp_path), log=lambda m: None)
    assert not made.exists(), "an up told to stop in its last step was left built"


def test_what_a_rollback_could_not_undo_stays_in_the_journal(tmp_path):
    steps = [runner.Step("a thing that will not go", ["true"], undo=["false"]),
             runner.Step("fail", ["false"])]
    journal = journal_in(tmp_path)
    with pytest.raises(runner.StepError):
        runner.apply(steps, journal, log=lambda m: None)
    kept = runner.Journal(journal.path).undo
    assert [e["what"] for e in kept] == ["a thing that will not go"], kept
    said = runner.rollback_left(journal, "`pepctl down`")
    assert said == f"the rollback left 1 undo step(s) in {journal.path}: run `pepctl down` to retry them", said


@runner.action("test_undo_that_breaks")
def _undo_that_breaks() -> None:
    raise RuntimeError("an undo that broke in a way run_undo does not expect")


def test_undos_not_done_stay_in_the_journal_whatever_ends_the_rollback(tmp_path):
    journal = journal_in(tmp_path)
    older = runner.Step("older", ["true"], undo=["true"])
    newer = runner.Step("newer", ["true"], undo=runner.Call("test_undo_that_breaks", (), "break"))
    runner.apply([older, newer], journal, log=lambda m: None)
    with pytest.raises(RuntimeError):
        runner.undo_all(journal, log=lambda m: None)
    kept = [e["what"] for e in runner.Journal(journal.path).undo]
    assert kept == ["older", "newer"], f"expected both undos kept for `down`, got {kept}"
    assert [e["what"] for e in journal.undo] == ["older", "newer"], journal.undo


def stops_by_sigterm(flag) -> list[str]:
    """A command that notes SIGTERM in `flag` and ends; SIGKILL would leave no note."""
    return ["sh", "-c", f"trap 'touch {flag}; kill $! 2>/dev/null; exit 0' TERM; sleep 10 >/dev/null 2>&1 & wait $!"]


def test_a_command_out_of_time_gets_sigterm_and_a_clear_error(tmp_path):
    flag = tmp_path / "terminated"
    with pytest.raises(runner.StepError, match=r"did not end within 0.5 s; stopped"):
        runner.run(stops_by_sigterm(flag), timeout=0.5)
    assert flag.exists(), "the command was not given SIGTERM (a SIGKILL leaves a rollback half done)"


def test_a_command_of_a_process_told_to_stop_gets_sigterm(tmp_path, sigterm_unwinds):
    flag = tmp_path / "terminated"
    # (It signals this process once it runs: a signal inside Popen() is before run() has a child to stop.)
    argv = ["sh", "-c", f"trap 'touch {flag}; kill $! 2>/dev/null; exit 0' TERM; sleep 0.2; kill -TERM {os.getpid()}; "
            "sleep 10 >/dev/null 2>&1 & wait $!"]
    with pytest.raises(KeyboardInterrupt):
        runner.run(argv, timeout=30)
    assert flag.exists(), "the command was not given SIGTERM when this process was told to stop"
