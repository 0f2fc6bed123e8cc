// SPDX-License-Identifier: GPL-2.0
/*
 * pep_radio: a congestion control for the access side's radio links, as BPF
 * struct_ops (no kernel module). The law is in radio_law.h, the maps and
 * statistics in radio.h; this file feeds the law from the kernel's ACK
 * processing and applies what it says (snd_cwnd, sk_pacing_rate).
 *
 * Per ACK: one lookup of the subscriber's entry. Per control window of a
 * subscriber (about a minimum RTT): the rate update, and one lookup of the
 * graph's statistics.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_endian.h>

#include "radio.h"
#include "radio_law.h"

char _license[] SEC("license") = "GPL";

#define AF_INET 2
#define AF_INET6 10

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, RADIO_GRAPHS_MAX);
	__type(key, __u32);
	__type(value, struct radio_params);
} radio_params SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, RADIO_SUBSCRIBERS_MAX);
	__type(key, struct radio_sub_key);
	__type(value, struct radio_sub);
} radio_subs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, RADIO_GRAPHS_MAX);
	__type(key, __u32);
	__type(value, struct radio_graph_stats);
} radio_stats SEC(".maps");

#ifdef RADIO_TRACE
/* Tuning aid, off in the shipped object: the last 8192 windows of every subscriber. */
struct radio_trace_entry { __u64 now, measured, rate, elapsed, window; __u32 qd, min_rtt, bulk, pad; };
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 8192);
	__type(key, __u32);
	__type(value, struct radio_trace_entry);
} radio_trace SEC(".maps");
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} radio_trace_pos SEC(".maps");
#endif

static const __u64 qdelay_bounds[RADIO_QDELAY_BUCKETS] = RADIO_QDELAY_BOUNDS_US;
static const __u64 rate_bounds[RADIO_RATE_BUCKETS] = RADIO_RATE_BOUNDS;

static __always_inline struct radio_flow *flow_of(struct sock *sk)
{
	return (struct radio_flow *)((struct inet_connection_sock *)sk)->icsk_ca_priv;
}

static __always_inline __u32 netns_of(struct sock *sk)
{
	return sk->__sk_common.skc_net.net->ns.inum;
}

/* The subscriber is the socket's peer: the proxy's access-side sockets are
 * the ones it accepted from subscribers. An IPv4-mapped IPv6 peer is the
 * IPv4 subscriber it maps. */
static __always_inline void key_of(struct sock *sk, struct radio_sub_key *key)
{
	__builtin_memset(key, 0, sizeof(*key));
	key->netns = netns_of(sk);
	if (sk->__sk_common.skc_family == AF_INET6) {
		const __u8 *a = sk->__sk_common.skc_v6_daddr.in6_u.u6_addr8;
		__u32 w0 = sk->__sk_common.skc_v6_daddr.in6_u.u6_addr32[0];
		__u32 w1 = sk->__sk_common.skc_v6_daddr.in6_u.u6_addr32[1];
		__u32 w2 = sk->__sk_common.skc_v6_daddr.in6_u.u6_addr32[2];

		if (!w0 && !w1 && w2 == (__u32)bpf_htonl(0xffff)) {
			key->family = AF_INET;
			__builtin_memcpy(key->addr, a + 12, 4);
			return;
		}
		key->family = AF_INET6;
		__builtin_memcpy(key->addr, a, 16);
		return;
	}
	key->family = AF_INET;
	__builtin_memcpy(key->addr, &sk->__sk_common.skc_daddr, 4);
}

static __always_inline struct radio_graph_stats *stats_of(__u32 netns)
{
	struct radio_graph_stats *st = bpf_map_lookup_elem(&radio_stats, &netns);

	if (st)
		return st;
	struct radio_graph_stats zero = {};

	bpf_map_update_elem(&radio_stats, &netns, &zero, BPF_NOEXIST);
	return bpf_map_lookup_elem(&radio_stats, &netns);
}

static __always_inline __u32 srtt_us(struct tcp_sock *tp)
{
	__u32 s = tp->srtt_us >> 3;

	return s ? s : 100000;  /* no sample yet: the kernel's own initial guess is 1 s; 100 ms is kinder */
}

/* The subscriber's minimum RTT, falling back on the socket's smoothed RTT. */
static __always_inline __u32 base_rtt(struct radio_sub *sub, struct tcp_sock *tp)
{
	__u32 a = sub->min_rtt_us, b = sub->min_rtt_prev_us, m;

	m = a && (!b || a < b) ? a : b;
	return m ? m : srtt_us(tp);
}

/* cwnd and pacing rate of one flow, from its subscriber's entry. */
static __always_inline void apply(struct sock *sk, struct radio_sub *sub, __u32 min_rtt_us, __u32 target_us,
				  __u32 extra_flows)
{
	struct tcp_sock *tp = (struct tcp_sock *)sk;
	__u32 sharers = sub->bulk + extra_flows;
	__u64 share = sub->window / (sharers ? sharers : 1);

	tp->snd_cwnd = radio_cwnd(share, tp->mss_cache);
	sk->sk_pacing_rate = radio_pacing(share, min_rtt_us);
}

