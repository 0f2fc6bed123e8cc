"""A default route with TCP features iproute2 cannot name yet: rtnetlink, stdlib only.

The features of a route (RTAX_FEATURES) change how the host's own TCP behaves toward it. The one the
tests need is RTAX_FEATURE_TCP_USEC_TS (Linux 6.7): connections on that route send timestamps that
tick in microseconds rather than ms, as a peer's clock that pep_radio must not read as ms. Debian
bookworm's iproute2 (6.1) knows only "ecn", so the route is replaced here, in the namespace of the
calling thread (pepctl.nsutil.in_netns puts it there).
"""

from __future__ import annotations

import os
import socket
import struct

RTM_NEWROUTE = 24                                 # <linux/rtnetlink.h>
NLM_F_REQUEST, NLM_F_ACK, NLM_F_REPLACE, NLM_F_CREATE = 0x1, 0x4, 0x100, 0x400
NLMSG_ERROR = 2
RTA_OIF, RTA_GATEWAY, RTA_METRICS = 4, 5, 8
RTAX_FEATURES, RTAX_CC_ALGO = 12, 16
RTAX_FEATURE_TCP_USEC_TS = 1 << 4
RT_TABLE_MAIN, RTPROT_BOOT, RT_SCOPE_UNIVERSE, RTN_UNICAST = 254, 3, 0, 1
RTMSG = struct.Struct("=BBBBBBBBI")                # family, dst_len, src_len, tos, table, protocol, scope, type, flags
NLMSGHDR = struct.Struct("=IHHII")


def _attr(kind: int, data: bytes) -> bytes:
    size = 4 + len(data)
    return struct.pack("=HH", size, kind) + data + b"\0" * (-size % 4)


def replace_default_route(gateway: str, dev: str, features: int, congctl: str) -> None:
    """Make this namespace's IPv4 default route `via gateway dev dev`, with RTAX_FEATURES features
    and congestion control congctl (the lab's end hosts keep CUBIC on theirs); OSError if refused."""
    body = RTMSG.pack(socket.AF_INET, 0, 0, 0, RT_TABLE_MAIN, RTPROT_BOOT, RT_SCOPE_UNIVERSE, RTN_UNICAST, 0)
    body += _attr(RTA_OIF, struct.pack("=i", socket.if_nametoindex(dev)))
    body += _attr(RTA_GATEWAY, socket.inet_aton(gateway))
    body += _attr(RTA_METRICS, _attr(RTAX_FEATURES, struct.pack("=I", features))
                  + _attr(RTAX_CC_ALGO, congctl.encode() + b"\0"))
    flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_REPLACE | NLM_F_CREATE
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as nl:
        nl.send(NLMSGHDR.pack(NLMSGHDR.size + len(body), RTM_NEWROUTE, flags, 1, 0) + body)
        reply = nl.recv(65536)
    kind = NLMSGHDR.unpack_from(reply)[1]
    error = struct.unpack_from("=i", reply, NLMSGHDR.size)[0] if kind == NLMSG_ERROR else 0
    if error:
        raise OSError(-error, f"replace the default route via {gateway} (features {features:#x}): "
                              f"{os.strerror(-error)}")
