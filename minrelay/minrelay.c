// minrelay: the least a transparent split-TCP proxy can do, as a yardstick for the benchmarks.
//
// It accepts on a transparent listener (the lab's interception hands it the subscriber's
// connections, the original destination kept as the accepted socket's local address), connects
// to that destination from the subscriber's own address (IP_TRANSPARENT, a spare port), and
// copies bytes both ways until each side has closed, passing a half-close on. Nothing else: no
// configuration, timeouts, limits, logs, statistics, reloads or IPv6. `bench proxy` runs it in
// the graph's namespace as `pep-lab up --proxy-engine minrelay` beside HAProxy and nginx stream:
// what HAProxy costs above it is what a leaner proxy could save; what it costs is the floor.
//
// usage: minrelay PORT WORKERS
// WORKER processes share one listener (EPOLLEXCLUSIVE), each with its own edge-triggered epoll
// loop; they die with the parent (PR_SET_PDEATHSIG), so stopping its recorded PID stops them.
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define BUF_SIZE 16384
#define MAX_WORKERS 1024

// One direction of a relayed connection: what was read from fd and is still to go to the peer.
struct side {
	int fd;
	struct side *peer;
	size_t len, off;
	int eof;        // fd sent its FIN (or failed): nothing more to read
	int shut;       // the FIN was passed on: shutdown(peer, SHUT_WR) done
	int connected;  // fd's handshake is done (shutdown() of a connecting socket aborts it)
	int readable;   // epoll said so and recv has not said EAGAIN since (edge-triggered:
	int writable;   // no call is made that would only say EAGAIN, as nginx keeps it)
	int closed;     // both fds closed; freed after the current batch of events
	char buf[BUF_SIZE];
};

// Pairs closed during one batch of epoll events, freed after it: a later event of the same
// batch may name the peer of a pair just closed.
static struct side *closed_pairs[512];
static int n_closed;

static void die(const char *what)
{
	perror(what);
	exit(1);
}

static void close_pair(struct side *a)
{
	struct side *b = a->peer;

	close(a->fd);
	close(b->fd);
	a->closed = b->closed = 1;
	closed_pairs[n_closed++] = a < b ? a : b;   // both sides live in one allocation
}

// Move what from has to say to its peer. Returns -1 when the pair failed.
static int pump(struct side *from)
{
	struct side *to = from->peer;

	for (;;) {
		if (from->len == 0 && !from->eof) {
			if (!from->readable)
				return 0;
			ssize_t n = recv(from->fd, from->buf, BUF_SIZE, 0);

			if (n > 0) {
				from->len = n;
				from->off = 0;
			} else if (n == 0) {
				from->eof = 1;
			} else if (errno == EAGAIN) {
				from->readable = 0;
				return 0;
			} else if (errno != EINTR) {
				return -1;
			}
		}
		if (from->len > 0) {
			if (!to->writable)
				return 0;
			ssize_t n = send(to->fd, from->buf + from->off, from->len, MSG_NOSIGNAL);

			if (n < 0 && errno == EINTR)
				continue;
			if (n < 0 && errno == EAGAIN) {
				to->writable = 0;
				return 0;
			}
			if (n < 0)
				return -1;
			from->off += n;
			from->len -= n;
			continue;
		}
		if (from->eof) {
			if (from->shut || !to->connected)
				return 0;   // not yet connected: its first EPOLLOUT comes back here
			if (shutdown(to->fd, SHUT_WR) < 0 && errno != ENOTCONN)
				return -1;
			from->shut = 1;
			return 0;
		}
	}
}

static void on_event(struct side *s, uint32_t events)
{
	if (s->closed)
		return;
	if (events & EPOLLERR) {
		close_pair(s);
		return;
	}
	if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP))
		s->readable = 1;
	if (events & EPOLLOUT)
		s->writable = s->connected = 1;
	// Readable: s has data for its peer; writable: s can take what its peer holds.
	if (pump(s) < 0 || pump(s->peer) < 0 || (s->shut && s->peer->shut)) {
		close_pair(s);
	}
}

static void init_side(struct side *s, int fd, struct side *peer, int connected)
{
	s->fd = fd;
	s->peer = peer;
	s->len = s->off = 0;
	s->eof = s->shut = s->closed = s->readable = s->writable = 0;
	s->connected = connected;
}

static int watch(int ep, struct side *s)
{
	struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET, .data.ptr = s};

	return epoll_ctl(ep, EPOLL_CTL_ADD, s->fd, &ev);
}

