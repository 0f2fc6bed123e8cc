/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The experiment's measurements (pep_flow.h, GRAPH_F_MEASURE): each flow of
 * either group as its subscriber sees it, from the segments the subscriber
 * sends, which every interception mode passes through c_in's ingress:
 *
 *   first SYN              start_ns, syn_seq              (measure_start)
 *   first ACK              ack_base = the other end's ISN + 1
 *   ACK of new data        ack_max, last_ack_ns
 *   data                   seq_max
 *   FIN or RST             a flow_record on flow_records; the entry goes
 *
 * Only segments the subscriber sends: nothing on the way to it (proxied
 * flows' segments toward the client leave HAProxy's sockets, which no tc
 * ingress sees), and one map lookup per segment while the experiment is on.
 */
#ifndef PEP_FLOW_MEASURE_H
#define PEP_FLOW_MEASURE_H

#include <linux/bpf.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "pep_flow.h"
#include "flow_maps.h"
#include "flow_parse.h"
#include "flow_table.h"

static __always_inline int measuring(const struct where *w)
{
	return (w->flags & GRAPH_F_MEASURE) && w->side == SIDE_ACCESS;
}

/* The control group: a subscriber whose hash falls below the graph's line. */
static __always_inline int in_control(const struct flow_key *k, const struct where *w)
{
	return w->side == SIDE_ACCESS && w->control_below &&
	       client_hash(k->sub_addr, w->control_seed) < w->control_below;
}

/* A first SYN decided PROXY or BYPASS_CONTROL. A retransmission (the same
 * ISN) keeps the start of the first. */
static __always_inline void measure_start(const struct flow_key *k, const struct tcp_pkt *p, const struct where *w,
					  __u8 group)
{
	struct flow_meas m = {};
	const struct flow_meas *old;

	if (!measuring(w))
		return;
	old = bpf_map_lookup_elem(&measured, k);
	if (old && old->syn_seq == p->seq)
		return;
	m.start_ns = bpf_ktime_get_ns();
	m.last_ack_ns = m.start_ns;
	m.syn_seq = p->seq;
	m.seq_max = p->seq + 1;
	m.group = group;
	if (!bpf_map_update_elem(&measured, k, &m, BPF_ANY))
		count(w->slot, CNT_FLOWS_MEASURED);
}

/* Any segment but a first SYN, from the access side of a measuring graph. */
static __always_inline void measure(const struct flow_key *k, const struct tcp_pkt *p, const struct where *w)
{
	struct flow_meas *m = bpf_map_lookup_elem(&measured, k);
	struct flow_record r = {};
	__u32 end;

	if (!m)
		return;
	if (p->flags & TCP_FLAG_ACK) {
		if (!m->acked) {
			m->ack_base = p->ack_seq;
			m->ack_max = p->ack_seq;
			m->acked = 1;
			m->last_ack_ns = bpf_ktime_get_ns();
		} else if (seq_after(p->ack_seq, m->ack_max)) {
			m->ack_max = p->ack_seq;
			m->last_ack_ns = bpf_ktime_get_ns();
		}
	}
	end = p->seq + payload_len(p);
	if (seq_after(end, m->seq_max))
		m->seq_max = end;
	if (!(p->flags & (TCP_FLAG_FIN | TCP_FLAG_RST)))
		return;
	__builtin_memcpy(&r.key, k, sizeof(r.key));
	r.start_ns = m->start_ns;
	r.last_ack_ns = m->last_ack_ns;
	r.bytes_down = m->ack_max - m->ack_base;
	r.bytes_up = m->seq_max - m->syn_seq - 1;
	r.group = m->group;
	r.closed_by = (p->flags & TCP_FLAG_RST) ? END_RST : END_FIN;
	if (bpf_map_push_elem(&flow_records, &r, 0))
		count(w->slot, CNT_RECORDS_DROPPED);
	bpf_map_delete_elem(&measured, k);
}

#endif /* PEP_FLOW_MEASURE_H */
