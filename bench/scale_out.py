"""bench scale-out: proxy hosts behind routers (netns/cluster.py): what a host adds, what an event costs.

Three cluster labs side by side, with 1, 2 and 3 proxy hosts (pep-lab up --hosts N, interception
bpf unless --interception says otherwise), measured alternately REPS times: pep-replay's 1 KB
transactions, one per connection, from 240 subscriber addresses that fall in all 8 shares (IPv4),
at a fixed concurrency. Reported per lab: transactions/s, the machine's CPU time per transaction
(busy time of all CPUs from /proc/stat over the run, client, routers and origin included), failed
transactions, and ratios to 1 host paired rep by rep. On this 2-core machine every host shares
the same two cores: more hosts cannot add capacity here, and the figure says what the cluster's
machinery costs; on real hosts capacity adds up.

Then the events, each under the same load for EVENT_SECONDS with the event at EVENT_AT:
  add    pep-lab add-host on the 2-host lab (it becomes 3): ph3 comes up, the others reload;
  drain  pepctl drain on ph1 of the 3-host lab, then --undo once the load is over;
  kill   ph2's NIC down on the 3-host lab (BFD finds it; its shares go to their backups).
For each: transactions failed (connections lost), and for kill, the time from the NIC going down
to new connections of a share ph2 owned succeeding (tests/netns/loadgen.py from that share's
address, a connection every 20 ms on a fixed schedule: the first one started after the last one
that failed or retransmitted its SYN).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import threading
import time
from contextlib import ExitStack

from netns import addresses
from netns.addresses import ORIGIN4
from netns.handle import PEPCTL, PYTHON, REPO
from pepctl import config as configmod
from pepctl import routing
from pepctl.names import in_netns

from .common import git_rev, labs, median, paired_ratio, write_report
from .proxy import cpu_busy_seconds
from .replay import REPLAY, compile_profile

HOSTS = (1, 2, 3)
CLIENTS = "198.18.0.11-198.18.0.250"
LOADGEN = os.path.join(REPO, "tests", "netns", "loadgen.py")
EVENT_SECONDS, EVENT_AT = 8.0, 3.0
SYN_LOST = 0.9        # s: a connect this slow had its SYN retransmitted (initial RTO: 1 s)
PROBE_EVERY = 0.02    # s: the probe opens a connection this often, whatever the others do (open loop)


def add_addresses(lab) -> None:
    have = {addresses.client_address(k) for k in range(addresses.SHARES)}
    batch = "".join(f"addr add 198.18.0.{i}/24 dev eth0\n" for i in range(11, 251) if f"198.18.0.{i}" not in have)
    subprocess.run(in_netns(lab.netns("client"), ["ip", "-batch", "-"]), input=batch, text=True, check=True)
    batch = "".join(f"addr add 198.19.0.{i}/24 dev eth0\n" for i in range(11, 21))
    subprocess.run(in_netns(lab.netns("origin"), ["ip", "-batch", "-"]), input=batch, text=True, check=True)


def replay(lab, profile: str, seconds: float, conns: int) -> dict:
    out = os.path.join(lab.run_dir, "replay-client.json")
    lab.run("client", REPLAY, "client", "--profile", profile, "--duration", f"{seconds:g}", "--concurrency",
            str(conns), "--clients", CLIENTS, "--quiet", "--json", out, timeout=seconds + 60, check=False)
    with open(out) as f:
        rep = json.load(f)
    return {"tps": rep["rates"]["transactions_per_s"], "ok": rep["counters"]["transactions_ok"],
            "failed": rep["counters"]["transactions_failed"], "errors": {k: v for k, v in rep["errors"].items() if v}}


def measure(lab, profile: str, seconds: float, conns: int) -> dict:
    busy = cpu_busy_seconds()
    r = replay(lab, profile, seconds, conns)
    r["cpu_us_per_tx"] = (cpu_busy_seconds() - busy) / max(r["ok"], 1) * 1e6
    return r


def owners(lab) -> list[tuple[str, str | None]]:
    return routing.owners(configmod.load(os.path.join(lab.run_dir, "pep1.toml")).routing)


def pepctl(lab, host: int, *args: str) -> subprocess.CompletedProcess:
    conf = os.path.join(lab.run_dir, f"pep{host}.toml")
    return subprocess.run(in_netns(lab.netns(f"ph{host}"), [PEPCTL, "-c", conf, *args]), capture_output=True,
                          text=True, timeout=120)


def under_load(lab, profile: str, conns: int, event, probe_share: int | None = None) -> dict:
    """The load for EVENT_SECONDS, event() at EVENT_AT (it returns what to report); with
    probe_share, loadgen from that share's address too, for the time to recover."""
    result: dict = {}
    load = threading.Thread(target=lambda: result.update(replay(lab, profile, EVENT_SECONDS, conns)))
    probe = None
    if probe_share is not None:
        probe = lab.popen("client", PYTHON, LOADGEN, "--dst", ORIGIN4, "--src",
                          addresses.client_address(probe_share), "--duration", str(EVENT_SECONDS), "--workers", "0",
                          "--long-every", str(PROBE_EVERY), "--long-requests", "1", "--timeout", "5")
        probe.stdout.readline()
    load.start()
    time.sleep(EVENT_AT)
    at = time.monotonic()
    detail = event()
    load.join()
    out = {"failed": result["failed"], "ok": result["ok"], "errors": result["errors"], "detail": detail}
    if probe is not None:
        conns_ = json.loads(probe.communicate(timeout=EVENT_SECONDS + 30)[0].splitlines()[-1])["connections"]
        after = sorted((c for c in conns_ if c["start"] >= at), key=lambda c: c["start"])
        bad = [c for c in after if not c["ok"] or c["connected"] - c["start"] > SYN_LOST]
        good = [c for c in after if not bad or c["start"] > bad[-1]["start"]]
        out["recovered_s"] = (good[0]["start"] - at) if good else None
        out["probe_failed"] = sum(1 for c in after if not c["ok"])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(prog="bench scale-out", description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--interception", choices=("bpf", "nft", "route"), default="bpf",
                    help="the hosts' interception (default bpf, the appliance's default)")
    args = ap.parse_args()
    names = {n: f"{n} host{'s' if n > 1 else ''}" for n in HOSTS}
    raw = {n: {"tps": [], "cpu_us_per_tx": [], "failed": []} for n in HOSTS}
    with ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="plbench-"))
        profile = compile_profile(tmp, "http_small.py", "1k")
        lab = labs(stack, {n: ["--hosts", str(n), "--interception", args.interception] for n in HOSTS})
        servers = {}
        for n in HOSTS:
            add_addresses(lab[n])
            servers[n] = lab[n].popen("origin", REPLAY, "server", "--profile", profile, "--duration", "3600",
                                      "--quiet")
            stack.callback(servers[n].wait)
            stack.callback(servers[n].terminate)
        time.sleep(1)
        for rep in range(args.reps):
            for n in HOSTS if rep % 2 == 0 else HOSTS[::-1]:
                r = measure(lab[n], profile, args.seconds, args.concurrency)
                for k in raw[n]:
                    raw[n][k].append(r[k])
                print(f"rep {rep + 1}/{args.reps} {names[n]:<8} {r['tps']:9,.0f} tx/s  {r['cpu_us_per_tx']:5.0f} us "
                      f"CPU/tx  failed {r['failed']}", flush=True)
        events = {}
        events["add"] = under_load(lab[2], profile, args.concurrency,
                                   lambda: lab[2].run_pep_lab("add-host").returncode)
        print(f"add:   {events['add']}", flush=True)
        drainer = {}

        def drain():
            drainer["proc"] = pepctl(lab[3], 1, "drain", "--timeout", "30")
            return drainer["proc"].returncode
        events["drain"] = under_load(lab[3], profile, args.concurrency, drain)
        events["drain"]["undo"] = pepctl(lab[3], 1, "drain", "--undo").returncode
        print(f"drain: {events['drain']}", flush=True)
        time.sleep(3)    # the routers take ph1's shares back
        victim = 2
        probe = next(k for k, (p, _) in enumerate(owners(lab[3])) if p == f"ph{victim}")
        events["kill"] = under_load(lab[3], profile, args.concurrency,
                                    lambda: lab[3].run(f"ph{victim}", "ip", "link", "set", "nic0", "down").returncode,
                                    probe_share=probe)
        print(f"kill:  {events['kill']}", flush=True)
    med = {n: {k: median(v) for k, v in s.items()} for n, s in raw.items()}
    ratios = {n: {k: paired_ratio(raw[n][k], raw[1][k]) for k in ("tps", "cpu_us_per_tx")} for n in HOSTS}
    table = [["hosts", "1 KB tx/s", "ratio", "CPU us/tx", "ratio", "failed"]]
    for n in HOSTS:
        table.append([names[n], f"{med[n]['tps']:,.0f}", f"{ratios[n]['tps']:.2f}", f"{med[n]['cpu_us_per_tx']:.0f}",
                      f"{ratios[n]['cpu_us_per_tx']:.2f}", f"{sum(raw[n]['failed'])}"])
    table.append(["event (under load)", "connections lost", "of", "new flows back after", "", ""])
    for name, e in events.items():
        back = f"{e['recovered_s']:.2f} s" if e.get("recovered_s") is not None else "-"
        table.append([name, str(e["failed"]), f"{e['failed'] + e['ok']:,}", back, "", ""])

    def plot(plt):
        fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
        labels = [names[n] for n in HOSTS]
        axes[0].bar(labels, [med[n]["tps"] for n in HOSTS], color="#37a")
        axes[0].set_title("1 KB transactions/s (2 cores shared)")
        axes[1].bar(labels, [med[n]["cpu_us_per_tx"] for n in HOSTS], color="#a73")
        axes[1].set_title("CPU time per transaction, us")
        axes[2].bar(list(events), [e["failed"] for e in events.values()], color="#b33")
        axes[2].set_title("connections lost per event")
        fig.suptitle(f"scale-out: medians of {args.reps} reps; kill: new flows back after "
                     f"{events['kill'].get('recovered_s') or float('nan'):.2f} s")
        return fig

    write_report("scale-out", {"reps": args.reps, "seconds": args.seconds, "concurrency": args.concurrency,
                               "interception": args.interception, "commit": git_rev(),
                               "command": f"./scripts/bench scale-out --interception {args.interception}",
                               "medians": med, "ratios": ratios, "events": events, "samples": raw}, table, plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
