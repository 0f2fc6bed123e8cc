"""pepctl: bring the PEP up on a proxy host, watch it, take it out.

Nouns change nothing (`plan`, `status`, `subscribers`); verbs change state (`up`, `down`, `reload`,
`bypass add|del|sync`) and hold the instance's lock while they do. Every run of `up` on a host
that is already up with the same config changes nothing and says so.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
import traceback

from haproxy import supervise

from . import bypass, checks, drain, exporter, hostinfo, plan, report, service, status, subscribers
from . import config as configmod
from . import reload as reload_mod
from . import upgrade as upgrade_mod
from .config.rules import RuleError, parse_rule, parse_rules_file
from .lock import InstanceLock, LockBusy
from .names import CRASH_LOG
from .runner import JOURNAL_FORMAT, Journal, StepError, apply, rollback_left, stop_on_sigterm, undo_all

DEFAULT_CONFIG = "/etc/pep/pep.toml"


def read_config(path: str) -> tuple[str, str]:
    """The config's text and its sha256."""
    with open(path, "rb") as f:
        data = f.read()
    return data.decode("utf-8", errors="replace"), hashlib.sha256(data).hexdigest()


def load(args):
    info_cc = hostinfo.read("/proc/sys/net/ipv4/tcp_available_congestion_control")
    cfg = configmod.load(args.config, available_cc=set(info_cc.split()) if info_cc else None)
    return cfg, hostinfo.gather(cfg.host.nic, service.unit_user())


def locked(cfg, command: str, args) -> InstanceLock:
    n = cfg.instance_names()
    return InstanceLock(n.lock, cfg.host.instance, command, wait=0 if args.no_wait else args.wait)


def cmd_plan(args, out) -> int:
    cfg, info = load(args)
    if args.upgrade:
        return _plan_upgrade(cfg, info, args, out)
    if args.reload:
        checks.refuse(checks.host_problems(cfg, info))
        journal = Journal(cfg.instance_names().journal)
        if not journal.complete:
            print(f"pepctl plan --reload: instance {cfg.host.instance} is not up; `pepctl plan` shows what `up` "
                  "would do", file=sys.stderr)
            return 1
        steps = reload_mod.steps(cfg, reload_mod.running_config(cfg, journal), info)
        print(f"# pepctl plan --reload for instance {cfg.host.instance} ({args.config}): "
              f"{len(steps)} step(s), each undone if a later one fails", file=out)
    else:
        checks.check(cfg, info)
        steps = plan.build(cfg, info)
        print(f"# pepctl plan for instance {cfg.host.instance} ({args.config})", file=out)
        print(f"# {info.cpus_note}", file=out)
    for step in steps:
        print(f"# {step.what}" + ("  (skipped if already so)" if step.done else ""), file=out)
        print(step.render(), file=out)
    return 0


def _unbuilt(cfg, command: str) -> bool:
    """This checkout's datapath is not built (said): nothing to upgrade to."""
    missing = [obj for obj, _ in plan.datapath(cfg).values() if not os.path.exists(obj)]
    if missing:
        print(f"pepctl {command}: {', '.join(missing)} not built: run scripts/setup (it builds the datapath); "
              "nothing was changed", file=sys.stderr)
    return bool(missing)


def _plan_upgrade(cfg, info, args, out) -> int:
    if os.geteuid() != 0:
        print("pepctl plan --upgrade: must run as root (it reads the running instance's journal and BPF maps)",
              file=sys.stderr)
        return 1
    if _unbuilt(cfg, "plan --upgrade"):
        return 1
    checks.refuse(checks.host_problems(cfg, info))
    journal = Journal(cfg.instance_names().journal)
    if not journal.complete:
        print(f"pepctl plan --upgrade: instance {cfg.host.instance} is not up; `pepctl plan` shows what `up` would do",
              file=sys.stderr)
        return 1
    if os.path.exists(cfg.instance_names().upgrade_journal):
        print(f"# an upgrade of {cfg.host.instance} was cut short: `pepctl upgrade` first finishes or rolls it back",
              file=out)
    try:
        u = upgrade_mod.build(cfg, info, journal) if _upgradable(cfg, journal, "plan --upgrade") else None
    except StepError as e:
        print(f"pepctl plan --upgrade: {e}", file=sys.stderr)
        return 1
    if u is None:
        print(f"instance {cfg.host.instance} runs this pepctl already; an upgrade would change nothing", file=out)
        return 0
    print(f"# pepctl plan --upgrade for instance {cfg.host.instance} ({args.config}): journal format "
          f"{journal.format} -> {JOURNAL_FORMAT}; {len(u.steps)} step(s), each undone if a later one fails", file=out)
    for step in u.steps:
        print(f"# {step.what}", file=out)
        print(step.render(), file=out)
    return 0


