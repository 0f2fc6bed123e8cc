// SPDX-License-Identifier: GPL-2.0
/*
 * model: pep_radio's control law (radio_law.h, the very text the kernel
 * runs) driving a simulated radio link, in userspace. The tests use it to
 * check the law's arithmetic and behaviour on links made to order; it is
 * also how the law is tuned before the lab measures it for real.
 *
 * The link is linkem's trace model (linkem/README.md, "Traces"): one
 * delivery opportunity of 1500 bytes per line of a mahimahi trace, frames
 * sharing them in arrival order, opportunities lost when nothing waits, a
 * drop-tail limit on the wait (limit_ms), and a fixed one-way delay. The
 * sender is a small TCP: one data packet per MSS, cumulative and selective
 * acknowledgements, loss found by a later packet's delivery (RACK) or by RTO, RTT
 * samples of retransmitted packets too (as TCP timestamps give them), and
 * pacing; the receiver acknowledges every second packet (at once when out of
 * order, else within 40 ms). Beside one bulk download, a 1 KB request on a
 * new connection every 200 ms measures the delay a subscriber feels: SYN,
 * SYN-ACK, request, response, each through the same queues. A page (--page)
 * is bench responsiveness's: 30 objects over 6 keep-alive connections.
 * --sender cubic replaces the law by end-to-end CUBIC (loss-based, no
 * pacing, the end host's initial window of 10): the baseline the issue's
 * bars are relative to, run on the same link. --sender oracle is a yardstick
 * no real sender can match: the subscriber's window is set, on every ACK,
 * from the link's true capacity (every delivery opportunity of the trace,
 * used or not) over the 100 ms that ended one round trip ago (the least lag a
 * sender at the PEP has: an ACK's news takes the uplink, its answer the
 * downlink), times the path's RTT plus the target; the flows share it as
 * pep_radio's flows do, with no drains. How far the law is from it says how
 * much a better estimate of capacity could still give on a trace.
 *
 *   model [options] DOWN_TRACE UP_TRACE
 *     --seconds S    (20)      --delay MS   one-way (25)
 *     --limit MS     (500)     --target MS  pep_radio's target (RADIO_TARGET_US)
 *     --idle         requests only, no download: the floor
 *     --flows N      bulk downloads of one subscriber at once (1)
 *     --join S       the second and later downloads start S seconds in, into the
 *                    queue the first one holds
 *     --bulk-at S    the first download starts S seconds in, after the requests began
 *                    (its handshake done then): it may begin beside their answers in flight
 *     --leave S      the first download ends S seconds in (sends nothing new, and
 *                    closes once all it sent is acknowledged)
 *     --offset S     start the traces S seconds in (they loop)
 *     --loss P       lose P% of the downlink's frames at random (after the queue)
 *     --jitter MS    add a uniform +-MS to every frame's delay, both ways, frames
 *                    kept in order (linkem's jitter= without reorder=1)
 *     --no-timestamps  the client sends no TCP timestamps (the law falls back on RTTs)
 *     --ts-wrap S    the client's timestamps (32 bits of ms) wrap S seconds in
 *     --delay-step S:MS  the one-way delay becomes MS (longer) S seconds in: a new route
 *     --ts-hz HZ     the client's timestamps tick HZ times a second (default 1000, as
 *                    Linux since 4.13; older kernels tick at HZ: 100, 250, 300)
 *     --series       print a line per 100 ms: time, queue delay, window, rate, and what
 *                    the first download has delivered so far
 *     --requests     print a line per request on stderr: when it began, how long it took
 *     --unused       print a line per second on stderr: the downlink's bytes offered in it,
 *                    and those that went unused (nothing waited when they came); then a
 *                    line of all it offered, and carried (offered = unused + carried)
 *     --page S       a page load S seconds in (bench responsiveness: 3)
 *     --sender cubic end-to-end CUBIC instead of pep_radio
 *     --sender oracle  the law's window from the link's true capacity one RTT ago
 *     --sender law+rises, law+falls  the law, its flows' shares from the oracle's window
 *                    where that is larger (or smaller): what knowing rises (or falls) is worth
 * Prints one JSON object: goodput (Mbit/s, and per bulk flow), what the trace
 * offered over the same time, request percentiles (ms), the link queue's
 * delay percentiles, outages the law saw, its control windows, its mean
 * rate estimate (Mbit/s), and the queue its window held at the end
 * (window_queue_ms: the target, or more on a long path; radio_window_queue).
 */
#include <errno.h>
#include <math.h>
#include <linux/types.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "radio.h"
#include "radio_law.h"

#define MSS 1448
#define DATA_FRAME 1514
#define ACK_FRAME 66
#define OPP_BYTES 1500
#define MAX_FLOWS 16384                /* connections in a run: a request's every 200 ms, 54 min */
#define MAX_PKTS (1 << 20)
#define MAX_BULK 8
#define PAGE_CONNS 6
#define PAGE_OBJECTS 30
#define CUBIC_C 0.4
#define CUBIC_BETA 0.7

/* -- the link ---------------------------------------------------------------------------------- */
struct link {
	__u32 *opp;          /* opportunity times, ms */
	size_t n;
	__u64 period_us;     /* the trace loops */
	size_t idx;          /* next opportunity (looped: idx / n periods) */
	__u32 used;          /* bytes of opportunity idx already taken */
	__u64 delay_us, limit_us;
	__u64 step_at_us, step_delay_us;   /* --delay-step: from then on, this delay (0: none) */
	__u64 drops;
	__u32 loss_ppm;      /* random loss, after the queue (the radio's own errors) */
	__u64 rng;
	__u64 jitter_us;     /* +- on every frame's delay; frames stay in order */
	__u64 last_at;
	__u64 *unused;       /* --unused: bytes of opportunity that found nothing waiting, per second */
	size_t unused_from;  /* ... counted for the opportunities before this one */
	__u64 unused_end;    /* ... up to the run's end */
	__u64 carried;       /* ... and the bytes of frames that opportunities before the end carried */
};

