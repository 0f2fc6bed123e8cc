"""Congestion controls pepctl brings itself (pep_radio, congestion/): registered with the kernel by
the first instance whose routes select one, shared by every instance of the host, unregistered by
the last one's `down`.

A congestion control is host-wide: one registration serves every instance and graph, and a route
selects it by name (`congctl pep_radio`), which the kernel refuses for a name it does not have. So
`up` registers it before the first route is added (one Step), and the undo of that step, journaled
by every instance that uses it, unregisters it only when no other running instance still does
(the host's register, pepctl/register.py, names each instance's congestion controls). Both run
under one host-wide flock (names.CONGESTION_LOCK), so two instances coming up or going down at
once register it once and never unregister it from under each other.

Registering is congestion/radio-load's work: it loads congestion/radio.bpf.o, registers its
struct_ops map and pins that map and the program's maps in names.congestion_pins(NAME). The kernel
keeps the registration after the loader exits; unregistering is BPF_MAP_DELETE_ELEM of key 0 of the
pinned struct_ops map (bpf(2)), then removing the pins.

Whose registration it is: a pep_radio the kernel lists is pepctl's when the struct_ops map pinned
in pepctl's folder is in use and carries that name. `up` reuses it whoever made it: another
instance, or a crashed run that left no instance behind (then the next `down` of its last user
removes it). A pep_radio registered by anything else (an experiment, `bpftool struct_ops register`)
is refused by `plan` and `up`: its maps are not the ones pepctl writes the graphs' parameters to.
Pins left without a registration (a crash between loading and pinning, an unregister by hand) are
cleared before registering again.

A registration is as old as its first user: a rebuilt congestion/radio.bpf.o takes effect once
every instance using pep_radio has gone down and one comes up again.

Per graph: its parameters (the queue delay target) in the pinned radio_params map, keyed by the
graph namespace's inode number; the undo removes them and the graph's statistics while the
namespace still exists. A subscriber's own state (radio_subs, an LRU map) is left to go stale
(RADIO_STALE_US).
"""

from __future__ import annotations

import os
import struct

from . import bpfsys, radio_maps
from .config import OWN_CONGESTION, Config, FieldError, Graph
from .lock import InstanceLock, LockBusy
from .names import CONGESTION_DIR, CONGESTION_LOCK, REGISTER, congestion_pins, netns_path
from .register import stop_using, users_of
from .runner import Call, Step, StepError, action, remove_dir, run

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AVAILABLE = "/proc/sys/net/ipv4/tcp_available_congestion_control"
BTF = "/sys/kernel/btf/vmlinux"     # BPF struct_ops resolves tcp_congestion_ops through the kernel's BTF
# What registers each of pepctl's own: (object, loader), run as `LOADER OBJECT PINS`.
BUILT = {radio_maps.NAME: (os.path.join(REPO, "congestion", "radio.bpf.o"),
                           os.path.join(REPO, "congestion", "radio-load"))}
assert set(BUILT) == set(OWN_CONGESTION), "every congestion control the config takes as pepctl's own is built here"
OPS_KEY = bytes(4)                  # a struct_ops map's one key
# A struct_ops map's value starts with struct bpf_struct_ops_common_value {refcount_t refcnt;
# enum bpf_struct_ops_state state;}; BPF_STRUCT_OPS_STATE_INUSE: registered.
OPS_STATE = struct.Struct("=4xI")
STATE_INUSE = 1
LOCK_WAIT = 120                     # seconds: a registration takes well under one


def used(cfg: Config) -> list[str]:
    """pepctl's own congestion controls that the instance's routes select."""
    return sorted({s.congestion for g in cfg.graphs for s in (g.access, g.origin)} & set(BUILT))


def radio_graphs(cfg: Config) -> list[Graph]:
    """Graphs whose access side runs pep_radio."""
    return [g for g in cfg.graphs if g.access.congestion == radio_maps.NAME]


def available() -> set[str]:
    try:
        with open(AVAILABLE) as f:
            return set(f.read().split())
    except OSError:
        return set()


def ops_map(pins: str) -> str | None:
    """The struct_ops map pinned in pins (radio-load pins it under its C name), or None."""
    try:
        entries = sorted(os.listdir(pins))
    except FileNotFoundError:
        return None
    for name in entries:
        path = os.path.join(pins, name)
        try:
            with bpfsys.Map(path, read_only=True) as m:
                if m.type == bpfsys.BPF_MAP_TYPE_STRUCT_OPS:
                    return path
        except ValueError:
            continue    # not a map
    return None