def _upgradable(cfg, journal: Journal, command: str) -> bool:
    """True if the running instance is not this pepctl's build; StepError if no upgrade can make it so."""
    if journal.format > JOURNAL_FORMAT:
        raise StepError(f"{upgrade_mod.outdated(cfg, journal)}; nothing was changed")
    return upgrade_mod.outdated(cfg, journal) is not None or journal.meta.get("build") != upgrade_mod.build_digest(cfg)


def _recover(cfg, journal: Journal, out, command: str) -> bool:
    """A reload or an upgrade cut short, finished or rolled back; False (said) if that failed."""
    errors = upgrade_mod.recover(cfg, out) + reload_mod.recover(cfg, journal, out)
    if errors:
        print(f"pepctl {command}: could not roll back an unfinished upgrade or reload:\n  " + "\n  ".join(errors)
              + f"\nrun `pepctl {command}` again to retry, or `pepctl down`", file=sys.stderr)
    return not errors


def _refused(cfg, journal: Journal, command: str) -> bool:
    """The instance is not this pepctl's to change (said): upgrade it first."""
    why = upgrade_mod.refusal(cfg, journal, f"`pepctl {command}`")
    if why:
        print(f"pepctl {command}: {why}", file=sys.stderr)
    return why is not None


def _forget(cfg, journal: Journal, lock: InstanceLock) -> None:
    """The instance is gone: remove its journal, its lock file, and the run folder if now empty."""
    journal.remove()
    Journal(cfg.instance_names().reload_journal).remove()
    Journal(cfg.instance_names().upgrade_journal).remove()
    lock.remove()
    try:
        os.rmdir(cfg.host.run_dir)
    except OSError:
        pass  # not empty (another instance) or already gone


def cmd_up(args, out) -> int:
    cfg, info = load(args)
    n = cfg.instance_names()
    text, digest = read_config(args.config)
    # Before the lock: it is a file in run_dir, and a run_dir that cannot be (under a file, on /proc)
    # is the config's fault, said as plan says it.
    checks.refuse(checks.host_problems(cfg, info))
    if _unbuilt(cfg, "up"):
        return 1
    with locked(cfg, "up", args) as lock:
        journal = Journal(n.journal)
        if journal.exists and journal.complete:
            if not _recover(cfg, journal, out, "up"):
                return 1
            journal = Journal(n.journal)
            if _refused(cfg, journal, "up"):
                return 1
            if journal.meta.get("config_sha256") != digest:
                print(f"pepctl up: instance {cfg.host.instance} is up with another config; run `pepctl reload` "
                      "to apply changes, or `pepctl down` first", file=sys.stderr)
                return 1
            found = status.problems(cfg)
            if found:
                print(f"pepctl up: instance {cfg.host.instance} is up but damaged: {'; '.join(found)}. "
                      "Run `pepctl down` then `pepctl up`.", file=sys.stderr)
                return 1
            print(f"instance {cfg.host.instance} is already up with this config; nothing changed", file=out)
            return 0
        if journal.exists:
            print(f"a previous `up` of {cfg.host.instance} did not finish: undoing it first", file=out)
            errors = undo_all(journal, log=lambda m: print(m, file=out))
            if errors:
                print("pepctl up: could not undo the previous attempt:\n  " + "\n  ".join(errors), file=sys.stderr)
                return 1
            journal.remove()
        try:
            checks.refuse(checks.taken(cfg))
            steps = plan.build(cfg, info)
        except configmod.ConfigError:
            _forget(cfg, journal, lock)   # refused before anything was made: not even the lock stays
            raise
        journal.start({"format": JOURNAL_FORMAT, "config": os.path.abspath(args.config), "config_sha256": digest,
                       "config_text": text, "datapath": plan.datapath_digest(cfg),
                       "build": upgrade_mod.build_digest(cfg), "started": time.time(), "pid": os.getpid()})
        print(f"bringing up instance {cfg.host.instance} on {cfg.host.nic} ({info.cpus_note})", file=out)
        try:
            apply(steps, journal, log=lambda m: print(m, file=out))
        except (StepError, OSError) as e:
            if journal.undo:
                print(f"pepctl up: {e}\n{rollback_left(journal, '`pepctl down`')}", file=sys.stderr)
                return 1
            _forget(cfg, journal, lock)
            print(f"pepctl up: {e}\nnothing is left of this attempt", file=sys.stderr)
            return 1
        except BaseException:
            if journal.undo:
                print(f"pepctl up: interrupted\n{rollback_left(journal, '`pepctl down`')}", file=sys.stderr)
            else:
                _forget(cfg, journal, lock)
            raise
        journal.mark_complete()
    print(f"instance {cfg.host.instance} is up: {len(cfg.graphs)} graph(s)", file=out)
    return 0


