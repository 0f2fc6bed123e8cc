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
#define SOL_TCP 6
#define TCP_USER_TIMEOUT 18
#define TCP_RTO_MAX_MS 44            /* Linux 6.15; bpf_setsockopt takes it since then too */

#define KERNEL_RTO_MIN_MS 200       /* TCP_RTO_MIN: the base of tcp_model_timeout() */

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

	return s ? s : RADIO_SRTT_GUESS_US;
}

/* How long the kernel's own backoff (doubling from TCP_RTO_MIN up to the namespace's
 * tcp_rto_max_ms) lets `retries` retransmissions go unanswered before it gives up on a connection:
 * tcp_model_timeout(), tcp_retries2's patience. */
static __always_inline __u32 kernel_patience_ms(__u32 retries, __u32 rto_max_ms)
{
	__u32 rto = KERNEL_RTO_MIN_MS, sum = 0, i;

	for (i = 0; i <= retries && i < 256; i++) {
		sum += rto;
		rto = rto * 2 < rto_max_ms ? rto * 2 : rto_max_ms;
	}
	return sum;
}

/* A radio's outages are the access side's everyday, and the kernel's retransmission timer doubles
 * through them toward two minutes: after a 3 s outage the first retransmission can come 1.5 s after
 * the link is back (lab, drive-trace: every transport stalled about 2 s after its 3 s outage). The
 * access side's sockets back off to at most RADIO_RTO_MAX_MS instead, so a flow resumes within a
 * second of its link.
 * The kernel counts a connection's patience in retransmissions on that backoff (tcp_retries2: 15 are
 * 925 s at the kernel's, 14 s at a second's; an orphan's ends as soon as the backoff reaches its
 * cap), so TCP_USER_TIMEOUT keeps the patience tcp_retries2 gives at the namespace's own backoff
 * (tcp_rto_max_ms). And after RADIO_FAST_RETRIES retransmissions of one silence the namespace's own
 * timers come back (radio_set_state): a subscriber who left for good costs some twenty
 * retransmissions a flow, not one a second for a quarter of an hour. Best effort: a kernel that
 * refuses either option (before 6.15) keeps its own timers; so does a socket whose proxy chose a
 * TCP_USER_TIMEOUT of its own. */
static __always_inline void shorten_backoff(struct sock *sk, struct radio_flow *f)
{
	struct net *net = sk->__sk_common.skc_net.net;
	int rto_max = radio_rto_max_ms(((struct tcp_sock *)sk)->srtt_us >> 3);
	int patience = kernel_patience_ms(net->ipv4.sysctl_tcp_retries2, net->ipv4.sysctl_tcp_rto_max_ms);

	if (bpf_setsockopt(sk, SOL_TCP, TCP_USER_TIMEOUT, &patience, sizeof(patience)))
		return;
	if (bpf_setsockopt(sk, SOL_TCP, TCP_RTO_MAX_MS, &rto_max, sizeof(rto_max))) {
		patience = 0;
		bpf_setsockopt(sk, SOL_TCP, TCP_USER_TIMEOUT, &patience, sizeof(patience));
		return;
	}
	f->timers = RADIO_TIMERS_SHORT;
}

static __always_inline void kernel_backoff(struct sock *sk, struct radio_flow *f)
{
	int rto_max = sk->__sk_common.skc_net.net->ipv4.sysctl_tcp_rto_max_ms, none = 0;

	bpf_setsockopt(sk, SOL_TCP, TCP_RTO_MAX_MS, &rto_max, sizeof(rto_max));
	bpf_setsockopt(sk, SOL_TCP, TCP_USER_TIMEOUT, &none, sizeof(none));
	f->timers = RADIO_TIMERS_SILENT;
}

/* Per ACK. A receiver that closed its window is probed on the retransmission timer's backoff, and
 * tcp_retries2 probes unanswered end the connection: on a second's backoff, a subscriber whose
 * receive buffer was full would lose it in a tunnel of 14 s. The namespace's own timers while the
 * window is shut; short again once it opens, or when ACKs come after a long silence. */
static __always_inline void backoff_on_ack(struct sock *sk, struct radio_flow *f)
{
	__u32 wnd = ((struct tcp_sock *)sk)->snd_wnd;

	if (!wnd && f->timers == RADIO_TIMERS_SHORT)
		kernel_backoff(sk, f);
	else if (wnd && f->timers == RADIO_TIMERS_SILENT)
		shorten_backoff(sk, f);
}

static __always_inline void apply(struct sock *sk, const struct radio_out *out)
{
	((struct tcp_sock *)sk)->snd_cwnd = out->cwnd;
	sk->sk_pacing_rate = out->pacing;
}

