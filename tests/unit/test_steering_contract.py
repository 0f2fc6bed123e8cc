"""The reason codes the control plane prints are the ones the datapath counts."""

import os
import re

from pepctl.steering import REASONS

HEADER = os.path.join(os.path.dirname(__file__), "..", "..", "tc", "pep_steer.h")


def test_reasons_match_header_enum():
    with open(HEADER) as f:
        text = f.read()
    body = re.search(r"enum steer_reason \{(.*?)\};", text, re.S).group(1)
    names = re.findall(r"^\s*REASON_([A-Z_]+)", body, re.M)
    assert names[-1] == "MAX", f"REASON_MAX must close the enum in {HEADER}, got {names[-1]}"
    assert [n.lower() for n in names[:-1]] == list(REASONS), \
        f"pepctl/steering.py REASONS {REASONS} != header {names[:-1]}"
