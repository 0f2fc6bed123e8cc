"""`pepctl bypass add|del KIND VALUE` and `--from-file FILE`: the rule grammar, its errors (the value,
FILE:LINE, every bad line, nothing used when one is bad), and the quick canonical form of networks
that lets 100,000 rules load in well under a second (it must equal ipaddress's, or live rules would
not match config rules and `del` would miss them).

Each bad rule of BAD_RULES is tried twice, on the command line and as line 3 of a file; BAD_FILES
are what only a file can hold (bytes that are not UTF-8, lines that are not KIND VALUE), NOT_FILES
what is not a readable regular file. Rules are ASCII (int() reads a full-width "80" (U+FF18 U+FF10) as 80) and of
the address kinds the config's [graph.bypass] takes. CRLF line endings, a UTF-8 byte-order mark,
comments in any UTF-8 and repeated rules are taken."""

import argparse
import ipaddress
import os
import random
import re

import pytest

from pepctl.cli import rules_of
from pepctl.config import rules
from pepctl.config.rules import Rule
from pepctl.config.values import kind_problem

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
    got = rules.parse_rules_file(write(tmp_path, GOOD))
    assert got == [Rule("client", "198.18.0.0/24"), Rule("client", "2001:2:0:1::/64"),
                   Rule("server", "198.19.0.10/32"), Rule("port", "8000-8080"), Rule("port", "443")], got


def test_comments_and_blank_lines_only_is_no_rule(tmp_path):
    assert rules.parse_rules_file(write(tmp_path, "# nothing yet\n\n   \n")) == []


# Bad rules, each given on the command line (`pepctl bypass add KIND VALUE`) and as line 3 of a file:
# (case id, kind, value, words the message must contain besides the value).
BAD_RULES = [
    ("host bits set", "client", "198.18.0.5/24", "has host bits set"),
    ("prefix too long", "client", "198.18.0.0/33", "198.18.0.0/33"),
    ("not hex", "server", "2001:2::zz/64", "write a network like"),
    ("IPv6 prefix too long", "server", "2001:2::/129", "write a network like"),
    ("two slashes", "client", "198.18.0.0/24/8", "write a network like"),
    ("port too large", "port", "70000", "out of range"),
    ("port 0", "port", "0", "out of range"),
    ("port range past 65535", "port", "65535-65536", "out of range"),
    ("port of 30 digits", "port", "9" * 30, "out of range"),
    ("port backwards", "port", "90-80", '"80-90"'),
    ("port not a number", "port", "x", "not a port"),
    ("port negative", "port", "-80", "not a port"),
    ("unknown kind", "subscriber", "198.18.0.0/24", "use one of client, server, port"),
    ("full-width kind", "\uff43lient", "198.18.0.0/24", "write it in ASCII"),
    ("full-width port", "port", "\uff18\uff10", 'U+FF18 FULLWIDTH DIGIT EIGHT (character 1); write it in ASCII, "80"'),
    ("full-width port range", "port", "80-\uff19\uff10", 'write it in ASCII, "80-90"'),
    ("Arabic-Indic digits", "port", "\u0668\u0660", "U+0668 ARABIC-INDIC DIGIT EIGHT"),
    ("full-width network", "client", "\uff11\uff19\uff18.18.0.0/24", 'write it in ASCII, "198.18.0.0/24"'),
    ("no-break space", "client", "198.18.0.0/24\u00a0", "U+00A0 NO-BREAK SPACE"),
    ("client multicast", "client", "224.0.0.0/24", "is multicast (224.0.0.0/4)"),
    ("server multicast", "server", "239.1.2.3", "no TCP flow goes to it"),
    ("client IPv6 multicast", "client", "ff02::/16", "is multicast (ff00::/8)"),
    ("client link-local", "client", "169.254.0.0/16", "is link-local (169.254.0.0/16)"),
    ("server IPv6 link-local", "server", "fe80::/64", "is link-local (fe80::/10)"),
    ("client loopback", "client", "127.0.0.0/8", "is loopback (127.0.0.0/8)"),
    ("server IPv6 loopback", "server", "::1/128", "is loopback (::1)"),
    ("client unspecified", "client", "0.0.0.0", "is unspecified (0.0.0.0)"),
    ("server IPv6 unspecified", "server", "::/128", "is unspecified (::)"),
    ("client IPv4-mapped", "client", "::ffff:198.18.0.0/120", 'write it as IPv4, "198.18.0.0/24"'),
    ("server IPv4-mapped in hex", "server", "::ffff:c613:a/128", 'write it as IPv4, "198.19.0.10/32"'),
    ("broadcast", "server", "255.255.255.255/32", "is broadcast (255.255.255.255)"),
    ("reserved", "client", "240.0.0.0/8", "is reserved (240.0.0.0/4)"),
    ("zone id", "client", "fe80::%eth0/64", 'write it without "%eth0"'),
    ("zone id on a global network", "server", "2001:2::%1/48", "has a zone id"),
]


