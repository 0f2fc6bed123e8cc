"""Map layouts from BTF, and an entry's conversion from one layout to another: what `pepctl upgrade`
does with a pinned map whose layout a new datapath changed.

A map's layout is its type, flags, maximum entries, and the sizes and fields of its key and value.
Both sides are read from BTF as `bpftool -j btf dump` prints it: a running map's from the kernel
(bpf(2) BPF_OBJ_GET_INFO_BY_FD names its BTF and the types of its key and value), a new object's
from the ELF file's `.maps` section, which is what libbpf creates the maps from. Fields are
compared by name, offset and type; the names of structs are not part of a layout, those of their
fields are (so a field whose meaning changes must change its name: tc/pep_flow.h says so).

What upgrade does with each map of the new object (decide()):

  reuse     the same layout: the new programs are loaded with the running map itself (its pin
            kept), so its entries are whatever both programs write while they overlap;
  convert   fields added, removed or moved, or more entries: each entry is read through bpf(2),
            rebuilt field by field (a field kept is copied, a new one starts at zero, one removed
            is dropped) and written into the new map; an array whose index has a meaning of its
            own (flow_stats: graph slot x counter) has it remapped by a function of the caller's;
  recreate  a map that pepctl fills from the config and the live rules: it starts empty and the
            upgrade writes it again (nothing is lost);
  new       no such map before: it starts empty;
  refuse    anything else: a kernel-managed field (a bpf_timer, a lock) in a layout that changed,
            whose state bpf(2) cannot carry; a map that cannot be walked (a queue, socket storage);
            a field whose type changed. The upgrade names the map and why, and changes nothing.
"""

from __future__ import annotations

import json
import struct
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from . import bpfsys

# enum bpf_map_type, the types whose entries bpf(2) walks and writes back
HASH, ARRAY, PERCPU_HASH, PERCPU_ARRAY, LRU_HASH, LRU_PERCPU_HASH, LPM_TRIE = 1, 2, 5, 6, 9, 10, 11
KEYED = {HASH, PERCPU_HASH, LRU_HASH, LRU_PERCPU_HASH, LPM_TRIE}
INDEXED = {ARRAY, PERCPU_ARRAY}
TYPE_NAMES = {1: "hash", 2: "array", 5: "percpu_hash", 6: "percpu_array", 9: "lru_hash", 10: "lru_percpu_hash",
              11: "lpm_trie", 22: "queue", 23: "stack", 24: "sk_storage", 26: "struct_ops"}
# Types the kernel manages inside a map's value: bpf(2) neither reads nor writes their state.
KERNEL_MANAGED = {"bpf_timer", "bpf_spin_lock", "bpf_res_spin_lock", "bpf_wq", "bpf_list_head", "bpf_list_node",
                  "bpf_rb_root", "bpf_rb_node", "bpf_refcount", "bpf_task_work"}
_QUALIFIERS = {"TYPEDEF", "CONST", "VOLATILE", "RESTRICT", "TYPE_TAG", "DECL_TAG"}
U32 = struct.Struct("=I")   # an array's key: its index


class NotConvertible(ValueError):
    """The entries of a map cannot be carried from one layout to the other; says why."""


@dataclass(frozen=True)
class Field:
    name: str
    offset: int          # bytes
    size: int
    layout: tuple


@dataclass(frozen=True)
class Shape:
    """A key or a value: its size, its canonical layout, its fields (a struct's), and the first
    kernel-managed type in it, if any."""

    size: int
    layout: tuple
    fields: tuple[Field, ...] | None = None
    managed: str | None = None


@dataclass(frozen=True)
class MapDef:
    name: str
    type: int
    max_entries: int
    flags: int
    key: Shape
    value: Shape

    def same(self, other: MapDef) -> bool:
        return (self.type, self.max_entries, self.flags, self.key, self.value) == \
            (other.type, other.max_entries, other.flags, other.key, other.value)


