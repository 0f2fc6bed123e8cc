/* SPDX-License-Identifier: GPL-2.0 */
/*
 * pep_radio: the access side's congestion control, the contract between the
 * BPF program (congestion/radio.bpf.c) and the control plane
 * (pepctl/radio_maps.py). Map names, struct layouts, defaults and the
 * statistics' buckets live here and only here; the control law itself is in
 * radio_law.h.
 *
 * If you change this file, change with it:
 *   - pepctl/radio_maps.py          (struct formats, map names, buckets)
 *   - monitoring/ (the dashboard panel and rules read the exporter's names)
 *   (tests/unit/test_radio_contract.py compares the first with this file)
 *
 * Where it runs: registered once per host (a congestion control is
 * host-wide), chosen per route (`congctl pep_radio` on a graph's access-side
 * routes), so every socket the proxy has toward a subscriber runs it. Types
 * come from the includer (vmlinux.h in BPF, <linux/types.h> in userspace).
 */
#ifndef PEP_RADIO_H
#define PEP_RADIO_H

#ifndef RADIO_NAME                         /* a build for experiments may take another name */
#define RADIO_NAME "pep_radio"            /* tcp_congestion_ops.name: what congctl and ss show */
#endif

#define RADIO_SUBSCRIBERS_MAX 131072       /* radio_subs: LRU, preallocated */
#define RADIO_GRAPHS_MAX 4096              /* radio_params, radio_stats: one entry per graph namespace */

/* Defaults of a graph's parameters (radio_params), and fixed constants. */
#define RADIO_TARGET_US 30000              /* queueing delay held in the radio's buffer */
#define RADIO_STALE_US 30000000            /* a subscriber not heard from for this long starts over */
#define RADIO_MIN_RTT_WIN_US 10000000      /* the minimum RTT is the least of the last 5-10 s */
#define RADIO_OUTAGE_US 250000             /* no ACK for this long with data in flight: an outage */
#define RADIO_SILENCE_US 100000            /* ... this long, and two round trips: the link paused (radio_pause_us) */
#define RADIO_DELACK_US 40000             /* a receiver's delayed-ACK timer, at least (Linux: TCP_DELACK_MIN) */
#define RADIO_EPOCH_US 10000000            /* "subscribers active" counts those heard in one epoch */
#define RADIO_RTO_MAX_MS 1000              /* the retransmission timer's longest backoff (the least the kernel takes) */
#define RADIO_RTO_MAX_RTTS 3               /* ... or this many of the handshake's round trips, if longer */
#define RADIO_FAST_RETRIES 20              /* ... for this many retransmissions of one silence (about 20 s) */

/* radio_params: HASH, key __u32 (the graph namespace's inode number).
 * Written by pepctl up for every graph whose access side runs pep_radio. A
 * socket in a namespace without an entry runs on the defaults above. */
struct radio_params {
	__u32 target_us;
	__u32 flags;                       /* none yet */
};

/* radio_subs: LRU_HASH[RADIO_SUBSCRIBERS_MAX], one entry per subscriber
 * (address, in its graph's namespace). Every flow of a subscriber reads and
 * feeds it: one capacity estimate and one minimum RTT for all of them.
 * `pepctl subscribers` reads it (struct radio_sub mirrored whole). */
struct radio_sub_key {
	__u32 netns;                       /* the graph namespace's inode number */
	__u32 family;                      /* AF_INET or AF_INET6 */
	__u8 addr[16];                     /* IPv4: the first 4 bytes; network order */
};

/* A base's rise (radio_rise): the least a drain epoch's samples were above the base, in the epoch
 * now and the one before. An epoch is a drain (radio_sub.drained_us) until the next. */
struct radio_rise {
	__u32 drain_ms;                    /* the drain whose epoch it counts, ms, odd; 0: none yet */
	__u32 least_us;                    /* the least sample above the base in it; ~0: none */
	__u32 before_us;                   /* ... in the epoch before, less the base's rise since; ~0: none */
};