static __u64 opp_time(const struct link *l, size_t i)
{
	return (i / l->n) * l->period_us + (__u64)l->opp[i % l->n] * 1000;
}

/* --unused: opportunity idx passed with `left` of its bytes taken by nothing. A frame the limit
 * drops passes the same opportunities again: each counts once. */
static void count_unused(struct link *l, size_t idx, __u32 left)
{
	__u64 t = opp_time(l, idx);

	if (!l->unused || idx < l->unused_from || t >= l->unused_end)
		return;
	l->unused[t / 1000000] += left;
	l->unused_from = idx + 1;
}

/* The link's one-way delay for a frame delivered at t: --delay-step's once it has come. */
static __u64 link_delay(const struct link *l, __u64 t)
{
	return l->step_delay_us && t >= l->step_at_us ? l->step_delay_us : l->delay_us;
}

/* Start the trace `ms` into it (the rest comes after, as the trace loops). */
static void rotate(struct link *l, __u32 ms)
{
	__u32 *r = malloc(l->n * sizeof(*r));
	__u32 period = l->opp[l->n - 1];
	size_t first = 0, i;

	ms %= period;
	while (first < l->n && l->opp[first] < ms)
		first++;
	for (i = 0; i < l->n; i++) {
		size_t j = (first + i) % l->n;

		r[i] = j >= first ? l->opp[j] - ms : l->opp[j] + period - ms;
	}
	r[l->n - 1] = period;   /* keep the period: the last line says it */
	free(l->opp);
	l->opp = r;
}

static void load_trace(struct link *l, const char *path)
{
	FILE *f = fopen(path, "r");
	size_t cap = 1024;
	unsigned v;

	if (!f) {
		fprintf(stderr, "model: %s: %s\n", path, strerror(errno));
		exit(2);
	}
	l->opp = malloc(cap * sizeof(*l->opp));
	while (fscanf(f, "%u", &v) == 1) {
		if (l->n == cap)
			l->opp = realloc(l->opp, (cap *= 2) * sizeof(*l->opp));
		l->opp[l->n++] = v;
	}
	fclose(f);
	if (!l->n || !l->opp[l->n - 1]) {
		fprintf(stderr, "model: %s: not a mahimahi trace (no opportunities)\n", path);
		exit(2);
	}
	l->period_us = (__u64)l->opp[l->n - 1] * 1000;
}

/* A frame of `bytes` arrives at `now`: when does it leave the far end
 * (0: dropped)? linkem's rule: opportunities carry bytes in arrival order. */
static __u64 link_send(struct link *l, __u64 now, __u32 bytes)
{
	size_t idx = l->idx;
	__u32 used = l->used;
	__u32 left = bytes;
	__u64 carried = 0;                 /* --unused: of its bytes, those in opportunities before the end */

	while (opp_time(l, idx) < now) {   /* passed with nothing waiting: lost */
		count_unused(l, idx, OPP_BYTES - used);
		idx++;
		used = 0;
	}
	for (;;) {
		__u32 room = OPP_BYTES - used;

		carried += opp_time(l, idx) < l->unused_end ? (left < room ? left : room) : 0;
		if (left <= room) {
			used += left;
			break;
		}
		left -= room;
		idx++;
		used = 0;
	}
	if (opp_time(l, idx) - now > l->limit_us) {
		l->drops++;
		return 0;
	}
	l->carried += carried;
	l->idx = idx;
	l->used = used;
	if (l->loss_ppm) {
		l->rng = l->rng * 6364136223846793005ULL + 1442695040888963407ULL;   /* seeded: runs repeat */
		if ((l->rng >> 33) % 1000000 < l->loss_ppm)
			return 0;
	}
	if (l->jitter_us) {
		__u64 at = opp_time(l, idx) + link_delay(l, opp_time(l, idx)) - l->jitter_us;

		l->rng = l->rng * 6364136223846793005ULL + 1442695040888963407ULL;
		at += (l->rng >> 33) % (2 * l->jitter_us + 1);
		l->last_at = at > l->last_at ? at : l->last_at;   /* as linkem does without reorder=1 */
		return l->last_at;
	}
	return opp_time(l, idx) + link_delay(l, opp_time(l, idx));
}

/* The wait a frame arriving now would have before its opportunity. */
static __u64 link_wait(struct link *l, __u64 now)
{
	size_t idx = l->idx;

	if (opp_time(l, idx) < now || (opp_time(l, idx) >= now && l->used == 0)) {
		while (opp_time(l, idx) < now)
			idx++;
		return opp_time(l, idx) - now;
	}
	return opp_time(l, idx) - now;
}

/* -- events ------------------------------------------------------------------------------------ */
enum ev_type {
	EV_DATA_AT_CLIENT,   /* a data packet arrives at the client: flow, seq */
	EV_ACK_AT_PEP,       /* an ACK arrives at the PEP: flow, cum, sacked seq */
	EV_SEND,             /* the flow may send (pacing) */
	EV_RTO,              /* the flow's retransmission timer: aux = its generation */
	EV_DELACK,           /* the client's delayed-ACK timer: aux = generation */
	EV_PROBE_START,      /* a request starts: client sends its SYN */
	EV_SYN_AT_PEP,
	EV_SYNACK_AT_CLIENT,
	EV_REQ_AT_PEP,
	EV_HANDSHAKE_RETRY,  /* a lost SYN, SYN-ACK or request: the client tries again after 1 s */
	EV_SAMPLE,
	EV_PAGE_START,       /* the page's connections start their handshakes */
	EV_BULK_START,       /* a later bulk download starts (--join): flow */
	EV_BULK_LEAVE,       /* the first download ends (--leave) */
	EV_PAGE_REQ_AT_PEP,  /* a page connection's next request reaches the PEP: aux = its object */
};

struct event {
	__u64 t;
	__u64 order;                       /* events of one time pop in the order they were pushed */
	__u32 type, flow;
	__u64 a, b, c;
};

