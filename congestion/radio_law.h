/* SPDX-License-Identifier: GPL-2.0 */
/*
 * pep_radio's control law: pure integer arithmetic, no helpers and no maps,
 * so that the same text runs in the kernel (congestion/radio.bpf.c) and in
 * the userspace model the tests drive (congestion/model.c). Units: bytes,
 * bytes/s, microseconds. Include radio.h first.
 *
 * The idea, per subscriber (every flow of one subscriber crosses the same
 * radio queue, so they share one estimate and one window):
 *   - The subscriber's flows together may have `window` bytes in flight;
 *     each gets an equal share of it (radio_share). A window of
 *     rate x (min RTT + target) keeps `target` of queue in the radio's
 *     buffer, whatever the capacity, and bounds what goes into a dead link.
 *     On a long round trip the window holds a quarter of it when that is
 *     more than the target: the link lives on the queue for the round trip
 *     the law takes to follow a rise (radio_window_queue).
 *   - Every control window (about one minimum RTT, at least 25 ms: radio links
 *     deliver in bursts, and a window must hold several; but no more than 50 ms
 *     or half of one: radio_window_us), the law looks at
 *     what the flows delivered (bytes/s) and the least queue sample of the
 *     window (the downlink's one-way delay over its floor, from the peer's
 *     TCP timestamps: radio_queue_sample) and sets the next window
 *     (radio_next_window): from the measured capacity when there is a queue,
 *     by growing it when there is none. A rise is bounded per window however
 *     many bytes one burst of ACKs brings (that burst is what inflates BBR's
 *     max filter on radio links). Startup grows per ACK, as slow start does.
 *   - Loss is not a signal: radio links lose frames that have nothing to do
 *     with the queue, and a deep drop-tail buffer is never full at the target.
 *     Only delay is, but for an overflow: a fifth of a window lost while the
 *     queue is over the target (or unseen), or a retransmission timer while
 *     ACKs keep coming (radio_end_window, radio_on_rto).
 *   - The flows together never have more in flight than the window: each
 *     gets its share, but no more than the others leave (radio_share), and
 *     a flow that begins to send counts what it sends at once, not from its
 *     first ACK (radio_on_tx_start).
 *   - Every 10 s the window drains the queue for a round trip, so every flow
 *     sees its floor again; sooner when the law is blind: its only flows
 *     began beside others' data and give no samples until a drain.
 *   - A pause of the link (the subscriber received nothing for RADIO_SILENCE_US
 *     and two round trips with data in flight: a scheduler's silence, an
 *     outage when it lasts RADIO_OUTAGE_US) is not
 *     congestion: the window that spans it is dropped, window and rate kept,
 *     the flows resume at them, paced, on the first ACK, and the delay of the
 *     packets sent before it ended (they waited out the pause) is not read as
 *     a queue. After an outage the link may come back slower: half the
 *     window, in startup (radio_after_outage).
 *   - When the rate falls at once, it falls by at most half per window, so
 *     a window that spanned a lull in delivery cannot collapse it.
 *   - On a slow link, saturation is judged against four frames' time at the
 *     rate when that is longer than the target: a frame's own wait for the
 *     link is not a queue (radio_judged_target).
 *   - Control windows and pauses run on the subscriber's time: an ACK counts
 *     when the subscriber sent it (its timestamp tells), not when the uplink's
 *     grants let it through (radio_uplink_hold).
 */
#ifndef PEP_RADIO_LAW_H
#define PEP_RADIO_LAW_H

#define RADIO_USEC 1000000ULL
#define RADIO_WINDOW_MIN_US 25000          /* a control window is at least this long: several grants */
#define RADIO_WINDOW_FADE_US 50000         /* ... and no longer than this, or half the minimum RTT (radio_window_us) */
#define RADIO_WINDOW_MIN_BYTES 6000ULL     /* four packets: never below */
#define RADIO_CWND_MIN 4                   /* packets */
#define RADIO_OVERFLOW_PARTS 5             /* a window that lost 1/5 of what it sent overflowed the buffer */
#define RADIO_SRTT_GUESS_US 100000         /* an RTT before any sample (the kernel's guess, 1 s, is unkind) */
#define RADIO_DRAIN_EVERY_US 10000000      /* a subscriber's queue is drained this often (radio_end_window) */
#define RADIO_DRAIN_BLIND_US 1000000       /* ... and sooner when blind (radio_window_blind), but not this soon */
#define RADIO_BLIND_WINDOWS 2              /* windows in a row blind before that drain */
#define RADIO_SEEN_PROVEN 1                /* win_seen: an ACK of a flow whose samples count */
#define RADIO_SEEN_SET_ASIDE 2             /* ... a queue sample set aside: its flow is not proven yet */
#define RADIO_TS_JUDGE_MS 200              /* a peer's clock is judged over this long at least, */
#define RADIO_TS_JUDGE_RTTS 4              /* ... and this many round trips */
#define RADIO_DRIFT_PPM 200                /* the most a peer's clock drifts from ours (radio_drifting_base) */
#define RADIO_OUTAGE_CUT 2                 /* an outage leaves the window this many times smaller */
#define RADIO_RESUME_PROBE 2               /* packets a flow may send past its flight when the link resumes */
#define RADIO_JUDGE_FRAMES 4               /* saturation is judged against the target or this many frames' */
#define RADIO_JUDGE_MAX_US 100000          /* ... time at the rate, but no more than this (radio_judged_target) */
#define RADIO_FRAME_BYTES 1500
#define RADIO_PATH_QUEUE_PARTS 4           /* a window holds the target, or this part of the round trip */
#define RADIO_PATH_QUEUE_MAX_US 50000      /* ... when longer, but no more than this (radio_window_queue) */

/* The standing queue: the window's least RTT above the minimum RTT. */
static inline __u32 radio_qdelay(__u32 rtt_us, __u32 min_rtt_us)
{
	return rtt_us > min_rtt_us ? rtt_us - min_rtt_us : 0;
}

/* How long a control window lasts: a minimum RTT, but no more than RADIO_WINDOW_FADE_US or half
 * of it, whichever is longer. A radio's capacity fades on a time of its own (tens to hundreds
 * of ms), whatever the path behind it: a window of a whole 150 ms round trip followed a 3G link's
 * rise after a fade in two seconds, and its fall with a second's queue (the model,
 * `congestion.frontier --targets 30`, 3g-trace: goodput over CUBIC's 0.67 and request p95 +331 ms
 * over the idle link's; half the RTT, 0.72 and +322; 50 ms, 0.69 and +306). Half, not less: what a
 * window measures is a round trip late, and the law's rise waits for the last one to be delivered
 * (radio_next_window). A window under 50 ms is a round trip (on LTE's 50 ms, 25 ms windows cost
 * 43 ms of request p95), and never under RADIO_WINDOW_MIN_US: it must hold several grants. */
static inline __u64 radio_window_us(__u32 min_rtt_us)
{
	__u64 window = min_rtt_us < RADIO_WINDOW_FADE_US ? min_rtt_us : RADIO_WINDOW_FADE_US;

	if (min_rtt_us / 2 > window)
		window = min_rtt_us / 2;
	return window > RADIO_WINDOW_MIN_US ? window : RADIO_WINDOW_MIN_US;
}

/* The rate a window of `elapsed_us` that delivered `delivered` bytes measured. */
static inline __u64 radio_delivery_rate(__u64 delivered, __u64 elapsed_us)
{
	return elapsed_us ? delivered * RADIO_USEC / elapsed_us : 0;
}

