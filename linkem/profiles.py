#!/usr/bin/env python3
"""Named link profiles for linkem, and the few calls the lab needs (stdlib only).

A profile (linkem/profiles.toml) becomes linkem's KEY=VALUE words; those go on
linkem's command line at start, or in a `replace` command on its control socket
to switch a running link. "down" means network -> client (linkem's b2a), "up"
client -> network (a2b), so linkem's -a interface faces the client.

Library use:
    words = profile_words("lte", ["down.loss=1"])      # ['a2b.delay=25', ...]
    argv = linkem_argv("ea", "eb", ctl="/run/x.sock", profile="lte")
    control("/run/x.sock", replace_command("3g"))      # switch a running link
    control("/run/x.sock", "stats")                    # counters as a dict

Command line (exit 0 on success, 2 on a user error with the reason on stderr):
    profiles.py list
    profiles.py show NAME [OVERRIDE...]       the profile's words, one per line
    profiles.py args NAME [OVERRIDE...]       the words on one line, for a shell
    profiles.py apply CTL NAME [OVERRIDE...]  switch a running linkem to NAME
    profiles.py set CTL OVERRIDE...           change some keys, keep the rest
    profiles.py stats CTL | params CTL        print linkem's JSON answer
OVERRIDE is KEY=VALUE with an optional direction: loss=1, down.rate=10M,
up.delay=40 (a2b./b2a. work too).
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import sys
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROFILES_FILE = HERE / "profiles.toml"
LINKEM_BIN = HERE / "linkem"

# linkem's parameter keys (linkem/params.c); tests check this against the binary.
KEYS = (
    "delay", "jitter", "jitter_dist", "reorder", "loss", "ge_p", "ge_r",
    "ge_loss_bad", "ge_loss_good", "rate", "limit_bytes", "limit_ms", "limit_pkts", "trace",
)
DIRECTIONS = {"up": "a2b", "down": "b2a", "a2b": "a2b", "b2a": "b2a"}


class ProfileError(ValueError):
    """A profile name, file entry or override that cannot be used."""


class LinkemError(RuntimeError):
    """linkem refused a control command or could not be reached."""


def _value_text(value: object, where: str) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ProfileError(f"{where}: want a number or a string like \"20M\", got {value!r}")
    return repr(value) if isinstance(value, float) else str(value)


def _check_key(key: str, where: str) -> None:
    if key not in KEYS:
        raise ProfileError(f"{where}: unknown key {key!r}; keys: {', '.join(KEYS)}")


def load(path: Path | str = PROFILES_FILE) -> dict[str, dict]:
    """All profiles of the file, checked: {name: {"description", "both", "up", "down"}}."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ProfileError(f"read profiles from {path}: {e}") from e
    out: dict[str, dict] = {}
    for name, table in raw.items():
        if not isinstance(table, dict):
            raise ProfileError(f"{path}: {name!r} is not a [profile] table")
        prof: dict = {"description": str(table.get("description", "")), "both": {}, "up": {}, "down": {}}
        for key, value in table.items():
            where = f"{path}: profile {name!r}, key {key!r}"
            if key == "description":
                continue
            if key in ("up", "down"):
                if not isinstance(value, dict):
                    raise ProfileError(f"{where}: want a table of keys")
                for k, v in value.items():
                    _check_key(k, f"{path}: profile {name!r}, key {key}.{k}")
                    prof[key][k] = _value_text(v, f"{path}: profile {name!r}, key {key}.{k}")
                continue
            _check_key(key, where)
            prof["both"][key] = _value_text(value, where)
        out[name] = prof
    return out


def _split_override(word: str) -> tuple[str | None, str, str]:
    """'down.rate=10M' -> ('b2a', 'rate', '10M'); no direction -> None (both)."""
    key, sep, value = word.partition("=")
    if not sep or not key or not value:
        raise ProfileError(f"override {word!r}: want KEY=VALUE, e.g. loss=1 or down.rate=10M")
    direction = None
    if "." in key:
        prefix, key = key.split(".", 1)
        if prefix not in DIRECTIONS:
            raise ProfileError(f"override {word!r}: direction {prefix!r} is not up, down, a2b or b2a")
        direction = DIRECTIONS[prefix]
    _check_key(key, f"override {word!r}")
    return direction, key, value


def profile_words(name: str | None, overrides: list[str] | tuple[str, ...] = (),
                  path: Path | str = PROFILES_FILE) -> list[str]:
    """linkem KEY=VALUE words for a profile (None: no profile) plus overrides.

    Every word carries its direction (a2b./b2a.), so the result reads the same
    whatever linkem had before; with `replace` it is the whole parameter set.
    """
    per_dir: dict[str, dict[str, str]] = {"a2b": {}, "b2a": {}}
    if name is not None:
        profiles = load(path)
        if name not in profiles:
            raise ProfileError(f"no profile {name!r} in {path}; profiles: {', '.join(profiles)}")
        prof = profiles[name]
        for d, side in (("a2b", "up"), ("b2a", "down")):
            per_dir[d].update(prof["both"])
            per_dir[d].update(prof[side])
    for word in overrides:
        direction, key, value = _split_override(word)
        for d in (direction,) if direction else ("a2b", "b2a"):
            per_dir[d][key] = value
    return [f"{d}.{k}={trace_path(v) if k == 'trace' else v}" for d in ("a2b", "b2a") for k, v in per_dir[d].items()]


