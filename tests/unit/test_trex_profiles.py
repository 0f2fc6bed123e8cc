"""The TRex profiles load and compile with the real TRex client library, on the lab's address plan.

Each profile is compiled by replay/compile_profile.py, which runs TRex's own ASTFProfile.to_json()
(ASTF) or STLProfile/STLStream.to_json() (STL) from the PyPI package lbr-trex-client. It runs as a
subprocess because that library puts its bundled scapy 2.4 first on sys.path. The compiled JSON is
then read back here and checked against the lab plan: client range 198.18.0.10-198.18.0.250,
servers inside 198.19.0.0/24, port 80, VLAN 100 on the access port and 200 on the origin port.
The HTTP bytes are decoded and checked as HTTP, and the STL frames are parsed with scapy.

No root; about a second in all.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import os
import re
import subprocess
import sys

import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Dot1Q, Ether

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROFILES = os.path.join(REPO, "trex-profiles")
COMPILE = os.path.join(REPO, "replay", "compile_profile.py")
ASTF = ["http_small", "http_large", "http_mix"]
STL = ["udp_vlan_steering"]

CLIENT_RANGE = ("198.18.0.10", "198.18.0.250")
ORIGIN_NET = ipaddress.ip_network("198.19.0.0/24")
KB, MB = 1024, 1024 * 1024


def compile_profiles(tmp, names, tunables=()):
    args = [sys.executable, COMPILE]
    outs = {}
    for name in names:
        outs[name] = os.path.join(tmp, f"{name}.json")
        args += [os.path.join(PROFILES, f"{name}.py"), outs[name]]
    for t in tunables:
        args += ["-t", t]
    p = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, f"compile_profile {names} {list(tunables)} failed:\n{p.stderr[-2000:]}"
    result = {}
    for name, path in outs.items():
        with open(path) as f:
            result[name] = json.load(f)
    return result


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    pytest.importorskip("lbr_trex_client", reason="TRex client library (lbr-trex-client) not installed")
    return compile_profiles(str(tmp_path_factory.mktemp("trex")), ASTF + STL)


# -- ASTF ---------------------------------------------------------------------------------------------
def buf_bytes(prof, index):
    """A buf_list entry as bytes; {"base", "size", "fill"} is base then fill repeated to size."""
    b = prof["buf_list"][index]
    if isinstance(b, str):
        return base64.b64decode(b)
    data = base64.b64decode(b["base"])
    fill = base64.b64decode(b.get("fill", "")) or b"\0"
    while len(data) < b["size"]:
        data += fill * ((b["size"] - len(data)) // len(fill) + 1)
    return data[:b["size"]]


def program(prof, index):
    return prof["program_list"][index]["commands"]


def transactions(prof):
    """(template, request bytes, response bytes) for every template."""
    out = []
    for t in prof["templates"]:
        c = program(prof, t["client_template"]["program_index"])
        s = program(prof, t["server_template"]["program_index"])
        req = b"".join(buf_bytes(prof, cmd["buf_index"]) for cmd in c if cmd["name"] == "tx")
        resp = b"".join(buf_bytes(prof, cmd["buf_index"]) for cmd in s if cmd["name"] == "tx")
        out.append((t, req, resp, c, s))
    return out


def body_sizes(prof):
    sizes = []
    for _, _, resp, _, _ in transactions(prof):
        head, _, body = resp.partition(b"\r\n\r\n")
        sizes.append(len(body))
    return sizes


@pytest.mark.parametrize("name", ASTF)
def test_astf_uses_the_lab_address_plan(compiled, name):
    prof = compiled[name]
    dists = prof["ip_gen_dist_list"]
    clients = [d for d in dists if d["dir"] == "c"]
    servers = [d for d in dists if d["dir"] == "s"]
    assert [(d["ip_start"], d["ip_end"]) for d in clients] == [CLIENT_RANGE], \
        f"{name}: client pools {clients}, expected one pool {CLIENT_RANGE}"
    assert servers, f"{name}: no server pool"
    for d in servers:
        first, last = ipaddress.ip_address(d["ip_start"]), ipaddress.ip_address(d["ip_end"])
        assert first in ORIGIN_NET and last in ORIGIN_NET and first <= last, \
            f"{name}: server pool {d['ip_start']}-{d['ip_end']} not inside {ORIGIN_NET}"
    # A second port pair adds ip_offset: it must stay in the benchmarking ranges.
    for d in dists:
        assert ipaddress.ip_address(d["ip_end"]) + int(ipaddress.ip_address(d["ip_offset"])) in \
            ipaddress.ip_network("198.18.0.0/15"), f"{name}: ip_offset {d['ip_offset']} leaves 198.18.0.0/15"
    for t in prof["templates"]:
        ct, st = t["client_template"], t["server_template"]
        assert ct["port"] == 80, f"{name}: client template port {ct['port']}, expected 80"
        assert [r["port"] for r in st["assoc"]] == [80], f"{name}: server association {st['assoc']}"
        assert dists[ct["ip_gen"]["dist_client"]["index"]]["dir"] == "c"
        assert dists[ct["ip_gen"]["dist_server"]["index"]]["dir"] == "s"


@pytest.mark.parametrize("name", ASTF)
def test_astf_programs_are_one_http_transaction_per_connection(compiled, name):
    for _t, req, resp, cprog, sprog in transactions(compiled[name]):
        assert re.match(rb"GET /obj/\d{8}\.bin HTTP/1\.1\r\n", req), f"{name}: request {req[:60]!r}"
        assert req.endswith(b"\r\n\r\n") and b"\r\nConnection: close\r\n" in req, f"{name}: request {req!r}"
        head, sep, body = resp.partition(b"\r\n\r\n")
        assert sep and head.startswith(b"HTTP/1.1 200 OK\r\n"), f"{name}: response head {head[:60]!r}"
        length = int(re.search(rb"\r\nContent-Length: (\d+)", head).group(1))
        assert length == len(body), f"{name}: Content-Length {length} but body is {len(body)} bytes"
        assert int(req[9:17]) == len(body), f"{name}: URL asks for {int(req[9:17])} bytes, body {len(body)}"
        # client: send the request, read the whole response; server: the mirror image
        assert [c["name"] for c in cprog] == ["tx", "rx"] and cprog[1]["min_bytes"] == len(resp)
        assert [c["name"] for c in sprog] == ["rx", "tx"] and sprog[0]["min_bytes"] == len(req)


@pytest.mark.parametrize("name", ASTF)
def test_astf_server_can_tell_templates_apart(compiled, name):
    """All templates share port 80, so the l7_map bytes of the requests must differ."""
    seen = {}
    for t, req, _, _, _ in transactions(compiled[name]):
        offsets = t["server_template"]["assoc"][0]["l7_map"]["offset"]
        key = bytes(req[o] for o in offsets)
        assert key not in seen, f"{name}: two templates map to the same request bytes {key!r}"
        seen[key] = t


def test_http_small_is_a_cdn_like_mix_of_small_objects(compiled):
    prof = compiled["http_small"]
    sizes = body_sizes(prof)
    cps = [t["client_template"]["cps"] for t in prof["templates"]]
    assert min(sizes) == 1 * KB and max(sizes) == 256 * KB, f"http_small sizes {sizes}"
    assert len(sizes) >= 5, f"http_small: only {len(sizes)} object sizes"
    assert sum(cps) == pytest.approx(100), f"http_small: total cps {sum(cps)}, expected 100 at -m 1"
    # most connections fetch the smallest objects
    by_size = dict(zip(sizes, cps, strict=True))
    assert by_size[1 * KB] == max(cps) and by_size[256 * KB] == min(cps), f"http_small weights {by_size}"


def test_http_large_objects_are_1_to_10_mb(compiled):
    sizes = body_sizes(compiled["http_large"])
    assert min(sizes) == 1 * MB and max(sizes) == 10 * MB, f"http_large sizes {sizes}"


def test_http_mix_has_small_and_large(compiled):
    prof = compiled["http_mix"]
    sizes = body_sizes(prof)
    cps = dict(zip(sizes, (t["client_template"]["cps"] for t in prof["templates"]), strict=True))
    large = sum(v for s, v in cps.items() if s >= MB)
    assert set(body_sizes(compiled["http_small"])) | set(body_sizes(compiled["http_large"])) == set(sizes)
    assert large / sum(cps.values()) == pytest.approx(0.05), f"http_mix large share {large / sum(cps.values())}"


def test_size_tunable_plays_one_object(tmp_path):
    pytest.importorskip("lbr_trex_client", reason="TRex client library (lbr-trex-client) not installed")
    prof = compile_profiles(str(tmp_path), ["http_small"], tunables=["size=1k"])["http_small"]
    assert body_sizes(prof) == [1024], f"http_small -t size=1k: sizes {body_sizes(prof)}"


def test_bad_tunable_is_reported(tmp_path):
    pytest.importorskip("lbr_trex_client", reason="TRex client library (lbr-trex-client) not installed")
    p = subprocess.run([sys.executable, COMPILE, os.path.join(PROFILES, "http_mix.py"),
                        str(tmp_path / "x.json"), "-t", "large_share=150"], capture_output=True, text=True)
    assert p.returncode != 0 and "large_share=150" in p.stderr, f"rc {p.returncode}, stderr {p.stderr[-500:]}"
    assert not (tmp_path / "x.json").exists()


# -- STL ----------------------------------------------------------------------------------------------
def ip_int(ip):
    return int(ipaddress.ip_address(ip))


@pytest.mark.parametrize("direction,vlan,src,dst,client_field", [
    ("0", 100, "198.18.0.10", "198.19.0.10", "src"),   # port 0: access side
    ("1", 200, "198.19.0.10", "198.18.0.10", "dst"),   # port 1: origin side
])
def test_stl_frames_are_vlan_tagged_64_byte_udp(compiled, direction, vlan, src, dst, client_field):
    streams = compiled["udp_vlan_steering"]["directions"][direction]
    assert len(streams) == 1, f"direction {direction}: {len(streams)} streams"
    raw = base64.b64decode(streams[0]["packet"]["binary"])
    assert len(raw) + 4 == 64, f"direction {direction}: frame is {len(raw) + 4} bytes with FCS, expected 64"
    pkt = Ether(raw)
    assert pkt.haslayer(Dot1Q) and pkt[Dot1Q].vlan == vlan, \
        f"direction {direction}: VLAN {pkt[Dot1Q].vlan if pkt.haslayer(Dot1Q) else None}, expected {vlan}"
    assert pkt.haslayer(UDP), f"direction {direction}: not UDP: {pkt.summary()}"
    assert (pkt[IP].src, pkt[IP].dst) == (src, dst), f"direction {direction}: {pkt[IP].src} -> {pkt[IP].dst}"

    # The field engine walks the client range and writes it into the client's address field.
    ins = streams[0]["vm"]["instructions"]
    var = next(i for i in ins if i["type"] == "flow_var" and i["name"] == "client")
    assert (var["min_value"], var["max_value"]) == (ip_int(CLIENT_RANGE[0]), ip_int(CLIENT_RANGE[1]))
    write = next(i for i in ins if i["type"] == "write_flow_var" and i["name"] == "client")
    ip_off = len(raw) - len(bytes(pkt[IP]))
    assert write["pkt_offset"] == ip_off + (12 if client_field == "src" else 16), \
        f"direction {direction}: client address written at {write['pkt_offset']}, not IP.{client_field}"
    assert any(i["type"] == "fix_checksum_ipv4" for i in ins), "IPv4 checksum not fixed after rewrites"


# -- platform config ----------------------------------------------------------------------------------
def test_trex_cfg_has_access_and_origin_ports():
    with open(os.path.join(PROFILES, "trex_cfg.example.yaml")) as f:
        text = f.read()
    ifaces = re.search(r"interfaces\s*:\s*\[([^\]]*)\]", text)
    assert ifaces and len([i for i in ifaces.group(1).split(",") if i.strip()]) == 2, "need two interfaces"
    vlans = [int(v) for v in re.findall(r"^\s*vlan\s*:\s*(\d+)", text, re.M)]
    assert vlans == [100, 200], f"port_info VLANs {vlans}, expected port 0 = 100, port 1 = 200"
    ips = re.findall(r"^\s*-?\s*ip\s*:\s*([\d.]+)", text, re.M)
    assert [ipaddress.ip_address(i) in net for i, net in
            zip(ips, (ipaddress.ip_network("198.18.0.0/24"), ORIGIN_NET), strict=True)] == [True, True], \
        f"port IPs {ips}: port 0 must be in the access subnet, port 1 in the origin subnet"
