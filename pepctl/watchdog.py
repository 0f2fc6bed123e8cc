"""The fail-open watchdog of one graph: an inline box must never black-hole subscribers.

With TPROXY, a dead HAProxy means every new SYN is dropped. Every
CHECK_INTERVAL the watchdog checks HAProxy (master process alive, stats socket
answering within ANSWER_TIMEOUT); on failure it sets proxy_state.up = 0 in
the graph's bypass maps, so new flows are forwarded at L3 by tc (flows keep
the verdict of their first SYN), logs the switch, and restarts HAProxy. When
HAProxy answers again it sets up = 1: new flows are proxied again. The mode
and the time of the last switch are in watchdog.json for `pepctl status`.

Run by `pepctl up` as `pepctl -c CONFIG watchdog GRAPH`; stopped by PID.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from . import bypass_maps, haproxy_sock
from .config import Config, Graph
from .plan import GraphNames, graph_names
from .runner import pid_alive, stop_pid
from .status import read_pid

CHECK_INTERVAL = 0.1     # seconds between checks: a switch within ~0.3 s of a failure
ANSWER_TIMEOUT = 0.3     # a stats socket slower than this counts as not answering
RESTART_BACKOFF = 1.0    # seconds between restart attempts of a HAProxy that will not start


def state_path(n: GraphNames) -> str:
    return os.path.join(n.dir, "watchdog.json")


def read_state(n: GraphNames) -> dict:
    try:
        with open(state_path(n)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


class Watchdog:
    def __init__(self, cfg: Config, g: Graph):
        from .bypass import graph_pins
        self.n = graph_names(cfg, g)
        self.pins = graph_pins(cfg, g)
        self.state = {"mode": "starting", "last_switch": None, "switches": 0, "restarts": 0,
                      "reason": None, "pid": os.getpid()}
        self.worker: int | None = None
        self.next_restart = 0.0

    def log(self, msg: str) -> None:
        print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {self.n.netns}: {msg}", flush=True)

    def save(self) -> None:
        tmp = state_path(self.n) + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.state, f)
        os.replace(tmp, state_path(self.n))

    def health(self) -> str | None:
        """None when healthy, else why not."""
        master = read_pid(self.n.haproxy_pid)
        if master is None or not pid_alive(master):
            return f"HAProxy master (pid {master}) is gone"
        try:
            info = haproxy_sock.info(self.n.haproxy_sock, timeout=ANSWER_TIMEOUT)
        except OSError as e:
            return f"stats socket does not answer: {e}"
        self.worker = int(info.get("Pid", 0)) or self.worker
        return None

    def switch(self, mode: str, reason: str) -> None:
        bypass_maps.set_proxy_up(self.pins, mode == "proxy")
        self.state.update(mode=mode, reason=reason, last_switch=time.time(), switches=self.state["switches"] + 1)
        self.save()
        what = "new flows are proxied" if mode == "proxy" else "FAIL-OPEN: new flows bypass the proxy"
        self.log(f"{what} ({reason})")

    def restart(self) -> None:
        """Stop what is left of the old HAProxy (by recorded PIDs) and start a new master."""
        if time.monotonic() < self.next_restart:
            return
        self.next_restart = time.monotonic() + RESTART_BACKOFF
        for pid in (read_pid(self.n.haproxy_pid), self.worker):
            if pid and pid_alive(pid):
                stop_pid(pid, grace=1.0)
        with open(self.n.haproxy_log, "ab") as logf:
            proc = subprocess.Popen(["ip", "netns", "exec", self.n.netns, "haproxy", "-W", "-f", self.n.haproxy_cfg],
                                    stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, start_new_session=True)
        with open(self.n.haproxy_pid, "w") as f:
            f.write(f"{proc.pid}\n")
        self.state["restarts"] += 1
        self.save()
        self.log(f"restarted HAProxy: new master pid {proc.pid}")

    def run(self, duration: float | None = None) -> None:
        stop = []
        signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
        signal.signal(signal.SIGINT, lambda *_: stop.append(1))
        end = time.monotonic() + duration if duration else None
        while not stop and (end is None or time.monotonic() < end):
            why = self.health()
            if why is None and self.state["mode"] != "proxy":
                self.switch("proxy", "HAProxy answers")
            elif why is not None:
                if self.state["mode"] != "failopen":
                    self.switch("failopen", why)
                self.restart()
            # Reap restarted masters that exited (we are their parent).
            try:
                while os.waitpid(-1, os.WNOHANG)[0] > 0:
                    pass
            except ChildProcessError:
                pass
            time.sleep(CHECK_INTERVAL)
        self.log("watchdog stopped")


def main(cfg: Config, graph: str) -> int:
    g = next((g for g in cfg.graphs if g.name == graph), None)
    if g is None:
        print(f"pepctl watchdog: no graph {graph!r} in {cfg.path}", file=sys.stderr)
        return 2
    Watchdog(cfg, g).run()
    return 0
