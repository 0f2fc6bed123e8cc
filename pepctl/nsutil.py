"""Working inside a graph's network namespace from pepctl's own process, without a subprocess.

setns(CLONE_NEWNET) moves only the calling thread, so each call runs on a short-lived thread
that joins the namespace: /proc/sys/net and new sockets there belong to that namespace, and
pepctl's main thread stays where it is. This is how `up` sets a namespace's sysctls (a dozen
per graph, for a thousand graphs) and how `status` asks the kernel, over sock_diag, whether
a graph's proxy listener exists.
"""

from __future__ import annotations

import ctypes
import os
import shlex
import socket
import struct
import threading

from .names import netns_path
from .runner import Call, action, read_pid

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def join(ns: str) -> None:
    """Moves the calling thread (only it) into network namespace ns."""
    fd = os.open(netns_path(ns), os.O_RDONLY | os.O_CLOEXEC)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into namespace {ns}: {os.strerror(err)}")
    finally:
        os.close(fd)


def in_netns(ns: str | None, fn, *args):
    """fn(*args) on a thread inside namespace ns (None: here); returns its result or raises."""
    if ns is None:
        return fn(*args)

    def there():
        join(ns)
        return fn(*args)
    return _on_thread(f"netns-{ns}", there)


def _on_thread(name: str, fn):
    """fn() on a short-lived thread of its own (whose namespace it may change); its result or error."""
    box: dict = {}

    def body():
        try:
            box["result"] = fn()
        except BaseException as e:   # handed to the caller's thread
            box["error"] = e

    t = threading.Thread(target=body, name=name)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["result"]


SO_NETNS_COOKIE = 71   # <asm-generic/socket.h>, Linux 5.14


def _cookie_here() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        return struct.unpack("=Q", s.getsockopt(socket.SOL_SOCKET, SO_NETNS_COOKIE, 8))[0]


def netns_cookie(ns: str | None) -> int:
    """The kernel's cookie of namespace ns (None: this one): what BPF's bpf_get_netns_cookie gives."""
    return in_netns(ns, _cookie_here)


def _sysctl_path(key: str) -> str:
    return "/proc/sys/" + key.replace(".", "/")


