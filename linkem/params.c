/* KEY=VALUE parsing and the JSON form of link parameters (see params.h). */
#include "params.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

const char *const dir_names[NDIRS] = { "a2b", "b2a" };

void params_default(struct link_params *p)
{
	memset(p, 0, sizeof(*p));
	p->jitter_dist = JITTER_UNIFORM;
	p->ge_loss_bad_pct = 100.0; /* the classic Gilbert model: bad state loses all */
}

/* A finite number within [lo, hi], nothing after it. */
static int parse_double(const char *s, double lo, double hi, double *out)
{
	char *end;
	double v = strtod(s, &end);

	if (end == s || *end != '\0' || !isfinite(v) || v < lo || v > hi)
		return -1;
	*out = v;
	return 0;
}

/* A non-negative count with an optional decimal multiplier k/M/G and, for
 * rates, an optional "bit"/"bps" unit: 20M, 20Mbit, 1.5G, 64000. */
static int parse_scaled(const char *s, int allow_bit_unit, uint64_t *out)
{
	char *end;
	double v = strtod(s, &end), mult = 1;

	if (end == s || !isfinite(v) || v < 0)
		return -1;
	switch (*end) {
	case 'k': case 'K': mult = 1e3; end++; break;
	case 'm': case 'M': mult = 1e6; end++; break;
	case 'g': case 'G': mult = 1e9; end++; break;
	}
	if (allow_bit_unit && (!strcasecmp(end, "bit") || !strcasecmp(end, "bps")))
		end += 3;
	if (*end != '\0' || v * mult > 1e13)
		return -1;
	*out = (uint64_t)llround(v * mult);
	return 0;
}

/* Loads a mahimahi-format trace; NULL (errno set, *why said) if it is not one. */
static const struct trace *load_trace(const char *path, const char **why)
{
	FILE *f = fopen(path, "r");
	struct trace *t;
	char line[64];
	size_t cap = 4096;
	uint32_t last = 0;

	*why = "cannot be read";
	if (!f)
		return NULL;
	t = calloc(1, sizeof(*t));
	if (!t || !(t->ms = malloc(cap * sizeof(*t->ms)))) {
		fclose(f);
		free(t);
		return NULL;
	}
	while (fgets(line, sizeof(line), f)) {
		char *end;
		unsigned long v;

		if (line[0] == '\n' || line[0] == '#')
			continue;
		errno = 0;
		v = strtoul(line, &end, 10);
		if (end == line || (*end != '\n' && *end != '\0') || errno || v > 86400000ul || v < last) {
			*why = "is not a trace: one time in ms a line, non-decreasing";
			goto bad;
		}
		if (t->n == cap) {
			uint32_t *more = realloc(t->ms, 2 * cap * sizeof(*t->ms));

			if (!more)
				goto bad;
			t->ms = more;
			cap *= 2;
		}
		t->ms[t->n++] = (uint32_t)v;
		last = (uint32_t)v;
	}
	fclose(f);
	if (!t->n) {
		*why = "holds no delivery opportunity";
		free(t->ms);
		free(t);
		return NULL;
	}
	t->period_ms = last ? last : 1;
	t->mean_bps = (double)t->n * TRACE_MTU * 8 * 1000 / (double)t->period_ms;
	snprintf(t->path, sizeof(t->path), "%s", path);
	return t;
bad:
	fclose(f);
	free(t->ms);
	free(t);
	return NULL;
}

static const char *trace_error;

static int set_one(struct link_params *p, const char *key, const char *val)
{
	double d;

	if (!strcmp(key, "delay"))
		return parse_double(val, 0, 60000, &p->delay_ms);
	if (!strcmp(key, "jitter"))
		return parse_double(val, 0, 60000, &p->jitter_ms);
	if (!strcmp(key, "jitter_dist")) {
		if (!strcmp(val, "uniform"))
			p->jitter_dist = JITTER_UNIFORM;
		else if (!strcmp(val, "normal"))
			p->jitter_dist = JITTER_NORMAL;
		else
			return -1;
		return 0;
	}
	if (!strcmp(key, "reorder")) {
		if (strcmp(val, "0") && strcmp(val, "1"))
			return -1;
		p->reorder = val[0] == '1';
		return 0;
	}
	if (!strcmp(key, "loss"))
		return parse_double(val, 0, 100, &p->loss_pct);
	if (!strcmp(key, "ge_p"))
		return parse_double(val, 0, 100, &p->ge_p_pct);
	if (!strcmp(key, "ge_r"))
		return parse_double(val, 0, 100, &p->ge_r_pct);
	if (!strcmp(key, "ge_loss_bad"))
		return parse_double(val, 0, 100, &p->ge_loss_bad_pct);
	if (!strcmp(key, "ge_loss_good"))
		return parse_double(val, 0, 100, &p->ge_loss_good_pct);
	if (!strcmp(key, "rate"))
		return parse_scaled(val, 1, &p->rate_bps);
	if (!strcmp(key, "limit_bytes"))
		return parse_scaled(val, 0, &p->limit_bytes);
	if (!strcmp(key, "limit_pkts"))
		return parse_scaled(val, 0, &p->limit_pkts);
	if (!strcmp(key, "trace")) {
		if (!strcmp(val, "none") || !*val) {
			p->trace = NULL;
			return 0;
		}
		p->trace = load_trace(val, &trace_error);
		return p->trace ? 0 : -3;
	}
	if (!strcmp(key, "limit_ms")) {
		if (parse_double(val, 0, 60000, &d))
			return -1;
		p->limit_ms = d;
		return 0;
	}
	return -2;
}