# A recording of one's own instead of a profile: trace:PATH is PATH.down and PATH.up (mahimahi's format)
# at 50 ms base RTT behind 500 ms drop-tail buffers, the lab that issue 24's recorded traces were
# measured in. bench responsiveness and congestion/frontier.py both take it.
RECORDING_PREFIX = "trace:"
RECORDING_LINK = {"delay": "25", "limit_ms": "500"}


def recording(spec: str) -> dict | None:
    """A profile (as load() gives them) for trace:PATH; None if spec is not one."""
    if not spec.startswith(RECORDING_PREFIX):
        return None
    path = spec[len(RECORDING_PREFIX):]
    for ext in ("down", "up"):
        if not os.path.isfile(f"{path}.{ext}"):
            raise ProfileError(f"profile {spec}: no file {path}.{ext}; give the path of a mahimahi trace pair "
                               f"without its .down/.up (e.g. trace:mahimahi/traces/Verizon-LTE-short)")
    return {"description": f"the recording {path}", "both": dict(RECORDING_LINK),
            "up": {"trace": f"{path}.up"}, "down": {"trace": f"{path}.down"}}


def trace_path(value: str) -> str:
    """A trace named relative to linkem/ (the shipped ones: traces/NAME), as linkem must open it."""
    return value if value == "none" or Path(value).is_absolute() else str(HERE / value)


def linkem_argv(a: str, b: str, *, profile: str | None = None, overrides: list[str] | tuple[str, ...] = (),
                ctl: str | None = None, duration: float | None = None, pool_mb: int | None = None,
                seed: int | None = None, stats_out: str | None = None,
                binary: Path | str = LINKEM_BIN) -> list[str]:
    """The argv that starts linkem between a (client side) and b (network side)."""
    argv = [str(binary), "-a", a, "-b", b]
    for flag, value in (("--ctl", ctl), ("--duration", duration), ("--pool-mb", pool_mb),
                        ("--seed", seed), ("--stats-out", stats_out)):
        if value is not None:
            argv += [flag, str(value)]
    return argv + profile_words(profile, overrides)


def replace_command(profile: str | None, overrides: list[str] | tuple[str, ...] = ()) -> str:
    """Control command that switches a running linkem to exactly this profile."""
    return " ".join(["replace", *profile_words(profile, overrides)])


def set_command(overrides: list[str] | tuple[str, ...]) -> str:
    """Control command that changes only the given keys."""
    return " ".join(["set", *profile_words(None, overrides)])


def peer_offload_argv(ifname: str) -> list[str]:
    """ethtool argv for the far end (peer) of linkem's A or B veth.

    Run it in the peer's namespace. Without it the peer hands linkem 64 KB
    TSO/GSO frames, which linkem drops (drop_oversize) rather than emulate as
    one packet. linkem turns GRO off on A and B itself.
    """
    return ["ethtool", "-K", ifname, "tso", "off", "gso", "off", "tx-udp-segmentation", "off"]


def control(ctl: str | Path, command: str, timeout: float = 3.0) -> dict:
    """Sends one command line to linkem's control socket; returns its JSON answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        try:
            s.connect(str(ctl))
            s.sendall(command.encode() + b"\n")
            data = b""
            while not data.endswith(b"\n"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        except OSError as e:
            raise LinkemError(f"linkem control socket {ctl}: {e}; is linkem running with --ctl {ctl}?") from e
    try:
        reply = json.loads(data)
    except ValueError as e:
        raise LinkemError(f"linkem control socket {ctl}: answer is not JSON: {data[:200]!r}") from e
    if not reply.get("ok"):
        raise LinkemError(f"linkem refused {command.split()[0]!r}: {reply.get('error')}")
    return reply


def _main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    try:
        if cmd == "list":
            for name, prof in load().items():
                print(f"{name:16} {prof['description']}")
        elif cmd in ("show", "args") and rest:
            words = profile_words(rest[0], rest[1:])
            print("\n".join(words) if cmd == "show" else shlex.join(words))
        elif cmd == "apply" and len(rest) >= 2:
            print(json.dumps(control(rest[0], replace_command(rest[1], rest[2:]))))
        elif cmd == "set" and len(rest) >= 2:
            print(json.dumps(control(rest[0], set_command(rest[1:]))))
        elif cmd in ("stats", "params") and len(rest) == 1:
            print(json.dumps(control(rest[0], cmd)))
        else:
            print(f"profiles.py: cannot use {shlex.join(argv)!r}; see profiles.py --help", file=sys.stderr)
            return 2
    except (ProfileError, LinkemError) as e:
        print(f"profiles.py: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
