/* One direction of the emulated link: frames read on `in` leave by `out`
 * after this direction's impairments. Each direction is one thread that owns
 * its receive socket, its send socket, its packet pool and its counters; the
 * main thread only publishes parameters and reads counters.
 */
#ifndef LINKEM_PATH_H
#define LINKEM_PATH_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "params.h"

#define PATH_BATCH 64 /* frames per recvmmsg/sendmmsg call */

/* Written only by the path's thread (relaxed atomic stores), read by main. */
struct path_stats {
	uint64_t in_pkts, in_bytes;	/* frames read on `in` (L2 bytes, no FCS) */
	uint64_t out_pkts, out_bytes;	/* frames sent on `out` */
	uint64_t drop_loss;		/* dropped by the loss models */
	uint64_t drop_queue;		/* tail-dropped by the rate queue limit */
	uint64_t drop_pool;		/* pool full: --pool-mb too small for rate x hold time */
	uint64_t drop_oversize;		/* larger than MTU (GSO/GRO not turned off) */
	uint64_t tx_errors;		/* sendmmsg refused the frame */
	uint64_t queue_pkts, queue_bytes; /* waiting for serialization (rate queue) */
	uint64_t held_pkts, held_bytes;	/* everything held: rate queue + delay line */
	uint64_t link_free_ns;		/* when the rate-limited link is next idle */
	uint64_t qdelay_sum_ns, qdelay_max_ns;	/* time in the rate queue, of queued frames */
	uint64_t qdelay_pkts;
};

struct pool_ring {
	uint8_t *mem;
	uint64_t size;			/* power of two */
	uint64_t head, tail, qhead;	/* byte positions, see path.c */
};

struct heap_item {
	uint64_t dep_ns;
	uint32_t seq;			/* arrival order: breaks departure ties */
	uint32_t off;			/* entry offset in the pool */
};

struct path {
	int dir;			/* DIR_A2B or DIR_B2A */
	const char *in_name, *out_name;
	int rx_fd, tx_fd, wake_fd;
	const volatile int *stop;

	struct pool_ring pool;
	struct heap_item *heap;
	uint32_t heap_len, heap_cap, seq;
	uint64_t last_dep_ns;
	int ge_bad;
	uint64_t rng[4];

	/* Trace-driven capacity: the next delivery opportunity (absolute index,
	 * looping over the trace) and the bytes it has left; time 0 of the trace
	 * is when it was first used. */
	const struct trace *trace_of;
	uint64_t trace_base_ns, trace_k;
	uint32_t trace_left;

	pthread_mutex_t mu;		/* guards `pending` */
	struct link_params pending;
	unsigned gen;			/* bumped on publish; atomic */
	struct link_params cur;		/* the thread's copy */
	unsigned cur_gen;

	size_t slot;			/* staging bytes per frame: vnet header + MTU frame */
	uint8_t *stage;
	struct path_stats st;
	int warned_oversize, last_errno;
	uint64_t rx_kernel_drops;	/* main thread only: PACKET_STATISTICS sum */
};

/* Sets up pool and staging; fds and names must be filled in by the caller.
 * Returns 0 or -1 with errno set. */
int path_init(struct path *p, int dir, uint64_t pool_bytes, size_t max_frame, uint64_t seed);
void path_free(struct path *p);
void path_publish(struct path *p, const struct link_params *lp);
void *path_thread(void *arg);
/* This direction's counters as a JSON object (new reference; NULL when out of memory). */
json_t *path_stats_json(struct path *p);
uint64_t now_ns(void);

#endif