/* The queue that tells a saturated link from one with room, at the rate: the target, or
 * RADIO_JUDGE_FRAMES frames' time at the rate when that is longer (at most RADIO_JUDGE_MAX_US). On a
 * slow link a frame or two of the link's own wait (a grant's, its jitter with frames kept in order)
 * is longer than half the target: at 0.5 Mbit/s one frame is 24 ms. Judged against the target alone,
 * that wait read as saturation at a fade's end, and the window held while the capacity tripled (the
 * model, 3g-trace at 20 s: 14-22 ms read where the link's true wait was 1-7). The window still holds
 * its queue (radio_window_queue): only the judgment moves. */
static inline __u32 radio_judged_target(__u32 target_us, __u64 rate)
{
	__u64 frames = rate ? RADIO_JUDGE_FRAMES * RADIO_FRAME_BYTES * RADIO_USEC / rate : 0;

	if (frames > RADIO_JUDGE_MAX_US)
		frames = RADIO_JUDGE_MAX_US;
	return frames > target_us ? (__u32)frames : target_us;
}

/* The queue the window holds on a round trip of `path_us`: the target, or a quarter of the round trip
 * when that is longer (at most RADIO_PATH_QUEUE_MAX_US). The law follows a rise a round trip late and a
 * control window at a time, and until it does the link lives on the queue: on a long path a short
 * target runs dry first. A quarter is what a rise of half again needs for a control window of half
 * the round trip (radio_window_us, radio_next_window's x1.5). Below four targets (120 ms at the default)
 * the target rules, so LTE, 5G and the drive hold it as before; 3G's 150 ms (about 156 with its uplink's
 * grants) holds 39 ms. Every judgment that reads the queue against the target reads it against this
 * (radio_judged_target's, startup's end, an overflow's): the law's own queue is no excess.
 * On 3G, goodput over end-to-end CUBIC's went from 0.73-0.79 to 0.82-0.87 in the lab, the request p95
 * staying near its bar; the runs are in congestion/README.md ("3G: the frontier"). The cap: a long path whose capacity does not fade within a round trip (a GEO
 * satellite's 600 ms) gains nothing from more (the model, 4 Mbit/s at 600 ms: 3.47 Mbit/s holding
 * 30 ms, 3.49 holding 100, the queue's median 28 and 101 ms). */
static inline __u32 radio_window_queue(__u32 target_us, __u32 path_us)
{
	__u32 part = path_us / RADIO_PATH_QUEUE_PARTS;

	if (part > RADIO_PATH_QUEUE_MAX_US)
		part = RADIO_PATH_QUEUE_MAX_US;
	return part > target_us ? part : target_us;
}

/* The subscriber's next window (bytes in flight for all its flows together)
 * and smoothed delivery rate, at the end of a control window.
 *   - Queue at or above half the target: the link is saturated, so what it
 *     delivered is its capacity. rate = the mean of the old rate and that,
 *     or (the capacity fell: every window spent at the old rate adds to the
 *     queue) that at once when it is lower and the queue is over twice the
 *     target, but no less than half the old rate. Leaving startup, the rate
 *     is what was delivered: the guess it started from (a window over the
 *     handshake's RTT) says nothing of the link. window = rate x (path +
 *     target): a window above what is in flight now lets the queue fill to
 *     the target, one below it stops
 *     the flows until the queue has drained to the target. It is set from
 *     the capacity, not from the window before, so cuts never compound while
 *     the queue they act on is still draining. At or under the target, with
 *     the window used, four packets more: a probe.
 *   - Queue under half the target, a flow filled its window (`full`), and
 *     what was delivered covers three quarters of it: the link may take more;
 *     grow the window x1.5 (x1.25 once the queue is over a quarter of the
 *     target). In startup (no queue seen yet) it grew with every ACK instead,
 *     by what the ACK delivered, as slow start does. The last condition
 *     holds a rise back until the one before it has been delivered: the
 *     queue it makes shows a round trip late.
 *   - Otherwise (no flow used it, or a receiver held it back): keep both.
 * path: the round trip without our queue (the minimum RTT, and what the uplink's
 * grants add to it now). queue_us: the queue the window holds (radio_window_queue: the target, or
 * more on a long path); "the target" above, in the judgments, is radio_judged_target's of it.
 * Returns the window; *rate and *startup are updated in place. */
static inline __u64 radio_next_window(__u64 window, __u64 *rate, __u8 *startup, __u64 measured,
				      __u32 path_us, __u32 qdelay_us, __u32 queue_us, __u32 full)
{
	__u32 target_us = radio_judged_target(queue_us, *rate);
	__u64 next = window;

	if (qdelay_us * 2 >= target_us) {
		if (*startup)
			*rate = measured;
		*startup = 0;
		if (qdelay_us > 2 * target_us && measured < *rate)
			*rate = measured > *rate / 2 ? measured : *rate / 2;
		else
			*rate = (*rate + measured) / 2;
		next = *rate * (path_us + queue_us) / RADIO_USEC;
		/* At or under the target, and the flows used all of it: probe, four packets a window. A
		 * link's own jitter (grants, the radio's retransmissions) reads as a queue of 10-20 ms
		 * that is not there; near half the target it holds the window where it is, at a rate
		 * that is only what the window let through (on 3G, a quarter of the link). */
		if (qdelay_us <= target_us && full)
			next += RADIO_WINDOW_MIN_BYTES;
	} else if (full && measured * (path_us + qdelay_us) / RADIO_USEC * 4 >= window * 3) {
		if (*startup)
			next = window;             /* it grew with every ACK (radio_on_ack) */
		else
			next = qdelay_us * 4 < target_us ? window + window / 2 : window + window / 4;
		*rate = (*rate + measured) / 2;
	}
	return next < RADIO_WINDOW_MIN_BYTES ? RADIO_WINDOW_MIN_BYTES : next;
}

/* A flow's congestion window (packets): its share of the subscriber's window. */
static inline __u32 radio_cwnd(__u64 share, __u32 mss)
{
	__u64 packets = mss ? share / mss : 0;

	if (packets < RADIO_CWND_MIN)
		packets = RADIO_CWND_MIN;
	return packets > 0x7fffffff ? 0x7fffffff : (__u32)packets;
}

/* A flow's pacing rate (bytes/s): its window over the minimum RTT. The window
 * sets the pace; pacing only spreads what an ACK burst would send at once. */
static inline __u64 radio_pacing(__u64 share, __u32 min_rtt_us)
{
	return share * RADIO_USEC / (min_rtt_us ? min_rtt_us : 1);
}

/* How long the subscriber must receive nothing, with data in flight, for the link to have paused:
 * RADIO_SILENCE_US, and two round trips. A link whose scheduler grants every 100-150 ms (3G) is not
 * paused between its grants: every pause restarts the control window and sets aside the samples of
 * what was sent before it, and pauses that came every grant would leave the law blind, and its
 * window where it was (in startup, growing). */
static inline __u64 radio_pause_us(__u32 min_rtt_us)
{
	return 2 * (__u64)min_rtt_us > RADIO_SILENCE_US ? 2 * (__u64)min_rtt_us : RADIO_SILENCE_US;
}

/* Whether the gap since the last ACK, while packets were in flight, was an
 * outage: the link stopped delivering, it did not merely slow down. */
static inline int radio_is_outage(__u64 gap_us, int in_flight_before)
{
	return in_flight_before > 0 && gap_us >= RADIO_OUTAGE_US;
}