@pytest.mark.parametrize("kind,value,words", [c[1:] for c in BAD_RULES], ids=[c[0] for c in BAD_RULES])
def test_bad_rule_on_the_command_line_names_the_value(kind, value, words):
    with pytest.raises(rules.RuleError) as e:
        rules_of(argparse.Namespace(from_file=None, kind=kind, value=value))
    msg = str(e.value)
    assert repr(kind if kind not in rules.KINDS else value) in msg, f"value not named in {msg!r}"
    assert words in msg, f"expected {words!r} in {msg!r}"


@pytest.mark.parametrize("kind,value,words", [c[1:] for c in BAD_RULES], ids=[c[0] for c in BAD_RULES])
def test_bad_rule_in_a_file_names_file_line_and_value(tmp_path, kind, value, words):
    path = write(tmp_path, f"client 198.18.1.0/24\n# ok so far\n{kind} {value}\nport 80\n")
    with pytest.raises(rules.RuleError) as e:
        rules.parse_rules_file(path)
    msg = str(e.value)
    assert f"{path}:3: " in msg, f"expected {path}:3 in the error, got {msg!r}"
    assert repr(kind if kind not in rules.KINDS else value) in msg, f"value not named in {msg!r}"
    assert words in msg, f"expected {words!r} in {msg!r}"
    assert f"{path}:1" not in msg and f"{path}:4" not in msg, f"a good line is named: {msg!r}"
    assert msg.endswith(f"{path}: nothing was changed"), msg


# Bad files, and lines only a file can have: (case id, the file's bytes, line named (None: the
# file as a whole), words the message must contain).
BAD_FILES = [
    ("three words", b"client 198.18.0.0/24 198.18.1.0/24\n", 1, "'client 198.18.0.0/24 198.18.1.0/24': write one rule"),
    ("kind alone", b"port 80\nclient\n", 2, "'client': write one rule a line: KIND VALUE"),
    ("value alone", b"198.18.0.0/24\n", 1, "'198.18.0.0/24': write one rule"),
    ("not UTF-8", b"port 80\nclient 198.18.0.0/24  # caf\xe9\n", 2, "byte 0xe9 (column 28) is not UTF-8"),
    ("UTF-16", "client 198.18.0.0/24\n".encode("utf-16"), 1, "byte 0xff (column 1) is not UTF-8"),
    ("ideographic space between", "client\u3000198.18.0.0/24\n".encode(), 1, "write one rule a line"),
    ("form feed between", b"port\x0c80\n", 1, "write one rule a line"),
    ("lone CR between two rules", b"port 80\rport 443\n", 1, "write one rule a line"),
    ("NUL in a value", b"port 8\x000\n", 1, "not a port"),
]


@pytest.mark.parametrize("data,line,words", [c[1:] for c in BAD_FILES], ids=[c[0] for c in BAD_FILES])
def test_bad_file_names_file_and_line(tmp_path, data, line, words):
    path = tmp_path / "rules.txt"
    path.write_bytes(data)
    with pytest.raises(rules.RuleError) as e:
        rules.parse_rules_file(str(path))
    msg = str(e.value)
    assert f"{path}:{line}: " in msg, f"expected {path}:{line} in the error, got {msg!r}"
    assert words in msg, f"expected {words!r} in {msg!r}"
    assert msg.endswith(f"{path}: nothing was changed"), msg


