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
import re
import shlex
import shutil
import subprocess

import pytest

from pepctl import cli, hostinfo, names, service

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


# -- the supervisor's unit (etc/systemd/pep-supervisor@.service) -------------------------------------
SUPERVISOR = service.UNIT_FILE
DOCUMENTED_CAPS = {"CAP_NET_ADMIN", "CAP_SYS_ADMIN", "CAP_NET_BIND_SERVICE"}   # haproxy/README.md


def unit_copy(tmp_path, template: str = SUPERVISOR) -> str:
    """A template unit instantiated for /run/pep/pep1, Exec paths pointed at this checkout."""
    with open(template) as f:
        text = f.read().replace(INSTALLED_AT, REPO)
    path = tmp_path / os.path.basename(template).replace("@", "@" + names.systemd_escape_path("/run/pep/pep1"))
    path.write_text(text)
    return str(path)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze (package systemd)")
def test_systemd_parses_the_supervisor_unit_without_a_word(tmp_path):
    unit = unit_copy(tmp_path)
    proc = subprocess.run(["systemd-analyze", "verify", unit], capture_output=True, text=True)
    ours = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "pep-supervisor" in ln]
    assert proc.returncode == 0 and not ours, f"systemd-analyze verify {SUPERVISOR}: exit {proc.returncode}: {ours}"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze (package systemd)")
def test_supervisor_unit_is_hardened(tmp_path):
    """systemd's own score: 0 (locked down) to 10 (exposed); 'OK' is below 5, 'MEDIUM' below 7."""
    proc = subprocess.run(["systemd-analyze", "security", "--offline=yes", unit_copy(tmp_path)],
                          capture_output=True, text=True)
    m = re.search(r"Overall exposure level for \S+: ([\d.]+) (\w+)", proc.stdout)
    assert m, f"systemd-analyze security printed no score: {proc.stdout[-500:]} {proc.stderr[-500:]}"
    assert float(m.group(1)) <= 3.0, f"{SUPERVISOR}: exposure {m.group(1)} {m.group(2)}; expected at most 3.0"


def test_supervisor_runs_as_its_own_user_with_only_the_documented_capabilities():
    unit = service.read_unit(SUPERVISOR)
    assert service.unit_user(unit) == "pep", f"{SUPERVISOR}: User= must be the proxy's own user, not root"
    for key in ("AmbientCapabilities", "CapabilityBoundingSet"):
        got = set(service.unit_value(unit, key).split())
        assert got == DOCUMENTED_CAPS, f"{SUPERVISOR}: {key}= {sorted(got)}, documented {sorted(DOCUMENTED_CAPS)}"
    assert service.unit_value(unit, "NoNewPrivileges") == "yes"
    assert service.unit_value(unit, "Restart") == "always", "a dead supervisor must come back by itself"
    with open(os.path.join(REPO, "haproxy", "README.md")) as f:
        readme = f.read()
    for cap in DOCUMENTED_CAPS:
        assert cap in readme, f"haproxy/README.md does not say why HAProxy needs {cap}"


def test_keeper_runs_the_unit_as_systemd_would():
    """Where there is no systemd, pepctl's keeper starts the supervisor from this same unit."""
    argv = service.unit_argv(service.read_unit(SUPERVISOR), "/run/pep/pep1")
    sep = argv.index("--")
    opts, cmd = argv[:sep], argv[sep + 1:]
    assert opts[0] == "setpriv" and "--reuid=pep" in opts and "--regid=pep" in opts and "--no-new-privs" in opts
    caps = "+net_admin,+sys_admin,+net_bind_service"
    assert f"--ambient-caps=-all,{caps}" in opts and f"--bounding-set=-all,{caps}" in opts, opts
    assert cmd == [os.path.join(REPO, "scripts", "pepctl"), "supervise", "/run/pep/pep1"], cmd


# -- the exporter's unit (etc/systemd/pep-exporter@.service) -------------------------------------
EXPORTER = service.EXPORTER_UNIT_FILE
EXPORTER_CAPS = {"CAP_BPF", "CAP_SYS_ADMIN", "CAP_DAC_OVERRIDE", "CAP_NET_BIND_SERVICE"}


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze (package systemd)")
def test_systemd_parses_the_exporter_unit_without_a_word(tmp_path):
    unit = unit_copy(tmp_path, EXPORTER)
    proc = subprocess.run(["systemd-analyze", "verify", unit], capture_output=True, text=True)
    ours = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "pep-exporter" in ln]
    assert proc.returncode == 0 and not ours, f"systemd-analyze verify {EXPORTER}: exit {proc.returncode}: {ours}"


def test_exporter_unit_bounds_its_capabilities_and_the_keeper_applies_them():
    unit = service.read_unit(EXPORTER)
    got = set(service.unit_value(unit, "CapabilityBoundingSet").split())
    assert got == EXPORTER_CAPS, f"{EXPORTER}: CapabilityBoundingSet= {sorted(got)}, expected {sorted(EXPORTER_CAPS)}"
    assert service.unit_value(unit, "Restart") == "always"
    argv = service.unit_argv(unit, "/run/pep/pep1")
    sep = argv.index("--")
    opts, cmd = argv[:sep], argv[sep + 1:]
    assert "--bounding-set=-all,+bpf,+sys_admin,+dac_override,+net_bind_service" in opts, opts
    assert "--no-new-privs" in opts, opts
    assert cmd == [os.path.join(REPO, "scripts", "pepctl"), "exporter", "/run/pep/pep1"], cmd
