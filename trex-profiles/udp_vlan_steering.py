"""STL profile: small UDP packets tagged with the lab VLANs, both directions (L2 steering test).

Models the appliance's trunk as the steering datapath sees it: access traffic arrives tagged VLAN
100 and origin traffic tagged VLAN 200. TRex port 0 (access side) sends VLAN 100 frames from the
client range to the origin server; port 1 (origin side) sends VLAN 200 frames from the origin
server back to the client range. Frames are 64 bytes on the wire (60 built + 4 FCS), the worst case
for a per-packet datapath. The source (port 0) or destination (port 1) address walks the whole client
range 198.18.0.10-198.18.0.250 and the UDP source port walks 1024-65535, so RSS spreads the flows.
UDP is forwarded, not proxied, by the appliance, so this measures the tc/BPF steering path only.

Tunables (`-t`): pps=N per direction at `-m 1` (default 1000000), size=N frame size with FCS (default 64).
"""

import argparse

from trex.stl.api import (
    IP,
    UDP,
    Dot1Q,
    Ether,
    STLPktBuilder,
    STLScVmRaw,
    STLStream,
    STLTXCont,
    STLVmFixIpv4,
    STLVmFlowVar,
    STLVmWrFlowVar,
)

CLIENT_FIRST, CLIENT_LAST = "198.18.0.10", "198.18.0.250"
ORIGIN = "198.19.0.10"
VLAN_ACCESS, VLAN_ORIGIN = 100, 200
FCS = 4
HEADERS = 14 + 4 + 20 + 8  # Ethernet, 802.1Q, IPv4, UDP


def _ip2int(ip):
    a, b, c, d = (int(x) for x in ip.split("."))
    return (a << 24) | (b << 16) | (c << 8) | d


class UdpVlanSteering:
    def get_streams(self, tunables=(), direction=0, port_id=0, **kwargs):
        parser = argparse.ArgumentParser(prog="udp_vlan_steering.py", description=__doc__.splitlines()[0])
        parser.add_argument("--pps", type=float, default=1_000_000, help="packets/s per direction at -m 1")
        parser.add_argument("--size", type=int, default=64, help="frame size on the wire, with FCS")
        args = parser.parse_args(list(tunables))
        if args.size < HEADERS + FCS:
            parser.error(f"size={args.size}: a VLAN-tagged UDP frame needs at least {HEADERS + FCS} bytes")

        # TRex calls get_streams once per port with direction = port_id % 2.
        access_side = direction == 0
        vlan = VLAN_ACCESS if access_side else VLAN_ORIGIN
        src, dst = (CLIENT_FIRST, ORIGIN) if access_side else (ORIGIN, CLIENT_FIRST)
        base = Ether() / Dot1Q(vlan=vlan) / IP(src=src, dst=dst) / UDP(sport=1024, dport=5001, chksum=0)
        pad = args.size - FCS - len(base)
        pkt = base / (b"\x00" * pad)

        # UDP checksum 0 ("none", valid on IPv4): the field engine rewrites addresses and ports.
        # The client address is the source on the access side and the destination on the origin side.
        client_field = "IP.src" if access_side else "IP.dst"
        vm = STLScVmRaw([
            STLVmFlowVar(name="client", min_value=_ip2int(CLIENT_FIRST), max_value=_ip2int(CLIENT_LAST),
                         size=4, op="inc"),
            STLVmWrFlowVar(fv_name="client", pkt_offset=client_field),
            STLVmFlowVar(name="sport", min_value=1024, max_value=65535, size=2, op="inc"),
            STLVmWrFlowVar(fv_name="sport", pkt_offset="UDP.sport"),
            STLVmFixIpv4(offset="IP"),
        ])
        return [STLStream(packet=STLPktBuilder(pkt=pkt, vm=vm), mode=STLTXCont(pps=args.pps),
                          name=f"vlan{vlan}-dir{direction}")]


def register():
    return UdpVlanSteering()