/* The graph's statistics, from what the law said happened. */
static __always_inline void count(__u32 netns, const struct radio_sub *sub, const struct radio_out *out, __u64 now)
{
	struct radio_graph_stats *st;
	struct radio_epoch_count *slot;
	__u32 epoch = now / RADIO_EPOCH_US;
	__u32 qb, rb;

	if (!out->window_ended && !out->outage_us)
		return;
	st = stats_of(netns);
	if (!st)
		return;
	if (out->outage_us) {
		__sync_fetch_and_add(&st->outages, 1);
		__sync_fetch_and_add(&st->outage_us, out->outage_us);
	}
	if (!out->window_ended)
		return;
	__sync_fetch_and_add(&st->windows, 1);
	__sync_fetch_and_add(&st->qdelay_sum_us, out->qdelay_us);
	__sync_fetch_and_add(&st->rate_sum, sub->rate);
	qb = radio_bucket(out->qdelay_us, qdelay_bounds, RADIO_QDELAY_BUCKETS);
	rb = radio_bucket(sub->rate, rate_bounds, RADIO_RATE_BUCKETS);
	if (qb < RADIO_QDELAY_BUCKETS)
		__sync_fetch_and_add(&st->qdelay_bucket[qb], 1);
	if (rb < RADIO_RATE_BUCKETS)
		__sync_fetch_and_add(&st->rate_bucket[rb], 1);
	if (sub->epoch == epoch)
		return;
	/* "Subscribers active": each counts itself once an epoch, in the
	 * epoch's slot; the first of a new epoch clears the slot (two epochs old). */
	((struct radio_sub *)sub)->epoch = epoch;
	slot = &st->active[epoch & 1];
	if (slot->epoch != epoch) {
		slot->epoch = epoch;
		slot->subscribers = 0;
		slot->rate_sum = 0;
	}
	__sync_fetch_and_add(&slot->subscribers, 1);
	__sync_fetch_and_add(&slot->rate_sum, sub->rate);
}

/* The socket joins its subscriber's entry, and its window is its share of the subscriber's. A
 * subscriber new, or not heard from for RADIO_STALE_US (radio_sub_fresh), starts over from the
 * socket's window (the route's initial window at a handshake); the sockets a stale entry counts carry
 * over (radio_sub_init). A new entry goes in only if none is there: two handshakes of a new
 * subscriber on two CPUs join one entry, not one each, the second overwriting the first's. */
static __always_inline void join(struct sock *sk, const struct radio_sub_key *key, int starting)
{
	struct tcp_sock *tp = (struct tcp_sock *)sk;
	struct radio_flow *f = flow_of(sk);
	struct radio_graph_stats *st = stats_of(key->netns);
	struct radio_params *params = bpf_map_lookup_elem(&radio_params, &key->netns);
	__u32 target = params && params->target_us ? params->target_us : RADIO_TARGET_US;
	struct radio_sub *sub = bpf_map_lookup_elem(&radio_subs, key);
	struct radio_out out = {};
	__u64 now = tp->tcp_mstamp;
	__u8 timers = f->timers;

	if (sub && radio_sub_fresh(sub, now)) {
		if (st && starting)
			__sync_fetch_and_add(&st->flows_warm, 1);
	} else {
		struct radio_sub fresh;

		radio_sub_init(&fresh, sub, now, tp->srtt_us >> 3, tp->snd_cwnd, tp->mss_cache, target);
		if (!bpf_map_update_elem(&radio_subs, key, &fresh, sub ? BPF_EXIST : BPF_NOEXIST) && st)
			__sync_fetch_and_add(&st->subscribers_new, 1);
		sub = bpf_map_lookup_elem(&radio_subs, key);   /* ours, or the one another CPU put first */
		if (!sub)
			return;
	}
	radio_start(sub, f, now, srtt_us(tp), tp->mss_cache, target, &out);
	f->timers = timers;               /* the socket's timers are what they were */
	apply(sk, &out);
}

SEC("struct_ops")
void BPF_PROG(radio_init, struct sock *sk)
{
	struct radio_graph_stats *st;
	struct radio_sub_key key;

	__builtin_memset(flow_of(sk), 0, sizeof(struct radio_flow));
	/* No fq on this host's qdiscs: TCP paces by itself when asked. */
	sk->sk_pacing_status = SK_PACING_NEEDED;
	key_of(sk, &key);
	st = stats_of(key.netns);
	if (st)
		__sync_fetch_and_add(&st->flows_started, 1);
	join(sk, &key, 1);
	if (!((struct inet_connection_sock *)sk)->icsk_user_timeout)
		shorten_backoff(sk, flow_of(sk));
}

