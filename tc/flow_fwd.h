/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Forwarding a bypassed packet at L3 from tc ingress, as the stack's own
 * forwarding would, minus netfilter (and so minus TPROXY and HAProxy):
 * TTL / hop limit checked and decremented, next hop and MACs from the FIB
 * and the neighbour table, out by the egress device. Counted in the
 * graph's own slots of flow_stats.
 */
#ifndef PEP_FLOW_FWD_H
#define PEP_FLOW_FWD_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "flow_maps.h"
#include "flow_parse.h"

#define AF_INET 2
#define AF_INET6 10
#define IP4_TTL_OFF (ETH_HLEN + offsetof(struct iphdr, ttl))
#define IP4_CSUM_OFF (ETH_HLEN + offsetof(struct iphdr, check))
#define IP6_HLIM_OFF (ETH_HLEN + offsetof(struct ipv6hdr, hop_limit))

/* Writes TTL - 1 (IPv4: and patches the header checksum; the TCP checksum
 * does not cover the TTL) or hop limit - 1 (IPv6: no header checksum).
 * Non-zero only when the kernel cannot make the skb writable (memory). */
static __always_inline int decrement_ttl(struct __sk_buff *skb, const struct tcp_pkt *p)
{
	__u8 ttl = p->ttl - 1;
	__be16 old_word, new_word;

	if (p->family == 6)
		return bpf_skb_store_bytes(skb, IP6_HLIM_OFF, &ttl, 1, 0);

	/* The checksum covers TTL as the high byte of the 16-bit word it
	 * shares with the protocol: replace that word in the sum. */
	if (load_hdr(skb, IP4_TTL_OFF, &old_word, sizeof(old_word)))
		return -1;
	new_word = old_word;
	*(__u8 *)&new_word = ttl;
	if (bpf_l3_csum_replace(skb, IP4_CSUM_OFF, old_word, new_word, sizeof(new_word)))
		return -1;
	return bpf_skb_store_bytes(skb, IP4_TTL_OFF, &ttl, 1, 0);
}

/* The FIB's answer for p as the stack would forward it from the interface it
 * came in on, rules on its protocol and ports aside (below): next hop, egress
 * interface and MACs in fib. */
static __always_inline long route_of(struct __sk_buff *skb, const struct tcp_pkt *p, struct bpf_fib_lookup *fib)
{
	fib->ifindex = skb->ingress_ifindex;
	/* No protocol and no ports: route mode's interception rules (iif c_in
	 * ipproto tcp dport P, iif s_in ... sport P: lookup the local table)
	 * would match them and answer "local", so a bypassed flow would be
	 * delivered to HAProxy's listener after all, or reset when there is
	 * none (fail-open). What the datapath forwards is routed as the main
	 * table routes it. The namespace has no multipath route whose hash the
	 * ports would feed. */
	/* tot_len stays 0 on purpose. Given, the kernel compares it with the
	 * route's MTU, and a GSO super-packet (up to 64 KB of a TCP stream from
	 * a local or veth sender) would fail with FRAG_NEEDED. Left 0, it checks
	 * the skb itself against the egress MTU, GSO-aware (is_skb_forwardable). */
	if (p->family == 4) {
		fib->family = AF_INET;
		fib->tos = p->tos;
		__builtin_memcpy(&fib->ipv4_src, p->src + 12, 4);
		__builtin_memcpy(&fib->ipv4_dst, p->dst + 12, 4);
	} else {
		fib->family = AF_INET6;
		fib->flowinfo = p->flowinfo;
		__builtin_memcpy(fib->ipv6_src, p->src, 16);
		__builtin_memcpy(fib->ipv6_dst, p->dst, 16);
	}
	return bpf_fib_lookup(skb, fib, sizeof(*fib), 0);
}

/* Whether send_copy can send p's segment on: a route, and the next hop's MAC known. */
static __attribute__((noinline)) int routable(struct __sk_buff *skb, const struct tcp_pkt *p)
{
	struct bpf_fib_lookup fib = {};

	return route_of(skb, p, &fib) == BPF_FIB_LKUP_RET_SUCCESS;
}

/* The segment's MACs written from the FIB for the next hop toward p's
 * destination. That hop's egress interface, or -1: no route, or the next
 * hop's MAC not known yet (routable() says beforehand), the MACs maybe
 * rewritten. */
