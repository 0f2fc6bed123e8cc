/* pep-replay: plays a compiled TRex ASTF profile on Linux sockets.
 *
 *   pep-replay server --profile P.json [--duration S] [--json F] [--peers F]
 *   pep-replay client --profile P.json [--duration S] [--rate CPS | --concurrency N] [--json F]
 *
 * One thread, one epoll loop, non-blocking sockets, edge-triggered connection
 * events: the aim is that the load generator is never the bottleneck of a
 * proxy test. Each connection runs one template's program (tx/rx commands),
 * and every received byte is compared with what the peer's program sends.
 * See replay/README.md for the full interface. */
#define _GNU_SOURCE
#include "profile.h"
#include "report.h"

#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#ifndef IP_BIND_ADDRESS_NO_PORT
#define IP_BIND_ADDRESS_NO_PORT 24
#endif

#define MAX_EVENTS 1024
#define RXBUF (256 * 1024)

struct opts {
	const char *role, *profile, *json, *peers;
	double duration, rate;
	long concurrency, max_inflight, timeout_ms, drain_ms;
	uint32_t clients_first, clients_last; /* 0/0: the profile's client range */
	int quiet;
	int client;            /* role "client" (else server, or check) */
	uint64_t seed;
};

struct conn {
	int fd;
	int tpl;               /* -1 on the server until the request picks a template */
	int listener;          /* server: listening socket index (local address and port) */
	uint32_t cmd;          /* next command of the program */
	size_t tx_off;         /* bytes of the current tx buffer already sent */
	uint64_t rx_count;     /* rx bytes since the last "clear", for rx watermarks */
	uint64_t rx_total;
	uint32_t exp_cmd;      /* position in the peer's tx stream: command index ... */
	size_t exp_off;        /* ... and offset in that command's buffer */
	uint64_t t_start, t_conn, t_first;
	uint32_t peer;         /* client: our source address; server: the client's */
	int connected, peer_closed;
	uint16_t npend;        /* server: request bytes held until the template is known */
	uint8_t pend[L7_MAX_OFFSET + 1];
	struct conn *prev, *next; /* in-flight list, oldest first, for timeouts */
};

struct listener {
	int fd;
	uint32_t addr;
	uint16_t port;
};

/* distinct IPv4 addresses, open addressing; enough for a /16 of clients */
#define ADDRSET_SIZE (1u << 17)
struct addrset {
	uint32_t *slot;        /* address + 1; 0 = empty */
	uint64_t *count;
	size_t n;
};

static struct {
	struct opts o;
	struct profile p;
	struct report r;
	int ep;
	struct conn *pool, *free_list, *head, *tail;
	size_t inflight;
	struct listener *lst;
	size_t nlst;
	struct addrset addrs;
	uint64_t rng;
	uint32_t *dist_next;   /* per ip dist: next address for "seq" */
	uint8_t *rxbuf;
	uint64_t t_first_accept, t_last_end; /* server: its busy time, for rates */
	int defer_accept;
	volatile sig_atomic_t stop;
} g;

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t rnd(void)
{
	/* xorshift64*: fast, and good enough to pick templates and addresses */
	g.rng ^= g.rng >> 12;
	g.rng ^= g.rng << 25;
	g.rng ^= g.rng >> 27;
	return g.rng * 0x2545F4914F6CDD1Dull;
}

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "pep-replay %s: ", g.o.role ? g.o.role : "");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(2);
}

static const char *ipstr(uint32_t a, char *buf)
{
	struct in_addr in = { .s_addr = htonl(a) };

	return inet_ntop(AF_INET, &in, buf, INET_ADDRSTRLEN);
}

static void addr_note(uint32_t a)
{
	uint32_t h = (a * 2654435761u) & (ADDRSET_SIZE - 1);

	/* Stop adding at half full: the count is then a lower bound, which is
	 * all a test needs, and probing stays short. */
	for (;;) {
		if (g.addrs.slot[h] == a + 1) {
			g.addrs.count[h]++;
			return;
		}
		if (!g.addrs.slot[h]) {
			if (g.addrs.n >= ADDRSET_SIZE / 2)
				return;
			g.addrs.slot[h] = a + 1;
			g.addrs.count[h] = 1;
			g.addrs.n++;
			return;
		}
		h = (h + 1) & (ADDRSET_SIZE - 1);
	}
}

/* ---- connection pool and in-flight list -------------------------------- */

static struct conn *conn_get(void)
{
	struct conn *c = g.free_list;