SEC("struct_ops")
void BPF_PROG(radio_release, struct sock *sk)
{
	struct radio_graph_stats *st;
	struct radio_sub_key key;
	struct radio_sub *sub;

	key_of(sk, &key);
	st = bpf_map_lookup_elem(&radio_stats, &key.netns);
	if (st)
		__sync_fetch_and_add(&st->flows_ended, 1);
	sub = bpf_map_lookup_elem(&radio_subs, &key);
	if (sub)
		radio_stop(sub, flow_of(sk), ((struct tcp_sock *)sk)->mss_cache);
}

SEC("struct_ops")
void BPF_PROG(radio_cong_control, struct sock *sk, __u32 ack, int flag, const struct rate_sample *rs)
{
	struct tcp_sock *tp = (struct tcp_sock *)sk;
	struct radio_sub_key key;
	struct radio_out out;
	struct radio_sub *sub;
	struct radio_ack a = {
		.now_us = tp->tcp_mstamp,
		.acked_bytes = (__u64)rs->acked_sacked * tp->mss_cache,
		.lost_bytes = (__u64)rs->losses * tp->mss_cache,
		.rtt_us = rs->rtt_us > 0 ? (__u32)rs->rtt_us : 0,
		.srtt_us = srtt_us(tp),
		/* in flight, as the law counts it (tcp_packets_in_flight): not what was selectively
		 * acknowledged or marked lost. packets_out counts both: a flow whose timer fired kept its
		 * whole window counted against its subscriber's until its next ACK, a dead peer's until
		 * its connection gave up, and the others were held to their floor meanwhile. */
		.packets_out = tp->packets_out - (tp->sacked_out + tp->lost_out) + tp->retrans_out,
		.prior_in_flight = rs->prior_in_flight,
		.cwnd = tp->snd_cwnd,
		.mss = tp->mss_cache,
		/* the peer's timestamp on this ACK; 0 without timestamps (a peer's clock is never 0 here:
		 * radio_queue_sample treats 0 as none) */
		.tsval = tp->rx_opt.rcv_tsval,
		.app_limited = rs->is_app_limited,
	};

	backoff_on_ack(sk, flow_of(sk));
	key_of(sk, &key);
	sub = bpf_map_lookup_elem(&radio_subs, &key);
	if (!sub || !radio_attached(sub, flow_of(sk))) {
		/* Its subscriber's entry was evicted under pressure (or another took its place since, or the
		 * map was full when it started): it joins again and starts over, as a new subscriber's flow.
		 * Left alone it kept the window it had, a single packet after a timeout, for good. */
		join(sk, &key, 0);
		return;
	}
	radio_on_ack(sub, flow_of(sk), &a, &out);
	apply(sk, &out);
	count(key.netns, sub, &out, a.now_us);
}

SEC("struct_ops")
void BPF_PROG(radio_cwnd_event, struct sock *sk, enum tcp_ca_event event)
{
	struct tcp_sock *tp = (struct tcp_sock *)sk;
	struct radio_sub_key key;
	struct radio_out out;
	struct radio_sub *sub;

	/* CA_EVENT_LOSS: the retransmission timer fired (tcp_enter_loss). CA_EVENT_TX_START: the
	 * first segment goes out with nothing in flight (tcp_event_data_sent, before the rest of what
	 * the window lets out): what was written and not yet sent is what the flow has to send. */
	if (event != CA_EVENT_LOSS && event != CA_EVENT_TX_START)
		return;
	key_of(sk, &key);
	sub = bpf_map_lookup_elem(&radio_subs, &key);
	if (!sub)
		return;
	if (event == CA_EVENT_LOSS) {
		radio_on_rto(sub, tp->tcp_mstamp);
		return;
	}
	if (radio_on_tx_start(sub, flow_of(sk), tp->tcp_mstamp, tp->write_seq - tp->snd_nxt, srtt_us(tp),
			      tp->mss_cache, &out))
		apply(sk, &out);
}

/* Every retransmission timeout enters TCP_CA_Loss again (tcp_enter_loss): after RADIO_FAST_RETRIES
 * of one silence, the namespace's own timers (shorten_backoff; backoff_on_ack shortens them
 * again once ACKs come). */
SEC("struct_ops")
void BPF_PROG(radio_set_state, struct sock *sk, __u8 new_state)
{
	struct radio_flow *f = flow_of(sk);

	if (new_state == TCP_CA_Loss && f->timers == RADIO_TIMERS_SHORT &&
	    ((struct inet_connection_sock *)sk)->icsk_retransmits >= RADIO_FAST_RETRIES)
		kernel_backoff(sk, f);
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
	.cwnd_event = (void *)radio_cwnd_event,
	.set_state = (void *)radio_set_state,
	.ssthresh = (void *)radio_ssthresh,
	.undo_cwnd = (void *)radio_undo_cwnd,
	.name = RADIO_NAME,
};
