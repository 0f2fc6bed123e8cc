"""bench proxy-tuning: what each candidate change to the proxy saves per new connection (issue 17).

Where a proxied connection's time goes (bench proxy's breakdown, and perf): about 90% of HAProxy's
CPU samples are in the kernel (two handshakes, the close of two sockets, each packet's way through
veth and tc), 6% in HAProxy and libc. The candidates are therefore the per-connection work the
proxy makes the kernel do, and how HAProxy spreads connections over its threads.

Labs side by side, measured alternately REPS times: `routed` (the baseline of the proxy's own CPU
share), `default` (the project as it is: bpf interception, splice both, TCP mode, port 80),
`nginx-stream` (the proxy an operator might pick instead), and one lab per candidate: the default
with one change: a setting pepctl already has, through the lab's options (threads), or else one
change made in the HAProxy configuration that pepctl rendered, loaded by the instance's supervisor
(SIGHUP: the seamless reload). A candidate that pays moves into haproxy/render.py; the others stay
here, so their figures can be measured again. One yardstick runs as a candidate: `minrelay-bpf`,
HAProxy's place taken by minrelay, the least a transparent proxy does, behind the same datapath.

For each: 1 KB transactions/s over new connections (wrk, `Connection: close`), the proxy's CPU per
transaction (the machine's busy time over the run per transaction, less routed's, rep by rep) and
how it splits into user, system and softirq time, TTFB of a new connection (p50, p99), and 10 MB
objects over keep-alive. Ratios are to `default`, paired rep by rep.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable
from contextlib import ExitStack

from netns.engines import LISTEN_PORT, MINRELAY, listening
from pepctl import config as configmod
from pepctl.reload import reload_haproxy
from pepctl.runner import wait_for

from .common import git_rev, labs, paired_ratio, write_report
from .proxy import (
    CPU_KINDS,
    VARIANTS,
    add_measure_args,
    measure_alternately,
    medians,
    own_shares,
    proxy_share,
    ratio_bars,
)


def in_sections(kind: str, line: str) -> Callable[[str], str]:
    """line added to every section of kind (frontend or backend), after its mode."""
    def change(cfg: str) -> str:
        return re.sub(rf"(?m)^({kind} \S+\n    mode \S+\n)", rf"\g<1>    {line}\n", cfg)
    return change


def in_global(line: str) -> Callable[[str], str]:
    def change(cfg: str) -> str:
        return cfg.replace("\nglobal\n", f"\nglobal\n    {line}\n", 1)
    return change


def without(line: str) -> Callable[[str], str]:
    def change(cfg: str) -> str:
        return cfg.replace(f"    {line}\n", "")
    return change


def replaced(old: str, new: str) -> Callable[[str], str]:
    def change(cfg: str) -> str:
        if old not in cfg:
            raise RuntimeError(f"the rendered HAProxy config has no {old!r}")
        return cfg.replace(old, new)
    return change


def shared_listener(cfg: str) -> str:
    """The binds as they were before each thread had its own (haproxy/render.py): one listening
    socket per address and port that every thread polls (the `thread 1` line, its owner dropped;
    the other threads' lines gone)."""
    cfg = re.sub(r"(?m)^    bind .* thread (?!1$)\d+\n", "", cfg)
    return re.sub(r"(?m)^(    bind .*) thread 1$", r"\g<1>", cfg)


# name: (what it changes, the change to the rendered config). Each is one HAProxy 2.6 setting (its
# manual says more).
CANDIDATES: dict[str, tuple[str, Callable[[str], str]]] = {
    "no-multi-queue": ("`tune.listener.multi-queue off`: the thread that accepts a connection serves it",
                       in_global("tune.listener.multi-queue off")),
    "shared-listener": ("one listening socket that every thread polls (the default had it before 2026-11)",
                        shared_listener),
    "smart-connect": ("backend `option tcp-smart-connect`: the handshake's last ACK goes with the request",
                      in_sections("backend", "option tcp-smart-connect")),
    "smart-accept": ("frontend `option tcp-smart-accept`: no quick ACK of the request",
                     in_sections("frontend", "option tcp-smart-accept")),
    "defer-accept": ("`defer-accept` on the binds (TCP_DEFER_ACCEPT): accept once data arrive",
                     lambda cfg: re.sub(r"(?m)^(    bind .*)$", r"\g<1> defer-accept", cfg)),
    "any-port": ("`usesrc clientip`: connect from a spare port (source_port = \"any\"), not the client's own",
                 replaced("usesrc client\n", "usesrc clientip\n")),
    "splice-response": ("splice the response only", without("option splice-request")),
    "no-splice": ("no splice (recv/send through HAProxy's buffers)",
                  lambda cfg: without("option splice-response")(without("option splice-request")(cfg))),
    "maxaccept-4": ("`tune.maxaccept 4`: fewer accepts per wake-up (default 64)",
                    in_global("tune.maxaccept 4")),
    # nginx's workers float; HAProxy's threads are pinned (haproxy/render.py), so a connection the
    # kernel hands to a thread on an idle CPU waits for that CPU to wake.
    "no-cpu-map": ("no `cpu-map`: the threads float over the CPUs, as nginx's workers do",
                   lambda cfg: re.sub(r"(?m)^    cpu-map .*\n", "", cfg)),
    # perf put epoll_ctl at about 7% of HAProxy's samples; nginx registers a socket once, edge-triggered.
    "edge-triggered": ("`tune.fd.edge-triggered on` (experimental in 2.6): fewer epoll_ctl calls",
                       in_global("expose-experimental-directives\n    tune.fd.edge-triggered on")),
}


# name: (what it changes, the bench proxy variant that makes it: a setting pepctl has).
LAB_CANDIDATES = {
    "threads-1": ("one HAProxy thread (`[host] threads = 1`; the default is one per CPU of the NIC's node)",
                  "bpf-1-thread"),
}


def minrelay_behind_bpf(lab, stack: ExitStack) -> None:
    """HAProxy's place taken by minrelay (minrelay/minrelay.c), the least a transparent proxy does,
    behind the project's own datapath: HAProxy's listener moves to another port (a reload) and
    minrelay listens on the one the tc program hands new flows to. What is left of the proxy's
    share is the interception's and the kernel's; what goes is HAProxy's own."""
    apply(lab, replaced(f":{LISTEN_PORT} ", f":{LISTEN_PORT + 1} "))   # both binds, IPv4 and IPv6
    ns = lab.netns("pep")
    wait_for(lambda: not listening(ns), timeout=10, what=f"HAProxy off port {LISTEN_PORT} after the reload")
    relay = lab.popen("pep", MINRELAY, str(LISTEN_PORT), str(os.cpu_count() or 1))
    stack.callback(relay.wait, timeout=10)
    stack.callback(relay.terminate)   # its recorded PID; its workers die with it (PR_SET_PDEATHSIG)
    wait_for(lambda: "minrelay" in listening(ns), timeout=10, what=f"minrelay listening on {LISTEN_PORT}")


# name: (what it is, how the lab is changed after it is up).
ENGINE_CANDIDATES = {
    "minrelay-bpf": ("HAProxy replaced by minrelay, the least a transparent proxy does, behind the same tc "
                     "interception (a yardstick, not a candidate for the product)", minrelay_behind_bpf),
}


def apply(lab, change: Callable[[str], str]) -> None:
    """Change the lab's rendered HAProxy config and have the supervisor reload it."""
    cfg = configmod.load(os.path.join(lab.run_dir, "pep.toml"))
    n = cfg.instance_names()
    with open(n.haproxy_cfg) as f:
        text = f.read()
    new = change(text)
    if new == text:
        raise RuntimeError(f"{n.haproxy_cfg}: the candidate's change left the config as it was")
    with open(n.haproxy_cfg, "w") as f:
        f.write(new)
    reload_haproxy(n)


def main() -> int:
    ap = argparse.ArgumentParser(prog="bench proxy-tuning", description=__doc__.splitlines()[0])
    add_measure_args(ap, reps=5, ttfb_count=100)
    known = [*LAB_CANDIDATES, *CANDIDATES, *ENGINE_CANDIDATES]
    ap.add_argument("--candidates", default=",".join(known), help="comma-separated subset")
    args = ap.parse_args()
    unknown = [c for c in args.candidates.split(",") if c not in known]
    if unknown:
        ap.error(f"--candidates: no candidate {', '.join(unknown)}; the candidates: {', '.join(known)}")
    chosen = ["routed", "default", "nginx-stream", *args.candidates.split(",")]
    variant = ({"default": "bpf"} | {c: "bpf" for c in (*CANDIDATES, *ENGINE_CANDIDATES)}
               | {c: v for c, (_, v) in LAB_CANDIDATES.items()})
    options = {v: VARIANTS[variant.get(v, v)] for v in chosen}
    with ExitStack() as stack:
        lab = labs(stack, options)
        for v in chosen:
            if v in CANDIDATES:
                apply(lab[v], CANDIDATES[v][1])
            elif v in ENGINE_CANDIDATES:
                ENGINE_CANDIDATES[v][1](lab[v], stack)
        raw = measure_alternately(lab, chosen, args)

    proxied = chosen[1:]
    med = medians(raw)
    own = {v: {k: proxy_share(raw, v, f"{k}_us_per_tx") for k in ("cpu", *CPU_KINDS)} for v in proxied}
    ratios = {v: {k: paired_ratio(raw[v][k], raw["default"][k]) for k in ("tps", "ttfb_p50_us", "ttfb_p99_us",
                                                                          "gbps_10m")} for v in proxied}
    for v in proxied:   # the proxy's own CPU against the default's, rep by rep
        ratios[v]["proxy_cpu"] = paired_ratio(own_shares(raw, v), own_shares(raw, "default"))
    table = [["variant", "1 KB tx/s", "ratio", "proxy's us/tx", "ratio", "user/sys/softirq", "TTFB p50 us", "ratio",
              "TTFB p99 us", "ratio", "10 MB Gbit/s", "ratio", "errors"]]
    table.append(["routed", f"{med['routed']['tps']:,.0f}", "", "-", "", "-", f"{med['routed']['ttfb_p50_us']:.0f}",
                  "", f"{med['routed']['ttfb_p99_us']:.0f}", "", f"{med['routed']['gbps_10m']:.2f}", "",
                  str(med["routed"]["errors"])])
    for v in proxied:
        m, r, o = med[v], ratios[v], own[v]
        table.append([v, f"{m['tps']:,.0f}", f"{r['tps']:.2f}", f"{o['cpu']:.0f}", f"{r['proxy_cpu']:.2f}",
                      "/".join(f"{o[k]:.0f}" for k in CPU_KINDS), f"{m['ttfb_p50_us']:.0f}", f"{r['ttfb_p50_us']:.2f}",
                      f"{m['ttfb_p99_us']:.0f}", f"{r['ttfb_p99_us']:.2f}", f"{m['gbps_10m']:.2f}",
                      f"{r['gbps_10m']:.2f}", str(m["errors"])])

    def plot(plt):
        panels = (("tps", "1 KB transactions/s"), ("proxy_cpu", "the proxy's CPU per transaction"),
                  ("ttfb_p50_us", "TTFB p50"))
        colors = ["#37a" if v == "default" else "#a73" if v == "nginx-stream" else "#888" for v in proxied]
        return ratio_bars(plt, ratios, panels, "default", colors,
                          f"Candidate changes to the proxy, one at a time (paired medians of {args.reps})")

    write_report("proxy-tuning", {"reps": args.reps, "seconds": args.seconds, "commit": git_rev(),
                                  "command": "./scripts/bench proxy-tuning",
                                  "candidates": {c: (CANDIDATES | LAB_CANDIDATES | ENGINE_CANDIDATES)[c][0]
                                                 for c in chosen if c in known},
                                  "medians": med, "proxy_cpu_us_per_tx": own, "ratios_to_default": ratios,
                                  "samples": raw}, table, plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
