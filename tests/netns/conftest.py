"""A bare proxy host for pepctl's own tests: a namespace with a trunk NIC and nothing else.

   [<inst>-host]  nic0 <-veth-> peer0        pepctl runs here (nsenter --net), as on a real host

BareHost.snapshot() (netns/handle.py) lists everything an instance could leave (namespaces, links, the NIC's qdiscs,
pins, run files, the proxy's processes), so a test compares it before and after.
"""

from __future__ import annotations

import secrets
import subprocess

import pytest

from netns.handle import BareHost


@pytest.fixture
def host(tmp_path):
    """A bare proxy host namespace <inst>-host with nic0; removed at teardown."""
    inst = f"pc{secrets.token_hex(3)}"
    ns = f"{inst}-host"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "-n", ns, "link", "add", "nic0", "type", "veth", "peer", "name", "peer0"], check=True)
        subprocess.run(["ip", "-n", ns, "link", "set", "nic0", "up"], check=True)
        h = BareHost(inst, ns, tmp_path)
        yield h
        # A test that failed halfway may have left its instance up: take it down first.
        for conf in dict.fromkeys(h.configs):
            h.pepctl(conf, "down")
    finally:
        subprocess.run(["ip", "netns", "del", ns])
