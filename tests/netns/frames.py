"""Put raw frames on a link and capture them, with the VLAN tag as it was on the wire.

Run inside a namespace (`ip netns exec NS python frames.py ...`); stdlib only.

  frames.py send IFACE HEX [HEX...]         write each frame as-is
  frames.py sniff IFACE SECONDS [MAX]        print one JSON line per frame:
                                             {"dir": "in"|"out", "hex": ...}, "ready" first

Linux hands packet sockets the 802.1Q tag in ancillary data (the kernel has
already moved it to skb metadata); the tag is put back into the bytes here,
so a capture shows exactly what travelled on the trunk.
"""

import json
import socket
import struct
import sys
import time

ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_AUXDATA = 8
TP_STATUS_VLAN_VALID = 0x10
TP_STATUS_VLAN_TPID_VALID = 0x40
PACKET_OUTGOING = 4
AUXDATA = struct.Struct("IIIHHHH")  # status, len, snaplen, mac, net, vlan_tci, vlan_tpid


def send(iface: str, frames: list[str]) -> None:
    with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as s:
        s.bind((iface, 0))
        for h in frames:
            s.send(bytes.fromhex(h))


def sniff(iface: str, seconds: float, limit: int) -> None:
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    s.setsockopt(SOL_PACKET, PACKET_AUXDATA, 1)
    s.bind((iface, 0))
    print("ready", flush=True)
    deadline = time.monotonic() + seconds
    seen = 0
    while seen < limit:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        s.settimeout(left)
        try:
            data, anc, _, addr = s.recvmsg(65535, socket.CMSG_SPACE(AUXDATA.size))
        except TimeoutError:
            break
        for level, kind, raw in anc:
            if level == SOL_PACKET and kind == PACKET_AUXDATA and len(raw) >= AUXDATA.size:
                status, _, _, _, _, tci, tpid = AUXDATA.unpack(raw[:AUXDATA.size])
                if status & TP_STATUS_VLAN_VALID:
                    tpid = tpid if status & TP_STATUS_VLAN_TPID_VALID else 0x8100
                    data = data[:12] + struct.pack("!HH", tpid, tci) + data[12:]
        direction = "out" if addr[2] == PACKET_OUTGOING else "in"
        print(json.dumps({"dir": direction, "hex": data.hex()}), flush=True)
        seen += 1


if __name__ == "__main__":
    if sys.argv[1] == "send":
        send(sys.argv[2], sys.argv[3:])
    elif sys.argv[1] == "sniff":
        sniff(sys.argv[2], float(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else 1000)
    else:
        sys.exit(__doc__)
