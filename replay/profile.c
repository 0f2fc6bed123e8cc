/* Loads a compiled TRex ASTF profile. The field names and their meaning follow
 * what trex.astf.trex_astf_profile.ASTFProfile.to_json() writes:
 *   buf_list[i]         base64 string, or {"base": b64, "size": N, "fill": b64}:
 *                       base, then fill repeated until N bytes (zeros without fill)
 *   program_list[i]     {"commands": [{"name": "tx", "buf_index"}, {"name": "rx",
 *                       "min_bytes", "clear"?}, {"name": "connect"|"reset"|"nc"}]}
 *   ip_gen_dist_list[i] {"ip_start", "ip_end", "distribution", "dir": "c"|"s"}
 *   templates[i]        {"client_template": {"program_index", "ip_gen": {"dist_client":
 *                       {"index"}, "dist_server": {"index"}}, "port", "cps"},
 *                        "server_template": {"program_index", "assoc": [{"port",
 *                       "ip_start"?, "ip_end"?, "l7_map"?: {"offset", "mask"?, "value"?}}]}} */
#include "profile.h"

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ctx {
	const char *path;
	char *err;
	size_t errlen;
};

static int bad(struct ctx *c, const char *fmt, ...)
{
	va_list ap;
	int n = snprintf(c->err, c->errlen, "%s: ", c->path);

	va_start(ap, fmt);
	if (n >= 0 && (size_t)n < c->errlen)
		vsnprintf(c->err + n, c->errlen - (size_t)n, fmt, ap);
	va_end(ap);
	return -1;
}

static int b64val(unsigned char ch)
{
	if (ch >= 'A' && ch <= 'Z')
		return ch - 'A';
	if (ch >= 'a' && ch <= 'z')
		return ch - 'a' + 26;
	if (ch >= '0' && ch <= '9')
		return ch - '0' + 52;
	if (ch == '+' || ch == '-')
		return 62;
	if (ch == '/' || ch == '_')
		return 63;
	return -1;
}

/* Decodes into a malloc'ed buffer of at least `room` bytes. */
static uint8_t *b64decode(const char *s, size_t n, size_t room, size_t *outlen)
{
	size_t cap = n / 4 * 3 + 3;
	uint8_t *out = malloc(cap > room ? cap : room ? room : 1);
	unsigned acc = 0;
	int bits = 0;
	size_t o = 0;

	if (!out)
		return NULL;
	for (size_t i = 0; i < n; i++) {
		int v;

		if (s[i] == '=' || s[i] == '\n' || s[i] == '\r')
			continue;
		v = b64val((unsigned char)s[i]);
		if (v < 0) {
			free(out);
			return NULL;
		}
		acc = acc << 6 | (unsigned)v;
		bits += 6;
		if (bits >= 8) {
			bits -= 8;
			out[o++] = (uint8_t)(acc >> bits);
		}
	}
	*outlen = o;
	return out;
}

static int load_buf(struct ctx *c, const json_t *j, size_t i, struct buf *b)
{
	const json_t *base = j, *size = NULL, *fill = NULL;

	if (json_is_object(j)) {
		base = json_object_get(j, "base");
		size = json_object_get(j, "size");
		fill = json_object_get(j, "fill");
		if (!json_is_number(size) || json_number_value(size) < 0 || json_number_value(size) > 1e10)
			return bad(c, "buf_list[%zu].size: missing or not a byte count", i);
	}
	if (!json_is_string(base))
		return bad(c, "buf_list[%zu]: expected a base64 string or {\"base\", \"size\", \"fill\"}", i);
	size_t want = size ? (size_t)json_number_value(size) : 0;
	b->data = b64decode(json_string_value(base), json_string_length(base), want, &b->len);
	if (!b->data)
		return bad(c, "buf_list[%zu]: not valid base64", i);
	if (want > b->len) {
		size_t flen = 0;
		uint8_t *f = NULL;

		if (json_is_string(fill)) {
			f = b64decode(json_string_value(fill), json_string_length(fill), 0, &flen);
			if (!f)
				return bad(c, "buf_list[%zu].fill: not valid base64", i);
		}
		for (size_t k = b->len; k < want; k++)
			b->data[k] = flen ? f[(k - b->len) % flen] : 0;
		free(f);
		b->len = want;
	}
	return 0;
}

