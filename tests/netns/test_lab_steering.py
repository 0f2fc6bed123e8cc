"""The lab and the VLAN steering datapath, with real frames and real clients.

   client --- switch ===trunk (802.1Q 100/200)=== nic0 [proxyhost] c_out/s_out === c_in/s_in [pep] (routes only)
   origin ---/

How right is told from wrong: frames are put on (or taken off) the trunk
with a raw packet socket that sees the 802.1Q tag as it was on the wire.
A frame tagged 100 must come out of c_in with no tag and the same payload;
one tagged 200 out of s_in; one of an unknown VLAN out of neither (and be
counted as passed to the host). The reverse direction must gain the tag.
End to end, ARP/ND, ICMP, UDP and TCP must work over IPv4 and IPv6, and the
steering counters must move for both VLANs in both directions.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Dot1Q, Ether

from netns.addresses import ACCESS_GW4, ACCESS_GW6, ORIGIN4, ORIGIN6, ORIGIN_URL4, ORIGIN_URL6
from netns.handle import PEP_LAB, PYTHON
from pepctl.runner import wait_for

LAB_OPTIONS = ["--no-proxy"]
FRAMES = os.path.join(os.path.dirname(__file__), "frames.py")


def capture(lab, node, iface, send_node, send_iface, frames, seconds=1.5):
    """Start a capture on node/iface, send frames from send_node/send_iface, return captured frames."""
    sniffer = lab.popen(node, PYTHON, FRAMES, "sniff", iface, str(seconds))
    assert sniffer.stdout.readline().strip() == "ready", sniffer.stderr.read()
    lab.run(send_node, PYTHON, FRAMES, "send", send_iface, *[bytes(f).hex() for f in frames])
    out, err = sniffer.communicate(timeout=seconds + 5)
    return [(json.loads(line)["dir"], Ether(bytes.fromhex(json.loads(line)["hex"])))
            for line in out.splitlines() if line.strip()]


def mac(lab, node, iface):
    return json.loads(lab.run(node, "ip", "-j", "link", "show", iface).stdout)[0]["address"]


def marker_frames(lab, vid, marker):
    """A tagged UDP frame from the trunk side; its payload marks it among other traffic."""
    return Ether(src="02:00:00:00:00:01", dst="ff:ff:ff:ff:ff:ff") / Dot1Q(vlan=vid) / \
        IP(src="198.18.0.99", dst=ACCESS_GW4) / UDP(sport=4011, dport=9) / marker


def received(captured, marker):
    return [f for d, f in captured if d == "in" and marker in bytes(f)]


@pytest.mark.parametrize("vid,iface", [(100, "c_in"), (200, "s_in")])
def test_tagged_frame_from_trunk_arrives_untagged_on_its_port(lab, vid, iface):
    marker = f"steer-{vid}".encode()
    frame = marker_frames(lab, vid, marker)
    got = received(capture(lab, "pep", iface, "switch", "trunk", [frame]), marker)
    assert len(got) == 1, f"on pep/{iface}: expected 1 frame carrying {marker!r}, got {len(got)}"
    assert Dot1Q not in got[0], f"on pep/{iface}: frame still tagged: {got[0].summary()}"
    assert bytes(got[0][IP]) == bytes(frame[IP]), "payload changed on the way"


def test_tagged_frame_goes_to_its_own_port_only(lab):
    marker = b"steer-only-100"
    got = received(capture(lab, "pep", "s_in", "switch", "trunk", [marker_frames(lab, 100, marker)]), marker)
    assert got == [], f"on pep/s_in: a VLAN 100 frame leaked to the origin side: {got}"


def test_unknown_vlan_goes_to_the_host_not_to_a_graph(lab):
    before = lab.status()["pepctl"]["trunk"]["reasons"]["pass_unknown_vlan"]
    marker = b"steer-unknown-300"
    got = received(capture(lab, "pep", "c_in", "switch", "trunk", [marker_frames(lab, 300, marker)]), marker)
    assert got == [], f"on pep/c_in: a VLAN 300 frame was steered: {got}"
    after = lab.status()["pepctl"]["trunk"]["reasons"]["pass_unknown_vlan"]
    assert after == before + 1, f"pass_unknown_vlan counter: expected {before + 1}, got {after}"


@pytest.mark.parametrize("iface,vid", [("c_in", 100), ("s_in", 200)])
def test_frame_from_proxy_side_is_tagged_on_trunk(lab, iface, vid):
    marker = f"tag-me-{vid}".encode()
    frame = Ether(src=mac(lab, "pep", iface), dst="ff:ff:ff:ff:ff:ff") / \
        IP(src=ACCESS_GW4, dst="198.18.0.200") / UDP(sport=9, dport=4011) / marker
    captured = capture(lab, "switch", "trunk", "pep", iface, [frame])
    got = received(captured, marker)
    assert len(got) == 1, f"on switch/trunk: expected 1 frame carrying {marker!r}, got {len(got)}"
    assert Dot1Q in got[0] and got[0][Dot1Q].vlan == vid, \
        f"on switch/trunk: expected VLAN {vid}, got {got[0].summary()}"
    assert bytes(got[0][IP]) == bytes(frame[IP])


def test_ping_ipv4_and_ipv6(lab):
    for dst in (ORIGIN4, ORIGIN6):
        proc = lab.run("client", "ping", "-c", "3", "-i", "0.1", "-W", "2", dst, check=False)
        assert proc.returncode == 0, f"client: ping {dst}: {proc.stdout[-300:]}"


def test_arp_and_nd_resolve_the_gateways_mac(lab):
    lab.run("client", "ping", "-c", "1", "-W", "2", ORIGIN4)
    lab.run("client", "ping", "-c", "1", "-W", "2", ORIGIN6)
    want = mac(lab, "pep", "c_in")
    neigh = json.loads(lab.run("client", "ip", "-j", "neigh", "show", "dev", "eth0").stdout)
    by_ip = {n["dst"]: n.get("lladdr") for n in neigh}
    assert by_ip.get(ACCESS_GW4) == want, f"client ARP for {ACCESS_GW4}: expected {want}, got {by_ip}"
    assert by_ip.get(ACCESS_GW6) == want, f"client ND for {ACCESS_GW6}: expected {want}, got {by_ip}"


@pytest.mark.parametrize("dst,listen", [(ORIGIN4, "0.0.0.0"), (ORIGIN6, "::")])
def test_udp_exchange(lab, dst, listen):
    echo = ("import socket,sys;f=socket.AF_INET6 if ':' in sys.argv[1] else socket.AF_INET;"
            "s=socket.socket(f,socket.SOCK_DGRAM);s.bind((sys.argv[1],7007));print('ready',flush=True);"
            "s.settimeout(5);d,a=s.recvfrom(2048);s.sendto(d[::-1],a)")
    server = lab.popen("origin", PYTHON, "-c", echo, listen)
    assert server.stdout.readline().strip() == "ready"
    ask = ("import socket,sys;f=socket.AF_INET6 if ':' in sys.argv[1] else socket.AF_INET;"
           "s=socket.socket(f,socket.SOCK_DGRAM);s.settimeout(3);s.sendto(b'pep-udp',(sys.argv[1],7007));"
           "print(s.recv(2048).decode())")
    got = lab.run("client", PYTHON, "-c", ask, dst).stdout.strip()
    server.wait(timeout=5)
    assert got == "pdu-pep", f"client: UDP echo via {dst}: expected 'pdu-pep', got {got!r}"


@pytest.mark.parametrize("url", [f"{ORIGIN_URL4}/", f"{ORIGIN_URL6}/"])
def test_tcp_http_to_origin(lab, url):
    body = lab.run("client", "curl", "-s", "-m", "5", url).stdout
    assert "PEP lab origin" in body, f"client: curl {url}: got {body[:200]!r}"


def test_large_tcp_transfer_is_byte_exact(lab):
    with open(os.path.join(lab.run_dir, "www", "10m"), "rb") as f:
        want = f.read()
    out = lab.run("client", "curl", "-s", "-m", "20", f"{ORIGIN_URL4}/10m", text=False).stdout
    assert len(out) == len(want) and out == want, f"client: /10m: got {len(out)} bytes, want {len(want)}"


def test_steering_counters_per_graph_and_direction(lab):
    lab.run("client", "curl", "-s", "-m", "5", "-o", "/dev/null", f"{ORIGIN_URL4}/100k")

    def counters():
        g = lab.status()["pepctl"]["graphs"][0]["steering"]
        ok = all(g[side].get(k, 0) > 0 for side in ("access", "origin")
                 for k in ("in_packets", "in_bytes", "out_packets", "out_bytes"))
        return g if ok else None

    g = wait_for(counters, timeout=3, what="steering counters on both VLANs, both directions")
    # 100 KB flowed origin -> client: more bytes enter by the origin VLAN than leave by it.
    assert g["origin"]["in_bytes"] > 100 * 1024, f"origin in_bytes {g['origin']['in_bytes']} < 100 KB"
    assert g["access"]["out_bytes"] > 100 * 1024, f"access out_bytes {g['access']['out_bytes']} < 100 KB"


def test_lab_up_twice_is_harmless(lab):
    t0 = time.monotonic()
    proc = subprocess.run([PEP_LAB, "up", *LAB_OPTIONS], env=lab.env, capture_output=True, text=True)
    assert proc.returncode == 0 and "already up" in proc.stdout, proc.stdout + proc.stderr
    assert time.monotonic() - t0 < 10
    assert lab.status()["state"] == "up"