	if (!c)
		return NULL;
	g.free_list = c->next;
	memset(c, 0, sizeof(*c));
	c->fd = -1;
	c->tpl = -1;
	c->prev = g.tail;
	if (g.tail)
		g.tail->next = c;
	else
		g.head = c;
	g.tail = c;
	g.inflight++;
	return c;
}

static void conn_put(struct conn *c)
{
	if (c->prev)
		c->prev->next = c->next;
	else
		g.head = c->next;
	if (c->next)
		c->next->prev = c->prev;
	else
		g.tail = c->prev;
	c->next = g.free_list;
	g.free_list = c;
	g.inflight--;
}

static const struct program *my_prog(const struct conn *c)
{
	const struct template *t = &g.p.tpl[c->tpl];

	return &g.p.progs[g.o.client ? t->cprog : t->sprog];
}

static const struct program *peer_prog(const struct conn *c)
{
	const struct template *t = &g.p.tpl[c->tpl];

	return &g.p.progs[g.o.client ? t->sprog : t->cprog];
}

static void conn_end(struct conn *c, int ok, enum err_kind why)
{
	uint64_t t = now_ns();

	g.t_last_end = t;
	if (c->fd >= 0) {
		if (!ok) {
			/* A failed transaction ends with RST, not FIN: no TIME_WAIT
			 * left behind, and the peer sees the failure at once. */
			struct linger lg = { .l_onoff = 1, .l_linger = 0 };

			setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
		}
		close(c->fd); /* also drops it from the epoll set */
	}
	if (ok) {
		g.r.trans_ok++;
		g.r.conn_closed++;
		samples_add(&g.r.complete, t - c->t_start);
		if (c->tpl >= 0)
			g.r.tpl[c->tpl].ok++;
	} else {
		g.r.trans_failed++;
		g.r.errors[why]++;
		if (c->tpl >= 0)
			g.r.tpl[c->tpl].failed++;
	}
	conn_put(c);
}

/* ---- running a program ------------------------------------------------- */

/* Compares received bytes with the peer's tx stream; 0 if they match. */
static int check_rx(struct conn *c, const uint8_t *d, size_t n, enum err_kind *why)
{
	const struct program *pp = peer_prog(c);

	while (n) {
		while (c->exp_cmd < pp->ncmds && pp->cmds[c->exp_cmd].op != OP_TX)
			c->exp_cmd++;
		if (c->exp_cmd >= pp->ncmds) {
			*why = ERR_overrun;
			return -1;
		}
		const struct buf *b = &g.p.bufs[pp->cmds[c->exp_cmd].buf];
		size_t k = b->len - c->exp_off < n ? b->len - c->exp_off : n;

		if (memcmp(b->data + c->exp_off, d, k)) {
			*why = ERR_mismatch;
			return -1;
		}
		d += k;
		n -= k;
		c->exp_off += k;
		if (c->exp_off == b->len) {
			c->exp_off = 0;
			c->exp_cmd++;
		}
	}
	return 0;
}

static enum err_kind errno_kind(int e, int connected)
{
	if (!connected) {
		switch (e) {
		case ECONNREFUSED: return ERR_connect_refused;
		case ETIMEDOUT: return ERR_connect_timeout;
		case EHOSTUNREACH:
		case ENETUNREACH: return ERR_connect_unreachable;
		default: return ERR_connect_other;
		}
	}
	if (e == ECONNRESET || e == EPIPE)
		return ERR_reset;
	if (e == ETIMEDOUT)
		return ERR_timeout;
	return ERR_other;
}

/* Runs commands until one has to wait. Returns 1 when the connection ended. */
static int advance(struct conn *c)
{
	const struct program *pr = my_prog(c);

	while (c->cmd < pr->ncmds) {
		const struct cmd *cmd = &pr->cmds[c->cmd];

		switch (cmd->op) {
		case OP_CONNECT:
			break;
		case OP_TX: {
			const struct buf *b = &g.p.bufs[cmd->buf];

			while (c->tx_off < b->len) {
				ssize_t w = send(c->fd, b->data + c->tx_off, b->len - c->tx_off, MSG_NOSIGNAL);

				if (w < 0) {
					if (errno == EAGAIN || errno == EWOULDBLOCK)
						return 0; /* EPOLLOUT edge will call us again */
					if (errno == EINTR)
						continue;
					conn_end(c, 0, errno_kind(errno, 1));
					return 1;
				}
				c->tx_off += (size_t)w;
				g.r.bytes_tx += (uint64_t)w;
				g.r.tpl[c->tpl].bytes_tx += (uint64_t)w;
			}
			c->tx_off = 0;
			break;
		}
		case OP_RX:
			if (c->rx_count < cmd->min_bytes) {
				if (c->peer_closed) {
					conn_end(c, 0, ERR_short_read);
					return 1;
				}
				return 0;
			}
			if (cmd->clear)
				c->rx_count -= cmd->min_bytes;
			break;
		case OP_RESET:
			/* a deliberate RST ends the program as the profile says */
			{
				struct linger lg = { .l_onoff = 1, .l_linger = 0 };

				setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
			}
			conn_end(c, 1, ERR_other);
			return 1;
		case OP_NOCLOSE:
			if (!c->peer_closed)
				return 0;
			break;
		}
		c->cmd++;
	}
	conn_end(c, 1, ERR_other);
	return 1;
}

