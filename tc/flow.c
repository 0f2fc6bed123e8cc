// SPDX-License-Identifier: GPL-2.0
/*
 * The flow datapath of an instance: the tc direct-action program
 * flow_ingress on the clsact ingress of c_in (access side) and s_in (origin
 * side) of every graph's namespace, flow_egress on their egress (the
 * proxy's own segments carry what the other end marked: flow_marks.h), and
 * flow_conns (sock_ops) counting each graph's connections. The graph slot
 * and the side come from skb->ifindex (PEP_IFINDEX_BASE + 2 * slot, + 1 for
 * the origin side).
 *
 * Each TCP flow is decided on its first SYN (decide_syn, the steps of
 * pep_flow.h in order):
 *
 *   1 to the graph's own addresses  TC_ACT_SHOT (syn_to_self)
 *   2 port or direction not ours    TC_ACT_OK, not remembered (flows_not_intercepted)
 *   3 a bypass rule matches         BYPASS_RULE: remembered, forwarded here
 *  3a an MPTCP option (and not      BYPASS_MPTCP: remembered, forwarded here
 *     mptcp = "proxy")
 *  3b a control-group subscriber    BYPASS_CONTROL: remembered, forwarded here
 *  3c the client's port is the      BYPASS_BUSY: remembered, forwarded here
 *     proxy's listener's (port kept)
 *     or the proxy's previous        ended (RSTs) and decided again, or the SYN
 *     connection's                   dropped while it is still at work
 *   4 no proxy listener, or (mode   BYPASS_FAILOPEN: remembered, forwarded here
 *     bpf) the hand-over refused
 *  4b the proxy is full: its accept  BYPASS_OVERLOAD: remembered, forwarded here
 *     queue, or maxconn connections
 *   5 otherwise                     PROXY: TC_ACT_OK (mode bpf: handed to the
 *                                   listener), not remembered; or, with the
 *                                   honest handshake, on to the origin first
 *                                   (flow_honest.h, syn_answered)
 *
 * Bypassed packets are forwarded at L3 here (flow_fwd.h) for the flow's
 * life (flow_table.h keeps them). With GRAPH_F_ASSIGN, segments of no
 * remembered flow go to their own socket, or with a valid SYN cookie to the
 * listener (flow_sock.h). A segment of no remembered flow that a bypass
 * rule names, on an intercepted port, and that no socket here owns is
 * another host's (a draining host's shares): forwarded too, as a bypassed
 * one (pkts_bypassed). So is, in modes nft and route, a segment to or from
 * an intercepted service port that no socket owns (pkts_unowned: the
 * interception would deliver it locally). Everything else goes to the stack
 * untouched.
 * While a graph's experiment is on, flow_measure.h measures the access
 * side's flows of both groups. The contract, counters included, is pep_flow.h.
 */
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "pep_flow.h"
#include "flow_craft.h"
#include "flow_fwd.h"
#include "flow_honest.h"
#include "flow_maps.h"
#include "flow_marks.h"
#include "flow_measure.h"
#include "flow_parse.h"
#include "flow_sock.h"
#include "flow_table.h"

char _license[] SEC("license") = "GPL";

static __always_inline int pass(const struct where *w, __u32 counter)
{
	count(w->slot, counter);
	return TC_ACT_OK;
}

/* The graph and side of the interface a packet came in on. Non-zero: not a
 * graph's interface, or a slot not in use. */
static __always_inline int where_from(__u32 ifindex, struct where *w)
{
	const struct graph_config *g;
	__u32 off = ifindex - PEP_IFINDEX_BASE;  /* below BASE: wraps to a huge value */

	if (off >= 2 * PEP_GRAPHS_MAX)
		return -1;
	w->slot = off >> 1;
	w->side = (off & 1) ? SIDE_ORIGIN : SIDE_ACCESS;
	g = bpf_map_lookup_elem(&graphs, &w->slot);
	if (!g || !(g->flags & GRAPH_F_ENABLED))
		return -1;
	w->flags = g->flags;
	w->listen_port = g->listen_port;
	w->control_below = g->control_below;
	w->control_seed = g->control_seed;
	w->maxconn = g->maxconn;
	w->host_maxconn = g->host_maxconn;
	return 0;
}

/* Does the graph intercept flows opened from this side to this port? */
static __always_inline int intercepted(const struct where *w, const struct tcp_pkt *p)
{
	struct port_key pk = { .graph = w->slot, .port = bpf_ntohs(p->dport) };

	if (w->side == SIDE_ORIGIN && !(w->flags & GRAPH_F_ORIGIN_SYNS))
		return 0;
	if (w->flags & GRAPH_F_ALL_PORTS)
		return 1;
	return present(bpf_map_lookup_elem(&intercept_ports, &pk));
}

/* Whether the stack's interception takes the segments of a flow to p's
 * service port (the origin's: the destination from the access side, the
 * source from the origin side). */
static __always_inline int service_port_intercepted(const struct where *w, const struct tcp_pkt *p)
{
	struct port_key pk = { .graph = w->slot, .port = bpf_ntohs(w->side == SIDE_ORIGIN ? p->sport : p->dport) };

	if (w->flags & GRAPH_F_ALL_PORTS)
		return 1;
	return present(bpf_map_lookup_elem(&intercept_ports, &pk));
}

static __always_inline int to_self(const struct where *w, const struct tcp_pkt *p)
{
	struct addr_key ak = { .graph = w->slot };

	__builtin_memcpy(ak.addr, p->dst, 16);
	return present(bpf_map_lookup_elem(&graph_addrs, &ak));
}

static __always_inline int lpm4_hit(void *map, __u32 slot, const __u8 *mapped)
{
	struct lpm4_key key = { .prefixlen = 32 + 32, .graph = bpf_htonl(slot) };

	__builtin_memcpy(key.addr, mapped + 12, 4);
	return present(bpf_map_lookup_elem(map, &key));
}

static __always_inline int lpm6_hit(void *map, __u32 slot, const __u8 *addr)
{
	struct lpm6_key key = { .prefixlen = 32 + 128, .graph = bpf_htonl(slot) };

	__builtin_memcpy(key.addr, addr, 16);
	return present(bpf_map_lookup_elem(map, &key));
}

/* A bypass rule of the graph: subscriber prefix, origin prefix, or the port
 * the SYN is addressed to. */