static struct event *heap;
static size_t heap_n, heap_cap;
static __u64 pushed;

/* Whether x pops before y. A trace gives several opportunities the same millisecond, and many ACKs
 * share one: without the push order as a tie-break the heap would reorder them, which a link
 * (and linkem) never does. */
static int before(const struct event *x, const struct event *y)
{
	return x->t < y->t || (x->t == y->t && x->order < y->order);
}

static void push3(__u64 t, __u32 type, __u32 flow, __u64 a, __u64 b, __u64 c)
{
	size_t i;

	if (heap_n == heap_cap)
		heap = realloc(heap, (heap_cap = heap_cap ? 2 * heap_cap : 4096) * sizeof(*heap));
	struct event e = {t, pushed++, type, flow, a, b, c};

	i = heap_n++;
	while (i && before(&e, &heap[(i - 1) / 2])) {
		heap[i] = heap[(i - 1) / 2];
		i = (i - 1) / 2;
	}
	heap[i] = e;
}

static void push(__u64 t, __u32 type, __u32 flow, __u64 a, __u64 b)
{
	push3(t, type, flow, a, b, 0);
}

static struct event pop(void)
{
	struct event top = heap[0], last = heap[--heap_n];
	size_t i = 0;

	for (;;) {
		size_t c = 2 * i + 1;

		if (c >= heap_n)
			break;
		if (c + 1 < heap_n && before(&heap[c + 1], &heap[c]))
			c++;
		if (!before(&heap[c], &last))
			break;
		heap[i] = heap[c];
		i = c;
	}
	heap[i] = last;
	return top;
}

/* -- the flows --------------------------------------------------------------------------------- */
enum pkt_state { PKT_OUT = 1, PKT_DELIVERED, PKT_LOST };

struct flow {
	int bulk, started, done;
	int left;                          /* a download that ended (--leave): full-size frames still */
	int page;                          /* a page connection (1..PAGE_CONNS); 0: not */
	__u64 begin;                       /* requests: when the client called connect() */
	__u64 total;                       /* packets to send (bulk: unbounded) */
	__u8 *state;                       /* per packet */
	__u64 *sent_at;
	__u8 *retx;
	__u64 nxt, una, out, lost_pending;
	__u64 rack_sent;                   /* send time of the latest packet known delivered */
	__u32 cwnd;
	__u64 pacing, next_send;
	int pending;                       /* a page connection: its next request is on its way */
	int send_scheduled;
	__u32 srtt, rttvar, rto_gen, rto_backoff;
	__u32 rto_max_ms;                  /* pep_radio's cap on the timer (radio_rto_max_ms), from its start */
	__u64 last_progress;
	struct radio_flow rf;
	/* --sender cubic */
	double cw, wmax, k_s, ssthresh;
	__u64 epoch_us, recover;
	/* client side */
	__u8 *got;
	__u64 cum, unacked, delack_gen;
	__u64 echo;                        /* the send time of the packet an ACK answers: TCP timestamps */
	__u32 ts_offset;                   /* the client's random timestamp offset for this connection */
	__u64 delivered_bytes;
};

static struct flow flows[MAX_FLOWS];
static size_t nflows;
static struct link down, up;
static struct radio_sub sub;
static int have_sub;
static __u32 target_us = RADIO_TARGET_US;
static __u64 outages, windows;
static double req_ms[100000];
static __u64 end_us;                   /* the download is cut here, as curl -m does */
static size_t nreq;

static int timestamps = 1;             /* the client sends TCP timestamps (--no-timestamps: not) */
static double ts_wrap_s = -1;          /* --ts-wrap S: the client's timestamps wrap S s in */
static double ts_hz = 1000;            /* --ts-hz HZ: the client's timestamp clock (RFC 7323: 1 Hz to 1 kHz) */
static int sender_cubic;               /* --sender cubic */
static int print_requests;             /* --requests */
static int print_unused;               /* --unused */
static int sender_oracle;              /* --sender oracle, law+rises, law+falls: ORACLE_* */
#define ORACLE_ALL 1                   /* the window from the link's true capacity, always */
#define ORACLE_RISES 2                 /* the law's window, or the oracle's where that is larger */
#define ORACLE_FALLS 3                 /* the law's window, or the oracle's where that is smaller */
static __u64 path_rtt_us;              /* the path's round trip with no queue: both delays */
static __u32 page_pkts[PAGE_OBJECTS];  /* the page's objects in packets, in the order they are asked for */
static size_t page_next, page_left;
static __u64 page_start, page_end;

/* The client's TCP timestamp when it sends an ACK: its clock (ms, or --ts-hz) plus the connection's offset. */
static __u32 client_tsval(const struct flow *f, __u64 now)
{
	return timestamps ? (__u32)((__u64)((double)now * ts_hz / 1e6) + f->ts_offset) | 1 : 0;
}

static struct flow *new_flow(int bulk, __u64 total, int page)
{
	struct flow *f;

	if (nflows >= MAX_FLOWS) {      /* (a slot used again freed a flow whose events were still queued) */
		fprintf(stderr, "model: more than %d connections; make --seconds shorter\n", MAX_FLOWS);
		exit(2);
	}
	f = &flows[nflows++];
	size_t n = bulk || page ? MAX_PKTS : total + 1;

	free(f->state);
	free(f->sent_at);
	free(f->retx);
	free(f->got);
	memset(f, 0, sizeof(*f));
	f->bulk = bulk;
	f->total = bulk ? MAX_PKTS - 1 : total;
	f->state = calloc(n, 1);
	f->sent_at = calloc(n, sizeof(__u64));
	f->retx = calloc(n, 1);
	f->got = calloc(n, 1);
	f->page = page;
	f->cwnd = sender_cubic ? 10 : 32;  /* the end host's initial window; the access routes' initcwnd */
	f->cw = f->cwnd;
	f->ssthresh = 1e9;
	/* random-looking, a different one per connection; --ts-wrap: each one's clock wraps then */
	f->ts_offset = ts_wrap_s >= 0 ? (__u32)(0 - (__u32)(ts_wrap_s * ts_hz)) + (__u32)nflows
				      : (__u32)(nflows * 2654435761u);
	return f;
}

