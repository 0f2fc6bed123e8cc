/* A compiled TRex ASTF profile (ASTFProfile.to_json(), as written by
 * compile_profile.py), loaded into the form pep-replay plays. */
#ifndef PEP_REPLAY_PROFILE_H
#define PEP_REPLAY_PROFILE_H

#include <stddef.h>
#include <stdint.h>

#define L7_MAX 32              /* l7_map offsets per association rule */
#define L7_MAX_OFFSET 255      /* a server holds this many request bytes to pick the template */

enum op {
	OP_TX,                 /* send buf */
	OP_RX,                 /* wait until rx bytes (since the last clear) reach min_bytes */
	OP_CONNECT,            /* wait until connected/accepted: always true when a program runs */
	OP_RESET,              /* abort with RST, ends the program */
	OP_NOCLOSE,            /* wait for the peer to close, then close */
};

struct cmd {
	enum op op;
	uint32_t buf;          /* OP_TX */
	uint64_t min_bytes;    /* OP_RX */
	int clear;             /* OP_RX: reset the rx counter once reached */
};

struct buf {
	uint8_t *data;
	size_t len;
};

struct program {
	struct cmd *cmds;
	size_t ncmds;
	uint64_t tx_bytes;     /* sum of its tx buffers: what its peer must receive */
};

struct ipdist {
	uint32_t first, last;  /* host order, inclusive */
	int random;            /* "rand" distribution, else "seq" */
};

struct template {
	size_t cprog, sprog;   /* program indexes, client and server side */
	size_t cdist, sdist;   /* ip_gen_dist_list indexes */
	uint16_t port;         /* destination port */
	double cps;            /* connections/s at multiplier 1: the template's weight */
	/* server association rule (only the first rule is used, as TRex does) */
	uint16_t assoc_port;
	uint32_t assoc_first, assoc_last;  /* 0/0xffffffff when the rule has no ip range */
	size_t l7n;            /* 0: the port (and range) alone picks this template */
	uint16_t l7off[L7_MAX];
	uint8_t l7mask[L7_MAX];
	uint8_t l7val[L7_MAX];
};

struct profile {
	struct buf *bufs;
	size_t nbufs;
	struct program *progs;
	size_t nprogs;
	struct ipdist *dists;
	size_t ndists;
	struct template *tpl;
	size_t ntpl;
	double cps_sum;
	size_t l7_need;        /* bytes a server must see before it can pick a template */
};

/* Loads path; on failure returns -1 with a message naming the file and field in err. */
int profile_load(struct profile *p, const char *path, char *err, size_t errlen);
void profile_free(struct profile *p);

#endif
