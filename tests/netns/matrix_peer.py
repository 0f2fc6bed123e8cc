"""The two ends of tests/netns/test_transparency.py: run inside the lab's namespaces.

    matrix_peer.py origin LOG PORT       the origin's server (198.19.0.10 and 2001:2:0:2::10): each
                                         connection's first bytes say what it does; every connection
                                         leaves one JSON line in LOG: the peer it saw and what came
    matrix_peer.py client ACTION ...     one client action; prints one JSON object

The origin marks its packets with DSCP CS2 (TOS 0x48), its listener too (so its SYN-ACK), and
offers MSS 1300 (TCP_MAXSEG). What a connection's first bytes ask:
    b""            nothing: the client closed at once (a 0-byte transfer)
    b"1"           answer b"2" and close (a 1-byte transfer each way)
    b"peer\\n"      answer "ADDRESS PORT" of the peer it sees, and close first
    b"reset\\n"     close with a RST (SO_LINGER 0)
    b"half\\n..."   read to the client's FIN, answer the byte count, close
    b"fin-first\\n" send b"bye" and a FIN, read on to the client's FIN, log what came after
    b"wait\\n"      read until the client ends: log "eof" or "reset"
"""

from __future__ import annotations

import json
import socket
import struct
import sys
import threading
import time

ORIGIN = ("198.19.0.10", "2001:2:0:2::10")
ORIGIN_TOS = 0x48
ORIGIN_MSS = 1300
TCP_MAXSEG = 2


def _marked(family: int) -> socket.socket:
    s = socket.socket(family, socket.SOCK_STREAM)
    if family == socket.AF_INET:
        s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, ORIGIN_TOS)
    else:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_TCLASS, ORIGIN_TOS)
    return s


def _read_to_end(c: socket.socket) -> tuple[bytes, str]:
    got = b""
    try:
        while chunk := c.recv(65536):
            got += chunk
        return got, "eof"
    except ConnectionResetError:
        return got, "reset"
    except TimeoutError:
        return got, "timeout"


def _serve(c: socket.socket, peer: tuple, log, lock: threading.Lock) -> None:
    c.settimeout(5)
    entry: dict = {"peer": [peer[0].removeprefix("::ffff:"), peer[1]]}
    try:
        first = c.recv(65536)
        entry["first"] = first[:32].decode(errors="replace")
        if first == b"":
            entry["result"] = "eof"
        elif first == b"1":
            c.sendall(b"2")
        elif first == b"peer\n":
            c.sendall(f"{entry['peer'][0]} {entry['peer'][1]}".encode())
        elif first == b"reset\n":
            c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        elif first.startswith(b"half\n"):
            rest, entry["result"] = _read_to_end(c)
            c.sendall(str(len(first) - 5 + len(rest)).encode())
        elif first == b"fin-first\n":
            c.sendall(b"bye")
            c.shutdown(socket.SHUT_WR)
            rest, entry["result"] = _read_to_end(c)
            entry["after_fin"] = rest.decode(errors="replace")
        elif first == b"wait\n":
            _, entry["result"] = _read_to_end(c)
    except OSError as e:
        entry["error"] = type(e).__name__
    finally:
        c.close()
        with lock:
            log.write(json.dumps(entry) + "\n")
            log.flush()


def origin(log_path: str, port: int) -> None:
    lock = threading.Lock()
    log = open(log_path, "a")   # noqa: SIM115 (open for the process's life)
    listeners = []
    for addr in ORIGIN:
        family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        s = _marked(family)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.setsockopt(socket.IPPROTO_TCP, TCP_MAXSEG, ORIGIN_MSS)
        s.bind((addr, port))
        s.listen(128)
        listeners.append(s)

    def accept(s: socket.socket) -> None:
        while True:
            c, peer = s.accept()
            threading.Thread(target=_serve, args=(c, peer, log, lock), daemon=True).start()

    for s in listeners[1:]:
        threading.Thread(target=accept, args=(s,), daemon=True).start()
    print("ready", flush=True)
    accept(listeners[0])


# -- the client's actions ------------------------------------------------------------------------
def _socket(src: str, dst: str, tos: int = 0, mss: int = 0, port: int = 0) -> socket.socket:
    family = socket.AF_INET6 if ":" in dst else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    if tos and family == socket.AF_INET:
        s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
    elif tos:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_TCLASS, tos)
    if mss:
        s.setsockopt(socket.IPPROTO_TCP, TCP_MAXSEG, mss)
    if port:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((src, port))
    return s


def _connect(s: socket.socket, dst: str, port: int, timeout: float) -> dict:
    s.settimeout(timeout)
    start = time.monotonic()
    try:
        s.connect((dst, port))
        out = {"connect": "ok"}
    except ConnectionRefusedError:
        out = {"connect": "refused"}
    except TimeoutError:
        out = {"connect": "timeout"}
    except OSError as e:
        out = {"connect": type(e).__name__}
    out["seconds"] = round(time.monotonic() - start, 4)
    if out["connect"] == "ok":
        out["local_port"] = s.getsockname()[1]
    return out


def client(action: str, src: str, dst: str, port: int, opts: dict) -> dict:
    s = _socket(src, dst, opts.get("tos", 0), opts.get("mss", 0), opts.get("bind_port", 0))
    out = _connect(s, dst, port, opts.get("timeout", 5))
    if out["connect"] != "ok":
        s.close()
        return out
    s.settimeout(5)
    try:
        if action == "connect":
            pass
        elif action == "zero":
            pass
        elif action == "one":
            s.sendall(b"1")
            out["got"], out["end"] = _read_text(s)
        elif action in ("peer", "reset"):
            s.sendall(f"{action}\n".encode())
            out["got"], out["end"] = _read_text(s)
        elif action == "abort":
            s.sendall(b"wait\n")
            time.sleep(0.2)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        elif action == "half":
            s.sendall(b"half\n" + b"x" * 1000)
            s.shutdown(socket.SHUT_WR)
            out["got"], out["end"] = _read_text(s)
        elif action == "fin-first":
            s.sendall(b"fin-first\n")
            out["got"], out["end"] = _read_text(s)
            s.sendall(b"after-fin")
        else:
            raise SystemExit(f"matrix_peer client: no action {action!r}")
    finally:
        s.close()
    return out


def _read_text(s: socket.socket) -> tuple[str, str]:
    got, end = _read_to_end(s)
    return got.decode(errors="replace"), end


def main(argv: list[str]) -> None:
    if argv[0] == "origin":
        origin(argv[1], int(argv[2]))
        return
    action, src, dst, port = argv[1], argv[2], argv[3], int(argv[4])
    opts = json.loads(argv[5]) if len(argv) > 5 else {}
    results = [client(action, src, dst, port, opts)]
    if opts.get("again"):   # the same 4-tuple at once, for the reuse case
        results.append(client(action, src, dst, port, opts))
    print(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1:])
