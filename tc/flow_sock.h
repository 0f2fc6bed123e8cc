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

/* The kernel's own socket structs, as far as the datapath reads them: only
 * the fields named here, found by name in the running kernel's BTF when the
 * program is loaded (CO-RE), wherever this kernel keeps them. */
struct sock_common {
	__u32 skc_tw_rcv_nxt;          /* a TIME_WAIT socket's next expected sequence number */
	__u32 skc_tw_snd_nxt;          /* and the next it would send */
} __attribute__((preserve_access_index));

struct inet_timewait_sock {
	struct sock_common __tw_common;
	__u8 tw_substate;              /* TCP_TIME_WAIT, or TCP_FIN_WAIT2: an orphan waiting for the peer's FIN */
} __attribute__((preserve_access_index));

struct tcp_timewait_sock {
	struct inet_timewait_sock tw_sk;
	__u32 tw_ts_recent;            /* the peer's last timestamp */
} __attribute__((preserve_access_index));

struct sock {
	__u32 sk_ack_backlog;          /* a listener's accept queue: connections waiting for accept() */
	__u32 sk_max_ack_backlog;      /* and its length (listen()'s backlog, capped by somaxconn) */
} __attribute__((preserve_access_index));

struct inet_sock {
	struct sock sk;
} __attribute__((preserve_access_index));

struct inet_connection_sock {
	struct inet_sock icsk_inet;
} __attribute__((preserve_access_index));

struct tcp_sock {
	struct inet_connection_sock inet_conn;
	__u32 rcv_nxt;                 /* the next sequence number it expects */
	__u32 snd_nxt;                 /* the next it sends */
	__u32 write_seq;               /* the end of what the application wrote: above snd_nxt, data not sent yet */
	__u32 rcv_tstamp;              /* jiffies (low 32 bits) when it last had an ACK: its SYN-ACK, at first */
	__u64 bytes_received;          /* data it has had from its peer */
	__u64 bytes_acked;             /* and data of its own its peer has acknowledged */
} __attribute__((preserve_access_index));

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

/* Whether the kernel would let SYN p (options o) open a new connection over
 * tw, a TIME_WAIT socket of its 4-tuple (tcp_timewait_state_process): not
 * an old duplicate by its timestamp (PAWS), and a sequence number past the
 * old connection's or a newer timestamp. */
static __always_inline int tw_takes_syn(struct bpf_sock *tw, const struct tcp_pkt *p, const struct syn_opts *o,
					__u32 *rcv_nxt)
{
	struct tcp_timewait_sock *t = bpf_skc_to_tcp_timewait_sock(tw);
	__u32 ts_recent;

	if (!t)
		return 0;
	*rcv_nxt = t->tw_sk.__tw_common.skc_tw_rcv_nxt;
	ts_recent = t->tw_ts_recent;
	if (o->has_ts && ts_recent && (__s32)(ts_recent - o->tsval) > 0)
		return 0;   /* PAWS: an old duplicate */
	return seq_after(p->seq, *rcv_nxt) || (o->has_ts && (__s32)(ts_recent - o->tsval) < 0);
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