static void accept_all(int ep, int lfd)
{
	static const int one = 1;

	for (;;) {
		struct sockaddr_in client, dst;
		socklen_t clen = sizeof(client), dlen = sizeof(dst);
		int cfd = accept4(lfd, (struct sockaddr *)&client, &clen, SOCK_NONBLOCK | SOCK_CLOEXEC);

		if (cfd < 0) {
			if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED)
				return;
			die("accept4");
		}
		int sfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
		// Not zeroed: the buffers are written before they are read (len says how much).
		struct side *pair = malloc(2 * sizeof(struct side));

		if (sfd < 0 || !pair || getsockname(cfd, (struct sockaddr *)&dst, &dlen) < 0)
			die("socket");
		client.sin_port = 0;   // the subscriber's address, a spare port (found at connect)
		// No Nagle on either side, as HAProxy and nginx (tcp_nodelay on) do.
		if (setsockopt(cfd, SOL_TCP, TCP_NODELAY, &one, sizeof(one)) < 0 ||
		    setsockopt(sfd, SOL_TCP, TCP_NODELAY, &one, sizeof(one)) < 0 ||
		    setsockopt(sfd, SOL_IP, IP_TRANSPARENT, &one, sizeof(one)) < 0 ||
		    setsockopt(sfd, SOL_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof(one)) < 0 ||
		    bind(sfd, (struct sockaddr *)&client, sizeof(client)) < 0 ||
		    (connect(sfd, (struct sockaddr *)&dst, sizeof(dst)) < 0 && errno != EINPROGRESS)) {
			close(cfd);   // as a failed connect would: the subscriber sees the connection end
			close(sfd);
			free(pair);
			continue;
		}
		init_side(&pair[0], cfd, &pair[1], 1);
		init_side(&pair[1], sfd, &pair[0], 0);
		if (watch(ep, &pair[0]) < 0 || watch(ep, &pair[1]) < 0)
			die("epoll_ctl");
	}
}

static void worker(int lfd, pid_t parent)
{
	struct epoll_event ev = {.events = EPOLLIN | EPOLLEXCLUSIVE, .data.ptr = NULL}, events[256];
	int ep = epoll_create1(EPOLL_CLOEXEC);

	if (prctl(PR_SET_PDEATHSIG, SIGTERM) < 0 || getppid() != parent)
		exit(1);   // the parent is gone already: nobody would stop this worker
	if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev) < 0)
		die("epoll");
	for (;;) {
		// At most one pair closes per event: closed_pairs holds a whole batch.
		int n = epoll_wait(ep, events, 256, -1);

		for (int i = 0; i < n; i++) {
			if (events[i].data.ptr == NULL)
				accept_all(ep, lfd);
			else
				on_event(events[i].data.ptr, events[i].events);
		}
		while (n_closed > 0)
			free(closed_pairs[--n_closed]);
		if (n < 0 && errno != EINTR)
			die("epoll_wait");
	}
}

int main(int argc, char **argv)
{
	static const int one = 1;
	int port = argc == 3 ? atoi(argv[1]) : 0, workers = argc == 3 ? atoi(argv[2]) : 0;
	struct sockaddr_in any = {.sin_family = AF_INET, .sin_port = htons(port)};

	if (port <= 0 || port > 65535 || workers <= 0 || workers > MAX_WORKERS) {
		fprintf(stderr, "usage: minrelay PORT WORKERS (PORT 1-65535, WORKERS 1-%d)\n", MAX_WORKERS);
		return 2;
	}
	int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);

	// Transparent: the interception delivers connections addressed to other hosts.
	if (lfd < 0 || setsockopt(lfd, SOL_IP, IP_TRANSPARENT, &one, sizeof(one)) < 0 ||
	    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
	    bind(lfd, (struct sockaddr *)&any, sizeof(any)) < 0 || listen(lfd, 4096) < 0)
		die("listener");
	pid_t parent = getpid(), pids[MAX_WORKERS];

	for (int i = 0; i < workers; i++) {
		pids[i] = fork();
		if (pids[i] < 0)
			die("fork");
		if (pids[i] == 0)
			worker(lfd, parent);
	}
	// The parent waits; a worker that dies takes the relay down (the lab sees its PID gone).
	wait(NULL);
	for (int i = 0; i < workers; i++)
		kill(pids[i], SIGTERM);
	return 1;
}
