/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The proxy's sockets, as seen from tc ingress: finding a listener or a
 * flow's own socket in the namespace the packet arrived in
 * (bpf_skc_lookup_tcp), handing the packet to it (bpf_sk_assign, then
 * PEP_LOCAL_MARK, which one policy rule routes to the local table), and
 * judging a SYN cookie (bpf_tcp_check_syncookie).
 *
 * Every socket a lookup returns holds a reference: the caller releases it
 * (bpf_sk_release) on every path, which the verifier checks.
 */
#ifndef PEP_FLOW_SOCK_H
#define PEP_FLOW_SOCK_H

#include <linux/bpf.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/tcp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "pep_flow.h"
#include "flow_parse.h"

/* The socket (established, request, time-wait or listening) that a segment
 * of p's addresses and source port, addressed to dport (network order),
 * would reach in the skb's namespace; NULL if none. */
static __always_inline struct bpf_sock *sock_for(struct __sk_buff *skb, const struct tcp_pkt *p, __be16 dport)
{
	struct bpf_sock_tuple t = {};

	if (p->family == 4) {
		t.ipv4.saddr = p->ip.v4.saddr;
		t.ipv4.daddr = p->ip.v4.daddr;
		t.ipv4.sport = p->sport;
		t.ipv4.dport = dport;
		return bpf_skc_lookup_tcp(skb, &t, sizeof(t.ipv4), BPF_F_CURRENT_NETNS, 0);
	}
	__builtin_memcpy(t.ipv6.saddr, p->src, 16);
	__builtin_memcpy(t.ipv6.daddr, p->dst, 16);
	t.ipv6.sport = p->sport;
	t.ipv6.dport = dport;
	return bpf_skc_lookup_tcp(skb, &t, sizeof(t.ipv6), BPF_F_CURRENT_NETNS, 0);
}

/* The port the proxy listens on for a new flow of a graph: its listen_port,
 * or the SYN's own port when that is 0. Network order. */
static __always_inline __be16 listener_port(__u16 listen_port, const struct tcp_pkt *p)
{
	return listen_port ? bpf_htons(listen_port) : p->dport;
}

/* Hands the packet to sk and marks it for local delivery. Zero, or the
 * helper's error (the socket is closing; the program does not run at tc
 * ingress, as in BPF_PROG_TEST_RUN: -EOPNOTSUPP). */
static __always_inline long hand_to(struct __sk_buff *skb, struct bpf_sock *sk)
{
	long err = bpf_sk_assign(skb, sk, 0);

	if (!err)
		skb->mark = PEP_LOCAL_MARK;
	return err;
}

/* Non-zero when p, an ACK, carries a SYN cookie the listener sent: the
 * kernel says no unless tcp_syncookies is on, the listener sent cookies
 * lately (its SYN queue overflowed, or tcp_syncookies=2) and the cookie
 * checks out for p's 4-tuple and sequence numbers. */
static __always_inline int cookie_valid(struct bpf_sock *listener, struct tcp_pkt *p)
{
	if (p->family == 4)
		return bpf_tcp_check_syncookie(listener, &p->ip.v4, sizeof(p->ip.v4),
					       &p->tcp, sizeof(p->tcp)) == 0;
	return bpf_tcp_check_syncookie(listener, &p->ip.v6, sizeof(p->ip.v6), &p->tcp, sizeof(p->tcp)) == 0;
}

#endif /* PEP_FLOW_SOCK_H */