static __always_inline int rule_hit(const struct flow_key *k, const struct where *w, const struct tcp_pkt *p)
{
	struct port_key pk = { .graph = w->slot, .port = bpf_ntohs(p->dport) };

	if (k->family == 4) {
		if (lpm4_hit(&bypass_client4, w->slot, k->sub_addr) || lpm4_hit(&bypass_server4, w->slot, k->org_addr))
			return 1;
	} else {
		if (lpm6_hit(&bypass_client6, w->slot, k->sub_addr) || lpm6_hit(&bypass_server6, w->slot, k->org_addr))
			return 1;
	}
	return present(bpf_map_lookup_elem(&bypass_ports, &pk));
}

/* Step 4b: whether the proxy could take a new connection now. Its listener
 * (a reference the caller holds): its accept queue. The graph, and the
 * instance: their connections (conns) against their maxconn. */
static __always_inline int overloaded(struct bpf_sock *listener, const struct where *w)
{
	struct tcp_sock *tp = bpf_skc_to_tcp_sock(listener);
	__u32 all = PEP_GRAPHS_MAX, slot = w->slot;
	__u64 *n;

	/* Full as the kernel judges it (sk_acceptq_is_full): it would drop the handshake's last ACK. */
	if (tp && tp->inet_conn.icsk_inet.sk.sk_ack_backlog > tp->inet_conn.icsk_inet.sk.sk_max_ack_backlog)
		return 1;
	if (w->maxconn && (n = bpf_map_lookup_elem(&conns, &slot)) && *n >= w->maxconn)
		return 1;
	return w->host_maxconn && (n = bpf_map_lookup_elem(&conns, &all)) && *n >= w->host_maxconn;
}

/* to_proxy's answer when a listener would take the SYN but the origin is to
 * answer it first (the honest handshake): not a verdict of the contract. */
#define VERDICT_PROBE 0x100

/* Steps 4 and 5: PROXY when a listener takes the SYN (counted, and in mode
 * bpf handed over and marked), else BYPASS_FAILOPEN. With probe, a SYN a
 * listener would take is left as it is: VERDICT_PROBE. */
static __always_inline __u32 to_proxy(struct __sk_buff *skb, const struct tcp_pkt *p, const struct where *w,
				      int probe)
{
	struct bpf_sock *sk;
	__u32 verdict = VERDICT_PROXY;

	if (w->flags & GRAPH_F_ASSIGN) {
		/* A retransmitted SYN of a flow the proxy is answering goes to
		 * its request socket, which answers it again at once (as the
		 * kernel's own lookup, and nft's tproxy, would do). Handed to the
		 * listener instead it would be dropped as a duplicate, and the
		 * client would wait for the SYN-ACK timer. A TIME_WAIT socket of
		 * an old connection on the same 4-tuple is passed over: the new
		 * flow belongs to the listener. Not a new flow: not counted. */
		sk = sock_for(skb, p, p->dport);
		if (sk) {
			int mine = sk->state != BPF_TCP_TIME_WAIT && sk->state != BPF_TCP_LISTEN && !hand_to(skb, sk);

			bpf_sk_release(sk);
			if (mine)
				return VERDICT_PROXY;
		}
	}
	sk = sock_for(skb, p, listener_port(w->listen_port, p));

	if (!sk)
		return VERDICT_BYPASS_FAILOPEN;  /* the proxy is down: fail open */
	if (overloaded(sk, w)) {
		bpf_sk_release(sk);
		return VERDICT_BYPASS_OVERLOAD;
	}
	if (probe) {
		bpf_sk_release(sk);
		return VERDICT_PROBE;
	}
	if (w->flags & GRAPH_F_ASSIGN) {
		if (hand_to(skb, sk)) {
			count(w->slot, CNT_ASSIGN_FAILED);
			verdict = VERDICT_BYPASS_FAILOPEN;
		}
	}
	bpf_sk_release(sk);
	if (verdict == VERDICT_PROXY)
		count(w->slot, CNT_FLOWS_PROXIED);
	return verdict;
}

/* Sends a SYN round again (a copy to this interface's ingress, marked
 * PEP_RETRY_MARK, or PEP_PORT_RETRY_MARK after ending the proxy's connection
 * from the client's port (reverse), decided again when it comes back: each
 * socket in the way is ended once, at most two rounds) after making the SYN
 * itself the RST, sequence number seq, that ends a socket of the proxy in
 * its way (reverse: a RST as from the origin). That RST is delivered here
 * and now, before the copy comes back. With to_origin, a RST at origin_seq
 * goes first on to the SYN's destination, which still holds its end of the
 * proxy's connection: ahead of the copy on the same path, so the origin has
 * forgotten it when the SYN arrives. -1: no copy could be made, or no route
 * to the origin (nothing changed); else the tc verdict. */
static __always_inline int end_then_retry(struct __sk_buff *skb, const struct tcp_pkt *p, __u32 seq, int reverse,
					  int to_origin, __u32 origin_seq)
{
	if (to_origin && !routable(skb, p))
		return -1;
	skb->mark = reverse ? PEP_PORT_RETRY_MARK : PEP_RETRY_MARK;
	if (bpf_clone_redirect(skb, skb->ifindex, BPF_F_INGRESS)) {
		skb->mark = 0;
		return -1;
	}
	skb->mark = 0;
	if (to_origin && (make_rst(skb, p, origin_seq, 0) || send_copy(skb, p)))
		return TC_ACT_SHOT;   /* half-made; the copy finds the socket still there */
	if (make_rst(skb, p, seq, reverse))
		return TC_ACT_SHOT;
	skb->mark = PEP_LOCAL_MARK;
	return TC_ACT_OK;
}

/* Mode bpf, a SYN about to be proxied, a TIME_WAIT socket of the proxy on
 * its 4-tuple (HAProxy's accepted socket, when the proxy closed first): the
 * listener would drop the SYN as a duplicate of it, and the kernel's own
 * lookup, which lets a SYN past TIME_WAIT, looks for a listener on the
 * origin's port and finds none. So when the kernel would let this SYN past
 * (tw_takes_syn), it ends the socket (seq = its rcv_nxt; net.ipv4.tcp_rfc1337
 * = 0 in the graph's namespace) and goes round again (end_then_retry), as
 * nft's tproxy does. A SYN it would not let past, or one back from its round
 * that finds the socket still there (retry), goes to the TIME_WAIT socket,
 * which answers as the kernel does (an ACK). -1: no TIME_WAIT socket. */
static __always_inline int past_time_wait(struct __sk_buff *skb, const struct tcp_pkt *p, const struct syn_opts *o,
					  const struct where *w, int retry)
{
	struct bpf_sock *sk = sock_for(skb, p, p->dport);
	__u32 rcv_nxt = 0;
	int takes, act;

	if (!sk)
		return -1;
	if (sk->state != BPF_TCP_TIME_WAIT) {
		bpf_sk_release(sk);
		return -1;
	}
	takes = !retry && !o->payload && tw_takes_syn(sk, p, o, &rcv_nxt);
	bpf_sk_release(sk);
	if (takes && (act = end_then_retry(skb, p, rcv_nxt, 0, 0, 0)) >= 0) {
		count(w->slot, CNT_TW_RESET);
		return act;
	}
	skb->mark = PEP_LOCAL_MARK;
	count(w->slot, CNT_TW_OLD_SYN);
	return TC_ACT_OK;
}

