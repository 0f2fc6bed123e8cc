"""`pepctl bypass add|del --from-file FILE`: the file's grammar, its errors (FILE:LINE and the value,
every bad line, nothing used when one is bad), and the quick canonical form of networks that lets
100,000 rules load in well under a second (it must equal ipaddress's, or live rules would not
match config rules and `del` would miss them)."""

import argparse
import ipaddress
import random

import pytest

from pepctl import bypass
from pepctl.bypass import Rule
from pepctl.cli import _rules_of

GOOD = """\
# subscribers that must never be proxied
client 198.18.0.0/24
client 2001:2:0:1:0:0:0:0/64     # spelled long: stored as 2001:2:0:1::/64

server   198.19.0.10/32
\tport 8000-8080
port 443
"""


def write(tmp_path, text: str) -> str:
    path = tmp_path / "rules.txt"
    path.write_text(text)
    return str(path)


def test_good_file_gives_canonical_rules_in_order(tmp_path):
    got = bypass.parse_rules_file(write(tmp_path, GOOD))
    assert got == [Rule("client", "198.18.0.0/24"), Rule("client", "2001:2:0:1::/64"),
                   Rule("server", "198.19.0.10/32"), Rule("port", "8000-8080"), Rule("port", "443")], got


def test_comments_and_blank_lines_only_is_no_rule(tmp_path):
    assert bypass.parse_rules_file(write(tmp_path, "# nothing yet\n\n   \n")) == []


@pytest.mark.parametrize("line,says", [
    ("client 198.18.0.5/24", "198.18.0.5/24"),          # host bits set
    ("client 198.18.0.0/33", "198.18.0.0/33"),
    ("server 2001:2::zz/64", "2001:2::zz/64"),
    ("port 70000", "70000"),
    ("subscriber 198.18.0.0/24", "subscriber"),          # unknown kind
    ("client", "'client'"),                              # value missing
    ("client 198.18.0.0/24 198.18.1.0/24", "KIND VALUE"),
])
def test_bad_line_names_file_line_and_value(tmp_path, line, says):
    path = write(tmp_path, f"client 198.18.1.0/24\n# ok so far\n{line}\n")
    with pytest.raises(bypass.RuleError) as e:
        bypass.parse_rules_file(path)
    msg = str(e.value)
    assert f"{path}:3: " in msg, f"expected {path}:3 in the error, got {msg!r}"
    assert says in msg, f"expected {says!r} in the error, got {msg!r}"
    assert "nothing was changed" in msg, msg


def test_every_bad_line_is_reported_not_only_the_first(tmp_path):
    path = write(tmp_path, "client 198.18.0.5/24\nclient 198.18.0.0/24\nport 0-99999\nport x\n")
    msg = str(pytest.raises(bypass.RuleError, bypass.parse_rules_file, path).value)
    for n in (1, 3, 4):
        assert f"{path}:{n}: " in msg, f"line {n} not named in {msg!r}"
    assert f"{path}:2: " not in msg, f"good line 2 named in {msg!r}"


def test_many_bad_lines_are_capped(tmp_path):
    path = write(tmp_path, "client 198.18.0.5/24\n" * 50)
    msg = str(pytest.raises(bypass.RuleError, bypass.parse_rules_file, path).value)
    assert msg.count(f"{path}:") == 21 and "and 30 more" in msg, msg   # 20 lines + "nothing was changed"


def test_cli_takes_a_rule_or_a_file_not_both(tmp_path):
    path = write(tmp_path, GOOD)
    ns = argparse.Namespace(from_file=path, kind="client", value="198.18.0.0/24")
    with pytest.raises(bypass.RuleError, match="not both"):
        _rules_of(ns)
    assert len(_rules_of(argparse.Namespace(from_file=path, kind=None, value=None))) == 5
    assert _rules_of(argparse.Namespace(from_file=None, kind="port", value="80")) == [Rule("port", "80")]
    with pytest.raises(bypass.RuleError, match="give a rule"):
        _rules_of(argparse.Namespace(from_file=None, kind="client", value=None))


def test_missing_file_is_named(tmp_path):
    missing = str(tmp_path / "nope.txt")
    with pytest.raises(bypass.RuleError, match=f"{missing}: No such file"):
        _rules_of(argparse.Namespace(from_file=missing, kind=None, value=None))


def test_quick_canonical_form_equals_ipaddress():
    rng = random.Random(4011)
    for _ in range(20000):
        v6 = rng.random() < 0.5
        bits = 128 if v6 else 32
        plen = rng.choice((0, 8, 16, 24, 32, 48, 64, 127, 128) if v6 else (0, 8, 17, 24, 31, 32))
        if v6:   # mostly zero hextets, so "::" runs of every length and position occur
            raw = int("".join(f"{rng.choice((0, 0, 0, rng.getrandbits(16))):04x}" for _ in range(8)), 16)
        else:
            raw = rng.getrandbits(32)
        net = ipaddress.ip_network((raw & ~((1 << (bits - plen)) - 1), plen))
        for spelling in (str(net), f"{net.network_address.exploded}/{plen}"):
            got = bypass.parse_rule("client", spelling)
            assert got.value == str(net), f"{spelling}: expected {net}, got {got.value}"


@pytest.mark.parametrize("spelling,canonical", [
    ("198.18.0.0/255.255.255.0", "198.18.0.0/24"),      # netmasks: ipaddress's path
    ("198.18.0.7", "198.18.0.7/32"),
    ("::ffff:198.18.0.0/120", "::ffff:c612:0/120"),
    ("2001:2::/048", "2001:2::/48"),
])
def test_unusual_spellings_fall_back_to_ipaddress(spelling, canonical):
    assert bypass.parse_rule("server", spelling).value == canonical