SEC("struct_ops")
void BPF_PROG(radio_init, struct sock *sk)
{
	struct tcp_sock *tp = (struct tcp_sock *)sk;
	struct radio_flow *f = flow_of(sk);
	struct radio_sub_key key;
	struct radio_graph_stats *st;
	struct radio_params *params;
	struct radio_sub *sub;
	__u64 now = tp->tcp_mstamp;
	__u32 netns;

	__builtin_memset(f, 0, sizeof(*f));
	/* No fq on this host's qdiscs: TCP paces by itself when asked. */
	sk->sk_pacing_status = SK_PACING_NEEDED;
	key_of(sk, &key);
	netns = key.netns;
	params = bpf_map_lookup_elem(&radio_params, &netns);
	f->target_us = params && params->target_us ? params->target_us : RADIO_TARGET_US;
	f->last_ack_us = now;
	st = stats_of(netns);
	if (st)
		__sync_fetch_and_add(&st->flows_started, 1);

	sub = bpf_map_lookup_elem(&radio_subs, &key);
	if (sub && now - sub->last_ack_us < RADIO_STALE_US && sub->window) {
		/* A known subscriber: start at its rate, shared with its flows. */
		if (st)
			__sync_fetch_and_add(&st->flows_warm, 1);
	} else {
		/* New (or forgotten): startup from the route's initial window. */
		struct radio_sub fresh = {};
		__u32 rtt = srtt_us(tp);

		fresh.window = (__u64)tp->snd_cwnd * tp->mss_cache;
		fresh.rate = fresh.window * RADIO_USEC / rtt;
		fresh.win_start_us = now;
		fresh.last_ack_us = now;
		fresh.min_rtt_stamp_us = now;
		fresh.min_rtt_us = tp->srtt_us ? rtt : 0;
		fresh.win_rtt_min_us = ~0U;
		fresh.target_us = f->target_us;
		if (bpf_map_update_elem(&radio_subs, &key, &fresh, BPF_ANY))
			return;
		sub = bpf_map_lookup_elem(&radio_subs, &key);
		if (!sub)
			return;
		if (st)
			__sync_fetch_and_add(&st->subscribers_new, 1);
	}
	__sync_fetch_and_add(&sub->flows, 1);
	sub->target_us = f->target_us;   /* the graph's, as it is now */
	f->has_sub = 1;
	apply(sk, sub, base_rtt(sub, tp), f->target_us, 1);
}

SEC("struct_ops")
void BPF_PROG(radio_release, struct sock *sk)
{
	struct radio_flow *f = flow_of(sk);
	struct radio_graph_stats *st;
	struct radio_sub_key key;
	struct radio_sub *sub;

	key_of(sk, &key);
	st = bpf_map_lookup_elem(&radio_stats, &key.netns);
	if (st)
		__sync_fetch_and_add(&st->flows_ended, 1);
	if (!f->has_sub)
		return;
	sub = bpf_map_lookup_elem(&radio_subs, &key);
	if (sub && sub->flows)
		__sync_fetch_and_add(&sub->flows, -1);
}

/* The end of a subscriber's control window: the rate update, and the graph's
 * statistics. Runs on the ACK that finds the window over and wins the
 * compare-and-swap on its start (flows of one subscriber may run on several
 * CPUs at once). */
