/* Recursive-descent JSON parser (RFC 8259), building a tree of struct jnode. */
#include "json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct parser {
	const char *s, *end;
	const char *start;
	char *err;
	size_t errlen;
	int failed;
	int depth;
};

static void fail(struct parser *p, const char *what)
{
	int line = 1;

	if (p->failed)
		return;
	p->failed = 1;
	for (const char *c = p->start; c < p->s && c < p->end; c++)
		line += *c == '\n';
	snprintf(p->err, p->errlen, "line %d: %s", line, what);
}

static void skip_ws(struct parser *p)
{
	while (p->s < p->end && (*p->s == ' ' || *p->s == '\t' || *p->s == '\n' || *p->s == '\r'))
		p->s++;
}

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

static int read_u4(struct parser *p, unsigned *out)
{
	unsigned v = 0;

	if (p->end - p->s < 4) {
		fail(p, "short \\u escape");
		return -1;
	}
	for (int i = 0; i < 4; i++) {
		int h = hexval(p->s[i]);

		if (h < 0) {
			fail(p, "bad \\u escape");
			return -1;
		}
		v = v << 4 | (unsigned)h;
	}
	p->s += 4;
	*out = v;
	return 0;
}

static size_t put_utf8(char *o, unsigned cp)
{
	if (cp < 0x80) {
		o[0] = (char)cp;
		return 1;
	}
	if (cp < 0x800) {
		o[0] = (char)(0xc0 | cp >> 6);
		o[1] = (char)(0x80 | (cp & 0x3f));
		return 2;
	}
	if (cp < 0x10000) {
		o[0] = (char)(0xe0 | cp >> 12);
		o[1] = (char)(0x80 | (cp >> 6 & 0x3f));
		o[2] = (char)(0x80 | (cp & 0x3f));
		return 3;
	}
	o[0] = (char)(0xf0 | cp >> 18);
	o[1] = (char)(0x80 | (cp >> 12 & 0x3f));
	o[2] = (char)(0x80 | (cp >> 6 & 0x3f));
	o[3] = (char)(0x80 | (cp & 0x3f));
	return 4;
}

/* p->s is just past the opening quote. An escape never grows the text, so
 * the unescaped string fits in the raw length. */
static char *parse_string(struct parser *p, size_t *len)
{
	const char *q = p->s;
	char *out, *o;

	while (q < p->end && *q != '"')
		q += *q == '\\' ? 2 : 1;
	if (q >= p->end) {
		fail(p, "unterminated string");
		return NULL;
	}
	out = malloc((size_t)(q - p->s) + 1);
	if (!out) {
		fail(p, "out of memory");
		return NULL;
	}
	o = out;
	while (p->s < q) {
		char c = *p->s++;
		unsigned cp, lo;

		if (c != '\\') {
			*o++ = c;
			continue;
		}
		c = *p->s++;
		switch (c) {
		case '"': *o++ = '"'; break;
		case '\\': *o++ = '\\'; break;
		case '/': *o++ = '/'; break;
		case 'b': *o++ = '\b'; break;
		case 'f': *o++ = '\f'; break;
		case 'n': *o++ = '\n'; break;
		case 'r': *o++ = '\r'; break;
		case 't': *o++ = '\t'; break;
		case 'u':
			if (read_u4(p, &cp))
				goto bad;
			if (cp >= 0xd800 && cp < 0xdc00 && q - p->s >= 6 && p->s[0] == '\\' && p->s[1] == 'u') {
				p->s += 2;
				if (read_u4(p, &lo))
					goto bad;
				cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
			}
			o += put_utf8(o, cp);
			break;
		default:
			fail(p, "bad escape in string");
			goto bad;
		}
	}
	p->s = q + 1;
	*o = 0;
	*len = (size_t)(o - out);
	return out;
bad:
	free(out);
	return NULL;
}

static int parse_value(struct parser *p, struct jnode *n);

/* Appends a child to n and parses it; n owns key from here on, even on failure. */
static int push(struct parser *p, struct jnode *n, size_t *cap, char *key)
{
	if (n->len == *cap) {
		size_t nc = *cap ? *cap * 2 : 8;
		struct jnode *k = realloc(n->kids, nc * sizeof(*k));

		if (!k) {
			free(key);
			fail(p, "out of memory");
			return -1;
		}
		n->kids = k;
		if (n->type == J_OBJ) {
			char **ks = realloc(n->keys, nc * sizeof(*ks));

			if (!ks) {
				free(key);
				fail(p, "out of memory");
				return -1;
			}
			n->keys = ks;
		}
		*cap = nc;
	}
	memset(&n->kids[n->len], 0, sizeof(n->kids[0]));
	if (n->type == J_OBJ)
		n->keys[n->len] = key;
	n->len++;
	return parse_value(p, &n->kids[n->len - 1]);
}