#define PORT_FREE -1
#define PORT_BUSY -2   /* bind() would fail: the flow goes end to end */
#define PORT_HELD -3   /* the proxy's previous connection from the port is still at work: the SYN waits */

/* With source_port = "kept": the socket of the proxy's own connection to the
 * origin for the flow of p, a segment from the subscriber (found as a segment
 * from the origin would find it), or a listener on the subscriber's port (the
 * lookup falls back to one); NULL if neither. The caller releases it. */
static __always_inline struct bpf_sock *origin_sock(struct __sk_buff *skb, const struct tcp_pkt *p)
{
	struct tcp_pkt back = {
		.family = p->family,
		.sport = p->dport,
	};

	if (p->family == 4) {
		back.ip.v4.saddr = p->ip.v4.daddr;
		back.ip.v4.daddr = p->ip.v4.saddr;
	} else {
		__builtin_memcpy(back.src, p->dst, 16);
		__builtin_memcpy(back.dst, p->src, 16);
	}
	return sock_for(skb, &back, p->sport);
}

/* GRAPH_F_KEEP_PORT: whether the proxy can connect to the origin from the
 * client's own address and port. A listener on that port (the lookup falls
 * back to one: HAProxy's own) makes bind() fail: PORT_BUSY. A socket of the
 * origin side's 4-tuple (as a segment from the origin finds it: HAProxy's
 * previous connection from that port, which the client has left since, as
 * its reuse of the port shows) makes connect() fail, and its origin may
 * still hold its end, which would answer the new SYN with a RST or an ACK.
 * So it is ended, and the SYN goes round again (end_then_retry; counted
 * port_freed):
 *   - its origin done with it too (LAST_ACK, CLOSING, TIME_WAIT): a RST as
 *     from the origin (seq = its rcv_nxt), as for a TIME_WAIT socket of the
 *     SYN's own 4-tuple (the origin's TIME_WAIT takes the new SYN, as when
 *     routed);
 *   - its origin not done (ESTABLISHED, CLOSE_WAIT, FIN_WAIT1, FIN_WAIT2, and
 *     the orphan FIN_WAIT2 kept as a time-wait socket): the same, and first
 *     a RST to the origin at the socket's snd_nxt, which is the origin's
 *     rcv_nxt once what the socket sent before arrives (it does, ahead of
 *     that RST, on the same path). Seen under load: the client closes and
 *     reuses its port while HAProxy has not closed toward the origin yet
 *     (CLOSE_WAIT), and the origin's FIN_WAIT2 refused the new SYN.
 * A socket that still has data to send (write_seq past snd_nxt: what the
 * client sent, acknowledged by the proxy, not delivered yet; only its FIN,
 * in LAST_ACK or CLOSING, is ended as in FIN_WAIT1), or one still connecting
 * (SYN_SENT): PORT_HELD, the SYN dropped (port_held); the client sends it
 * again. One ended on the round before and still there when the SYN comes
 * back (HAProxy held its lock, in close(): the RST waits in its backlog
 * until close() returns, and the round, one softirq, does not outlast that;
 * seen in mode nft: a client that reuses its port the moment it closed) is
 * PORT_FREE with the honest handshake (probe): the probe's round trip to
 * the origin gives close() its time (if it was not enough, the flow goes end
 * to end when the answer comes: answer_too_early). Else PORT_BUSY: the flow
 * goes end to end, as it would with no proxy. Both ends of the old connection
 * have been told (the origin's own end is gone, or its TIME_WAIT takes the
 * new SYN as when routed); dropped, the SYN would cost the client its 1 s
 * retransmission timer. */
static __always_inline int origin_side(struct __sk_buff *skb, const struct tcp_pkt *p, const struct where *w,
				       int retry, int probe)
{
	struct bpf_sock *sk = origin_sock(skb, p);
	struct tcp_timewait_sock *tw;
	__u32 state, rcv_nxt = 0, snd_nxt = 0;
	int act, how = PORT_HELD, to_origin = 0, done, fin_unsent;
	struct tcp_sock *tp;

	if (!sk)
		return PORT_FREE;
	state = sk->state;
	/* CLOSE: caught on its way out of the table (reset, or its last ACK
	 * had). Nothing to end, but the proxy cannot connect from the port
	 * until it has left (seen: once in 100 kill -9 tests whose load
	 * reuses ports), so the flow goes end to end, as for a listener. */
	if (state == BPF_TCP_LISTEN || state == BPF_TCP_CLOSE) {
		bpf_sk_release(sk);
		return PORT_BUSY;
	}
	if (state == BPF_TCP_TIME_WAIT) {
		tw = bpf_skc_to_tcp_timewait_sock(sk);
		if (tw) {
			rcv_nxt = tw->tw_sk.__tw_common.skc_tw_rcv_nxt;
			snd_nxt = tw->tw_sk.__tw_common.skc_tw_snd_nxt;
			to_origin = tw->tw_sk.tw_substate == BPF_TCP_FIN_WAIT2;
			how = 0;
		}
	} else if (state == BPF_TCP_ESTABLISHED || state == BPF_TCP_CLOSE_WAIT || state == BPF_TCP_FIN_WAIT1 ||
		   state == BPF_TCP_FIN_WAIT2 || state == BPF_TCP_LAST_ACK || state == BPF_TCP_CLOSING) {
		tp = bpf_skc_to_tcp_sock(sk);
		done = state == BPF_TCP_LAST_ACK || state == BPF_TCP_CLOSING;
		/* HAProxy caught in close(), between the state's change and
		 * the FIN's send (seen: 1 reuse in 20): the origin has not had
		 * that FIN, so it is not done yet either, and gets the RST at
		 * snd_nxt (if the FIN goes out meanwhile, its TIME_WAIT takes
		 * the new SYN all the same). */
		fin_unsent = done && tp && tp->write_seq == tp->snd_nxt + 1;
		if (tp && (tp->write_seq == tp->snd_nxt || fin_unsent)) {
			rcv_nxt = tp->rcv_nxt;
			snd_nxt = tp->snd_nxt;
			to_origin = !done || fin_unsent;
			how = 0;
		}
	}
	bpf_sk_release(sk);
	if (retry && !how)
		return probe ? PORT_FREE : PORT_BUSY;
	if (how || retry)
		return PORT_HELD;
	act = end_then_retry(skb, p, rcv_nxt, 1, to_origin, snd_nxt);
	if (act < 0)
		return PORT_HELD;
	count(w->slot, CNT_PORT_FREED);
	return act;
}

