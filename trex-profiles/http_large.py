"""ASTF profile: large objects (1-10 MB), one HTTP transaction per connection.

Models downloads and progressive video segments: few connections, each long enough for the
congestion controller to leave slow start, so the BBR (access) and CUBIC (origin) halves of the
split connection both reach steady state. Per-template cps is the weight: 10 connections/s in total
at `-m 1` (about 380 Mbit/s of responses); scale with TRex's `-m`.

Tunables (`-t`): size=SIZE plays one object size only (e.g. `-t size=10m`).

Addresses: clients 198.18.0.10-198.18.0.250, servers 198.19.0.10-198.19.0.20, port 80 (lab plan).
"""

import argparse

import lab_http
from trex.astf.api import ASTFProfile

MB = 1024 * 1024
# (object size in bytes, connections per second at -m 1)
SIZE_MIX = [
    (1 * MB, 4),
    (2 * MB, 3),
    (5 * MB, 2),
    (10 * MB, 1),
]


class HttpLarge:
    def get_profile(self, tunables=(), **kwargs):
        parser = argparse.ArgumentParser(prog="http_large.py", description=__doc__.splitlines()[0])
        parser.add_argument("--size", type=lab_http.parse_size, default=None,
                            help="play only this object size (bytes, or with k/m suffix)")
        lab_http.add_address_args(parser)
        args = parser.parse_args(list(tunables))

        mix = [(args.size, 10)] if args.size else SIZE_MIX
        gen = lab_http.ip_gen(args.servers)
        return ASTFProfile(default_ip_gen=gen, templates=lab_http.templates(mix, gen))


def register():
    return HttpLarge()
