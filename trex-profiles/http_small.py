"""ASTF profile: small web objects, one HTTP transaction per connection (CDN-like size mix).

Models subscribers browsing through the PEP: many short connections, most of them carrying a few
kilobytes. The mix below weights object sizes roughly like a CDN edge's request log (many small
images, scripts and API answers; few larger images). Per-template cps is the weight, so the
profile's total is 100 connections/s at `-m 1`; scale with TRex's `-m`.

Tunables (`-t`): size=SIZE plays one object size only (e.g. `-t size=1k` for a wrk-comparable run).

Addresses: clients 198.18.0.10-198.18.0.250, servers 198.19.0.10-198.19.0.20, port 80 (lab plan).
"""

import lab_http

# (object size in bytes, share of connections in percent)
SIZE_MIX = [
    (1 * 1024, 30),
    (4 * 1024, 22),
    (16 * 1024, 18),
    (32 * 1024, 12),
    (64 * 1024, 10),
    (128 * 1024, 5),
    (256 * 1024, 3),
]


class HttpSmall:
    def get_profile(self, tunables=(), **kwargs):
        return lab_http.size_mix_profile("http_small.py", __doc__, SIZE_MIX, tunables)


def register():
    return HttpSmall()