static __u32 rto_us(struct flow *f)
{
	__u64 r = f->srtt ? f->srtt + 4 * (__u64)f->rttvar : 1000000;

	if (r < 200000)
		r = 200000;
	r <<= f->rto_backoff;
	/* pep_radio's sockets back off to RADIO_RTO_MAX_MS for a silence's first retransmissions
	 * (radio.bpf.c, shorten_backoff); the model's CUBIC is the origin's, on the kernel's timers. */
	if (!sender_cubic && f->rto_backoff < RADIO_FAST_RETRIES && r > f->rto_max_ms * 1000ULL)
		return f->rto_max_ms * 1000;
	return r > 1000000 * 10 ? 10000000 : r;
}

static void arm_rto(struct flow *f, __u32 id, __u64 now)
{
	f->rto_gen++;
	push(now + rto_us(f), EV_RTO, id, f->rto_gen, 0);
}

/* The kernel's CA_EVENT_TX_START: the flow sends with nothing in flight (radio.bpf.c). What it has to
 * send is all of its object: the model's server writes it at once. */
static void flow_tx_start(struct flow *f, __u64 now)
{
	struct radio_out o;

	if (!radio_on_tx_start(&sub, &f->rf, now, (f->total - f->nxt) * MSS, f->srtt, MSS, &o))
		return;
	f->cwnd = o.cwnd;
	f->pacing = o.pacing;
	if (f->next_send < now)
		f->next_send = now;
}

static void try_send(struct flow *f, __u32 id, __u64 now)
{
	while (f->out < f->cwnd && !(f->bulk && now >= end_us)) {
		__u64 seq;
		__u64 at;

		if (f->pacing && f->next_send > now) {
			if (!f->send_scheduled) {
				f->send_scheduled = 1;
				push(f->next_send, EV_SEND, id, 0, 0);
			}
			return;
		}
		if (!f->out && !f->lost_pending && f->nxt < f->total && !sender_cubic)
			flow_tx_start(f, now);
		if (f->lost_pending) {
			for (seq = f->una; seq < f->nxt && f->state[seq] != PKT_LOST; seq++)
				;
			if (seq == f->nxt) {
				f->lost_pending = 0;
				continue;
			}
			f->lost_pending--;
			f->retx[seq] = 1;
		} else if (f->nxt < f->total) {
			seq = f->nxt++;
		} else {
			return;
		}
		f->state[seq] = PKT_OUT;
		f->sent_at[seq] = now;
		f->out++;
		at = link_send(&down, now, f->bulk || f->left ? DATA_FRAME : 1100 + 66);
		if (at)
			push(at, EV_DATA_AT_CLIENT, id, seq, now);
		if (f->out == 1)
			arm_rto(f, id, now);
		if (f->pacing)
			f->next_send = (f->next_send > now ? f->next_send : now) +
				       (__u64)DATA_FRAME * 1000000 / f->pacing;
	}
}

/* What the law said happened, counted (as radio.bpf.c counts it per graph). */
static void count(const struct radio_out *o)
{
	if (o->window_ended)
		windows++;
	if (o->outage_us)
		outages++;
}

/* Delivery opportunities of the link before time `t`, counted on from *seen (the events come in
 * time order, so each cursor only moves on). */
static __u64 opportunities_before(const struct link *l, size_t *seen, __u64 t)
{
	while (opp_time(l, *seen) < t)
		(*seen)++;
	return *seen;
}

/* The oracle's window: from the downlink's true capacity over the ORACLE_AVG_US that ended one round
 * trip ago, times the path's RTT plus the target (0: no such time yet). *rate is that capacity. */
#define ORACLE_AVG_US 100000ULL
static __u64 oracle_window(__u64 now, __u64 *rate)
{
	static size_t seen_from, seen_to;
	__u64 to = now > path_rtt_us ? now - path_rtt_us : 0;
	__u64 from = to > ORACLE_AVG_US ? to - ORACLE_AVG_US : 0;
	__u64 window;

	if (to <= from)
		return 0;
	*rate = (opportunities_before(&down, &seen_to, to) - opportunities_before(&down, &seen_from, from)) *
		OPP_BYTES * 1000000 / (to - from);
	window = *rate * (path_rtt_us + radio_window_queue(target_us, (__u32)path_rtt_us)) / 1000000;
	return window < RADIO_WINDOW_MIN_BYTES ? RADIO_WINDOW_MIN_BYTES : window;
}

/* --sender oracle: the subscriber's window and rate are the oracle's, and the flow's share of it is
 * as the law shares. --sender law+rises and law+falls: the law runs as it does, and only the flow's
 * share is taken from the oracle's window where that is larger (the link rose: what knowing a rise at
 * once would give) or smaller (it fell); the law's startup and drains stand. They split the oracle's
 * lead over the law into what its knowledge of rises and of falls is worth. */
static void oracle_share(struct flow *f, __u64 now, struct radio_out *o)
{
	__u64 rate = 0, window = oracle_window(now, &rate);

	if (!window)
		return;
	if (sender_oracle == ORACLE_ALL) {
		sub.rate = rate;
		sub.window = window;
		sub.draining = 0;
		radio_share(&sub, (__u32)path_rtt_us, MSS, 0, &f->rf, o);
	} else if (!sub.startup && !sub.draining &&
		   (sender_oracle == ORACLE_RISES ? window > sub.window : window < sub.window)) {
		struct radio_sub told = sub;   /* the law's own state stays as it is */

		told.window = window;
		radio_share(&told, (__u32)path_rtt_us, MSS, 0, &f->rf, o);
	}
}

