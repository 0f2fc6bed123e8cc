"""Shared parts of the HTTP ASTF profiles: the lab address plan and one HTTP template per object size.

Not a profile itself. The profiles import it by name: TRex (and replay/compile_profile.py) put the
profile's folder on sys.path while loading, so keep this file next to them when copying profiles.

Every object is fetched with one HTTP/1.1 transaction per connection, as a browser fetching from a
CDN edge with `Connection: close`: the client sends the request and reads the whole response; the
server reads the request, sends the response and closes. The request and response are real HTTP
bytes. The response body is TRex's "size + fill" buffer (headers, then a fill pattern repeated up to
the object size), so a 10 MB object costs a few hundred bytes in the compiled JSON.

All templates share port 80. The server side picks the template from the request itself: the object
size is written as 8 digits at a fixed place in the URL (`GET /obj/00001024.bin`), and each server
template's association rule names those byte offsets (TRex `l7_map`), so TRex (and pep-replay)
answer `/obj/00001024.bin` with the 1 KB response.
"""

import argparse

from trex.astf.api import (
    ASTFAssociationRule,
    ASTFIPGen,
    ASTFIPGenDist,
    ASTFIPGenGlobal,
    ASTFProfile,
    ASTFProgram,
    ASTFTCPClientTemplate,
    ASTFTCPServerTemplate,
    ASTFTemplate,
)

# Lab address plan (shared/design.md): clients on the access side, origin servers behind the proxy.
CLIENT_RANGE = ("198.18.0.10", "198.18.0.250")
SERVER_RANGE = ("198.19.0.10", "198.19.0.20")
PORT = 80
HOST = "origin.pep.lab"

# Where the 8 size digits sit in the request: after "GET /obj/".
_PATH_PREFIX = "/obj/"
SIZE_OFFSETS = list(range(len("GET " + _PATH_PREFIX), len("GET " + _PATH_PREFIX) + 8))

# Body pattern: printable and not periodic on a power of two, so a shifted or truncated body
# does not compare equal by accident.
FILL = b"pep-replay/trex object body 0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ\n"


def add_address_args(parser):
    """Tunables every ASTF profile takes: --servers FIRST-LAST overrides the server pool (the lab's
    replay test uses 198.19.0.11-198.19.0.20, since its nginx holds 198.19.0.10:80)."""
    parser.add_argument("--servers", type=address_range, default=SERVER_RANGE,
                        help=f"server pool FIRST-LAST (default {SERVER_RANGE[0]}-{SERVER_RANGE[1]})")


def address_range(text):
    first, sep, last = text.partition("-")
    if not sep or not all(_is_v4(a) for a in (first, last)):
        raise ValueError(f"bad server range {text!r}: write FIRST-LAST, e.g. 198.19.0.11-198.19.0.20")
    return (first, last)


def _is_v4(a):
    parts = a.split(".")
    return len(parts) == 4 and all(p.isdigit() and int(p) < 256 for p in parts)


def ip_gen(servers=SERVER_RANGE):
    """Client and server pools of the lab plan.

    ip_offset is added once per extra TRex port pair; 0.0.1.0 keeps a second pair inside the
    benchmarking ranges (198.18.1.x clients, 198.19.1.x servers) instead of TRex's 1.0.0.0 default.
    """
    return ASTFIPGen(
        dist_client=ASTFIPGenDist(ip_range=list(CLIENT_RANGE), distribution="seq"),
        dist_server=ASTFIPGenDist(ip_range=list(servers), distribution="seq"),
        glob=ASTFIPGenGlobal(ip_offset="0.0.1.0"),
    )


def request(size):
    if not 0 < size < 10**8:
        raise ValueError(f"object size {size} does not fit the 8-digit URL field (1..99999999 bytes)")
    return (
        f"GET {_PATH_PREFIX}{size:08d}.bin HTTP/1.1\r\n"
        f"Host: {HOST}\r\n"
        "User-Agent: pep-replay/1 (TRex ASTF profile)\r\n"
        "Accept: */*\r\n"
        "Connection: close\r\n"
        "\r\n"
    ).encode()


def response_head(size):
    return (
        "HTTP/1.1 200 OK\r\n"
        "Server: pep-origin\r\n"
        "Content-Type: application/octet-stream\r\n"
        f"Content-Length: {size}\r\n"
        "Cache-Control: max-age=3600\r\n"
        "Connection: close\r\n"
        "\r\n"
    ).encode()


def http_template(size, cps, gen):
    """One connection = one GET of a `size`-byte object; `cps` is its share of new connections."""
    req = request(size)
    head = response_head(size)
    total = len(head) + size

    client = ASTFProgram()
    client.send(req)
    client.recv(total)

    server = ASTFProgram()
    server.recv(len(req))
    server.send(head, size=total, fill=FILL)

    return ASTFTemplate(
        client_template=ASTFTCPClientTemplate(program=client, ip_gen=gen, port=PORT, cps=cps),
        server_template=ASTFTCPServerTemplate(
            program=server, assoc=ASTFAssociationRule(port=PORT, l7_map=SIZE_OFFSETS)
        ),
    )


def templates(mix, gen, scale=1.0):
    """`mix` is [(size_bytes, weight)]; a template's cps is its weight times `scale`."""
    return [http_template(size, weight * scale, gen) for size, weight in mix]


def parse_size(text):
    """'1k', '256K', '10m', '1500' -> bytes (powers of 1024)."""
    t = text.strip().lower()
    mult = {"k": 1024, "m": 1024 * 1024}.get(t[-1:], 1)
    digits = t[:-1] if mult != 1 else t
    if not digits.isdigit():
        raise ValueError(f"bad object size {text!r}: use bytes or a k/m suffix, e.g. 1k, 256k, 10m")
    return int(digits) * mult


def profile(mix, servers):
    """The ASTF profile of a size mix [(bytes, connections/s at -m 1)], served from `servers`."""
    gen = ip_gen(servers)
    return ASTFProfile(default_ip_gen=gen, templates=templates(mix, gen))


def size_mix_profile(prog, doc, mix, tunables):
    """A profile playing `mix`, or one object size with the tunable size=SIZE at the mix's total
    rate; both take servers=FIRST-LAST."""
    parser = argparse.ArgumentParser(prog=prog, description=doc.splitlines()[0])
    parser.add_argument("--size", type=parse_size, default=None,
                        help="play only this object size (bytes, or with k/m suffix)")
    add_address_args(parser)
    args = parser.parse_args(list(tunables))
    return profile([(args.size, sum(w for _, w in mix))] if args.size else mix, args.servers)
