"""pep-lab's command line: the one-host lab (netns/lab.py) or, with --hosts N, the cluster lab
(netns/cluster.py)."""

from __future__ import annotations

import argparse
import os
import sys

from pepctl import runner

from .cluster import HOSTS_MAX, ClusterLab
from .engines import ENGINES, MINRELAY
from .lab import DEFAULT_CONGESTION, MAX_GRAPHS, Lab, lab_name


def main(argv: list[str] | None = None) -> int:
    runner.stop_on_sigterm()   # a stopped `up` rolls back what it made, as a failed one does
    ap = argparse.ArgumentParser(prog="pep-lab", description="the one-host lab of the PEP appliance")
    sub = ap.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="build the lab and bring the proxy host up with pepctl")
    up.add_argument("--no-proxy", action="store_true", help="the pep namespace only routes")
    up.add_argument("--no-pepctl", action="store_true",
                    help="leave the proxy host's namespace bare (nic0 on the trunk, no pepctl up): a container "
                    "booted in it is the proxy host (tests/netns/test_systemd.py)")
    up.add_argument("--link", metavar="PROFILE",
                    help="put the access-link emulator between client and switch (profiles: linkem/profiles.toml)")
    up.add_argument("--plain", action="store_true",
                    help="benchmark baseline: no VLANs, no BPF steering, no pepctl: Linux bridges, pep only routes")
    up.add_argument("--interception", choices=("bpf", "nft", "route"), default="bpf")
    up.add_argument("--ports", default="all", help='intercepted TCP ports: "all" or a list like 80,443,8000-8080 '
                    '(route interception needs a list; it gets 80 when given "all")')
    up.add_argument("--splice", choices=("both", "auto", "off"), default="both")
    up.add_argument("--proxy-engine", choices=("haproxy", *ENGINES), default="haproxy",
                    help="nginx or minrelay: pepctl's proxy off, that proxy intercepting port 80 with nft in the "
                    "graph, transparent both ways (netns/engines.py; bench proxy's nginx-stream and minrelay)")
    up.add_argument("--mode", choices=("tcp", "http"), default="tcp")
    up.add_argument("--handshake", choices=("honest", "early"),
                    help="who answers a new flow's SYN first (default: honest with bpf interception, early else)")
    up.add_argument("--source-port", choices=("kept", "any"), default="kept",
                    help="the proxy connects to the origin from the client's own port (kept, the default) or a "
                    "spare one (any)")
    up.add_argument("--congestion", default=DEFAULT_CONGESTION, metavar="NAME",
                    help=f"the access side's congestion control (default {DEFAULT_CONGESTION}): one the kernel offers, "
                    "or pep_radio (pepctl's own, congestion/: registered by pepctl up, shared by every lab of the "
                    "host)")
    up.add_argument("--queue-target", type=int, metavar="MS",
                    help="pep_radio's queue target toward the subscriber, ms ([graph.access] queue_target_ms; "
                    "default the config's default)")
    up.add_argument("--threads", type=int, default=0, metavar="N",
                    help="the proxy's threads (HAProxy) or workers (nginx, minrelay); default 0: one per CPU")
    up.add_argument("--no-metrics", action="store_true", help="no metrics exporter (metrics_port = 0)")
    up.add_argument("--control-fraction", type=float, default=0.0, metavar="F",
                    help="the experiment: a share F of subscribers bypassed as the control group (default 0: off)")
    up.add_argument("--hosts", type=int, default=0, metavar="N",
                    help=f"N proxy hosts (1-{HOSTS_MAX}) behind an access and an origin router, FRR (BGP, BFD) on "
                    "every one (netns/cluster.py; add-host adds one); default: the one-host lab")
    up.add_argument("--graphs", type=int, default=1, metavar="N",
                    help=f"graphs on the proxy host: the lab's own, and N-1 more without hosts (max {MAX_GRAPHS})")
    sub.add_parser("add-host", help="the cluster lab (up --hosts N): one more proxy host; the others take it in "
                   "with pepctl reload")
    sub.add_parser("down", help="remove everything the lab made")
    lk = sub.add_parser("link", help="change the access link live: link PROFILE [KEY=VALUE...]")
    lk.add_argument("profile")
    lk.add_argument("overrides", nargs="*", help="linkem parameters, e.g. down.rate=100M loss=1 delay=25")
    st = sub.add_parser("status", help="namespaces, steering counters, HAProxy sessions")
    st.add_argument("--json", action="store_true")
    ex = sub.add_parser("exec", help="run a command in a node: exec NODE -- CMD...")
    ex.add_argument("node")
    ex.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    if args.command == "up" and not 1 <= args.graphs <= MAX_GRAPHS:
        ap.error(f"--graphs {args.graphs}: use 1-{MAX_GRAPHS}")
    if args.command == "up" and args.hosts and not 1 <= args.hosts <= HOSTS_MAX:
        ap.error(f"--hosts {args.hosts}: use 1-{HOSTS_MAX} (or leave it out for the one-host lab)")
    if args.command == "up" and args.hosts and (args.link or args.plain or args.graphs > 1):
        ap.error("--hosts builds the cluster lab: it takes no --link, --plain or --graphs")
    if args.command == "up" and args.no_pepctl and (args.hosts or args.plain or args.proxy_engine != "haproxy"):
        ap.error("--no-pepctl leaves the one-host lab's proxy host bare: not with --hosts, --plain or --proxy-engine")
    if args.command == "up" and args.proxy_engine != "haproxy" and (args.hosts or args.plain or args.no_proxy):
        ap.error(f"--proxy-engine {args.proxy_engine} is the one-host lab's proxy: not with --hosts, --plain or "
                 "--no-proxy")
    if args.command == "up" and args.proxy_engine == "minrelay" and not os.path.exists(MINRELAY):
        ap.error(f"--proxy-engine minrelay: {MINRELAY} is not built; run make build (scripts/setup does)")
    if os.geteuid() != 0:
        print("pep-lab: must run as root (it creates namespaces)", file=sys.stderr)
        return 1
    lab = Lab(lab_name())
    if (args.command == "up" and args.hosts) or lab.journal.meta.get("options", {}).get("hosts"):
        lab = ClusterLab(lab_name())
    if args.command == "up":
        return lab.up(args)
    if args.command == "add-host":
        if not isinstance(lab, ClusterLab):
            print(f"pep-lab add-host: lab {lab.name} is not a cluster lab (pep-lab up --hosts N)", file=sys.stderr)
            return 1
        return lab.add_host()
    if args.command == "down":
        return lab.down()
    if args.command == "status":
        return lab.status(args.json)
    if args.command == "link":
        return lab.set_link(args.profile, args.overrides)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    return lab.exec(args.node, cmd)


if __name__ == "__main__":
    sys.exit(main())
