/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The contract between the per-flow bypass datapath (tc/bypass.c) and the
 * control plane (pepctl/bypass.py, pepctl/watchdog.py). Map names, struct
 * layouts, verdicts and counters live here and only here.
 *
 * If you change this file, change with it:
 *   - pepctl/bypass.py    (struct formats, COUNTERS list, map names)
 *   - tests/bpf/test_bypass_golden.py
 *
 * Where it runs: tc clsact ingress of c_in (access side) and s_in (origin
 * side) inside a graph's namespace, one pinned object per graph. Every TCP
 * flow is decided once, on its first SYN (SYN without ACK), and the decision
 * is kept in flow_table for the flow's life:
 *   PROXY   TC_ACT_OK: the stack's interception (nft TPROXY or policy rules)
 *           hands it to HAProxy;
 *   BYPASS  forwarded at L3 right here (TTL / hop limit decremented, MACs
 *           from bpf_fib_lookup, bpf_redirect_neigh when the neighbour is not
 *           known yet), never reaching netfilter or HAProxy.
 * A flow is bypassed when the proxy is down (fail-open: proxy_state.up == 0)
 * or a rule matches: the subscriber's address (client LPM), the origin's
 * address (server LPM), or the port the SYN is addressed to (bypass_ports).
 * The subscriber is the access-side end of the flow, the origin the
 * origin-side end, whoever sent the SYN.
 * Non-TCP, and TCP segments of flows not in flow_table that are not a first
 * SYN (e.g. HAProxy's own connections to the origin), get TC_ACT_OK.
 */
#ifndef PEP_BYPASS_H
#define PEP_BYPASS_H

#define BYPASS_FLOWS_MAX 262144   /* LRU: oldest idle flows are forgotten first */
#define BYPASS_RULES_MAX 1048576  /* per LPM map */

/* Which side a program instance is attached to: the loader sets this in
 * side_config[ifindex] (HASH keyed by the ifindex of c_in / s_in). */
enum bypass_side {
	SIDE_ACCESS = 1,
	SIDE_ORIGIN = 2,
};

struct side_config {
	__u32 side;           /* enum bypass_side */
	__u32 peer_ifindex;   /* the other side's interface (c_in <-> s_in) */
};

/* LPM keys: bypass_client4/bypass_server4 (IPv4), bypass_client6/6 (IPv6). */
struct lpm4_key {
	__u32 prefixlen;
	__u8 addr[4];
};

struct lpm6_key {
	__u32 prefixlen;
	__u8 addr[16];
};

/* bypass_ports: ARRAY[65536] of __u32, indexed by destination port of the
 * SYN (host byte order); non-zero: bypass. */
#define BYPASS_PORTS_MAX 65536

/* flow_table: LRU_HASH. The key is the flow as the subscriber sees it, so
 * both directions find the same entry. */
struct flow_key {
	__u8 sub_addr[16];    /* subscriber (access side); IPv4 as ::ffff:a.b.c.d */
	__u8 org_addr[16];    /* origin side */
	__u16 sub_port;       /* network byte order */
	__u16 org_port;       /* network byte order */
	__u8 family;          /* 4 or 6 */
	__u8 pad[3];
};

enum flow_verdict {
	VERDICT_PROXY = 1,
	VERDICT_BYPASS_RULE = 2,
	VERDICT_BYPASS_FAILOPEN = 3,
};

struct flow_value {
	__u32 verdict;        /* enum flow_verdict */
	__u32 syn_seq;        /* ISN of the first SYN: a SYN with another ISN on
			       * the same 4-tuple is a new flow, decided anew */
	__u64 first_seen_ns;  /* bpf_ktime_get_ns() of the first SYN */
};

/* proxy_state: ARRAY[1]. The watchdog sets up = 0 when HAProxy fails, and
 * up = 1 when it answers again. */
struct proxy_state {
	__u32 up;
	__u32 pad;
};

/* bypass_stats: PERCPU_ARRAY of __u64 indexed by enum bypass_counter. */
enum bypass_counter {
	CNT_FLOWS_PROXIED = 0,      /* first SYNs decided PROXY */
	CNT_FLOWS_BYPASS_RULE,      /* first SYNs decided BYPASS by a rule */
	CNT_FLOWS_BYPASS_FAILOPEN,  /* first SYNs decided BYPASS because the proxy is down */
	CNT_PKTS_BYPASSED,          /* packets forwarded by this program */
	CNT_PKTS_TTL_EXPIRED,       /* bypassed packets dropped: TTL/hop limit <= 1. Not left to the
				     * stack: its TPROXY rule would hand them to HAProxy */
	CNT_PKTS_FIB_MISS,          /* bypassed packets dropped: no route (blackhole, unreachable) */
	CNT_PKTS_NOT_TCP,           /* passed: ICMP, UDP, ... (routed by the stack) */
	CNT_PKTS_NO_FLOW,           /* passed: TCP not a first SYN and not in flow_table */
	CNT_FLOWS_STALE,            /* entries forgotten: a SYN-ACK answered another SYN on the same
				     * 4-tuple (e.g. HAProxy reusing an old bypassed flow's port) */
	CNT_MAX
};

#endif /* PEP_BYPASS_H */
