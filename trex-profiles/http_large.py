"""ASTF profile: large objects (1-10 MB), one HTTP transaction per connection.

Models downloads and progressive video segments: few connections, each long enough for the
congestion controller to leave slow start, so the BBR (access) and CUBIC (origin) halves of the
split connection both reach steady state. Per-template cps is the weight: 10 connections/s in total
at `-m 1` (about 380 Mbit/s of responses); scale with TRex's `-m`.

Tunables (`-t`): size=SIZE plays one object size only (e.g. `-t size=10m`).

Addresses: clients 198.18.0.10-198.18.0.250, servers 198.19.0.10-198.19.0.20, port 80 (lab plan).
"""

import lab_http

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
        return lab_http.size_mix_profile("http_large.py", __doc__, SIZE_MIX, tunables)


def register():
    return HttpLarge()