/* Server: picks the template from local address, port and the request's first
 * bytes (d, n). Returns 1 when picked, 0 when more bytes are needed, -1 when
 * nothing matches. */
static int pick_template(struct conn *c, const uint8_t *d, size_t n)
{
	const struct listener *l = &g.lst[c->listener];

	for (size_t i = 0; i < g.p.ntpl; i++) {
		const struct template *t = &g.p.tpl[i];
		size_t k;

		if (t->assoc_port != l->port || l->addr < t->assoc_first || l->addr > t->assoc_last)
			continue;
		for (k = 0; k < t->l7n; k++) {
			if (t->l7off[k] >= n)
				return 0;
			if ((d[t->l7off[k]] & t->l7mask[k]) != t->l7val[k])
				break;
		}
		if (k == t->l7n) {
			c->tpl = (int)i;
			return 1;
		}
	}
	return -1;
}

/* Counts and checks received bytes. Returns 1 when the connection ended. */
static int account(struct conn *c, const uint8_t *d, size_t n)
{
	enum err_kind why;

	if (!c->t_first) {
		c->t_first = now_ns();
		if (g.o.client)
			samples_add(&g.r.ttfb, c->t_first - c->t_start);
	}
	g.r.bytes_rx += n;
	g.r.tpl[c->tpl].bytes_rx += n;
	if (check_rx(c, d, n, &why)) {
		conn_end(c, 0, why);
		return 1;
	}
	c->rx_count += n;
	c->rx_total += n;
	return 0;
}

/* Server, template not known yet: the request's first bytes pick it. They are
 * held in c->pend while too few have come. Returns 1 when the connection ended. */
static int first_bytes(struct conn *c, const uint8_t *d, size_t n)
{
	size_t take;
	int r;

	if (!c->npend) {
		r = pick_template(c, d, n);
		if (r == 1)
			return account(c, d, n);
	} else {
		r = 0;
	}
	/* Hold what fits (the profile loader keeps l7 offsets inside pend). */
	take = sizeof(c->pend) - c->npend < n ? sizeof(c->pend) - c->npend : n;
	memcpy(c->pend + c->npend, d, take);
	c->npend += (uint16_t)take;
	if (r == 0)
		r = pick_template(c, c->pend, c->npend);
	if (r < 0) {
		conn_end(c, 0, ERR_no_template);
		return 1;
	}
	if (r == 0)
		return 0;
	if (account(c, c->pend, c->npend))
		return 1;
	return n > take ? account(c, d + take, n - take) : 0;
}

static void on_readable(struct conn *c)
{
	for (;;) {
		ssize_t n = recv(c->fd, g.rxbuf, RXBUF, 0);

		if (n > 0) {
			if (c->tpl < 0 ? first_bytes(c, g.rxbuf, (size_t)n) : account(c, g.rxbuf, (size_t)n))
				return;
			if ((size_t)n < RXBUF)
				break; /* drained (a short read): saves one EAGAIN recv */
			continue;
		}
		if (n == 0) {
			c->peer_closed = 1;
			break;
		}
		if (errno == EINTR)
			continue;
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			break;
		conn_end(c, 0, errno_kind(errno, 1));
		return;
	}
	if (c->tpl < 0) {
		if (c->peer_closed)
			conn_end(c, 0, ERR_no_template);
		return;
	}
	if (advance(c))
		return;
	if (c->peer_closed) {
		/* The peer is done and our program still waits: it never finishes. */
		const struct program *pr = my_prog(c);

		conn_end(c, 0, c->cmd < pr->ncmds && pr->cmds[c->cmd].op == OP_TX ? ERR_reset : ERR_short_read);
	}
}