static __always_inline __u32 verdict_counter(__u32 verdict)
{
	if (verdict == VERDICT_BYPASS_RULE)
		return CNT_FLOWS_BYPASS_RULE;
	if (verdict == VERDICT_BYPASS_CONTROL)
		return CNT_FLOWS_BYPASS_CONTROL;
	if (verdict == VERDICT_BYPASS_MPTCP)
		return CNT_FLOWS_BYPASS_MPTCP;
	if (verdict == VERDICT_BYPASS_BUSY)
		return CNT_FLOWS_BYPASS_BUSY;
	if (verdict == VERDICT_BYPASS_OVERLOAD)
		return CNT_FLOWS_BYPASS_OVERLOAD;
	return CNT_FLOWS_BYPASS_FAILOPEN;
}

/* A first SYN of no remembered flow: decided here and now. */
static __always_inline int decide_syn(struct __sk_buff *skb, const struct tcp_pkt *p, const struct where *w,
				      const struct flow_key *k)
{
	int retry = skb->mark == PEP_RETRY_MARK || skb->mark == PEP_PORT_RETRY_MARK, act;
	int port_retry = skb->mark == PEP_PORT_RETRY_MARK, probe;
	struct craft_buf *b = craft_buf();
	struct syn_opts *o;
	__u32 verdict;

	if (retry)
		skb->mark = 0;   /* back from a round of end_then_retry: decided again */
	if (to_self(w, p)) {
		/* Dropped: the PEP accepts no connection to itself through its
		 * graphs, and no proxy must answer for its addresses. */
		count(w->slot, CNT_SYN_TO_SELF);
		return TC_ACT_SHOT;
	}
	if (!intercepted(w, p))
		return pass(w, CNT_FLOWS_NOT_INTERCEPTED);
	if (!b)
		return TC_ACT_OK;   /* never: the per-CPU scratch always exists */
	o = &b->opts;
	if (read_syn_opts(skb, p, o))
		return pass(w, CNT_PKTS_NOT_TCP);   /* a header the stack will judge (and drop) */
	probe = (w->flags & GRAPH_F_HONEST) && (w->flags & GRAPH_F_ASSIGN) && probeable(p, o);
	if (rule_hit(k, w, p))
		verdict = VERDICT_BYPASS_RULE;
	else if (o->mptcp && !(w->flags & GRAPH_F_PROXY_MPTCP))
		verdict = VERDICT_BYPASS_MPTCP;
	else if (in_control(k, w))
		verdict = VERDICT_BYPASS_CONTROL;
	else if ((w->flags & GRAPH_F_ASSIGN) && (act = past_time_wait(skb, p, o, w, retry)) >= 0)
		return act;
	else if ((w->flags & GRAPH_F_KEEP_PORT) && (act = origin_side(skb, p, w, port_retry, probe)) != PORT_FREE) {
		if (act == PORT_HELD) {
			count(w->slot, CNT_PORT_HELD);
			return TC_ACT_SHOT;
		}
		if (act != PORT_BUSY)
			return act;
		verdict = VERDICT_BYPASS_BUSY;
	} else
		verdict = to_proxy(skb, p, w, probe);
	if (verdict == VERDICT_PROBE) {
		/* On to the origin, forwarded as a bypassed flow's SYN is. */
		syn_record(skb, k, p, o, w->side, 0);
		marks_syn(k, p, o, w->flags & GRAPH_F_KEEP_PORT);
		count(w->slot, CNT_SYNS_PROBED);
		measure_start(k, p, w, GROUP_TREATED);
		return forward(skb, p, w->slot);
	}
	if (verdict == VERDICT_PROXY) {
		marks_syn(k, p, o, w->flags & GRAPH_F_KEEP_PORT);
		measure_start(k, p, w, GROUP_TREATED);
		return TC_ACT_OK;
	}
	remember(k, p, w, verdict);
	if (verdict == VERDICT_BYPASS_CONTROL)
		measure_start(k, p, w, GROUP_CONTROL);
	count(w->slot, verdict_counter(verdict));
	return forward(skb, p, w->slot);
}

/* The honest handshake, a first SYN of a flow with a record: a retransmission
 * while the origin has not answered goes on again (its record refreshed); the
 * SYN rebuilt once it answered SYN-ACK (or a retransmission since) goes to
 * the listener, or, gone meanwhile, end to end. -1: no record of this SYN. */
static __always_inline int honest_syn(struct __sk_buff *skb, const struct tcp_pkt *p, const struct where *w,
				      const struct flow_key *k)
{
	struct flow_syn *r = bpf_map_lookup_elem(&syns, k);
	struct craft_buf *b;
	__u32 verdict;

	if (!r)
		return -1;
	if (r->syn_seq != p->seq || r->opener != w->side) {
		bpf_map_delete_elem(&syns, k);   /* the 4-tuple reused: a new flow */
		return -1;
	}
	if (r->state == SYN_PROBING) {
		b = craft_buf();
		if (b && !read_syn_opts(skb, p, &b->opts) && probeable(p, &b->opts))
			syn_record(skb, k, p, &b->opts, w->side, r->first_seen_ns);
		return forward(skb, p, w->slot);
	}
	verdict = to_proxy(skb, p, w, 0);
	if (verdict == VERDICT_PROXY)
		return TC_ACT_OK;
	bpf_map_delete_elem(&syns, k);
	remember(k, p, w, verdict);
	count(w->slot, verdict_counter(verdict));
	return forward(skb, p, w->slot);
}

static __always_inline int first_syn(struct __sk_buff *skb, const struct tcp_pkt *p, const struct where *w,
				     const struct flow_key *k)
{
	const struct flow_new *n = bpf_map_lookup_elem(&flows_new, k);
	const struct flow_est *e;
	int act;

	if (w->flags & GRAPH_F_HONEST) {
		act = honest_syn(skb, p, w, k);
		if (act >= 0)
			return act;
	}

	if (n) {
		if (n->syn_seq == p->seq)
			return forward(skb, p, w->slot);  /* a retransmission: decided already */
		bpf_map_delete_elem(&flows_new, k);    /* the 4-tuple reused: a new flow */
	}
	e = bpf_map_lookup_elem(&flows, k);
	if (e) {
		if (e->syn_seq == p->seq)
			return forward(skb, p, w->slot);
		bpf_map_delete_elem(&flows, k);
	}
	return decide_syn(skb, p, w, k);
}