def cmd_down(args, out) -> int:
    try:
        cfg = configmod.load(args.config)
    except configmod.ConfigError as e:
        # What to undo is in the journal, not the config: a config this pepctl no longer takes (its
        # checks grew since `up`) must not keep an instance up. [host] finds the journal.
        cfg = configmod.load(args.config, host_only=True)
        print(f"pepctl down: notice: {args.config} no longer passes the checks ({e.errors[0]}); "
              "taking down what the journal says was made", file=sys.stderr)
    n = cfg.instance_names()
    if not os.path.exists(n.journal):
        print(f"instance {cfg.host.instance} is not up (no {n.journal}); nothing to do", file=out)
        return 0
    with locked(cfg, "down", args) as lock:
        journal = Journal(n.journal)
        if not journal.exists:   # taken down while we waited for the lock
            print(f"instance {cfg.host.instance} is not up; nothing to do", file=out)
            return 0
        if journal.format > JOURNAL_FORMAT:
            print(f"pepctl down: {upgrade_mod.outdated(cfg, journal)}: its `down` knows what it made; nothing was "
                  "changed", file=sys.stderr)
            return 1
        # An upgrade or a reload cut short first: an upgrade's undos put back what the instance's
        # journal knows (or, all its steps done, the journal is rewritten: read it again). What of
        # them fails is moot once the instance is gone.
        for e in upgrade_mod.recover(cfg, out):
            print(f"pepctl down: notice: rolling back an unfinished upgrade: {e}", file=sys.stderr)
        journal = Journal(n.journal)
        for e in reload_mod.recover(cfg, journal, out):
            print(f"pepctl down: notice: rolling back an unfinished reload: {e}", file=sys.stderr)
        errors = undo_all(journal, log=lambda m: print(m, file=out))
        if errors:
            for e in errors:
                print(f"pepctl down: {e}", file=sys.stderr)
            print(f"pepctl down: {len(errors)} undo step(s) failed; the journal keeps them: re-run `pepctl down`",
                  file=sys.stderr)
            return 1
        _forget(cfg, journal, lock)
    print(f"instance {cfg.host.instance} is down", file=out)
    return 0


def cmd_status(args, out) -> int:
    cfg = configmod.load(args.config)
    report = status.collect(cfg)
    if args.json:
        json.dump(report, out, indent=2)
        print(file=out)
    else:
        status.print_table(report, out)
    return 0 if report["state"] in ("up", "down") else 1


