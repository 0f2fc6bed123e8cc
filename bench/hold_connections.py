"""Open COUNT TCP connections to HOST:PORT and hold them, idle, until stdin closes (or --hold s).

Run by bench/scale.py in the lab's client namespace. Prints one JSON line once every connection
is established ({"established": n, "failed": m, "seconds": t}), then waits.
"""

from __future__ import annotations

import argparse
import errno
import json
import resource
import select
import socket
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(prog="hold_connections", description=__doc__.splitlines()[0])
    ap.add_argument("host")
    ap.add_argument("port", type=int)
    ap.add_argument("count", type=int)
    ap.add_argument("--hold", type=float, default=300, help="seconds at most (the load stops by itself)")
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    started = time.monotonic()
    pending, done, failed = {}, [], 0
    poller = select.epoll()
    for i in range(args.count):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        err = s.connect_ex((args.host, args.port))
        if err not in (0, errno.EINPROGRESS):
            failed += 1
            s.close()
            continue
        pending[s.fileno()] = s
        poller.register(s.fileno(), select.EPOLLOUT)
        if i % 200 == 199:   # let handshakes complete; a burst of SYNs would overflow backlogs
            drain(poller, pending, done, timeout=0.01)
    deadline = time.monotonic() + 60
    while pending and time.monotonic() < deadline:
        failed += drain(poller, pending, done, timeout=0.2)
    failed += len(pending)
    print(json.dumps({"established": len(done), "failed": failed, "seconds": time.monotonic() - started}),
          flush=True)
    select.select([sys.stdin], [], [], args.hold)
    for s in done:
        s.close()
    return 0


def drain(poller, pending: dict, done: list, timeout: float) -> int:
    failed = 0
    for fd, _ in poller.poll(timeout):
        s = pending.pop(fd)
        poller.unregister(fd)
        if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
            failed += 1
            s.close()
        else:
            done.append(s)
    return failed


if __name__ == "__main__":
    raise SystemExit(main())