static void on_event(struct conn *c, uint32_t ev)
{
	if (!c->connected) {
		if (ev & (EPOLLERR | EPOLLHUP)) {
			int e = 0;
			socklen_t l = sizeof(e);

			getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &e, &l);
			conn_end(c, 0, errno_kind(e ? e : ECONNREFUSED, 0));
			return;
		}
		if (!(ev & EPOLLOUT))
			return;
		c->connected = 1;
		c->t_conn = now_ns();
		g.r.conn_established++;
		samples_add(&g.r.connect, c->t_conn - c->t_start);
		if (advance(c))
			return;
	}
	if (c->tpl < 0) {
		/* Server: the template (and so the program) is known after the
		 * first bytes of the request; a port-only profile knows it now. */
		if (!g.p.l7_need && pick_template(c, NULL, 0) < 0) {
			conn_end(c, 0, ERR_no_template);
			return;
		}
		if (c->tpl >= 0 && advance(c)) /* the server program may start by sending */
			return;
	}
	if (ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
		on_readable(c);
		return;
	}
	if ((ev & EPOLLOUT) && c->tpl >= 0)
		advance(c);
}

static int watch(int fd, void *ptr, uint32_t events)
{
	struct epoll_event e = { .events = events, .data.ptr = ptr };

	return epoll_ctl(g.ep, EPOLL_CTL_ADD, fd, &e);
}

/* ---- client ------------------------------------------------------------ */

static uint32_t next_addr(size_t dist, uint32_t first, uint32_t last)
{
	uint32_t span = last - first + 1;

	if (g.p.dists[dist].random)
		return first + (uint32_t)(rnd() % span);
	return first + (g.dist_next[dist]++ % span);
}

static int pick_weighted(void)
{
	double x = (double)(rnd() >> 11) / 9007199254740992.0 * g.p.cps_sum;

	for (size_t i = 0; i < g.p.ntpl; i++) {
		x -= g.p.tpl[i].cps;
		if (x < 0)
			return (int)i;
	}
	return (int)g.p.ntpl - 1;
}

static void client_dist_range(const struct template *t, uint32_t *first, uint32_t *last)
{
	*first = g.p.dists[t->cdist].first;
	*last = g.p.dists[t->cdist].last;
	if (g.o.clients_first) {
		*first = g.o.clients_first;
		*last = g.o.clients_last;
	}
}

static void open_one(void)
{
	struct conn *c = conn_get();
	const struct template *t;
	struct sockaddr_in src = { .sin_family = AF_INET }, dst = { .sin_family = AF_INET };
	uint32_t cf, cl;
	int one = 1;

	if (!c)
		return;
	c->tpl = pick_weighted();
	t = &g.p.tpl[c->tpl];
	client_dist_range(t, &cf, &cl);
	c->peer = next_addr(t->cdist, cf, cl);
	src.sin_addr.s_addr = htonl(c->peer);
	dst.sin_addr.s_addr = htonl(next_addr(t->sdist, g.p.dists[t->sdist].first, g.p.dists[t->sdist].last));
	dst.sin_port = htons(t->port);
	c->t_start = now_ns();
	g.r.conn_attempts++;
	addr_note(c->peer);

	c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (c->fd < 0) {
		conn_end(c, 0, ERR_other);
		return;
	}
	/* Let connect() pick the port per 4-tuple, not bind() per address:
	 * otherwise ~28k connections per source address exhaust its ports. */
	setsockopt(c->fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof(one));
	if (bind(c->fd, (struct sockaddr *)&src, sizeof(src))) {
		conn_end(c, 0, ERR_bind);
		return;
	}
	if (connect(c->fd, (struct sockaddr *)&dst, sizeof(dst)) && errno != EINPROGRESS) {
		conn_end(c, 0, errno == EADDRNOTAVAIL ? ERR_ports_exhausted : errno_kind(errno, 0));
		return;
	}
	if (watch(c->fd, c, EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET)) {
		conn_end(c, 0, ERR_other);
		return;
	}
}

/* Every source address must be on an interface here: say which is missing
 * before starting, instead of counting thousands of bind errors. */
static void check_sources(void)
{
	uint32_t done_first = 1, done_last = 0; /* templates usually share one range */

	for (size_t i = 0; i < g.p.ntpl; i++) {
		uint32_t first, last;

		client_dist_range(&g.p.tpl[i], &first, &last);
		if (first == done_first && last == done_last)
			continue;
		done_first = first;
		done_last = last;
		for (uint64_t a = first; a <= last; a++) {
			struct sockaddr_in s = { .sin_family = AF_INET, .sin_addr.s_addr = htonl((uint32_t)a) };
			int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
			char b1[INET_ADDRSTRLEN], b2[INET_ADDRSTRLEN], b3[INET_ADDRSTRLEN];

			if (fd < 0)
				die("socket: %s", strerror(errno));
			setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof(one));
			if (bind(fd, (struct sockaddr *)&s, sizeof(s)))
				die("source address %s (client range %s-%s of template %zu) cannot be bound: %s; "
				    "add the range to this namespace's interface (ip addr add %s/24 dev IF ...) "
				    "or narrow it with --clients FIRST-LAST",
				    ipstr((uint32_t)a, b1), ipstr(first, b2), ipstr(last, b3), i, strerror(errno),
				    ipstr((uint32_t)a, b1));
			close(fd);
		}
	}
}

