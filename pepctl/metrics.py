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
             bypass_failopen, bypass_control, bypass_mptcp, bypass_busy, bypass_overload,
             not_intercepted, syn_to_self
  reason     steering's trunk reasons (tc/pep_steer.h) and the datapath's packet reasons
  group      the experiment's groups: treated (proxied), control (bypassed)
  size       the experiment's flow size classes (pepctl/experiment.py SIZE_CLASSES)

pep_radio_*: graphs whose access side runs pep_radio (congestion/radio.h, read from its
radio_stats map). Its histograms' buckets are the header's (pepctl/radio_maps.py); each control
window of each subscriber is one sample.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import radio_maps


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
           "flow table events: promoted, stale, table_full, no_timer (a promotion put off: no memory for "
           "its timer that moment), expired, closed, assign_failed, record_dropped; "
           "tw_reset (a TIME_WAIT socket of the proxy ended for a new SYN), tw_old_syn (a SYN left to one), "
           "reset_to_subscriber (the proxy's FIN sent as a RST: the origin had reset); the honest handshake's "
           "syn_probed, origin_accepted, origin_refused, probe_failed; port_freed (the proxy's previous "
           "connection from a client's port ended for a new flow from it), port_held (a new flow's SYN dropped "
           "while that connection still sends or connects), fin_deferred (a client's FIN "
           "dropped until the proxy's connection to the origin is up); unowned (modes nft and route: a "
           "segment of no remembered flow and no socket, forwarded end to end, not delivered locally by the "
           "interception: a bypassed flow the tables lost)"),
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
    # pep_radio, the access side's congestion control (congestion/radio.h)
    Metric("pep_radio_queue_target_seconds", "gauge", G,
           "queueing delay pep_radio holds in the subscribers' radio buffers ([graph.access] queue_target_ms; "
           "the least: a long round trip holds more, pepctl subscribers)"),
    Metric("pep_radio_flows_started_total", "counter", G, "access-side connections that started with pep_radio"),
    Metric("pep_radio_flows_ended_total", "counter", G, "access-side connections with pep_radio that ended"),
    Metric("pep_radio_flows_warm_started_total", "counter", G,
           "connections that started at their subscriber's known rate (another flow's estimate), not from startup"),
    Metric("pep_radio_subscribers_new_total", "counter", G, "subscribers pep_radio started an estimate for (new, "
           f"or not heard from for {radio_maps.STALE_US / 1e6:g} s)"),
    Metric("pep_radio_outages_total", "counter", G, f"radio outages: no ACK for {radio_maps.OUTAGE_US / 1e3:g} ms "
           "or more with data in flight, counted once per subscriber"),
    Metric("pep_radio_outage_seconds_total", "counter", G, "the outages' total length"),
    Metric("pep_radio_control_windows_total", "counter", G,
           "control windows ended (about one minimum RTT of a subscriber): each is a sample of the histograms"),
    Metric("pep_radio_queue_delay_seconds", "histogram", G,
           "standing queueing delay of a subscriber's control window: its least RTT over the minimum RTT"),
    Metric("pep_radio_rate_bytes_per_second", "histogram", G,
           "a subscriber's estimated delivery rate at the end of a control window"),
    Metric("pep_radio_subscribers_active", "gauge", G,
           f"subscribers heard from in the last complete epoch ({radio_maps.EPOCH_US / 1e6:g} s)"),
    Metric("pep_radio_subscriber_rate_mean_bytes_per_second", "gauge", G,
           "mean estimated rate of the subscribers active in the last complete epoch"),
    Metric("pep_exporter_scrape_seconds", "gauge", (), "time the last scrape took"),
)}

# Histogram buckets (upper bounds, base units).
BUCKETS = {
    "pep_tcp_rtt_seconds": (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
    "pep_tcp_min_rtt_seconds": (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
    "pep_tcp_delivery_rate_bytes_per_second": (1e4, 1e5, 3e5, 1e6, 3e6, 1e7, 3e7, 1e8, 1e9),
    "pep_tcp_retransmit_ratio": (0.0, 0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5),
    "pep_tcp_socket_bytes": (1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9),
    # The BPF program's own buckets (the last one, +Inf, is implied here as for the others).
    "pep_radio_queue_delay_seconds": tuple(b / 1e6 for b in radio_maps.QDELAY_BOUNDS_US if b),
    "pep_radio_rate_bytes_per_second": tuple(float(b) for b in radio_maps.RATE_BOUNDS if b),
}
