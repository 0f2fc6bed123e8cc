"""A running lab as an object, for the tests and the benchmarks."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time

from netns.addresses import ORIGIN_URL4
from netns.configs import one_graph, second_graph, toml_text
from netns.lab import node_netns
from pepctl import config as configmod
from pepctl.names import in_netns
from pepctl.runner import Journal, interrupts_held, stop_on_sigterm, wait_for
from pepctl.runner import run as run_command  # (LabHandle.run runs a command in a node)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEP_LAB = os.path.join(REPO, "scripts", "pep-lab")
PEPCTL = os.path.join(REPO, "scripts", "pepctl")
PYTHON = os.path.join(REPO, ".venv", "bin", "python")
METRICS_URL = "http://127.0.0.1:9101/metrics"     # the lab's exporter, in the proxy host's namespace
if not os.path.exists(PYTHON):
    PYTHON = sys.executable


class LabHandle:
    """A running lab: run commands in its nodes, read its status."""

    @classmethod
    def up(cls, name: str, options: list[str]) -> LabHandle:
        stop_on_sigterm()     # a benchmark or test run stopped by `kill` takes its labs down
        env = {**os.environ, "PEP_LAB": name}
        try:
            proc = run_command([PEP_LAB, "up", *options], check=False, timeout=300, env=env)
        except BaseException:
            # Stopped (or out of time) while the lab is being built, and no `with` holds it yet: `pep-lab
            # up` has had SIGTERM and time to roll back what it made, its pepctl's instance with it
            # (runner.run; a SIGKILL at once would orphan a running `pepctl up`). `down` takes what is left.
            with interrupts_held():
                run_command([PEP_LAB, "down"], check=False, timeout=120, env=env)
            raise
        if proc.returncode != 0:
            raise RuntimeError(f"pep-lab up {' '.join(options)} failed: {proc.stderr}\n{proc.stdout[-2000:]}")
        return cls(name)

    def down(self) -> None:
        with interrupts_held():   # a holder told to stop takes its lab down to the end
            proc = run_command([PEP_LAB, "down"], check=False, timeout=120, env=self.env)
        if proc.returncode != 0:
            raise RuntimeError(f"pep-lab down failed: {proc.stderr}")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.down()

    def __init__(self, name: str):
        self.name = name
        self.env = {**os.environ, "PEP_LAB": name}
        self.rid = Journal(f"/run/peplab/{name}.json").meta["rid"]
        self.run_dir = f"/run/peplab/{self.rid}"

    def netns(self, node: str) -> str:
        return node_netns(f"pl{self.rid}", node)

    def config(self) -> configmod.Config:
        """The proxy host's pepctl config, as the lab wrote it: its names are cfg.instance_names()."""
        return configmod.load(os.path.join(self.run_dir, "pep.toml"))

    def argv(self, node: str, *cmd: str) -> list[str]:
        """cmd in the node's network namespace only (nsenter --net, as pep-lab exec): it sees the host's
        /sys and mounts, so BPF pins under /sys/fs/bpf stay in view."""
        return in_netns(self.netns(node), list(cmd))

    def run(self, node: str, *cmd: str, check: bool = True, timeout: float = 30, text: bool = True, **kw):
        proc = subprocess.run(self.argv(node, *cmd), capture_output=True, text=text, timeout=timeout, **kw)
        if check and proc.returncode != 0:
            err = proc.stderr if text else proc.stderr.decode(errors="replace")
            raise AssertionError(f"on {node}: {' '.join(cmd)} exited {proc.returncode}: {err.strip()}")
        return proc

    def popen(self, node: str, *cmd: str, **kw) -> subprocess.Popen:
        return subprocess.Popen(self.argv(node, *cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, **kw)

    def origin_peer(self, tag: str, timeout: float = 5) -> str:
        """The peer address the origin's access log gives for the request whose URL holds tag."""
        path = os.path.join(self.run_dir, "origin-access.log")

        def find():
            with open(path) as f:
                return next((line.split()[0] for line in f if tag in line), None)
        return wait_for(find, timeout=timeout, what=f"origin access log line for {tag}")

    def reload_under_load(self, configs: list[str], seconds: float = 4, pause: float = 0.5, inspect=None):
        """Reloads the proxy host with each config text in turn while wrk makes new 1 KB transactions
        (`Connection: close`) from the client; inspect(), if given, runs after the last reload; then the
        lab's own config comes back. Returns wrk's output and what inspect returned."""
        conf = os.path.join(self.run_dir, "pep.toml")
        with open(conf) as f:
            original = f.read()
        out: dict = {}
        load = threading.Thread(target=lambda: out.update(wrk=self.run(
            "client", "wrk", "-t1", "-c8", f"-d{seconds:g}s", "-H", "Connection: close", f"{ORIGIN_URL4}/1k",
            timeout=seconds + 30).stdout))
        load.start()
        try:
            time.sleep(1.0)
            for text in configs:
                with open(conf, "w") as f:
                    f.write(text)
                proc = self.pepctl("reload")
                assert "reloaded" in proc.stdout, proc.stdout + proc.stderr
                time.sleep(pause)
        finally:
            load.join()
            seen = inspect() if inspect else None
            with open(conf, "w") as f:
                f.write(original)
            self.pepctl("reload")
        return out["wrk"], seen

    def run_pep_lab(self, *args: str) -> subprocess.CompletedProcess:
        """`pep-lab ARGS` on this lab; stopped, it gets SIGTERM and time to roll back (runner.run)."""
        return run_command([PEP_LAB, *args], check=False, timeout=60, env=self.env)

    def status(self) -> dict:
        proc = subprocess.run([PEP_LAB, "status", "--json"], env=self.env, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    def scrape_metrics(self) -> str:
        """The proxy host's metrics endpoint, as its monitoring scrapes it."""
        proc = self.run("proxyhost", "curl", "-sS", "-m", "5", METRICS_URL, check=False)
        assert proc.returncode == 0, f"proxyhost: curl {METRICS_URL}: exit {proc.returncode}: {proc.stderr.strip()}"
        return proc.stdout

    def pepctl(self, *args: str, check: bool = True, timeout: float = 120):
        cmd = self.argv("proxyhost", PEPCTL, "-c", os.path.join(self.run_dir, "pep.toml"), *args)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"pepctl {' '.join(args)} exited {proc.returncode}: {proc.stderr}")
        return proc


def metric_value(text: str, name: str, **labels) -> float | None:
    """The sample of name in Prometheus text whose labels include these, or None."""
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", line)
        if m and all(f'{k}="{v}"' in (m.group(1) or "") for k, v in labels.items()):
            return float(m.group(2))
    return None


# -- a bare proxy host, for pepctl's own tests ----------------------------------------------------
def bare_host_config(inst: str = "{inst}") -> dict:
    """The one-graph config of a bare host's instance inst; tests change what they need."""
    return one_graph(inst, "nic0", host={"run_dir": f"/run/{inst}", "bpf_dir": f"/sys/fs/bpf/{inst}",
                                         "supervisor": "pepctl",
                                         "tuning": {"irq_affinity": True, "rss_symmetric": True}},
                     proxy={"ports": [80, "8000-8080"]})


# As text, {inst} for the instance (BareHost.config fills it in); tests edit it or add to it.
BASE = toml_text(bare_host_config())
SECOND_GRAPH = "\n" + toml_text({"graph": [second_graph()]})


class BareHost:
    def __init__(self, inst: str, ns: str, tmp):
        self.inst, self.ns, self.tmp = inst, ns, tmp
        self.configs: list[str] = []

    def config(self, text: str | dict, name: str = "pep.toml") -> str:
        """A config file for this host: text with {inst} for the instance, or a config dict."""
        path = os.path.join(self.tmp, name)
        with open(path, "w") as f:
            f.write(toml_text(text) if isinstance(text, dict) else text.format(inst=self.inst))
        self.configs.append(path)
        return path

    """A bare proxy host: a namespace with a trunk NIC (nic0), where pepctl runs as on a real host.
    snapshot() lists everything an instance could leave there, for before/after comparisons."""

    def argv(self, conf: str, *args: str) -> list[str]:
        return ["nsenter", f"--net=/run/netns/{self.ns}", PEPCTL, "-c", conf, *args]

    def pepctl(self, conf: str, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
        return subprocess.run(self.argv(conf, *args), capture_output=True, text=True, timeout=timeout)

    def processes(self) -> list[str]:
        """Command lines of the instance's processes: keepers, supervisor, HAProxy, exporter."""
        out = []
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if f"/run/{self.inst}/" in cmd and ("haproxy" in cmd or "supervise" in cmd or " keep " in cmd
                                                or " exporter " in cmd):
                out.append(cmd.strip())
        return sorted(out)

    def snapshot(self) -> dict:
        def ls(path):
            try:
                return sorted(os.listdir(path))
            except FileNotFoundError:
                return []

        def j(*cmd):
            out = subprocess.run(["nsenter", f"--net=/run/netns/{self.ns}", *cmd], capture_output=True,
                                 text=True).stdout
            return json.loads(out) if out.strip() else []
        return {
            "netns": [n for n in ls("/run/netns") if n.startswith(self.inst) and n != self.ns],
            "links": sorted(ln["ifname"] for ln in j("ip", "-j", "link")),
            "qdiscs": sorted(q["kind"] for q in j("tc", "-j", "qdisc", "show", "dev", "nic0")),
            "pins": [p for p in ls("/sys/fs/bpf") if p.startswith(self.inst)],
            "run": [p for p in ls("/run") if p.startswith(self.inst)],
            "processes": self.processes(),
        }