static void expire(uint64_t now, uint64_t limit_ns, enum err_kind why)
{
	while (g.head && now - g.head->t_start > limit_ns)
		conn_end(g.head, 0, why);
}

static void dispatch(int n, struct epoll_event *ev);

static void run_client(void)
{
	struct epoll_event ev[MAX_EVENTS];
	uint64_t t0, t_end, opened = 0, timeout_ns = (uint64_t)g.o.timeout_ms * 1000000ull;
	uint64_t window;
	size_t cap = (size_t)(g.o.concurrency ? g.o.concurrency : g.o.max_inflight);

	check_sources();
	t0 = now_ns();
	t_end = t0 + (uint64_t)(g.o.duration * 1e9);
	/* At most 100 ms worth of connections are opened late after a stall. */
	window = (uint64_t)(g.o.rate * 0.1) + 1;
	for (;;) {
		uint64_t now = now_ns();
		int running = now < t_end && !g.stop;

		if (running && g.o.concurrency) {
			/* Bounded: connections that fail at once (no route) free their slot again. */
			for (size_t n = 0; g.inflight < cap && n < cap; n++)
				open_one();
		} else if (running) {
			uint64_t due = (uint64_t)((double)(now - t0) * 1e-9 * g.o.rate) + 1;

			if (due > opened + window) {
				g.r.rate_dropped += due - opened - window;
				opened = due - window;
			}
			while (opened < due && g.inflight < cap) {
				open_one();
				opened++;
			}
		}
		if (!running) {
			if (!g.inflight)
				break;
			if (now > t_end + (uint64_t)g.o.drain_ms * 1000000ull || g.stop > 1) {
				expire(now, 0, ERR_drain);
				break;
			}
		}
		int n = epoll_wait(g.ep, ev, MAX_EVENTS, running && g.o.rate ? 1 : 10);

		if (n < 0 && errno != EINTR)
			die("epoll_wait: %s", strerror(errno));
		dispatch(n, ev);
		expire(now_ns(), timeout_ns, ERR_timeout);
	}
	g.r.elapsed_s = (double)(now_ns() - t0) * 1e-9;
	if (g.r.elapsed_s > g.o.duration && g.o.duration > 0)
		g.r.elapsed_s = g.o.duration; /* rates over the load phase; drain adds no new work */
}

/* ---- server ------------------------------------------------------------ */

static void add_listener(uint32_t addr, uint16_t port)
{
	struct sockaddr_in s = { .sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(addr) };
	int one = 1, fd;
	char b[INET_ADDRSTRLEN];

	for (size_t i = 0; i < g.nlst; i++)
		if (g.lst[i].addr == addr && g.lst[i].port == port)
			return;
	if (g.nlst >= 4096)
		die("the profile's server ranges need more than 4096 listening sockets; "
		    "use a smaller server range (ip_gen dist_server) for pep-replay");
	fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		die("socket: %s", strerror(errno));
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	/* IP_FREEBIND: listen on every server address of the profile even when
	 * some are not (yet) assigned here; only assigned ones get traffic. */
	setsockopt(fd, IPPROTO_IP, IP_FREEBIND, &one, sizeof(one));
	/* When every server program starts by reading, hand connections over only
	 * once the request is there: one wakeup and no empty read per connection. */
	if (g.defer_accept)
		setsockopt(fd, IPPROTO_TCP, TCP_DEFER_ACCEPT, &one, sizeof(one));
	if (bind(fd, (struct sockaddr *)&s, sizeof(s)) || listen(fd, 4096))
		die("listen on %s:%u: %s (is another server already there?)", ipstr(addr, b), port, strerror(errno));
	g.lst[g.nlst] = (struct listener){ .fd = fd, .addr = addr, .port = port };
	/* listener pointers are tagged by being inside g.lst */
	if (watch(fd, &g.lst[g.nlst], EPOLLIN))
		die("epoll_ctl: %s", strerror(errno));
	g.nlst++;
}

static int is_listener(void *ptr)
{
	return (char *)ptr >= (char *)g.lst && (char *)ptr < (char *)(g.lst + 4096);
}