/* The link came back from an outage: at what capacity, nothing has told yet. A radio that stopped
 * for a quarter of a second or more (a tunnel, a handover, a fade to nothing) comes back in a cell
 * or at a signal of its own, often slower than before. Half the window goes out, in startup: it
 * doubles per round trip on ACKs that meet no queue, so a link that came back as it was has the old
 * window again within a round trip, and one that came back slower never meets it. Startup stops at
 * the old window (radio_on_ack), and the law goes on from there: growing on past it, startup read
 * its queue a round trip late, and stood at 1.75 times the window the link had taken before (the
 * model, 20 Mbit/s before and after a 2 s outage: 94 ms of queue for a moment). Resumed at the old
 * window, that window stood in the radio's buffer as queue when the link came back at a fraction of
 * its rate, and the requests caught behind it waited out the next outage there, and were dropped
 * (the model, mahimahi's ATT-LTE-driving-2016: request p95 +509 ms over the idle link's, +370
 * with this; 3g-trace +454 and +331; the download's goodput the same within 0.01). */
static inline void radio_after_outage(struct radio_sub *sub)
{
	if (!sub->startup)
		sub->resume_window = sub->window;
	sub->window /= RADIO_OUTAGE_CUT;
	if (sub->window < RADIO_WINDOW_MIN_BYTES)
		sub->window = RADIO_WINDOW_MIN_BYTES;
	sub->startup = 1;
}

/* The minimum RTT over the last 5-10 s, in two buckets: a sample lowers the
 * current bucket; a bucket older than half the window becomes the previous
 * one. Returns the minimum of both. */
static inline __u32 radio_min_rtt(__u32 *cur, __u32 *prev, __u64 *stamp_us, __u64 now_us, __u32 sample_us)
{
	/* (Signed: a stamp another CPU set may be a little after this ACK's clock; read unsigned, it
	 * turned the buckets over at once and lost the minimum.) */
	if ((__s64)(now_us - *stamp_us) >= RADIO_MIN_RTT_WIN_US / 2) {
		*prev = *cur;
		*cur = sample_us;
		*stamp_us = now_us;
	} else if (sample_us && (!*cur || sample_us < *cur)) {
		*cur = sample_us;
	}
	if (!*prev || (*cur && *cur < *prev))
		return *cur;
	return *prev;
}

/* The histogram bucket of a value: the first bound it does not exceed (a
 * bound of 0 is +Inf, and closes the list). */
static inline __u32 radio_bucket(__u64 value, const __u64 *bounds, __u32 n)
{
	__u32 i;

	for (i = 0; i < n; i++)
		if (!bounds[i] || value <= bounds[i])
			return i;
	return n - 1;
}

/* -- the events -------------------------------------------------------------------------- */

/* What one ACK tells the law. */
struct radio_ack {
	__u64 now_us;
	__u64 acked_bytes;                 /* newly delivered: acknowledged or selectively acknowledged */
	__u64 lost_bytes;                  /* newly marked lost */
	__u32 rtt_us;                      /* RTT sample of the newest packet it covers; 0: none */
	__u32 srtt_us;                     /* the socket's smoothed RTT: the base until a minimum is known */
	__u32 packets_out;                 /* still in flight after it */
	__u32 prior_in_flight;             /* in flight before it */
	__u32 cwnd;                        /* the flow's window before it */
	__u32 mss;
	__u32 tsval;                       /* the peer's timestamp on it (its clock: ms, radio_peer_clock); 0: none */
	__u8 app_limited;                  /* the packet was sent while the application had nothing more */
};

/* What the law tells the flow, and what happened (for the statistics). */
struct radio_out {
	__u64 pacing;                      /* bytes/s */
	__u64 outage_us;                   /* an outage just ended, this long; 0: none */
	__u64 measured;                    /* what the window that just ended delivered, bytes/s */
	__u32 cwnd;                        /* packets */
	__u32 qdelay_us;                   /* of the window that just ended */
	__u8 window_ended;
};

/* A flow's window and pacing rate for a share of `share` bytes. */
static inline void radio_share_of(__u64 share, __u32 min_rtt_us, __u32 mss, struct radio_out *out)
{
	out->cwnd = radio_cwnd(share, mss);
	out->pacing = radio_pacing(share, min_rtt_us);
}

/* The flow's window and pacing rate: its share of the subscriber's window (shared among the bulk
 * flows of the last window, plus `joining`), and no more than it has in flight plus what the
 * subscriber's flows together leave of the window. Shares alone would not bound the sum: a flow
 * that sent all it had (a keep-alive connection between objects, one that just joined) keeps a
 * share it is not using, and six of them (a page opened beside a download) would put three windows
 * in the radio's buffer at once when their next objects come; a shallow buffer drops the
 * handshakes and answers of them all. */
static inline void radio_share(const struct radio_sub *sub, __u32 min_rtt_us, __u32 mss, __u32 joining,
			       const struct radio_flow *f, struct radio_out *out)
{
	__u32 sharers = sub->bulk + joining;
	__u64 window = sub->draining ? sub->rate * min_rtt_us / RADIO_USEC / 2 : sub->window;
	__u64 share = window / (sharers ? sharers : 1);
	__s64 others = sub->inflight - (__s64)f->in_flight * mss;
	__s64 room = (__s64)window - (others > 0 ? others : 0);

	if (room < (__s64)RADIO_CWND_MIN * mss)
		room = (__s64)RADIO_CWND_MIN * mss;
	if ((__u64)room < share)
		share = (__u64)room;
	radio_share_of(share, min_rtt_us, mss, out);
}

/* The subscriber's minimum RTT as known now (0: none yet). */
static inline __u32 radio_known_min_rtt(const struct radio_sub *sub)
{
	__u32 a = sub->min_rtt_us, b = sub->min_rtt_prev_us;

	return a && (!b || a < b) ? a : b;
}

/* A subscriber's entry for its first flow: startup from the flow's initial window over its
 * handshake RTT. Or, made anew from a stale one (`stale`, radio_sub_fresh), its estimate starts over,
 * but the sockets it counts are still open (a subscriber silent for RADIO_STALE_US with its
 * connections kept: a push channel, a tunnel). Their count, what they have in flight and the entry's
 * id carry over; started from zero, their ACKs and their ends drove both below zero for good, and a
 * negative flight left the window unable to grow (win_full) or to bound the flows' sum. The verdict
 * on its timestamp clock carries over too: it is the device's, and a slow clock taken for ms again
 * filled the buffer for the seconds its next flow took to be judged (radio_peer_clock). */
static inline void radio_sub_init(struct radio_sub *sub, const struct radio_sub *stale, __u64 now_us,
				  __u32 srtt_us, __u32 cwnd, __u32 mss, __u32 target_us)
{
	__builtin_memset(sub, 0, sizeof(*sub));
	sub->window = (__u64)cwnd * mss;
	sub->rate = sub->window * RADIO_USEC / (srtt_us ? srtt_us : RADIO_SRTT_GUESS_US);
	sub->win_start_us = now_us;
	sub->last_ack_us = now_us;
	sub->last_rx_us = now_us;
	sub->min_rtt_stamp_us = now_us;
	sub->min_rtt_us = srtt_us;
	sub->win_qd_us = ~0U;
	sub->target_us = target_us;
	sub->startup = 1;
	sub->drained_us = now_us;
	sub->id = (__u32)now_us | 1;       /* never 0: a flow's sub_id before it joins */
	sub->rtt_rise.least_us = ~0U;
	sub->rtt_rise.before_us = ~0U;
	if (stale) {
		sub->flows = stale->flows;
		sub->inflight = stale->inflight;
		sub->inflight_hi = stale->inflight_hi;
		sub->id = stale->id;
		sub->ts_clock = stale->ts_clock;
	}
}