static __always_inline void end_window(struct radio_sub *sub, __u64 start, __u64 now, __u32 min_rtt_us,
				       __u32 netns)
{
	struct radio_graph_stats *st;
	struct radio_epoch_count *slot;
	__u64 elapsed = now - start;
	__u64 measured = radio_delivery_rate(sub->win_delivered, elapsed);
	__u32 qd = sub->win_rtt_min_us == ~0U ? sub->qdelay_us : radio_qdelay(sub->win_rtt_min_us, min_rtt_us);
	__u32 epoch = now / RADIO_EPOCH_US;

	sub->window = radio_next_window(sub->window, &sub->rate, measured, min_rtt_us, qd, sub->target_us,
					sub->win_bulk);
	sub->qdelay_us = qd;
#ifdef RADIO_TRACE
	{
		__u32 z = 0, *pos = bpf_map_lookup_elem(&radio_trace_pos, &z);
		if (pos) {
			__u32 i = __sync_fetch_and_add(pos, 1) & 8191;
			struct radio_trace_entry e = {now, measured, sub->rate, elapsed, sub->window, qd, min_rtt_us, sub->win_bulk, 0};
			bpf_map_update_elem(&radio_trace, &i, &e, BPF_ANY);
		}
	}
#endif
	sub->bulk = sub->win_bulk;
	sub->win_bulk = 0;
	sub->win_delivered = 0;
	sub->win_rtt_min_us = ~0U;
	sub->window_id++;

	st = stats_of(netns);
	if (!st)
		return;
	__sync_fetch_and_add(&st->windows, 1);
	__sync_fetch_and_add(&st->qdelay_sum_us, qd);
	__sync_fetch_and_add(&st->rate_sum, sub->rate);
	__u32 qb = radio_bucket(qd, qdelay_bounds, RADIO_QDELAY_BUCKETS);
	__u32 rb = radio_bucket(sub->rate, rate_bounds, RADIO_RATE_BUCKETS);

	if (qb < RADIO_QDELAY_BUCKETS)
		__sync_fetch_and_add(&st->qdelay_bucket[qb], 1);
	if (rb < RADIO_RATE_BUCKETS)
		__sync_fetch_and_add(&st->rate_bucket[rb], 1);
	if (sub->epoch == epoch)
		return;
	sub->epoch = epoch;
	slot = &st->active[epoch & 1];
	if (slot->epoch != epoch) {
		/* The first subscriber of a new epoch clears its slot (two epochs old). */
		slot->epoch = epoch;
		slot->subscribers = 0;
		slot->rate_sum = 0;
	}
	__sync_fetch_and_add(&slot->subscribers, 1);
	__sync_fetch_and_add(&slot->rate_sum, sub->rate);
}

SEC("struct_ops")
void BPF_PROG(radio_cong_control, struct sock *sk, __u32 ack, int flag, const struct rate_sample *rs)
{
	struct tcp_sock *tp = (struct tcp_sock *)sk;
	struct radio_flow *f = flow_of(sk);
	struct radio_sub_key key;
	struct radio_sub *sub;
	__u64 now = tp->tcp_mstamp;
	__u64 gap = now - f->last_ack_us;
	__u32 in_flight_before = f->in_flight;
	long rtt = rs->rtt_us;
	__u32 min_rtt;
	__u64 start;

	f->last_ack_us = now;
	f->in_flight = tp->packets_out;
	key_of(sk, &key);
	sub = bpf_map_lookup_elem(&radio_subs, &key);
	if (!sub)
		return;   /* evicted under pressure: the window stays as it was */

	min_rtt = radio_min_rtt(&sub->min_rtt_us, &sub->min_rtt_prev_us, &sub->min_rtt_stamp_us, now,
				rtt > 0 ? (__u32)rtt : 0);
	if (!min_rtt)
		min_rtt = srtt_us(tp);
	if (rtt > 0 && (__u32)rtt < sub->win_rtt_min_us)
		sub->win_rtt_min_us = rtt;

	if (radio_is_outage(gap, in_flight_before) && now - sub->last_ack_us >= RADIO_OUTAGE_US) {
		/* The link came back. Counted once per subscriber (its other flows'
		 * ACKs would have ended the gap); the window that spans the outage
		 * says nothing of capacity: start a new one, rate kept. */
		struct radio_graph_stats *st = stats_of(key.netns);

		if (st) {
			__sync_fetch_and_add(&st->outages, 1);
			__sync_fetch_and_add(&st->outage_us, now - sub->last_ack_us);
		}
		sub->outages++;
		sub->win_start_us = now;
		sub->win_delivered = 0;
		sub->win_bulk = 0;
		sub->win_rtt_min_us = ~0U;
	}
	sub->last_ack_us = now;
	__sync_fetch_and_add(&sub->win_delivered, (__u64)rs->acked_sacked * tp->mss_cache);
	if (!rs->is_app_limited && f->window_id != sub->window_id + 1) {
		f->window_id = sub->window_id + 1;
		__sync_fetch_and_add(&sub->win_bulk, 1);
	}

	start = sub->win_start_us;
	if (now - start >= radio_window_us(min_rtt) &&
	    __sync_val_compare_and_swap(&sub->win_start_us, start, now) == start)
		end_window(sub, start, now, min_rtt, key.netns);
	apply(sk, sub, min_rtt, f->target_us, 0);
}

SEC("struct_ops")
__u32 BPF_PROG(radio_ssthresh, struct sock *sk)
{
	/* Loss is not a signal (radio_law.h): the threshold stays where it is. */
	return ((struct tcp_sock *)sk)->snd_ssthresh;
}

SEC("struct_ops")
__u32 BPF_PROG(radio_undo_cwnd, struct sock *sk)
{
	return ((struct tcp_sock *)sk)->snd_cwnd;
}

SEC(".struct_ops")
struct tcp_congestion_ops pep_radio = {
	.init = (void *)radio_init,
	.release = (void *)radio_release,
	.cong_control = (void *)radio_cong_control,
	.ssthresh = (void *)radio_ssthresh,
	.undo_cwnd = (void *)radio_undo_cwnd,
	.name = RADIO_NAME,
};
