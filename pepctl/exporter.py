"""The instance's Prometheus exporter: one endpoint per host, in the host's own namespace.

`up` starts it through etc/systemd/pep-exporter@.service (systemd, or pepctl's keeper), like the
proxy's supervisor. It listens on [host] metrics_address:metrics_port in the host's namespace:
a data VLAN's frames are steered into the graphs' namespaces, which have no route to it, so only
the host's management side reaches it. It serves exactly pepctl/metrics.py's CATALOGUE.

What a scrape reads, live: the steering and flow counters through bpf(2), HAProxy's `show stat`
through its stats socket, the supervisor's state. What a background loop keeps, every second:
  - each graph's fail-open state (its listeners, through sock_diag, as `pepctl status`) and the
    switches between proxy and fail-open; up to FAILOPEN_BATCH graphs a second, so a host of
    many graphs sees a switch within graphs / FAILOPEN_BATCH seconds. One sock_diag socket per
    graph's namespace, opened once, so a look costs one dump and no thread;
  - the experiment's flow records (pepctl/experiment.py), popped off the datapath's queue,
    counted, and appended to the instance's experiment log for `pepctl report`;
  - every tcp_sample.SAMPLE_INTERVAL seconds, a bounded sample of the proxy sockets of up to
    SAMPLE_BATCH graphs (the next ones each round) into the per-side TCP histograms.
A scrape also reads pep_radio's statistics of each graph whose access side runs it (one lookup
of its radio_stats entry, pepctl/radio_maps.py): its counters, its histograms as the BPF program
keeps them, and the subscribers active in the last complete epoch.
What the loop costs is bounded by those batches, not by the number of graphs or connections.
The instance's config is the one its journal says `up` or `reload` installed; a reload is picked
up at the next second.
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import socket
import sys
import threading
import time

from haproxy import stats as haproxy_stats

from . import config as configmod
from . import congestion, experiment, flow_maps, nsutil, radio_maps, service, steering, tcp_sample
from .metrics import BUCKETS, CATALOGUE
from .names import congestion_pins, folder_names, netns_path, previous_log
from .runner import Journal, remove_file, write_file
from .status import listen_ports

TICK = 1.0
# Graphs looked at per second (fail-open) and per sampling round (TCP): what bounds the exporter's
# idle cost on a host of many graphs (bench scale: 1,024 graphs). The datapath fails open by
# itself at once; these only say so, within graphs / FAILOPEN_BATCH seconds, or at once when
# HAProxy itself is not running (then every graph fails open).
FAILOPEN_BATCH = 16
SAMPLE_BATCH = 16
RECORDS_PER_TICK = 100_000      # pops per second at most: the queue holds RECORDS_MAX
LOG_MAX_BYTES = 256 << 20       # the experiment log is rotated to .1 beyond this
# enum flow_counter -> (metric, label value); the rest are per-graph table events.
FLOW_VERDICTS = {"flows_proxied": "proxied", "flows_bypass_rule": "bypass_rule",
                 "flows_bypass_failopen": "bypass_failopen", "flows_bypass_control": "bypass_control",
                 "flows_not_intercepted": "not_intercepted", "syn_to_self": "syn_to_self",
                 "flows_bypass_mptcp": "bypass_mptcp", "flows_bypass_busy": "bypass_busy",
                 "flows_bypass_overload": "bypass_overload"}
PACKET_REASONS = {"pkts_bypassed": "bypassed", "pkts_ttl_expired": "ttl_expired", "pkts_fib_miss": "fib_miss",
                  "pkts_not_tcp": "not_tcp", "pkts_no_flow": "no_flow", "pkts_assigned": "assigned",
                  "pkts_syncookie": "syncookie", "pkts_old_connection": "old_connection"}
TABLE_EVENTS = {"flows_promoted": "promoted", "flows_stale": "stale", "flows_table_full": "table_full",
                "flows_expired": "expired", "flows_closed": "closed", "assign_failed": "assign_failed",
                "records_dropped": "record_dropped", "flows_measured": "measured",
                "tw_reset": "tw_reset", "tw_old_syn": "tw_old_syn", "resets_to_sub": "reset_to_subscriber",
                "syns_probed": "syn_probed", "origin_accepted": "origin_accepted", "origin_refused": "origin_refused",
                "probe_failed": "probe_failed", "port_freed": "port_freed",
                "fin_deferred": "fin_deferred", "port_held": "port_held", "flows_no_timer": "no_timer",
                "pkts_unowned": "unowned"}
assert set(FLOW_VERDICTS) | set(PACKET_REASONS) | set(TABLE_EVENTS) == set(flow_maps.COUNTERS), \
    "every counter of tc/pep_flow.h has its metric"
# struct radio_graph_stats counters -> metric (outage_us, the sums and the buckets make the rest).
RADIO_COUNTERS = {"flows_started": "pep_radio_flows_started_total", "flows_ended": "pep_radio_flows_ended_total",
                  "flows_warm": "pep_radio_flows_warm_started_total",
                  "subscribers_new": "pep_radio_subscribers_new_total", "outages": "pep_radio_outages_total",
                  "windows": "pep_radio_control_windows_total"}


class Histogram:
    def __init__(self, bounds: tuple[float, ...], counts: list[int] | None = None, total: float = 0.0,
                 count: int | None = None):
        self.bounds = bounds
        self.counts = counts or [0] * (len(bounds) + 1)   # the last one: above every bound
        self.sum = total
        self.count = count      # _count when it is kept apart from the buckets (pep_radio's windows)

    def observe(self, v: float) -> None:
        i = 0
        while i < len(self.bounds) and v > self.bounds[i]:
            i += 1
        self.counts[i] += 1
        self.sum += v


def _labels(names: tuple[str, ...], values: tuple) -> str:
    """{k="v",...}, values escaped as the text format wants (backslash, quote, newline)."""
    if not names:
        return ""
    escaped = (str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") for v in values)
    return "{" + ",".join(f'{k}="{v}"' for k, v in zip(names, escaped, strict=True)) + "}"


class Exposition:
    """Text exposition format 0.0.4: every metric's HELP and TYPE once, then its samples."""

    def __init__(self):
        self.samples: dict[str, list[str]] = {name: [] for name in CATALOGUE}

    def add(self, name: str, values: tuple, value: float) -> None:
        self.samples[name].append(f"{name}{_labels(CATALOGUE[name].labels, values)} {_num(value)}")

    def histogram(self, name: str, values: tuple, h: Histogram) -> None:
        names = CATALOGUE[name].labels
        cum = 0
        for bound, n in zip((*h.bounds, float("inf")), h.counts, strict=True):
            cum += n
            le = "+Inf" if bound == float("inf") else _num(bound)
            self.samples[name].append(f"{name}_bucket{_labels((*names, 'le'), (*values, le))} {cum}")
        self.samples[name].append(f"{name}_sum{_labels(names, values)} {_num(h.sum)}")
        self.samples[name].append(f"{name}_count{_labels(names, values)} {cum if h.count is None else h.count}")

    def text(self) -> str:
        out = []
        for name, m in CATALOGUE.items():
            out.append(f"# HELP {name} {m.help}")
            out.append(f"# TYPE {name} {m.type}")
            out.extend(self.samples[name])
        return "\n".join(out) + "\n"


