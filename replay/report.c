#include "report.h"

#include <stdlib.h>
#include <string.h>

static const char *const err_names[] = {
#define X(name) #name,
	ERROR_KINDS(X)
#undef X
};

const char *err_name(enum err_kind k)
{
	return k < ERR__COUNT ? err_names[k] : "?";
}

void samples_add(struct samples *s, uint64_t ns)
{
	uint64_t us = ns / 1000;

	if (s->n == s->cap) {
		size_t nc = s->cap ? s->cap * 2 : 4096;
		uint32_t *v = realloc(s->v, nc * sizeof(*v));

		if (!v)
			return; /* out of memory: drop the sample, keep the run going */
		s->v = v;
		s->cap = nc;
	}
	s->v[s->n++] = us > UINT32_MAX ? UINT32_MAX : (uint32_t)us;
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return x < y ? -1 : x > y;
}

/* Nearest-rank percentile in milliseconds; samples must be sorted. */
static double pct_ms(const struct samples *s, double q)
{
	size_t rank;

	if (!s->n)
		return 0;
	rank = (size_t)(q / 100.0 * (double)s->n + 0.999999);
	if (rank < 1)
		rank = 1;
	if (rank > s->n)
		rank = s->n;
	return s->v[rank - 1] / 1000.0;
}

static void sort_samples(struct report *r)
{
	struct samples *all[] = { &r->connect, &r->ttfb, &r->complete };

	for (size_t i = 0; i < 3; i++)
		if (all[i]->n)
			qsort(all[i]->v, all[i]->n, sizeof(uint32_t), cmp_u32);
}

static double per_s(const struct report *r, double v)
{
	return r->elapsed_s > 0 ? v / r->elapsed_s : 0;
}

static void json_lat(FILE *f, const char *name, const struct samples *s, int last)
{
	fprintf(f, "    \"%s\": {\"count\": %zu, \"p50\": %.3f, \"p90\": %.3f, \"p99\": %.3f, \"max\": %.3f}%s\n",
		name, s->n, pct_ms(s, 50), pct_ms(s, 90), pct_ms(s, 99), s->n ? s->v[s->n - 1] / 1000.0 : 0,
		last ? "" : ",");
}

static void json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (; s && *s; s++) {
		if (*s == '"' || *s == '\\')
			fprintf(f, "\\%c", *s);
		else if ((unsigned char)*s < 0x20)
			fprintf(f, "\\u%04x", *s);
		else
			fputc(*s, f);
	}
	fputc('"', f);
}

