// SPDX-License-Identifier: GPL-2.0
/*
 * Per-flow bypass on the two inner interfaces of a graph's namespace. One tc
 * direct-action program, flow_ingress, on the clsact ingress of c_in (access
 * side) and s_in (origin side); which one it runs on is side_config's
 * answer for skb->ifindex.
 *
 * Each TCP flow is decided on its first SYN and the verdict kept in
 * flow_table, keyed by the flow as the subscriber sees it so both
 * directions find it:
 *
 *   PROXY             TC_ACT_OK: the stack's interception hands it to HAProxy
 *   BYPASS_RULE       a client / server prefix or the SYN's port matched
 *   BYPASS_FAILOPEN   the proxy is down (proxy_state.up == 0)
 *
 * Bypassed packets are forwarded at L3 here (bypass_fwd.h). Everything else
 * (not TCP, TCP of no known flow) goes to the stack untouched. The contract,
 * counters included, is pep_bypass.h.
 */
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "pep_bypass.h"
#include "bypass_fwd.h"
#include "bypass_maps.h"
#include "bypass_parse.h"

char _license[] SEC("license") = "GPL";

static __always_inline int pass(__u32 counter)
{
	count(counter);
	return TC_ACT_OK;
}

/* The flow as the subscriber sees it: on the access side the subscriber
 * sent the packet, on the origin side it is the one the packet is for. */
static __always_inline void flow_key_of(const struct tcp_pkt *p, __u32 side, struct flow_key *k)
{
	__builtin_memset(k, 0, sizeof(*k));
	k->family = p->family;
	if (side == SIDE_ACCESS) {
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

static __always_inline int rule_hit(const __u32 *v)
{
	return v && *v;
}

static __always_inline int lpm4_hit(void *map, const __u8 *mapped)
{
	struct lpm4_key key = { .prefixlen = 32 };

	__builtin_memcpy(key.addr, mapped + 12, 4);
	return rule_hit(bpf_map_lookup_elem(map, &key));
}

static __always_inline int lpm6_hit(void *map, const __u8 *addr)
{
	struct lpm6_key key = { .prefixlen = 128 };

	__builtin_memcpy(key.addr, addr, 16);
	return rule_hit(bpf_map_lookup_elem(map, &key));
}

/* The verdict of a new flow, from the proxy's state and the rules. */
static __always_inline __u32 decide(const struct tcp_pkt *p, const struct flow_key *k)
{
	const struct proxy_state *ps;
	__u32 zero = 0, port;

	ps = bpf_map_lookup_elem(&proxy_state, &zero);
	if (!ps || !ps->up)
		return VERDICT_BYPASS_FAILOPEN;

	if (k->family == 4) {
		if (lpm4_hit(&bypass_client4, k->sub_addr) || lpm4_hit(&bypass_server4, k->org_addr))
			return VERDICT_BYPASS_RULE;
	} else {
		if (lpm6_hit(&bypass_client6, k->sub_addr) || lpm6_hit(&bypass_server6, k->org_addr))
			return VERDICT_BYPASS_RULE;
	}
	port = bpf_ntohs(p->dport);  /* the port the SYN is addressed to */
	if (rule_hit(bpf_map_lookup_elem(&bypass_ports, &port)))
		return VERDICT_BYPASS_RULE;
	return VERDICT_PROXY;
}

static __always_inline __u32 flow_counter(__u32 verdict)
{
	switch (verdict) {
	case VERDICT_BYPASS_RULE:
		return CNT_FLOWS_BYPASS_RULE;
	case VERDICT_BYPASS_FAILOPEN:
		return CNT_FLOWS_BYPASS_FAILOPEN;
	default:
		return CNT_FLOWS_PROXIED;
	}
}

SEC("tc")
int flow_ingress(struct __sk_buff *skb)
{
	const struct side_config *sc;
	const struct flow_value *fv;
	struct flow_value nv = {};
	struct flow_key key;
	struct tcp_pkt p = {};
	__u32 ifindex = skb->ifindex;
	__u32 verdict;

	/* Attached to an interface the loader has not registered (or with a
	 * bad side): we cannot tell the subscriber from the origin, so leave
	 * the packet to the stack. Not counted: a setup error, not traffic.
	 * peer_ifindex is not read: the FIB picks the egress device. */
	sc = bpf_map_lookup_elem(&side_config, &ifindex);
	if (!sc || (sc->side != SIDE_ACCESS && sc->side != SIDE_ORIGIN))
		return TC_ACT_OK;

	if (parse_tcp(skb, &p))
		return pass(CNT_PKTS_NOT_TCP);
	flow_key_of(&p, sc->side, &key);

	fv = bpf_map_lookup_elem(&flow_table, &key);
	if (is_first_syn(&p)) {
		if (fv && fv->syn_seq == p.seq) {
			/* A retransmitted SYN: the flow was decided already. */
			verdict = fv->verdict;
		} else {
			/* New, or the 4-tuple reused with a new ISN: decide anew. */
			verdict = decide(&p, &key);
			nv.verdict = verdict;
			nv.syn_seq = p.seq;
			nv.first_seen_ns = bpf_ktime_get_ns();
			/* Can only fail without memory; the flow's later packets
			 * then find no entry and go to the stack (no_flow). */
			bpf_map_update_elem(&flow_table, &key, &nv, BPF_ANY);
			count(flow_counter(verdict));
		}
	} else {
		if (!fv)
			return pass(CNT_PKTS_NO_FLOW);
		/* Entries outlive their flows (LRU). A SYN-ACK that does not
		 * answer the stored SYN belongs to another connection on the
		 * same 4-tuple: typically HAProxy's own connection to the
		 * origin, made from the client's address (usesrc clientip) on a
		 * port an old bypassed flow used. Forget the old flow and leave
		 * this one to the stack, or the origin's answer would be
		 * forwarded to the client and the proxied connection hang. */
		if (is_syn_ack(&p) && p.ack_seq != fv->syn_seq + 1) {
			bpf_map_delete_elem(&flow_table, &key);
			return pass(CNT_FLOWS_STALE);
		}
		verdict = fv->verdict;
	}

	if (verdict != VERDICT_BYPASS_RULE && verdict != VERDICT_BYPASS_FAILOPEN)
		return TC_ACT_OK;  /* PROXY: the stack's interception takes it */
	return forward(skb, &p);
}