def _num(v: float) -> str:
    return repr(float(v)) if isinstance(v, float) and not float(v).is_integer() else str(int(v))


class Exporter:
    def __init__(self, instance_dir: str):
        self.dir = instance_dir
        self.journal = Journal(folder_names(instance_dir).journal)
        self.lock = threading.Lock()
        self.cfg = None
        self.cfg_stamp = None
        self.failopen: dict[str, bool] = {}
        self.switches: dict[str, int] = {}
        self.hist: dict[tuple[str, str, str], Histogram] = {}
        self.sampled: dict[tuple[str, str], int] = {}
        self.capped: dict[str, int] = {}
        self.sample_seconds = 0.0
        self.exp: dict[tuple[str, str, str], list[float]] = {}   # (graph, group, size) -> flows, bytes, seconds
        self.next_sample = 0.0
        self.failopen_cursor = 0
        self.sample_cursor = 0
        self.diag: dict[str, socket.socket] = {}   # graph namespace -> its sock_diag socket
        self.boot_offset = experiment.boot_offset()
        self.last_scrape = 0.0
        self.stop = threading.Event()

    # -- the installed config ------------------------------------------------------------------
    def config(self):
        try:
            stamp = os.stat(self.journal.path).st_mtime_ns
        except FileNotFoundError:
            return self.cfg
        if stamp != self.cfg_stamp:
            self.journal = Journal(self.journal.path)
            meta = self.journal.meta
            self.cfg = configmod.parse(meta["config_text"], meta["config"])
            self.cfg_stamp = stamp
        return self.cfg

    # -- the background loop --------------------------------------------------------------------
    def run_loop(self) -> None:
        while not self.stop.wait(TICK):
            try:
                cfg = self.config()
                if cfg is None:
                    continue
                self.drain_records(cfg)
                self.check_failopen(cfg)
                if time.monotonic() >= self.next_sample:
                    self.next_sample = time.monotonic() + tcp_sample.SAMPLE_INTERVAL
                    self.sample_tcp(cfg)
            except Exception as e:   # a bad second must not stop the exporter
                print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} exporter: {type(e).__name__}: {e}", flush=True)

    def drain_records(self, cfg) -> None:
        if not any(g.experiment.on for g in cfg.graphs):
            return
        n = cfg.instance_names()
        names = {g.index: g.name for g in cfg.graphs}
        lines = []
        with flow_maps.open_map(n.flow_pins, "flow_records") as q:
            for _ in range(RECORDS_PER_TICK):
                raw = q.pop()
                if raw is None:
                    break
                lines.append(experiment.decode_record(raw, self.boot_offset, names))
        if not lines:
            return
        with self.lock:
            for r in lines:
                key = (r["graph"], r["group"], experiment.size_class(r["bytes_down"]))
                acc = self.exp.setdefault(key, [0, 0, 0.0])
                acc[0] += 1
                acc[1] += r["bytes_down"]
                acc[2] += r["seconds"]
        write_log(n.experiment_log, lines)

    def check_failopen(self, cfg) -> None:
        proxied = [g for g in cfg.graphs if g.proxy.enabled]
        if proxied and not service.processes(cfg.instance_names())["haproxy"]["running"]:
            for g in proxied:   # no HAProxy: no listener anywhere
                self.set_failopen(g.name, True)
            return
        batch, self.failopen_cursor = next_batch(proxied, self.failopen_cursor, FAILOPEN_BATCH)
        for g in batch:
            ns = cfg.graph_names(g).netns
            try:
                if ns not in self.diag:
                    self.diag[ns] = nsutil.in_netns(ns, nsutil.diag_socket)
                have = nsutil.listening_ports(ns, self.diag[ns])
            except OSError:
                old = self.diag.pop(ns, None)   # the namespace went away, or the socket broke
                if old is not None:
                    old.close()
                continue
            self.set_failopen(g.name, not listen_ports(g) <= have)

    def set_failopen(self, graph: str, fail: bool) -> None:
        with self.lock:
            if graph in self.failopen and self.failopen[graph] != fail:
                self.switches[graph] = self.switches.get(graph, 0) + 1
            self.failopen[graph] = fail

    def sample_tcp(self, cfg) -> None:
        t0 = time.monotonic()
        batch, self.sample_cursor = next_batch([g for g in cfg.graphs if g.proxy.enabled], self.sample_cursor,
                                               SAMPLE_BATCH)
        for g in batch:
            access = [a.network for a in g.access.addresses] + list(g.access.prefixes)
            try:
                got, capped = tcp_sample.sample(cfg.graph_names(g).netns)
            except OSError:
                continue
            with self.lock:
                if capped:
                    self.capped[g.name] = self.capped.get(g.name, 0) + 1
                for s in got:
                    side = tcp_sample.side_of(s.remote, access)
                    self.sampled[(g.name, side)] = self.sampled.get((g.name, side), 0) + 1
                    for name, v in (("pep_tcp_rtt_seconds", s.rtt), ("pep_tcp_min_rtt_seconds", s.min_rtt),
                                    ("pep_tcp_delivery_rate_bytes_per_second", s.delivery_rate),
                                    ("pep_tcp_retransmit_ratio", s.retransmit_ratio),
                                    ("pep_tcp_socket_bytes", s.bytes)):
                        self.hist.setdefault((name, g.name, side), Histogram(BUCKETS[name])).observe(v)
        with self.lock:
            self.sample_seconds += time.monotonic() - t0

    # -- a scrape ---------------------------------------------------------------------------------
    def scrape(self) -> str:
        t0 = time.monotonic()
        cfg = self.config()
        e = Exposition()
        if cfg is None:
            e.add("pep_up", (), 0)
            return e.text()
        n = cfg.instance_names()
        e.add("pep_up", (), int(self.journal.complete))
        e.add("pep_graphs", (), len(cfg.graphs))
        for g in cfg.graphs:
            for side, vid in (("access", g.access.vlan), ("origin", g.origin.vlan)):
                c = _or_empty(steering.vlan_counters, n.steer_pins, vid)
                for direction in ("in", "out"):
                    e.add("pep_steer_packets_total", (g.name, side, direction), c.get(f"{direction}_packets", 0))
                    e.add("pep_steer_bytes_total", (g.name, side, direction), c.get(f"{direction}_bytes", 0))
        for reason, v in _or_empty(steering.reason_counters, n.steer_pins).items():
            e.add("pep_steer_trunk_packets_total", (reason,), v)
        proxied = [g for g in cfg.graphs if g.proxy.enabled]
        for g in proxied:
            c = _or_empty(flow_maps.read_counters, n.flow_pins, g.index)
            for key, v in c.items():
                if key in FLOW_VERDICTS:
                    e.add("pep_flows_total", (g.name, FLOW_VERDICTS[key]), v)
                elif key in PACKET_REASONS:
                    e.add("pep_datapath_packets_total", (g.name, PACKET_REASONS[key]), v)
                else:
                    e.add("pep_flow_table_events_total", (g.name, TABLE_EVENTS[key]), v)
            e.add("pep_experiment_control_fraction", (g.name,), g.experiment.control_fraction)
        self.proxy_metrics(e, cfg, proxied)
        radio_metrics(e, cfg)
        with self.lock:
            for g in proxied:
                if g.name in self.failopen:
                    e.add("pep_failopen", (g.name,), int(self.failopen[g.name]))
                e.add("pep_failopen_switches_total", (g.name,), self.switches.get(g.name, 0))
                e.add("pep_tcp_sample_capped_total", (g.name,), self.capped.get(g.name, 0))
            for (name, graph, side), h in sorted(self.hist.items()):
                e.histogram(name, (graph, side), h)
            for (graph, side), v in sorted(self.sampled.items()):
                e.add("pep_tcp_sampled_sockets_total", (graph, side), v)
            e.add("pep_tcp_sample_seconds_total", (), self.sample_seconds)
            for (graph, group, size), (flows, nbytes, secs) in sorted(self.exp.items()):
                e.add("pep_experiment_flows_total", (graph, group, size), flows)
                e.add("pep_experiment_bytes_total", (graph, group, size), nbytes)
                e.add("pep_experiment_seconds_total", (graph, group, size), secs)
        e.add("pep_exporter_scrape_seconds", (), self.last_scrape)
        self.last_scrape = time.monotonic() - t0
        return e.text()

    def proxy_metrics(self, e: Exposition, cfg, proxied) -> None:
        if not proxied:
            return
        n = cfg.instance_names()
        procs = service.processes(n)
        e.add("pep_proxy_up", (), int(procs["haproxy"]["running"]))
        e.add("pep_proxy_restarts_total", (), procs["restarts"])
        try:
            rows = haproxy_stats.stats(n.haproxy_sock)
        except OSError:
            return
        by = {(r["pxname"], r["svname"]): r for r in rows}
        for g in proxied:
            px = cfg.graph_names(g).proxy
            fe, be = by.get((px, "FRONTEND")), by.get((px, "BACKEND"))
            if fe:
                e.add("pep_proxy_sessions", (g.name,), _int(fe["scur"]))
                e.add("pep_proxy_sessions_limit", (g.name,), _int(fe["slim"]))
                e.add("pep_proxy_sessions_total", (g.name,), _int(fe["stot"]))
                e.add("pep_proxy_bytes_total", (g.name, "in"), _int(fe["bin"]))
                e.add("pep_proxy_bytes_total", (g.name, "out"), _int(fe["bout"]))
                e.add("pep_proxy_errors_total", (g.name, "request"), _int(fe["ereq"]))
            if be:
                e.add("pep_proxy_queue", (g.name,), _int(be["qcur"]))
                e.add("pep_proxy_errors_total", (g.name, "connect"), _int(be["econ"]))
                e.add("pep_proxy_errors_total", (g.name, "response"), _int(be["eresp"]))