struct radio_sub {
	__u64 window;                      /* bytes its flows may have in flight together */
	__u64 rate;                        /* bytes/s they delivered, smoothed: what it is shown as */
	__u64 win_start_us;                /* the control window: since when (the subscriber's time) */
	__u64 win_delivered;               /* bytes every flow had delivered in it */
	__u64 win_lost;                    /* bytes they found lost in it */
	__u64 last_ack_us;                 /* the last ACK of any of its flows */
	__u64 last_rx_us;                  /* ... and when the subscriber sent it (radio_uplink_hold) */
	__u64 min_rtt_stamp_us;            /* when the current minimum-RTT bucket opened */
	__u64 resumed_us;                  /* the link last resumed after a pause: earlier sends waited in it */
	__u64 drained_us;                  /* the last drain of its queue */
	__u64 resume_window;               /* the window before an outage: startup after it stops there */
	__s64 inflight;                    /* bytes its flows had in flight at their last ACKs, together */
	__s64 inflight_hi;                 /* ... and before those ACKs: once refilled (radio_flight_hi) */
	__u32 min_rtt_us;                  /* least RTT of the current bucket */
	__u32 min_rtt_prev_us;             /* ... and of the bucket before */
	__u64 win_path_sum_us;             /* RTT samples less their queue samples, summed: the round trip */
	__u32 win_path_n;                  /* without our queue (with the uplink's grants' wait) is their mean */
	__u32 win_qd_us;                   /* least queue sample of the window: the standing queue */
	__u32 win_bulk;                    /* flows that were not application-limited in the window */
	__u32 win_full;                    /* a flow filled its window in it: the link may take more */
	__u32 bulk;                        /* ... in the last two windows (the most of either): the window is
					    * shared among them */
	__u32 bulk_last;                   /* ... in the last window alone */
	__u32 window_id;                   /* counts windows, so a flow counts itself once in each */
	__u32 qdelay_us;                   /* the standing queue of the last window */
	__u32 target_us;                   /* the graph's target when the entry was made */
	__u32 window_queue_us;             /* the queue its window holds: the target, or more on a long path
					    * (radio_window_queue); 0 until a control window with a queue
					    * sample, or an overflow, set it */
	__u32 flows;                       /* sockets open */
	__u32 id;                          /* which incarnation of the entry: its flows hold it (radio_attached) */
	__u32 outages;
	__u32 epoch;                       /* the last epoch it was counted active in */
	struct radio_rise rtt_rise;        /* its minimum RTT's, fed by flows without timestamps */
	__u8 startup;                      /* no queue seen yet: the window grows by what each ACK delivers */
	__u8 draining;                     /* this control window drains the queue: half the path flies */
	__u8 win_seen;                     /* RADIO_SEEN_*: whose ACKs the window had (radio_window_blind) */
	__u8 blind;                        /* windows in a row that were blind, up to 255 */
	__u8 ts_clock;                     /* RADIO_TS_*: its flows' timestamp clock, as last judged */
	__u8 pad[7];                       /* (named: pepctl/radio_maps.py's mirror names every byte) */
};

