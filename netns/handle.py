"""A running lab as an object, for the tests and the benchmarks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEP_LAB = os.path.join(REPO, "scripts", "pep-lab")
PEPCTL = os.path.join(REPO, "scripts", "pepctl")
PYTHON = os.path.join(REPO, ".venv", "bin", "python")
if not os.path.exists(PYTHON):
    PYTHON = sys.executable


class LabHandle:
    """A running lab: run commands in its nodes, read its status."""

    @classmethod
    def up(cls, name: str, options: list[str]) -> LabHandle:
        env = {**os.environ, "PEP_LAB": name}
        proc = subprocess.run([PEP_LAB, "up", *options], env=env, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"pep-lab up {' '.join(options)} failed: {proc.stderr}\n{proc.stdout[-2000:]}")
        return cls(name)

    def down(self) -> None:
        proc = subprocess.run([PEP_LAB, "down"], env=self.env, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"pep-lab down failed: {proc.stderr}")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.down()

    def __init__(self, name: str):
        self.name = name
        self.env = {**os.environ, "PEP_LAB": name}
        with open(f"/run/peplab/{name}.json") as f:
            self.rid = json.load(f)["meta"]["rid"]
        self.run_dir = f"/run/peplab/{self.rid}"

    def netns(self, node: str) -> str:
        return f"pl{self.rid}-{node}"

    def argv(self, node: str, *cmd: str) -> list[str]:
        return ["ip", "netns", "exec", self.netns(node), *cmd]

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
        return wait_until(find, timeout=timeout, what=f"origin access log line for {tag}")

    def run_pep_lab(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([PEP_LAB, *args], env=self.env, capture_output=True, text=True, timeout=60)

    def status(self) -> dict:
        proc = subprocess.run([PEP_LAB, "status", "--json"], env=self.env, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    def pepctl(self, *args: str, check: bool = True):
        cmd = ["nsenter", f"--net=/run/netns/{self.netns('proxyhost')}", PEPCTL, "-c",
               os.path.join(self.run_dir, "pep.toml"), *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        if check and proc.returncode != 0:
            raise AssertionError(f"pepctl {' '.join(args)} exited {proc.returncode}: {proc.stderr}")
        return proc


def wait_until(cond, *, timeout: float, what: str, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