static void on_accept(struct listener *l)
{
	for (int i = 0; i < 256; i++) {
		struct sockaddr_in peer;
		socklen_t pl = sizeof(peer);
		int fd = accept4(l->fd, (struct sockaddr *)&peer, &pl, SOCK_NONBLOCK | SOCK_CLOEXEC);
		struct conn *c;

		if (fd < 0)
			return; /* EAGAIN, or an aborted handshake: nothing to count */
		c = conn_get();
		if (!c) {
			close(fd); /* over the fd budget: refuse rather than stall */
			g.r.errors[ERR_other]++;
			continue;
		}
		c->fd = fd;
		c->listener = (int)(l - g.lst);
		c->connected = 1;
		c->t_start = now_ns();
		if (!g.t_first_accept)
			g.t_first_accept = c->t_start;
		c->peer = ntohl(peer.sin_addr.s_addr);
		g.r.conn_accepted++;
		g.r.conn_established++;
		addr_note(c->peer);
		if (watch(fd, c, EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET)) {
			conn_end(c, 0, ERR_other);
			continue;
		}
		on_event(c, EPOLLIN); /* the request may be queued already */
	}
}

static void run_server(void)
{
	struct epoll_event ev[MAX_EVENTS];
	uint64_t t0 = now_ns(), t_end = t0 + (uint64_t)(g.o.duration * 1e9);
	uint64_t timeout_ns = (uint64_t)g.o.timeout_ms * 1000000ull;

	g.lst = calloc(4096, sizeof(*g.lst));
	if (!g.lst)
		die("out of memory");
	g.defer_accept = 1;
	for (size_t i = 0; i < g.p.ntpl; i++) {
		const struct program *sp = &g.p.progs[g.p.tpl[i].sprog];
		size_t k = 0;

		while (k < sp->ncmds && sp->cmds[k].op == OP_CONNECT)
			k++;
		if (k == sp->ncmds || sp->cmds[k].op != OP_RX)
			g.defer_accept = 0;
	}
	for (size_t i = 0; i < g.p.ntpl; i++) {
		const struct ipdist *d = &g.p.dists[g.p.tpl[i].sdist];

		for (uint64_t a = d->first; a <= d->last; a++)
			add_listener((uint32_t)a, g.p.tpl[i].assoc_port);
	}
	if (!g.o.quiet)
		fprintf(stderr, "pep-replay server: listening on %zu address:port pairs for %.0f s\n", g.nlst,
			g.o.duration);
	while (!g.stop && now_ns() < t_end) {
		int n = epoll_wait(g.ep, ev, MAX_EVENTS, 100);

		if (n < 0 && errno != EINTR)
			die("epoll_wait: %s", strerror(errno));
		dispatch(n, ev);
		expire(now_ns(), timeout_ns, ERR_timeout);
	}
	g.r.elapsed_s = (double)(now_ns() - t0) * 1e-9;
	for (size_t i = 0; i < g.nlst; i++)
		close(g.lst[i].fd);
	/* Give connections in flight a moment, then count them as drained. */
	uint64_t t_drain = now_ns() + (uint64_t)g.o.drain_ms * 1000000ull;

	while (g.inflight && now_ns() < t_drain && g.stop < 2) {
		int n = epoll_wait(g.ep, ev, MAX_EVENTS, 10);

		dispatch(n < 0 ? 0 : n, ev);
	}
	expire(now_ns(), 0, ERR_drain);
	/* Rates over the time the server was busy, from first accept to last end. */
	if (g.t_first_accept && g.t_last_end > g.t_first_accept)
		g.r.elapsed_s = (double)(g.t_last_end - g.t_first_accept) * 1e-9;
}

static void dispatch(int n, struct epoll_event *ev)
{
	for (int i = 0; i < n; i++) {
		if (is_listener(ev[i].data.ptr))
			on_accept(ev[i].data.ptr);
		else
			on_event(ev[i].data.ptr, ev[i].events);
	}
}

/* ---- main -------------------------------------------------------------- */

static void on_signal(int sig)
{
	(void)sig;
	g.stop++;
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: pep-replay check --profile P.json   (load it and list its templates)\n"
		"       pep-replay server --profile P.json [--duration S] [--json FILE] [--peers FILE]\n"
		"       pep-replay client --profile P.json [--duration S] [--rate CPS | --concurrency N]\n"
		"                         [--clients FIRST-LAST] [--json FILE]\n"
		"P.json is a compiled TRex ASTF profile: replay/compile_profile.py PROFILE.py P.json\n"
		"options:\n"
		"  --duration S       load time (client, default 10) or lifetime (server, default 60)\n"
		"  --rate CPS         new connections per second (default: the profile's cps sum)\n"
		"  --concurrency N    keep N transactions in flight instead of a rate\n"
		"  --max-inflight N   cap on open connections in rate mode (default 4096)\n"
		"  --timeout MS       a transaction not done after MS fails as timeout (default 10000)\n"
		"  --drain MS         after --duration, wait this long for transactions in flight (default 3000)\n"
		"  --clients A-B      client source range instead of the profile's (IPv4)\n"
		"  --json FILE        write the report as JSON (the printed table goes to stdout)\n"
		"  --peers FILE       server: write each client address seen and its connection count\n"
		"  --seed N           random seed for template and address choice\n"
		"  --quiet            no table on stdout\n");
}