/* --sender NAME: its ORACLE_* mode, 0 for a name that is none of them. */
static int oracle_mode(const char *name)
{
	return !strcmp(name, "oracle") ? ORACLE_ALL : !strcmp(name, "law+rises") ? ORACLE_RISES :
	       !strcmp(name, "law+falls") ? ORACLE_FALLS : 0;
}

static void apply(struct flow *f, __u64 now, struct radio_out *o)
{
	if (sender_oracle)
		oracle_share(f, now, o);
	f->cwnd = o->cwnd;
	f->pacing = o->pacing;
}

static void flow_start(struct flow *f, __u32 id, __u64 now, __u32 handshake_rtt)
{
	struct radio_out o;

	f->started = 1;
	f->srtt = handshake_rtt;
	f->rttvar = handshake_rtt / 2;
	f->rto_max_ms = radio_rto_max_ms(handshake_rtt);
	f->last_progress = now;
	if (sender_cubic) {
		try_send(f, id, now);
		return;
	}
	if (!have_sub || !radio_sub_fresh(&sub, now)) {
		struct radio_sub fresh;

		radio_sub_init(&fresh, have_sub ? &sub : NULL, now, handshake_rtt, f->cwnd, MSS, target_us);
		sub = fresh;
		have_sub = 1;
	}
	radio_start(&sub, &f->rf, now, handshake_rtt, MSS, target_us, &o);
	apply(f, now, &o);
	f->last_progress = now;
	try_send(f, id, now);
}

/* --sender cubic: a loss ends the round's growth, once per round trip (RFC 9438's multiplicative
 * decrease; no HyStart, no fast convergence). */
static void cubic_loss(struct flow *f, __u64 now, int timeout)
{
	if (!timeout && f->una < f->recover)
		return;
	f->recover = f->nxt;
	f->wmax = f->cw;
	f->cw = f->cw * CUBIC_BETA < 2 ? 2 : f->cw * CUBIC_BETA;
	f->ssthresh = f->cw;
	if (timeout)
		f->cw = 1;
	f->epoch_us = now;
	f->k_s = cbrt(f->wmax * (1 - CUBIC_BETA) / CUBIC_C);
	f->cwnd = (__u32)f->cw;
}

/* --sender cubic: slow start, then the cubic curve toward and past the window of the last loss,
 * and never below what Reno would reach (the TCP-friendly region). */
static void cubic_ack(struct flow *f, __u64 now, __u64 newly)
{
	double t, target, reno;

	if (!newly)
		return;
	if (f->cw < f->ssthresh) {
		f->cw += newly;
	} else {
		t = (now - f->epoch_us) / 1e6;
		target = f->wmax + CUBIC_C * pow(t - f->k_s, 3);
		reno = f->wmax * CUBIC_BETA + 3 * (1 - CUBIC_BETA) / (1 + CUBIC_BETA) * t / (f->srtt ? f->srtt / 1e6 : 0.1);
		if (target < reno)
			target = reno;
		f->cw += (target > f->cw ? target - f->cw : 0.01) * newly / f->cw;
	}
	f->cwnd = (__u32)f->cw;
}

static void on_ack(struct flow *f, __u32 id, __u64 now, __u64 cum, __u64 sacked, __u64 echo, __u32 tsval)
{
	int lost = 0;
	__u64 newly = 0, seq, rtt = 0, newest_sent = 0;
	__u32 prior = (__u32)f->out;
	struct radio_ack a;
	struct radio_out o;

	if (f->done)
		return;
	for (seq = f->una; seq < cum && seq < f->nxt; seq++) {
		if (f->state[seq] != PKT_DELIVERED) {
			if (f->state[seq] == PKT_OUT)
				f->out--;
			f->state[seq] = PKT_DELIVERED;
			newly++;
		}
	}
	if (cum > f->una)
		f->una = cum;
	if (sacked >= f->una && sacked < f->nxt && f->state[sacked] != PKT_DELIVERED) {
		if (f->state[sacked] == PKT_OUT)
			f->out--;
		f->state[sacked] = PKT_DELIVERED;
		newly++;
	}
	newest_sent = echo;
	if (newly && newest_sent) {
		rtt = now - newest_sent;
		if (!f->srtt) {
			f->srtt = rtt;
			f->rttvar = rtt / 2;
		} else {
			__u64 d = rtt > f->srtt ? rtt - f->srtt : f->srtt - rtt;

			f->rttvar = (3 * f->rttvar + d) / 4;
			f->srtt = (7 * (__u64)f->srtt + rtt) / 8;
		}
	}
	/* Lost (RACK): a packet sent after it, by more than a reordering window,
	 * was delivered. */
	if (newly && echo > f->rack_sent)
		f->rack_sent = echo;
	for (seq = f->una; seq < f->nxt; seq++) {
		if (f->state[seq] == PKT_OUT && f->sent_at[seq] + 1000 < f->rack_sent) {
			f->state[seq] = PKT_LOST;
			f->out--;
			f->lost_pending++;
			lost++;
		}
	}
	if (newly) {
		f->rto_backoff = 0;
		f->last_progress = now;
		if (f->out)
			arm_rto(f, id, now);
	}
	if (sender_cubic) {
		if (!f->bulk && f->una >= f->total && !f->pending) {
			f->done = 1;
			return;
		}
		if (lost)
			cubic_loss(f, now, 0);
		cubic_ack(f, now, newly);
		try_send(f, id, now);
		return;
	}
	/* As the kernel does, the last ACK of a short flow goes through the law too (its RTT sample and
	 * queue sample count) before the flow ends. */
	a = (struct radio_ack){.now_us = now, .acked_bytes = newly * MSS, .lost_bytes = (__u64)lost * MSS,
			       .rtt_us = rtt, .srtt_us = f->srtt,
			       .packets_out = f->out, .prior_in_flight = prior, .cwnd = f->cwnd, .mss = MSS,
			       .tsval = tsval, .app_limited = !f->bulk && f->nxt >= f->total};
	radio_on_ack(&sub, &f->rf, &a, &o);
	count(&o);
	if (!f->bulk && f->una >= f->total && !f->pending) {
		f->done = 1;
		radio_stop(&sub, &f->rf, MSS);
		return;
	}
	apply(f, now, &o);
	try_send(f, id, now);
}

