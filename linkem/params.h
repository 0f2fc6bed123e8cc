/* Link parameters of one direction, and their KEY=VALUE text form.
 *
 * The same KEY=VALUE syntax is used on the command line and by the control
 * socket's `set`/`replace` commands; `params` prints the same keys back, so a
 * dump can be fed to `set` unchanged. linkem/profiles.py and linkem/README.md
 * list these keys too: change them together.
 */
#ifndef LINKEM_PARAMS_H
#define LINKEM_PARAMS_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

enum jitter_dist { JITTER_UNIFORM = 0, JITTER_NORMAL = 1 };

#define TRACE_MTU 1500 /* bytes one delivery opportunity carries (mahimahi's MTU) */

/* A capacity trace in mahimahi's format: one line per delivery opportunity of
 * TRACE_MTU bytes, its time in ms from the start, non-decreasing; the trace
 * loops with a period of its last time (at least 1 ms). Loaded once by the
 * main thread and never freed (a path may still be using it). */
struct trace {
	uint32_t *ms;
	size_t n;
	uint64_t period_ms;
	double mean_bps;	/* n * TRACE_MTU * 8 / period */
	char path[256];
};

struct link_params {
	double delay_ms;	/* fixed one-way delay */
	double jitter_ms;	/* uniform: +-jitter; normal: sigma (clipped at 3 sigma) */
	int jitter_dist;	/* enum jitter_dist */
	int reorder;		/* 1: jitter may reorder packets */
	double loss_pct;	/* Bernoulli loss */
	double ge_p_pct;	/* Gilbert-Elliott good->bad per packet; 0 = model off */
	double ge_r_pct;	/* Gilbert-Elliott bad->good per packet */
	double ge_loss_bad_pct;	/* loss probability while in the bad state */
	double ge_loss_good_pct;	/* loss probability while in the good state */
	uint64_t rate_bps;	/* serialization rate in bit/s of L2 frames; 0 = unlimited */
	uint64_t limit_bytes;	/* tail-drop when the rate queue would exceed this; 0 = none */
	double limit_ms;	/* tail-drop when the rate queue wait would exceed this; 0 = none */
	uint64_t limit_pkts;	/* tail-drop when the rate queue would hold more packets; 0 = none */
	const struct trace *trace; /* capacity from a trace instead of `rate`; NULL = none */
};

enum { DIR_A2B = 0, DIR_B2A = 1, NDIRS = 2 };

extern const char *const dir_names[NDIRS];

void params_default(struct link_params *p);

/* Apply one "[a2b.|b2a.]key=value" to p[] (no prefix: both directions).
 * Returns 0, or -1 with a message naming the key and the accepted form. */
int params_apply_kv(struct link_params p[NDIRS], const char *kv, char *err, size_t errlen);

/* One direction's parameters as a JSON object, under the keys `set` takes
 * (new reference; NULL when out of memory). */
json_t *params_json(const struct link_params *p);

/* A JSON string of s; bytes that are not UTF-8 become '?' (NULL when out of memory). */
json_t *json_text(const char *s);

#endif