/* radio_flow: a socket's own state, in its icsk_ca_priv (at most 104 bytes). */
struct radio_flow {
	__u64 last_ack_us;                 /* the socket's last ACK */
	__u64 last_rx_us;                  /* ... and when the peer sent it (radio_uplink_hold) */
	__u64 start_us;                    /* when it joined its subscriber (radio_start) */
	__s64 owd_base;                    /* one-way delay with no queue, in the peer's timestamp terms */
	__s64 up_base;                     /* an ACK's way back with no wait for a grant, in the same terms */
	__u32 window_id;                   /* the subscriber window it last counted itself bulk in */
	__u32 in_flight;                   /* packets out after its last ACK: was it waiting for one? */
	__u32 flight_hi;                   /* ... and before it, 0 once none are out (radio_flight_hi) */
	__u32 target_us;
	__u32 sub_id;                      /* the id of the entry it holds a count in */
	__u32 last_tsval;                  /* the peer's newest timestamp, and how often its 32 bits */
	__u32 ts_wraps;                    /* ... wrapped (radio_peer_us) */
	__u32 ts_ref;                      /* a timestamp its clock is judged from (radio_peer_clock) */
	__u32 ts_ref_ms;                   /* ... our clock then, ms (odd); 0: none yet */
	__u32 ts_ref_rtt_us;               /* ... and that ACK's RTT */
	__u32 up_base_ms;                  /* our clock when up_base was taken, ms (radio_drifting_base) */
	struct radio_rise owd_rise;        /* owd_base's */
	__u8 has_sub;                      /* it holds a count in its subscriber's entry */
	__u8 has_base;                     /* owd_base is set */
	__u8 has_up;                       /* up_base is set */
	__u8 delacks;                      /* the peer acknowledges two packets at once: it delays ACKs */
	__u8 proven;                       /* its owd_base has seen the queue empty: its samples count */
	__u8 timers;                       /* RADIO_TIMERS_*: whose retransmission timers it runs on */
	__u8 has_ts;                       /* last_tsval is set */
	__u8 ts_clock;                     /* RADIO_TS_*: does the peer's timestamp clock tick in ms? */
};
#define RADIO_TS_JUDGING 0                 /* ts_clock: not judged yet (radio_peer_clock) */
#define RADIO_TS_MS 1                      /* ... about 1 kHz: its timestamps are read as its ms clock */
#define RADIO_TS_OTHER 2                   /* ... another rate: read as if it sent none */
#define RADIO_TIMERS_KERNEL 0              /* radio_flow.timers: the kernel's own */
#define RADIO_TIMERS_SHORT 1               /* ... backoff capped at RADIO_RTO_MAX_MS, patience kept */
#define RADIO_TIMERS_SILENT 2              /* ... the kernel's again: a long silence, or a shut window */
_Static_assert(sizeof(struct radio_flow) <= 104, "radio_flow must fit in icsk_ca_priv (13 x u64)");

/* radio_stats: HASH, key __u32 (graph namespace inode), value struct
 * radio_graph_stats. Counters only grow; the exporter makes rates of them.
 * Every control window of every subscriber adds one sample to the queueing
 * delay and rate histograms: bucket i counts samples above bound i-1 and at
 * most bound i (0: no bound); the exporter makes them cumulative. */
#define RADIO_QDELAY_BUCKETS 9
#define RADIO_QDELAY_BOUNDS_US {5000, 10000, 20000, 40000, 80000, 160000, 320000, 640000, 0}
#define RADIO_RATE_BUCKETS 11
/* bytes/s: 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000 Mbit/s, +Inf */
#define RADIO_RATE_BOUNDS {125000, 250000, 625000, 1250000, 2500000, 6250000, 12500000, 25000000, \
			   62500000, 125000000, 0}

struct radio_epoch_count {
	__u32 epoch;                       /* now / RADIO_EPOCH_US when counted */
	__u32 subscribers;                 /* subscribers heard from in that epoch */
	__u64 rate_sum;                    /* the sum of their rates (bytes/s) */
};

struct radio_graph_stats {
	__u64 flows_started;
	__u64 flows_ended;
	__u64 flows_warm;                  /* started at a known subscriber's rate, not from startup */
	__u64 subscribers_new;
	__u64 outages;
	__u64 outage_us;                   /* the outages' total length */
	__u64 windows;
	__u64 qdelay_sum_us;
	__u64 rate_sum;
	__u64 qdelay_bucket[RADIO_QDELAY_BUCKETS];
	__u64 rate_bucket[RADIO_RATE_BUCKETS];
	struct radio_epoch_count active[2];      /* indexed by epoch % 2 */
};

#endif /* PEP_RADIO_H */