/* Whether the flow holds a count in this entry: it joined it (radio_start), not an entry of its
 * subscriber's that was evicted from the map since, nor none (its start found the map full). */
static inline int radio_attached(const struct radio_sub *sub, const struct radio_flow *f)
{
	return f->has_sub && f->sub_id == sub->id;
}

/* The access side's longest retransmission timer (ms): RADIO_RTO_MAX_MS, or RADIO_RTO_MAX_RTTS of the
 * round trip the flow began with on a longer path. Since Linux 6.15 the cap bounds the timer itself,
 * not only its backoff (tcp_bound_rto): on a path whose timer is over a second (a GEO satellite's
 * 600 ms round trip and the 200 ms the kernel adds to it at least, or a queue that stood) the timer
 * fired before the ACK could come back, and the window it retransmitted was not lost. */
static inline __u32 radio_rto_max_ms(__u32 srtt_us)
{
	__u64 rtts = (__u64)srtt_us * RADIO_RTO_MAX_RTTS / 1000;

	return rtts > RADIO_RTO_MAX_MS ? (__u32)rtts : RADIO_RTO_MAX_MS;
}

/* Whether an entry still describes its subscriber's link. Signed: another flow's last ACK, on another
 * CPU, may be stamped a little after this flow's clock, and an entry in use is not stale. */
static inline int radio_sub_fresh(const struct radio_sub *sub, __u64 now_us)
{
	return sub->window && (__s64)(now_us - sub->last_ack_us) < RADIO_STALE_US;
}

/* A flow starts (its handshake is done): it joins its subscriber's entry and
 * starts at a share of the subscriber's window. */
static inline void radio_start(struct radio_sub *sub, struct radio_flow *f, __u64 now_us, __u32 srtt_us,
			       __u32 mss, __u32 target_us, struct radio_out *out)
{
	__u32 min_rtt = radio_known_min_rtt(sub);

	__builtin_memset(out, 0, sizeof(*out));
	__builtin_memset(f, 0, sizeof(*f));
	f->last_ack_us = now_us;
	f->target_us = target_us;
	f->has_sub = 1;
	f->sub_id = sub->id;
	__sync_fetch_and_add(&sub->flows, 1);
	sub->target_us = target_us;        /* the graph's, as it is now */
	if (sub->flows == 1) {
		sub->inflight = 0;         /* its only flow: whatever the count held is stale */
		sub->inflight_hi = 0;
	}
	f->start_us = now_us;
	f->proven = sub->inflight <= 0;    /* nothing of the others in flight: no queue to take for a base */
	radio_share(sub, min_rtt ? min_rtt : srtt_us, mss, 1, f, out);
}

/* A flow's high-water flight: what it had in flight before its last ACK (0 once it has nothing out),
 * summed over the subscriber's flows in inflight_hi. A flow that the window holds back refills to its
 * window right after each ACK, so that is what it has out between its ACKs; the count after the ACK
 * (inflight) is short by what the ACK covered. With a page's six connections at 4-5 packets each
 * beside a download, every one delaying its ACKs, that was half of each flow's window: the sum read
 * 60% of the subscriber's window when the flows held all of it, the window never counted as used
 * (win_full), and it did not grow while the link offered twice what they took (model, 3g-trace, a
 * page beside a download: 1.6-1.8 of 2.2-4.7 Mbit/s for 2 s, the link's queue under 10 ms). */
static inline void radio_flight_hi(struct radio_sub *sub, struct radio_flow *f, __u32 packets, __u32 mss)
{
	if (packets != f->flight_hi)
		__sync_fetch_and_add(&sub->inflight_hi, ((__s64)packets - (__s64)f->flight_hi) * mss);
	f->flight_hi = packets;
}

/* A flow begins to send with nothing of its own in flight: a new flow's first data, or a keep-alive
 * connection's next object. Its window is what the subscriber's window has room for now, not what
 * its last ACK (or its handshake) left it, and no more than what it has to send (`unsent` bytes, at
 * least RADIO_CWND_MIN packets); what it has to send, up to that window, counts as in flight at
 * once. A flow's flight otherwise counts only from its first ACK, a round trip on: flows that began
 * together each saw the whole room, and each sent a window it had been given while idle (lab,
 * Verizon-LTE-short: a page's six connections got their next objects within a millisecond and sent
 * 39 packets each beside the download's 59, 305 packets in flight against a window of 78: the
 * radio's queue went to its 500 ms limit). Returns 0, and leaves `out` alone, when the flow has
 * packets counted in flight already (a retransmission after a timeout) or is a download of the last
 * windows. srtt_us: the socket's, until the subscriber has a minimum RTT (as radio_start). */
static inline int radio_on_tx_start(struct radio_sub *sub, struct radio_flow *f, __u64 now_us, __u64 unsent,
				    __u32 srtt_us, __u32 mss, struct radio_out *out)
{
	__u32 known = radio_known_min_rtt(sub);
	__u32 min_rtt_us = known ? known : srtt_us;
	__u64 about = mss ? (unsent + mss - 1) / mss : 0;
	__u64 most = (about > RADIO_CWND_MIN ? about : RADIO_CWND_MIN) * mss;

	/* A flow that counted itself among the bulk flows of the last window or of this one (window_id
	 * 0: never) is no newcomer: a download whose ACKs covered all it had sent, between two of a
	 * link's grants, keeps the window its last ACK gave it. Its socket may hold less than a window
	 * unsent just then (the proxy refills it once the ACK has freed room): capped to that, it lost a
	 * tenth of its goodput on the 3G and drive traces. */
	if (f->in_flight || !radio_attached(sub, f) ||
	    (f->window_id && (f->window_id == sub->window_id || f->window_id == sub->window_id + 1)))
		return 0;
	__builtin_memset(out, 0, sizeof(*out));
	/* Nothing of the subscriber's was in flight: the silence until now was its own, no pause of the
	 * link (radio_on_ack measures a pause from the last ACK, with data in flight). */
	if (sub->inflight <= 0 && (__s64)(now_us - sub->last_rx_us) > 0)
		sub->last_rx_us = now_us;
	radio_share(sub, min_rtt_us, mss, 1, f, out);
	if ((__u64)out->cwnd * mss > most)
		radio_share_of(most, min_rtt_us, mss, out);
	if (about > out->cwnd)
		about = out->cwnd;
	__sync_fetch_and_add(&sub->inflight, (__s64)about * mss);
	f->in_flight = (__u32)about;
	radio_flight_hi(sub, f, (__u32)about, mss);
	return 1;
}

/* A flow ends: what it had in flight leaves its subscriber's count. */
static inline void radio_stop(struct radio_sub *sub, struct radio_flow *f, __u32 mss)
{
	if (!radio_attached(sub, f))
		return;
	f->has_sub = 0;
	/* Never below 0 for good: two ends at once both found 1 when the count was read first. */
	if (!__sync_fetch_and_add(&sub->flows, -1))
		__sync_fetch_and_add(&sub->flows, 1);
	__sync_fetch_and_add(&sub->inflight, -(__s64)f->in_flight * mss);
	radio_flight_hi(sub, f, 0, mss);
}