class Types:
    """The types of one BTF (bpftool -j btf dump): sizes, canonical layouts, fields."""

    def __init__(self, dump: dict):
        self.by_id = {t["id"]: t for t in dump.get("types", [])}

    def resolve(self, tid: int) -> tuple[dict | None, str | None]:
        """The type behind typedefs and qualifiers (None: void), and a "kptr" tag met on the way."""
        tag = None
        t = self.by_id.get(tid)
        while t is not None and t["kind"] in _QUALIFIERS:
            if t["kind"] == "TYPE_TAG" and t.get("name", "").startswith("kptr"):
                tag = "kptr"
            t = self.by_id.get(t["type_id"])
        return t, tag

    def size(self, tid: int) -> int:
        t, _ = self.resolve(tid)
        if t is None:
            return 0
        if t["kind"] == "ARRAY":
            return t["nr_elems"] * self.size(t["type_id"])
        if t["kind"] == "PTR":
            return 8
        return t.get("size", 0)

    def layout(self, tid: int) -> tuple:
        t, tag = self.resolve(tid)
        if tag:
            return ("managed", tag)
        if t is None:
            return ("void",)
        kind = t["kind"]
        if kind in ("STRUCT", "UNION") and t.get("name") in KERNEL_MANAGED:
            return ("managed", t["name"], t["size"])
        if kind in ("STRUCT", "UNION"):
            return (kind.lower(), t["size"], tuple((m["name"], m["bits_offset"], m.get("bitfield_size", 0),
                                                    self.layout(m["type_id"])) for m in t["members"]))
        if kind == "ARRAY":
            return ("array", t["nr_elems"], self.layout(t["type_id"]))
        if kind in ("INT", "ENUM", "ENUM64"):
            return ("int", t["size"])
        if kind == "PTR":
            return ("ptr",)
        return (kind.lower(), t.get("size", 0), t.get("name", ""))

    def shape(self, tid: int) -> Shape:
        layout = self.layout(tid)
        t, _ = self.resolve(tid)
        fields = None
        if t is not None and t["kind"] == "STRUCT" and layout[0] == "struct":
            fields = tuple(Field(m["name"], m["bits_offset"] // 8, self.size(m["type_id"]), self.layout(m["type_id"]))
                           for m in t["members"] if not m.get("bitfield_size"))
        return Shape(self.size(tid), layout, fields, managed_in(layout))

    def maps(self) -> dict[str, MapDef]:
        """The map definitions of an object's `.maps` section: __uint(type, ...) and the like are
        pointers to arrays whose length is the number, __type(key, T) a pointer to T."""
        out = {}
        for sec in self.by_id.values():
            if sec["kind"] != "DATASEC" or sec.get("name") != ".maps":
                continue
            for v in sec["vars"]:
                var = self.by_id[v["type_id"]]
                body, _ = self.resolve(var["type_id"])
                members = {m["name"]: m["type_id"] for m in body["members"]}

                def num(name: str, members=members) -> int:
                    if name not in members:
                        return 0
                    arr, _ = self.resolve(self.by_id[members[name]]["type_id"])
                    return arr["nr_elems"]

                def part(name: str, members=members) -> Shape:
                    if name in members:
                        return self.shape(self.by_id[members[name]]["type_id"])
                    size = num(f"{name}_size")
                    return Shape(size, ("bytes", size))

                out[var["name"]] = MapDef(var["name"], num("type"), num("max_entries"), num("map_flags"),
                                          part("key"), part("value"))
        return out


def managed_in(layout: tuple) -> str | None:
    """The first kernel-managed type in a canonical layout, if any."""
    if layout[0] == "managed":
        return layout[1]
    for part in layout:
        if isinstance(part, tuple):
            found = managed_in(part)
            if found:
                return found
    return None


def btf_dump(*source: str) -> dict:
    """`bpftool -j btf dump file OBJ` or `... id ID`."""
    proc = subprocess.run(["bpftool", "-j", "btf", "dump", *source], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise OSError(f"bpftool btf dump {' '.join(source)}: {(proc.stderr or proc.stdout).strip()}")
    return json.loads(proc.stdout)


def object_maps(obj: str) -> dict[str, MapDef]:
    """The maps a BPF object file defines, as libbpf would create them."""
    return Types(btf_dump("file", obj)).maps()


def pinned_map(path: str, btf: dict[int, Types] | None = None) -> MapDef:
    """A running map's definition, from the kernel (btf caches the BTFs read, by id)."""
    with bpfsys.Map(path, read_only=True) as m:
        info = m.info()
    btf = {} if btf is None else btf
    types = None
    if info["btf_id"]:
        types = btf.get(info["btf_id"]) or btf.setdefault(info["btf_id"], Types(btf_dump("id", str(info["btf_id"]))))

    def part(tid: int, size: int) -> Shape:
        return types.shape(tid) if types is not None and tid else Shape(size, ("bytes", size))

    return MapDef(info["name"], info["type"], info["max_entries"], info["map_flags"],
                  part(info["btf_key_type_id"], info["key_size"]), part(info["btf_value_type_id"], info["value_size"]))


# -- what to do with each map ----------------------------------------------------------------------
@dataclass(frozen=True)
class Decision:
    name: str
    action: str          # reuse | convert | recreate | new | refuse
    why: str


def differences(old: MapDef, new: MapDef) -> str:
    out = []
    if old.type != new.type:
        out.append(f"type {TYPE_NAMES.get(old.type, old.type)} -> {TYPE_NAMES.get(new.type, new.type)}")
    if old.max_entries != new.max_entries:
        out.append(f"entries {old.max_entries} -> {new.max_entries}")
    if old.flags != new.flags:
        out.append(f"flags {old.flags:#x} -> {new.flags:#x}")
    for part in ("key", "value"):
        a, b = getattr(old, part), getattr(new, part)
        if a.layout == b.layout:
            continue
        names_a = {f.name for f in a.fields or ()}
        names_b = {f.name for f in b.fields or ()}
        said = f"{part} {a.size} -> {b.size} bytes"
        if names_b - names_a:
            said += f", {', '.join(sorted(names_b - names_a))} added"
        if names_a - names_b:
            said += f", {', '.join(sorted(names_a - names_b))} removed"
        out.append(said)
    return "; ".join(out) or "BTF differs"


def copies(old: Shape, new: Shape) -> list[tuple[int, int, int]]:
    """How to build a new key or value from an old one: (old offset, new offset, size) per field
    kept; what no copy covers is zero. Raises NotConvertible."""
    if old.layout == new.layout:
        return [(0, 0, new.size)]
    for s in (old, new):
        if s.managed:
            raise NotConvertible(f"it holds a {s.managed}, which the kernel manages and bpf(2) cannot carry")
    if old.fields is None or new.fields is None:
        raise NotConvertible(f"its {old.size}-byte type became another of {new.size} bytes, with no fields to "
                             "carry by name")
    before = {f.name: f for f in old.fields}
    out = []
    for f in new.fields:
        o = before.get(f.name)
        if o is None:
            continue
        if o.layout != f.layout:
            raise NotConvertible(f"field {f.name} changed type")
        out.append((o.offset, f.offset, f.size))
    return out


def rebuild(data: bytes, plan: list[tuple[int, int, int]], size: int) -> bytes:
    out = bytearray(size)
    for src, dst, n in plan:
        out[dst:dst + n] = data[src:src + n]
    return bytes(out)


Remap = Callable[[int, int, int], "int | None"]   # (old index, old entries, new entries) -> new index or None


def decide(name: str, old: MapDef | None, new: MapDef, *, refilled: Iterable[str] = (),
           remap: dict[str, Remap] | None = None) -> Decision:
    """What an upgrade does with map name (see the module's docstring). refilled: the maps the
    upgrade writes again from the config and the live rules; remap: index functions of arrays
    whose index has a meaning of its own."""
    if old is None:
        return Decision(name, "new", "new in this version: starts empty")
    blind = [part for part in ("key", "value") if getattr(old, part).layout[0] == "bytes"]
    if blind:
        # The kernel keeps no BTF for some maps' keys or values (a queue's): sizes are all it can say.
        seen = {part: Shape(getattr(new, part).size, ("bytes", getattr(new, part).size)) for part in blind}
        new = MapDef(new.name, new.type, new.max_entries, new.flags, seen.get("key", new.key),
                     seen.get("value", new.value))
    if old.same(new):
        return Decision(name, "reuse", "same layout: kept as it is" if not blind else
                        f"same size of {' and '.join(blind)} (the kernel keeps no BTF of them): kept as it is")
    what = differences(old, new)
    try:
        if old.type != new.type:
            raise NotConvertible("its type changed")
        if old.type not in KEYED | INDEXED:
            raise NotConvertible(f"a {TYPE_NAMES.get(old.type, old.type)} map cannot be walked through bpf(2)")
        if name in (remap or {}) and (old.type not in INDEXED or old.value.layout != new.value.layout):
            raise NotConvertible("its index has a meaning of its own, kept only in an array of the same values")
        copies(old.key, new.key)
        copies(old.value, new.value)
    except NotConvertible as e:
        if name in set(refilled):
            return Decision(name, "recreate", f"{what}: recreated empty, and pepctl writes it again from the config "
                                              "and the live rules")
        return Decision(name, "refuse", f"{what}: {e}")
    how = "entries carried by index" if name in (remap or {}) else "entries converted field by field"
    return Decision(name, "convert", f"{what}: {how}")


# -- carrying the entries --------------------------------------------------------------------------
def convert(old_path: str, new_path: str, old: MapDef, new: MapDef, remap: Remap | None = None) -> int:
    """Reads every entry of the running map through bpf(2), rebuilds it in the new layout and writes
    it into the new map; returns how many entries were written. An array's entries that are all
    zero are not written (the new map starts so)."""
    key_plan, value_plan = copies(old.key, new.key), copies(old.value, new.value)
    written = 0
    with bpfsys.Map(old_path, read_only=True) as src, bpfsys.Map(new_path) as dst:
        if old.type in INDEXED:
            pairs = ((U32.pack(i), i) for i in range(old.max_entries))
        else:
            pairs = ((k, None) for k in list(src.keys()))
        for key, index in pairs:
            if index is not None:
                at = remap(index, old.max_entries, new.max_entries) if remap else index
                if at is None or at >= new.max_entries:
                    continue
                new_key = U32.pack(at)
            else:
                new_key = rebuild(key, key_plan, new.key.size)
            if src.percpu:
                values = src.lookup_percpu(key)
                if values is None or (index is not None and not any(any(v) for v in values)):
                    continue
                dst.update_percpu(new_key, [rebuild(v, value_plan, new.value.size) for v in values])
            else:
                value = src.lookup(key)
                if value is None or (index is not None and not any(value)):
                    continue   # gone meanwhile, or an array's zero entry
                dst.update(new_key, rebuild(value, value_plan, new.value.size))
            written += 1
    return written
