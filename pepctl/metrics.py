"""Every metric the instance's exporter serves: name, type, labels and help, in one place.

Prometheus naming (https://prometheus.io/docs/practices/naming/): the `pep_` prefix, base units
in the name (seconds, bytes), `_total` on counters, labels graph, side, direction, reason. The
exporter (pepctl/exporter.py) serves exactly these names; the Grafana dashboard and the alert
rules (monitoring/) may use only these, and tests check both.

Label values:
  side       access (toward subscribers), origin (toward servers)
  direction  steering: in (NIC -> graph), out (graph -> NIC); proxy bytes: in (from clients),
             out (to clients)
  verdict    flows decided on their first SYN (tc/pep_flow.h): proxied, bypass_rule,
             bypass_failopen, bypass_control, not_intercepted, syn_to_self
  reason     steering's trunk reasons (tc/pep_steer.h) and the datapath's packet reasons
  group      the experiment's groups: treated (proxied), control (bypassed)
  size       the experiment's flow size classes (pepctl/experiment.py SIZE_CLASSES)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    name: str
    type: str            # counter, gauge, histogram
    labels: tuple[str, ...]
    help: str


G, GS, GSD = ("graph",), ("graph", "side"), ("graph", "side", "direction")

CATALOGUE = {m.name: m for m in (
    Metric("pep_up", "gauge", (), "1 when the instance is up: everything `pepctl up` made is in place"),
    Metric("pep_graphs", "gauge", (), "graphs of the instance"),
    # steering (tc/steer.c)
    Metric("pep_steer_packets_total", "counter", GSD, "frames steered between the NIC and a graph's VLAN"),
    Metric("pep_steer_bytes_total", "counter", GSD, "bytes of frames steered (L2, untagged)"),
    Metric("pep_steer_trunk_packets_total", "counter", ("reason",),
           "trunk frames not steered to a graph, by reason: pass_* go to the host's stack, drop_* are lost"),
    # the flow datapath (tc/flow.c)
    Metric("pep_flows_total", "counter", ("graph", "verdict"), "new flows by the verdict of their first SYN"),
    Metric("pep_datapath_packets_total", "counter", ("graph", "reason"),
           "packets the flow datapath forwarded, handed to a socket, dropped or passed, by reason"),
    Metric("pep_flow_table_events_total", "counter", ("graph", "event"),
           "flow table events: promoted, stale, table_full, expired, closed, assign_failed, record_dropped"),
    Metric("pep_failopen", "gauge", G, "1 while the graph's new flows fail open: no proxy listener"),
    Metric("pep_failopen_switches_total", "counter", G,
           "switches between proxy and fail-open the exporter saw (it looks at HAProxy every second, "
           "at 16 graphs' listeners a second)"),
    # the proxy (HAProxy, through its stats socket)
    Metric("pep_proxy_up", "gauge", (), "1 while the instance's HAProxy runs"),
    Metric("pep_proxy_restarts_total", "counter", (), "HAProxy restarts by its supervisor"),
    Metric("pep_proxy_sessions", "gauge", G, "proxied connections open now"),
    Metric("pep_proxy_sessions_limit", "gauge", G, "the graph's maxconn"),
    Metric("pep_proxy_sessions_total", "counter", G, "proxied connections accepted"),
    Metric("pep_proxy_queue", "gauge", G, "connections waiting for a connection to the origin"),
    Metric("pep_proxy_errors_total", "counter", ("graph", "kind"),
           "proxy errors: request (client side), connect (to the origin), response (origin side)"),
    Metric("pep_proxy_bytes_total", "counter", ("graph", "direction"),
           "bytes proxied: in from clients, out to clients"),
    # TCP health of the proxy's own sockets, sampled (pepctl/tcp_sample.py)
    Metric("pep_tcp_rtt_seconds", "histogram", GS, "smoothed RTT of sampled proxy sockets"),
    Metric("pep_tcp_min_rtt_seconds", "histogram", GS, "minimum RTT of sampled proxy sockets"),
    Metric("pep_tcp_delivery_rate_bytes_per_second", "histogram", GS, "delivery rate of sampled proxy sockets"),
    Metric("pep_tcp_retransmit_ratio", "histogram", GS, "retransmitted / sent segments of sampled proxy sockets"),
    Metric("pep_tcp_socket_bytes", "histogram", GS, "bytes acknowledged + received of sampled proxy sockets"),
    Metric("pep_tcp_sampled_sockets_total", "counter", GS, "socket samples taken"),
    Metric("pep_tcp_sample_capped_total", "counter", G, "sampling rounds that reached the per-round cap"),
    Metric("pep_tcp_sample_seconds_total", "counter", (), "time spent sampling sockets"),
    # the control group (pepctl/experiment.py)
    Metric("pep_experiment_control_fraction", "gauge", G, "share of subscribers in the control group"),
    Metric("pep_experiment_flows_total", "counter", ("graph", "group", "size"), "measured flows ended"),
    Metric("pep_experiment_bytes_total", "counter", ("graph", "group", "size"), "bytes downloaded by measured flows"),
    Metric("pep_experiment_seconds_total", "counter", ("graph", "group", "size"),
           "completion time of measured flows: first SYN to the last acknowledgement"),
    Metric("pep_exporter_scrape_seconds", "gauge", (), "time the last scrape took"),
)}

# Histogram buckets (upper bounds, base units).
BUCKETS = {
    "pep_tcp_rtt_seconds": (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
    "pep_tcp_min_rtt_seconds": (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
    "pep_tcp_delivery_rate_bytes_per_second": (1e4, 1e5, 3e5, 1e6, 3e6, 1e7, 3e7, 1e8, 1e9),
    "pep_tcp_retransmit_ratio": (0.0, 0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5),
    "pep_tcp_socket_bytes": (1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9),
}
