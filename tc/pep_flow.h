/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The contract between the flow datapath (tc/flow.c: programs flow_ingress,
 * flow_egress, flow_conns) and the control plane (pepctl/flow_maps.py). Map
 * names, struct layouts, verdicts, flags and counters live here and only here.
 *
 * If you change this file, change with it:
 *   - pepctl/flow_maps.py            (struct formats, COUNTERS, flags, map names)
 *   - tests/bpf/test_flow_golden.py  (expected verdicts and counters)
 *   (tests/unit/test_flow_contract.py compares the first with this file)
 * and keep what `pepctl upgrade` relies on to swap a running datapath for
 * this one (pepctl/upgrade.py, pepctl/layouts.py): a map whose layout
 * changes has its entries carried over field by field, by name (a field
 * whose meaning changes takes a new name); a program keeps its name and its
 * hook; a counter keeps its number.
 *
 * Where it runs: one set of programs and maps per instance. flow_ingress and
 * flow_egress are attached to tc clsact ingress and egress of c_in (access
 * side) and s_in (origin side) inside every graph's namespace; flow_conns
 * (sock_ops) to the root of the host's cgroup v2 hierarchy. The graph and side of a packet come from the
 * interface it arrived on: pepctl gives c_in and s_in of graph slot g the
 * ifindexes PEP_IFINDEX_BASE + 2g and PEP_IFINDEX_BASE + 2g + 1 (ifindexes
 * are per namespace, so every graph's namespace holds the same small set).
 * An interface outside that range, or of a slot without GRAPH_F_ENABLED,
 * is left to the stack untouched and uncounted.
 *
 * Every TCP flow is decided on its first SYN (SYN without ACK), in order:
 *   1. addressed to one of the graph's own addresses (graph_addrs): dropped,
 *      the proxy answers no connection to the PEP itself (syn_to_self);
 *   2. a port the graph does not intercept, or opened from the origin side
 *      when the graph intercepts access-side flows only: left to the stack
 *      and not remembered (flows_not_intercepted);
 *   3. a bypass rule matches (client / server prefix, destination port:
 *      bypass_client4/6, bypass_server4/6, bypass_ports):
 *      BYPASS_RULE;
 *   3a. the SYN carries an MPTCP option (MP_CAPABLE, or MP_JOIN of a subflow),
 *      unless the graph has GRAPH_F_PROXY_MPTCP: BYPASS_MPTCP. HAProxy would
 *      answer it as plain TCP, and a multipath subscriber would lose its
 *      subflows; bypassed, the origin sees MP_CAPABLE and answers it;
 *   3b. opened from the access side by a subscriber of the control group
 *      (client_hash(subscriber, control_seed) < control_below): BYPASS_CONTROL;
 *   3c. GRAPH_F_KEEP_PORT (source_port = "kept"), and the proxy could not
 *      connect from the client's own port as things are:
 *      - a socket of the graph's namespace listens on that port (HAProxy's
 *        own listener: bind() would fail), or holds the origin side's
 *        4-tuple in state CLOSE (on its way out of the table): BYPASS_BUSY,
 *        the flow goes end to end, as it would with no proxy;
 *      - a socket holds the origin side's 4-tuple: the proxy's previous
 *        connection from that port, which the client has left (it reuses the
 *        port), not closed yet, and its origin perhaps holding its end too.
 *        It is ended by a RST as from the origin, and, if the origin has not
 *        closed its end, by a RST to the origin first (at the socket's
 *        snd_nxt); then the SYN is decided again (port_freed). Still there on
 *        the SYN's second round (its process was in close()): BYPASS_BUSY,
 *        the flow goes end to end (with the honest handshake, the probe's
 *        round trip gives the socket its time; still there when the
 *        origin's answer comes, BYPASS_BUSY then). Still sending (data not
 *        yet sent to the origin) or still connecting: the SYN is dropped
 *        (port_held) and the client sends it again;
 *   4. no proxy socket listens for it (the graph's listen_port, or the SYN's
 *      own port when listen_port is 0): BYPASS_FAILOPEN. This is the fail-open:
 *      the moment HAProxy dies its listeners are gone, and new flows are
 *      forwarded, with no process or polling in between;
 *   4b. the proxy could not take the flow now: the listener's accept queue
 *      is full, or the graph (or the instance) holds maxconn connections
 *      (conns, counted by flow_conns as the kernel opens and closes them):
 *      BYPASS_OVERLOAD, so that a flow never waits for HAProxy to make room;
 *   5. otherwise PROXY. With GRAPH_F_ASSIGN (interception mode `bpf`) the SYN
 *      is handed to the listener (bpf_sk_assign) and marked PEP_LOCAL_MARK,
 *      which one policy rule routes to the local table; a failed hand-over
 *      makes the flow BYPASS_FAILOPEN (assign_failed). Without it (modes nft
 *      and route) the stack's own interception takes the SYN.
 *      Mode bpf, a TIME_WAIT socket of the proxy on the SYN's 4-tuple (the
 *      listener would drop the SYN as a duplicate of it), checked before
 *      step 3c: when the kernel would let the SYN past it, the SYN is made a
 *      RST that ends it and a copy of the SYN (PEP_RETRY_MARK) is decided
 *      again (tw_reset); else (an old duplicate, or still there on the
 *      retry) the SYN goes to the TIME_WAIT socket, which answers as the
 *      kernel does (tw_old_syn).
 * Bypassed flows (verdicts 3 to 4) are remembered and forwarded at L3 by
 * this program for their whole life, whatever the rules or the proxy do
 * later. Proxied flows are not remembered: they are known by their sockets.
 * With GRAPH_F_ASSIGN every later packet whose socket exists (bpf_skc_lookup_tcp)
 * is marked for local delivery, where the kernel's early demultiplexing takes
 * it to that socket with the input route cached on it: nearly all of them are
 * a proxied flow's, which then skip the flow tables. Then the flow
 * tables (a bypassed flow's packets); then an ACK that carries a valid SYN
 * cookie of the listener goes to the listener (the handshake of a flow
 * answered by a cookie under a SYN flood). Everything else goes to the
 * stack untouched, but for one kind in modes nft and route: a segment to or
 * from an intercepted service port that no socket here owns and that
 * carries no valid SYN cookie. The stack's interception would deliver it
 * locally (to the listener, which would reset it; route mode's rules take
 * the origin's answers too, to no socket); it is a bypassed flow's whose
 * entry was lost, or a late one of a connection the proxy has ended, and is
 * forwarded end to end (pkts_unowned). Mode bpf's stack routes such a
 * segment on.
 *
 * The flow tables, so that no flood of new flows evicts a live bypassed one:
 *   flows_new  LRU: bypassed flows whose handshake is not complete. A SYN
 *              flood (spoofed sources never complete a handshake) churns
 *              only this table.
 *   flows      HASH, allocated on demand: bypassed flows whose opener has
 *              acknowledged the answering SYN-ACK (the ISN of the other end:
 *              a blind spoofer cannot). Entries leave by their own timer:
 *              FLOW_IDLE_NS after the last packet, FLOW_LINGER_NS after a
 *              RST or the second FIN. When it is full, a flow stays in
 *              flows_new (flows_table_full counts the pressure); so it does
 *              while the kernel has no memory for its timer (flows_no_timer:
 *              frequent on 6.18). Its state is then FLOW_PROVEN, and each
 *              of its segments tries again; meanwhile a SYN flood churning
 *              flows_new may evict it, the quietest flows first (LRU), and
 *              its later segments then find no entry: forwarded all the same
 *              as nobody's (above), the connection goes on. Its
 *              FINs are not counted there: promoted late, an entry whose
 *              FIN passed before leaves idle (FLOW_IDLE_NS), not closed.
 *
 * Non-TCP, IPv4 fragments and IPv6 with extension headers go to the stack.
 */
#ifndef PEP_FLOW_H
#define PEP_FLOW_H

#define PEP_GRAPHS_MAX 2048          /* a graph takes two of the 4094 VLAN ids */
#define PEP_IFINDEX_BASE 0x100000    /* c_in of slot g: BASE + 2g; s_in: BASE + 2g + 1 */
#define PEP_LOCAL_MARK 1             /* skb mark of packets handed to a socket: routed locally */
#define PEP_RETRY_MARK 2             /* a SYN the program sent round again to its own ingress */
#define PEP_PORT_RETRY_MARK 3        /* the same, once the proxy's previous connection from its port ended */

#define FLOWS_NEW_MAX 262144         /* LRU, preallocated */
#define FLOWS_MAX 1048576            /* allocated on demand */
#define RULES_MAX 1048576            /* per LPM map, all graphs together */
#define PORTS_MAX 1048576            /* bypass_ports, intercept_ports: all graphs together */
#define ADDRS_MAX 65536              /* graph_addrs, all graphs together */

#define FLOW_IDLE_NS (6ULL * 3600 * 1000000000)  /* longer than TCP keepalive's 2 h */
#define FLOW_LINGER_NS (60ULL * 1000000000)      /* after RST or both FINs: late segments */
#define FLOW_TOUCH_NS (1000000000ULL)            /* last_seen is refreshed at most this often */

enum flow_side {
	SIDE_ACCESS = 1,
	SIDE_ORIGIN = 2,
};

/* graphs: ARRAY[PEP_GRAPHS_MAX] indexed by graph slot. */
struct graph_config {
	__u32 flags;          /* GRAPH_F_* */
	__u16 listen_port;    /* host order: the proxy's listener for new flows; 0: the SYN's own port */
	__u16 pad;
	__u32 control_below;  /* the control group: clients whose client_hash() is below; 0: none */
	__u32 control_seed;   /* the seed of client_hash(): another seed draws another share */
	__u32 maxconn;        /* the graph's connections at which new flows go end to end; 0: no limit */
	__u32 host_maxconn;   /* the same for all of the instance's graphs together; 0: no limit */
};

#define GRAPH_F_ENABLED     0x1  /* the slot is in use */
#define GRAPH_F_ASSIGN      0x2  /* interception mode bpf: hand proxied flows to their sockets */
#define GRAPH_F_ALL_PORTS   0x4  /* every TCP port is intercepted; else those in intercept_ports */
#define GRAPH_F_ORIGIN_SYNS 0x8  /* flows opened from the origin side are intercepted too */
#define GRAPH_F_MEASURE     0x10 /* the experiment is on: measure access-side flows of both groups */
#define GRAPH_F_PROXY_MPTCP 0x20 /* mptcp = "proxy": SYNs with an MPTCP option are decided as any other */
#define GRAPH_F_KEEP_PORT   0x40 /* source_port = "kept": the proxy connects from the client's own port */
#define GRAPH_F_HONEST      0x80 /* handshake = "honest" (mode bpf): the origin answers a flow's SYN first */

/* bypass_ports, intercept_ports: HASH port_key -> __u32 (non-zero: present).
 * bypass_ports: SYNs to that port are bypassed (a rule). intercept_ports:
 * the ports a graph without GRAPH_F_ALL_PORTS intercepts. Port in host order. */
struct port_key {
	__u32 graph;
	__u32 port;
};

/* graph_addrs: HASH {graph, address} -> __u32 (1): the graph's own addresses. */
struct addr_key {
	__u32 graph;
	__u8 addr[16];      /* IPv4 as ::ffff:a.b.c.d */
};

/* LPM rule maps bypass_client4, bypass_server4 (lpm4_key), bypass_client6,
 * bypass_server6 (lpm6_key). prefixlen counts the graph too: 32 + the
 * network's length. The value is non-zero when the rule is present, so a
 * longer prefix stored with 0 carves an exception out of a shorter one. */
struct lpm4_key {
	__u32 prefixlen;
	__be32 graph;       /* network byte order: the leading 32 bits of the match */
	__u8 addr[4];
};

struct lpm6_key {
	__u32 prefixlen;
	__be32 graph;
	__u8 addr[16];
};

/* The key of both flow tables: the flow as the subscriber sees it, so both
 * directions find the same entry. */
struct flow_key {
	__u8 sub_addr[16];  /* subscriber (access side); IPv4 as ::ffff:a.b.c.d */
	__u8 org_addr[16];  /* origin side */
	__u16 sub_port;     /* network byte order */
	__u16 org_port;     /* network byte order */
	__u16 graph;        /* graph slot */
	__u8 family;        /* 4 or 6 */
	__u8 pad;
};

enum flow_verdict {
	VERDICT_PROXY = 1,
	VERDICT_BYPASS_RULE = 2,
	VERDICT_BYPASS_FAILOPEN = 3,
	VERDICT_BYPASS_CONTROL = 4,   /* the subscriber is in the control group */
	VERDICT_BYPASS_MPTCP = 5,     /* the SYN carries an MPTCP option: multipath end to end */
	VERDICT_BYPASS_BUSY = 6,      /* the client's port is taken on the proxy's origin side */
	VERDICT_BYPASS_OVERLOAD = 7,  /* the proxy cannot take another connection now */
};

enum flow_state {
	FLOW_SYN_SEEN = 1,     /* the opening SYN went through */
	FLOW_SYNACK_SEEN = 2,  /* and the other end answered it */
	FLOW_PROVEN = 3,       /* and the opener acknowledged the answer, but `flows` did not take
				* the flow yet (table_full, no_timer): any segment tries again */
};

/* marks: LRU_HASH flow_key -> flow_marks. What a proxied flow's two ends put
 * on their packets, for the proxy's packets to the other end to carry
 * (flow_egress, on c_in's and s_in's egress): with source_port = "kept"
 * (the default) the proxy's two sockets have the flow's own 4-tuple, so one
 * key finds the flow from either side. Made at the first SYN (PROXY),
 * updated by the ends' segments (mode bpf), left to the LRU. */
#define MARKS_MAX 262144

struct flow_marks {
	__u8 sub_dscp;        /* the subscriber's DSCP, as the TOS / traffic class byte (ECN bits 0) */
	__u8 org_dscp;        /* the origin's */
	__u8 flags;           /* MARK_F_* */
	__u8 seen;            /* MARK_S_*: what the flow's segments have shown so far */
	__u16 sub_mss;        /* host order: the MSS the subscriber's SYN offered; 0: none */
	__u16 org_mss;        /* the MSS the origin's SYN-ACK offered (honest handshake) */
};

#define MARK_F_SUB_ECN   0x1  /* the subscriber's SYN asked for ECN: the proxy's SYN to the origin does */
#define MARK_F_ORG_RESET 0x2  /* the origin reset the flow: the proxy's FIN to the subscriber goes as a RST */
/* What each end's handshake offered, mirrored on the proxy's own: the
 * proxy's SYN offers SACK and timestamps only as the subscriber's did, and
 * an MSS no larger; the rebuilt SYN (so the proxy's SYN-ACK) offers SACK and
 * timestamps only as the origin's SYN-ACK did, and the proxy's SYN-ACK an
 * MSS no larger than the origin's. Window scale is each socket's own. */
#define MARK_F_SUB_SACK  0x4
#define MARK_F_SUB_TS    0x8
#define MARK_F_ORG_SACK  0x10
#define MARK_F_ORG_TS    0x20
#define MARK_F_SUB_OPTS  0x40  /* the subscriber's offer is known (the fields above it) */
#define MARK_F_ORG_OPTS  0x80  /* the origin's offer is known */
#define MARK_S_SUB_DATA  0x1   /* the subscriber has sent data (mode bpf) */
#define MARK_S_FIN_HELD  0x2   /* a FIN of the subscriber's was held back once (fin_deferred) */
#define MARK_S_KEPT      0x4   /* decided with GRAPH_F_KEEP_PORT: the proxy connects from the client's
				* port. A flow proxied before (source_port "any" then, or an older
				* datapath: pepctl upgrade) is told by its flags of its own day */

/* syns: LRU_HASH flow_key -> flow_syn. The honest handshake (GRAPH_F_HONEST,
 * mode bpf): a first SYN that would be proxied goes on to the origin first,
 * recorded here (SYN_PROBING); retransmissions go on too. The origin's
 * answer decides, at the other side's ingress:
 *   RST (refused)  passed on to the opener as routed; the entry goes
 *                  (origin_refused);
 *   SYN-ACK        not passed on: that very packet becomes a RST to the
 *                  origin (seq = its ack: the origin forgets its half-open
 *                  connection), sent out, and then the opener's SYN rebuilt
 *                  from this entry (its IP fields and TCP options; ECE and
 *                  CWR only if the origin agreed to ECN), put in at the
 *                  opener's interface (SYN_ACCEPTED, origin_accepted);
 *   nothing        nothing: the opener is answered by no one, as routed.
 * The rebuilt SYN, and any retransmission once accepted, goes to the
 * listener as in step 5; HAProxy then connects to the origin as ever. A
 * SYN whose flow the datapath cannot rebuild (data in it, IPv4 options) is
 * handed to the listener at once; an answer it cannot rewrite makes the
 * flow BYPASS_FAILOPEN, the answer passed on (probe_failed). */
#define SYNS_MAX 262144

enum syn_state {
	SYN_PROBING = 1,      /* the SYN went on to the origin */
	SYN_ACCEPTED = 2,     /* the origin answered SYN-ACK: the rebuilt SYN went to the listener */
};

struct flow_syn {
	__u32 syn_seq;        /* the opener's ISN */
	__u8 state;           /* enum syn_state */
	__u8 opener;          /* enum flow_side of the SYN's sender */
	__u8 tcp_flags;       /* the SYN's flags byte (ECE, CWR) */
	__u8 opt_len;         /* bytes of opts */
	__be16 window;
	__u8 ttl;             /* TTL / hop limit */
	__u8 tos;             /* IPv4 TOS */
	__be32 ip_word;       /* IPv4: id and frag_off; IPv6: version, traffic class, flow label */
	__u8 macs[12];        /* the SYN's destination and source MACs */
	__u8 opts[40];        /* its TCP options, as they came */
	__u32 pad;
	__u64 first_seen_ns;
};

/* The proxy's connections, for step 4b: flow_conns, a sock_ops program
 * attached to the root of the host's cgroup v2 hierarchy (every socket's),
 * counts each connection accepted in a graph's namespace from its handshake's
 * end (PASSIVE_ESTABLISHED) to its close (the STATE callback, TCP_CLOSE).
 * That is HAProxy's own count (accept() to close()) plus connections waiting
 * in the accept queue and closing ones: never less, so the datapath bypasses
 * no later than HAProxy would stop accepting.
 *   netns_slots  HASH netns cookie (__u64) -> graph slot (__u32), by pepctl
 *   conns        ARRAY[PEP_GRAPHS_MAX + 1] of __u64: per slot, and the sum
 *                of all at PEP_GRAPHS_MAX
 *   conn_tags    SK_STORAGE conn_tag: a counted socket's slot, so its close
 *                is counted once */
struct conn_tag {
	__u32 slot1;          /* the slot + 1; 0: not counted (any more) */
};

/* flows_new: LRU_HASH flow_key -> flow_new. */
struct flow_new {
	__u32 verdict;        /* enum flow_verdict (a bypass) */
	__u32 syn_seq;        /* ISN of the opening SYN: another ISN on the 4-tuple is a new flow */
	__u32 synack_seq;     /* ISN of the answering SYN-ACK (state FLOW_SYNACK_SEEN) */
	__u8 opener;          /* enum flow_side of the SYN's sender */
	__u8 state;           /* enum flow_state */
	__u16 pad;
	__u64 first_seen_ns;  /* bpf_ktime_get_ns() of the first SYN */
};

/* flows: HASH (BPF_F_NO_PREALLOC) flow_key -> flow_est. */
struct flow_est {
	__u32 verdict;        /* enum flow_verdict (a bypass) */
	__u32 syn_seq;
	__u64 first_seen_ns;
	__u64 last_seen_ns;   /* refreshed at most once per FLOW_TOUCH_NS */
	__u8 fins;            /* sides that sent a FIN: bit (side - 1) */
	__u8 closing;         /* RST or both FINs seen: the entry lingers FLOW_LINGER_NS */
	__u8 pad[6];
	struct bpf_timer timer;  /* expires the entry (idle or closed) */
};

/* flow_stats: PERCPU_ARRAY[PEP_GRAPHS_MAX * CNT_MAX] of __u64, indexed by
 * graph slot * CNT_MAX + enum flow_counter. A counter keeps its number: new
 * ones go at the end (pepctl upgrade carries a running instance's counters
 * over by number, pepctl/flow_maps.py stats_index). */
enum flow_counter {
	CNT_FLOWS_PROXIED = 0,      /* first SYNs decided PROXY */
	CNT_FLOWS_BYPASS_RULE,      /* first SYNs decided BYPASS_RULE */
	CNT_FLOWS_BYPASS_FAILOPEN,  /* first SYNs decided BYPASS_FAILOPEN (no listener, or assign failed) */
	CNT_FLOWS_NOT_INTERCEPTED,  /* first SYNs of ports / directions not intercepted: the stack's */
	CNT_SYN_TO_SELF,            /* first SYNs to the graph's own addresses: dropped */
	CNT_ASSIGN_FAILED,          /* bpf_sk_assign refused a socket: closing, or not at tc ingress
				     * (BPF_PROG_TEST_RUN runs refuse every one) */
	CNT_PKTS_BYPASSED,          /* packets forwarded by this program */
	CNT_PKTS_TTL_EXPIRED,       /* bypassed packets dropped: TTL / hop limit <= 1. Not left to the
				     * stack, whose interception would hand them to HAProxy */
	CNT_PKTS_FIB_MISS,          /* bypassed packets dropped: no route (blackhole, unreachable) */
	CNT_PKTS_NOT_TCP,           /* passed: ICMP, UDP, fragments, ... (routed by the stack) */
	CNT_PKTS_NO_FLOW,           /* passed: TCP of no remembered flow and (mode bpf) no socket */
	CNT_PKTS_ASSIGNED,          /* mode bpf: later packets of a flow with a socket: marked for it */
	CNT_PKTS_SYNCOOKIE,         /* mode bpf: ACKs with a valid SYN cookie handed to the listener */
	CNT_FLOWS_STALE,            /* entries forgotten: a SYN-ACK answered another SYN on the 4-tuple
				     * (e.g. HAProxy reusing a bypassed flow's port toward the origin) */
	CNT_FLOWS_PROMOTED,         /* bypassed flows moved to `flows` (handshake complete) */
	CNT_FLOWS_TABLE_FULL,       /* promotions refused: `flows` full, or no memory for an entry */
	CNT_FLOWS_EXPIRED,          /* `flows` entries removed idle for FLOW_IDLE_NS */
	CNT_FLOWS_CLOSED,           /* `flows` entries removed FLOW_LINGER_NS after RST / both FINs */
	CNT_FLOWS_BYPASS_CONTROL,   /* first SYNs decided BYPASS_CONTROL (the control group) */
	CNT_FLOWS_MEASURED,         /* flows measured for the experiment (GRAPH_F_MEASURE) */
	CNT_RECORDS_DROPPED,        /* measured flows' records lost: flow_records full (nobody pops it) */
	CNT_FLOWS_BYPASS_MPTCP,     /* first SYNs decided BYPASS_MPTCP */
	CNT_TW_RESET,               /* mode bpf: TIME_WAIT sockets of the proxy ended by a RST so that a
				     * new SYN on their 4-tuple reaches the listener (sent round again) */
	CNT_TW_OLD_SYN,             /* mode bpf: SYNs given to the TIME_WAIT socket of their 4-tuple, which
				     * answers as the kernel does: an old duplicate, or the retry found it */
	CNT_FLOWS_BYPASS_BUSY,      /* first SYNs decided BYPASS_BUSY */
	CNT_RESETS_TO_SUB,          /* the proxy's FINs to a subscriber sent as RSTs: the origin had reset */
	CNT_SYNS_PROBED,            /* honest: first SYNs sent on to the origin before the proxy answers */
	CNT_ORIGIN_ACCEPTED,        /* honest: SYN-ACKs made the origin's RST and the opener's SYN to the listener */
	CNT_ORIGIN_REFUSED,         /* honest: RSTs answering a probe, passed on to the opener */
	CNT_PROBE_FAILED,           /* honest: answers not rewritten: the flow went end to end (bypass_failopen) */
	CNT_FLOWS_BYPASS_OVERLOAD,  /* first SYNs decided BYPASS_OVERLOAD */
	CNT_PORT_FREED,             /* port kept: the proxy's previous origin-side socket of a client's port
				     * ended by a RST (and its origin's end by another, if still open) so
				     * that a new SYN from that port is proxied (sent round again) */
	CNT_FIN_DEFERRED,           /* mode bpf: a subscriber's bare FIN dropped, before its proxy's
				     * connection to the origin is up (the subscriber sends it again) */
	CNT_PORT_HELD,              /* port kept: a client's SYN dropped, the proxy's previous connection
				     * from its port still at work (data to send, connecting) */
	CNT_PKTS_OLD_CONNECTION,    /* dropped: a segment from the end that has not answered a bypassed
				     * flow's SYN yet, and not its answer: an earlier connection's on
				     * the 4-tuple (the proxy's, on a port a client reused at once) */
	CNT_FLOWS_NO_TIMER,         /* promotions put off: no memory for the entry's timer at that moment
				     * (bpf_timer_init); the flow stays in flows_new (FLOW_PROVEN), tried
				     * again on its next segment */
	CNT_PKTS_UNOWNED,           /* modes nft and route: a segment to or from an intercepted service port,
				     * of no remembered flow, that no socket here owns (and no SYN cookie of
				     * the listener's): forwarded end to end, not delivered locally.
				     * A bypassed flow the tables lost, or a late segment of a connection
				     * the proxy has ended. Forwarded, it counts in pkts_bypassed too */
	CNT_MAX
};

/* The experiment (GRAPH_F_MEASURE): every flow opened from the access side
 * and decided PROXY (group treated) or BYPASS_CONTROL (group control) is
 * measured as the subscriber sees it, from the packets it sends (c_in's
 * ingress): from its first SYN to the last ACK that acknowledged new data,
 * the bytes it acknowledged (download) and the bytes it sent (upload). When
 * the subscriber ends the flow (FIN or RST), a flow_record is pushed on
 * flow_records and the entry leaves `measured`. pepctl's exporter pops them
 * (pepctl/experiment.py follows these layouts). A flow that the subscriber
 * never ends (the other end resets it, or it just stops) leaves no record:
 * the LRU forgets it. So the report compares flows that completed. */
#define MEASURED_MAX 65536           /* LRU, preallocated: flows in measurement at once; a flow that never ends is forgotten, not leaked */
#define RECORDS_MAX 65536            /* flow_records: QUEUE, popped by the exporter every second */

enum flow_group {
	GROUP_TREATED = 1,   /* proxied */
	GROUP_CONTROL = 2,   /* bypassed: end-to-end */
};

enum flow_end {
	END_FIN = 1,
	END_RST = 2,
};

/* measured: LRU_HASH flow_key -> flow_meas. */
struct flow_meas {
	__u64 start_ns;       /* the first SYN */
	__u64 last_ack_ns;    /* the last ACK that acknowledged new data */
	__u32 syn_seq;        /* the subscriber's ISN */
	__u32 ack_base;       /* its first ACK number: the other end's ISN + 1 */
	__u32 ack_max;        /* its highest ACK number since */
	__u32 seq_max;        /* the end of the highest data it sent */
	__u8 group;           /* enum flow_group */
	__u8 acked;           /* ack_base is set */
	__u8 pad[6];
};

/* flow_records: QUEUE of flow_record. */
struct flow_record {
	struct flow_key key;
	__u64 start_ns;
	__u64 last_ack_ns;
	__u64 bytes_down;     /* ack_max - ack_base */
	__u64 bytes_up;       /* seq_max - syn_seq - 1 */
	__u8 group;           /* enum flow_group */
	__u8 closed_by;       /* enum flow_end */
	__u8 pad[6];
};

/* The control group's draw: a subscriber's address (IPv4 as ::ffff:a.b.c.d)
 * as four 32-bit words in memory order, folded with murmur3's finaliser.
 * Keyed by the address alone, so a subscriber stays in one group. */
static __always_inline __u32 fmix32(__u32 h)
{
	h ^= h >> 16;
	h *= 0x85ebca6b;
	h ^= h >> 13;
	h *= 0xc2b2ae35;
	h ^= h >> 16;
	return h;
}

static __always_inline __u32 client_hash(const __u8 *addr, __u32 seed)
{
	__u32 h = seed ^ 0x9e3779b9, w;
	int i;

	for (i = 0; i < 4; i++) {
		__builtin_memcpy(&w, addr + 4 * i, 4);
		h = fmix32(h ^ w);
	}
	return h;
}

#endif /* PEP_FLOW_H */
