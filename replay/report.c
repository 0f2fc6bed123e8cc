#include "report.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
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

/* v rounded to 1/scale: seconds are reported to the ms and rates to a tenth, as
 * they always were (latencies are whole microseconds already). */
static double rounded(double v, double scale)
{
	return nearbyint(v * scale) / scale;
}

static json_t *json_lat(const struct samples *s)
{
	return json_pack("{s:I, s:f, s:f, s:f, s:f}", "count", (json_int_t)s->n, "p50", pct_ms(s, 50),
			 "p90", pct_ms(s, 90), "p99", pct_ms(s, 99), "max", s->n ? s->v[s->n - 1] / 1000.0 : 0.0);
}

/* A whole number is written as an integer ({"concurrency": 64}), as %g did. */
static json_t *json_number(double v)
{
	return v == nearbyint(v) && fabs(v) < 1e15 ? json_integer((json_int_t)v) : json_real(v);
}

static json_t *report_json(struct report *r)
{
	json_t *errors = json_object(), *templates = json_array(), *profile = json_string(r->profile);
	int failed = !errors || !templates || !profile;

	for (int k = 0; !failed && k < ERR__COUNT; k++)
		failed = json_object_set_new(errors, err_name(k), json_integer((json_int_t)r->errors[k]));
	for (size_t i = 0; !failed && i < r->ntpl; i++)
		failed = json_array_append_new(templates, json_pack("{s:I, s:I, s:I, s:I, s:I}", "index", (json_int_t)i,
				"transactions_ok", (json_int_t)r->tpl[i].ok, "transactions_failed",
				(json_int_t)r->tpl[i].failed, "bytes_tx", (json_int_t)r->tpl[i].bytes_tx,
				"bytes_rx", (json_int_t)r->tpl[i].bytes_rx));
	if (failed) {
		/* out of memory, or a profile path that is not UTF-8 (JSON strings must be) */
		errno = profile ? ENOMEM : EILSEQ;
		json_decref(errors);
		json_decref(templates);
		json_decref(profile);
		return NULL;
	}
	/* "o" steals each reference, also when json_pack fails; a NULL part fails it. */
	return json_pack("{s:s, s:s, s:s, s:o, s:o, s:f, s:f,"
			 " s:{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}, s:o,"
			 " s:{s:f, s:f, s:I, s:I}, s:{s:o, s:o, s:o}, s:o, s:{s:I}}",
		"schema", "pep-replay-report/1", "tool", "pep-replay", "role", r->role, "profile", profile,
		"mode", r->mode ? json_pack("{s:o}", r->mode, json_number(r->mode_value)) : json_null(),
		"duration_s", rounded(r->duration_s, 1000), "elapsed_s", rounded(r->elapsed_s, 1000),
		"counters",
		"conn_attempts", (json_int_t)r->conn_attempts, "conn_established", (json_int_t)r->conn_established,
		"conn_accepted", (json_int_t)r->conn_accepted, "conn_closed", (json_int_t)r->conn_closed,
		"bytes_tx", (json_int_t)r->bytes_tx, "bytes_rx", (json_int_t)r->bytes_rx,
		"transactions_ok", (json_int_t)r->trans_ok, "transactions_failed", (json_int_t)r->trans_failed,
		"rate_dropped", (json_int_t)r->rate_dropped,
		"errors", errors,
		"rates",
		"transactions_per_s", rounded(per_s(r, (double)r->trans_ok), 10),
		"connections_per_s",
		rounded(per_s(r, (double)(r->conn_attempts ? r->conn_attempts : r->conn_accepted)), 10),
		"tx_bits_per_s", (json_int_t)nearbyint(per_s(r, 8.0 * (double)r->bytes_tx)),
		"rx_bits_per_s", (json_int_t)nearbyint(per_s(r, 8.0 * (double)r->bytes_rx)),
		"latency_ms", "connect", json_lat(&r->connect), "ttfb", json_lat(&r->ttfb),
		"complete", json_lat(&r->complete),
		"templates", templates,
		"addresses", "distinct", (json_int_t)r->distinct_addrs);
}

int report_write_json(struct report *r, FILE *f)
{
	json_t *doc;
	int rc;

	sort_samples(r);
	doc = report_json(r);
	if (!doc)
		return -1;
	/* 15 digits print each rounded value as its decimal (0.1, not 0.10000000000000001). */
	rc = json_dumpf(doc, f, JSON_INDENT(2) | JSON_REAL_PRECISION(15));
	json_decref(doc);
	if (rc || fputc('\n', f) == EOF || ferror(f))
		return -1;
	return 0;
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
