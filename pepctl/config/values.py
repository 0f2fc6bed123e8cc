"""The config's value rules: ASCII, address kinds, ports, paths. Each returns what is wrong (a
message saying what to do) or None, and knows nothing of where the value was written: the
reader adds the file, line and field. The bypass rules of the command line share them through
the one rule grammar (pepctl/config/rules.py).
"""

from __future__ import annotations

import ipaddress
import json
import re
import unicodedata
from typing import Any

from .. import names
from .model import Addr, Iface, Net
from .schema import PATH_CHARS, PATH_LEN_MAX, STATS_SOCKET_MAX

_PATH_RE = re.compile(r"[A-Za-z0-9._/-]*")


def merge_ranges(ranges) -> tuple[tuple[int, int], ...]:
    """Sort inclusive ranges and merge overlapping or adjacent ones."""
    out: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return tuple((lo, hi) for lo, hi in out)


def in_ranges(port: int, ranges) -> bool:
    return any(lo <= port <= hi for lo, hi in ranges)


def port_count(ranges) -> int:
    return sum(hi - lo + 1 for lo, hi in ranges)


def port_range(item: Any) -> tuple[int, int] | str:
    """80, "80" or "8000-8080" -> (lo, hi); otherwise the message saying what is wrong. ASCII digits
    only: int() would read a full-width "80" (U+FF18 U+FF10) as 80."""
    usage = 'use a port 1-65535 or a range like "8000-8080"'
    if isinstance(item, str) and ascii_problem(item):
        return ascii_problem(item)
    m = re.fullmatch(r"[ \t]*([0-9]+)[ \t]*(?:-[ \t]*([0-9]+)[ \t]*)?", item) if isinstance(item, str) else None
    if isinstance(item, int) and not isinstance(item, bool):
        lo = hi = item
    elif m:
        # int() of thousands of digits raises (sys.get_int_max_str_digits): no port has more than 5.
        lo_s, hi_s = m.group(1).lstrip("0") or "0", (m.group(2) or m.group(1)).lstrip("0") or "0"
        if len(lo_s) > 5 or len(hi_s) > 5:
            return f"out of range; {usage}"
        lo, hi = int(lo_s), int(hi_s)
    else:
        return f"not a port; {usage}"
    if not (1 <= lo <= 65535 and 1 <= hi <= 65535):
        return f"out of range; {usage}"
    if lo > hi:
        return f"range runs backwards; write it low-high, \"{hi}-{lo}\""
    return (lo, hi)


def ascii_problem(text: str) -> str | None:
    """What is wrong with a string that must be ASCII, naming its first other character; or None.
    The message is ASCII itself, and says how the text reads in ASCII when NFKC can tell
    (full-width "80" -> "80")."""
    if text.isascii():
        return None
    i, ch = next((i, c) for i, c in enumerate(text) if not c.isascii())
    plain = unicodedata.normalize("NFKC", text).strip()   # no value takes a space: "80\u00a0" reads "80"
    hint = f", {json.dumps(plain)}" if plain.isascii() and plain else ""
    return (f"has a non-ASCII character, U+{ord(ch):04X} {unicodedata.name(ch, '(unnamed)')} (character {i + 1}); "
            f"write it in ASCII{hint}")


# Address kinds nothing in a config or a bypass rule can use. An address is of a kind when it lies
# in the range; a network when it lies wholly inside it (0.0.0.0/0 and ::/0 are of no kind).
_KINDS = [(ipaddress.ip_network(net), kind, why) for net, kind, why in (
    ("0.0.0.0/32", "unspecified", 'it means "no address"'),
    ("127.0.0.0/8", "loopback", "it never leaves its host"),
    ("169.254.0.0/16", "link-local", "it is for one link only: no router forwards it"),
    ("224.0.0.0/4", "multicast", "it names a group of hosts, not one"),
    ("255.255.255.255/32", "broadcast", "it reaches every host of a link, not one"),
    ("240.0.0.0/4", "reserved", "it is reserved for future use (RFC 1112) and not routed"),
    ("::/128", "unspecified", 'it means "no address"'),
    ("::1/128", "loopback", "it never leaves its host"),
    ("::ffff:0:0/96", "IPv4-mapped", "it stands for an IPv4 address inside a host and never appears on a link"),
    ("fe80::/10", "link-local", "it is for one link only (the kernel gives every link one): no router "
     "forwards it"),
    ("ff00::/8", "multicast", "it names a group of hosts, not one"),
)]
_KIND_BITS = [(n.version, n.max_prefixlen - n.prefixlen, int(n.network_address) >> (n.max_prefixlen - n.prefixlen),
               n.prefixlen) for n, _, _ in _KINDS]
