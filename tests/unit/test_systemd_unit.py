"""The systemd unit a proxy host installs (etc/systemd/pep.service).

How right is told from wrong: systemd's own parser (`systemd-analyze verify`)
reads the unit with its Exec paths pointed at this checkout and must say
nothing; the Exec lines must name pepctl commands that exist, with the config
pepctl uses by default; and the open-file limit must let maxconn grow past
the few hundred connections a distribution's default would allow.
"""

from __future__ import annotations

import configparser
import os
import shlex
import shutil
import subprocess

import pytest

from pepctl import cli, hostinfo

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UNIT = os.path.join(REPO, "etc", "systemd", "pep.service")
INSTALLED_AT = "/opt/pep"


def service_section() -> configparser.SectionProxy:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str   # systemd keys are case-sensitive
    parser.read(UNIT)
    return parser["Service"]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze (package systemd)")
def test_systemd_parses_the_unit_without_a_word(tmp_path):
    with open(UNIT) as f:
        text = f.read().replace(INSTALLED_AT, REPO)
    unit = tmp_path / "pep.service"
    unit.write_text(text)
    proc = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
    # Warnings about other units of the host (not ours) are not this test's business.
    ours = [ln for ln in (proc.stdout + proc.stderr).splitlines() if str(unit) in ln]
    assert proc.returncode == 0 and not ours, f"systemd-analyze verify {UNIT}: exit {proc.returncode}: {ours}"


@pytest.mark.parametrize("key, verb", [("ExecStart", "up"), ("ExecReload", "reload"), ("ExecStop", "down")])
def test_exec_lines_run_pepctl_with_the_default_config(key, verb):
    argv = shlex.split(service_section()[key])
    want = [f"{INSTALLED_AT}/scripts/pepctl", "-c", cli.DEFAULT_CONFIG, verb]
    assert argv == want, f"{UNIT}: {key}: expected {want}, got {argv}"
    assert verb in cli.COMMANDS, f"{UNIT}: {key}: pepctl has no command {verb!r}"
    assert os.access(os.path.join(REPO, "scripts", "pepctl"), os.X_OK), "scripts/pepctl is not executable"


def test_open_file_limit_lets_maxconn_grow():
    nofile = int(service_section()["LimitNOFILE"])
    assert hostinfo.maxconn_for(nofile) >= 100_000, \
        f"{UNIT}: LimitNOFILE={nofile} gives HAProxy maxconn {hostinfo.maxconn_for(nofile)}; expected >= 100000"
