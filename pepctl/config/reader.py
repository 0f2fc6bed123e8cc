"""The config's generic reader: a line index of the file, typed getters that record a FieldError
and return BAD instead of raising, and unknown keys named with what was meant.

Checking collects every problem before giving up: a section reader (host, sides, graphs,
routing) takes the Reader, checks what it can, records each problem with r.error(), and goes on
with BAD in place of the value; a dataclass is made only of values that are all good.
"""

from __future__ import annotations

import difflib
import re
import unicodedata
from typing import Any

from .model import FieldError, key_text, toml_value
from .schema import MOVED_TO_HOST
from .values import ascii_problem, merge_ranges, port_range

INT, BOOL, STR, LIST, TABLE = "an integer", "true or false", "a string", "a list", "a table"


def is_kind(v: Any, kind: str) -> bool:
    if kind == INT:
        return isinstance(v, int) and not isinstance(v, bool)
    return isinstance(v, {BOOL: bool, STR: str, LIST: list, TABLE: dict}[kind])


def type_name(v: Any) -> str:
    for kind in (BOOL, INT, STR, LIST, TABLE):
        if is_kind(v, kind):
            return kind
    return "a float" if isinstance(v, float) else "a date/time"


def join(where: str, key: str) -> str:
    return f"{where}.{key_text(key)}" if where else key_text(key)


def table_header(path: str) -> str:
    """graph[1].access -> graph.access: how the table header is written in the file."""
    return re.sub(r"\[\d+\]", "", path)


# Linear regexes (no two parts can take the same characters): the scanner reads every line,
# also those inside multi-line strings.
HEADER_RE = re.compile(r"[ \t]*(\[\[?)[ \t]*([A-Za-z0-9_.-]+(?:[ \t]+[A-Za-z0-9_.-]+)*)[ \t]*\]\]?[ \t\r]*(?:#.*)?$")
KEY_RE = re.compile(r"[ \t]*([A-Za-z0-9_.-]+)[ \t]*=")


def line_index(text: str) -> dict[str, int]:
    """Map dotted field paths (graph[1].access.vlan) to the line that defines them.

    A cheap line scanner, not a TOML parser: it follows [table] and [[array]]
    headers and `key =` lines, which is how people write this file. Anything
    it cannot place falls back to its enclosing table's line (see Reader.line).
    """
    index: dict[str, int] = {}
    counts: dict[str, int] = {}
    table = ""
    # split("\n"), as TOML counts lines: splitlines() would also split at U+2028 or U+0085 in a
    # comment or a string, and every line number after it would be wrong.
    for no, line in enumerate(text.split("\n"), 1):
        m = HEADER_RE.match(line)
        if m:
            name = re.sub(r"[ \t]", "", m.group(2))
            if m.group(1) == "[[":
                counts[name] = counts.get(name, -1) + 1
                table = f"{name}[{counts[name]}]"
            else:
                # [graph.access] belongs to the latest [[graph]].
                head, _, rest = name.partition(".")
                table = f"{head}[{counts[head]}].{rest}" if head in counts and rest else name
            index.setdefault(table, no)
            continue
        m = KEY_RE.match(line)
        if m and not line.lstrip().startswith("#"):
            index.setdefault(f"{table}.{m.group(1)}" if table else m.group(1), no)
    return index


class Bad:
    """Marks a value that failed a check; its error is already recorded."""

    def __repr__(self) -> str:
        return "BAD"


BAD: Any = Bad()
REQUIRED: Any = object()


