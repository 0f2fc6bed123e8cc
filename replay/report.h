/* Counters, latency samples and the report (JSON and a printed table).
 * The JSON shape is shared with scripts/trex-run; see replay/README.md. */
#ifndef PEP_REPLAY_REPORT_H
#define PEP_REPLAY_REPORT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Why a connection or transaction failed. Names are the JSON keys under "errors". */
#define ERROR_KINDS(X) \
	X(bind)               /* source address not on any interface here */ \
	X(ports_exhausted)    /* connect: no free local port for this address pair */ \
	X(connect_refused)    /* RST to our SYN: nothing listens there */ \
	X(connect_timeout)    /* SYN never answered */ \
	X(connect_unreachable)/* no route / host unreachable */ \
	X(connect_other) \
	X(reset)              /* RST after the connection was up */ \
	X(timeout)            /* --timeout passed before the program finished */ \
	X(mismatch)           /* received bytes differ from what the peer's program sends */ \
	X(short_read)         /* peer closed before sending everything expected */ \
	X(overrun)            /* peer sent more than its program says */ \
	X(no_template)        /* server: no template matches the port, address or request */ \
	X(drain)              /* still running when the drain time after --duration ended */ \
	X(other)

enum err_kind {
#define X(name) ERR_##name,
	ERROR_KINDS(X)
#undef X
	ERR__COUNT
};

struct samples {
	uint32_t *v;           /* microseconds */
	size_t n, cap;
};

struct tpl_stats {
	uint64_t ok, failed, bytes_tx, bytes_rx;
};

struct report {
	const char *role, *profile, *mode;  /* mode: "rate" or "concurrency" (client) */
	double mode_value, duration_s, elapsed_s;
	uint64_t conn_attempts, conn_established, conn_accepted, conn_closed;
	uint64_t bytes_tx, bytes_rx, trans_ok, trans_failed, rate_dropped;
	uint64_t errors[ERR__COUNT];
	struct samples connect, ttfb, complete;
	struct tpl_stats *tpl;
	size_t ntpl;
	size_t distinct_addrs; /* client: sources used; server: peers seen */
};

void samples_add(struct samples *s, uint64_t ns);
const char *err_name(enum err_kind k);
int report_write_json(struct report *r, FILE *f);
void report_print_table(struct report *r, FILE *f);

#endif