/* Whether a control window was blind: it had queue samples, all set aside (their flows began beside
 * the others' data in flight and are not proven: radio_on_ack), and no ACK of a flow whose samples
 * count. A download that joined beside another one is left so when that one ends: until a drain
 * passes under it, the law neither grows nor cuts the window, however the capacity moves (the model:
 * a capacity that fell sixfold then stood in the buffer as 440 ms of queue, one that tripled went
 * unused, until the next drain up to 10 s later). */
static inline int radio_window_blind(const struct radio_sub *sub)
{
	return sub->win_qd_us == ~0U && sub->win_seen == RADIO_SEEN_SET_ASIDE;
}

/* What a control window gathers, cleared for the next one (at a window's end, and when the link
 * resumed after a pause: the window that spans it says nothing). */
static inline void radio_clear_window(struct radio_sub *sub)
{
	sub->win_delivered = 0;
	sub->win_lost = 0;
	sub->win_bulk = 0;
	sub->win_qd_us = ~0U;
	sub->win_seen = 0;
	sub->win_path_sum_us = 0;
	sub->win_path_n = 0;
}

/* The end of a subscriber's control window: its next window and rate. */
static inline void radio_end_window(struct radio_sub *sub, __u64 start_us, __u64 now_us, __u32 min_rtt_us,
				    struct radio_out *out)
{
	__u64 elapsed = now_us - start_us;
	__u64 measured = radio_delivery_rate(sub->win_delivered, elapsed);
	__u32 overflow_queue = radio_window_queue(sub->target_us, min_rtt_us);   /* (an overflow's window: below) */
	__u32 qd = sub->qdelay_us;

	/* A fifth of what the window sent lost, and a queue over the target or none
	 * seen (lost packets' ACKs carry no RTT): the radio's buffer overflowed (a
	 * window far above a capacity that fell, say tenfold at a handover). What
	 * was delivered is the capacity, at once. Isolated losses stay below the
	 * fifth, and losses while the delay stays low (a lossy radio, packets
	 * reordered) are not congestion. */
	if (sub->draining) {
		/* (A drain's window says nothing of capacity: it held the flows back on purpose.) */
		if (sub->win_qd_us != ~0U)
			qd = sub->win_qd_us;
	} else if (sub->win_lost * RADIO_OVERFLOW_PARTS > sub->win_delivered + sub->win_lost &&
		   (sub->win_qd_us == ~0U || sub->win_qd_us > overflow_queue)) {
		sub->startup = 0;
		if (measured < sub->rate)
			sub->rate = measured;
		sub->window_queue_us = overflow_queue;
		sub->window = sub->rate * (min_rtt_us + sub->window_queue_us) / RADIO_USEC;
		if (sub->window < RADIO_WINDOW_MIN_BYTES)
			sub->window = RADIO_WINDOW_MIN_BYTES;
	} else if (sub->win_qd_us != ~0U) {
		/* (A window without an RTT sample, where every ACK covered retransmissions or packets
		 * sent before a pause ended and the peer sends no timestamps, says nothing of the queue:
		 * all is kept.) */
		/* The round trip without our queue, as the window saw it: the minimum RTT, and what the
		 * uplink adds to it now (ACKs wait for their own grants, tens of ms apart). The window must
		 * cover it to keep the radio busy: the mean, not the least, or every window would stop
		 * short by the uplink's wait (an uplink's stall is left out: radio_path_sample_ok). */
		__u32 path = sub->win_path_n ? (__u32)(sub->win_path_sum_us / sub->win_path_n) : 0;

		if (path < min_rtt_us)
			path = min_rtt_us;
		qd = sub->win_qd_us;
		sub->window_queue_us = radio_window_queue(sub->target_us, path);
		sub->window = radio_next_window(sub->window, &sub->rate, &sub->startup, measured, path, qd,
						sub->window_queue_us, sub->win_full);
	}
	if (!sub->startup)
		sub->resume_window = 0;            /* (startup after an outage met a queue before its end) */
	/* Every RADIO_DRAIN_EVERY_US, the next window lets half the path's worth fly, so the radio's queue
	 * empties: every flow then sees the path's one-way delay and RTT with no queue, its base and the
	 * minimum RTT are right again (a flow that began in a held queue, a minimum that expired while
	 * the queue stood), and the law cannot creep up on a queue of its own making. It costs a round
	 * trip at half rate in ten seconds (BBR's PROBE_RTT does the same for its minimum RTT). After
	 * RADIO_BLIND_WINDOWS blind windows, at once (one alone may be a lull of the proven flows).
	 * Startup has no queue of its own to drain, but a blind one drains all the same, and then without
	 * waiting out RADIO_DRAIN_BLIND_US: startup grows only on queue samples, so a subscriber whose
	 * flows all began beside others' data in flight (a download opened while a request's answer was
	 * on its way) stayed at its first window for good (lab, mahimahi's ATT-LTE-driving run after the
	 * idle link's run: 3.2 Mbit/s for all 20 s, where end-to-end CUBIC took 5.7). */
	sub->blind = !radio_window_blind(sub) ? 0 : sub->blind < 255 ? sub->blind + 1 : 255;
	if (sub->draining) {
		sub->draining = 0;
	} else if ((!sub->startup && (__s64)(now_us - sub->drained_us) >= RADIO_DRAIN_EVERY_US) ||
		   (sub->blind >= RADIO_BLIND_WINDOWS &&
		    (sub->startup || (__s64)(now_us - sub->drained_us) >= RADIO_DRAIN_BLIND_US))) {
		sub->draining = 1;
		sub->drained_us = now_us;
		sub->blind = 0;            /* the next blind drain waits for two more blind windows */
	}
	sub->qdelay_us = qd;
	/* The flows that share the window: those that sent as much as they could in this window or the
	 * last. A flow the window holds to a few packets hears one ACK of two packets a round trip, and a
	 * control window (the minimum RTT) is shorter than a round trip with a queue: it missed every
	 * other window, and counted in one, the other flow's share was the whole window and left it its
	 * floor of four packets, so it missed more. Two downloads of one subscriber took 4 and 18 MB of a
	 * 20 Mbit/s link in 10 s, in turns, swapping every few seconds (lab, `ss -ti`: cwnd 4 against 130). */
	sub->bulk = sub->win_bulk > sub->bulk_last ? sub->win_bulk : sub->bulk_last;
	sub->bulk_last = sub->win_bulk;
	radio_clear_window(sub);
	sub->win_full = 0;
	sub->window_id++;
	out->window_ended = 1;
	out->qdelay_us = qd;
	out->measured = measured;
}

/* A base that only moves down cannot follow a path that grew longer (a new route, another gateway):
 * every sample after reads the difference as queue, for good (the model, one way 25 to 75 ms 20 s
 * into a download: 2.3 of 10 Mbit/s for the next 100 s, and 1.8 without timestamps, whose minimum
 * RTT was fed itself; in the lab, 0.3 of 20). It rises by the least its samples were above it in
 * two drain epochs in a row. A drain empties the queue (radio_end_window), so an epoch's least is 0
 * unless the base is too low; one alone may end in a drain that could not empty it (a handover to a
 * slower cell), and the epoch after it reads 0 again. A sample counts in the epoch of the last drain
 * its packet left after. Returns the rise; above_us is the sample over the base before it. */