int report_write_json(struct report *r, FILE *f)
{
	sort_samples(r);
	fprintf(f, "{\n  \"schema\": \"pep-replay-report/1\",\n  \"tool\": \"pep-replay\",\n  \"role\": ");
	json_str(f, r->role);
	fprintf(f, ",\n  \"profile\": ");
	json_str(f, r->profile);
	fprintf(f, ",\n  \"mode\": ");
	if (r->mode) {
		fprintf(f, "{");
		json_str(f, r->mode);
		fprintf(f, ": %g}", r->mode_value);
	} else {
		fprintf(f, "null");
	}
	fprintf(f, ",\n  \"duration_s\": %.3f,\n  \"elapsed_s\": %.3f,\n", r->duration_s, r->elapsed_s);
	fprintf(f, "  \"counters\": {\n"
		"    \"conn_attempts\": %llu,\n    \"conn_established\": %llu,\n    \"conn_accepted\": %llu,\n"
		"    \"conn_closed\": %llu,\n    \"bytes_tx\": %llu,\n    \"bytes_rx\": %llu,\n"
		"    \"transactions_ok\": %llu,\n    \"transactions_failed\": %llu,\n    \"rate_dropped\": %llu\n  },\n",
		(unsigned long long)r->conn_attempts, (unsigned long long)r->conn_established,
		(unsigned long long)r->conn_accepted, (unsigned long long)r->conn_closed,
		(unsigned long long)r->bytes_tx, (unsigned long long)r->bytes_rx,
		(unsigned long long)r->trans_ok, (unsigned long long)r->trans_failed,
		(unsigned long long)r->rate_dropped);
	fprintf(f, "  \"errors\": {");
	for (int k = 0; k < ERR__COUNT; k++)
		fprintf(f, "%s\"%s\": %llu", k ? ", " : "", err_name(k), (unsigned long long)r->errors[k]);
	fprintf(f, "},\n");
	fprintf(f, "  \"rates\": {\"transactions_per_s\": %.1f, \"connections_per_s\": %.1f, "
		"\"tx_bits_per_s\": %.0f, \"rx_bits_per_s\": %.0f},\n",
		per_s(r, (double)r->trans_ok),
		per_s(r, (double)(r->conn_attempts ? r->conn_attempts : r->conn_accepted)),
		per_s(r, 8.0 * (double)r->bytes_tx), per_s(r, 8.0 * (double)r->bytes_rx));
	fprintf(f, "  \"latency_ms\": {\n");
	json_lat(f, "connect", &r->connect, 0);
	json_lat(f, "ttfb", &r->ttfb, 0);
	json_lat(f, "complete", &r->complete, 1);
	fprintf(f, "  },\n  \"templates\": [");
	for (size_t i = 0; i < r->ntpl; i++)
		fprintf(f, "%s\n    {\"index\": %zu, \"transactions_ok\": %llu, \"transactions_failed\": %llu, "
			"\"bytes_tx\": %llu, \"bytes_rx\": %llu}", i ? "," : "", i,
			(unsigned long long)r->tpl[i].ok, (unsigned long long)r->tpl[i].failed,
			(unsigned long long)r->tpl[i].bytes_tx, (unsigned long long)r->tpl[i].bytes_rx);
	fprintf(f, "\n  ],\n  \"addresses\": {\"distinct\": %zu}\n}\n", r->distinct_addrs);
	return ferror(f) ? -1 : 0;
}

static void row(FILE *f, const char *name, unsigned long long v)
{
	fprintf(f, "  %-26s %16llu\n", name, v);
}

void report_print_table(struct report *r, FILE *f)
{
	sort_samples(r);
	fprintf(f, "pep-replay %s  profile %s  %.2f s", r->role, r->profile, r->elapsed_s);
	if (r->mode)
		fprintf(f, "  %s %g", r->mode, r->mode_value);
	fprintf(f, "\n");
	if (r->conn_attempts)
		row(f, "connection attempts", r->conn_attempts);
	if (r->conn_accepted)
		row(f, "connections accepted", r->conn_accepted);
	row(f, "connections established", r->conn_established);
	row(f, "connections closed", r->conn_closed);
	row(f, "bytes tx", r->bytes_tx);
	row(f, "bytes rx", r->bytes_rx);
	row(f, "transactions ok", r->trans_ok);
	row(f, "transactions failed", r->trans_failed);
	if (r->rate_dropped)
		row(f, "rate dropped (inflight cap)", r->rate_dropped);
	for (int k = 0; k < ERR__COUNT; k++)
		if (r->errors[k]) {
			char name[48];

			snprintf(name, sizeof(name), "error %s", err_name(k));
			row(f, name, r->errors[k]);
		}
	row(f, r->conn_attempts ? "source addresses used" : "peer addresses seen", r->distinct_addrs);
	fprintf(f, "  %-26s %16.1f\n", "transactions/s", per_s(r, (double)r->trans_ok));
	fprintf(f, "  %-26s %16.1f\n", "rx Mbit/s", per_s(r, 8e-6 * (double)r->bytes_rx));
	fprintf(f, "  %-26s %10s %10s %10s\n", "latency ms", "p50", "p90", "p99");
	struct { const char *n; struct samples *s; } l[] = {
		{ "connect", &r->connect }, { "time to first byte", &r->ttfb }, { "completion", &r->complete },
	};
	for (size_t i = 0; i < 3; i++)
		if (l[i].s->n)
			fprintf(f, "  %-26s %10.3f %10.3f %10.3f\n", l[i].n, pct_ms(l[i].s, 50), pct_ms(l[i].s, 90),
				pct_ms(l[i].s, 99));
}