static int parse_container(struct parser *p, struct jnode *n, char close)
{
	size_t cap = 0;

	p->s++;
	skip_ws(p);
	if (p->s < p->end && *p->s == close) {
		p->s++;
		return 0;
	}
	for (;;) {
		char *key = NULL;

		skip_ws(p);
		if (n->type == J_OBJ) {
			size_t klen;

			if (p->s >= p->end || *p->s != '"') {
				fail(p, "expected a \"key\" in object");
				return -1;
			}
			p->s++;
			key = parse_string(p, &klen);
			if (!key)
				return -1;
			skip_ws(p);
			if (p->s >= p->end || *p->s != ':') {
				free(key);
				fail(p, "expected ':' after key");
				return -1;
			}
			p->s++;
		}
		if (push(p, n, &cap, key))
			return -1;
		skip_ws(p);
		if (p->s < p->end && *p->s == ',') {
			p->s++;
			continue;
		}
		if (p->s < p->end && *p->s == close) {
			p->s++;
			return 0;
		}
		fail(p, close == ']' ? "expected ',' or ']'" : "expected ',' or '}'");
		return -1;
	}
}

static int parse_value(struct parser *p, struct jnode *n)
{
	skip_ws(p);
	if (p->s >= p->end) {
		fail(p, "unexpected end of input");
		return -1;
	}
	if (++p->depth > 64) {
		fail(p, "nested too deep");
		return -1;
	}
	int rc = 0;

	switch (*p->s) {
	case '{':
		n->type = J_OBJ;
		rc = parse_container(p, n, '}');
		break;
	case '[':
		n->type = J_ARR;
		rc = parse_container(p, n, ']');
		break;
	case '"':
		p->s++;
		n->type = J_STR;
		n->str = parse_string(p, &n->len);
		rc = n->str ? 0 : -1;
		break;
	case 't':
	case 'f':
	case 'n': {
		static const struct { const char *w; enum jtype t; double v; } lit[] = {
			{ "true", J_BOOL, 1 }, { "false", J_BOOL, 0 }, { "null", J_NULL, 0 },
		};
		rc = -1;
		for (size_t i = 0; i < 3; i++) {
			size_t l = strlen(lit[i].w);

			if ((size_t)(p->end - p->s) >= l && !memcmp(p->s, lit[i].w, l)) {
				n->type = lit[i].t;
				n->num = lit[i].v;
				p->s += l;
				rc = 0;
				break;
			}
		}
		if (rc)
			fail(p, "unknown literal");
		break;
	}
	default: {
		char buf[64], *e;
		size_t l = 0;

		while (p->s + l < p->end && l < sizeof(buf) - 1 && strchr("+-0123456789.eE", p->s[l]))
			l++;
		memcpy(buf, p->s, l);
		buf[l] = 0;
		n->type = J_NUM;
		n->num = strtod(buf, &e);
		if (l == 0 || *e) {
			fail(p, "bad number or unexpected character");
			rc = -1;
		} else {
			p->s += l;
		}
	}
	}
	p->depth--;
	return rc;
}

static void free_node(struct jnode *n)
{
	for (size_t i = 0; (n->type == J_ARR || n->type == J_OBJ) && i < n->len; i++) {
		free_node(&n->kids[i]);
		if (n->type == J_OBJ)
			free(n->keys[i]);
	}
	if (n->type == J_ARR || n->type == J_OBJ) {
		free(n->kids);
		free(n->keys);
	}
	if (n->type == J_STR)
		free(n->str);
}

void json_free(struct jnode *root)
{
	if (!root)
		return;
	free_node(root);
	free(root);
}

struct jnode *json_parse(const char *text, size_t n, char *err, size_t errlen)
{
	struct parser p = { .s = text, .end = text + n, .start = text, .err = err, .errlen = errlen };
	struct jnode *root = calloc(1, sizeof(*root));

	if (!root) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	if (parse_value(&p, root) == 0) {
		skip_ws(&p);
		if (p.s == p.end)
			return root;
		fail(&p, "trailing characters after the document");
	}
	json_free(root);
	return NULL;
}

const struct jnode *json_get(const struct jnode *o, const char *key)
{
	if (!o || o->type != J_OBJ)
		return NULL;
	for (size_t i = 0; i < o->len; i++)
		if (!strcmp(o->keys[i], key))
			return &o->kids[i];
	return NULL;
}

const struct jnode *json_at(const struct jnode *a, size_t i)
{
	if (!a || a->type != J_ARR || i >= a->len)
		return NULL;
	return &a->kids[i];
}