static int load_program(struct ctx *c, const json_t *j, size_t i, struct profile *p)
{
	const json_t *cmds = json_object_get(j, "commands");
	struct program *pr = &p->progs[i];

	if (!json_is_array(cmds))
		return bad(c, "program_list[%zu].commands: missing or not a list", i);
	pr->ncmds = json_array_size(cmds);
	pr->cmds = calloc(pr->ncmds ? pr->ncmds : 1, sizeof(*pr->cmds));
	if (!pr->cmds)
		return bad(c, "out of memory");
	if (json_is_false(json_object_get(j, "stream")))
		return bad(c, "program_list[%zu] is a UDP (stream=false) program: pep-replay plays TCP only", i);
	for (size_t k = 0; k < pr->ncmds; k++) {
		const json_t *cmd = json_array_get(cmds, k);
		const char *name = json_string_value(json_object_get(cmd, "name"));
		struct cmd *o = &pr->cmds[k];

		if (!name)
			return bad(c, "program_list[%zu].commands[%zu].name: missing", i, k);
		if (!strcmp(name, "tx")) {
			const json_t *bi = json_object_get(cmd, "buf_index");

			if (!json_is_number(bi) || json_number_value(bi) < 0 || (size_t)json_number_value(bi) >= p->nbufs)
				return bad(c, "program_list[%zu].commands[%zu].buf_index: not an index into buf_list "
					   "(%zu buffers)", i, k, p->nbufs);
			o->op = OP_TX;
			o->buf = (uint32_t)json_number_value(bi);
			pr->tx_bytes += p->bufs[o->buf].len;
		} else if (!strcmp(name, "rx")) {
			const json_t *mb = json_object_get(cmd, "min_bytes"), *cl = json_object_get(cmd, "clear");

			if (!json_is_number(mb) || json_number_value(mb) < 0)
				return bad(c, "program_list[%zu].commands[%zu].min_bytes: missing", i, k);
			o->op = OP_RX;
			o->min_bytes = (uint64_t)json_number_value(mb);
			o->clear = json_is_true(cl) || json_number_value(cl) != 0;
		} else if (!strcmp(name, "connect")) {
			o->op = OP_CONNECT;
		} else if (!strcmp(name, "reset")) {
			o->op = OP_RESET;
		} else if (!strcmp(name, "nc")) {
			o->op = OP_NOCLOSE;
		} else {
			return bad(c, "program_list[%zu].commands[%zu]: command '%s' is not played by pep-replay "
				   "(it plays tx, rx, connect, reset, nc: request/response programs without "
				   "delays, loops or variables)", i, k, name);
		}
	}
	return 0;
}

static int parse_ip(struct ctx *c, const json_t *j, const char *where, uint32_t *out)
{
	struct in_addr a;

	if (!json_is_string(j) || inet_pton(AF_INET, json_string_value(j), &a) != 1)
		return bad(c, "%s: missing or not an IPv4 address", where);
	*out = ntohl(a.s_addr);
	return 0;
}

static int get_index(struct ctx *c, const json_t *j, size_t limit, const char *where, size_t *out)
{
	if (!json_is_number(j) || json_number_value(j) < 0 || (size_t)json_number_value(j) >= limit)
		return bad(c, "%s: missing or out of range (0..%zu)", where, limit ? limit - 1 : 0);
	*out = (size_t)json_number_value(j);
	return 0;
}

