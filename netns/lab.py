"""pep-lab: the whole network of the appliance on one machine, in namespaces.

   client                switch                      proxyhost                 pep (graph netns)
 +---------+        +--------------+            +-----------------+        +-------------------+
 | eth0    |--------| p-client     |            |                 |        |                   |
 | .0.10   |  untagged  (VLAN 100) |  trunk     | nic0            |  c_out | c_in 198.18.0.1   |
 +---------+        |        trunk |============| trunk_ingress:  |========|   HAProxy         |
 +---------+        |  (BPF: tag / |  802.1Q    |  pop, redirect  |  s_out | s_in 198.19.0.1   |
 | eth0    |--------| p-origin     |  100, 200  | port_ingress:   |========|  (TPROXY, BBR to  |
 | .0.10   |  untagged  (VLAN 200) |            |  push, redirect |        |   clients, CUBIC  |
 +---------+        +--------------+            +-----------------+        |   to origin)      |
   origin (nginx :80)                              pepctl up runs here     +-------------------+

client 198.18.0.10 / 2001:2:0:1::10 via 198.18.0.1; origin 198.19.0.10 / 2001:2:0:2::10 via 198.19.0.1.
The switch has no 8021q or VLAN-filtering bridge on this kernel: it runs the
same steering programs as the proxy host, with its access ports as the "graph".
Every name is pl<run id>-...: two labs (or tests) never collide, and `down`
removes only what this lab's journal says it made.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import secrets
import string
import subprocess
import sys

from linkem import profiles
from pepctl import runner
from pepctl.config.schema import DEFAULT_CONGESTION as PEPCTL_DEFAULT_CONGESTION
from pepctl.names import in_netns
from pepctl.plan import mkdir_step, port_attach_batch, steer_ports_step, steering_load_steps, trunk_attach_step
from pepctl.runner import Call, Journal, Step, daemon_step

from . import engines
from .addresses import (
    ACCESS_ADDRESSES,
    ACCESS_GW4,
    ACCESS_VLAN,
    CLIENT,
    CLIENT4,
    CLIENT6,
    ORIGIN,
    ORIGIN4,
    ORIGIN6,
    ORIGIN_ADDRESSES,
    ORIGIN_GW4,
    ORIGIN_URL4,
    ORIGIN_VLAN,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STATE_DIR = "/run/peplab"
PEPCTL = os.path.join(REPO, "scripts", "pepctl")
NODES = ("client", "switch", "proxyhost", "origin")
END_HOST_SYSCTLS = [
    ("net.ipv4.tcp_rmem", "4096 131072 33554432"),
    ("net.ipv4.tcp_wmem", "4096 65536 33554432"),
]
OBJECT_SIZES = {"1k": 1024, "100k": 100 * 1024, "1m": 1 << 20, "10m": 10 << 20, "50m": 50 << 20}
# The access side's congestion control (pep-lab up --congestion): what a proxy host gets by default.
DEFAULT_CONGESTION = PEPCTL_DEFAULT_CONGESTION["access"]
# A download that outlasts any timed run, even on the fastest profile: sparse (zeros, no memory or
# disk), so only for loads whose content does not matter.
ENDLESS_OBJECT = ("1g", 1 << 30)


def lab_name() -> str:
    """Which lab this is: PEP_LAB (default "default"), so tests and people can run several."""
    name = os.environ.get("PEP_LAB", "default")
    if not name or not all(c.isalnum() or c in "-_" for c in name):
        sys.exit(f"pep-lab: PEP_LAB={name!r}: use letters, digits, '-' and '_'")
    return name


class Lab:
    def __init__(self, name: str, rid: str | None = None):
        self.name = name
        self.journal = Journal(os.path.join(STATE_DIR, f"{name}.json"))
        self.rid = rid or self.journal.meta.get("rid") or secrets.token_hex(3)
        self.prefix = f"pl{self.rid}"
        self.run_dir = os.path.join(STATE_DIR, self.rid)

    @property
    def has_link(self) -> bool:
        return bool(self.journal.meta.get("options", {}).get("link"))

    @property
    def nodes(self) -> tuple[str, ...]:
        return (*NODES, "pep", *(("link",) if self.has_link else ()))

    @property
    def linkem_ctl(self) -> str:
        return os.path.join(self.run_dir, "linkem.sock")

    def netns(self, node: str) -> str:
        if node not in self.nodes and node not in ("pep", "link"):
            raise KeyError(node)
        return node_netns(self.prefix, node)

    @property
    def pep_config(self) -> str:
        return os.path.join(self.run_dir, "pep.toml")

    def pepctl_argv(self, *args: str) -> list[str]:
        """pepctl with the lab's config, in the proxy host (its network namespace only)."""
        return in_netns(self.netns("proxyhost"), [PEPCTL, "-c", self.pep_config, *args])

    @property
    def switch_pins(self) -> str:
        return f"/sys/fs/bpf/{self.prefix}sw"

    # -- building -----------------------------------------------------------
    def steps(self, opts: argparse.Namespace) -> list[Step]:
        sw, ph, cl, og = (self.netns(n) for n in ("switch", "proxyhost", "client", "origin"))
        steps = [mkdir_step(self.run_dir, 0o755, what=f"create lab folder {self.run_dir}")]
        steps += [Step(f"create namespace {self.netns(n)}", ["ip", "netns", "add", self.netns(n)],
                       undo=["ip", "netns", "del", self.netns(n)]) for n in NODES]
        # Links live in the namespaces: deleting a namespace deletes them.
        steps += self.link_steps(opts.link) if opts.link else [
            Step("cable client <-> switch", ["ip", "-n", sw, "link", "add", "p-client", "type", "veth",
                                             "peer", "name", "eth0", "netns", cl])]
        steps += [
            Step("cable origin <-> switch", ["ip", "-n", sw, "link", "add", "p-origin", "type", "veth",
                                             "peer", "name", "eth0", "netns", og]),
        ]
        steps += quiet_port_steps(((sw, "p-client"), (sw, "p-origin")))
        for ns, (a4, a6, gw4, gw6) in ((cl, CLIENT), (og, ORIGIN)):
            steps += [
                Step(f"bring up {ns}/lo", ["ip", "-n", ns, "link", "set", "lo", "up"]),
                Step(f"address {a4} on {ns}/eth0", ["ip", "-n", ns, "addr", "add", a4, "dev", "eth0"]),
                Step(f"address {a6} on {ns}/eth0", ["ip", "-n", ns, "addr", "add", a6, "dev", "eth0", "nodad"]),
                Step(f"bring up {ns}/eth0", ["ip", "-n", ns, "link", "set", "eth0", "up"]),
                # End hosts run CUBIC, as subscribers' devices and servers do (this host's default
                # is BBR, and a namespace may not pick another default: the route says it).
                Step(f"default route of {ns}", ["ip", "-n", ns, "route", "add", "default", "via", gw4,
                                                "congctl", "cubic"]),
                Step(f"IPv6 default route of {ns}", ["ip", "-6", "-n", ns, "route", "add", "default", "via", gw6,
                                                     "congctl", "cubic"]),
            ]
        steps.append(sysctl_step(cl, "net.ipv6.conf.all.accept_dad=0", f"no DAD in {cl}"))
        for ns in (cl, og):
            # Buffers big enough for a 600 ms satellite path at 100 Mbit/s.
            steps += [sysctl_step(ns, f"{key}={value}") for key, value in END_HOST_SYSCTLS]
        steps += self.plain_core_steps() if opts.plain else self.steered_core_steps(opts)
        steps += self.origin_steps()
        return steps

    def link_steps(self, profile: str) -> list[Step]:
        """The access link: client -- [link: linkem between to-client and to-switch] -- switch.

        linkem moves frames between its two veths in userspace (-a faces the client), with
        the profile's delay, jitter, loss and rate (this kernel has no netem). The
        veths' far ends must not hand it 64 KB TSO/GSO frames: offloads off there."""
        link, cl, sw = self.netns("link"), self.netns("client"), self.netns("switch")
        profiles.profile_words(profile)   # an unknown profile fails here, before anything is made
        return [
            Step(f"create namespace {link}", ["ip", "netns", "add", link], undo=["ip", "netns", "del", link]),
            Step("cable client <-> link", ["ip", "-n", link, "link", "add", "to-client", "type", "veth",
                                           "peer", "name", "eth0", "netns", cl]),
            Step("cable link <-> switch", ["ip", "-n", link, "link", "add", "to-switch", "type", "veth",
                                           "peer", "name", "p-client", "netns", sw]),
            sysctl_step(link, "net.ipv6.conf.all.disable_ipv6=1", f"no IPv6 in {link}"),
            *[Step(f"bring up {link}/{d}", ["ip", "-n", link, "link", "set", d, "up"])
              for d in ("to-client", "to-switch")],
            Step(f"no TSO/GSO on {cl}/eth0", in_netns(cl, profiles.peer_offload_argv("eth0"))),
            Step(f"no TSO/GSO on {sw}/p-client", in_netns(sw, profiles.peer_offload_argv("p-client"))),
            daemon_step(f"start linkem in {link} (profile {profile})",
                        in_netns(link, profiles.linkem_argv("to-client", "to-switch", profile=profile,
                                                            ctl=self.linkem_ctl)),
                        os.path.join(self.run_dir, "linkem.pid"), os.path.join(self.run_dir, "linkem.log"),
                        lambda: os.path.exists(self.linkem_ctl) and _linkem_answers(self.linkem_ctl)),
        ]

    def set_link(self, profile: str, overrides: list[str]) -> int:
        if not self.journal.exists:
            print(f"pep-lab link: lab {self.name} is not up", file=sys.stderr)
            return 1
        if not self.has_link:
            print(f"pep-lab link: lab {self.name} was built without an access link; "
                  "rebuild it with `pep-lab up --link PROFILE`", file=sys.stderr)
            return 1
        try:
            profiles.control(self.linkem_ctl, profiles.replace_command(profile, overrides))
            params = profiles.control(self.linkem_ctl, "params")
        except (profiles.ProfileError, profiles.LinkemError) as e:
            print(f"pep-lab link: {e}", file=sys.stderr)
            return 2
        self.journal.update_meta(link={"profile": profile, "overrides": overrides})
        print(f"access link now: {profile} {' '.join(overrides)}")
        print(json.dumps({k: v for k, v in params.items() if k != "ok"}))
        return 0

    def steered_core_steps(self, opts: argparse.Namespace) -> list[Step]:
        """The real thing: one 802.1Q trunk, the switch and the proxy host steering with tc BPF."""
        sw, ph = self.netns("switch"), self.netns("proxyhost")
        steps = switch_steps(sw, ph, self.switch_pins)
        if getattr(opts, "no_pepctl", False):
            return steps     # the proxy host is someone else's: a container booted in its namespace
        text = self.render_pep(opts)
        steps.append(Step("write the proxy host's pepctl config", Call("write", (self.pep_config, text),
                                                                       self.pep_config)))
        steps.append(pepctl_up_step(ph, self.pep_config))
        engine = getattr(opts, "proxy_engine", "haproxy")
        if engine in engines.ENGINES:
            workers = getattr(opts, "threads", 0) or os.cpu_count() or 1   # as many as HAProxy's threads
            steps += engines.steps(engine, text, self.pep_config, self.run_dir, workers=workers)
        return steps

    def plain_core_steps(self) -> list[Step]:
        """The same namespaces and links forwarding without BPF steering: one untagged trunk per
        side and a Linux bridge per side in the switch and the proxy host. The benchmarks' baseline."""
        sw, ph, pep = self.netns("switch"), self.netns("proxyhost"), self.netns("pep")
        steps = [Step(f"create namespace {pep}", ["ip", "netns", "add", pep], undo=["ip", "netns", "del", pep])]
        for side, port, trunk, nic, out, inn, addrs in (
                ("a", "p-client", "trunk-a", "nic0a", "c_out", "c_in", ACCESS_ADDRESSES),
                ("o", "p-origin", "trunk-o", "nic0o", "s_out", "s_in", ORIGIN_ADDRESSES)):
            steps += [
                Step(f"cable {trunk} <-> {nic}", ["ip", "-n", sw, "link", "add", trunk, "type", "veth",
                                                  "peer", "name", nic, "netns", ph]),
                Step(f"cable {out} <-> {pep}/{inn}", ["ip", "-n", ph, "link", "add", out, "type", "veth",
                                                      "peer", "name", inn, "netns", pep]),
            ]
            steps += quiet_port_steps(((sw, trunk), (ph, nic), (ph, out)))
            for ns, members in ((sw, (port, trunk)), (ph, (nic, out))):
                br = f"br-{side}"
                steps.append(Step(f"bridge {ns}/{br}", ["ip", "-n", ns, "link", "add", br, "type", "bridge"]))
                steps += [Step(f"{ns}/{m} into {br}", ["ip", "-n", ns, "link", "set", m, "master", br])
                          for m in members]
                steps += quiet_port_steps(((ns, br),))
            steps += [Step(f"address {a} on {pep}/{inn}", ["ip", "-n", pep, "addr", "add", a, "dev", inn, "nodad"])
                      for a in addrs]
            steps.append(Step(f"bring up {pep}/{inn}", ["ip", "-n", pep, "link", "set", inn, "up"]))
        for ns in (sw, ph):
            # Bridged frames skip netfilter, as the steered ones do.
            steps.append(sysctl_step(ns, "net.bridge.bridge-nf-call-iptables=0", f"no bridge netfilter in {ns}",
                                     tolerate=("No such file", "cannot stat")))
        steps += [sysctl_step(pep, key, f"forwarding in {pep}")
                  for key in ("net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1")]
        return steps

    def render_pep(self, opts: argparse.Namespace, run_dir: str | None = None, supervisor: str = "pepctl") -> str:
        """The proxy host's pepctl config for these options. run_dir and supervisor: for a proxy host
        that is not this lab's namespace (a container booted in it has a /run and a systemd of its own)."""
        with open(os.path.join(REPO, "netns", "lab.toml.in")) as f:
            template = string.Template(f.read())
        if opts.ports == "all" and opts.interception == "route":
            opts.ports = "80"
        ports = "\"all\"" if opts.ports == "all" else json.dumps(
            [int(p) if p.isdigit() else p for p in opts.ports.split(",")])
        fraction = getattr(opts, "control_fraction", 0.0)
        experiment = f"\n[graph.experiment]\ncontrol_fraction = {fraction}\n" if fraction else ""
        # With another engine as the proxy, pepctl's stays off: the graph routes, the engine intercepts.
        proxy = not opts.no_proxy and getattr(opts, "proxy_engine", "haproxy") == "haproxy"
        congestion = getattr(opts, "congestion", DEFAULT_CONGESTION)
        target = getattr(opts, "queue_target", None)
        queue_target = f"queue_target_ms = {target}  # pep-lab up --queue-target" if target else ""
        handshake = getattr(opts, "handshake", None)
        text = template.substitute(rid=self.rid, run_dir=run_dir or self.run_dir, supervisor=supervisor,
                                   proxy=str(proxy).lower(),
                                   interception=opts.interception, ports=ports, splice=opts.splice,
                                   mode=opts.mode, experiment=experiment, threads=getattr(opts, "threads", 0),
                                   source_port=getattr(opts, "source_port", "kept"),
                                   handshake=f'handshake = "{handshake}"' if handshake else "",
                                   metrics_port=0 if getattr(opts, "no_metrics", False) else 9101,
                                   congestion=congestion, queue_target=queue_target)
        proxy = text[text.index("[graph.proxy]"):]
        return text + "".join(extra_graph(i, proxy, congestion, queue_target)
                              for i in range(2, getattr(opts, "graphs", 1) + 1))

    def origin_steps(self) -> list[Step]:
        og = self.netns("origin")
        www = os.path.join(self.run_dir, "www")
        conf = os.path.join(self.run_dir, "nginx.conf")
        nginx_conf = NGINX_CONF.format(run=self.run_dir, www=www, origin4=ORIGIN4, origin6=ORIGIN6)

        def nginx_ready() -> bool:
            probe = in_netns(og, ["curl", "-s", "-o", "/dev/null", "-m", "1", f"{ORIGIN_URL4}/"])
            return subprocess.run(probe, capture_output=True).returncode == 0

        return [
            Step(f"origin folder {www}", ["mkdir", "-p", www]),
            Step("origin index page", Call("write", (os.path.join(www, "index.html"),
                                                     f"PEP lab origin: hello from {ORIGIN4}\n"), "index.html")),
            *[Step(f"origin object /{name} ({size} random bytes)",
                   ["sh", "-c", f"head -c {size} /dev/urandom > {os.path.join(www, name)}"])
              for name, size in OBJECT_SIZES.items()],
            Step(f"origin object /{ENDLESS_OBJECT[0]} ({ENDLESS_OBJECT[1]} bytes, sparse)",
                 ["truncate", "-s", str(ENDLESS_OBJECT[1]), os.path.join(www, ENDLESS_OBJECT[0])]),
            Step("write nginx config", Call("write", (conf, nginx_conf), conf)),
            daemon_step(f"start nginx in {og}", in_netns(og, ["nginx", "-c", conf, "-g", "daemon off;"]),
                        os.path.join(self.run_dir, "nginx.pid"), os.path.join(self.run_dir, "nginx.out"),
                        nginx_ready),
        ]

    def up(self, opts) -> int:
        if self.journal.exists and self.journal.complete:
            print(f"lab {self.name} is already up (run id {self.rid}); nothing changed")
            self.print_topology()
            return 0
        if not self.undo_previous(self.journal, "up"):
            return 1
        self.journal.start({"rid": self.rid, "options": vars(opts)})
        print(f"lab {self.name}: building run {self.rid}")
        try:
            runner.apply(self.steps(opts), self.journal)
        except Exception as e:
            if self.journal.undo:
                print(f"pep-lab up: {e}\n{self.rollback_left()}", file=sys.stderr)
                return 1
            self.forget()
            print(f"pep-lab up: {e}\nthe lab was rolled back; nothing is left", file=sys.stderr)
            return 1
        except BaseException:
            if self.journal.undo:
                print(f"pep-lab up: interrupted\n{self.rollback_left()}", file=sys.stderr)
            else:
                self.forget()
            raise
        self.journal.mark_complete()
        self.print_topology()
        return 0

    def down(self) -> int:
        if not self.journal.exists:
            print(f"lab {self.name} is not up; nothing to do")
            return 0
        errors = runner.undo_all(self.journal, log=lambda m: None)
        for e in errors:
            print(f"pep-lab down: {e}", file=sys.stderr)
        if errors:
            return 1
        self.forget()
        print(f"lab {self.name} (run {self.rid}) is down")
        return 0

    def rollback_left(self, journal: runner.Journal | None = None) -> str:
        return runner.rollback_left(journal or self.journal, f"`PEP_LAB={self.name} pep-lab down`")

    def undo_previous(self, journal: runner.Journal, command: str) -> bool:
        """Undo what a `command` that did not finish left in `journal`, before it starts again; False
        (said why) if some of it could not be undone: starting over would lose the journal of it."""
        if not journal.exists:
            return True
        print(f"lab {self.name}: a previous `{command}` did not finish; undoing it first")
        errors = runner.undo_all(journal)
        if errors:
            print(f"pep-lab {command}: could not undo the previous attempt:\n  " + "\n  ".join(errors)
                  + f"\n{self.rollback_left(journal)}", file=sys.stderr)
        return not errors

    def forget(self) -> None:
        try:
            os.unlink(self.journal.path)
        except FileNotFoundError:
            pass
        try:
            os.rmdir(STATE_DIR)
        except OSError:
            pass

    # -- looking ------------------------------------------------------------
    def print_topology(self) -> None:
        p = self.prefix
        print(f"""
  {p}-client  {CLIENT4} {CLIENT6}
      |  eth0 -- p-client (untagged; switch tags VLAN {ACCESS_VLAN})
  {p}-switch  ==trunk== 802.1Q {ACCESS_VLAN},{ORIGIN_VLAN} ==nic0==  {p}-proxyhost
      |  eth0 -- p-origin (untagged; switch tags VLAN {ORIGIN_VLAN})        | c_out/s_out (tc BPF steering)
  {p}-origin  {ORIGIN4} {ORIGIN6}  nginx :80        {p}-pep  c_in {ACCESS_GW4} | s_in {ORIGIN_GW4}

  try: ./scripts/pep-lab exec client -- curl -s {ORIGIN_URL4}/
       ./scripts/pep-lab status""")

    def status(self, as_json: bool) -> int:
        if not self.journal.exists:
            print(json.dumps({"lab": self.name, "state": "down"}) if as_json else f"lab {self.name}: down")
            return 0
        present = {n: os.path.exists(f"/run/netns/{self.netns(n)}") for n in self.nodes}
        if self.journal.meta["options"].get("plain"):
            print(json.dumps({"lab": self.name, "run_id": self.rid, "plain": True, "namespaces": present}))
            return 0
        pep = subprocess.run(self.pepctl_argv("status", "--json"), capture_output=True, text=True)
        link = {}
        if self.has_link:
            try:
                link = {"setting": self.journal.meta.get("link") or
                        {"profile": self.journal.meta["options"]["link"], "overrides": []},
                        "stats": profiles.control(self.linkem_ctl, "stats")}
            except profiles.LinkemError as e:
                link = {"error": str(e)}
        report = {"lab": self.name, "run_id": self.rid, "access_link": link,
                  "state": "up" if self.journal.complete and all(present.values()) else "damaged",
                  "namespaces": {n: {"name": self.netns(n), "present": ok} for n, ok in present.items()},
                  "pepctl": json.loads(pep.stdout) if pep.stdout.strip() else {"error": pep.stderr.strip()}}
        if as_json:
            print(json.dumps(report, indent=2))
            return 0
        print(f"lab {self.name} (run {self.rid}): {report['state']}")
        for n, v in report["namespaces"].items():
            print(f"  {n:<10} {v['name']:<20} {'present' if v['present'] else 'MISSING'}")
        subprocess.run(self.pepctl_argv("status"))
        return 0

    def exec(self, node: str, argv: list[str]) -> int:
        if not self.journal.exists:
            print(f"pep-lab exec: lab {self.name} is not up; run `pep-lab up` first", file=sys.stderr)
            return 1
        try:
            if node not in self.nodes:
                raise KeyError(node)
            ns = self.netns(node)
        except KeyError:
            print(f"pep-lab exec: unknown node {node!r}; nodes: {', '.join(self.nodes)}", file=sys.stderr)
            return 2
        if not argv:
            print("pep-lab exec: give a command after --", file=sys.stderr)
            return 2
        # The node's network namespace only (nsenter --net): `ip netns exec` would give the command a
        # mount namespace of its own, where `pepctl down`'s `ip netns del` removes a graph's namespace
        # only for itself.
        argv = in_netns(ns, argv)
        os.execvp(argv[0], argv)