static inline __u32 radio_rise(struct radio_rise *r, __u64 sent_us, __u64 drained_us, __u32 above_us)
{
	__u32 drain_ms = (__u32)(drained_us / 1000) | 1, rise = 0;

	if (r->drain_ms != drain_ms && (__s64)(sent_us - drained_us) >= 0) {
		if (r->drain_ms && r->least_us != ~0U && r->before_us != ~0U)
			rise = r->least_us < r->before_us ? r->least_us : r->before_us;
		r->before_us = !r->drain_ms || r->least_us == ~0U ? ~0U : r->least_us - rise;
		r->least_us = ~0U;
		r->drain_ms = drain_ms;
	}
	above_us = above_us > rise ? above_us - rise : 0;
	if (r->drain_ms && above_us < r->least_us)
		r->least_us = above_us;
	return rise;
}

/* The uplink's base (radio_uplink_hold), the peer's clock against ours: the least sample, less the
 * drift of the two clocks since it was taken. Crystals drift by tens of ppm (RADIO_DRIFT_PPM covers
 * the worst), so the true base moves by up to a few hundred ms an hour, and a base that only moved
 * down read a slow peer's drift as an uplink that held every ACK longer, for good (the model, a peer
 * 100 ppm slow, one download of 15 min: the queue's p95 72 ms instead of 37, requests' 220 ms
 * instead of 172): it rises by RADIO_DRIFT_PPM of the time since its sample, and the next sample
 * below it takes its place. The wait read short by the rise is at most that of the time since the
 * uplink last held an ACK no longer than its flow's least. (The downlink's base needs no such creep:
 * radio_rise follows a drift as it follows a longer path, radio_queue_sample.) */
static inline __s64 radio_drifting_base(__s64 *base, __u32 *stamp_ms, __u8 *has, __s64 sample, __u64 now_us)
{
	__u32 now_ms = (__u32)(now_us / 1000);
	__s64 drifted = *base + (__s64)(now_ms - *stamp_ms) * RADIO_DRIFT_PPM / 1000;

	if (*has && sample >= drifted)
		return drifted;
	*base = sample;
	*stamp_ms = now_ms;
	*has = 1;
	return sample;
}

/* The queue this ACK saw on the way to the subscriber. With the peer's TCP timestamps: the one-way
 * delay (its clock when it acknowledged, less ours when we sent) over the flow's own base, so the
 * uplink's queue, which the ACKs wait in and which the flows do not fill, is left out. Each flow has
 * its own base (a peer offsets every connection's timestamps at random): the least one-way delay it
 * has seen. A base moves down to any sample below it at once: one too high (a flow that began in a
 * standing queue) reads the queue short until a packet of it crosses a shorter one, which the
 * subscriber's drains make sure of (radio_end_window). One too low reads a queue that is not there,
 * and rises only with care: by what two drain epochs in a row saw above it (radio_rise). That also
 * follows the clocks' drift (a peer 100 ppm fast, read against a base that only moved down, made a
 * queue that grew for good: 0.77 of the goodput over 15 min in the model, and a queue p95 of 364
 * ms), two epochs late at most: a queue read 4 ms long at RADIO_DRIFT_PPM. Without timestamps, or
 * from a clock not trusted (radio_peer_clock): the RTT over the minimum. */
static inline __u32 radio_queue_sample(struct radio_flow *f, const struct radio_ack *a, __u32 min_rtt_us,
					__u64 since_us, __s64 peer_us, int use_ts, __u64 drained_us)
{
	__u32 qd, timer_wait = 0, above, rise;
	__s64 owd, base;

	/* A peer that acknowledges two packets at once delays its ACKs: one that acknowledges a single
	 * packet waited for the next packet, or for its delayed-ACK timer if that came first, and both
	 * the RTT and the peer's timestamp count the wait. On a small window on a slow link, packets
	 * arrive alone, tens of ms apart, and every ACK waits: read as a queue, the wait would cut the
	 * window further, down to its floor. The wait is at most the timer, and at most the time since
	 * the peer's ACK before (which it sent when or before the packet arrived): on a fast link, a
	 * fraction of a ms. */
	if (a->acked_bytes >= 2 * (__u64)a->mss)
		f->delacks = 1;
	else if (f->delacks)
		timer_wait = since_us < RADIO_DELACK_US ? (__u32)since_us : RADIO_DELACK_US;
	qd = radio_qdelay(a->rtt_us, min_rtt_us);
	if (peer_us) {     /* (the base is kept while the peer's clock is judged: it is ready when trusted) */
		owd = peer_us - (__s64)(a->now_us - a->rtt_us);
		if (!f->has_base || owd < f->owd_base) {
			f->owd_base = owd;
			f->has_base = 1;
		}
		base = f->owd_base;
		above = owd <= base ? 0 : owd - base < (__s64)~0U ? (__u32)(owd - base) : ~0U - 1;
		rise = radio_rise(&f->owd_rise, a->now_us - a->rtt_us, drained_us, above);
		f->owd_base += rise;
		base += rise;
		if (use_ts)
			qd = owd > base ? (__u32)(owd - base) : 0;
	}
	return qd > timer_wait ? qd - timer_wait : 0;
}

/* The peer's timestamp in us of its clock, counted on past the wrap of its 32 bits (at 1 kHz every
 * 49.7 days, from a random start: any connection may meet one). Taken as it is, the wrap moved the
 * one-way delay and the uplink's wait by 2^32 ms, and the flow never ended a control window again.
 * Serial arithmetic (RFC 7323): a timestamp older than the newest (an ACK reordered) is of the
 * wrap before when it is numerically larger. 0 without timestamps. */
static inline __s64 radio_peer_us(struct radio_flow *f, __u32 tsval)
{
	__s64 wraps;

	if (!tsval)
		return 0;
	if (!f->has_ts) {
		f->has_ts = 1;
		f->last_tsval = tsval;
	} else if ((__s32)(tsval - f->last_tsval) > 0) {
		if (tsval < f->last_tsval)
			f->ts_wraps++;
		f->last_tsval = tsval;
	}
	wraps = f->ts_wraps;
	if ((__s32)(tsval - f->last_tsval) < 0 && tsval > f->last_tsval && wraps)
		wraps--;
	return ((wraps << 32) + tsval) * 1000;
}

/* The subscriber's minimum RTT starts over: a flow read its queue from a clock faster than ms
 * (radio_peer_clock), and fed the minimum its round trips less that queue. A µs clock's queue grows
 * through every value, and a sample of it just under an RTT left a path of 2.5 ms (the lab); read
 * against it, every RTT was a queue, and the window stayed at its floor. (A slower clock's queue
 * read 0, so its samples were whole RTTs, and the minimum is right: kept, as it must be, for by
 * then the window it let grow stands in the buffer, and a minimum taken anew would count it.) */
static inline void radio_forget_min_rtt(struct radio_sub *sub, __u64 now_us)
{
	sub->min_rtt_us = 0;
	sub->min_rtt_prev_us = 0;
	sub->min_rtt_stamp_us = now_us;
}

/* Without timestamps the queue is the RTT over the subscriber's minimum RTT, and the minimum is fed
 * the RTT less that queue, itself: it never rose, and a path that grew longer was a queue for good.
 * It rises as a base does (radio_rise), by the RTTs of proven flows (radio_on_ack). Before the
 * minimum is read for this ACK: read before, its own sample fed the old one back at once. */
static inline void radio_min_rtt_rise(struct radio_sub *sub, const struct radio_ack *a)
{
	__u32 known = radio_known_min_rtt(sub), rise;

	if (!known || !a->rtt_us)
		return;
	rise = radio_rise(&sub->rtt_rise, a->now_us - a->rtt_us, sub->drained_us,
			  a->rtt_us > known ? a->rtt_us - known : 0);
	if (sub->min_rtt_us)
		sub->min_rtt_us += rise;
	if (sub->min_rtt_prev_us)
		sub->min_rtt_prev_us += rise;
}

