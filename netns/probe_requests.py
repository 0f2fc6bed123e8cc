"""Send a small HTTP request on a new connection every INTERVAL s for SECONDS, on a fixed schedule.

Run by netns/workloads.py one_run in the lab's client namespace. Each request starts on time whether
or not the ones before it have finished (a request stuck behind a full buffer does not thin out
the samples, as a loop of curl would), and its time runs from connect() to the response's last
byte, handshake included. Prints one JSON object: {"samples": [[offset s, time s], ...],
"failed": n}. Every request gives up after --timeout s, so the load stops by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time


async def one(host: str, port: int, path: str, timeout: float) -> float | None:
    started = time.monotonic()
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        body = await asyncio.wait_for(reader.read(), timeout - (time.monotonic() - started))
        writer.close()
    except (OSError, TimeoutError):
        return None
    return time.monotonic() - started if body.startswith(b"HTTP/1.1 200") else None


async def probe(host: str, port: int, path: str, seconds: float, interval: float, timeout: float) -> dict:
    started = time.monotonic()
    tasks = []
    for n in range(int(seconds / interval)):
        await asyncio.sleep(max(0.0, started + n * interval - time.monotonic()))
        tasks.append((n * interval, asyncio.create_task(one(host, port, f"{path}?probe{n}", timeout))))
    samples, failed = [], 0
    for offset, task in tasks:
        took = await task
        if took is None:
            failed += 1
        else:
            samples.append([round(offset, 3), round(took, 6)])
    return {"samples": samples, "failed": failed}


def main() -> int:
    ap = argparse.ArgumentParser(prog="probe_requests", description=__doc__.splitlines()[0])
    ap.add_argument("host")
    ap.add_argument("--port", type=int, default=80)
    ap.add_argument("--path", default="/1k")
    ap.add_argument("--seconds", type=float, required=True)
    ap.add_argument("--interval", type=float, default=0.2)
    ap.add_argument("--timeout", type=float, default=10)
    args = ap.parse_args()
    print(json.dumps(asyncio.run(probe(args.host, args.port, args.path, args.seconds, args.interval, args.timeout))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
