"""The host's register of running instances: one JSON file per instance in /run/pep-instances,
written first by `up` and removed last by `down`.

What others read there: `plan` refuses an instance that would collide with a running one
(pepctl/checks.py conflicts), and the last instance using a congestion control that pepctl
registered is the one that unregisters it (pepctl/congestion.py), so each entry names the
congestion controls its routes select.
"""

from __future__ import annotations

import json
import os

from .config import Config
from .names import REGISTER
from .runner import write_file


def netns_id() -> list[int]:
    """This process's network namespace, as (device, inode) of /proc/self/ns/net."""
    st = os.stat("/proc/self/ns/net")
    return [st.st_dev, st.st_ino]


def congestion_of(cfg: Config) -> list[str]:
    """The congestion controls an instance's routes select, both sides, every graph."""
    return sorted({s.congestion for g in cfg.graphs for s in (g.access, g.origin)})


# The entry's format ("format"): 1, the entries before the key; 2, with it. Readers take both (every
# key of 1 is in 2); `pepctl upgrade` rewrites an instance's entry in this format.
REGISTER_FORMAT = 2


def register_entry(cfg: Config) -> dict:
    """What the host's register says of an instance that is up: enough to refuse a second one."""
    n = cfg.instance_names()
    return {"format": REGISTER_FORMAT, "instance": cfg.host.instance, "config": cfg.path,
            "run_dir": cfg.host.run_dir, "bpf_dir": cfg.host.bpf_dir,
            "journal": n.journal, "pins": n.pins, "nic": cfg.host.nic, "netns": netns_id(),
            "vlans": sorted(v for g in cfg.graphs for v in (g.access.vlan, g.origin.vlan)),
            "metrics": [cfg.host.metrics_address, cfg.host.metrics_port],
            "congestion": congestion_of(cfg)}


def register_text(cfg: Config) -> str:
    """The instance's entry, as its file holds it."""
    return json.dumps(register_entry(cfg), indent=1) + "\n"


def running_instances() -> list[dict]:
    """Entries of the register whose journal still exists (an entry without is a crashed run's)."""
    out = []
    try:
        names = sorted(os.listdir(REGISTER))
    except FileNotFoundError:
        return []
    for name in names:
        try:
            with open(os.path.join(REGISTER, name)) as f:
                entry = json.load(f)
        except (OSError, ValueError):
            continue
        if os.path.exists(entry.get("journal", "")):
            out.append(entry)
    return out


def stop_using(cc: str, journal: str) -> None:
    """Takes cc out of the entry of the instance whose journal is `journal`, as its release of cc runs
    (pepctl/congestion.py, under the host's congestion lock). The entry itself stays until the end of
    that instance's `down`, and for good when a later undo of it fails: counted as a user until then,
    it kept cc registered when it was the last user, and so did the other instance's release when two
    last users went down at once."""
    try:
        names = sorted(os.listdir(REGISTER))
    except FileNotFoundError:
        return
    for name in names:
        path = os.path.join(REGISTER, name)
        try:
            with open(path) as f:
                entry = json.load(f)
        except (OSError, ValueError):
            continue
        if entry.get("journal") == journal and cc in entry.get("congestion", ()):
            entry["congestion"] = [c for c in entry["congestion"] if c != cc]
            write_file(path, json.dumps(entry, indent=1) + "\n")


def users_of(cc: str, *, besides: str | None = None) -> list[dict]:
    """Running instances whose routes select congestion control cc, but the one whose journal is
    besides. An entry of a pepctl older than the "congestion" key uses none of pepctl's own."""
    return [e for e in running_instances() if cc in e.get("congestion", ()) and e.get("journal") != besides]