static __always_inline void mark_own(struct __sk_buff *skb, const struct where *w)
{
	skb->mark = PEP_LOCAL_MARK;
	count(w->slot, CNT_PKTS_ASSIGNED);
}

/* Mode bpf: a segment of a flow the proxy holds a socket for. Zero: it has
 * one, and the segment is marked for local delivery (counted pkts_assigned);
 * the kernel's own early demultiplexing then finds that very socket and
 * reuses the input route cached on it. Handing it over here (bpf_sk_assign)
 * would skip that cache and cost a policy-routing lookup per packet (measured:
 * 0.86 of routing's 10 MB rate against 0.95 without interception in tc).
 * Tried before the flow tables: almost every segment in this mode is a
 * proxied flow's; a bypassed flow pays one lookup that finds nothing.
 * 1: the 4-tuple's socket is in TIME_WAIT, or a SYN-ACK meets a socket that
 * is not connecting; not marked yet: a bypassed flow may have taken the
 * 4-tuple since (the caller looks first). -1: none. */
static __always_inline int to_own_socket(struct __sk_buff *skb, const struct tcp_pkt *p, const struct where *w,
					 __u32 *state_out)
{
	struct bpf_sock *sk = sock_for(skb, p, p->dport);
	__u32 state;

	if (!sk)
		return -1;
	state = sk->state;
	*state_out = state;
	bpf_sk_release(sk);
	/* The lookup falls back to a listener on the segment's port: a
	 * bypassed flow to or from the listener's port (50080) is not the
	 * listener's. Only a socket of this very 4-tuple is the flow's. */
	if (state == BPF_TCP_LISTEN)
		return -1;
	/* A SYN-ACK is only a connecting socket's. To another (the proxy's
	 * previous connection on this 4-tuple, ended for a new flow and not
	 * gone yet: origin_side's PORT_BUSY) it is the new flow's, if one is
	 * remembered: the caller looks first, as for TIME_WAIT. */
	if (state == BPF_TCP_TIME_WAIT || (is_syn_ack(p) && state != BPF_TCP_SYN_SENT))
		return 1;
	mark_own(skb, w);
	return 0;
}

/* Mode bpf: a bare FIN from the subscriber to the proxy's socket (still open:
 * state) before the proxy's own connection to the origin is up. HAProxy 2.6
 * would abort that connection with a RST ("the client might want to abort":
 * a client that left with nothing to send while the server connection was
 * being made), where the origin, routed, sees the FIN. Dropped, the FIN comes
 * again on the subscriber's retransmission timer, once the connection is up,
 * and goes on as a FIN (fin_deferred). A flow proxied with the client's port
 * kept (MARK_S_KEPT) has the proxy's connection found by its 4-tuple and its
 * state read (established within the last jiffy or two, nothing sent or
 * had yet, counts as still connecting: the kernel has the SYN-ACK, HAProxy
 * may not have seen it yet; seen under load, 1 zero-byte flow in about 50);
 * any other (from a spare port, or proxied before this datapath ran: no
 * marks) has its first bare FIN held back once if its subscriber sent
 * no data. The graph's flag alone would hold forever the FIN of a flow whose
 * proxy connected from a spare port before a reload or an upgrade set it. */
static __always_inline int fin_too_early(struct __sk_buff *skb, const struct tcp_pkt *p, const struct where *w,
					 const struct flow_key *k, __u32 state)
{
	struct flow_marks *m;
	struct tcp_sock *tp;
	struct bpf_sock *sk;
	__u32 b_state;
	int young;

	if (w->side != SIDE_ACCESS || (p->flags & (TCP_FLAG_FIN | TCP_FLAG_RST | TCP_FLAG_SYN)) != TCP_FLAG_FIN ||
	    payload_len(p) || (state != BPF_TCP_ESTABLISHED && state != BPF_TCP_SYN_RECV))
		return 0;
	m = bpf_map_lookup_elem(&marks, k);
	if ((w->flags & GRAPH_F_KEEP_PORT) && m && (m->seen & MARK_S_KEPT)) {
		sk = origin_sock(skb, p);
		if (!sk)
			return 1;
		b_state = sk->state;
		young = 0;
		if (b_state == BPF_TCP_ESTABLISHED) {
			tp = bpf_skc_to_tcp_sock(sk);
			young = tp && !tp->bytes_received && !tp->bytes_acked &&
				(__u32)bpf_jiffies64() - tp->rcv_tstamp <= 1;
		}
		bpf_sk_release(sk);
		return b_state == BPF_TCP_SYN_SENT || b_state == BPF_TCP_LISTEN || young;
	}
	if (!m || (m->seen & (MARK_S_SUB_DATA | MARK_S_FIN_HELD)))
		return 0;
	m->seen |= MARK_S_FIN_HELD;
	return 1;
}

/* Non-zero when a socket of this namespace owns the segment's 4-tuple (not
 * a listener: a connection, a request or a TIME_WAIT socket). */
static __always_inline int owned(struct __sk_buff *skb, const struct tcp_pkt *p)
{
	struct bpf_sock *sk = sock_for(skb, p, p->dport);
	int mine;

	if (!sk)
		return 0;
	mine = sk->state != BPF_TCP_LISTEN;
	bpf_sk_release(sk);
	return mine;
}

/* The listener a segment of no remembered flow would reach, when the segment
 * is an ACK with a valid SYN cookie of that listener (the handshake of a flow
 * it answered by a cookie); else NULL. The caller releases it. */
static __always_inline struct bpf_sock *cookie_listener(struct __sk_buff *skb, struct tcp_pkt *p,
							const struct where *w)
{
	struct bpf_sock *sk;

	if (!is_bare_ack(p))
		return NULL;
	sk = sock_for(skb, p, listener_port(w->listen_port, p));
	if (sk && !cookie_valid(sk, p)) {
		bpf_sk_release(sk);
		return NULL;
	}
	return sk;
}

/* Modes nft and route: whether a segment of no remembered flow, to or from a
 * service port the stack's interception takes, is nobody's here: no socket
 * owns its 4-tuple, and it answers no SYN cookie. Left to the stack, the
 * interception would deliver it locally, to the listener, which would reset
 * it, or (route mode, the origin's side) to no socket. It is a bypassed
 * flow's whose entry the tables lost, or a late one of a connection the proxy
 * has ended (pep_flow.h): forwarded end to end, as with no PEP. */