static void on_rto(struct flow *f, __u32 id, __u64 now)
{
	__u64 seq;

	if (!f->out || f->done)
		return;
	for (seq = f->una; seq < f->nxt; seq++) {
		if (f->state[seq] == PKT_OUT) {
			f->state[seq] = PKT_LOST;
			f->out--;
			f->lost_pending++;
		}
	}
	f->cwnd = 1;                       /* tcp_enter_loss; the law restores it on the next ACK */
	if (sender_cubic)
		cubic_loss(f, now, 1);
	else if (f->rf.has_sub)
		radio_on_rto(&sub, now);
	f->rto_backoff++;
	f->next_send = now;
	try_send(f, id, now);
	arm_rto(f, id, now);
}

/* A page connection's object has arrived: the page is done with its last object; else the
 * connection asks for the next one not yet asked for (keep-alive: one uplink trip, no handshake). */
static void page_object_done(struct flow *f, __u32 id, __u64 now)
{
	__u64 at;

	if (--page_left == 0)
		page_end = now;
	if (page_next == PAGE_OBJECTS)
		return;
	f->pending = 1;
	at = link_send(&up, now, 140);
	push(at ? at : now + 1000000, EV_PAGE_REQ_AT_PEP, id, page_next++, 0);
}

/* The client receives a data packet. */
static void client_data(struct flow *f, __u32 id, __u64 now, __u64 seq, __u64 sent)
{
	__u64 cum_before = f->cum, at;
	int in_order;

	f->echo = sent;
	if (!f->got[seq]) {
		f->got[seq] = 1;
		if (now < end_us)
			f->delivered_bytes += MSS;
	}
	while (f->got[f->cum])
		f->cum++;
	/* In order, and not filling a hole: the ACK may wait for a second packet. */
	in_order = seq == cum_before && f->cum == cum_before + 1;
	if (!f->bulk && f->cum >= f->total && f->begin) {
		if (f->page)
			page_object_done(f, id, now);
		else if (nreq < sizeof(req_ms) / sizeof(req_ms[0]))
			req_ms[nreq++] = (now - f->begin) / 1000.0;
		if (print_requests && !f->page)
			fprintf(stderr, "request at %.2f s: %.0f ms\n", f->begin / 1e6, (now - f->begin) / 1000.0);
		f->begin = 0;
	}
	f->unacked++;
	if (in_order && f->unacked < 2) {
		push(now + 40000, EV_DELACK, id, ++f->delack_gen, 0);
		return;
	}
	f->unacked = 0;
	f->delack_gen++;
	at = link_send(&up, now, ACK_FRAME);
	if (at)
		push3(at, EV_ACK_AT_PEP, id, f->cum, seq, f->echo | (__u64)client_tsval(f, now) << 32);
}

/* One packet of a request's handshake (SYN, SYN-ACK, the request itself) over a link; lost, the
 * client tries again after 1 s, as its SYN timer would. `since` rides along: when the SYN left. */