def registration(cc: str) -> str:
    """"pepctl": the kernel has cc and it is the one pinned in pepctl's folder; "other": the kernel
    has a cc of someone else's; "none". Needs bpf(2) (root) when the kernel has it."""
    if cc not in available():
        return "none"
    path = ops_map(congestion_pins(cc))
    if path is None:
        return "other"
    with bpfsys.Map(path, read_only=True) as m:
        value = m.lookup(OPS_KEY)
    # The value's tcp_congestion_ops holds the name it registered, NUL-terminated.
    if value and OPS_STATE.unpack_from(value)[0] == STATE_INUSE and cc.encode() + b"\0" in value:
        return "pepctl"
    return "other"


def settled_registration(cc: str) -> str:
    """registration(cc) once no pepctl is registering it: between the loader's registering and its
    pinning, pepctl's own reads as someone else's, so "other" is read again under the host's lock.
    No lock file: no pepctl is at it (and none is made here, so `plan` leaves nothing behind)."""
    state = registration(cc)
    if state != "other" or not os.path.exists(CONGESTION_LOCK):
        return state
    try:
        with _host_lock("plan (reads the registration)"):
            return registration(cc)
    except LockBusy:
        return state


def foreign_message(cc: str) -> str:
    return (f"a congestion control named {cc} is registered already, and none in use is pinned in "
            f"{congestion_pins(cc)}, where pepctl pins its own: something other than pepctl registered it, or "
            "pepctl's pins were removed from under its registration. Either way pepctl cannot reach its maps to "
            "set the graphs' parameters. Find it with `bpftool struct_ops list` and unregister it (`bpftool "
            "struct_ops unregister id ID`), then try again")


def problems(cfg: Config) -> list[FieldError]:
    """What keeps `up` from registering the instance's own congestion controls."""
    out = []
    for cc in used(cfg):
        g, side = next((g, s) for g in cfg.graphs for s in ("access", "origin") if getattr(g, s).congestion == cc)
        field = f"graph[{g.index}].{side}.congestion"
        missing = [p for p in BUILT[cc] if not os.path.exists(p)]
        if missing:
            out.append(FieldError(cfg.path, field, cc, f"{' and '.join(missing)} not built: run scripts/setup "
                                  "(it builds congestion/ with make)"))
        if not os.path.exists(BTF):
            out.append(FieldError(cfg.path, field, cc, f"this kernel has no BTF ({BTF}), which a BPF struct_ops "
                                  "congestion control needs to register: use a kernel built with "
                                  'CONFIG_DEBUG_INFO_BTF, or congestion = "bbr"'))
        try:
            state = settled_registration(cc)
        except OSError:
            state = "unknown"   # `plan` without root cannot open the pins: `up` checks again
        if state == "other":
            out.append(FieldError(cfg.path, field, cc, foreign_message(cc)))
    return out


# -- the steps ---------------------------------------------------------------------------------------
def steps(cfg: Config) -> list[Step]:
    """Register each of pepctl's own congestion controls the instance uses (shared, see above)."""
    journal = cfg.instance_names().journal
    out = []
    for cc in used(cfg):
        obj, loader = BUILT[cc]
        pins = congestion_pins(cc)
        show = (f"# under flock {CONGESTION_LOCK}; if pepctl registered {cc} already (another instance): "
                f"nothing, but a notice\nmkdir -p -m 700 {pins}\n{loader} {obj} {pins}")
        undo = (f"under flock {CONGESTION_LOCK}, unless another running instance uses {cc} "
                f"(its entry in {REGISTER}): bpf(2) BPF_MAP_DELETE_ELEM key 0 of the struct_ops map in "
                f"{pins} (unregisters {cc}); rm -r {pins}")
        out.append(Step(f"use congestion control {cc}", Call("congestion_use", (cc, journal), show),
                        undo=Call("congestion_release", (cc, journal), undo)))
    return out


def graph_steps(cfg: Config, g: Graph) -> list[Step]:
    """A pep_radio graph's parameters, once its namespace exists (its inode is the key)."""
    if g.access.congestion != radio_maps.NAME:
        return []
    ns = cfg.graph_names(g).netns
    pins = congestion_pins(radio_maps.NAME)
    where = f"[inode of {netns_path(ns)}]"
    return [Step(f"set pep_radio's parameters of graph {g.name}", _params_call(cfg, g, g.access.queue_target_ms),
                 undo=Call("radio_forget", (pins, ns), f"bpf(2) delete {radio_maps.PARAMS_MAP}{where} and "
                           f"{radio_maps.STATS_MAP}{where} in {pins}"))]


