/* The per-direction datapath of linkem.
 *
 * Timeline of one frame, all in CLOCK_MONOTONIC nanoseconds:
 *   arrival t  -> loss models (Bernoulli, then Gilbert-Elliott): drop_loss
 *              -> rate queue: start = max(t, link_free); tail-drop (drop_queue)
 *                 if the wait (start - t) > limit_ms or queued bytes + frame >
 *                 limit_bytes; tx_done = start + 8 * bytes / rate; link_free = tx_done
 *              -> departure = tx_done + max(0, delay + jitter sample), and unless
 *                 reorder=1, departure = max(departure, previous departure)
 * With a trace instead of a rate (mahimahi's format), tx_done is the time of the
 * delivery opportunity that carries the frame's last byte: opportunities carry
 * TRACE_MTU bytes each, frames share them in arrival order, and an opportunity
 * the queue leaves unused is lost (the link does not save capacity). The wait
 * checked against limit_ms is then tx_done - t. limit_pkts bounds the queue in
 * frames. Without a rate or a trace, tx_done = t and nothing queues.
 *
 * Storage: frames are copied into a byte ring (the pool) in arrival order, each
 * as an entry header + virtio-net header + frame, 16-byte aligned. A min-heap
 * keyed by (departure, arrival seq) says what to send next, so reorder=1 and
 * live changes of it need no second code path. Ring positions:
 *   head  <= qhead <= tail
 *   head:  oldest entry not yet freed; entries are freed in arrival order once
 *          sent, so with reorder=1 a late frame holds the space behind it
 *          (bounded by jitter x rate)
 *   qhead: first entry whose serialization is not over (rate-queue gauge)
 * When the ring empties, positions restart at 0 so light traffic stays in a
 * few warm pages.
 */
#define _GNU_SOURCE
#include "path.h"

#include <errno.h>
#include <linux/if_packet.h>
#include <linux/virtio_net.h>
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define VNET_LEN sizeof(struct virtio_net_hdr)
#define ALIGN16(x) (((x) + 15) & ~(uint64_t)15)

enum { ENT_SENT = 1, ENT_WRAP = 2, ENT_QUEUED = 4 };

/* Only total and flags are read from a WRAP marker, so they sit in the first
 * 16 bytes: a marker needs 16 bytes, the smallest gap alignment leaves. */
struct entry {
	uint32_t total;		/* bytes this entry occupies in the ring */
	uint16_t flags;
	uint16_t pad;
	uint32_t len;		/* vnet header + frame */
	uint32_t pad2;
	uint64_t dep_ns;
	uint64_t txdone_ns;
	uint8_t data[];
};

#define ENT_HDR sizeof(struct entry)

/* Single writer: a plain read of our own counter, a relaxed store others can load. */
#define ST_ADD(p, f, v) __atomic_store_n(&(p)->st.f, (p)->st.f + (v), __ATOMIC_RELAXED)
#define ST_SET(p, f, v) __atomic_store_n(&(p)->st.f, (v), __ATOMIC_RELAXED)
#define ST_GET(p, f) __atomic_load_n(&(p)->st.f, __ATOMIC_RELAXED)

uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* xoshiro256** seeded by splitmix64: fast, and reproducible with --seed. */
static uint64_t splitmix64(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static inline uint64_t rotl(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

static uint64_t rng_next(uint64_t s[4])
{
	uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;

	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = rotl(s[3], 45);
	return r;
}

/* Uniform in [0, 1). */
static double rng_unit(uint64_t s[4])
{
	return (double)(rng_next(s) >> 11) * 0x1.0p-53;
}

static int chance_pct(uint64_t s[4], double pct)
{
	return pct > 0 && rng_unit(s) * 100.0 < pct;
}

static double jitter_sample_ms(struct path *p)
{
	const struct link_params *lp = &p->cur;
	double z;

	if (lp->jitter_ms <= 0)
		return 0;
	if (lp->jitter_dist == JITTER_UNIFORM)
		return (2 * rng_unit(p->rng) - 1) * lp->jitter_ms;
	/* Box-Muller; clipped so one sample cannot stall a non-reordering line. */
	z = sqrt(-2 * log(1 - rng_unit(p->rng))) * cos(2 * M_PI * rng_unit(p->rng));
	if (z > 3)
		z = 3;
	if (z < -3)
		z = -3;
	return z * lp->jitter_ms;
}

/* Gilbert-Elliott as netem's gemodel: move the state first, then lose with the
 * new state's probability. Mean loss = (r*good + p*bad) / (p + r). */
static int lost(struct path *p)
{
	const struct link_params *lp = &p->cur;

	if (chance_pct(p->rng, lp->loss_pct))
		return 1;
	if (lp->ge_p_pct <= 0)
		return 0;
	if (!p->ge_bad)
		p->ge_bad = chance_pct(p->rng, lp->ge_p_pct);
	else
		p->ge_bad = !chance_pct(p->rng, lp->ge_r_pct);
	return chance_pct(p->rng, p->ge_bad ? lp->ge_loss_bad_pct : lp->ge_loss_good_pct);
}

static inline struct entry *ent_at(struct pool_ring *r, uint64_t pos)
{
	return (struct entry *)(r->mem + (pos & (r->size - 1)));
}

/* Reserves `need` contiguous bytes at the tail; NULL when the pool is full. */
static struct entry *pool_alloc(struct pool_ring *r, uint32_t need)
{
	uint64_t off = r->tail & (r->size - 1), gap = r->size - off;
	uint64_t want = need > gap ? gap + need : need;
	struct entry *e;

	if (r->tail - r->head + want > r->size)
		return NULL;
	if (need > gap) {
		e = ent_at(r, r->tail);
		e->total = (uint32_t)gap;
		e->flags = ENT_WRAP;
		r->tail += gap;
	}
	e = ent_at(r, r->tail);
	e->total = need;
	r->tail += need;
	return e;
}

static int heap_less(const struct heap_item *a, const struct heap_item *b)
{
	if (a->dep_ns != b->dep_ns)
		return a->dep_ns < b->dep_ns;
	return (int32_t)(a->seq - b->seq) < 0;
}

static void heap_push(struct path *p, struct heap_item it)
{
	uint32_t i = p->heap_len++;

	while (i > 0) {
		uint32_t up = (i - 1) / 2;

		if (!heap_less(&it, &p->heap[up]))
			break;
		p->heap[i] = p->heap[up];
		i = up;
	}
	p->heap[i] = it;
}

static struct heap_item heap_pop(struct path *p)
{
	struct heap_item top = p->heap[0], last = p->heap[--p->heap_len];
	uint32_t i = 0, n = p->heap_len;

	for (;;) {
		uint32_t c = 2 * i + 1;

		if (c >= n)
			break;
		if (c + 1 < n && heap_less(&p->heap[c + 1], &p->heap[c]))
			c++;
		if (!heap_less(&p->heap[c], &last))
			break;
		p->heap[i] = p->heap[c];
		i = c;
	}
	if (n)
		p->heap[i] = last;
	return top;
}

int path_init(struct path *p, int dir, uint64_t pool_bytes, size_t max_frame, uint64_t seed)
{
	uint64_t x = seed ^ (0x5bd1e995ull * (uint64_t)(dir + 1));

	p->dir = dir;
	p->pool.size = pool_bytes;
	p->pool.mem = mmap(NULL, pool_bytes, PROT_READ | PROT_WRITE,
			   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p->pool.mem == MAP_FAILED)
		return -1;
	/* Every entry takes at least header + vnet + 60-byte minimum frame. */
	p->heap_cap = (uint32_t)(pool_bytes / ALIGN16(ENT_HDR + VNET_LEN + 60) + 1);
	p->heap = mmap(NULL, (size_t)p->heap_cap * sizeof(*p->heap), PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p->heap == MAP_FAILED)
		return -1;
	p->slot = ALIGN16(VNET_LEN + max_frame);
	p->stage = malloc(p->slot * PATH_BATCH);
	if (!p->stage)
		return -1;
	for (int i = 0; i < 4; i++)
		p->rng[i] = splitmix64(&x);
	params_default(&p->cur);
	p->pending = p->cur;
	return pthread_mutex_init(&p->mu, NULL) ? -1 : 0;
}

void path_free(struct path *p)
{
	if (p->pool.mem && p->pool.mem != MAP_FAILED)
		munmap(p->pool.mem, p->pool.size);
	if (p->heap && p->heap != MAP_FAILED)
		munmap(p->heap, (size_t)p->heap_cap * sizeof(*p->heap));
	free(p->stage);
}

void path_publish(struct path *p, const struct link_params *lp)
{
	pthread_mutex_lock(&p->mu);
	p->pending = *lp;
	__atomic_add_fetch(&p->gen, 1, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&p->mu);
}

static void refresh_params(struct path *p)
{
	unsigned g = __atomic_load_n(&p->gen, __ATOMIC_ACQUIRE);

	if (g == p->cur_gen)
		return;
	pthread_mutex_lock(&p->mu);
	p->cur = p->pending;
	p->cur_gen = p->gen;
	pthread_mutex_unlock(&p->mu);
	if (p->cur.ge_p_pct <= 0)
		p->ge_bad = 0;
	if (!p->cur.rate_bps && !p->cur.trace) /* the queue drains at once; no stale backlog for later */
		ST_SET(p, link_free_ns, 0);
}

static uint64_t opp_ns(const struct path *p, uint64_t k)
{
	const struct trace *tr = p->trace_of;

	return p->trace_base_ns + (k / tr->n) * tr->period_ms * 1000000ull + (uint64_t)tr->ms[k % tr->n] * 1000000ull;
}

/* The first opportunity at or after time `at`: whole periods skipped, then a
 * binary search within the period. */
static uint64_t first_opp_at(const struct path *p, uint64_t at)
{
	const struct trace *tr = p->trace_of;
	uint64_t period_ns = tr->period_ms * 1000000ull, since = at - p->trace_base_ns;
	uint64_t loop = since / period_ns, off_ms = (since % period_ns + 999999) / 1000000;
	size_t lo = 0, hi = tr->n;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;

		if (tr->ms[mid] < off_ms)
			lo = mid + 1;
		else
			hi = mid;
	}
	return loop * tr->n + lo;   /* lo == n: the next period's first */
}

/* A new trace starts with the first frame that meets it, whether or not the frame is then dropped:
 * a trace whose first opportunity lies beyond limit_ms would otherwise start over with every frame
 * and never deliver one (mahimahi's ATT-LTE-driving uplink begins 831 ms in). */
static void trace_begin(struct path *p, uint64_t start)
{
	if (p->trace_of == p->cur.trace)
		return;
	p->trace_of = p->cur.trace;
	p->trace_base_ns = start;
	p->trace_k = 0;
	p->trace_left = TRACE_MTU;
}

/* tx_done of a frame of flen bytes whose serialization may start at `start` (trace_begin first). */
static uint64_t trace_txdone(struct path *p, uint64_t start, uint64_t flen)
{
	if (opp_ns(p, p->trace_k) < start) {   /* idle link: the opportunities before start are gone */
		p->trace_k = first_opp_at(p, start);
		p->trace_left = TRACE_MTU;
	}
	while (flen > p->trace_left) {
		flen -= p->trace_left;
		p->trace_k++;
		p->trace_left = TRACE_MTU;
	}
	p->trace_left -= (uint32_t)flen;
	return opp_ns(p, p->trace_k);
}

/* One frame (vnet header + L2 frame) arrived at time t. */
static void admit(struct path *p, uint64_t t, const uint8_t *buf, uint32_t len)
{
	const struct link_params *lp = &p->cur;
	uint64_t flen = len - VNET_LEN, txdone = t, dep;
	uint64_t link_free = p->st.link_free_ns;
	double extra_ms;
	struct entry *e;

	ST_ADD(p, in_pkts, 1);
	ST_ADD(p, in_bytes, flen);
	if (lost(p)) {
		ST_ADD(p, drop_loss, 1);
		return;
	}
	if (lp->rate_bps || lp->trace) {
		uint64_t start = link_free > t ? link_free : t, wait;

		if ((lp->limit_bytes && p->st.queue_bytes + flen > lp->limit_bytes) ||
		    (lp->limit_pkts && p->st.queue_pkts + 1 > lp->limit_pkts)) {
			ST_ADD(p, drop_queue, 1);
			return;
		}
		if (lp->trace) {
			/* The opportunities the frame would take stay free if it is dropped. */
			uint64_t k;
			uint32_t left;

			trace_begin(p, start);
			k = p->trace_k;
			left = p->trace_left;
			txdone = trace_txdone(p, start, flen);
			wait = txdone - t;
			if (lp->limit_ms > 0 && (double)wait > lp->limit_ms * 1e6) {
				p->trace_k = k;
				p->trace_left = left;
				ST_ADD(p, drop_queue, 1);
				return;
			}
		} else {
			wait = start - t;
			if (lp->limit_ms > 0 && (double)wait > lp->limit_ms * 1e6) {
				ST_ADD(p, drop_queue, 1);
				return;
			}
			txdone = start + (flen * 8 * 1000000000ull + lp->rate_bps - 1) / lp->rate_bps;
		}
		ST_ADD(p, qdelay_sum_ns, txdone - t);
		ST_ADD(p, qdelay_pkts, 1);
		if (txdone - t > p->st.qdelay_max_ns)
			ST_SET(p, qdelay_max_ns, txdone - t);
	}
	e = pool_alloc(&p->pool, (uint32_t)ALIGN16(ENT_HDR + len));
	if (!e || p->heap_len == p->heap_cap) {
		ST_ADD(p, drop_pool, 1);
		return;
	}
	extra_ms = lp->delay_ms + jitter_sample_ms(p);
	dep = txdone + (extra_ms > 0 ? (uint64_t)(extra_ms * 1e6) : 0);
	if (!lp->reorder && dep < p->last_dep_ns)
		dep = p->last_dep_ns;
	if (dep > p->last_dep_ns)
		p->last_dep_ns = dep;

	e->flags = 0;
	e->len = len;
	e->dep_ns = dep;
	e->txdone_ns = txdone;
	memcpy(e->data, buf, len);
	if (lp->rate_bps || lp->trace) {
		e->flags |= ENT_QUEUED;
		ST_SET(p, link_free_ns, txdone);
		ST_ADD(p, queue_pkts, 1);
		ST_ADD(p, queue_bytes, flen);
	}
	ST_ADD(p, held_pkts, 1);
	ST_ADD(p, held_bytes, flen);
	heap_push(p, (struct heap_item){ .dep_ns = dep, .seq = p->seq++,
		.off = (uint32_t)((uint8_t *)e - p->pool.mem) });
}

/* Moves qhead past entries whose serialization ended by `now`. Returns the
 * tx_done of the first one still serializing, or 0. */
static uint64_t advance_queue(struct path *p, uint64_t now)
{
	struct pool_ring *r = &p->pool;

	while (r->qhead != r->tail) {
		struct entry *e = ent_at(r, r->qhead);

		if (!(e->flags & ENT_WRAP)) {
			if (e->txdone_ns > now)
				return e->txdone_ns;
			if (e->flags & ENT_QUEUED) {
				e->flags &= (uint16_t)~ENT_QUEUED;
				ST_ADD(p, queue_pkts, -1);
				ST_ADD(p, queue_bytes, -(uint64_t)(e->len - VNET_LEN));
			}
		}
		r->qhead += e->total;
	}
	return 0;
}

static void reclaim(struct path *p)
{
	struct pool_ring *r = &p->pool;

	while (r->head != r->qhead) {
		struct entry *e = ent_at(r, r->head);

		if (!(e->flags & (ENT_SENT | ENT_WRAP)))
			break;
		r->head += e->total;
	}
	if (r->head == r->tail)
		r->head = r->tail = r->qhead = 0;
}

static void send_batch(struct path *p, struct mmsghdr *msg, struct entry **ents, int n)
{
	int done = 0;

	while (done < n) {
		int rc = sendmmsg(p->tx_fd, msg + done, (unsigned)(n - done), 0);

		if (rc < 0 && errno == EINTR)
			continue;
		if (rc <= 0) {
			/* The frame at `done` was refused (link down, too big for the MTU...):
			 * count it and go on with the rest. */
			p->last_errno = rc < 0 ? errno : EIO;
			ST_ADD(p, tx_errors, 1);
			done++;
			continue;
		}
		for (int i = done; i < done + rc; i++) {
			ST_ADD(p, out_pkts, 1);
			ST_ADD(p, out_bytes, ents[i]->len - VNET_LEN);
		}
		done += rc;
	}
	for (int i = 0; i < n; i++) {
		ents[i]->flags |= ENT_SENT;
		ST_ADD(p, held_pkts, -1);
		ST_ADD(p, held_bytes, -(uint64_t)(ents[i]->len - VNET_LEN));
	}
}

/* Sends everything due by `now`; returns the next departure time or 0. */
static uint64_t send_due(struct path *p, uint64_t now)
{
	struct mmsghdr msg[PATH_BATCH];
	struct iovec iov[PATH_BATCH];
	struct entry *ents[PATH_BATCH];
	int n = 0;

	while (p->heap_len && p->heap[0].dep_ns <= now) {
		struct heap_item it = heap_pop(p);
		struct entry *e = (struct entry *)(p->pool.mem + it.off);
		struct virtio_net_hdr *vh = (struct virtio_net_hdr *)e->data;

		/* DATA_VALID means nothing on transmit; only NEEDS_CSUM is carried over. */
		vh->flags &= VIRTIO_NET_HDR_F_NEEDS_CSUM;
		iov[n] = (struct iovec){ .iov_base = e->data, .iov_len = e->len };
		msg[n] = (struct mmsghdr){ .msg_hdr = { .msg_iov = &iov[n], .msg_iovlen = 1 } };
		ents[n++] = e;
		if (n == PATH_BATCH) {
			send_batch(p, msg, ents, n);
			n = 0;
		}
	}
	if (n)
		send_batch(p, msg, ents, n);
	return p->heap_len ? p->heap[0].dep_ns : 0;
}

/* Reads up to a batch of frames; returns how many were read (0: none waiting). */
static int receive(struct path *p)
{
	struct mmsghdr msg[PATH_BATCH];
	struct iovec iov[PATH_BATCH];
	struct sockaddr_ll from[PATH_BATCH];
	uint64_t t;
	int n;

	for (int i = 0; i < PATH_BATCH; i++) {
		iov[i] = (struct iovec){ .iov_base = p->stage + i * p->slot, .iov_len = p->slot };
		msg[i] = (struct mmsghdr){ .msg_hdr = { .msg_name = &from[i],
			.msg_namelen = sizeof(from[i]), .msg_iov = &iov[i], .msg_iovlen = 1 } };
	}
	n = recvmmsg(p->rx_fd, msg, PATH_BATCH, MSG_DONTWAIT, NULL);
	if (n < 0) {
		if (errno != EAGAIN && errno != EINTR)
			p->last_errno = errno; /* e.g. ENETDOWN once when the link goes down */
		return 0;
	}
	t = now_ns();
	for (int i = 0; i < n; i++) {
		const uint8_t *buf = iov[i].iov_base;
		const struct virtio_net_hdr *vh = (const void *)buf;
		uint32_t len = msg[i].msg_len;

		if (from[i].sll_pkttype == PACKET_OUTGOING || len < VNET_LEN + 14)
			continue;
		if ((msg[i].msg_hdr.msg_flags & MSG_TRUNC) || vh->gso_type != VIRTIO_NET_HDR_GSO_NONE) {
			ST_ADD(p, in_pkts, 1);
			ST_ADD(p, drop_oversize, 1);
			if (!p->warned_oversize) {
				p->warned_oversize = 1;
				fprintf(stderr, "linkem: %s: dropping %s frames larger than the MTU "
					"(counted in drop_oversize); on the peer of %s run: ethtool -K PEER "
					"tso off gso off tx-udp-segmentation off\n", p->in_name,
					vh->gso_type ? "GSO" : "truncated", p->in_name);
			}
			continue;
		}
		admit(p, t, buf, len);
	}
	return n;
}

void *path_thread(void *arg)
{
	struct path *p = arg;
	struct pollfd pfd[2] = { { .fd = p->rx_fd, .events = POLLIN },
				 { .fd = p->wake_fd, .events = POLLIN } };

	while (!*p->stop) {
		uint64_t now, next_dep, next_q, next;
		struct timespec ts;

		refresh_params(p);
		now = now_ns();
		next_q = advance_queue(p, now);
		next_dep = send_due(p, now);
		reclaim(p);
		if (receive(p) > 0)
			continue;
		/* Idle: sleep until the next departure, the end of the current
		 * serialization (keeps the queue gauge honest) or a frame. */
		next = next_dep;
		if (next_q && (!next || next_q < next))
			next = next_q;
		now = now_ns();
		if (next && next <= now)
			continue;
		if (next) {
			uint64_t d = next - now;

			ts = (struct timespec){ .tv_sec = (time_t)(d / 1000000000ull),
						.tv_nsec = (long)(d % 1000000000ull) };
		} else {
			ts = (struct timespec){ .tv_sec = 0, .tv_nsec = 200000000 };
		}
		ppoll(pfd, 2, &ts, NULL);
	}
	return NULL;
}

/* Milliseconds to the µs, as the stats have always been given. */
static double ms3(double ms)
{
	return nearbyint(ms * 1000) / 1000;
}

json_t *path_stats_json(struct path *p)
{
	uint64_t now = now_ns(), lf = ST_GET(p, link_free_ns), qpkts = ST_GET(p, qdelay_pkts);
	double qms = lf > now ? (double)(lf - now) / 1e6 : 0;

	return json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:I, s:I, s:f, s:f, s:I}",
			 "in_pkts", (json_int_t)ST_GET(p, in_pkts), "in_bytes", (json_int_t)ST_GET(p, in_bytes),
			 "out_pkts", (json_int_t)ST_GET(p, out_pkts), "out_bytes", (json_int_t)ST_GET(p, out_bytes),
			 "drop_loss", (json_int_t)ST_GET(p, drop_loss), "drop_queue", (json_int_t)ST_GET(p, drop_queue),
			 "drop_pool", (json_int_t)ST_GET(p, drop_pool),
			 "drop_oversize", (json_int_t)ST_GET(p, drop_oversize),
			 "drop_rx", (json_int_t)p->rx_kernel_drops, "tx_errors", (json_int_t)ST_GET(p, tx_errors),
			 "queue_pkts", (json_int_t)ST_GET(p, queue_pkts), "queue_bytes", (json_int_t)ST_GET(p, queue_bytes),
			 "queue_ms", ms3(qms),
			 "held_pkts", (json_int_t)ST_GET(p, held_pkts), "held_bytes", (json_int_t)ST_GET(p, held_bytes),
			 "queue_delay_ms_avg", ms3(qpkts ? (double)ST_GET(p, qdelay_sum_ns) / (double)qpkts / 1e6 : 0.0),
			 "queue_delay_ms_max", ms3((double)ST_GET(p, qdelay_max_ns) / 1e6),
			 "queue_delay_pkts", (json_int_t)qpkts);
}