static void handshake(struct link *l, __u64 now, __u32 bytes, enum ev_type next, __u32 flow, __u64 since)
{
	__u64 at = link_send(l, now, bytes);

	if (at)
		push(at, next, flow, since, 0);
	else
		push(now + 1000000, EV_HANDSHAKE_RETRY, flow, 0, 0);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double pct(double *xs, size_t n, double p)
{
	size_t i;

	if (!n)
		return -1;
	i = (size_t)(p / 100 * (n - 1) + 0.5);
	return xs[i < n ? i : n - 1];
}

int main(int argc, char **argv)
{
	double step_s = 0, step_ms = 0;
	double seconds = 20, delay_ms = 25, limit_ms = 500, offset_s = 0, loss_pct = 0, jitter_ms = 0;
	int idle = 0, series = 0, nbulk = 1, i;
	double page_s = -1, join_s = 0, leave_s = 0, bulk_at_s = 0;
	const char *paths[2] = {0};
	int npaths = 0;
	struct flow *bulk[MAX_BULK];
	double *qwait = NULL;
	size_t nq = 0, qcap = 0;
	__u64 end, offered = 0, *offered_by_s = NULL;   /* (per second: --unused) */
	double rate_sum = 0;
	size_t rate_n = 0;
	size_t k;

	for (i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
			seconds = atof(argv[++i]);
		else if (!strcmp(argv[i], "--delay") && i + 1 < argc)
			delay_ms = atof(argv[++i]);
		else if (!strcmp(argv[i], "--limit") && i + 1 < argc)
			limit_ms = atof(argv[++i]);
		else if (!strcmp(argv[i], "--target") && i + 1 < argc)
			target_us = (__u32)(atof(argv[++i]) * 1000);
		else if (!strcmp(argv[i], "--loss") && i + 1 < argc)
			loss_pct = atof(argv[++i]);
		else if (!strcmp(argv[i], "--jitter") && i + 1 < argc)
			jitter_ms = atof(argv[++i]);
		else if (!strcmp(argv[i], "--offset") && i + 1 < argc)
			offset_s = atof(argv[++i]);
		else if (!strcmp(argv[i], "--flows") && i + 1 < argc)
			nbulk = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--idle"))
			idle = 1;
		else if (!strcmp(argv[i], "--series"))
			series = 1;
		else if (!strcmp(argv[i], "--no-timestamps"))
			timestamps = 0;
		else if (!strcmp(argv[i], "--ts-wrap") && i + 1 < argc)
			ts_wrap_s = atof(argv[++i]);
		else if (!strcmp(argv[i], "--ts-hz") && i + 1 < argc)
			ts_hz = atof(argv[++i]);
		else if (!strcmp(argv[i], "--delay-step") && i + 1 < argc && sscanf(argv[++i], "%lf:%lf", &step_s, &step_ms) == 2)
			;
		else if (!strcmp(argv[i], "--leave") && i + 1 < argc)
			leave_s = atof(argv[++i]);
		else if (!strcmp(argv[i], "--join") && i + 1 < argc)
			join_s = atof(argv[++i]);
		else if (!strcmp(argv[i], "--bulk-at") && i + 1 < argc)
			bulk_at_s = atof(argv[++i]);
		else if (!strcmp(argv[i], "--requests"))
			print_requests = 1;
		else if (!strcmp(argv[i], "--unused"))
			print_unused = 1;
		else if (!strcmp(argv[i], "--page") && i + 1 < argc)
			page_s = atof(argv[++i]);
		else if (!strcmp(argv[i], "--sender") && i + 1 < argc && !strcmp(argv[i + 1], "cubic") && ++i)
			sender_cubic = 1;
		else if (!strcmp(argv[i], "--sender") && i + 1 < argc && oracle_mode(argv[i + 1]) && ++i)
			sender_oracle = oracle_mode(argv[i]);
		else if (argv[i][0] != '-' && npaths < 2)
			paths[npaths++] = argv[i];
		else {
			fprintf(stderr, "model: bad argument %s; see the comment at the top of model.c\n", argv[i]);
			return 2;
		}
	}
	if (npaths != 2 || nbulk < 1 || nbulk > MAX_BULK) {
		fprintf(stderr, "usage: model [--seconds S] [--delay MS] [--limit MS] [--target MS] [--flows N] "
			"[--offset S] [--loss P] [--jitter MS] [--no-timestamps] [--ts-wrap S] [--ts-hz HZ] [--delay-step S:MS] [--idle] [--series] [--requests] [--unused] [--page S] [--join S] [--bulk-at S] [--leave S] [--sender cubic|oracle|law+rises|law+falls] "
			"DOWN_TRACE UP_TRACE\n");
		return 2;
	}
	if (ts_hz <= 0) {
		fprintf(stderr, "model: --ts-hz %g: a clock ticks a positive number of times a second\n", ts_hz);
		return 2;
	}
	if (jitter_ms > delay_ms) {
		fprintf(stderr, "model: --jitter %g is more than --delay %g: a frame would arrive before it left\n",
			jitter_ms, delay_ms);
		return 2;
	}
	load_trace(&down, paths[0]);
	load_trace(&up, paths[1]);
	if (offset_s > 0) {
		rotate(&down, (__u32)(offset_s * 1000));
		rotate(&up, (__u32)(offset_s * 1000));
	}
	down.delay_us = up.delay_us = (__u64)(delay_ms * 1000);
	if (step_ms) {         /* (longer only: a shorter delay would deliver frames out of order) */
		if (step_ms < delay_ms || step_s <= 0) {
			fprintf(stderr, "model: --delay-step %g:%g: the path may only grow longer, after 0 s\n", step_s, step_ms);
			return 2;
		}
		down.step_at_us = up.step_at_us = (__u64)(step_s * 1e6);
		down.step_delay_us = up.step_delay_us = (__u64)(step_ms * 1000);
	}
	path_rtt_us = 2 * down.delay_us;
	down.limit_us = up.limit_us = (__u64)(limit_ms * 1000);
	down.loss_ppm = (__u32)(loss_pct * 10000);
	down.rng = 1;
	up.rng = 2;                        /* the uplink's jitter draws its own numbers */
	down.jitter_us = up.jitter_us = (__u64)(jitter_ms * 1000);
	end = end_us = (__u64)(seconds * 1e6);
	if (print_unused) {
		down.unused = calloc((size_t)seconds + 1, sizeof(*down.unused));
		down.unused_end = end;
		offered_by_s = calloc((size_t)seconds + 1, sizeof(*offered_by_s));
	}

	for (i = 0; !idle && i < nbulk; i++) {
		bulk[i] = new_flow(1, 0, 0);
		/* The download's handshake happened before the measurement starts (a joining one's, just
		 * before it joins). */
		if (i && join_s > 0)
			push((__u64)(join_s * 1e6), EV_BULK_START, (__u32)(nflows - 1), 0, 0);
		else if (!i && bulk_at_s > 0)
			push((__u64)(bulk_at_s * 1e6), EV_BULK_START, (__u32)(nflows - 1), 0, 0);
		else
			flow_start(bulk[i], (__u32)(nflows - 1), 0, (__u32)(2 * delay_ms * 1000));
	}
	for (__u64 t = 0; t + 1000000 <= end; t += 200000)
		push(t, EV_PROBE_START, 0, 0, 0);
	if (leave_s > 0 && !idle)
		push((__u64)(leave_s * 1e6), EV_BULK_LEAVE, 0, 0, 0);
	for (__u64 t = 0; t < end; t += 10000)
		push(t, EV_SAMPLE, 0, 0, 0);
	for (k = 0; k < PAGE_OBJECTS; k++)   /* 10 of 100 KB, then 20 of 1 KB */
		page_pkts[k] = k < 10 ? (100 * 1024 + MSS - 1) / MSS : 1;
	if (page_s >= 0)
		push((__u64)(page_s * 1e6), EV_PAGE_START, 0, 0, 0);

	while (heap_n) {
		struct event e = pop();
		struct flow *f = &flows[e.flow];
		__u64 at;

		if (e.t > end + 10000000)
			break;
		switch (e.type) {
		case EV_DATA_AT_CLIENT:
			client_data(f, e.flow, e.t, e.a, e.b);
			break;
		case EV_DELACK:
			if (e.a == f->delack_gen && f->unacked) {
				f->unacked = 0;
				at = link_send(&up, e.t, ACK_FRAME);
				if (at)
					push3(at, EV_ACK_AT_PEP, e.flow, f->cum, f->cum ? f->cum - 1 : 0,
					      f->echo | (__u64)client_tsval(f, e.t) << 32);
			}
			break;
		case EV_ACK_AT_PEP:
			on_ack(f, e.flow, e.t, e.a, e.b, e.c & 0xffffffffULL, (__u32)(e.c >> 32));
			break;
		case EV_SEND:
			f->send_scheduled = 0;
			try_send(f, e.flow, e.t);
			break;
		case EV_RTO:
			if (e.a == f->rto_gen)
				on_rto(f, e.flow, e.t);
			break;
		case EV_PROBE_START:
			if (e.t >= end)
				break;
			f = new_flow(0, 1, 0);
			f->begin = e.t;
			e.flow = (__u32)(nflows - 1);
			/* fall through */
		case EV_HANDSHAKE_RETRY:
			handshake(&up, e.t, 74, EV_SYN_AT_PEP, e.flow, e.t);
			break;
		case EV_SYN_AT_PEP:
			handshake(&down, e.t, 74, EV_SYNACK_AT_CLIENT, e.flow, e.t);
			break;
		case EV_SYNACK_AT_CLIENT:
			handshake(&up, e.t, 140, EV_REQ_AT_PEP, e.flow, e.a);
			break;
		case EV_REQ_AT_PEP:
			if (!f->started)
				flow_start(f, e.flow, e.t, (__u32)(e.t - e.a));
			break;
		case EV_BULK_START:
			flow_start(f, e.flow, e.t, (__u32)(2 * delay_ms * 1000));
			break;
		case EV_BULK_LEAVE:
			/* A short flow from now on: it ends, and leaves the law, once all it sent is acknowledged. */
			bulk[0]->total = bulk[0]->nxt;
			bulk[0]->bulk = 0;
			bulk[0]->left = 1;
			break;
		case EV_PAGE_START:
			page_start = e.t;
			page_left = PAGE_OBJECTS;
			for (i = 0; i < PAGE_CONNS; i++) {
				f = new_flow(0, page_pkts[page_next++], i + 1);
				f->begin = e.t;
				handshake(&up, e.t, 74, EV_SYN_AT_PEP, (__u32)(nflows - 1), e.t);
			}
			break;
		case EV_PAGE_REQ_AT_PEP:
			f->total += page_pkts[e.a];
			f->pending = 0;
			f->begin = e.t;
			try_send(f, e.flow, e.t);
			break;
		case EV_SAMPLE:
			if (nq == qcap)
				qwait = realloc(qwait, (qcap = qcap ? 2 * qcap : 4096) * sizeof(*qwait));
			qwait[nq++] = link_wait(&down, e.t) / 1000.0;
			if (have_sub && !idle) {
				rate_sum += sub.rate;
				rate_n++;
			}
			if (series && e.t % 100000 == 0)
				printf("# %.1f s: wait %.0f ms, window %llu B, rate %.2f Mbit/s, qdelay %u ms, "
				       "bulk cwnd %u, out %llu, delivered %llu B\n", e.t / 1e6, qwait[nq - 1],
				       (unsigned long long)sub.window, sub.rate * 8 / 1e6, sub.qdelay_us / 1000,
				       idle ? 0 : bulk[0]->cwnd, idle ? 0ULL : (unsigned long long)bulk[0]->out,
				       idle ? 0ULL : (unsigned long long)bulk[0]->delivered_bytes);
			break;
		}
	}
	for (k = 0; k < down.n * 4 && opp_time(&down, k) < end; k++) {
		offered += OPP_BYTES;
		if (offered_by_s)
			offered_by_s[opp_time(&down, k) / 1000000] += OPP_BYTES;
	}
	if (print_unused) {
		/* What no frame came for after the last one sent: the rest of its opportunity, and all after. */
		count_unused(&down, down.idx, OPP_BYTES - down.used);
		for (k = down.idx + 1; opp_time(&down, k) < end; k++)
			count_unused(&down, k, OPP_BYTES);
		for (i = 0; (double)i < seconds; i++)
			fprintf(stderr, "second %d: offered %llu B, unused %llu B\n", i,
				(unsigned long long)offered_by_s[i], (unsigned long long)down.unused[i]);
		fprintf(stderr, "in all: offered %llu B, carried %llu B\n", (unsigned long long)offered,
			(unsigned long long)down.carried);
	}
	qsort(req_ms, nreq, sizeof(double), cmp_double);
	qsort(qwait, nq, sizeof(double), cmp_double);
	{
		double total = 0;

		printf("{\"seconds\": %g, \"target_ms\": %g, \"offered_mbps\": %.3f, \"bulk_mbps\": [", seconds,
		       target_us / 1000.0, offered * 8 / seconds / 1e6);
		for (i = 0; !idle && i < nbulk; i++) {
			total += bulk[i]->delivered_bytes;
			printf("%s%.3f", i ? ", " : "", bulk[i]->delivered_bytes * 8 / seconds / 1e6);
		}
		printf("], \"goodput_mbps\": %.3f, \"requests\": %zu, \"p50_ms\": %.0f, \"p95_ms\": %.0f, "
		       "\"p99_ms\": %.0f, \"wait_p50_ms\": %.0f, \"wait_p95_ms\": %.0f, \"outages\": %llu, "
		       "\"windows\": %llu, \"drops_down\": %llu, \"drops_up\": %llu, \"rate_estimate_mbps\": %.3f, "
		       "\"page_s\": %.3f, \"window_queue_ms\": %g}\n",
		       total * 8 / seconds / 1e6, nreq, pct(req_ms, nreq, 50), pct(req_ms, nreq, 95),
		       pct(req_ms, nreq, 99), pct(qwait, nq, 50), pct(qwait, nq, 95), (unsigned long long)outages,
		       (unsigned long long)windows, (unsigned long long)down.drops, (unsigned long long)up.drops,
		       rate_n ? rate_sum / rate_n * 8 / 1e6 : 0.0,
		       page_end ? (page_end - page_start) / 1e6 : -1.0, sub.window_queue_us / 1000.0);
	}
	return 0;
}
