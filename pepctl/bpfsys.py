"""A small stdlib-only wrapper of the bpf(2) syscall, for pinned maps and programs.

Generic on purpose: keys and values are bytes, and the caller packs them (the layouts of
the steering maps live in pepctl/steering.py and tc/pep_steer.h). Two layers:

- functions on file descriptors (obj_get, map_lookup, map_update, ...), the thin syscall;
- Map and Prog, which open a pinned path, learn the map's sizes from /proc/self/fdinfo,
  check the sizes of what they are given, and name the path in every error.

Every failure of the syscall raises OSError (or its errno subclass, e.g. FileNotFoundError)
with the errno and a message "<BPF command> <path or fd>: <cause>".
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
from dataclasses import dataclass

# bpf(2) syscall numbers: the generic table (arm64 and others) and x86_64.
_NR_BPF = {"x86_64": 321, "aarch64": 280}

# Commands (enum bpf_cmd in linux/bpf.h)
BPF_MAP_LOOKUP_ELEM = 1
BPF_MAP_UPDATE_ELEM = 2
BPF_MAP_DELETE_ELEM = 3
BPF_MAP_GET_NEXT_KEY = 4
BPF_OBJ_GET = 7
BPF_PROG_ATTACH = 8
BPF_PROG_DETACH = 9
BPF_PROG_TEST_RUN = 10
BPF_OBJ_GET_INFO_BY_FD = 15
BPF_MAP_LOOKUP_AND_DELETE_ELEM = 21
BPF_MAP_UPDATE_BATCH = 26

_CMD_NAMES = {
    BPF_MAP_LOOKUP_ELEM: "BPF_MAP_LOOKUP_ELEM",
    BPF_MAP_UPDATE_ELEM: "BPF_MAP_UPDATE_ELEM",
    BPF_MAP_DELETE_ELEM: "BPF_MAP_DELETE_ELEM",
    BPF_MAP_GET_NEXT_KEY: "BPF_MAP_GET_NEXT_KEY",
    BPF_OBJ_GET: "BPF_OBJ_GET",
    BPF_PROG_ATTACH: "BPF_PROG_ATTACH",
    BPF_PROG_DETACH: "BPF_PROG_DETACH",
    BPF_OBJ_GET_INFO_BY_FD: "BPF_OBJ_GET_INFO_BY_FD",
    BPF_PROG_TEST_RUN: "BPF_PROG_TEST_RUN",
    BPF_MAP_UPDATE_BATCH: "BPF_MAP_UPDATE_BATCH",
    BPF_MAP_LOOKUP_AND_DELETE_ELEM: "BPF_MAP_LOOKUP_AND_DELETE_ELEM",
}

# Update flags
BPF_ANY = 0
BPF_NOEXIST = 1
BPF_EXIST = 2

# BPF_OBJ_GET file flags
BPF_F_RDONLY = 1 << 3

# BPF_PROG_ATTACH: attach types and flags
BPF_CGROUP_SOCK_OPS = 3
BPF_F_ALLOW_MULTI = 1 << 1
BPF_F_REPLACE = 1 << 2

# A congestion control (or other kernel ops table) written in BPF: one key, 0; deleting it unregisters
BPF_MAP_TYPE_STRUCT_OPS = 26

# Map types whose values are one slot per possible CPU
PERCPU_MAP_TYPES = {
    5,   # BPF_MAP_TYPE_PERCPU_HASH
    6,   # BPF_MAP_TYPE_PERCPU_ARRAY
    10,  # BPF_MAP_TYPE_LRU_PERCPU_HASH
    21,  # BPF_MAP_TYPE_PERCPU_CGROUP_STORAGE
}

_HINTS = {
    errno.EPERM: "needs root (CAP_BPF/CAP_SYS_ADMIN)",
    errno.EACCES: "needs root (CAP_BPF/CAP_SYS_ADMIN)",
    errno.ENOSYS: "this kernel has no bpf(2) syscall",
}


# The members of union bpf_attr that we use. ctypes aligns the u64 fields as the kernel's
# __aligned_u64 does, so these match the kernel layout on 64-bit hosts.
class _ObjAttr(ctypes.Structure):
    _fields_ = [
        ("pathname", ctypes.c_uint64),
        ("bpf_fd", ctypes.c_uint32),
        ("file_flags", ctypes.c_uint32),
        ("path_fd", ctypes.c_int32),
    ]


class _ElemAttr(ctypes.Structure):
    _fields_ = [
        ("map_fd", ctypes.c_uint32),
        ("key", ctypes.c_uint64),
        ("value", ctypes.c_uint64),  # next_key for BPF_MAP_GET_NEXT_KEY
        ("flags", ctypes.c_uint64),
    ]


class _BatchAttr(ctypes.Structure):
    _fields_ = [
        ("in_batch", ctypes.c_uint64),
        ("out_batch", ctypes.c_uint64),
        ("keys", ctypes.c_uint64),
        ("values", ctypes.c_uint64),
        ("count", ctypes.c_uint32),
        ("map_fd", ctypes.c_uint32),
        ("elem_flags", ctypes.c_uint64),
        ("flags", ctypes.c_uint64),
    ]


class _AttachAttr(ctypes.Structure):
    _fields_ = [
        ("target_fd", ctypes.c_uint32),
        ("attach_bpf_fd", ctypes.c_uint32),
        ("attach_type", ctypes.c_uint32),
        ("attach_flags", ctypes.c_uint32),
        ("replace_bpf_fd", ctypes.c_uint32),
    ]


class _InfoAttr(ctypes.Structure):
    _fields_ = [
        ("bpf_fd", ctypes.c_uint32),
        ("info_len", ctypes.c_uint32),
        ("info", ctypes.c_uint64),
    ]


# struct bpf_map_info, the fields upgrades read (pepctl/layouts.py): the rest of it follows.
_MAP_INFO = struct.Struct("=IIIIII16sIIQQIIII")
_MAP_INFO_FIELDS = ("type", "id", "key_size", "value_size", "max_entries", "map_flags", "name", "ifindex",
                    "btf_vmlinux_value_type_id", "netns_dev", "netns_ino", "btf_id", "btf_key_type_id",
                    "btf_value_type_id", "btf_vmlinux_id")
_PROG_INFO = struct.Struct("=II8s")       # struct bpf_prog_info: type, id, tag


class _TestRunAttr(ctypes.Structure):
    _fields_ = [
        ("prog_fd", ctypes.c_uint32),
        ("retval", ctypes.c_uint32),
        ("data_size_in", ctypes.c_uint32),
        ("data_size_out", ctypes.c_uint32),
        ("data_in", ctypes.c_uint64),
        ("data_out", ctypes.c_uint64),
        ("repeat", ctypes.c_uint32),
        ("duration", ctypes.c_uint32),
        ("ctx_size_in", ctypes.c_uint32),
        ("ctx_size_out", ctypes.c_uint32),
        ("ctx_in", ctypes.c_uint64),
        ("ctx_out", ctypes.c_uint64),
        ("flags", ctypes.c_uint32),
        ("cpu", ctypes.c_uint32),
        ("batch_size", ctypes.c_uint32),
    ]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _bpf(cmd: int, attr: ctypes.Structure, what: str) -> int:
    nr = _NR_BPF.get(platform.machine())
    if nr is None:
        raise OSError(errno.ENOSYS, f"{_CMD_NAMES[cmd]} {what}: no bpf(2) number known for "
                                    f"{platform.machine()}; add it to pepctl/bpfsys.py _NR_BPF")
    ret = _libc.syscall(ctypes.c_long(nr), ctypes.c_int(cmd), ctypes.byref(attr),
                        ctypes.c_uint(ctypes.sizeof(attr)))
    if ret < 0:
        err = ctypes.get_errno()
        cause = os.strerror(err)
        if err in _HINTS:
            cause += f" ({_HINTS[err]})"
        raise OSError(err, f"{_CMD_NAMES[cmd]} {what}: {cause}")
    return ret


def _buf(data: bytes) -> ctypes.Array:
    # create_string_buffer(bytes) would add a NUL; give it the exact size.
    return ctypes.create_string_buffer(bytes(data), len(data))


def _addr(buf: ctypes.Array | None) -> int:
    return ctypes.addressof(buf) if buf is not None else 0


def _round8(n: int) -> int:
    return (n + 7) & ~7


def possible_cpus() -> int:
    """Number of possible CPUs: the count of per-CPU slots the kernel copies for a per-CPU map."""
    path = "/sys/devices/system/cpu/possible"
    with open(path) as f:
        text = f.read().strip()
    count = 0
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        count += int(hi or lo) - int(lo) + 1
    return count


def obj_get(path: str, read_only: bool = False) -> int:
    """Opens a pinned BPF object (map or program) and returns a new fd."""
    p = ctypes.create_string_buffer(os.fsencode(path))
    attr = _ObjAttr(pathname=_addr(p), file_flags=BPF_F_RDONLY if read_only else 0)
    try:
        return _bpf(BPF_OBJ_GET, attr, path)
    except OSError as e:
        if e.errno == errno.ENOENT:
            raise OSError(e.errno, f"{e.strerror} (is bpffs mounted at /sys/fs/bpf and the object "
                                   f"pinned there?)") from None
        raise


def map_lookup(fd: int, key: bytes, value_size: int, *, name: str = "") -> bytes | None:
    """The value at key (value_size bytes; for per-CPU maps ncpus * round8(size)), None if absent."""
    k, v = _buf(key), ctypes.create_string_buffer(value_size)
    attr = _ElemAttr(map_fd=fd, key=_addr(k), value=_addr(v))
    try:
        _bpf(BPF_MAP_LOOKUP_ELEM, attr, name or f"fd {fd}")
    except FileNotFoundError:
        return None
    return v.raw


def map_lookup_percpu(fd: int, key: bytes, value_size: int, *, name: str = "") -> list[bytes] | None:
    """One value per possible CPU (each value_size bytes), None if key is absent."""
    stride = _round8(value_size)
    raw = map_lookup(fd, key, stride * possible_cpus(), name=name)
    if raw is None:
        return None
    return [raw[i:i + value_size] for i in range(0, len(raw), stride)]


def map_pop(fd: int, value_size: int, *, name: str = "") -> bytes | None:
    """The oldest value of a queue map, taken off it; None when it is empty."""
    v = ctypes.create_string_buffer(value_size)
    try:
        _bpf(BPF_MAP_LOOKUP_AND_DELETE_ELEM, _ElemAttr(map_fd=fd, key=0, value=_addr(v)), name or f"fd {fd}")
    except FileNotFoundError:
        return None
    return v.raw


def map_update(fd: int, key: bytes, value: bytes, flags: int = BPF_ANY, *, name: str = "") -> None:
    k, v = _buf(key), _buf(value)
    _bpf(BPF_MAP_UPDATE_ELEM, _ElemAttr(map_fd=fd, key=_addr(k), value=_addr(v), flags=flags),
         name or f"fd {fd}")


def map_delete(fd: int, key: bytes, *, name: str = "", missing_ok: bool = False) -> bool:
    """Deletes key; returns False if it was absent and missing_ok, else absence raises."""
    k = _buf(key)
    try:
        _bpf(BPF_MAP_DELETE_ELEM, _ElemAttr(map_fd=fd, key=_addr(k)), name or f"fd {fd}")
    except FileNotFoundError:
        if missing_ok:
            return False
        raise
    return True


def map_get_next_key(fd: int, key: bytes | None, key_size: int, *, name: str = "") -> bytes | None:
    """The key after key (the first key if key is None), None at the end."""
    k = _buf(key) if key is not None else None
    nxt = ctypes.create_string_buffer(key_size)
    try:
        _bpf(BPF_MAP_GET_NEXT_KEY, _ElemAttr(map_fd=fd, key=_addr(k), value=_addr(nxt)),
             name or f"fd {fd}")
    except FileNotFoundError:
        return None
    return nxt.raw


def map_update_batch(fd: int, keys: list[bytes], values: list[bytes], elem_flags: int = BPF_ANY,
                     *, name: str = "") -> int:
    """Writes all pairs in one syscall (BPF_MAP_UPDATE_BATCH); returns how many were written.

    Keys (and values) must all have one size. On failure the OSError message says how many
    pairs the kernel wrote before it stopped.
    """
    if len(keys) != len(values):
        raise ValueError(f"map_update_batch {name or fd}: {len(keys)} keys but {len(values)} values")
    if not keys:
        return 0
    kb, vb = _buf(b"".join(keys)), _buf(b"".join(values))
    attr = _BatchAttr(keys=_addr(kb), values=_addr(vb), count=len(keys), map_fd=fd,
                      elem_flags=elem_flags)
    try:
        _bpf(BPF_MAP_UPDATE_BATCH, attr, name or f"fd {fd}")
    except OSError as e:
        raise OSError(e.errno, f"{e.strerror} (after {attr.count} of {len(keys)} entries)") from None
    return attr.count


@dataclass
class TestRun:
    retval: int       # the program's return value (e.g. TC_ACT_*)
    data: bytes       # the packet as the program left it
    ctx: bytes | None  # ctx_out, when a ctx was given
    duration_ns: int  # mean run time per repetition


_CTX_OUT_MAX = 1024
SKB_INGRESS_IFINDEX_OFF = 36   # offsetof(struct __sk_buff, ingress_ifindex); ifindex follows at 40
SKB_MARK_OFF = 8               # offsetof(struct __sk_buff, mark)


def skb_ctx(ifindex: int, mark: int = 0, ingress_ifindex: int | None = None) -> bytes:
    """A __sk_buff prefix for a tc program's test run: the packet is on ifindex and arrived there
    (ingress_ifindex, by default ifindex: what bpf_fib_lookup and a program's side lookup read; 0:
    made on this host, as an egress program sees it), carrying skb mark."""
    ctx = bytearray(SKB_INGRESS_IFINDEX_OFF + 8)
    struct.pack_into("=II", ctx, SKB_INGRESS_IFINDEX_OFF, ifindex if ingress_ifindex is None else ingress_ifindex,
                     ifindex)
    struct.pack_into("=I", ctx, SKB_MARK_OFF, mark)
    return bytes(ctx)


def prog_test_run(fd: int, data: bytes, *, ctx: bytes | None = None, repeat: int = 1,
                  data_out_size: int | None = None, name: str = "") -> TestRun:
    """Runs the program on one packet in the kernel (BPF_PROG_TEST_RUN).

    ctx, for a tc program, is a leading part of struct __sk_buff; the kernel accepts only a
    few fields (mark, priority, ingress_ifindex, ifindex, cb, tstamp, wire_len, gso_*), and an
    ifindex > 1 must name a device of the caller's network namespace.
    """
    din = _buf(data)
    dout = ctypes.create_string_buffer(data_out_size or len(data) + 256)
    cin = _buf(ctx) if ctx else None
    # The kernel returns its whole ctx struct (ENOSPC if ctx_out is smaller), however short
    # the ctx given: room for any struct it has today.
    cout = ctypes.create_string_buffer(max(len(ctx), _CTX_OUT_MAX)) if ctx else None
    attr = _TestRunAttr(prog_fd=fd, data_size_in=len(data), data_size_out=len(dout),
                        data_in=_addr(din), data_out=_addr(dout), repeat=repeat,
                        ctx_size_in=len(ctx or b""), ctx_size_out=len(cout) if cout else 0,
                        ctx_in=_addr(cin), ctx_out=_addr(cout))
    _bpf(BPF_PROG_TEST_RUN, attr, name or f"fd {fd}")
    return TestRun(attr.retval, dout.raw[:attr.data_size_out],
                   cout.raw[:attr.ctx_size_out] if cout else None, attr.duration)


def _obj_info(fd: int, size: int) -> bytes:
    buf = ctypes.create_string_buffer(size)
    _bpf(BPF_OBJ_GET_INFO_BY_FD, _InfoAttr(bpf_fd=fd, info_len=size, info=_addr(buf)), f"fd {fd}")
    return buf.raw


def map_info(fd: int) -> dict:
    """struct bpf_map_info of a map: its type, sizes, flags, and the BTF of its key and value."""
    info = dict(zip(_MAP_INFO_FIELDS, _MAP_INFO.unpack(_obj_info(fd, _MAP_INFO.size)), strict=True))
    info["name"] = info["name"].rstrip(b"\0").decode()
    return info


def prog_id(fd: int) -> int:
    """The kernel's id of a program: what `tc filter show` and `bpftool cgroup show` name it by."""
    return _PROG_INFO.unpack(_obj_info(fd, _PROG_INFO.size))[1]


