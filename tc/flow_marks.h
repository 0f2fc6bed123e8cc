/* SPDX-License-Identifier: GPL-2.0 */
/*
 * What a proxied flow's ends mark their packets with, carried across the
 * split (pep_flow.h, marks): the subscriber's DSCP onto the proxy's packets
 * to the origin and the origin's onto those to the subscriber, ECN asked of
 * the origin only when the subscriber asked for it, and an origin's reset
 * passed on as a reset.
 *
 *   first SYN (PROXY)    marks_syn: the subscriber's DSCP, whether it asked ECN,
 *                        what its handshake offered (MSS, SACK, timestamps)
 *   origin's SYN-ACK     marks_answer (honest handshake): the origin's DSCP
 *                        and what it offered
 *   segments in (bpf)    marks_in: each end's DSCP as its last segment had it;
 *                        a RST from the origin side: MARK_F_ORG_RESET
 *   segments out         flow_egress (flow.c) applies them to the proxy's own
 *                        packets (made here: no ingress interface): DSCP rewritten, ECE and CWR
 *                        taken off its SYN unless the subscriber asked, its
 *                        SYN and SYN-ACK offering no more than the other end
 *                        (mirror_offer), a FIN after the origin's reset sent
 *                        as a RST
 *
 * The proxy's sockets are found by the flow's 4-tuple, which they share with
 * source_port = "kept" (the default); with "any" nothing matches on the
 * origin side and the proxy asks no ECN and marks nothing there.
 */
#ifndef PEP_FLOW_MARKS_H
#define PEP_FLOW_MARKS_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "pep_flow.h"
#include "flow_maps.h"
#include "flow_parse.h"
#include "flow_table.h"

#define DSCP_MASK 0xfc          /* of the TOS / traffic class byte; the rest is ECN */
#define IP4_TOS_OFF (ETH_HLEN + offsetof(struct iphdr, tos))
#define IP6_TC_DSCP 0x0fc0      /* the DSCP's bits in the IPv6 header's first 16 bits */
#define TCP_FLAGS_WORD 12       /* the 16 bits of data offset and flags, for the checksum */
#define TCP_CHECK 16

/* The segment's DSCP, as a TOS byte with its ECN bits 0. */
static __always_inline __u8 dscp_of(const struct tcp_pkt *p)
{
	if (p->family == 4)
		return p->tos & DSCP_MASK;
	return (bpf_ntohl(p->flowinfo) >> 20) & DSCP_MASK;
}

/* What an end's handshake offered, as marks flags (side: MARK_F_SUB_* or the
 * origin's, shifted): SACK, timestamps, and that they are known. */
static __always_inline __u8 offer_flags(const struct syn_opts *o, int origin)
{
	__u8 f = (o->has_sack ? MARK_F_SUB_SACK : 0) | (o->has_ts ? MARK_F_SUB_TS : 0);

	return origin ? (f << 2) | MARK_F_ORG_OPTS : f | MARK_F_SUB_OPTS;
}

/* A first SYN to be proxied (or sent to the origin first): what its flow's
 * proxy side will carry, and whether the proxy connects from the client's port
 * (kept). Replaces an entry of an earlier flow on the 4-tuple. */
static __always_inline void marks_syn(const struct flow_key *k, const struct tcp_pkt *p, const struct syn_opts *o,
				      int kept)
{
	struct flow_marks m = { .sub_dscp = dscp_of(p), .sub_mss = o->mss, .flags = offer_flags(o, 0),
				.seen = kept ? MARK_S_KEPT : 0 };

	if ((p->flags & (TCP_FLAG_ECE | TCP_FLAG_CWR)) == (TCP_FLAG_ECE | TCP_FLAG_CWR))
		m.flags |= MARK_F_SUB_ECN;   /* RFC 3168: an ECN-setup SYN */
	bpf_map_update_elem(&marks, k, &m, BPF_ANY);
}

/* The origin's SYN-ACK (options o) answering the honest handshake's probe. */
static __always_inline void marks_answer(const struct flow_key *k, const struct tcp_pkt *p, const struct syn_opts *o)
{
	struct flow_marks *m = bpf_map_lookup_elem(&marks, k);

	if (!m)
		return;   /* forgotten meanwhile (LRU): the proxy's side carries nothing */
	m->org_dscp = dscp_of(p);
	m->org_mss = o->mss;
	m->flags = (m->flags & ~(MARK_F_ORG_SACK | MARK_F_ORG_TS)) | offer_flags(o, 1);
}