MAX_GRAPHS = 2048


def extra_graph(i: int, proxy: str, congestion: str = DEFAULT_CONGESTION, queue_target: str = "") -> str:
    """Graph i (2, 3, ...) of a lab brought up with --graphs N: VLANs and subnets of its own, no
    hosts behind it (the benchmarks measure what many graphs cost; tests reload one while another
    carries traffic). Its proxy settings and access side's congestion control (and its queue
    target: queue_target, a config line or nothing) are graph 1's."""
    k = i - 2
    a4 = ipaddress.ip_address("198.18.128.0") + 16 * k
    o4 = ipaddress.ip_address("198.19.128.0") + 16 * k
    return f"""
[[graph]]
name = "g{i}"
[graph.access]
vlan = {300 + 2 * k}
addresses = ["{a4 + 1}/28", "2001:2:0:{0x1000 + i:x}::1/64"]
congestion = "{congestion}"
{queue_target}
[graph.origin]
vlan = {301 + 2 * k}
addresses = ["{o4 + 1}/28", "2001:2:0:{0x8000 + i:x}::1/64"]
{proxy}"""


def switch_steps(sw: str, ph: str, pins: str) -> list[Step]:
    """A switch with two access ports, p-client (VLAN 100) and p-origin (VLAN 200), and a trunk to
    the proxy host's nic0. It runs the project's own steering programs, tagging its access ports
    (no 8021q here)."""
    steps = [Step(f"cable trunk {sw} <-> {ph}/nic0", ["ip", "-n", sw, "link", "add", "trunk", "type", "veth",
                                                      "peer", "name", "nic0", "netns", ph])]
    steps += quiet_port_steps(((sw, "trunk"), (ph, "nic0")))
    # A host has its loopback up: HAProxy's exporter listens there (127.0.0.1:9101).
    steps.append(Step(f"bring up {ph}/lo", ["ip", "-n", ph, "link", "set", "lo", "up"]))
    steps += steering_load_steps(pins, "trunk", sw)
    access_ports = [(ACCESS_VLAN, "p-client"), (ORIGIN_VLAN, "p-origin")]
    steps.append(steer_ports_step(pins, access_ports, "trunk", sw))
    steps.append(Step(f"tag the access ports of {sw}", in_netns(sw, ["tc", "-batch", "-"]),
                      input=port_attach_batch(pins, [p for _, p in access_ports])))
    steps.append(trunk_attach_step(pins, "trunk", sw))
    return steps