static __always_inline int unowned(struct __sk_buff *skb, struct tcp_pkt *p, const struct where *w)
{
	struct bpf_sock *sk;

	if ((p->flags & TCP_FLAG_SYN) || !service_port_intercepted(w, p) || owned(skb, p))
		return 0;
	sk = cookie_listener(skb, p, w);
	if (sk)
		bpf_sk_release(sk);
	return !sk;
}

/* Whether a segment of no remembered flow may be another proxy host's: to or
 * from what a bypass rule names, on a port the proxy intercepts (no_flow). */
static __always_inline int another_hosts(const struct flow_key *k, const struct where *w, const struct tcp_pkt *p)
{
	return rule_hit(k, w, p) && service_port_intercepted(w, p);
}

/* A segment of no remembered flow, and (mode bpf) no socket but maybe a
 * TIME_WAIT one another host's flow overrides (later): an ACK with a
 * valid SYN cookie goes to the listener. One of a flow this graph did not
 * see begin, to or from what a bypass rule names, and that no socket here
 * owns, is forwarded: it is another proxy host's. (A draining host hands its
 * shares' new flows to their other host, and the origin's answers to that
 * host still come here until the routers move the shares.) Left to the
 * stack, the interception (tproxy, or route mode's rules) would hand it to
 * HAProxy, which would reset it (others: 0 for a stale SYN-ACK, which is
 * this host's own). Else the stack's. */
static __always_inline int no_flow(struct __sk_buff *skb, struct tcp_pkt *p, const struct where *w,
				   const struct flow_key *k, int others)
{
	struct bpf_sock *sk;
	long err;

	if ((w->flags & GRAPH_F_ASSIGN) && listener_port(w->listen_port, p) != p->dport && intercepted(w, p)) {
		sk = cookie_listener(skb, p, w);
		if (sk) {
			err = hand_to(skb, sk);
			bpf_sk_release(sk);
			return pass(w, err ? CNT_ASSIGN_FAILED : CNT_PKTS_SYNCOOKIE);
		}
	}
	/* In mode bpf the caller found no socket already. */
	if (others && another_hosts(k, w, p) && ((w->flags & GRAPH_F_ASSIGN) || !owned(skb, p)))
		return forward(skb, p, w->slot);
	if (!(w->flags & GRAPH_F_ASSIGN)) {
		if (others && unowned(skb, p, w)) {
			count(w->slot, CNT_PKTS_UNOWNED);
			return forward(skb, p, w->slot);
		}
		marks_in(k, p, w);   /* modes nft and route: the proxy's flows end up here */
	}
	return pass(w, CNT_PKTS_NO_FLOW);
}

/* A SYN-ACK answering another SYN on a remembered flow's 4-tuple: typically
 * HAProxy's own connection to the origin, made from the client's address
 * (usesrc clientip) on a port an old bypassed flow used. The old flow is
 * forgotten (by the caller) and the segment is of no flow, or the origin's
 * answer would be forwarded to the client and the proxied connection hang. */
static __always_inline int stale(struct __sk_buff *skb, struct tcp_pkt *p, const struct where *w,
				 const struct flow_key *k)
{
	count(w->slot, CNT_FLOWS_STALE);
	return no_flow(skb, p, w, k, 0);   /* this host's own connection, not another host's */
}

/* The opener's SYN, rebuilt from the origin's SYN-ACK p (record r), handed to
 * the listener where it is, at the origin side's ingress (bpf_sk_assign works
 * on any ingress interface of the namespace): one pass through the stack
 * fewer than putting it in at the opener's interface. When the proxy cannot
 * take it now, it is put in there after all, where honest_syn sends it end
 * to end. */
static __always_inline int accepted_here(struct __sk_buff *skb, const struct tcp_pkt *p, const struct where *w,
					 const struct flow_syn *r)
{
	struct craft_buf *b = craft_buf();
	struct where at = *w;
	struct tcp_pkt *q;

	if (b) {
		q = &b->pkt;   /* the rebuilt SYN: p the other way */
		*q = *p;
		at.side = r->opener;
		__builtin_memcpy(q->src, p->dst, 16);
		__builtin_memcpy(q->dst, p->src, 16);
		q->ip.v4.saddr = p->ip.v4.daddr;
		q->ip.v4.daddr = p->ip.v4.saddr;
		q->sport = p->dport;
		q->dport = p->sport;
		if (to_proxy(skb, q, &at, 0) == VERDICT_PROXY)
			return TC_ACT_OK;
	}
	skb->mark = 0;
	return bpf_redirect(side_ifindex(w->slot, r->opener), BPF_F_INGRESS);
}

/* The honest handshake gives a probed flow up (record r): the origin's answer
 * p goes on to the opener, and the flow end to end, remembered as verdict. */
static __always_inline int answered_end_to_end(struct __sk_buff *skb, const struct tcp_pkt *p, const struct where *w,
					       const struct flow_key *k, const struct flow_syn *r, __u32 verdict)
{
	struct flow_new n = {
		.verdict = verdict,
		.syn_seq = r->syn_seq,
		.synack_seq = p->seq,
		.opener = r->opener,
		.state = FLOW_SYNACK_SEEN,
		.first_seen_ns = r->first_seen_ns,
	};

	bpf_map_update_elem(&flows_new, k, &n, BPF_ANY);
	bpf_map_delete_elem(&syns, k);
	count(w->slot, verdict_counter(verdict));
	return forward(skb, p, w->slot);
}

/* The honest handshake: the origin's answer to a probe (pep_flow.h, syns).
 * -1: not one. */
static __always_inline int syn_answered(struct __sk_buff *skb, struct tcp_pkt *p, const struct where *w,
					const struct flow_key *k)
{
	struct flow_syn *r = bpf_map_lookup_elem(&syns, k);
	struct craft_buf *b = craft_buf();
	__u8 syn_flags = TCP_FLAG_SYN;
	int err;

	if (!r || r->opener == w->side || !(p->flags & TCP_FLAG_ACK) || p->ack_seq != r->syn_seq + 1)
		return -1;
	if (r->state == SYN_ACCEPTED) {
		/* The origin answering again (it had the SYN twice, or our RST
		 * was lost): never the opener's to see; the RST goes again. */
		if (is_syn_ack(p) && !make_rst(skb, p, p->ack_seq, 1) &&
		    !set_dscp(skb, p, (p->family == 4 ? r->tos : bpf_ntohl(r->ip_word) >> 20) & DSCP_MASK))
			return bpf_redirect(rst_egress(skb, p), 0);
		return TC_ACT_SHOT;
	}
	if (p->flags & TCP_FLAG_RST) {
		bpf_map_delete_elem(&syns, k);
		count(w->slot, CNT_ORIGIN_REFUSED);
		return forward(skb, p, w->slot);   /* refused: on to the opener */
	}
	if (!is_syn_ack(p) || !b)
		return -1;
	/* ECN toward the opener as the origin answered it (RFC 3168: ECE
	 * without CWR); toward the origin as the opener asked. */
	if ((r->tcp_flags & ECN_SETUP) == ECN_SETUP && (p->flags & ECN_SETUP) == TCP_FLAG_ECE)
		syn_flags |= ECN_SETUP;
	err = read_syn_opts(skb, p, &b->opts) ? 1 : 0;
	if (!err) {
		marks_answer(k, p, &b->opts);
		err = syn_rebuild(skb, p, r, syn_flags, !b->opts.has_sack, !b->opts.has_ts);
	}
	if (err < 0)
		return TC_ACT_SHOT;   /* half-made: the origin sends its SYN-ACK again, or the opener its SYN */
	if (err) {
		/* An answer this datapath cannot rewrite: the flow goes end to end. */
		count(w->slot, CNT_PROBE_FAILED);
		return answered_end_to_end(skb, p, w, k, r, VERDICT_BYPASS_FAILOPEN);
	}
	r->state = SYN_ACCEPTED;
	count(w->slot, CNT_ORIGIN_ACCEPTED);
	return accepted_here(skb, p, w, r);
}

