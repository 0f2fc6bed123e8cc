"""A load of new HTTP connections with every connection timed, for the lab's client namespace.

    python loadgen.py --dst 198.19.0.10 --src 198.18.0.20 --duration 4

Two kinds of connection, all from --src to --dst:--port, on one asyncio loop:

  short  --workers loops, each opening one connection after another: GET PATH with
         `Connection: close`, read to the end; ok when the answer is a 200 with a body of
         the expected size.
  long   every --long-every seconds a new connection that makes --long-requests keep-alive
         requests of PATH, one every --long-interval seconds (about one second in all), on the
         same connection; ok when every one is answered in full.

A connection is opened with a --timeout, and every request must be answered within it.
New connections start for --duration seconds; those under way then are finished (or time
out), so the whole run is bounded by duration + long lifetime + timeout.

Times are time.monotonic() (CLOCK_MONOTONIC, which every network namespace shares, so a test
can put a kill -9 on the same time line). On start it prints one JSON line
{"ready": t} on stdout; at the end one JSON object:

  {"start": t, "end": t, "src": ..., "connections": [
     {"kind": "short"|"long", "start": t, "connected": t|null, "end": t, "ok": bool,
      "error": "" | "connect: ConnectionRefusedError" | "request 3: ConnectionResetError" | ...,
      "done": requests answered, "want": requests wanted, "port": local port|null,
      "answers": [end time of each answered request]}, ...]}
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
import time

now = time.monotonic


class Result:
    __slots__ = ("kind", "start", "connected", "end", "ok", "error", "done", "want", "port", "answers")

    def __init__(self, kind: str, want: int):
        self.kind, self.want = kind, want
        self.start, self.connected, self.end = now(), None, None
        self.ok, self.error, self.done, self.port, self.answers = False, "", 0, None, []

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__}


async def read_answer(reader: asyncio.StreamReader, size: int, to_eof: bool) -> None:
    """One HTTP answer: a 200 with a body of size bytes (then EOF when to_eof), else raises."""
    head = await reader.readuntil(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0]
    if not status.startswith(b"HTTP/1.1 200"):
        raise ValueError(f"answer {status[:40]!r}")
    length = None
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    if length != size:
        raise ValueError(f"content-length {length}, expected {size}")
    await reader.readexactly(size)
    if to_eof and await reader.read(1):
        raise ValueError("data after the body")


async def one(args, kind: str, out: list[Result]) -> Result:
    want = 1 if kind == "short" else args.long_requests
    r = Result(kind, want)
    out.append(r)
    stage = "connect"
    writer = None
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(args.dst, args.port, local_addr=(args.src, 0)), args.timeout)
        r.connected = now()
        r.port = writer.get_extra_info("sockname")[1]
        close = "close" if kind == "short" else "keep-alive"
        request = f"GET {args.path} HTTP/1.1\r\nHost: origin\r\nConnection: {close}\r\n\r\n".encode()
        for i in range(want):
            stage = f"request {i + 1}"
            if i:
                await asyncio.sleep(args.long_interval)
            writer.write(request)
            await asyncio.wait_for(read_answer(reader, args.size, kind == "short"), args.timeout)
            r.done += 1
            r.answers.append(now())
        r.ok = True
    except (OSError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
            ValueError) as e:
        r.error = f"{stage}: {type(e).__name__}" + (f" {e}" if isinstance(e, ValueError) else "")
    finally:
        r.end = now()
        if writer is not None:
            writer.close()
            try:
                await writer.wait_closed()
            except OSError:
                pass
    return r


async def short_worker(args, stop: float, out: list[Result]) -> None:
    while now() < stop:
        r = await one(args, "short", out)
        if not r.ok and r.end - r.start < 0.001:
            await asyncio.sleep(0.001)   # refused at once: do not spin


async def run(args) -> dict:
    out: list[Result] = []
    start = now()
    stop = start + args.duration
    print(json.dumps({"ready": start}), flush=True)
    tasks = [asyncio.create_task(short_worker(args, stop, out)) for _ in range(args.workers)]
    if args.long_every > 0:
        nxt = start
        while now() < stop:
            tasks.append(asyncio.create_task(one(args, "long", out)))
            nxt += args.long_every
            await asyncio.sleep(max(0.0, nxt - now()))
    await asyncio.gather(*tasks)
    return {"start": start, "end": now(), "src": args.src, "dst": args.dst,
            "connections": [r.as_dict() for r in sorted(out, key=lambda r: r.start)]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dst", required=True)
    ap.add_argument("--port", type=int, default=80)
    ap.add_argument("--src", required=True, help="local address to connect from")
    ap.add_argument("--path", default="/1k")
    ap.add_argument("--size", type=int, default=1024, help="the body size PATH answers with")
    ap.add_argument("--workers", type=int, default=4, help="short-connection workers")
    ap.add_argument("--long-every", type=float, default=0.02, help="seconds between new long connections (0: none)")
    ap.add_argument("--long-requests", type=int, default=10)
    ap.add_argument("--long-interval", type=float, default=0.1)
    ap.add_argument("--duration", type=float, default=4.0, help="seconds during which new connections start")
    ap.add_argument("--timeout", type=float, default=3.0, help="per connect and per request")
    args = ap.parse_args(argv)
    if args.duration > 60:
        ap.error("--duration: at most 60 s")
    socket.inet_pton(socket.AF_INET6 if ":" in args.dst else socket.AF_INET, args.dst)
    result = asyncio.run(run(args))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