def cmd_subscribers(args, out) -> int:
    cfg = configmod.load(args.config)
    if args.top < 0:
        print(f"pepctl subscribers: --top {args.top}: give how many to show (0: all)", file=sys.stderr)
        return 2
    graph = _graph(cfg, args.graph).name if args.graph else None    # (None: every graph)
    try:
        got = subscribers.collect(cfg, args.address, graph, args.top, args.all)
    except subscribers.Refused as e:
        print(f"pepctl subscribers: {e}", file=sys.stderr)
        return 2 if isinstance(e, subscribers.BadSelector) else 1
    if args.json:
        json.dump(got, out, indent=2)
        print(file=out)
    else:
        subscribers.print_table(got, out)
    for sel in got["unmatched"]:
        print(f"pepctl subscribers: {sel}: pep_radio has no state for it (no flow of it ran pep_radio in "
              f"{'graph ' + args.graph if args.graph else 'these graphs'}, or its entry was evicted)", file=sys.stderr)
    return 1 if got["unmatched"] and not got["subscribers"] else 0


def cmd_reload(args, out) -> int:
    cfg, info = load(args)
    text, digest = read_config(args.config)
    checks.refuse(checks.host_problems(cfg, info))
    with locked(cfg, "reload", args):
        journal = Journal(cfg.instance_names().journal)
        if journal.exists and (not _recover(cfg, journal, out, "reload") or
                               _refused(cfg, Journal(journal.path), "reload")):
            return 1
        try:
            return reload_mod.reload(cfg, info, Journal(cfg.instance_names().journal), text, digest, out)
        except StepError as e:
            print(f"pepctl reload: {e}", file=sys.stderr)
            return 1


def cmd_upgrade(args, out) -> int:
    try:
        cfg, info = load(args)
    except configmod.ConfigError as e:
        print(f"pepctl upgrade: {args.config} no longer passes this pepctl's checks:\n{e}\nAn upgrade in place keeps "
              "the config the instance runs, so it must pass both pepctls: take the instance down (with either one), "
              "mend the config, and bring it up with this one; nothing was changed", file=sys.stderr)
        return 2
    _, digest = read_config(args.config)
    if _unbuilt(cfg, "upgrade"):
        return 1
    checks.refuse(checks.host_problems(cfg, info))
    n = cfg.instance_names()
    with locked(cfg, "upgrade", args):
        journal = Journal(n.journal)
        if not journal.complete:
            print(f"pepctl upgrade: instance {cfg.host.instance} is not up" + (" (an `up` did not finish: `pepctl up` "
                  "or `pepctl down` first)" if journal.exists else "; `pepctl up` brings it up with this pepctl"),
                  file=sys.stderr)
            return 1
        try:
            if not _recover(cfg, journal, out, "upgrade"):
                return 1
            journal = Journal(n.journal)
            if not _upgradable(cfg, journal, "upgrade"):
                print(f"instance {cfg.host.instance} runs this pepctl already (journal format {JOURNAL_FORMAT}, this "
                      "checkout's datapath and code); nothing changed", file=out)
                return 0
            if journal.meta.get("config_sha256") != digest:
                print(f"pepctl upgrade: {args.config} has changed since instance {cfg.host.instance} came up (or was "
                      "last reloaded): an upgrade keeps the config the instance runs. Put the file back as it was, "
                      "upgrade, then change it and `pepctl reload`; nothing was changed", file=sys.stderr)
                return 1
            return upgrade_mod.upgrade(cfg, info, journal, out)
        except StepError as e:
            print(f"pepctl upgrade: {e}", file=sys.stderr)
            return 1


def _graph(cfg, name: str | None):
    if name is None:
        if len(cfg.graphs) == 1:
            return cfg.graphs[0]
        raise SystemExit(f"pepctl: {cfg.path} has {len(cfg.graphs)} graphs; say which with --graph "
                         f"({', '.join(g.name for g in cfg.graphs)})")
    for g in cfg.graphs:
        if g.name == name:
            return g
    raise SystemExit(f"pepctl: no graph {name!r} in {cfg.path}; graphs: {', '.join(g.name for g in cfg.graphs)}")