def prog_attach(target_fd: int, prog_fd: int, attach_type: int, flags: int = 0, replace_fd: int = 0,
                *, name: str = "") -> None:
    """BPF_PROG_ATTACH of a program to a cgroup (target_fd: the cgroup's folder, opened). With
    BPF_F_REPLACE, replace_fd's program is swapped for this one in place: no moment with both or
    neither."""
    attr = _AttachAttr(target_fd=target_fd, attach_bpf_fd=prog_fd, attach_type=attach_type, attach_flags=flags,
                       replace_bpf_fd=replace_fd)
    _bpf(BPF_PROG_ATTACH, attr, name or f"fd {target_fd}")


def _fdinfo(fd: int) -> dict[str, str]:
    with open(f"/proc/self/fdinfo/{fd}") as f:
        return dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)


class _Pinned:
    """An fd opened from a pinned path; closes on exit from a with block."""

    def __init__(self, path: str, read_only: bool = False):
        self.path = path
        self.fd = obj_get(path, read_only)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Map(_Pinned):
    """A pinned map. For per-CPU maps, update() writes the value on every CPU."""

    def __init__(self, path: str, read_only: bool = False):
        super().__init__(path, read_only)
        info = _fdinfo(self.fd)
        if "map_type" not in info:
            self.close()
            raise ValueError(f"open map {path}: it is not a BPF map (a program?)")
        self.type = int(info["map_type"])
        self.key_size = int(info["key_size"])
        self.value_size = int(info["value_size"])
        self.max_entries = int(info["max_entries"])
        self.percpu = self.type in PERCPU_MAP_TYPES

    def _check(self, what: str, key: bytes, value: bytes | None = None) -> None:
        if len(key) != self.key_size:
            raise ValueError(f"{what} {self.path}: key is {len(key)} bytes, the map's are {self.key_size}")
        if value is not None and len(value) != self.value_size:
            raise ValueError(f"{what} {self.path}: value is {len(value)} bytes, "
                             f"the map's are {self.value_size}")

    def _percpu_value(self, value: bytes) -> bytes:
        return value.ljust(_round8(self.value_size), b"\0") * possible_cpus()

    def lookup(self, key: bytes) -> bytes | None:
        self._check("lookup", key)
        if self.percpu:
            raise ValueError(f"lookup {self.path}: a per-CPU map; use lookup_percpu()")
        return map_lookup(self.fd, key, self.value_size, name=self.path)

    def lookup_percpu(self, key: bytes) -> list[bytes] | None:
        self._check("lookup", key)
        if not self.percpu:
            raise ValueError(f"lookup_percpu {self.path}: not a per-CPU map; use lookup()")
        return map_lookup_percpu(self.fd, key, self.value_size, name=self.path)

    def update(self, key: bytes, value: bytes, flags: int = BPF_ANY) -> None:
        self._check("update", key, value)
        if self.percpu:
            value = self._percpu_value(value)
        map_update(self.fd, key, value, flags, name=self.path)

    def update_percpu(self, key: bytes, values: list[bytes], flags: int = BPF_ANY) -> None:
        """A per-CPU map's entry with a value of its own on each CPU (lookup_percpu's order)."""
        for v in values:
            self._check("update_percpu", key, v)
        if len(values) != possible_cpus():
            raise ValueError(f"update_percpu {self.path}: {len(values)} values for {possible_cpus()} CPUs")
        map_update(self.fd, key, b"".join(v.ljust(_round8(self.value_size), b"\0") for v in values), flags,
                   name=self.path)

    def info(self) -> dict:
        return map_info(self.fd)

    def delete(self, key: bytes, missing_ok: bool = False) -> bool:
        self._check("delete", key)
        return map_delete(self.fd, key, name=self.path, missing_ok=missing_ok)

    def pop(self) -> bytes | None:
        """A queue map's oldest value, taken off it; None when it is empty."""
        return map_pop(self.fd, self.value_size, name=self.path)

    def keys(self):
        """Iterates the keys (for arrays: every index). Entries may change while iterating."""
        key = map_get_next_key(self.fd, None, self.key_size, name=self.path)
        while key is not None:
            yield key
            key = map_get_next_key(self.fd, key, self.key_size, name=self.path)

    def update_batch(self, keys: list[bytes], values: list[bytes], elem_flags: int = BPF_ANY) -> int:
        if len(keys) != len(values):
            raise ValueError(f"update_batch {self.path}: {len(keys)} keys but {len(values)} values")
        for k, v in zip(keys, values, strict=True):
            self._check("update_batch", k, v)
        if self.percpu:
            values = [self._percpu_value(v) for v in values]
        return map_update_batch(self.fd, keys, values, elem_flags, name=self.path)


class Prog(_Pinned):
    """A pinned program, for BPF_PROG_TEST_RUN, and its kernel id."""

    def __init__(self, path: str):
        super().__init__(path)
        if "prog_type" not in _fdinfo(self.fd):
            self.close()
            raise ValueError(f"open program {path}: it is not a BPF program (a map?)")

    @property
    def id(self) -> int:
        return prog_id(self.fd)

    def test_run(self, data: bytes, ctx: bytes | None = None, repeat: int = 1) -> TestRun:
        return prog_test_run(self.fd, data, ctx=ctx, repeat=repeat, name=self.path)