static int load_assoc(struct ctx *c, const json_t *st, size_t i, struct template *t, struct profile *p)
{
	const json_t *rule = json_array_get(json_object_get(st, "assoc"), 0), *l7, *off, *mask, *val;
	char where[96];

	t->assoc_port = t->port;
	t->assoc_first = 0;
	t->assoc_last = 0xffffffff;
	if (!rule)
		return 0;
	if (json_object_get(rule, "port"))
		t->assoc_port = (uint16_t)json_number_value(json_object_get(rule, "port"));
	if (json_object_get(rule, "ip_start") || json_object_get(rule, "ip_end")) {
		snprintf(where, sizeof(where), "templates[%zu].server_template.assoc[0].ip_start", i);
		if (parse_ip(c, json_object_get(rule, "ip_start"), where, &t->assoc_first))
			return -1;
		snprintf(where, sizeof(where), "templates[%zu].server_template.assoc[0].ip_end", i);
		if (parse_ip(c, json_object_get(rule, "ip_end"), where, &t->assoc_last))
			return -1;
	}
	l7 = json_object_get(rule, "l7_map");
	if (!l7)
		return 0;
	off = json_object_get(l7, "offset");
	mask = json_object_get(l7, "mask");
	val = json_object_get(l7, "value");
	if (json_array_size(off) == 0 || json_array_size(off) > L7_MAX)
		return bad(c, "templates[%zu] l7_map.offset: expected a list of 1..%d byte offsets", i, L7_MAX);
	/* Without "value", TRex takes the bytes at the offsets from the client's first send. */
	const struct program *cp = &p->progs[t->cprog];
	const struct buf *first = NULL;

	for (size_t k = 0; k < cp->ncmds && !first; k++)
		if (cp->cmds[k].op == OP_TX)
			first = &p->bufs[cp->cmds[k].buf];
	t->l7n = json_array_size(off);
	for (size_t k = 0; k < t->l7n; k++) {
		const json_t *ok = json_array_get(off, k);
		double o = json_number_value(ok);

		if (!json_is_number(ok) || o < 0 || o > L7_MAX_OFFSET)
			return bad(c, "templates[%zu] l7_map.offset[%zu]: not a byte offset 0..%d of the request", i, k,
				   L7_MAX_OFFSET);
		t->l7off[k] = (uint16_t)o;
		t->l7mask[k] = json_array_get(mask, k) ? (uint8_t)json_number_value(json_array_get(mask, k)) : 0xff;
		if (val) {
			if (!json_array_get(val, k))
				return bad(c, "templates[%zu] l7_map.value: shorter than offset", i);
			t->l7val[k] = (uint8_t)json_number_value(json_array_get(val, k));
		} else {
			if (!first || t->l7off[k] >= first->len)
				return bad(c, "templates[%zu] l7_map.offset[%zu]=%u is past the client's first send",
					   i, k, t->l7off[k]);
			t->l7val[k] = first->data[t->l7off[k]];
		}
		t->l7val[k] &= t->l7mask[k];
		if ((size_t)t->l7off[k] + 1 > p->l7_need)
			p->l7_need = (size_t)t->l7off[k] + 1;
	}
	return 0;
}

static int load_template(struct ctx *c, const json_t *j, size_t i, struct profile *p)
{
	struct template *t = &p->tpl[i];
	const json_t *ct = json_object_get(j, "client_template"), *st = json_object_get(j, "server_template");
	const json_t *gen = json_object_get(ct, "ip_gen");
	char where[96];

	if (!ct || !st)
		return bad(c, "templates[%zu]: needs client_template and server_template", i);
	snprintf(where, sizeof(where), "templates[%zu].client_template.program_index", i);
	if (get_index(c, json_object_get(ct, "program_index"), p->nprogs, where, &t->cprog))
		return -1;
	snprintf(where, sizeof(where), "templates[%zu].server_template.program_index", i);
	if (get_index(c, json_object_get(st, "program_index"), p->nprogs, where, &t->sprog))
		return -1;
	snprintf(where, sizeof(where), "templates[%zu].client_template.ip_gen.dist_client.index", i);
	if (get_index(c, json_object_get(json_object_get(gen, "dist_client"), "index"), p->ndists, where, &t->cdist))
		return -1;
	snprintf(where, sizeof(where), "templates[%zu].client_template.ip_gen.dist_server.index", i);
	if (get_index(c, json_object_get(json_object_get(gen, "dist_server"), "index"), p->ndists, where, &t->sdist))
		return -1;
	const json_t *port = json_object_get(ct, "port");
	double cps = json_number_value(json_object_get(ct, "cps"));

	if (!json_is_number(port) || json_number_value(port) < 1 || json_number_value(port) > 65535)
		return bad(c, "templates[%zu].client_template.port: missing or not a TCP port", i);
	t->port = (uint16_t)json_number_value(port);
	t->cps = cps > 0 ? cps : 1;
	p->cps_sum += t->cps;
	return load_assoc(c, st, i, t, p);
}

