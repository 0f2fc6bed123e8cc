"""Talking to HAProxy's stats socket (a unix socket in the graph's run folder)."""

from __future__ import annotations

import csv
import io
import socket


def query(path: str, command: str, *, timeout: float = 1.0) -> str:
    """Send one command, return the whole answer. Raises OSError if HAProxy does not answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(path)
        s.sendall(command.encode() + b"\n")
        chunks = []
        while True:
            data = s.recv(65536)
            if not data:
                break
            chunks.append(data)
    return b"".join(chunks).decode(errors="replace")


def answers(path: str) -> bool:
    try:
        return "Pid:" in query(path, "show info")
    except OSError:
        return False


def info(path: str, *, timeout: float = 1.0) -> dict[str, str]:
    out = {}
    for line in query(path, "show info", timeout=timeout).splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out


def stats(path: str) -> list[dict[str, str]]:
    """`show stat` as rows keyed by column name (pxname, svname, stot, scur, bin, bout, ...)."""
    text = query(path, "show stat").lstrip("# ")
    return [dict(row) for row in csv.DictReader(io.StringIO(text)) if row.get("pxname")]