/* Whether the peer's timestamps can be read as its ms clock. RFC 7323 lets a timestamp clock tick
 * from once a second to once a ms, and Linux before 4.13 ticked at HZ (100, 250 or 300 on the phones
 * and home routers of that age). Read as ms, a slower clock makes the one-way delay fall for good:
 * the base follows it down, the queue reads empty, and the law grew the window until the buffer
 * overflowed (the model, LTE at 250 Hz: request p95 1.2 s instead of 0.45, a page in 3.7 s instead
 * of 1.3); every ACK also read as held on the uplink. A faster one (1 MHz: Linux's TCP_USEC_TS)
 * reads a queue that grows for good. Not trusted, they are read as no timestamps: the queue from
 * RTTs. A flow's clock is judged once, from two of its ACKs with RTT samples: once they are
 * RADIO_TS_JUDGE_MS apart, and RADIO_TS_JUDGE_RTTS times the longer of their RTTs (the uplink held
 * neither for longer than its RTT, so the count is off by a quarter at most), its clock ticks in ms
 * if it counted within a factor of two of ours. Until then the flow goes by its subscriber's last
 * verdict: a short flow lives too little to be judged, and a request's flow that read no queue hid
 * the download's (the window's queue is its least sample). A subscriber with none is taken to tick
 * in ms, as peers since Linux 4.13 do, so the first seconds of its first flow may read its queue
 * wrong. */
static inline int radio_peer_clock(struct radio_sub *sub, struct radio_flow *f, const struct radio_ack *a)
{
	__u32 now_ms = (__u32)(a->now_us / 1000), ours, theirs, longer;

	if (!a->tsval || f->ts_clock != RADIO_TS_JUDGING)
		return a->tsval && f->ts_clock == RADIO_TS_MS;
	if (a->rtt_us && !f->ts_ref_ms) {
		f->ts_ref = a->tsval;
		f->ts_ref_ms = now_ms | 1;
		f->ts_ref_rtt_us = a->rtt_us;
	} else if (a->rtt_us) {
		/* (ours signed: the reference was made odd, so this ms may be before it; a clock of theirs
		 * that went back, over that long, is no ms clock either) */
		ours = now_ms - f->ts_ref_ms;
		theirs = a->tsval - f->ts_ref;
		longer = a->rtt_us > f->ts_ref_rtt_us ? a->rtt_us : f->ts_ref_rtt_us;
		if ((__s32)ours >= RADIO_TS_JUDGE_MS && ours >= RADIO_TS_JUDGE_RTTS * (longer / 1000)) {
			f->ts_clock = (__u64)theirs * 2 >= ours && theirs <= 2 * (__u64)ours ? RADIO_TS_MS : RADIO_TS_OTHER;
			if (theirs > 2 * (__u64)ours && sub->ts_clock != RADIO_TS_OTHER)
				radio_forget_min_rtt(sub, a->now_us);
			sub->ts_clock = f->ts_clock;
		}
	}
	if (f->ts_clock != RADIO_TS_JUDGING)
		return f->ts_clock == RADIO_TS_MS;
	return sub->ts_clock != RADIO_TS_OTHER;
}

/* How long this ACK waited on the uplink beyond the least any ACK of its flow waited: the
 * subscriber's clock (its timestamp, when it sent the ACK) against ours. ACKs wait for the uplink's
 * own grants, and a silence of the uplink hands over the ACKs of a quarter of a second at once:
 * taken at their arrival they read as a burst of delivery that never happened (what inflates a
 * max filter like BBR's) and as a pause of the downlink that never was. The law times its control
 * windows and pauses by `now - hold`: when the subscriber sent the ACK, on our clock.
 * The flow's base drifts with the peer's clock (radio_drifting_base). 0 without timestamps, or from a
 * clock not trusted. */
static inline __u64 radio_uplink_hold(struct radio_flow *f, const struct radio_ack *a, __s64 peer_us, int use_ts)
{
	__s64 up, base;

	if (!peer_us)
		return 0;
	up = (__s64)a->now_us - peer_us;
	base = radio_drifting_base(&f->up_base, &f->up_base_ms, &f->has_up, up, a->now_us);
	return use_ts ? (__u64)(up - base) : 0;
}

/* Whether an ACK's round trip, less its queue sample, counts toward the path the window covers
 * (radio_end_window): not when the uplink held it longer than a minimum RTT beyond the least its
 * flow has seen. The uplink's grants, a few to tens of ms apart, are part of every round trip and
 * the window must cover them; a stall of the uplink (LTE's and Wi-Fi's schedulers go silent for
 * hundreds of ms while the downlink delivers) is not: its ACKs, all late, stretched the mean path,
 * and the window grown by it stood in the radio's buffer as a queue of the stall's length once the
 * ACKs flowed again (200-340 ms p95 behind stalls of 200-500 ms, model). */
static inline int radio_path_sample_ok(__u64 held_us, __u32 min_rtt_us)
{
	return held_us <= min_rtt_us;
}

/* A flow's retransmission timer fired. While its subscriber's other ACKs kept coming (within
 * RADIO_SILENCE_US) the link is not paused: the flow's packets, and those sent again, were dropped by
 * a full buffer. The window that sees it counts as one that overflowed. A timer after a pause is
 * an outage's, and changes nothing. */
static inline void radio_on_rto(struct radio_sub *sub, __u64 now_us)
{
	if ((__s64)(now_us - sub->last_ack_us) < RADIO_SILENCE_US)
		__sync_fetch_and_add(&sub->win_lost, sub->window);
}

/* One ACK of a flow. Flows of one subscriber may run on several CPUs at
 * once: counters are added atomically, and the end of a window belongs to
 * the ACK that wins the compare-and-swap on its start. The rest is racy by
 * design (a lost minimum-RTT sample costs nothing). */
static inline void radio_on_ack(struct radio_sub *sub, struct radio_flow *f, const struct radio_ack *a,
				struct radio_out *out)
{
	/* Whether the subscriber had data in flight before this ACK: any of its flows (a short flow's
	 * first ACK may be the one that ends a pause of the download's). */
	int in_flight_before = f->in_flight || sub->inflight > 0;
	/* (Before the minimum RTT is read: a verdict on the peer's clock may make it start over, and
	 * read before, it was fed right back by this ACK's own sample.) */
	int use_ts = radio_peer_clock(sub, f, a);
	__u32 known, base_rtt;
	/* A flow's first ACK with a timestamp sets its uplink base: how long the uplink held that one is
	 * unknown, and so is when the subscriber sent it. It neither ends a pause nor dates the last ACK
	 * heard (an uplink's stall would read as a pause: a short flow's first flight counts as in flight
	 * from its first packet, radio_on_tx_start). */
	int dated = f->has_up || !use_ts;
	__u64 prev_ack_us = f->last_ack_us;
	__s64 peer_us = radio_peer_us(f, a->tsval);
	__u64 held = radio_uplink_hold(f, a, peer_us, use_ts);
	__u64 rx = a->now_us - held;                     /* when the subscriber sent this ACK */
	__u32 sample_qd = ~0U;
	__u32 path_sample = 0;
	__u32 min_rtt;
	__u64 start;