class Reader:
    def __init__(self, path: str, text: str, available_cc: set[str] | None):
        self.path = path
        self.lines = line_index(text)
        self.available_cc = available_cc
        self.errors: list[FieldError] = []
        self.notices: list[str] = []

    def line(self, field: str) -> int | None:
        # graph[1].access.addresses[2] -> graph[1].access.addresses -> graph[1].access -> graph[1]
        f = field
        while f:
            if f in self.lines:
                return self.lines[f]
            f = f[: f.rfind("[")] if f.endswith("]") else f.rpartition(".")[0]
        return None

    def error(self, field: str, value: Any, message: str) -> Any:
        self.errors.append(FieldError(self.path, field, value, message, self.line(field)))
        return BAD

    # -- generic shape checks --

    def unknown_keys(self, table: dict, where: str, known: tuple[str, ...]) -> None:
        for key in table:
            if key in known:
                continue
            if key in MOVED_TO_HOST and where.endswith("proxy"):
                self.error(join(where, key), table[key], f"moved to [host] (one HAProxy serves every graph): "
                           f"write `{key} = {toml_value(table[key])}` under [host]")
                continue
            listed = f"known keys here: {', '.join(known)}"
            if not key.isascii():   # a full-width "nic": ascii_problem spells it in ASCII
                hint = "" if unicodedata.normalize("NFKC", key) in known else f"; {listed}"
                self.error(join(where, key), table[key], f"unknown key: it {ascii_problem(key)}{hint}")
                continue
            close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
            if not close and key:  # an abbreviation: irq -> irq_affinity
                close = [k for k in known if k.startswith(key)][:1]
            hint = f"did you mean {close[0]!r}?" if close else listed
            self.error(join(where, key), table[key], f"unknown key; {hint}")

    def get(self, table: dict, where: str, key: str, kind: str, default: Any = REQUIRED,
            example: str = "") -> Any:
        path = join(where, key)
        if key not in table:
            if default is REQUIRED:
                header = f"[{table_header(where)}]" if where else "the top level"
                return self.error(path, None, f"missing; add `{key} = {example}` to {header}")
            return default
        value = table[key]
        if not is_kind(value, kind):
            return self.error(path, value, f"must be {kind}, not {type_name(value)}")
        if kind == STR and ascii_problem(value):
            return self.error(path, value, ascii_problem(value))
        return value

    def subtable(self, table: dict, where: str, key: str, known: tuple[str, ...],
                 required: bool = False) -> dict | Any:
        path = join(where, key)
        if key not in table:
            if required:
                return self.error(path, None, f"missing; add a [{table_header(path)}] table")
            return {}
        value = table[key]
        if not isinstance(value, dict):
            return self.error(path, value, f"must be a table ([{table_header(path)}]), not {type_name(value)}")
        self.unknown_keys(value, path, known)
        return value

    def strings(self, raw: dict, path: str, key: str, default: Any, empty: str = "") -> list[tuple[str, Any]] | Any:
        """A list of strings as (field path, value) pairs, or BAD when an item is not one (each is
        reported). empty: what to do when the list given is empty (no message: empty is fine)."""
        items = self.get(raw, path, key, LIST, default, example='["198.18.0.1/24", "2001:2:0:1::1/64"]')
        if items is BAD or items is default:
            return items
        if not items and empty:
            return self.error(f"{path}.{key}", [], f"empty; {empty}")
        out = []
        for i, item in enumerate(items):
            if not is_kind(item, STR):
                self.error(f"{path}.{key}[{i}]", item, f"must be a string, not {type_name(item)}")
            elif ascii_problem(item):
                self.error(f"{path}.{key}[{i}]", item, ascii_problem(item))
            else:
                out.append((f"{path}.{key}[{i}]", item))
        return out if len(out) == len(items) else BAD

    def each(self, items: list[tuple[str, Any]], check) -> list | Any:
        """check(value, the good values before it) of every (field, value) of items: what it makes,
        or a str saying what is wrong (reported at the field). BAD unless every item is good."""
        out: list = []
        for field, value in items:
            got = check(value, out)
            if isinstance(got, str):
                self.error(field, value, got)
            else:
                out.append(got)
        return out if len(out) == len(items) else BAD

    def port_list(self, items: list, path: str) -> tuple[tuple[int, int], ...] | Any:
        """[80, "8000-8080"] -> ((80, 80), (8000, 8080)), sorted and merged; each bad item is reported
        at path[i] (the proxy's ports and the bypass rules' take ports alike: values.port_range)."""
        ranges = []
        for i, item in enumerate(items):
            got = port_range(item)
            if isinstance(got, str):
                self.error(f"{path}[{i}]", item, got)
            else:
                ranges.append(got)
        return merge_ranges(ranges) if len(ranges) == len(items) else BAD