def cmd_bypass(args, out) -> int:
    cfg = configmod.load(args.config)
    n = cfg.instance_names()
    if not os.path.exists(n.journal):
        print(f"pepctl bypass: instance {cfg.host.instance} is not up; rules in the config apply at `up`",
              file=sys.stderr)
        return 1
    g = _graph(cfg, args.graph)
    if not g.proxy.enabled:
        print(f"pepctl bypass: graph {g.name} has no proxy: every flow is forwarded already", file=sys.stderr)
        return 1
    if args.action == "list":
        return _bypass_list(cfg, g, args, out)
    try:
        rules = rules_of(args) if args.action != "sync" else []
    except RuleError as e:
        print(f"pepctl bypass {args.action}: {e}", file=sys.stderr)
        return 2
    with locked(cfg, f"bypass {args.action}", args):
        journal = Journal(n.journal)
        if _refused(cfg, journal, f"bypass {args.action}"):
            return 1
        if args.action == "sync":
            old = bypass.config_rules(_old_config(journal, cfg, g).bypass) if journal.complete else set()
            added, removed = bypass.sync(cfg, g, old)
            print(f"graph {g.name}: {added} bypass rule(s) installed, {removed} removed", file=out)
            return 0
        return _bypass_change(cfg, installed_config(journal, cfg), g, args, rules, out)


def _bypass_list(cfg, g, args, out) -> int:
    live = bypass.read_live(cfg, g)
    from_config = bypass.config_rules(g.bypass)
    rules = [{**r.as_json(), "source": "config"} for r in sorted(from_config)]
    rules += [{**r.as_json(), "source": "live"} for r in sorted(live - from_config)]
    if args.json:
        why = upgrade_mod.outdated(cfg, Journal(cfg.instance_names().journal))
        # The counters' layout is this pepctl's: an instance not yet upgraded has another.
        counters = {"unavailable": f"{why}; `pepctl upgrade` first"} if why else bypass.counters(cfg, g)
        json.dump({"graph": g.name, "rules": rules, "counters": counters}, out, indent=2)
        print(file=out)
    else:
        for r in rules:
            print(f"{r['kind']:<7} {r['value']:<24} ({r['source']})", file=out)
        if not rules:
            print(f"graph {g.name}: no bypass rules", file=out)
    return 0


def _bypass_change(cfg, installed, g, args, rules, out) -> int:
    live = bypass.read_live(cfg, g)
    from_config = bypass.config_rules(g.bypass)
    # One rule is named in the messages; a file's rules are counted.
    what = f"{rules[0].kind} {rules[0].value}" if not args.from_file else \
        f"{len(set(rules))} rule(s) from {args.from_file}"
    if args.action == "add":
        started = time.monotonic()
        try:
            done = bypass.add(cfg, installed, g, rules)
        except RuleError as e:
            print(f"pepctl bypass add: {e}", file=sys.stderr)
            return 1
        took = time.monotonic() - started
        bypass.write_live(cfg, g, live | set(rules))
        print(f"graph {g.name}: bypass {what} added (new flows only); maps written in {took:.3f} s "
              f"({done['method']})", file=out)
        return 0
    refused = sorted(r for r in set(rules) if r in from_config)
    if refused:
        names = ", ".join(f"{r.kind} {r.value}" for r in refused[:5]) + (" ..." if len(refused) > 5 else "")
        one = len(refused) == 1
        print(f"pepctl bypass del: {names} {'is' if one else 'are'} in {cfg.path} [graph.bypass]; remove "
              f"{'it' if one else 'them'} there and run `pepctl reload`; nothing was changed", file=sys.stderr)
        return 1
    gone = set(rules) & live
    if not gone:
        none = f"none of the {what} is live" if args.from_file else f"no live bypass rule {what}"
        print(f"graph {g.name}: {none}; nothing to do", file=out)
        return 0
    bypass.remove(cfg, g, gone)
    bypass.write_live(cfg, g, live - gone)
    live_ones = f", {len(gone)} of them live" if args.from_file else ""
    print(f"graph {g.name}: bypass {what} removed{live_ones} (new flows only)", file=out)
    return 0


def rules_of(args) -> list:
    """The rules an add/del names: KIND VALUE on the command line, or --from-file FILE."""
    if args.from_file:
        if args.kind:
            raise RuleError("give either a rule (KIND VALUE) or --from-file FILE, not both")
        try:
            return parse_rules_file(args.from_file)
        except OSError as e:
            raise RuleError(f"{args.from_file}: {e.strerror}; give a file of rules, "
                                   "one `KIND VALUE` a line") from None
    if not args.kind or not args.value:
        raise RuleError("give a rule: client NETWORK | server NETWORK | port PORT[-PORT], "
                               "or --from-file FILE")
    return [parse_rule(args.kind, args.value)]