	__builtin_memset(out, 0, sizeof(*out));
	if (!use_ts && f->proven)
		radio_min_rtt_rise(sub, a);
	known = radio_known_min_rtt(sub);
	base_rtt = known ? known : a->srtt_us;           /* the minimum RTT, or the socket's guess before one */
	f->last_ack_us = a->now_us;
	/* What the subscriber has in flight, all flows together (the last ACK's count of each). */
	if (a->packets_out != f->in_flight)
		__sync_fetch_and_add(&sub->inflight, ((__s64)a->packets_out - (__s64)f->in_flight) * a->mss);
	f->in_flight = a->packets_out;
	radio_flight_hi(sub, f, a->packets_out ? a->prior_in_flight : 0, a->mss);

	if (dated && in_flight_before && (__s64)(rx - sub->last_rx_us) >= (__s64)radio_pause_us(known)) {
		/* The link resumed after a pause, an outage when it was long (counted
		 * once per subscriber: another flow's ACK would have ended the gap).
		 * A pause is the subscriber's: it received nothing (an uplink that held
		 * the ACKs back is not one). The window that spans it says nothing of
		 * capacity: a new one starts, window and rate kept. */
		if (radio_is_outage(rx - sub->last_rx_us, in_flight_before)) {
			out->outage_us = rx - sub->last_rx_us;
			sub->outages++;
			radio_after_outage(sub);
		}
		sub->resumed_us = a->now_us;
		sub->win_start_us = rx;
		radio_clear_window(sub);
	} else if (a->rtt_us && a->now_us - a->rtt_us >= sub->resumed_us) {
		/* (A packet sent before the link resumed waited out the pause: its delay is not a queue.) */
		__u32 qd = radio_queue_sample(f, a, base_rtt,
					      (__s64)(rx - f->last_rx_us) > 0 ? rx - f->last_rx_us : 0, peer_us,
					      use_ts, sub->drained_us);

		/* A flow that began beside the others' data in flight may have taken their queue for its
		 * base, and reads that queue as none: its samples count once a drain that began after it
		 * has emptied the queue under its packets. (Without this, the short flows of a page or of
		 * requests beside a download read 0 in every window, and the law grew the window into a
		 * queue of half a second on 3G.) */
		if (!f->proven && sub->drained_us > f->start_us && !sub->draining &&
		    a->now_us - a->rtt_us >= sub->drained_us)
			f->proven = 1;
		if (f->proven) {
			path_sample = a->rtt_us > qd ? a->rtt_us - qd : 0;
			sample_qd = qd;
			if (qd < sub->win_qd_us)
				sub->win_qd_us = qd;
			if (radio_path_sample_ok(held, base_rtt)) {
				sub->win_path_sum_us += path_sample;
				sub->win_path_n++;
			}
		} else {
			sub->win_seen |= RADIO_SEEN_SET_ASIDE;
		}
	}
	if (f->proven)
		sub->win_seen |= RADIO_SEEN_PROVEN;
	/* The minimum RTT is the path's without our queue: fed the RTT less its queue sample, so a queue
	 * the law holds for good does not creep into it when an old minimum expires (and with it the
	 * queue's own baseline: the law would then hold twice its target). */
	min_rtt = radio_min_rtt(&sub->min_rtt_us, &sub->min_rtt_prev_us, &sub->min_rtt_stamp_us, a->now_us,
				path_sample);
	if (!min_rtt)
		min_rtt = a->srtt_us;
	sub->last_ack_us = a->now_us;
	if (dated && (__s64)(rx - sub->last_rx_us) > 0)
		sub->last_rx_us = rx;
	f->last_rx_us = rx;
	__sync_fetch_and_add(&sub->win_delivered, a->acked_bytes);
	if (a->lost_bytes)
		__sync_fetch_and_add(&sub->win_lost, a->lost_bytes);
	if (!a->app_limited && f->window_id != sub->window_id + 1) {
		f->window_id = sub->window_id + 1;
		__sync_fetch_and_add(&sub->win_bulk, 1);
	}
	/* Startup grows the window by what each ACK delivered, as slow start does: double per round
	 * trip, whatever the control window's length (25 ms at least, many round trips on a short
	 * path). It ends at the first control window that sees a queue; and only an ACK that saw no
	 * queue grows it: one that saw none at all (its packet waited out a pause) would grow it
	 * blind, and on a link that pauses every second (3G's grants) startup would never see the
	 * queue it makes. */
	if (sub->startup && !a->app_limited && a->prior_in_flight * 4 >= a->cwnd * 3 &&
	    sample_qd * 2 < radio_window_queue(sub->target_us, min_rtt)) {
		__sync_fetch_and_add(&sub->window, a->acked_bytes);
		/* After an outage, up to the window the link took before it (radio_after_outage), and on
		 * from there as the law goes, at the rate it had. */
		if (sub->resume_window && sub->window >= sub->resume_window) {
			sub->window = sub->resume_window;
			sub->resume_window = 0;
			sub->startup = 0;
		}
	}
	/* The subscriber's flows together filled its window (this one filled its own, and with the
	 * others' flight it came to three quarters of the window): only then may the window grow. One
	 * held back by its receiver or its application says nothing of the link, and neither does a
	 * flow that filled a small window of its own while the others left most of the subscriber's
	 * unused (a window grown so would land on the radio's queue at once when they end). The others
	 * count what they had out before their last ACKs: they refilled it since (radio_flight_hi); this
	 * one what it had before this ACK, also when the ACK left it nothing out. */
	if (!a->app_limited && a->prior_in_flight * 4 >= a->cwnd * 3 &&
	    (sub->inflight_hi + ((__s64)a->prior_in_flight - (__s64)f->flight_hi) * a->mss) * 4 >=
	    (__s64)sub->window * 3)
		sub->win_full = 1;

	/* A control window ends on an ACK the subscriber's clock dates, and that delivered something:
	 * its rate is what was delivered until then. A flow's first ACK with a timestamp is dated by its
	 * arrival (how long the uplink held it is unknown), and a duplicate ACK (of a retransmission, say)
	 * delivered nothing. When the uplink falls silent, both come in the burst of held ACKs after it:
	 * a window ended by them ran on past the download's last delivery, over the silence, read the
	 * queue its flight had met at a quarter of the link's rate, and halved the rate (the model: a
	 * 900 ms silence of the uplink at 2 Mbit/s left 1 Mbit/s for a second and a half; on 3g-trace,
	 * a request's first ACK after the 0.9 s outage at 38 s closed a window of 926 ms). */
	start = sub->win_start_us;
	if (dated && a->acked_bytes && (__s64)(rx - start) >= (__s64)radio_window_us(min_rtt) &&
	    __sync_val_compare_and_swap(&sub->win_start_us, start, rx) == start)
		radio_end_window(sub, start, rx, min_rtt, out);
	radio_share(sub, min_rtt, a->mss, 0, f, out);
	/* The flow's first ACK since the link resumed after a pause. What it sent before the pause may
	 * have been dropped in it (a radio's buffer overflows when a pause outlasts it), and what the
	 * kernel still counts in flight may be more than its share: then nothing new goes out, no SACK
	 * shows the loss, and only the tail-loss probe ends the wait, two smoothed RTTs on, which the
	 * pause's own RTT sample has stretched (lab, drive-trace: nothing sent for 0.5 s after an
	 * outage of 1.2 s, while end-to-end CUBIC, whose window was above its flight, resumed at once).
	 * A few new packets go out at once instead: their SACKs show the loss (RACK). */
	if ((__s64)(prev_ack_us - sub->resumed_us) < 0 && out->cwnd <= a->packets_out)
		out->cwnd = a->packets_out + RADIO_RESUME_PROBE;
}

#endif /* PEP_RADIO_LAW_H */