/* With source_port = "kept", the honest handshake: the record of the probe
 * that p answers if a socket of the proxy still holds its 4-tuple (the
 * proxy's previous connection from the opener's port, being ended when
 * origin_side let the SYN probe; its process still in close()); else NULL.
 * The proxy could not connect from that port yet, and that socket would take
 * the answer. The flow goes end to end instead (BYPASS_BUSY): dropped, the
 * answer would come again only on the origin's 1 s timer. A SYN-ACK only:
 * one lookup per connection. */
static __always_inline const struct flow_syn *answer_too_early(struct __sk_buff *skb, const struct tcp_pkt *p,
							       const struct where *w, const struct flow_key *k)
{
	struct flow_syn *r;
	struct bpf_sock *sk;
	int held;

	if (!(w->flags & GRAPH_F_HONEST) || !(w->flags & GRAPH_F_KEEP_PORT) || !is_syn_ack(p))
		return NULL;
	r = bpf_map_lookup_elem(&syns, k);
	if (!r || r->opener == w->side || r->state == SYN_ACCEPTED || p->ack_seq != r->syn_seq + 1)
		return NULL;
	sk = sock_for(skb, p, p->dport);
	if (!sk)
		return NULL;
	held = sk->state != BPF_TCP_LISTEN;
	bpf_sk_release(sk);
	return held ? r : NULL;
}

/* A RST that refuses the SYN of n (RFC 9293: it acknowledges the SYN). */
static __always_inline int refuses(const struct tcp_pkt *p, const struct flow_new *n)
{
	return (p->flags & TCP_FLAG_RST) && (p->flags & TCP_FLAG_ACK) && p->ack_seq == n->syn_seq + 1;
}

/* Any segment but a first SYN. */
static __always_inline int later(struct __sk_buff *skb, struct tcp_pkt *p, const struct where *w,
				 const struct flow_key *k)
{
	const struct flow_syn *early;
	struct flow_est *e;
	struct flow_new *n;
	__u32 state = 0;
	int own = -1;

	if (measuring(w))
		measure(k, p, w);
	early = answer_too_early(skb, p, w, k);
	if (early)
		return answered_end_to_end(skb, p, w, k, early, VERDICT_BYPASS_BUSY);
	if (w->flags & GRAPH_F_ASSIGN) {
		own = to_own_socket(skb, p, w, &state);
		if (!own) {
			if (fin_too_early(skb, p, w, k, state)) {
				count(w->slot, CNT_FIN_DEFERRED);
				return TC_ACT_SHOT;
			}
			marks_in(k, p, w);
			return TC_ACT_OK;
		}
	}
	if ((w->flags & GRAPH_F_HONEST) && (p->flags & (TCP_FLAG_SYN | TCP_FLAG_RST))) {
		int act = syn_answered(skb, p, w, k);

		if (act >= 0)
			return act;
	}
	e = bpf_map_lookup_elem(&flows, k);
	if (e) {
		if (is_syn_ack(p) && p->ack_seq != e->syn_seq + 1) {
			bpf_map_delete_elem(&flows, k);
			return stale(skb, p, w, k);
		}
		est_seen(e, p, w->side);
		return forward(skb, p, w->slot);
	}
	n = bpf_map_lookup_elem(&flows_new, k);
	if (!n) {
		/* A late segment of the proxy's closed connection goes to its
		 * TIME_WAIT socket, unless it is another host's flow that reuses
		 * the 4-tuple (a drain hands the shares' new flows on; clients
		 * reuse ports at once): the socket would swallow its segments
		 * (seen: test_cluster's drain timed out 3 connections in 2,000). */
		if (own == 1 && !another_hosts(k, w, p)) {
			mark_own(skb, w);
			return TC_ACT_OK;
		}
		return no_flow(skb, p, w, k, 1);
	}
	if (is_syn_ack(p)) {
		if (w->side == n->opener || p->ack_seq != n->syn_seq + 1) {
			bpf_map_delete_elem(&flows_new, k);
			return stale(skb, p, w, k);
		}
		n->synack_seq = p->seq;
		n->state = FLOW_SYNACK_SEEN;
	} else if (w->side != n->opener && n->state == FLOW_SYN_SEEN && !refuses(p, n)) {
		/* The other end has not answered the SYN yet, so this is not the
		 * flow's: an earlier connection's on the 4-tuple (the origin's
		 * ACK of the proxy's FIN on the port a client reused at once:
		 * BYPASS_BUSY). Forwarded, the client would answer it with a RST
		 * that ends the new flow's entry. */
		count(w->slot, CNT_PKTS_OLD_CONNECTION);
		return TC_ACT_SHOT;
	} else if (p->flags & TCP_FLAG_RST) {
		bpf_map_delete_elem(&flows_new, k);  /* refused or aborted: nothing to keep */
	} else if (w->side == n->opener && (p->flags & TCP_FLAG_ACK) && n->state == FLOW_SYNACK_SEEN &&
		   p->ack_seq == n->synack_seq + 1) {
		promote(k, n, w->slot);
	} else if (n->state == FLOW_PROVEN) {
		promote(k, n, w->slot);   /* put off before */
	}
	return forward(skb, p, w->slot);
}