_EXAMPLE = {4: ("198.18.0.1/24", "198.18.0.0/24"), 6: ("2001:2:0:1::1/64", "2001:2:0:1::/64")}
# What to do, by where the address is written.
_TODO = {
    "address": "give this side a unicast address of its own, e.g. {addr}",
    "gateway": "give the next router's unicast address, in a subnet of this side's addresses",
    "prefix": "list the unicast networks reached through this side (a default route is 0.0.0.0/0 or ::/0)",
    "client": "no subscriber's TCP flow comes from it; give a unicast network, e.g. {net}",
    "server": "no TCP flow goes to it; give a unicast network, e.g. {net}",
    "metrics": 'give an address of this host, e.g. "127.0.0.1"',
}
_ALLOWED = {"metrics": ("unspecified", "loopback")}   # listen on every address, or on 127.0.0.1


# The first bytes of every address of a kind, by IP version: most networks are of no kind, and
# their first byte alone says so.
_KIND_FIRST = {v: {b for n, _, _ in _KINDS if n.version == v
                   for b in range(int(n.network_address) >> (n.max_prefixlen - 8),
                                  (int(n.broadcast_address) >> (n.max_prefixlen - 8)) + 1)} for v in (4, 6)}


def address_kind(version: int, value: int, plen: int) -> int | None:
    """The index in _KINDS of the kind of network value/plen (an address: plen 32 or 128), or None.
    Plain integers, so bypass rules (100,000 of them) need no ipaddress objects."""
    if plen >= 8 and value >> (96 * (version == 6) + 24) not in _KIND_FIRST[version]:
        return None
    for i, (v, shift, top, kplen) in enumerate(_KIND_BITS):
        if v == version and plen >= kplen and value >> shift == top:
            return i
    return None


def kind_problem(x: Addr | Iface | Net, role: str) -> str | None:
    """What is wrong with an address, interface address or network of a kind that cannot serve as
    role (a key of _TODO), or None."""
    if isinstance(x, ipaddress.IPv4Interface | ipaddress.IPv6Interface):
        value, plen = int(x.ip), x.max_prefixlen
    elif isinstance(x, ipaddress.IPv4Network | ipaddress.IPv6Network):
        value, plen = int(x.network_address), x.prefixlen
    else:
        value, plen = int(x), x.max_prefixlen
    i = address_kind(x.version, value, plen)
    return None if i is None else kind_message(i, role, x)


def kind_message(i: int, role: str, x: Any = None) -> str | None:
    """The message for kind _KINDS[i] written as role; None when role may use that kind. x, the
    value as ipaddress has it, lets an IPv4-mapped one be shown in IPv4."""
    net, kind, why = _KINDS[i]
    if kind in _ALLOWED.get(role, ()):
        return None
    where = str(net.network_address) if net.prefixlen == net.max_prefixlen else str(net)
    addr, example = _EXAMPLE[net.version]
    todo = _TODO[role].format(addr=json.dumps(addr), net=example)
    if kind == "IPv4-mapped" and x is not None and _as_ipv4(x):
        todo = f"write it as IPv4, {json.dumps(_as_ipv4(x))}"
    return f"is {kind} ({where}): {why}; {todo}"


def _as_ipv4(x: Any) -> str | None:
    """An IPv4-mapped address, interface or network written as IPv4, or None."""
    if isinstance(x, ipaddress.IPv6Interface):    # before IPv6Address: an interface is one too
        plen = x.network.prefixlen - 96
        return f"{x.ip.ipv4_mapped}/{plen}" if x.ip.ipv4_mapped and plen >= 0 else None
    if isinstance(x, ipaddress.IPv6Address):
        return str(x.ipv4_mapped) if x.ipv4_mapped else None
    if isinstance(x, ipaddress.IPv6Network) and x.prefixlen >= 96:
        return str(ipaddress.ip_network((int(x.network_address) & 0xFFFFFFFF, x.prefixlen - 96)))
    return None