def radio_metrics(e: Exposition, cfg) -> None:
    """pep_radio's statistics of each graph whose access side runs it. Before its first socket a
    graph has no entry: its counters are 0."""
    graphs = congestion.radio_graphs(cfg)
    if not graphs:
        return
    for g in graphs:
        e.add("pep_radio_queue_target_seconds", (g.name,), g.access.queue_target_ms / 1000)
    try:
        m = radio_maps.open_stats(congestion_pins(radio_maps.NAME))
    except (OSError, ValueError):
        return      # not registered (status says so), or a layout this pepctl does not speak
    with m:
        for g in graphs:
            try:
                st = radio_maps.stats_of(m, netns_path(cfg.graph_names(g).netns))
            except (OSError, ValueError):
                continue
            radio_graph_metrics(e, g.name, st or radio_maps.STATS.zero())


def radio_graph_metrics(e: Exposition, graph: str, st: dict) -> None:
    """One graph's radio_stats entry as metrics: counters, the BPF program's histograms (_count:
    the windows counted), and the subscribers active in the last complete epoch."""
    for key, name in RADIO_COUNTERS.items():
        e.add(name, (graph,), st[key])
    e.add("pep_radio_outage_seconds_total", (graph,), st["outage_us"] / 1e6)
    e.histogram("pep_radio_queue_delay_seconds", (graph,),
                Histogram(BUCKETS["pep_radio_queue_delay_seconds"], list(st["qdelay_bucket"]),
                          st["qdelay_sum_us"] / 1e6, st["windows"]))
    e.histogram("pep_radio_rate_bytes_per_second", (graph,),
                Histogram(BUCKETS["pep_radio_rate_bytes_per_second"], list(st["rate_bucket"]), st["rate_sum"],
                          st["windows"]))
    n, rate = radio_maps.active(st)
    e.add("pep_radio_subscribers_active", (graph,), n)
    e.add("pep_radio_subscriber_rate_mean_bytes_per_second", (graph,), rate)