static double num_arg(const char *name, const char *v, double lo, double hi)
{
	char *e;
	double x = strtod(v, &e);

	if (*e || e == v || x < lo || x > hi)
		die("--%s %s: expected a number from %g to %g", name, v, lo, hi);
	return x;
}

static void parse_range(const char *v)
{
	char buf[64], *dash;
	struct in_addr a, b;

	snprintf(buf, sizeof(buf), "%s", v);
	dash = strchr(buf, '-');
	if (!dash)
		die("--clients %s: expected FIRST-LAST, e.g. 198.18.0.10-198.18.0.250", v);
	*dash = 0;
	if (inet_pton(AF_INET, buf, &a) != 1 || inet_pton(AF_INET, dash + 1, &b) != 1 ||
	    ntohl(b.s_addr) < ntohl(a.s_addr) || !a.s_addr)
		die("--clients %s: expected FIRST-LAST IPv4 addresses, FIRST <= LAST", v);
	g.o.clients_first = ntohl(a.s_addr);
	g.o.clients_last = ntohl(b.s_addr);
}

static void parse_args(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "profile", 1, 0, 'p' }, { "duration", 1, 0, 'd' }, { "rate", 1, 0, 'r' },
		{ "concurrency", 1, 0, 'c' }, { "max-inflight", 1, 0, 'm' }, { "timeout", 1, 0, 't' },
		{ "drain", 1, 0, 'D' }, { "clients", 1, 0, 'C' }, { "json", 1, 0, 'j' }, { "peers", 1, 0, 'P' },
		{ "seed", 1, 0, 's' }, { "quiet", 0, 0, 'q' }, { "help", 0, 0, 'h' }, { 0, 0, 0, 0 },
	};
	int ch;

	if (argc < 2 || (strcmp(argv[1], "client") && strcmp(argv[1], "server") && strcmp(argv[1], "check"))) {
		if (argc >= 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
			usage(stdout);
			exit(0);
		}
		usage(stderr);
		exit(2);
	}
	g.o.role = argv[1];
	g.o.client = !strcmp(g.o.role, "client");
	g.o.duration = g.o.client ? 10 : 60;
	g.o.max_inflight = 4096;
	g.o.timeout_ms = 10000;
	g.o.drain_ms = 3000;
	g.o.seed = 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid();
	optind = 2;
	while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		switch (ch) {
		case 'p': g.o.profile = optarg; break;
		case 'd': g.o.duration = num_arg("duration", optarg, 0.1, 86400); break;
		case 'r': g.o.rate = num_arg("rate", optarg, 0.1, 1e8); break;
		case 'c': g.o.concurrency = (long)num_arg("concurrency", optarg, 1, 1e6); break;
		case 'm': g.o.max_inflight = (long)num_arg("max-inflight", optarg, 1, 1e6); break;
		case 't': g.o.timeout_ms = (long)num_arg("timeout", optarg, 1, 864e5); break;
		case 'D': g.o.drain_ms = (long)num_arg("drain", optarg, 0, 864e5); break;
		case 'C': parse_range(optarg); break;
		case 'j': g.o.json = optarg; break;
		case 'P': g.o.peers = optarg; break;
		case 's': g.o.seed = (uint64_t)num_arg("seed", optarg, 1, 1e18); break;
		case 'q': g.o.quiet = 1; break;
		case 'h': usage(stdout); exit(0);
		default: usage(stderr); exit(2);
		}
	}
	if (optind < argc)
		die("unexpected argument '%s'; see --help", argv[optind]);
	if (!g.o.profile)
		die("--profile P.json is required (compile one: replay/compile_profile.py PROFILE.py P.json)");
	if (g.o.rate && g.o.concurrency)
		die("give --rate or --concurrency, not both");
}