def _read_sysctls(keys: list[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for key in keys:
        try:
            with open(_sysctl_path(key)) as f:
                out[key] = " ".join(f.read().split())   # "1024\t65535" reads as written: "1024 65535"
        except FileNotFoundError:
            out[key] = None
    return out


def read_sysctls(ns: str | None, keys: list[str]) -> dict[str, str | None]:
    """The values of sysctls in namespace ns (None: absent here), as sysctl -w takes them."""
    return in_netns(ns, _read_sysctls, list(keys))


def fresh_sysctls(keys: list[str]) -> dict[str, str | None]:
    """The values a namespace just made has: the kernel's defaults for one. The namespace is a
    thread's own, made for the reading and gone with the thread."""
    def fresh():
        if _libc.unshare(CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"unshare(CLONE_NEWNET): {os.strerror(err)}")
        return _read_sysctls(list(keys))
    return _on_thread("netns-fresh", fresh)


def _write_sysctls(pairs: list[tuple[str, str]]) -> None:
    for key, value in pairs:
        path = _sysctl_path(key)
        try:
            with open(path, "w") as f:
                f.write(value)
        except OSError as e:
            raise OSError(e.errno, f"sysctl {key}={value}: {e.strerror}") from None


@action("sysctls")
def set_sysctls(ns: str | None, pairs: list) -> None:
    in_netns(ns, _write_sysctls, [tuple(p) for p in pairs])


def sysctls_step_call(ns: str | None, pairs: list[tuple[str, str]]) -> Call:
    words = " ".join(shlex.quote(f"{k}={v}") for k, v in pairs)
    where = f"nsenter --net={netns_path(ns)} " if ns else ""
    return Call("sysctls", (ns, [list(p) for p in pairs]), f"{where}sysctl -q -w {words}")


# -- sock_diag: the TCP sockets of a namespace -------------------------------------------------
NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_DONE, NLMSG_ERROR = 3, 2
TCP_ESTABLISHED, TCP_LISTEN = 1, 10
NLMSGHDR = struct.Struct("=IHHII")
# struct inet_diag_req_v2: family, protocol, ext, pad, states, then inet_diag_sockid
# (sport, dport: big endian; src[4], dst[4]: 16 bytes each; if; cookie[2])
DIAG_REQ = struct.Struct("=BBBxI")
SOCKID = struct.Struct(">HH16s16sIQ")
# struct inet_diag_msg: family, state, timer, retrans, the sockid, expires, rqueue, wqueue, uid,
# inode (72 bytes); then its attributes (struct rtattr: len, type).
MSG_HEAD = struct.Struct("=BBBB")
MSG_SIZE = 72
RTA = struct.Struct("=HH")


def diag_socket() -> socket.socket:
    """A sock_diag socket of this thread's namespace (it stays of that namespace wherever used)."""
    return socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG)


def sock_diag(family: int, states: int, ext: int = 0, sock: socket.socket | None = None):
    """Yields (sockid, {attribute type: bytes}) for each TCP socket of family in states (a bit mask
    of TCP_* states) in this thread's namespace, or in that of sock (diag_socket(), kept by the
    caller: read every dump on it to the end), asking for the INET_DIAG_* attributes in ext.
    Closing the generator early stops the dump: the kernel fills one reply at a time, as read."""
    s = sock or diag_socket()
    try:
        req = DIAG_REQ.pack(family, socket.IPPROTO_TCP, ext, states) + SOCKID.pack(0, 0, bytes(16), bytes(16), 0, 0)
        s.sendto(NLMSGHDR.pack(NLMSGHDR.size + len(req), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, 1, 0)
                 + req, (0, 0))
        while True:
            data = s.recv(65536)
            off = 0
            while off + NLMSGHDR.size <= len(data):
                length, kind, _, _, _ = NLMSGHDR.unpack_from(data, off)
                if kind == NLMSG_DONE:
                    return
                if kind == NLMSG_ERROR:
                    err = -struct.unpack_from("=i", data, off + NLMSGHDR.size)[0]
                    raise OSError(err, f"sock_diag dump: {os.strerror(err)}")
                body = off + NLMSGHDR.size
                attrs, at, end = {}, body + MSG_SIZE, off + length
                while at + RTA.size <= end:
                    alen, atype = RTA.unpack_from(data, at)
                    if alen < RTA.size:
                        break
                    attrs[atype] = data[at + RTA.size:at + alen]
                    at += (alen + 3) & ~3
                yield SOCKID.unpack_from(data, body + MSG_HEAD.size), attrs
                off += (length + 3) & ~3
    finally:
        if sock is None:
            s.close()


SOCK_DESTROY, NLM_F_ACK = 21, 0x4
ALL_TCP_STATES = 0xFFF


def destroy_tcp_sockets(ns: str) -> int:
    """Resets every TCP socket in namespace ns, as `ss -K` does (SOCK_DESTROY); returns how many.

    `down` does this before it deletes a graph's namespace: a connection HAProxy left behind when it
    stopped (an orphan with a download's tail still queued, behind a slow link) keeps the namespace,
    and its links, alive until it has sent everything; the subscriber's connection is gone anyway."""
    def destroy() -> int:
        done = 0
        with diag_socket() as dump, diag_socket() as kill:
            for family in (socket.AF_INET, socket.AF_INET6):
                ids = [SOCKID.pack(*sockid) for sockid, _ in sock_diag(family, ALL_TCP_STATES, sock=dump)]
                for raw in ids:
                    req = DIAG_REQ.pack(family, socket.IPPROTO_TCP, 0, ALL_TCP_STATES) + raw
                    kill.sendto(NLMSGHDR.pack(NLMSGHDR.size + len(req), SOCK_DESTROY, NLM_F_REQUEST | NLM_F_ACK, 1, 0)
                                + req, (0, 0))
                    reply = kill.recv(4096)
                    done += struct.unpack_from("=i", reply, NLMSGHDR.size)[0] == 0   # else gone already
        return done
    return in_netns(ns, destroy)


# -- packet sockets: what makes the kernel share a namespace's IP packets -----------------------
IP_ETHERTYPES = {0x0800: "IPv4", 0x86DD: "IPv6"}
SYS_PIDFD_GETFD = 438        # the same number on every architecture (Linux >= 5.6)


def _packet_rows() -> list[tuple[str, int, int]]:
    """(family, ifindex, inode) of every IPv4 or IPv6 packet socket of the calling thread's namespace."""
    with open("/proc/thread-self/net/packet") as f:
        rows = [line.split() for line in f.read().splitlines()[1:]]
    return [(IP_ETHERTYPES[int(r[3], 16)], int(r[4]), int(r[8])) for r in rows if int(r[3], 16) in IP_ETHERTYPES]


def _socket_fds(pid: str) -> dict[int, int]:
    """inode -> fd of every socket process pid holds (none if it is gone or not ours to see)."""
    out = {}
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
            if link.startswith("socket:["):
                out[int(link[8:-1])] = int(fd)
    except OSError:
        pass
    return out


def ip_packet_sockets(ns: str, pids: list[int] | None = None) -> list[dict]:
    """Packet sockets bound to IPv4 or IPv6 in namespace ns (/proc/net/packet), with the process
    that holds each (pid, fd), and the device each is bound to (ifindex, 0: every device). One
    bound to every device, or to a device that carries traffic, makes the kernel hand that traffic
    to ip_rcv shared: ip_rcv clones it, and the clone has lost the socket bpf_sk_assign gave at tc
    ingress. pids: look only in these processes for holders (default: all)."""
    found = in_netns(ns, _packet_rows)
    if not found:
        return []
    wanted = {inode for _, _, inode in found}
    holders: dict[int, tuple[int, int, str]] = {}
    for pid in map(str, pids) if pids is not None else filter(str.isdigit, os.listdir("/proc")):
        held = {inode: fd for inode, fd in _socket_fds(pid).items() if inode in wanted}
        if not held:
            continue
        try:
            with open(f"/proc/{pid}/comm") as f:
                comm = f.read().strip()
        except OSError:
            continue
        holders.update({inode: (int(pid), fd, comm) for inode, fd in held.items()})
    out = []
    for family, ifindex, inode in found:
        pid, fd, comm = holders.get(inode, (None, None, "?"))
        out.append({"family": family, "ifindex": ifindex, "inode": inode, "pid": pid, "fd": fd,
                    "held_by": f"{comm} (pid {pid})" if pid else "?"})
    return out


def pin_packet_sockets(ns: str, pid: int, dev: str = "lo") -> list[dict]:
    """Binds every IP packet socket process pid holds in namespace ns on every device to dev
    instead: the kernel then runs it for dev's packets only. Taken from the process with
    pidfd_getfd(2), so the process keeps its socket, and rebound (its protocol kept): a bind
    moves the socket's hook from the namespace's list to dev's. What it pinned."""
    found = [p for p in ip_packet_sockets(ns, [pid]) if p["pid"] == pid and p["ifindex"] == 0]
    if not found:
        return []
    pidfd = os.pidfd_open(pid)
    try:
        for p in found:
            fd = _libc.syscall(SYS_PIDFD_GETFD, pidfd, p["fd"], 0)
            if fd < 0:
                err = ctypes.get_errno()
                raise OSError(err, f"take {p['family']} packet socket {p['inode']} of {p['held_by']}: "
                              f"{os.strerror(err)}")
            with socket.socket(fileno=fd) as s:
                s.bind((dev, s.getsockname()[1]))
    finally:
        os.close(pidfd)
    return found


@action("pin_packet_sockets")
def pin_daemons_packet_sockets(ns: str, pidfiles: list, dev: str = "lo") -> None:
    """pin_packet_sockets for each process a plan started (by its pidfile)."""
    for pidfile in pidfiles:
        pid = read_pid(pidfile)
        if pid:
            pin_packet_sockets(ns, pid, dev)


def listening_ports(ns: str | None, sock: socket.socket | None = None) -> set[int]:
    """The TCP ports something listens on in namespace ns (or in sock's: no thread, no setns), IPv4
    or IPv6."""
    def both():
        return {sockid[0] for family in (socket.AF_INET, socket.AF_INET6)
                for sockid, _ in sock_diag(family, 1 << TCP_LISTEN, sock=sock)}
    return both() if sock is not None else in_netns(ns, both)
