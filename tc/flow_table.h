/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The two flow tables of bypassed flows (pep_flow.h says why two):
 *
 *   first SYN ──> flows_new {SYN_SEEN} ── SYN-ACK from the other end,
 *                                         acking the SYN ──> {SYNACK_SEEN}
 *                 ── ACK from the opener acking the SYN-ACK ──> flows
 *                    (promotion; the entry's timer starts: FLOW_IDLE_NS)
 *   flows: RST, or FINs from both sides ──> closing (timer: FLOW_LINGER_NS)
 *
 * A flows entry leaves only by its timer (or when a SYN of a new ISN or a
 * SYN-ACK of another connection shows the 4-tuple reused). The timer does
 * not follow every packet: it fires at the deadline it was set for, finds
 * last_seen_ns moved on, and sets itself again for the rest.
 */
#ifndef PEP_FLOW_TABLE_H
#define PEP_FLOW_TABLE_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "pep_flow.h"
#include "flow_maps.h"
#include "flow_parse.h"

#define CLOCK_MONOTONIC 1
#define EEXIST 17

/* Where a packet came in: the graph and the side. */
struct where {
	__u32 slot;
	__u32 side;          /* enum flow_side */
	__u32 flags;         /* GRAPH_F_* of the graph */
	__u16 listen_port;   /* host order */
	__u32 control_below; /* the graph's experiment (struct graph_config) */
	__u32 control_seed;
	__u32 maxconn;       /* struct graph_config */
	__u32 host_maxconn;
};

/* The flow as the subscriber sees it: on the access side the subscriber
 * sent the packet, on the origin side it is the one the packet is for. */
static __always_inline void flow_key_of(const struct tcp_pkt *p, const struct where *w, struct flow_key *k)
{
	__builtin_memset(k, 0, sizeof(*k));
	k->family = p->family;
	k->graph = w->slot;
	if (w->side == SIDE_ACCESS) {
		__builtin_memcpy(k->sub_addr, p->src, 16);
		__builtin_memcpy(k->org_addr, p->dst, 16);
		k->sub_port = p->sport;
		k->org_port = p->dport;
	} else {
		__builtin_memcpy(k->sub_addr, p->dst, 16);
		__builtin_memcpy(k->org_addr, p->src, 16);
		k->sub_port = p->dport;
		k->org_port = p->sport;
	}
}

/* A new bypassed flow, on its first SYN. If the insert fails (memory), the
 * flow's later packets find no entry and go to the stack (pkts_no_flow). */
static __always_inline void remember(const struct flow_key *k, const struct tcp_pkt *p, const struct where *w,
				     __u32 verdict)
{
	struct flow_new n = {
		.verdict = verdict,
		.syn_seq = p->seq,
		.opener = w->side,
		.state = FLOW_SYN_SEEN,
		.first_seen_ns = bpf_ktime_get_ns(),
	};

	bpf_map_update_elem(&flows_new, k, &n, BPF_ANY);
}

/* The timer of a flows entry: removes it once idle (or closed) long enough,
 * else waits for the rest of the time. */
static int flow_timer_fired(void *map, struct flow_key *k, struct flow_est *v)
{
	__u64 now = bpf_ktime_get_ns();
	__u64 deadline = v->last_seen_ns + (v->closing ? FLOW_LINGER_NS : FLOW_IDLE_NS);

	if (now < deadline) {
		bpf_timer_start(&v->timer, deadline - now, 0);
		return 0;
	}
	count(k->graph, v->closing ? CNT_FLOWS_CLOSED : CNT_FLOWS_EXPIRED);
	bpf_map_delete_elem(map, k);
	return 0;
}

/* Moves a flow whose handshake completed from flows_new to flows. When
 * flows refuses it, the flow stays in flows_new, still bypassed, as
 * FLOW_PROVEN: its next segment tries again. */
static __always_inline void promote(const struct flow_key *k, struct flow_new *n, __u32 slot)
{
	struct flow_est e = {
		.verdict = n->verdict,
		.syn_seq = n->syn_seq,
		.first_seen_ns = n->first_seen_ns,
		.last_seen_ns = bpf_ktime_get_ns(),
	};
	struct flow_est *v;
	long err;

	err = bpf_map_update_elem(&flows, k, &e, BPF_NOEXIST);
	if (err == -EEXIST) {
		/* Promoted meanwhile by the same ACK's twin on another CPU. */
		bpf_map_delete_elem(&flows_new, k);
		return;
	}
	if (err) {
		n->state = FLOW_PROVEN;
		count(slot, CNT_FLOWS_TABLE_FULL);
		return;
	}
	v = bpf_map_lookup_elem(&flows, k);
	if (!v)
		return;  /* removed meanwhile (a new SYN on another CPU) */
	if (bpf_timer_init(&v->timer, &flows, CLOCK_MONOTONIC) ||
	    bpf_timer_set_callback(&v->timer, flow_timer_fired) ||
	    bpf_timer_start(&v->timer, FLOW_IDLE_NS, 0)) {
		/* No memory for the timer: an entry without one would never
		 * leave. Undo; the flow stays in flows_new, and its next
		 * segment tries again. Not table_full: kernel 6.18 allocates
		 * the timer without locks (kmalloc_nolock), and in softirq
		 * that fails often with the table nearly empty (seen: 4 in 5
		 * promotions under a lab's churn of new flows). */
		bpf_map_delete_elem(&flows, k);
		n->state = FLOW_PROVEN;
		count(slot, CNT_FLOWS_NO_TIMER);
		return;
	}
	bpf_map_delete_elem(&flows_new, k);
	count(slot, CNT_FLOWS_PROMOTED);
}

/* A segment of an established bypassed flow: keeps last_seen_ns roughly
 * current and notes its end. Plain writes: two CPUs racing on the fins of
 * a simultaneous close may lose a bit, and the entry then leaves idle
 * instead of closed. */
static __always_inline void est_seen(struct flow_est *v, const struct tcp_pkt *p, __u32 side)
{
	__u64 now = bpf_ktime_get_ns();
	int closing = 0;

	if (now - v->last_seen_ns > FLOW_TOUCH_NS)
		v->last_seen_ns = now;
	if (p->flags & TCP_FLAG_RST) {
		closing = 1;
	} else if (p->flags & TCP_FLAG_FIN) {
		v->fins |= 1 << (side - 1);
		closing = v->fins == ((1 << (SIDE_ACCESS - 1)) | (1 << (SIDE_ORIGIN - 1)));
	}
	if (closing && !v->closing) {
		v->closing = 1;
		v->last_seen_ns = now;
		bpf_timer_start(&v->timer, FLOW_LINGER_NS, 0);
	}
}

#endif /* PEP_FLOW_TABLE_H */
