"""ASTF profile: a subscriber-day mix of small and large HTTP objects, one transaction per connection.

Connections are mostly small objects (the http_small.py mix) with a tail of large downloads (the
http_large.py mix): by connection count about 95% small and 5% large, by bytes the large objects
dominate, as on a real access network. 100 connections/s at `-m 1`; scale with TRex's `-m`.

Tunables (`-t`): large_share=PERCENT of connections that fetch a large object (default 5).

Addresses: clients 198.18.0.10-198.18.0.250, servers 198.19.0.10-198.19.0.20, port 80 (lab plan).
"""

import argparse

import http_large
import http_small
import lab_http


class HttpMix:
    def get_profile(self, tunables=(), **kwargs):
        parser = argparse.ArgumentParser(prog="http_mix.py", description=__doc__.splitlines()[0])
        parser.add_argument("--large_share", type=float, default=5.0,
                            help="percent of connections fetching a 1-10 MB object (0-100)")
        lab_http.add_address_args(parser)
        args = parser.parse_args(list(tunables))
        if not 0 <= args.large_share <= 100:
            parser.error(f"large_share={args.large_share}: must be a percentage, 0..100")

        small_w = sum(w for _, w in http_small.SIZE_MIX)
        large_w = sum(w for _, w in http_large.SIZE_MIX)
        small = [(s, w * (100 - args.large_share) / small_w) for s, w in http_small.SIZE_MIX]
        large = [(s, w * args.large_share / large_w) for s, w in http_large.SIZE_MIX]
        mix = [(s, w) for s, w in small + large if w > 0]

        return lab_http.profile(mix, args.servers)


def register():
    return HttpMix()