def zone_problem(text: str) -> str | None:
    """An IPv6 zone id ("fe80::1%eth0"): ipaddress takes one, pepctl cannot use one."""
    if "%" not in text:
        return None
    zone = "%" + text.partition("%")[2].partition("/")[0]
    return (f"has a zone id, {json.dumps(zone)}: zone ids pick a link for a link-local address, and pepctl "
            f"names every link itself and takes no link-local addresses; write it without {json.dumps(zone)}")


def address_problem(text: str) -> str | None:
    """What is wrong with an interface address like "198.18.0.1/24", or None."""
    if zone_problem(text):
        return zone_problem(text)
    if "/" not in text:
        return "needs its prefix length, e.g. \"198.18.0.1/24\" or \"2001:2:0:1::1/64\""
    try:
        iface = ipaddress.ip_interface(text)
    except ValueError:
        return "not an address with prefix length; write it like \"198.18.0.1/24\" or \"2001:2:0:1::1/64\""
    if kind_problem(iface, "address"):
        return kind_problem(iface, "address")
    net = iface.network
    if net.prefixlen == 0:
        return ("has prefix length 0, which makes every address of its family this side's subnet; give "
                "the length of the subnet it is in, e.g. \"198.18.0.1/24\"")
    # /31, /32, /127 and /128 have no network or broadcast address to avoid.
    if net.num_addresses > 2:
        if iface.ip == net.network_address:
            return f"is the network address of {net}; use a host address in it"
        if iface.version == 4 and iface.ip == net.broadcast_address:
            return f"is the broadcast address of {net}; use a host address in it"
    return None


def valid_ifname(name: str) -> bool:
    """As the kernel's dev_valid_name, and printable ASCII (no control characters)."""
    return 0 < len(name) < 16 and name not in (".", "..") and re.fullmatch(r"[!-~]+", name) is not None \
        and not re.search(r"[/:]", name)


def run_dir_max(instance: str) -> int:
    """The longest run_dir whose stats sockets (run_dir/INSTANCE/proxy/haproxy.sNNNNNN.sock) HAProxy can bind."""
    return STATS_SOCKET_MAX - len(stats_socket("/", instance))


def stats_socket(run_dir: str, instance: str) -> str:
    """HAProxy's longest stats socket (pepctl/names.py haproxy_sock_longest)."""
    return names.instance_names(instance, run_dir).haproxy_sock_longest


def supervisor_unit_len(run_dir: str, instance: str) -> int:
    """The length of the supervisor's unit name (pepctl/names.py unit_name):
    pep-supervisor@<run_dir/INSTANCE, as systemd-escape --path writes it>.service."""
    return len(names.unit_name(names.instance_names(instance, run_dir)))


def path_problem(path: str, example: str) -> str | None:
    """What is wrong with host.run_dir or host.bpf_dir (ASCII already), or None. A path may end
    in "/" and repeat "/": clean_path() removes those."""
    if not path.startswith("/"):
        return f"must be an absolute path, e.g. {json.dumps(example)}"
    m = _PATH_RE.match(path)
    if m.end() < len(path):
        ch = path[m.end()]
        what = {" ": "a space", "\t": "a tab", "\n": "a newline", "\0": "a NUL"}.get(ch) or (
            f"a control character (0x{ord(ch):02x})" if ord(ch) < 32 or ord(ch) == 127 else json.dumps(ch))
        return (f"has {what} (character {m.end() + 1}); use only {PATH_CHARS}: pepctl writes this path into "
                "HAProxy's config, systemd unit names and commands")
    parts = path.split("/")
    for p in (".", ".."):
        if p in parts:
            return (f'has a "{p}" folder in it; write the folder plainly, e.g. {json.dumps(example)} '
                    '(pepctl does not resolve "." and "..")')
    clean = clean_path(path)
    if clean == "/":
        return f"is the root folder; give a folder of pepctl's own, e.g. {json.dumps(example)}"
    if len(clean) > PATH_LEN_MAX:
        return f"is {len(clean)} bytes long; use at most {PATH_LEN_MAX}, e.g. {json.dumps(example)}"
    return None


def nesting(a: str, b: str) -> str | None:
    """How folder a lies to folder b: "the same folder as", "inside", "around", or None (apart)."""
    if a == b:
        return "the same folder as"
    if (a + "/").startswith(b + "/"):
        return "inside"
    return "around" if (b + "/").startswith(a + "/") else None


def clean_path(path: str) -> str:
    """"/run//pep/" -> "/run/pep"."""
    return "/" + "/".join(p for p in path.split("/") if p)
