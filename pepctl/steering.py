"""The control plane's side of tc/pep_steer.h: map names and reason codes.

Keep REASONS in the order of `enum steer_reason`; tests/unit/test_steering_contract.py
checks it against the header.
"""

MAPS = ("vlan_ports", "port_vlans", "vlan_stats", "reason_stats")
PROGRAMS = ("trunk_ingress", "port_ingress")

REASONS = (
    "pass_untagged",
    "pass_unknown_vlan",
    "pass_other_tpid",
    "drop_runt",
    "drop_nested_tag",
    "drop_pop_failed",
    "drop_push_failed",
    "drop_unknown_port",
)