static void size_fds(void)
{
	struct rlimit rl;
	long need = (g.o.concurrency ? g.o.concurrency : g.o.max_inflight) + 64;

	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	if (!g.o.client)
		need = (long)rl.rlim_cur - 4200; /* room for up to 4096 listeners */
	if (need > (long)rl.rlim_cur - 16) {
		if (g.o.client)
			die("%ld connections in flight need more open files than the limit (%ld); "
			    "lower --concurrency/--max-inflight or raise ulimit -n",
			    need - 64, (long)rl.rlim_cur);
	}
	if (need < 64)
		need = 64;
	g.pool = calloc((size_t)need, sizeof(*g.pool));
	if (!g.pool)
		die("out of memory for %ld connections", need);
	for (long i = need - 1; i >= 0; i--) {
		g.pool[i].next = g.free_list;
		g.free_list = &g.pool[i];
	}
}

/* "check": what would be played, one line per template. */
static int check_profile(void)
{
	char a[INET_ADDRSTRLEN], b[INET_ADDRSTRLEN], c[INET_ADDRSTRLEN], d[INET_ADDRSTRLEN];

	printf("profile %s: %zu templates, %.6g connections/s at -m 1\n", g.o.profile, g.p.ntpl, g.p.cps_sum);
	for (size_t i = 0; i < g.p.ntpl; i++) {
		const struct template *t = &g.p.tpl[i];
		const struct ipdist *cd = &g.p.dists[t->cdist], *sd = &g.p.dists[t->sdist];

		printf("template %zu: cps %.6g clients %s-%s servers %s-%s port %u request %llu bytes "
		       "response %llu bytes l7 %zu bytes\n", i, t->cps, ipstr(cd->first, a), ipstr(cd->last, b),
		       ipstr(sd->first, c), ipstr(sd->last, d), t->port,
		       (unsigned long long)g.p.progs[t->cprog].tx_bytes,
		       (unsigned long long)g.p.progs[t->sprog].tx_bytes, t->l7n);
	}
	return 0;
}

static void write_peers(void)
{
	FILE *f = fopen(g.o.peers, "w");
	char b[INET_ADDRSTRLEN];

	if (!f)
		die("--peers %s: %s", g.o.peers, strerror(errno));
	for (size_t h = 0; h < ADDRSET_SIZE; h++)
		if (g.addrs.slot[h])
			fprintf(f, "%s %llu\n", ipstr(g.addrs.slot[h] - 1, b), (unsigned long long)g.addrs.count[h]);
	if (fclose(f))
		die("--peers %s: %s", g.o.peers, strerror(errno));
}

int main(int argc, char **argv)
{
	char err[512];
	struct sigaction sa = { .sa_handler = on_signal };

	parse_args(argc, argv);
	if (profile_load(&g.p, g.o.profile, err, sizeof(err)))
		die("%s", err);
	if (!strcmp(g.o.role, "check"))
		return check_profile();
	if (g.o.client && !g.o.rate && !g.o.concurrency)
		g.o.rate = g.p.cps_sum; /* the profile's own rate, as TRex at -m 1 */
	g.rng = g.o.seed | 1;
	g.rxbuf = malloc(RXBUF);
	g.addrs.slot = calloc(ADDRSET_SIZE, sizeof(*g.addrs.slot));
	g.addrs.count = calloc(ADDRSET_SIZE, sizeof(*g.addrs.count));
	g.dist_next = calloc(g.p.ndists, sizeof(*g.dist_next));
	g.r.tpl = calloc(g.p.ntpl, sizeof(*g.r.tpl));
	if (!g.rxbuf || !g.addrs.slot || !g.addrs.count || !g.dist_next || !g.r.tpl)
		die("out of memory");
	g.r.ntpl = g.p.ntpl;
	g.r.role = g.o.role;
	g.r.profile = g.o.profile;
	g.r.duration_s = g.o.duration;
	if (g.o.client) {
		g.r.mode = g.o.concurrency ? "concurrency" : "rate";
		g.r.mode_value = g.o.concurrency ? (double)g.o.concurrency : g.o.rate;
	}
	size_fds();
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
	g.ep = epoll_create1(EPOLL_CLOEXEC);
	if (g.ep < 0)
		die("epoll_create1: %s", strerror(errno));

	if (g.o.client)
		run_client();
	else
		run_server();

	g.r.distinct_addrs = g.addrs.n;
	if (g.o.json) {
		char tmp[4096];
		FILE *f;

		snprintf(tmp, sizeof(tmp), "%s.tmp", g.o.json);
		f = fopen(tmp, "w");
		if (!f || report_write_json(&g.r, f) || fclose(f) || rename(tmp, g.o.json))
			die("--json %s: cannot write: %s", g.o.json, strerror(errno));
	}
	if (g.o.peers)
		write_peers();
	if (!g.o.quiet)
		report_print_table(&g.r, stdout);
	return g.r.trans_failed ? 1 : 0;
}