static __attribute__((noinline)) long to_next_hop(struct __sk_buff *skb, const struct tcp_pkt *p)
{
	struct bpf_fib_lookup fib = {};

	if (route_of(skb, p, &fib) != BPF_FIB_LKUP_RET_SUCCESS ||
	    bpf_skb_store_bytes(skb, offsetof(struct ethhdr, h_dest), fib.dmac, ETH_ALEN, 0) ||
	    bpf_skb_store_bytes(skb, offsetof(struct ethhdr, h_source), fib.smac, ETH_ALEN, 0))
		return -1;
	return fib.ifindex;
}

/* A copy of the segment as it is now (one the datapath made: a RST to the
 * origin) sent on toward its destination (to_next_hop); the segment itself
 * stays here. Zero: sent. Non-zero: not sent, the MACs maybe rewritten. */
static __always_inline int send_copy(struct __sk_buff *skb, const struct tcp_pkt *p)
{
	long ifindex = to_next_hop(skb, p);

	return ifindex < 0 || bpf_clone_redirect(skb, ifindex, 0) ? -1 : 0;
}

/* Forwards a packet of a bypassed flow of graph slot: TC_ACT_REDIRECT, or
 * TC_ACT_SHOT / TC_ACT_OK as said at each case. A subprogram, not inlined:
 * it has five callers, and inlined in each it made the program 40% bigger. */
static __attribute__((noinline)) int forward(struct __sk_buff *skb, const struct tcp_pkt *p, __u32 slot)
{
	struct bpf_fib_lookup fib = {};
	struct bpf_redir_neigh nh = {};
	long rc;

	/* Expired: dropped here and not left to the stack, whose interception
	 * (TPROXY) would hand the segment to HAProxy (no ICMP time exceeded,
	 * then). */
	if (p->ttl <= 1) {
		count(slot, CNT_PKTS_TTL_EXPIRED);
		return TC_ACT_SHOT;
	}

	rc = route_of(skb, p, &fib);
	switch (rc) {
	case BPF_FIB_LKUP_RET_SUCCESS:
		/* A failed write leaves a half-rewritten packet: drop it (only
		 * under memory pressure; the contract has no counter for it). */
		if (decrement_ttl(skb, p) ||
		    bpf_skb_store_bytes(skb, offsetof(struct ethhdr, h_dest), fib.dmac, ETH_ALEN, 0) ||
		    bpf_skb_store_bytes(skb, offsetof(struct ethhdr, h_source), fib.smac, ETH_ALEN, 0))
			return TC_ACT_SHOT;
		count(slot, CNT_PKTS_BYPASSED);
		return bpf_redirect(fib.ifindex, 0);
	case BPF_FIB_LKUP_RET_NO_NEIGH:
		/* Routed, but the next hop's MAC is not known yet: the kernel
		 * resolves it (ARP / ND) and fills in the MACs. The lookup left
		 * the next hop in ipv4_dst / ipv6_dst: the gateway, or the
		 * packet's own destination on a connected route; its family may
		 * differ from the packet's (IPv4 via an IPv6 gateway). */
		if (decrement_ttl(skb, p))
			return TC_ACT_SHOT;  /* memory pressure, as above */
		nh.nh_family = fib.family;
		if (fib.family == AF_INET)
			nh.ipv4_nh = fib.ipv4_dst;
		else
			__builtin_memcpy(nh.ipv6_nh, fib.ipv6_dst, 16);
		count(slot, CNT_PKTS_BYPASSED);
		return bpf_redirect_neigh(fib.ifindex, &nh, sizeof(nh), 0);
	case BPF_FIB_LKUP_RET_NOT_FWDED:
		/* Addressed to this namespace itself (local, broadcast): not ours
		 * to forward; the stack delivers it. */
		return TC_ACT_OK;
	default:
		/* No usable route (blackhole, unreachable, prohibit), forwarding
		 * disabled on the ingress device, too big for the egress MTU, or
		 * a bad lookup argument (< 0). Passed on, it would meet the
		 * stack's TPROXY rule, which must never see a bypassed flow. */
		count(slot, CNT_PKTS_FIB_MISS);
		return TC_ACT_SHOT;
	}
}

#endif /* PEP_FLOW_FWD_H */