def installed_config(journal: Journal, cfg):
    """The config the last up/reload installed (its rules are in the maps). One that this pepctl no
    longer accepts (its checks grew stricter) counts as the current one."""
    if not journal.complete:
        return cfg
    try:
        return configmod.parse(journal.meta["config_text"], journal.meta["config"])
    except configmod.ConfigError:
        return cfg


def _old_config(journal: Journal, cfg, g):
    """The graph as the last up/reload installed it (its config rules are in the maps)."""
    return next((o for o in installed_config(journal, cfg).graphs if o.name == g.name), g)


def cmd_drain(args, out) -> int:
    cfg = configmod.load(args.config)
    n = cfg.instance_names()
    with locked(cfg, "drain", args):
        journal = Journal(n.journal)
        if not journal.complete:
            print(f"pepctl drain: instance {cfg.host.instance} is not up", file=sys.stderr)
            return 1
        if _refused(cfg, journal, "drain"):
            return 1
        try:
            drain.check_drainable(cfg)
            if args.undo:
                return drain.undo(cfg, out)
            return drain.drain(cfg, installed_config(journal, cfg), args.timeout, out)
        except (StepError, RuleError) as e:
            print(f"pepctl drain: {e}", file=sys.stderr)
            return 1


def cmd_supervise(args, out) -> int:
    return supervise.main(args.instance_dir)


def cmd_keep(args, out) -> int:
    return service.keep(args.instance_dir, args.journal, args.go_fd, args.unit)


def cmd_exporter(args, out) -> int:
    return exporter.serve(args.instance_dir)


def cmd_report(args, out) -> int:
    cfg = configmod.load(args.config)
    return report.run(args, args.log or cfg.instance_names().experiment_log, out)


COMMANDS = {
    "plan": (cmd_plan, "print the exact commands `up` would run; change nothing"),
    "up": (cmd_up, "bring the instance up (no-op if already up with this config)"),
    "down": (cmd_down, "remove everything `up` made, and nothing else"),
    "status": (cmd_status, "report state, what new flows get, HAProxy sessions and datapath counters"),
    "subscribers": (cmd_subscribers, "pep_radio's estimate per subscriber: rate, window, minimum RTT, queue, "
                                     "outages"),
    "reload": (cmd_reload, "apply a changed proxy config without dropping connections (plan --reload: how)"),
    "upgrade": (cmd_upgrade, "take over an instance another pepctl brought up, in place, dropping no connection "
                             "(plan --upgrade: how)"),
    "bypass": (cmd_bypass, "per-flow bypass rules: add|del|list|sync (new flows only)"),
    "report": (cmd_report, "the PEP's gain on live traffic: the experiment's treated vs control flows"),
    "drain": (cmd_drain, "[routing] hand this host's shares to their other hosts, losing no connection"),
    "supervise": (cmd_supervise, "(run by the supervisor's unit or keeper) supervise HAProxy"),
    "exporter": (cmd_exporter, "(run by the exporter's unit or keeper) serve the instance's metrics"),
    "keep": (cmd_keep, "(run by `up` where there is no systemd) keep the supervisor or the exporter running"),
}
NO_CONFIG = ("supervise", "exporter", "keep")
LOCKING = ("up", "down", "reload", "upgrade", "bypass", "drain")


