/* SPDX-License-Identifier: GPL-2.0 */
/*
 * pep_radio's control law: pure integer arithmetic, no helpers and no maps,
 * so that the same text runs in the kernel (congestion/radio.bpf.c) and in
 * the userspace model the tests drive (congestion/model.c). Units: bytes,
 * bytes/s, microseconds. Include radio.h first.
 *
 * The idea, per subscriber (every flow of one subscriber crosses the same
 * radio queue, so they share one estimate):
 *   - Every control window (about one minimum RTT, at least 40 ms: radio links
 *     deliver in bursts, and a window must hold several), measure what the
 *     subscriber's flows had delivered (C, bytes/s) and the least RTT sample
 *     (base RTT + the standing queue: its excess over the minimum RTT is the
 *     queueing delay qd).
 *   - qd above the target: the link is saturated and C is its capacity; send
 *     below C by what drains the excess within a window.
 *     qd between half the target and the target: hold at C.
 *     qd below half the target: if the flows used their rate, the link may
 *     take more: raise it (x2 in startup, x1.25 after); if they did not, the
 *     limit was elsewhere: keep it.
 *     A rise is never more than that step, however many bytes one burst of
 *     ACKs brings (that is what inflates BBR's max filter on radio links).
 *   - The flows' windows together hold rate x (min RTT + target): the queue
 *     they can build is bounded by the target even before the next window
 *     notices a fall in capacity, and no more than that goes into a dead link.
 *   - Loss is not a signal: radio links lose frames that have nothing to do
 *     with the queue, and a 500 ms drop-tail buffer is never full at a 40 ms
 *     target. Only delay is.
 *   - An outage (no ACK for RADIO_OUTAGE_US with data in flight) is not
 *     congestion: the window that spans it is dropped, the rate kept, and the
 *     flows resume at it, paced.
 */
#ifndef PEP_RADIO_LAW_H
#define PEP_RADIO_LAW_H

#define RADIO_USEC 1000000ULL
#define RADIO_WINDOW_MIN_US 40000          /* a control window is at least this long */
#define RADIO_WINDOW_MIN_BYTES 6000ULL     /* four packets: never below */
#define RADIO_CWND_MIN 4                   /* packets */

/* The standing queue: the window's least RTT above the minimum RTT. */
static inline __u32 radio_qdelay(__u32 win_rtt_min_us, __u32 min_rtt_us)
{
	return win_rtt_min_us > min_rtt_us ? win_rtt_min_us - min_rtt_us : 0;
}

/* How long a control window lasts. */
static inline __u64 radio_window_us(__u32 min_rtt_us)
{
	return min_rtt_us > RADIO_WINDOW_MIN_US ? min_rtt_us : RADIO_WINDOW_MIN_US;
}

/* The rate a window of `elapsed_us` that delivered `delivered` bytes measured. */
static inline __u64 radio_delivery_rate(__u64 delivered, __u64 elapsed_us)
{
	return elapsed_us ? delivered * RADIO_USEC / elapsed_us : 0;
}

/* The subscriber's next window (bytes in flight for all its flows together)
 * and smoothed delivery rate, at the end of a control window.
 *   - Queue at or above half the target: the link is saturated, so what it
 *     delivered is its capacity. rate = the mean of the old rate and that;
 *     window = rate x (min RTT + target): a window above what is in flight
 *     now lets the queue fill to the target, one below it stops the flows
 *     until the queue has drained to the target. It is set from the capacity,
 *     not from the window before, so cuts never compound while the queue
 *     they act on is still draining.
 *   - Queue under half the target, and the flows filled their window: the
 *     link may take more; grow the window x1.5 (x1.25 once the queue is over
 *     a quarter of the target).
 *   - Otherwise (no flow used it, or a receiver held it back): keep both.
 * Returns the window; *rate is updated in place. */
static inline __u64 radio_next_window(__u64 window, __u64 *rate, __u64 measured, __u32 min_rtt_us,
				      __u32 qdelay_us, __u32 target_us, __u32 bulk)
{
	__u64 next = window;

	if (qdelay_us * 2 >= target_us) {
		/* A fall is taken at once (the queue is there to cover a measuring
		 * window that a delivery gap made look poor), a rise by halves. */
		*rate = measured < *rate ? measured : (*rate + measured) / 2;
		next = *rate * (min_rtt_us + target_us) / RADIO_USEC;
	} else if (bulk && measured * (min_rtt_us + qdelay_us) / RADIO_USEC * 4 >= window * 3) {
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

/* Whether the gap since the last ACK, while packets were in flight, was an
 * outage: the link stopped delivering, it did not merely slow down. */
static inline int radio_is_outage(__u64 gap_us, __u32 in_flight_before)
{
	return in_flight_before > 0 && gap_us >= RADIO_OUTAGE_US;
}

/* The minimum RTT over the last 5-10 s, in two buckets: a sample lowers the
 * current bucket; a bucket older than half the window becomes the previous
 * one. Returns the minimum of both. */
static inline __u32 radio_min_rtt(__u32 *cur, __u32 *prev, __u64 *stamp_us, __u64 now_us, __u32 sample_us)
{
	if (now_us - *stamp_us >= RADIO_MIN_RTT_WIN_US / 2) {
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

#endif /* PEP_RADIO_LAW_H */