def target_step(cfg: Config, g: Graph, old_target_ms: int) -> Step:
    """`reload`: a pep_radio graph's queue target changed. Its subscribers' entries take it at their
    next connection (radio_start), each flow at its start."""
    return Step(f"pep_radio's queue target of graph {g.name}: {g.access.queue_target_ms} ms (was {old_target_ms})",
                _params_call(cfg, g, g.access.queue_target_ms), undo=_params_call(cfg, g, old_target_ms))


def _params_call(cfg: Config, g: Graph, target_ms: int) -> Call:
    ns = cfg.graph_names(g).netns
    pins = congestion_pins(radio_maps.NAME)
    target = target_ms * 1000
    return Call("radio_params", (pins, ns, target), f"# bpf(2) {pins}/{radio_maps.PARAMS_MAP}[inode of "
                f"{netns_path(ns)}] = {{target_us {target}, flags 0}}")


# -- the actions ---------------------------------------------------------------------------------------
def _host_lock(command: str) -> InstanceLock:
    return InstanceLock(CONGESTION_LOCK, "", command, wait=LOCK_WAIT, what="the host's congestion controls")


@action("congestion_use")
def use(cc: str, journal: str) -> str | None:
    """Registers cc unless pepctl has already: then a notice."""
    pins = congestion_pins(cc)
    try:
        with _host_lock(f"up (use {cc})"):
            state = registration(cc)
            if state == "pepctl":
                return f"{cc} is registered already (pinned in {pins}): this instance shares that registration"
            if state == "other":
                raise StepError(foreign_message(cc))
            _clear_stale(cc, journal)
            os.makedirs(pins, 0o700, exist_ok=True)
            obj, loader = BUILT[cc]
            run([loader, obj, pins])
            if registration(cc) != "pepctl":
                raise StepError(f"{loader} {obj} {pins} succeeded, yet the kernel lists no {cc} pinned there "
                                f"({AVAILABLE}: {' '.join(sorted(available()))})")
    except LockBusy as e:
        raise StepError(str(e)) from None
    return None


def _clear_stale(cc: str, journal: str) -> None:
    """Pins without a registration behind them. Nobody else uses cc: all of them go. Someone does
    (their registration vanished under them): only the dead struct_ops map goes, their parameters
    stay in the maps, which the loader reuses."""
    pins = congestion_pins(cc)
    if not os.path.isdir(pins):
        return
    if not users_of(cc, besides=journal):
        remove_dir(pins)
        return
    dead = ops_map(pins)
    if dead:
        os.unlink(dead)


@action("congestion_release")
def release(cc: str, journal: str) -> str | None:
    """Unregisters cc and removes its pins, unless another running instance uses it (a notice)."""
    pins = congestion_pins(cc)
    notice = None
    try:
        with _host_lock(f"down (release {cc})") as lock:
            stop_using(cc, journal)
            others = users_of(cc, besides=journal)
            if others:
                return (f"{cc} stays registered: instance(s) {', '.join(e['instance'] for e in others)} "
                        "still use it")
            state = registration(cc)
            if state == "pepctl":
                with bpfsys.Map(ops_map(pins)) as m:
                    m.delete(OPS_KEY, missing_ok=True)
                if cc in available():
                    raise StepError(f"unregister {cc}: the kernel still lists it after the delete of key 0 of "
                                    f"{m.path}")
            elif state == "other":
                notice = (f"{cc} stays registered: none in use is pinned in {pins} (something other than pepctl "
                          "registered it, or pepctl's pins were removed from under its registration), so pepctl "
                          "leaves it alone; `bpftool struct_ops list` shows it")
            remove_dir(pins)
            try:
                os.rmdir(CONGESTION_DIR)
            except FileNotFoundError:
                pass
            except OSError:
                return notice   # another of pepctl's own is pinned there: its users keep the lock
            lock.remove()       # nothing of pepctl's own is registered: nothing of them left
    except LockBusy as e:
        raise StepError(str(e)) from None
    return notice


@action("radio_params")
def _radio_params(pins: str, ns: str, target_us: int) -> None:
    radio_maps.set_params(pins, netns_path(ns), target_us)


@action("radio_forget")
def _radio_forget(pins: str, ns: str) -> None:
    radio_maps.forget_graph(pins, netns_path(ns))