def make_fifo(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    return str(tmp_path / "fifo")


def make_file(tmp_path):
    (tmp_path / "afile").write_text("port 80\n")
    return str(tmp_path / "afile")


# What is not a readable regular file: (case id, makes the path, words the message must contain).
NOT_FILES = [
    ("missing", lambda tmp: str(tmp / "nope.txt"), "No such file or directory"),
    ("a folder", lambda tmp: str(tmp), "is a folder"),
    ("a FIFO (must not wait for a writer)", make_fifo, "is not a regular file"),
    ("a device", lambda tmp: "/dev/null", "is not a regular file"),
    ("under a file", lambda tmp: make_file(tmp) + "/rules", "Not a directory"),
    ("dangling symlink", lambda tmp: os.symlink(tmp / "gone", tmp / "link") or str(tmp / "link"),
     "No such file or directory"),
]


@pytest.mark.parametrize("make,words", [c[1:] for c in NOT_FILES], ids=[c[0] for c in NOT_FILES])
def test_not_a_readable_file_is_a_rule_error_naming_it(tmp_path, make, words):
    path = make(tmp_path)
    with pytest.raises(rules.RuleError) as e:
        rules.parse_rules_file(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}: ") and words in msg, f"expected {path}: ... {words!r}, got {msg!r}"
    assert "KIND VALUE" in msg, f"the message does not say what to give: {msg!r}"


def test_there_are_enough_bad_rule_inputs():
    n = 2 * len(BAD_RULES) + len(BAD_FILES) + len(NOT_FILES)   # BAD_RULES: on the command line and in a file
    assert len(BAD_RULES) >= 30 and n >= 60, f"{len(BAD_RULES)} bad rules, {n} bad inputs in all"
    ids = [c[0] for c in BAD_RULES + BAD_FILES + NOT_FILES]
    assert len(set(ids)) == len(ids), "two cases share an id"


def test_crlf_comments_in_utf8_a_bom_and_repeats_are_fine(tmp_path):
    """CRLF line endings are taken (a file saved on Windows), so is a UTF-8 byte-order mark; comments
    may be any UTF-8; a repeated rule is no error (the maps hold it once)."""
    path = tmp_path / "rules.txt"
    path.write_bytes("\ufeffclient 198.18.0.0/24\r\n# M\u00fcller's office\r\n\r\n\tport 80\t\r\nport 80 # ok\r\n"
                     .encode())
    got = rules.parse_rules_file(str(path))
    assert got == [Rule("client", "198.18.0.0/24"), Rule("port", "80"), Rule("port", "80")], got


def test_every_bad_line_is_reported_not_only_the_first(tmp_path):
    path = write(tmp_path, "client 198.18.0.5/24\nclient 198.18.0.0/24\nport 0-99999\nport x\n")
    msg = str(pytest.raises(rules.RuleError, rules.parse_rules_file, path).value)
    for n in (1, 3, 4):
        assert f"{path}:{n}: " in msg, f"line {n} not named in {msg!r}"
    assert f"{path}:2: " not in msg, f"good line 2 named in {msg!r}"


def test_many_bad_lines_are_capped(tmp_path):
    path = write(tmp_path, "client 198.18.0.5/24\n" * 50)
    msg = str(pytest.raises(rules.RuleError, rules.parse_rules_file, path).value)
    assert msg.count(f"{path}:") == 21 and "and 30 more" in msg, msg   # 20 lines + "nothing was changed"


def test_cli_takes_a_rule_or_a_file_not_both(tmp_path):
    path = write(tmp_path, GOOD)
    ns = argparse.Namespace(from_file=path, kind="client", value="198.18.0.0/24")
    with pytest.raises(rules.RuleError, match="not both"):
        rules_of(ns)
    assert len(rules_of(argparse.Namespace(from_file=path, kind=None, value=None))) == 5
    assert rules_of(argparse.Namespace(from_file=None, kind="port", value="80")) == [Rule("port", "80")]
    with pytest.raises(rules.RuleError, match="give a rule"):
        rules_of(argparse.Namespace(from_file=None, kind="client", value=None))


def test_missing_file_is_named(tmp_path):
    missing = str(tmp_path / "nope.txt")
    with pytest.raises(rules.RuleError, match=f"{missing}: No such file"):
        rules_of(argparse.Namespace(from_file=missing, kind=None, value=None))


def test_quick_canonical_form_equals_ipaddress():
    """Also for the address kinds no rule may have (multicast, loopback, ...): the quick path refuses
    exactly what ipaddress's path refuses."""
    rng = random.Random(4011)
    refused = 0
    for _ in range(20000):
        v6 = rng.random() < 0.5
        bits = 128 if v6 else 32
        plen = rng.choice((0, 8, 16, 24, 32, 48, 64, 127, 128) if v6 else (0, 8, 17, 24, 31, 32))
        if v6:   # mostly zero hextets, so "::" runs of every length and position occur
            raw = int("".join(f"{rng.choice((0, 0, 0, rng.getrandbits(16))):04x}" for _ in range(8)), 16)
        else:
            raw = rng.getrandbits(32)
        net = ipaddress.ip_network((raw & ~((1 << (bits - plen)) - 1), plen))
        bad = kind_problem(net, "client")
        for spelling in (str(net), f"{net.network_address.exploded}/{plen}"):
            if bad:
                with pytest.raises(rules.RuleError, match=re.escape(bad)):
                    rules.parse_rule("client", spelling)
                refused += 1
                continue
            got = rules.parse_rule("client", spelling)
            assert got.value == str(net), f"{spelling}: expected {net}, got {got.value}"
    assert 500 < refused < 10000, f"{refused} of 40,000 spellings refused: the sample misses the address kinds"


@pytest.mark.parametrize("spelling,canonical", [
    ("198.18.0.0/255.255.255.0", "198.18.0.0/24"),      # netmasks: ipaddress's path
    ("198.18.0.7", "198.18.0.7/32"),
    ("2001:2::/048", "2001:2::/48"),
    ("0.0.0.0/0", "0.0.0.0/0"),                            # every address: of no kind
    ("::/0", "::/0"),
])
def test_unusual_spellings_fall_back_to_ipaddress(spelling, canonical):
    assert rules.parse_rule("server", spelling).value == canonical