def main(argv: list[str] | None = None, out=sys.stdout) -> int:
    ap = argparse.ArgumentParser(prog="pepctl", description=__doc__.splitlines()[0])
    ap.add_argument("-c", "--config", default=DEFAULT_CONFIG, help=f"config file (default {DEFAULT_CONFIG})")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        if name in LOCKING:
            p.add_argument("--wait", type=float, default=600, metavar="SECONDS",
                           help="how long to wait for another command holding the instance's lock (default 600)")
            p.add_argument("--no-wait", action="store_true", help="do not wait for the lock: say who holds it")
        if name == "status":
            p.add_argument("--json", action="store_true", help="machine-readable output")
        if name == "subscribers":
            p.add_argument("address", nargs="*", help="only these addresses or networks (198.18.0.10, 2001:2::/48)")
            p.add_argument("--graph", "-g", help="only this graph")
            p.add_argument("--top", type=int, default=subscribers.TOP,
                           help="at most this many, fastest first (default %(default)s; 0: all)")
            p.add_argument("--all", action="store_true", help="stale entries too (silent for 30 s: they start over)")
            p.add_argument("--json", action="store_true", help="machine-readable output")
        if name == "plan":
            which = p.add_mutually_exclusive_group()
            which.add_argument("--reload", action="store_true",
                               help="what `reload` would change in the running instance, step by step")
            which.add_argument("--upgrade", action="store_true",
                               help="what `upgrade` would change in the running instance, step by step")
        if name == "bypass":
            p.add_argument("action", choices=("add", "del", "list", "sync"))
            p.add_argument("kind", nargs="?", help="client | server | port")
            p.add_argument("value", nargs="?", help="a network (198.18.0.0/24, 2001:2::/48) or a port (80, 8000-8080)")
            p.add_argument("--graph", "-g", help="which graph (needed when there are several)")
            p.add_argument("--json", action="store_true", help="with list: machine-readable output")
            p.add_argument("--from-file", metavar="FILE",
                           help="with add/del: the rules of FILE, one `KIND VALUE` a line (# comments); "
                                "all or nothing")
        if name in NO_CONFIG:
            p.add_argument("instance_dir", metavar="INSTANCE_DIR")
        if name == "keep":
            p.add_argument("journal", metavar="JOURNAL")
            p.add_argument("--go-fd", type=int, help="start once a byte arrives on this fd (`up` recorded the PID)")
            p.add_argument("--unit", default=service.SUPERVISOR_UNIT, help="the unit to run (default %(default)s)")
        if name == "report":
            report.add_arguments(p)
        if name == "drain":
            p.add_argument("--timeout", type=float, default=600, metavar="SECONDS",
                           help="withdraw the shares after this long even if connections remain (default 600)")
            p.add_argument("--undo", action="store_true", help="announce the shares again")
    args = ap.parse_args(argv)
    args.config = os.path.abspath(args.config)
    if args.command not in ("plan", "supervise") and os.geteuid() != 0:
        print(f"pepctl {args.command}: must run as root (it changes namespaces, links and BPF maps)",
              file=sys.stderr)
        return 1
    stop_on_sigterm()   # (supervise and the exporter install handlers of their own)
    try:
        return COMMANDS[args.command][0](args, out)
    except KeyboardInterrupt:
        print(f"pepctl {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`pepctl bypass list | head`): not an error of ours.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except configmod.ConfigError as e:
        print(f"pepctl {args.command}: invalid config:\n{e}", file=sys.stderr)
        return 2
    except LockBusy as e:
        print(f"pepctl {args.command}: {e}", file=sys.stderr)
        return 1
    except FileNotFoundError as e:
        if e.filename == args.config:
            print(f"pepctl {args.command}: {e.filename}: no such file; give the config with -c FILE",
                  file=sys.stderr)
            return 2
        return unexpected(args, e)
    except Exception as e:   # noqa: BLE001 - the one place that turns a bug into a message
        return unexpected(args, e)


def unexpected(args, e: BaseException) -> int:
    """No traceback reaches the operator: one line says what failed and where the details went."""
    where = CRASH_LOG
    try:
        os.makedirs(os.path.dirname(CRASH_LOG), exist_ok=True)
        with open(CRASH_LOG, "a") as f:
            f.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S')} pepctl {' '.join(sys.argv[1:])} (pid {os.getpid()})\n")
            f.write("".join(traceback.format_exception(e)))
    except OSError:
        where = "nowhere (could not write " + CRASH_LOG + ")"
    print(f"pepctl {args.command}: unexpected error: {type(e).__name__}: {e}; this is a bug in pepctl, the details "
          f"are in {where}", file=sys.stderr)
    return 70


if __name__ == "__main__":
    sys.exit(main())