def pepctl_up_step(ph: str, config: str) -> Step:
    """The proxy host runs pepctl exactly as a real one does."""
    pepctl = [PEPCTL, "-c", config]
    return Step(f"pepctl up in {ph}", in_netns(ph, [*pepctl, "up"]), undo=in_netns(ph, [*pepctl, "down"]))


def node_netns(prefix: str, node: str) -> str:
    """A lab node's namespace. pepN is proxy host N's graph (pepctl names it INSTANCE-GRAPH; the
    instance of host N is the lab's prefix and N), pep the one-host lab's."""
    if node.startswith("pep") and node[3:].isdigit():
        return f"{prefix}{node[3:]}-pep"
    return f"{prefix}-{node}"


def sysctl_step(ns: str, setting: str, what: str | None = None, tolerate: tuple[str, ...] = ()) -> Step:
    """One sysctl (KEY=VALUE) in a node's namespace."""
    return Step(what or f"{setting} in {ns}", in_netns(ns, ["sysctl", "-q", "-w", setting]), tolerate=tolerate)


def quiet_port_steps(ports) -> list[Step]:
    """Links that carry frames, not addresses: no IPv6 link-local chatter, then up."""
    steps = []
    for ns, dev in ports:
        steps.append(sysctl_step(ns, f"net.ipv6.conf.{dev}.disable_ipv6=1", f"no IPv6 on {ns}/{dev}"))
        steps.append(Step(f"bring up {ns}/{dev}", ["ip", "-n", ns, "link", "set", dev, "up"]))
    return steps