def next_batch(items: list, cursor: int, size: int) -> tuple[list, int]:
    """Up to size items from cursor on, wrapping around; and the cursor after them."""
    if not items:
        return [], 0
    start = cursor % len(items)
    batch = (items + items)[start:start + min(size, len(items))]
    return batch, start + len(batch)


def _int(text: str) -> int:
    return int(text or 0)


def _or_empty(fn, *args) -> dict:
    try:
        return fn(*args)
    except (OSError, ValueError):
        return {}


def write_log(path: str, records: list[dict]) -> None:
    """Appends records as JSON lines; beyond LOG_MAX_BYTES the log becomes path.1 (one kept)."""
    try:
        if os.path.getsize(path) > LOG_MAX_BYTES:
            os.replace(path, previous_log(path))
    except FileNotFoundError:
        pass
    with open(path, "a") as f:
        f.write("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records))


def _handler(exporter: Exporter):
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404, "try /metrics")
                return
            try:
                body = exporter.scrape().encode()
            except Exception as e:
                self.send_error(500, f"{type(e).__name__}: {e}")
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass
    return Handler


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True


class _Server6(_Server):
    address_family = socket.AF_INET6


def serve(instance_dir: str) -> int:
    ex = Exporter(instance_dir)
    cfg = ex.config()
    if cfg is None:
        print(f"exporter: no journal beside {instance_dir}: is the instance up?", file=sys.stderr)
        return 1
    host, names = cfg.host, cfg.instance_names()
    server_class = _Server6 if ":" in host.metrics_address else _Server
    try:
        server = server_class((host.metrics_address, host.metrics_port), _handler(ex))
    except OSError as e:
        why = f"exporter: cannot listen on {host.metrics_address} port {host.metrics_port}: {e.strerror}; " \
              "change [host] metrics_port (0: no exporter)"
        print(why, file=sys.stderr, flush=True)
        write_file(names.exporter_failed, why + "\n")   # `up` fails at once, not after its timeout
        return 1
    remove_file(names.exporter_failed)
    for _ in range(0, len(cfg.graphs), FAILOPEN_BATCH):   # every graph's state before the first scrape
        ex.check_failopen(cfg)
    loop = threading.Thread(target=ex.run_loop, name="exporter-loop", daemon=True)
    loop.start()

    def on_term(signum, _frame):
        ex.stop.set()
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    print(f"exporter: serving http://{host.metrics_address}:{host.metrics_port}/metrics", flush=True)
    pid_file = names.exporter_pid
    write_file(pid_file, f"{os.getpid()}\n")   # listening: `up` waits for this
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        server.server_close()
        remove_file(pid_file)
    return 0