/* The egress program's room for a header's options before and after, per
 * CPU (its stack holds the segment's parse already); only it uses it. */
struct opts_buf {
	__u8 old[TCP_OPTS_BUF];
	__u8 new[TCP_OPTS_BUF];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct opts_buf);
} egress_scratch SEC(".maps");

/* The proxy's own SYN or SYN-ACK offers no more than the other end's did:
 * an MSS no larger, SACK and timestamps only if it offered them (dropped:
 * made NOPs, the header's length kept). */
static __attribute__((noinline)) void mirror_offer(struct __sk_buff *skb, const struct tcp_pkt *p, __u16 mss_max,
						   int drop_sack, int drop_ts)
{
	__u32 len = p->tcp.doff * 4, off = p->l4_off + sizeof(struct tcphdr), zero = 0;
	struct opts_buf *b = bpf_map_lookup_elem(&egress_scratch, &zero);
	__s64 diff;

	if (!b || len <= sizeof(struct tcphdr) || len > sizeof(struct tcphdr) + TCP_OPTS_MAX)
		return;
	len = MASKED(len - sizeof(struct tcphdr), TCP_OPTS_BUF - 1);
	if (!len || bpf_skb_load_bytes(skb, off, b->old, len))
		return;
	__builtin_memcpy(b->new, b->old, sizeof(b->new));
	if (!edit_opts(b->new, len, mss_max, drop_sack, drop_ts))
		return;
	diff = bpf_csum_diff((__be32 *)b->old, len, (__be32 *)b->new, len, 0);
	if (diff >= 0 && !bpf_skb_store_bytes(skb, off, b->new, len, 0))
		bpf_l4_csum_replace(skb, p->l4_off + TCP_CHECK, 0, diff, 0);
}

/* A segment of a proxied flow arriving from one end (mode bpf: its socket
 * found; other modes: no flow table knew it). */
static __always_inline void marks_in(const struct flow_key *k, const struct tcp_pkt *p, const struct where *w)
{
	struct flow_marks *m = bpf_map_lookup_elem(&marks, k), fresh = {};
	int reset = w->side == SIDE_ORIGIN && (p->flags & TCP_FLAG_RST);
	__u8 dscp = dscp_of(p);

	if (!m) {
		if (!dscp && !reset)
			return;
		m = &fresh;
	}
	if (w->side == SIDE_ACCESS) {
		if (m->sub_dscp != dscp)
			m->sub_dscp = dscp;
		if (!(m->seen & MARK_S_SUB_DATA) && payload_len(p))
			m->seen |= MARK_S_SUB_DATA;
	} else if (m->org_dscp != dscp) {
		m->org_dscp = dscp;
	}
	if (reset)
		m->flags |= MARK_F_ORG_RESET;
	if (m == &fresh)
		bpf_map_update_elem(&marks, k, &fresh, BPF_NOEXIST);
}

/* The proxy's own segment leaves with dscp (its ECN bits kept). */
static __always_inline int set_dscp(struct __sk_buff *skb, const struct tcp_pkt *p, __u8 dscp)
{
	__be16 old, new;

	if (dscp_of(p) == dscp)
		return 0;
	if (load_hdr(skb, ETH_HLEN, &old, sizeof(old)))
		return -1;
	if (p->family == 4) {
		/* version and header length share the checksummed word with the TOS */
		new = bpf_htons((bpf_ntohs(old) & 0xff03) | dscp);
		return bpf_l3_csum_replace(skb, ETH_HLEN + offsetof(struct iphdr, check), old, new, 2) ||
		       bpf_skb_store_bytes(skb, ETH_HLEN, &new, 2, 0);
	}
	new = bpf_htons((bpf_ntohs(old) & ~IP6_TC_DSCP) | (dscp << 4));
	return bpf_skb_store_bytes(skb, ETH_HLEN, &new, 2, 0);   /* no IPv6 header checksum */
}

/* The segment's TCP flags made flags. */
static __always_inline int set_tcp_flags(struct __sk_buff *skb, const struct tcp_pkt *p, __u8 flags)
{
	__be16 old, new;

	if (load_hdr(skb, p->l4_off + TCP_FLAGS_WORD, &old, sizeof(old)))
		return -1;
	new = old;
	((__u8 *)&new)[1] = flags;
	return bpf_l4_csum_replace(skb, p->l4_off + TCP_CHECK, old, new, 2) ||
	       bpf_skb_store_bytes(skb, p->l4_off + TCP_FLAGS_WORD, &new, 2, 0);
}

#endif /* PEP_FLOW_MARKS_H */