static const char *const accepted =
	"delay=MS jitter=MS jitter_dist=uniform|normal reorder=0|1 loss=PCT ge_p=PCT ge_r=PCT "
	"ge_loss_bad=PCT ge_loss_good=PCT rate=BITS[k|M|G] limit_bytes=N[k|M] limit_ms=MS limit_pkts=N "
	"trace=FILE|none";

int params_apply_kv(struct link_params p[NDIRS], const char *kv, char *err, size_t errlen)
{
	char key[64];
	const char *eq = strchr(kv, '='), *name = key;
	size_t klen;
	int first = 0, last = NDIRS - 1, rc = 0;

	if (!eq || eq == kv) {
		snprintf(err, errlen, "'%s' is not KEY=VALUE; keys: [a2b.|b2a.]%s", kv, accepted);
		return -1;
	}
	klen = (size_t)(eq - kv);
	if (klen >= sizeof(key)) {
		snprintf(err, errlen, "key in '%s' is too long", kv);
		return -1;
	}
	memcpy(key, kv, klen);
	key[klen] = '\0';
	if (!strncmp(key, "a2b.", 4)) {
		last = DIR_A2B;
		name += 4;
	} else if (!strncmp(key, "b2a.", 4)) {
		first = DIR_B2A;
		name += 4;
	}
	for (int d = first; d <= last && rc == 0; d++)
		rc = set_one(&p[d], name, eq + 1);
	if (rc == -2)
		snprintf(err, errlen, "unknown key '%s'; keys: [a2b.|b2a.]%s", key, accepted);
	else if (rc == -3)
		snprintf(err, errlen, "'%s': the file %s (mahimahi's format: a delivery opportunity of "
			 "%d bytes a line, its time in ms)", kv, trace_error, TRACE_MTU);
	else if (rc)
		snprintf(err, errlen, "bad value in '%s'; forms: %s (MS, PCT may be fractional; "
			 "PCT in 0..100, MS in 0..60000)", kv, accepted);
	return rc ? -1 : 0;
}

json_t *json_text(const char *s)
{
	json_t *j = json_string(s);
	char *copy;

	if (j || !(copy = strdup(s)))
		return j;
	/* Not UTF-8 (a message may quote the user's bytes): each byte above ASCII becomes '?'. */
	for (char *c = copy; *c; c++)
		if ((unsigned char)*c >= 0x80)
			*c = '?';
	j = json_string(copy);
	free(copy);
	return j;
}

/* %.9g-like: a whole value stays an integer ("delay": 25), a fraction is a real ("loss": 0.1). */
static json_t *json_number(double v)
{
	return v == nearbyint(v) && fabs(v) < 1e15 ? json_integer((json_int_t)v) : json_real(v);
}

json_t *params_json(const struct link_params *p)
{
	return json_pack("{s:o, s:o, s:s, s:i, s:o, s:o, s:o, s:o, s:o, s:I, s:I, s:o, s:I, s:o, s:I, s:I}",
			 "delay", json_number(p->delay_ms), "jitter", json_number(p->jitter_ms),
			 "jitter_dist", p->jitter_dist == JITTER_NORMAL ? "normal" : "uniform",
			 "reorder", p->reorder, "loss", json_number(p->loss_pct),
			 "ge_p", json_number(p->ge_p_pct), "ge_r", json_number(p->ge_r_pct),
			 "ge_loss_bad", json_number(p->ge_loss_bad_pct), "ge_loss_good", json_number(p->ge_loss_good_pct),
			 "rate", (json_int_t)p->rate_bps, "limit_bytes", (json_int_t)p->limit_bytes,
			 "limit_ms", json_number(p->limit_ms), "limit_pkts", (json_int_t)p->limit_pkts,
			 "trace", p->trace ? json_text(p->trace->path) : json_null(),
			 "trace_mean_bps", (json_int_t)(p->trace ? nearbyint(p->trace->mean_bps) : 0),
			 "trace_period_ms", (json_int_t)(p->trace ? p->trace->period_ms : 0));
}