def _linkem_answers(ctl: str) -> bool:
    try:
        profiles.control(ctl, "stats", timeout=0.5)
        return True
    except profiles.LinkemError:
        return False


NGINX_CONF = """# The lab's origin server. Written by pep-lab.
user root;
worker_processes 2;
pid {run}/nginx.own.pid;
error_log {run}/nginx-error.log warn;
events {{ worker_connections 8192; }}
http {{
    log_format lab '$remote_addr $request_method $request_uri $status $body_bytes_sent';
    access_log {run}/origin-access.log lab buffer=64k flush=200ms;
    client_body_temp_path {run}/tmp-body;
    proxy_temp_path {run}/tmp-proxy;
    fastcgi_temp_path {run}/tmp-fastcgi;
    uwsgi_temp_path {run}/tmp-uwsgi;
    scgi_temp_path {run}/tmp-scgi;
    sendfile on;
    tcp_nopush on;
    keepalive_requests 1000000;
    default_type application/octet-stream;
    server {{
        # Its own addresses only: other servers (pep-replay) may use 198.19.0.11-20 port 80.
        listen {origin4}:80 reuseport backlog=4096;
        listen [{origin6}]:80 reuseport backlog=4096;
        root {www};
        # Uploads: PUT /upload/NAME is written whole before the answer (so a client's upload
        # time is the time to deliver every byte).
        location /upload/ {{
            alias {run}/uploads/;
            dav_methods PUT;
            create_full_put_path on;
            client_max_body_size 0;
        }}
    }}
}}
"""
