/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Making one TCP segment into another, in place, at tc: the datapath's own
 * RSTs (to end a TIME_WAIT socket, to tell the origin to forget the honest
 * handshake's half-open connection) and the client's SYN rebuilt from what
 * was recorded. Only segments without payload are rewritten (SYN, SYN-ACK,
 * RST); the callers check.
 *
 * Checksums are updated, never computed from scratch, so every ip_summed an
 * skb may carry stays right:
 *   CHECKSUM_PARTIAL (a local sender's, over veth): the TCP checksum field
 *     holds the pseudo-header's sum only; bpf_l4_csum_replace leaves it for
 *     data changes and updates it for the pseudo-header's (BPF_F_PSEUDO_HDR);
 *   CHECKSUM_NONE / UNNECESSARY: the field is updated for every change;
 *   CHECKSUM_COMPLETE (a NIC's sum of the packet): data and checksum field
 *     change by opposite amounts (bytes stored without BPF_F_RECOMPUTE_CSUM),
 *     the IPv6 header, which no checksum covers, is stored with it, and the
 *     header bytes a shrink trims are added back (bpf_csum_update), since the
 *     checksum field already accounts for them.
 * The MACs are outside every checksum: stored plainly.
 */
#ifndef PEP_FLOW_CRAFT_H
#define PEP_FLOW_CRAFT_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/tcp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "flow_parse.h"

#define TCP_HDR_MAX (sizeof(struct tcphdr) + TCP_OPTS_MAX)
#define TCP_HDR_BUF (sizeof(struct tcphdr) + TCP_OPTS_BUF)   /* a length is 20 + (x & 63) for the verifier */
#define TCP_CSUM_OFF offsetof(struct tcphdr, check)
#define IP4_TOTLEN_OFF (ETH_HLEN + offsetof(struct iphdr, tot_len))
#define IP4_CHECK_OFF (ETH_HLEN + offsetof(struct iphdr, check))
#define IP6_PLEN_OFF (ETH_HLEN + offsetof(struct ipv6hdr, payload_len))

/* Room for a TCP and an IP header before and after, and a SYN's options, per
 * CPU (the stack is too small for them beside the decision's own). Nothing
 * that runs nested on the same CPU (the egress program, through a redirect)
 * touches it. */
struct craft_buf {
	__u8 old[TCP_HDR_BUF];
	__u8 new[TCP_HDR_BUF];
	__u8 ip_old[sizeof(struct iphdr)];
	__u8 ip_new[sizeof(struct iphdr)];
	struct syn_opts opts;   /* a first SYN's, while it is decided */
	struct tcp_pkt pkt;     /* a rewritten segment as parsed (the honest handshake's rebuilt SYN) */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct craft_buf);
} craft_scratch SEC(".maps");

static __always_inline struct craft_buf *craft_buf(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&craft_scratch, &zero);
}

/* Swaps the segment's ends: MACs, IP addresses (the TCP ports go with the
 * new header, put_tcp). A swap changes no sum: no checksum to update. */
static __always_inline int swap_ends(struct __sk_buff *skb, const struct tcp_pkt *p)
{
	__u8 macs[2 * ETH_ALEN];
	__u32 src = p->family == 4 ? ETH_HLEN + offsetof(struct iphdr, saddr) : ETH_HLEN + offsetof(struct ipv6hdr, saddr);
	__u32 alen = p->family == 4 ? 4 : 16;

	if (bpf_skb_load_bytes(skb, 0, macs, sizeof(macs)) ||
	    bpf_skb_store_bytes(skb, 0, macs + ETH_ALEN, ETH_ALEN, 0) ||
	    bpf_skb_store_bytes(skb, ETH_ALEN, macs, ETH_ALEN, 0))
		return -1;
	if (alen == 4)
		return bpf_skb_store_bytes(skb, src, p->dst + 12, 4, 0) ||
		       bpf_skb_store_bytes(skb, src + 4, p->src + 12, 4, 0);
	return bpf_skb_store_bytes(skb, src, p->dst, 16, 0) || bpf_skb_store_bytes(skb, src + 16, p->src, 16, 0);
}

/* Replaces the TCP header of p's segment (payload-less; p gives its family
 * and where its TCP header starts, which a rewrite does not move) with
 * b->new's first new_len bytes. The checksum field is moved by the
 * difference (b->new's own is ignored), and the IP length follows. */
static __attribute__((noinline)) int put_tcp(struct __sk_buff *skb, const struct tcp_pkt *p, struct craft_buf *b,
					     __u32 new_len)
{
	__u32 l3 = p->l4_off - ETH_HLEN, csum_off = p->l4_off + TCP_CSUM_OFF, old_len;
	__s64 diff, tail = 0;
	__be16 old_tot, new_tot;

	if (!b || bpf_skb_load_bytes(skb, p->l4_off, b->old, sizeof(struct tcphdr)))
		return -1;
	old_len = ((struct tcphdr *)b->old)->doff * 4;
	if (old_len < sizeof(struct tcphdr) || old_len > TCP_HDR_MAX || new_len < sizeof(struct tcphdr) ||
	    new_len > TCP_HDR_MAX || (new_len & 3))
		return -1;
	/* The same values, in a form whose bounds the verifier sees where they are used. */
	old_len = sizeof(struct tcphdr) + MASKED(old_len - sizeof(struct tcphdr), TCP_OPTS_BUF - 1);
	new_len = sizeof(struct tcphdr) + MASKED(new_len - sizeof(struct tcphdr), TCP_OPTS_BUF - 1);
	if (bpf_skb_load_bytes(skb, p->l4_off, b->old, old_len))
		return -1;
	/* The field's own value on both sides: the difference leaves it out. */
	((struct tcphdr *)b->new)->check = ((struct tcphdr *)b->old)->check;
	diff = bpf_csum_diff((__be32 *)b->old, old_len, (__be32 *)b->new, new_len, 0);
	if (diff < 0)
		return -1;
	if (old_len > new_len) {
		/* the sum of old[new_len..old_len): both buffers start at old */
		tail = bpf_csum_diff((__be32 *)b->old, new_len, (__be32 *)b->old, old_len, 0);
		if (tail < 0)
			return -1;
	}
	if (bpf_skb_change_tail(skb, p->l4_off + new_len, 0) ||
	    bpf_skb_store_bytes(skb, p->l4_off, b->new, new_len, 0) ||
	    bpf_l4_csum_replace(skb, csum_off, 0, diff, 0) ||
	    bpf_l4_csum_replace(skb, csum_off, bpf_htonl(old_len), bpf_htonl(new_len), BPF_F_PSEUDO_HDR | 4))
		return -1;
	if (tail)
		bpf_csum_update(skb, tail);   /* refused unless CHECKSUM_COMPLETE: then nothing to do */
	if (p->family == 6) {
		new_tot = bpf_htons(new_len);
		return bpf_skb_store_bytes(skb, IP6_PLEN_OFF, &new_tot, 2, BPF_F_RECOMPUTE_CSUM);
	}
	if (bpf_skb_load_bytes(skb, IP4_TOTLEN_OFF, &old_tot, 2))
		return -1;
	new_tot = bpf_htons(l3 + new_len);
	return bpf_skb_store_bytes(skb, IP4_TOTLEN_OFF, &new_tot, 2, 0) ||
	       bpf_l3_csum_replace(skb, IP4_CHECK_OFF, old_tot, new_tot, 2);
}

/* b->new as a bare header (no options) from sport to dport: seq, ack (0:
 * none), flags, window. */
static __always_inline void bare_header(struct craft_buf *b, __be16 sport, __be16 dport, __u32 seq, __u32 ack,
					__u8 flags, __be16 window)
{
	struct tcphdr *h = (struct tcphdr *)b->new;

	__builtin_memset(h, 0, sizeof(*h));
	h->source = sport;
	h->dest = dport;
	h->seq = bpf_htonl(seq);
	h->ack_seq = bpf_htonl(ack);
	h->doff = sizeof(*h) / 4;
	((__u8 *)h)[TCP_FLAGS_OFF] = flags;
	h->window = window;
}

/* The segment, payload-less, made a bare RST with sequence number seq: from
 * the same sender to the same receiver, or (reverse) from the receiver back to
 * the sender. */
static __always_inline int make_rst(struct __sk_buff *skb, const struct tcp_pkt *p, __u32 seq, int reverse)
{
	struct craft_buf *b = craft_buf();

	if (!b)
		return -1;
	if (reverse) {
		if (swap_ends(skb, p))
			return -1;
		bare_header(b, p->dport, p->sport, seq, 0, TCP_FLAG_RST, 0);
	} else {
		bare_header(b, p->sport, p->dport, seq, 0, TCP_FLAG_RST, 0);
	}
	return put_tcp(skb, p, b, sizeof(struct tcphdr));
}

#endif /* PEP_FLOW_CRAFT_H */
