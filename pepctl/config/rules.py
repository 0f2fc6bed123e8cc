"""The bypass rules' grammar: one for the config's [graph.bypass] and for `pepctl bypass`.

A rule is KIND VALUE: client NETWORK, server NETWORK or port PORT[-PORT]. check_rule() takes
one and gives it canonical (as the maps key it and `bypass list` shows it) or says what is
wrong: ASCII only (int() would read a full-width "80" (U+FF18 U+FF10) as 80), the address
kinds no flow can have (pepctl/config/values.py kind_problem: no flow has a multicast client),
ports as the proxy's ports (values.port_range). The config's reader records what is wrong as a
FieldError at the field (graph[0].bypass.clients[1]); the command line's rules and rules files
(`bypass add --from-file`) get the same FieldError, named by `KIND 'VALUE'` and the file's line.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import stat
from typing import Any, NamedTuple

from .. import flow_maps
from .model import FieldError
from .values import address_kind, ascii_problem, kind_message, kind_problem, port_range, zone_problem

KINDS = ("client", "server", "port")
MAX_SHOWN = 20     # bad lines a file's RuleError names; it counts the rest
_WORD_RE = re.compile(r"[^ \t]+")   # words are apart by spaces or tabs: str.split() would also part at U+3000


class Rule(NamedTuple):
    """A tuple, not a dataclass: made, hashed and sorted in C, which counts at 100,000 rules."""
    kind: str        # client | server | port
    value: str       # "198.18.0.0/24" | "2001:2::/48" | "80" | "8000-8080"

    def as_json(self) -> dict:
        return {"kind": self.kind, "value": self.value}


class RuleError(ValueError):
    """Rules refused; errors holds the FieldErrors of the rules themselves (none for a file that
    cannot be read, or a rule the maps have no room for)."""

    def __init__(self, text: str, errors: list[FieldError] | None = None):
        super().__init__(text)
        self.errors = list(errors or [])


def port_text(lo: int, hi: int) -> str:
    return str(lo) if lo == hi else f"{lo}-{hi}"


def check_rule(kind: str, value: Any) -> Rule | str:
    """One rule, canonical; or what is wrong with it (kind is one of KINDS)."""
    if isinstance(value, str) and not value.isascii():
        return ascii_problem(value)
    if kind == "port":
        got = port_range(value)
        return got if isinstance(got, str) else Rule("port", port_text(*got))
    fast = _canonical_net(value)
    if fast is not None:
        text, version, number, plen = fast
        at = address_kind(version, number, plen)
        msg = kind_message(at, kind) if at is not None else None
        return msg or Rule(kind, text)
    if "%" in value:
        return zone_problem(value)
    try:
        net = ipaddress.ip_network(value, strict=True)
    except ValueError:
        try:
            return f'has host bits set; write the network, "{ipaddress.ip_network(value, strict=False)}"'
        except ValueError:
            return 'not a network; write a network like "198.18.0.0/24" or "2001:2:0:1::/64"'
    return kind_problem(net, kind) or Rule(kind, str(net))


def _canonical_net(value: str) -> tuple[str, int, int, int] | None:
    """(str(ip_network(value)), IP version, network as an int, prefix length) by inet_pton/inet_ntop,
    several times quicker (it counts at 100,000 rules); None for anything unusual (netmasks, mapped
    IPv6, errors), which ipaddress then judges."""
    got = flow_maps.fast_prefix(value)
    if got is None:
        return None
    family, packed, plen = got
    text = socket.inet_ntop(family, packed)
    if "." in text and family == socket.AF_INET6:
        return None
    return f"{text}/{plen}", 6 if family == socket.AF_INET6 else 4, int.from_bytes(packed, "big"), plen


def rule_error(kind: str, value: str, file: str = "", line: int | None = None) -> FieldError | Rule:
    """A rule of the command line or of a rules file (file, line): the Rule, or the FieldError that
    names it as written, KIND 'VALUE'."""
    if kind not in KINDS:
        hint = "; write it in ASCII" if not kind.isascii() else ""
        return FieldError(file, f"rule kind {kind!r}", None, f"use one of {', '.join(KINDS)}{hint}", line)
    got = check_rule(kind, value)
    return FieldError(file, f"{kind} {value!r}", None, got, line) if isinstance(got, str) else got


def parse_rule(kind: str, value: str) -> Rule:
    """One rule of the command line, checked and canonical; RuleError names the value and says what to do."""
    got = rule_error(kind, value)
    if isinstance(got, FieldError):
        raise RuleError(str(got), [got])
    return got


def parse_rules_file(path: str) -> list[Rule]:
    """The rules of a file, one `KIND VALUE` a line, words apart by spaces or tabs; `#` starts a
    comment; blank lines and repeated rules are fine. A line may end in LF or CRLF, and the file
    may start with a UTF-8 byte-order mark (a file saved on Windows reads the same); rules are
    ASCII, comments any UTF-8. Every line is checked before any rule is used: one bad line and
    RuleError names every bad line (up to MAX_SHOWN) as FILE:LINE, and says nothing was changed.
    A file that cannot be read, or is not a regular file (a folder, a FIFO, a device), is a
    RuleError too."""
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; a regular file ignores it.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise RuleError(f"{path}: {e.strerror}; give a file of rules, one `KIND VALUE` a line") from None
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        mode = 0
    if not stat.S_ISREG(mode):   # checked before open(): it refuses a folder's fd with its own error
        os.close(fd)
        what = "a folder" if stat.S_ISDIR(mode) else "not a regular file"
        raise RuleError(f"{path}: is {what}; give a file of rules, one `KIND VALUE` a line")
    with open(fd, "rb") as f:
        try:
            return _rules_of_lines(path, f)
        except OSError as e:
            raise RuleError(f"{path}: {e.strerror}; nothing was changed") from None


def _rules_of_lines(path: str, f) -> list[Rule]:
    rules, errors = [], []
    for number, raw in enumerate(f, 1):
        if number == 1:
            raw = raw.removeprefix(b"\xef\xbb\xbf")   # a UTF-8 byte-order mark, as some Windows editors write
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            errors.append(FieldError(path, "", None, f"byte 0x{raw[e.start]:02x} (column {e.start + 1}) is not UTF-8; "
                                     "write rules in ASCII and save the file as UTF-8", number))
            continue
        line = line.removesuffix("\n").removesuffix("\r")
        words = _WORD_RE.findall(line.partition("#")[0])
        if not words:
            continue
        if len(words) != 2:
            errors.append(FieldError(path, repr(line.strip(" \t")), None, "write one rule a line: KIND VALUE, KIND one "
                                     f"of {', '.join(KINDS)}", number))
            continue
        got = rule_error(*words, path, number)
        (errors if isinstance(got, FieldError) else rules).append(got)
    if errors:
        more = f"\n... and {len(errors) - MAX_SHOWN} more" if len(errors) > MAX_SHOWN else ""
        text = "\n".join(str(e) for e in errors[:MAX_SHOWN]) + more + f"\n{path}: nothing was changed"
        raise RuleError(text, errors)
    return rules