SEC("tc")
int flow_ingress(struct __sk_buff *skb)
{
	struct tcp_pkt p = {};
	struct flow_key key;
	struct where w;

	/* Not a graph's interface, or a slot not in use: we know no graph to
	 * count in, nor which end is the subscriber. Left to the stack,
	 * uncounted: a setup error, not traffic. */
	if (where_from(skb->ifindex, &w))
		return TC_ACT_OK;
	if (parse_tcp(skb, &p))
		return pass(&w, CNT_PKTS_NOT_TCP);
	flow_key_of(&p, &w, &key);
	if (is_first_syn(&p))
		return first_syn(skb, &p, &w, &key);
	return later(skb, &p, &w, &key);
}

/* The origin reset the flow, and the proxy's socket toward the subscriber
 * sends its FIN (p, without data): that FIN goes as a RST, at the sequence
 * number it had, and the socket itself is ended by a RST as from the
 * subscriber (seq = the FIN's ack: its rcv_nxt), put in at this interface's
 * ingress, or it would send its FIN again until its orphan retries run out,
 * counted all along as a connection of the graph. Non-zero: not done. */
static __attribute__((noinline)) int reset_both(struct __sk_buff *skb, const struct tcp_pkt *p)
{
	struct tcp_pkt q = *p;   /* p as the RST to the socket will be: the other way */

	__builtin_memcpy(q.src, p->dst, 16);
	__builtin_memcpy(q.dst, p->src, 16);
	q.ip.v4.saddr = p->ip.v4.daddr;
	q.ip.v4.daddr = p->ip.v4.saddr;
	q.sport = p->dport;
	q.dport = p->sport;
	if (make_rst(skb, p, p->ack_seq, 1) || bpf_clone_redirect(skb, skb->ifindex, BPF_F_INGRESS))
		return -1;
	return make_rst(skb, &q, p->seq, 1);
}

/* The proxy's own segments leaving c_in (to the subscriber) or s_in (to the
 * origin): they carry what the other end marked its own with (flow_marks.h).
 * Forwarded packets (bypassed flows, the honest handshake's probe, the
 * datapath's own RSTs) came in on an interface and pass untouched. Not
 * skb->sk: a veth does not orphan a packet, so a forwarded one still holds
 * its sender's socket, in another namespace. */
SEC("tc")
int flow_egress(struct __sk_buff *skb)
{
	struct tcp_pkt p = {};
	struct flow_marks *m;
	struct flow_key key;
	struct where w;

	if (skb->ingress_ifindex || where_from(skb->ifindex, &w) || parse_tcp(skb, &p))
		return TC_ACT_OK;
	/* Seen from the flow: leaving s_in is the subscriber's way in, leaving c_in the origin's. */
	w.side = w.side == SIDE_ACCESS ? SIDE_ORIGIN : SIDE_ACCESS;
	flow_key_of(&p, &w, &key);
	m = bpf_map_lookup_elem(&marks, &key);
	if (w.side == SIDE_ACCESS) {
		/* The proxy's sockets to the origin ask ECN (tcp_ecn = 1 in the
		 * namespace); a SYN asks only when its subscriber did. */
		if (is_first_syn(&p) && (p.flags & (TCP_FLAG_ECE | TCP_FLAG_CWR)) &&
		    (!m || !(m->flags & MARK_F_SUB_ECN)))
			set_tcp_flags(skb, &p, p.flags & ~(TCP_FLAG_ECE | TCP_FLAG_CWR));
		if (!m)
			return TC_ACT_OK;
		if (is_first_syn(&p) && (m->flags & MARK_F_SUB_OPTS))
			mirror_offer(skb, &p, m->sub_mss, !(m->flags & MARK_F_SUB_SACK), !(m->flags & MARK_F_SUB_TS));
		set_dscp(skb, &p, m->sub_dscp);
		return TC_ACT_OK;
	}
	if (!m)
		return TC_ACT_OK;
	if (is_syn_ack(&p) && (m->flags & MARK_F_ORG_OPTS))
		mirror_offer(skb, &p, m->org_mss, 0, 0);
	set_dscp(skb, &p, m->org_dscp);
	if ((m->flags & MARK_F_ORG_RESET) && (p.flags & TCP_FLAG_FIN)) {
		/* The origin reset: so does the proxy (reset_both). A FIN with data
		 * loses only its FIN: the data goes, the FIN comes again alone. */
		if (payload_len(&p))
			set_tcp_flags(skb, &p, p.flags & ~TCP_FLAG_FIN);
		else if (!reset_both(skb, &p))
			count(w.slot, CNT_RESETS_TO_SUB);
		else
			return TC_ACT_SHOT;   /* half-made: the socket sends its FIN again */
	}
	return TC_ACT_OK;
}

/* flow_conns (sock_ops, on the root of the host's cgroup v2 hierarchy): each
 * graph's connections, for step 4b (pep_flow.h, conns). Every socket of the
 * host comes by; only those of a graph's namespace are counted: from the end
 * of an accepted connection's handshake to its close. It always lets the
 * socket be (returns 1) and sets no reply. */
SEC("sockops")
int flow_conns(struct bpf_sock_ops *ops)
{
	struct bpf_sock *sk = ops->sk;
	__u32 all = PEP_GRAPHS_MAX, *slot, at;
	struct conn_tag *tag;
	__u64 cookie, *n;

	if (!sk)
		return 1;
	if (ops->op == BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB) {
		cookie = bpf_get_netns_cookie(ops);
		slot = bpf_map_lookup_elem(&netns_slots, &cookie);
		if (!slot)
			return 1;
		at = *slot;
		tag = bpf_sk_storage_get(&conn_tags, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
		if (!tag || at >= PEP_GRAPHS_MAX)
			return 1;   /* no memory for the tag: not counted, so never uncounted either */
		tag->slot1 = at + 1;
		n = bpf_map_lookup_elem(&conns, &at);
		if (n)
			__sync_fetch_and_add(n, 1);
		n = bpf_map_lookup_elem(&conns, &all);
		if (n)
			__sync_fetch_and_add(n, 1);
		bpf_sock_ops_cb_flags_set(ops, ops->bpf_sock_ops_cb_flags | BPF_SOCK_OPS_STATE_CB_FLAG);
		return 1;
	}
	if (ops->op != BPF_SOCK_OPS_STATE_CB || ops->args[1] != BPF_TCP_CLOSE)
		return 1;
	tag = bpf_sk_storage_get(&conn_tags, sk, 0, 0);
	if (!tag || !tag->slot1)
		return 1;
	at = tag->slot1 - 1;
	tag->slot1 = 0;
	n = bpf_map_lookup_elem(&conns, &at);
	if (n)
		__sync_fetch_and_add(n, -1);
	n = bpf_map_lookup_elem(&conns, &all);
	if (n)
		__sync_fetch_and_add(n, -1);
	return 1;
}
