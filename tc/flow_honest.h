/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The honest handshake (pep_flow.h, syns; GRAPH_F_HONEST, mode bpf): the
 * opener learns from the origin's own answer whether its connection opens.
 *
 *   first SYN   syn_record: kept in syns (SYN_PROBING), and on to the origin
 *               through the stack's routing, as a bypassed SYN would go
 *   RST         (origin side) passed on to the opener: refused, as routed
 *   SYN-ACK     syn_answered: made a RST to the origin (it forgets the
 *               half-open connection), sent out of the interface it came
 *               in on; then made the opener's SYN again and put in at the
 *               opener's interface (SYN_ACCEPTED), where flow_ingress hands
 *               it to the listener
 *
 * The opener's handshake then takes one round trip to the origin, as when
 * routed; the origin sees two SYNs per flow (the probe, then the proxy's)
 * and one RST.
 */
#ifndef PEP_FLOW_HONEST_H
#define PEP_FLOW_HONEST_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/tcp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "pep_flow.h"
#include "flow_craft.h"
#include "flow_fwd.h"
#include "flow_maps.h"
#include "flow_marks.h"
#include "flow_parse.h"
#include "flow_table.h"

#define IP4_ID_OFF (ETH_HLEN + offsetof(struct iphdr, id))
#define IP6_HLIM_OFF (ETH_HLEN + offsetof(struct ipv6hdr, hop_limit))
#define ECN_SETUP (TCP_FLAG_ECE | TCP_FLAG_CWR)

/* The interface a side of graph slot comes in on (pep_flow.h). */
static __always_inline __u32 side_ifindex(__u32 slot, __u32 side)
{
	return PEP_IFINDEX_BASE + 2 * slot + (side == SIDE_ORIGIN);
}

/* Whether the datapath can make this SYN again from a record: no data (a
 * Fast Open SYN's), no IPv4 options. */
static __always_inline int probeable(const struct tcp_pkt *p, const struct syn_opts *o)
{
	return !o->payload && (p->family == 6 || p->ip.v4.ihl == 5);
}

/* Keeps what the SYN will be rebuilt from (a retransmission refreshes it:
 * its options, a timestamp among them, are the ones the origin answered). */
static __always_inline void syn_record(struct __sk_buff *skb, const struct flow_key *k, const struct tcp_pkt *p,
				       const struct syn_opts *o, __u32 side, __u64 first_seen_ns)
{
	struct flow_syn r = {
		.syn_seq = p->seq,
		.state = SYN_PROBING,
		.opener = side,
		.tcp_flags = p->flags,
		.opt_len = o->len,
		.window = p->tcp.window,
		.ttl = p->ttl,
		.tos = p->tos,
		.first_seen_ns = first_seen_ns ? first_seen_ns : bpf_ktime_get_ns(),
	};

	if (p->family == 4)
		__builtin_memcpy(&r.ip_word, &p->ip.v4.id, 4);   /* id, then frag_off */
	else
		__builtin_memcpy(&r.ip_word, &p->ip.v6, 4);
	if (bpf_skb_load_bytes(skb, 0, r.macs, sizeof(r.macs)))
		return;
	__builtin_memcpy(r.opts, o->bytes, sizeof(r.opts));
	bpf_map_update_elem(&syns, k, &r, BPF_ANY);
}

/* The IP header of the segment being rebuilt given the SYN's own fields. */
static __always_inline int put_syn_ip(struct __sk_buff *skb, const struct tcp_pkt *p, const struct flow_syn *r,
				      struct craft_buf *b)
{
	struct iphdr *ip = (struct iphdr *)b->ip_new;
	__s64 diff;

	if (p->family == 6)
		return bpf_skb_store_bytes(skb, ETH_HLEN, &r->ip_word, 4, BPF_F_RECOMPUTE_CSUM) ||
		       bpf_skb_store_bytes(skb, IP6_HLIM_OFF, &r->ttl, 1, BPF_F_RECOMPUTE_CSUM);
	if (bpf_skb_load_bytes(skb, ETH_HLEN, b->ip_old, sizeof(b->ip_old)))
		return -1;
	__builtin_memcpy(b->ip_new, b->ip_old, sizeof(b->ip_new));
	ip->tos = r->tos;
	ip->ttl = r->ttl;
	__builtin_memcpy(&ip->id, &r->ip_word, 4);
	diff = bpf_csum_diff((__be32 *)b->ip_old, sizeof(b->ip_old), (__be32 *)b->ip_new, sizeof(b->ip_new), 0);
	if (diff < 0)
		return -1;
	return bpf_skb_store_bytes(skb, ETH_HLEN, b->ip_new, sizeof(b->ip_new), 0) ||
	       bpf_l3_csum_replace(skb, ETH_HLEN + offsetof(struct iphdr, check), 0, diff, 0);
}

/* Where the RST made of the origin's SYN-ACK p (make_rst reversed: its ends
 * swapped) goes: the interface toward the origin by the route the stack would
 * take, its MACs written from the FIB, not back to the MAC the SYN-ACK came
 * from: in a cluster that MAC may be another proxy host's (a draining host
 * forwards the origin's answers to the host that probed, docs/routing.md),
 * which would take the RST for one of its own flows and drop it, and the
 * origin, never told, would refuse the proxy's connection. No route or next
 * hop's MAC yet: back the way it came (the interface, MACs swapped). */
static __always_inline __u32 rst_egress(struct __sk_buff *skb, const struct tcp_pkt *p)
{
	struct craft_buf *b = craft_buf();
	struct tcp_pkt *q;
	long ifindex;

	if (!b)
		return skb->ifindex;
	q = &b->pkt;
	q->family = p->family;
	q->tos = p->tos;
	q->flowinfo = p->flowinfo;
	__builtin_memcpy(q->src, p->dst, 16);
	__builtin_memcpy(q->dst, p->src, 16);
	q->sport = p->dport;
	q->dport = p->sport;
	ifindex = to_next_hop(skb, q);
	return ifindex < 0 ? skb->ifindex : ifindex;
}

/* The SYN-ACK p, answering the probe of record r, made into the origin's RST
 * (sent) and then the opener's SYN (left in skb), offering SACK and timestamps
 * only as the origin did (drop_*). Zero, or 1: p cannot be
 * rewritten, untouched; -1: failed half-way. */
static __always_inline int syn_rebuild(struct __sk_buff *skb, const struct tcp_pkt *p, const struct flow_syn *r,
				       __u8 syn_flags, int drop_sack, int drop_ts)
{
	struct craft_buf *b = craft_buf();
	__u32 opt_len = r->opt_len;

	if (!b || payload_len(p) || (p->family == 4 && p->ip.v4.ihl != 5) || opt_len > TCP_OPTS_MAX || (opt_len & 3))
		return 1;
	/* The origin forgets: a RST from the opener, at the SYN-ACK's ack, with
	 * the opener's DSCP. */
	if (make_rst(skb, p, p->ack_seq, 1) ||
	    set_dscp(skb, p, (p->family == 4 ? r->tos : bpf_ntohl(r->ip_word) >> 20) & DSCP_MASK))
		return -1;
	if (bpf_clone_redirect(skb, rst_egress(skb, p), 0))
		return -1;
	/* The opener's SYN, as it came: MACs, IP fields, TCP header and options. */
	bare_header(b, p->dport, p->sport, r->syn_seq, 0, syn_flags, r->window);
	((struct tcphdr *)b->new)->doff = (sizeof(struct tcphdr) + opt_len) / 4;
	__builtin_memcpy(b->new + sizeof(struct tcphdr), r->opts, TCP_OPTS_MAX);
	/* Offered to the listener only as the origin offered it to the opener. */
	edit_opts(b->new + sizeof(struct tcphdr), opt_len, 0, drop_sack, drop_ts);
	if (bpf_skb_store_bytes(skb, 0, r->macs, sizeof(r->macs), 0) || put_syn_ip(skb, p, r, b) ||
	    put_tcp(skb, p, b, sizeof(struct tcphdr) + opt_len))
		return -1;
	return 0;
}

#endif /* PEP_FLOW_HONEST_H */
