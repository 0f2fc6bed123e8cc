"""The config's entry points: parse() checks a config's text, load() reads a file and parses it."""

from __future__ import annotations

import re
import tomllib

from .graphs import read_defaults_proxy, read_graphs
from .host import read_host
from .model import Config, ConfigError, FieldError
from .reader import BAD, Reader
from .routing import read_routing
from .schema import CONFIG_MAX_BYTES, TOP_KEYS


def parse(text: str, path: str, *, available_cc: set[str] | None = None, host_only: bool = False) -> Config:
    """Check a config's text; path is only used in messages and Config.path. host_only: [host] alone
    (no graphs): enough to find an instance's journal, for a `down` whose config this pepctl no
    longer takes whole."""
    if text.startswith("\ufeff"):   # a byte-order mark, as some Windows editors write: not TOML, harmless
        text = text[1:]
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        msg = str(e)
        m = re.search(r"\s*\(at line (\d+), column (\d+)\)$", msg)
        line = int(m.group(1)) if m else None
        if m:
            msg = f"{msg[: m.start()]} (column {m.group(2)})"
        err = FieldError(path, "", None, f"TOML syntax error: {msg}; fix the syntax", line)
        raise ConfigError([err]) from None
    except ValueError:
        # tomllib's int() of an integer of more than 4,300 digits (sys.get_int_max_str_digits).
        m = re.search(r"[0-9_]{4300}", text)
        line = text.count("\n", 0, m.start()) + 1 if m else None
        err = FieldError(path, "", None, "an integer of thousands of digits; no key takes one: fix the value", line)
        raise ConfigError([err]) from None
    except RecursionError:
        err = FieldError(path, "", None, "arrays or tables nested hundreds deep; no key takes that: fix the value")
        raise ConfigError([err]) from None
    r = Reader(path, text, available_cc)
    if host_only:
        host = read_host(r, doc)
        if r.errors:
            raise ConfigError(r.errors)
        return Config(path, host, ())
    r.unknown_keys(doc, "", TOP_KEYS)
    host = read_host(r, doc)
    defaults = read_defaults_proxy(r, doc)
    graphs = read_graphs(r, doc, defaults)
    routing = read_routing(r, doc, graphs) if "routing" in doc else None
    if host is not BAD and host.metrics_port == 0:
        for g in graphs:
            if g is not BAD and g.experiment.on:
                r.error(f"graph[{g.index}].experiment.control_fraction", g.experiment.control_fraction,
                        "the experiment's flow records are collected by the metrics exporter, which "
                        "host.metrics_port = 0 turns off: give it a port, or set control_fraction = 0")
    if r.errors:
        # In file order, so they read alongside the file; unplaceable ones first.
        raise ConfigError(sorted(r.errors, key=lambda e: e.line or 0))
    return Config(path, host, tuple(graphs), routing, tuple(r.notices))


def load(path: str, *, available_cc: set[str] | None = None, host_only: bool = False) -> Config:
    """Read and check a config file. A missing file raises FileNotFoundError (the CLI says so)."""
    try:
        with open(path, "rb") as f:
            data = f.read(CONFIG_MAX_BYTES + 1)   # -c /dev/zero must not read forever
    except FileNotFoundError:
        raise
    except OSError as e:
        raise ConfigError([FieldError(path, "", None, f"cannot read: {e.strerror}; check the path and "
                                      "its permissions")]) from None
    if len(data) > CONFIG_MAX_BYTES:
        raise ConfigError([FieldError(path, "", None, f"more than {CONFIG_MAX_BYTES >> 20} MiB: not a pepctl config "
                                      "(2,047 graphs, the most there can be, take well under 1 MiB); give the "
                                      "config with -c FILE")])
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise ConfigError([FieldError(path, "", None, "not UTF-8 text; save the file as UTF-8",
                                      line)]) from None
    return parse(text, path, available_cc=available_cc, host_only=host_only)