static int load_tree(struct ctx *c, const json_t *root, struct profile *p)
{
	const json_t *bufs = json_object_get(root, "buf_list"), *progs = json_object_get(root, "program_list");
	const json_t *dists = json_object_get(root, "ip_gen_dist_list"), *tpls = json_object_get(root, "templates");

	if (!json_is_array(bufs) || !json_is_array(progs) || !json_is_array(dists) || !json_is_array(tpls))
		return bad(c, "not a compiled ASTF profile (needs buf_list, program_list, ip_gen_dist_list, "
			   "templates); compile the .py first: replay/compile_profile.py PROFILE.py OUT.json");
	if (json_array_size(tpls) == 0)
		return bad(c, "templates: empty; nothing to play");
	/* Counts first: profile_free() frees every slot, loaded or still zeroed. */
	p->nbufs = json_array_size(bufs);
	p->nprogs = json_array_size(progs);
	p->ndists = json_array_size(dists);
	p->ntpl = json_array_size(tpls);
	p->bufs = calloc(p->nbufs + 1, sizeof(*p->bufs));
	p->progs = calloc(p->nprogs + 1, sizeof(*p->progs));
	p->dists = calloc(p->ndists + 1, sizeof(*p->dists));
	p->tpl = calloc(p->ntpl + 1, sizeof(*p->tpl));
	if (!p->bufs || !p->progs || !p->dists || !p->tpl)
		return bad(c, "out of memory");
	for (size_t i = 0; i < p->nbufs; i++)
		if (load_buf(c, json_array_get(bufs, i), i, &p->bufs[i]))
			return -1;
	for (size_t i = 0; i < p->nprogs; i++)
		if (load_program(c, json_array_get(progs, i), i, p))
			return -1;
	for (size_t i = 0; i < p->ndists; i++) {
		const json_t *d = json_array_get(dists, i);
		const char *dist = json_string_value(json_object_get(d, "distribution"));
		char where[64];

		snprintf(where, sizeof(where), "ip_gen_dist_list[%zu].ip_start", i);
		if (parse_ip(c, json_object_get(d, "ip_start"), where, &p->dists[i].first))
			return -1;
		snprintf(where, sizeof(where), "ip_gen_dist_list[%zu].ip_end", i);
		if (parse_ip(c, json_object_get(d, "ip_end"), where, &p->dists[i].last))
			return -1;
		if (p->dists[i].last < p->dists[i].first)
			return bad(c, "ip_gen_dist_list[%zu]: ip_end is before ip_start", i);
		p->dists[i].random = dist && !strcmp(dist, "rand");
	}
	for (size_t i = 0; i < p->ntpl; i++)
		if (load_template(c, json_array_get(tpls, i), i, p))
			return -1;
	return 0;
}

int profile_load(struct profile *p, const char *path, char *err, size_t errlen)
{
	struct ctx c = { .path = path, .err = err, .errlen = errlen };
	json_error_t jerr;
	FILE *f = fopen(path, "rb");
	json_t *root;
	int rc;

	memset(p, 0, sizeof(*p));
	if (!f)
		return bad(&c, "cannot open: %s", strerror(errno));
	/* Any top-level value: a number or a list gets the message below that says what a profile is. */
	root = json_loadf(f, JSON_DECODE_ANY, &jerr);
	fclose(f);
	if (!root)
		return bad(&c, "not valid JSON: line %d, column %d: %s", jerr.line, jerr.column, jerr.text);
	rc = load_tree(&c, root, p);
	json_decref(root);
	if (rc)
		profile_free(p);
	return rc;
}

void profile_free(struct profile *p)
{
	for (size_t i = 0; p->bufs && i < p->nbufs; i++)
		free(p->bufs[i].data);
	for (size_t i = 0; p->progs && i < p->nprogs; i++)
		free(p->progs[i].cmds);
	free(p->bufs);
	free(p->progs);
	free(p->dists);
	free(p->tpl);
	memset(p, 0, sizeof(*p));
}
