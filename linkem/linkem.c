/* linkem: a userspace "bump in the wire" link emulator between two interfaces.
 *
 * Frames read on A leave by B after the a2b impairments, and frames read on B
 * leave by A after the b2a ones (delay, jitter, loss, Gilbert-Elliott loss,
 * rate with a tail-drop queue; see path.c for the timeline). One thread per
 * direction moves frames; this main thread serves the control socket, the
 * signals and --duration. Usage and the control protocol: linkem/README.md.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <arpa/inet.h>
#include <jansson.h>
#include <linux/ethtool.h>
#include <linux/if_ether.h>
#include <linux/sockios.h>
#include <linux/if_packet.h>
#include <linux/virtio_net.h>
#include <math.h>
#include <net/if.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include "params.h"
#include "path.h"

/* Receive buffer: absorbs a path thread's scheduling stalls (8 MB of socket
 * memory is ~3.5k full frames, ~40 ms at 1 Gbit/s) without hiding an
 * overloaded emulator behind a huge queue; overflow shows as drop_rx. */
#define RX_BUF (8 << 20)
#define TX_BUF (4 << 20)

static volatile int stop_flag;
static struct path paths[NDIRS];
static struct link_params cur[NDIRS]; /* authoritative copy, main thread only */
static const char *if_name[NDIRS];
static uint64_t start_ns;

static void usage(FILE *f)
{
	fprintf(f,
		"usage: linkem -a IFACE -b IFACE [--ctl PATH] [--duration SEC] [--pool-mb N]\n"
		"              [--seed N] [--stats-out FILE] [[a2b.|b2a.]KEY=VALUE ...]\n"
		"Moves frames A->B and B->A with per-direction impairments. Keys:\n"
		"  delay=MS jitter=MS jitter_dist=uniform|normal reorder=0|1 loss=PCT\n"
		"  ge_p=PCT ge_r=PCT ge_loss_bad=PCT ge_loss_good=PCT\n"
		"  rate=BITS[k|M|G] limit_bytes=N[k|M] limit_ms=MS limit_pkts=N\n"
		"  trace=FILE|none   (capacity from a mahimahi trace instead of rate)\n"
		"Control socket commands (one line in, one JSON line out):\n"
		"  stats | params | set KEY=VALUE... | replace KEY=VALUE... | stop\n"
		"See linkem/README.md.\n");
}

static void die(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fputs("linkem: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	exit(2);
}

static int if_mtu(const char *name)
{
	struct ifreq ifr = { 0 };
	int fd = socket(AF_INET, SOCK_DGRAM, 0), rc;

	snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%s", name);
	rc = fd < 0 ? -1 : ioctl(fd, SIOCGIFMTU, &ifr);
	if (fd >= 0)
		close(fd);
	return rc < 0 ? -1 : ifr.ifr_mtu;
}

/* GRO on A or B would merge wire frames before we see them; linkem owns these
 * two interfaces, so it turns GRO off itself. (The peers' TSO/GSO are not ours
 * to touch: see README, "Offloads".) */
static void gro_off(const char *name)
{
	struct ethtool_value ev = { .cmd = ETHTOOL_SGRO, .data = 0 };
	struct ifreq ifr = { 0 };
	int fd = socket(AF_INET, SOCK_DGRAM, 0);

	snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%s", name);
	ifr.ifr_data = (void *)&ev;
	if (fd < 0 || (ioctl(fd, SIOCETHTOOL, &ifr) < 0 && errno != EOPNOTSUPP))
		fprintf(stderr, "linkem: warning: turn GRO off on %s: %s; run: ethtool -K %s gro off\n",
			name, strerror(errno), name);
	if (fd >= 0)
		close(fd);
}

static void setopt(int fd, int level, int name, int val, const char *what, const char *ifn)
{
	if (setsockopt(fd, level, name, &val, sizeof(val)) < 0)
		die("set %s on the packet socket of %s: %s", what, ifn, strerror(errno));
}

/* Receive socket: every frame the wire brings to `ifn`, with its checksum state
 * in a virtio-net header. It is created with protocol 0 and bound with
 * ETH_P_ALL, so it never sees frames of other interfaces. */
static int open_rx(const char *ifn, int ifindex)
{
	int fd = socket(AF_PACKET, SOCK_RAW | SOCK_CLOEXEC, 0);
	struct sockaddr_ll sll = { .sll_family = AF_PACKET, .sll_protocol = htons(ETH_P_ALL),
				   .sll_ifindex = ifindex };
	struct packet_mreq mr = { .mr_ifindex = ifindex, .mr_type = PACKET_MR_PROMISC };

	if (fd < 0)
		die("open a packet socket for %s: %s (needs root or CAP_NET_RAW)", ifn, strerror(errno));
	setopt(fd, SOL_PACKET, PACKET_VNET_HDR, 1, "PACKET_VNET_HDR", ifn);
	/* Our own transmissions on this interface (the other direction) are not input. */
	setopt(fd, SOL_PACKET, PACKET_IGNORE_OUTGOING, 1, "PACKET_IGNORE_OUTGOING", ifn);
	setopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, RX_BUF, "SO_RCVBUFFORCE", ifn);
	if (bind(fd, (struct sockaddr *)&sll, sizeof(sll)) < 0)
		die("bind a packet socket to %s: %s", ifn, strerror(errno));
	/* Real NICs filter by MAC; veth does not, but promisc costs nothing there. */
	if (setsockopt(fd, SOL_PACKET, PACKET_ADD_MEMBERSHIP, &mr, sizeof(mr)) < 0)
		die("set %s promiscuous: %s", ifn, strerror(errno));
	return fd;
}

/* Send socket: protocol 0, so it receives nothing; bypasses the qdisc because
 * the emulator already shapes, and a qdisc would only add its own queue. */
static int open_tx(const char *ifn, int ifindex)
{
	int fd = socket(AF_PACKET, SOCK_RAW | SOCK_CLOEXEC, 0);
	struct sockaddr_ll sll = { .sll_family = AF_PACKET, .sll_protocol = 0, .sll_ifindex = ifindex };

	if (fd < 0)
		die("open a packet socket for %s: %s (needs root or CAP_NET_RAW)", ifn, strerror(errno));
	setopt(fd, SOL_PACKET, PACKET_VNET_HDR, 1, "PACKET_VNET_HDR", ifn);
	setopt(fd, SOL_PACKET, PACKET_QDISC_BYPASS, 1, "PACKET_QDISC_BYPASS", ifn);
	setopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, TX_BUF, "SO_SNDBUFFORCE", ifn);
	if (bind(fd, (struct sockaddr *)&sll, sizeof(sll)) < 0)
		die("bind a packet socket to %s: %s", ifn, strerror(errno));
	return fd;
}

/* Pool needed by one direction: rate x (delay + jitter + queue), plus entry
 * headers (~4% for full frames). Unlimited rate: nothing to check here.
 * Returns the warnings as a JSON array of strings (NULL when out of memory). */
static json_t *pool_warnings(void)
{
	json_t *list = json_array();

	for (int d = 0; list && d < NDIRS; d++) {
		const struct link_params *lp = &cur[d];
		double hold_ms = lp->delay_ms + lp->jitter_ms * (lp->jitter_dist == JITTER_NORMAL ? 3 : 1);
		double need;
		char text[256];

		double rate = lp->trace ? lp->trace->mean_bps : (double)lp->rate_bps;

		if (!rate)
			continue;
		need = rate / 8 * (hold_ms + lp->limit_ms) / 1000 + (double)lp->limit_bytes;
		if (!lp->limit_ms && !lp->limit_bytes && !lp->limit_pkts)
			snprintf(text, sizeof(text), "%s: rate without limit_ms/limit_bytes/limit_pkts: "
				 "the queue is bounded only by the pool", dir_names[d]);
		else if (need * 1.05 > (double)paths[d].pool.size)
			snprintf(text, sizeof(text), "%s: rate x (delay + jitter + limit) needs %.0f MiB, "
				 "pool has %llu MiB: raise --pool-mb", dir_names[d], need * 1.05 / (1 << 20),
				 (unsigned long long)(paths[d].pool.size >> 20));
		else
			continue;
		if (json_array_append_new(list, json_string(text))) {
			json_decref(list);
			return NULL;
		}
	}
	return list;
}

static void collect_kernel_drops(void)
{
	for (int d = 0; d < NDIRS; d++) {
		struct tpacket_stats ts;
		socklen_t sl = sizeof(ts);

		/* PACKET_STATISTICS resets on read, hence the running sum. */
		if (getsockopt(paths[d].rx_fd, SOL_PACKET, PACKET_STATISTICS, &ts, &sl) == 0)
			paths[d].rx_kernel_drops += ts.tp_drops;
	}
}

/* The answers: JSON objects with "ok"; serve_one() and write_stats() print them
 * as one line each. All return a new reference, or NULL when out of memory. */
static json_t *stats_answer(void)
{
	collect_kernel_drops();
	/* Seconds to the ms, as they have always been given. */
	return json_pack("{s:b, s:f, s:o, s:o, s:I, s:o, s:o}", "ok", 1,
			 "uptime_s", nearbyint((double)(now_ns() - start_ns) / 1e6) / 1e3,
			 "a", json_text(if_name[0]), "b", json_text(if_name[1]),
			 "pool_bytes", (json_int_t)paths[0].pool.size,
			 dir_names[0], path_stats_json(&paths[0]), dir_names[1], path_stats_json(&paths[1]));
}

static json_t *params_answer(void)
{
	return json_pack("{s:b, s:o, s:o, s:o}", "ok", 1, dir_names[0], params_json(&cur[0]),
			 dir_names[1], params_json(&cur[1]), "warnings", pool_warnings());
}

static json_t *error_answer(const char *msg)
{
	return json_pack("{s:b, s:o}", "ok", 0, "error", json_text(msg));
}

/* One line of JSON text (malloc'ed), without the newline. The layout is
 * {"key": value, ...}: flags 0 write no newline and keep the space after ':'
 * and ','. Reals with 15 digits print as their decimal (0.1, not
 * 0.10000000000000001). Takes the answer's reference. */
static char *answer_text(json_t *answer)
{
	char *text = answer ? json_dumps(answer, JSON_REAL_PRECISION(15)) : NULL;

	json_decref(answer);
	return text ? text : strdup("{\"ok\": false, \"error\": \"out of memory\"}");
}

/* Applies KEY=VALUE words to a copy; publishes only if all of them are valid. */
static int apply_words(char **words, int n, int from_defaults, char *err, size_t errlen)
{
	struct link_params next[NDIRS];

	for (int d = 0; d < NDIRS; d++) {
		next[d] = cur[d];
		if (from_defaults)
			params_default(&next[d]);
	}
	for (int i = 0; i < n; i++)
		if (params_apply_kv(next, words[i], err, errlen))
			return -1;
	for (int d = 0; d < NDIRS; d++) {
		cur[d] = next[d];
		path_publish(&paths[d], &cur[d]);
	}
	return 0;
}

static json_t *handle_command(char *line)
{
	char *words[128], *save = NULL, err[1024];
	int n = 0;

	for (char *w = strtok_r(line, " \t\r\n", &save); w; w = strtok_r(NULL, " \t\r\n", &save)) {
		if (n == 128)
			return error_answer("more than 127 KEY=VALUE words in one command");
		words[n++] = w;
	}
	if (n == 0)
		return error_answer("empty command; commands: stats, params, set KEY=VALUE..., "
				    "replace KEY=VALUE..., stop");
	if (!strcmp(words[0], "stats") && n == 1)
		return stats_answer();
	if (!strcmp(words[0], "params") && n == 1)
		return params_answer();
	if (!strcmp(words[0], "set") || !strcmp(words[0], "replace")) {
		if (apply_words(words + 1, n - 1, words[0][0] == 'r', err, sizeof(err)))
			return error_answer(err);
		return params_answer();
	}
	if (!strcmp(words[0], "stop") && n == 1) {
		stop_flag = 1;
		return json_pack("{s:b}", "ok", 1);
	}
	snprintf(err, sizeof(err), "unknown command '%s'; commands: stats, params, set KEY=VALUE..., "
		 "replace KEY=VALUE..., stop", words[0]);
	return error_answer(err);
}

/* One request per connection: read a line (1 s budget), answer, close. */
static void serve_one(int lfd)
{
	char line[4096], *reply;
	size_t got = 0;
	int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
	struct iovec iov[2] = { { 0 }, { .iov_base = "\n", .iov_len = 1 } };
	struct pollfd pfd = { .events = POLLIN };
	uint64_t deadline = now_ns() + 1000000000ull;

	if (fd < 0)
		return;
	pfd.fd = fd;
	while (got < sizeof(line) - 1 && !memchr(line, '\n', got)) {
		uint64_t now = now_ns();
		ssize_t r;

		if (now >= deadline || poll(&pfd, 1, (int)((deadline - now) / 1000000 + 1)) <= 0)
			break;
		r = read(fd, line + got, sizeof(line) - 1 - got);
		if (r <= 0)
			break;
		got += (size_t)r;
	}
	line[got] = '\0';
	if (got == sizeof(line) - 1 && !memchr(line, '\n', got))
		reply = answer_text(error_answer("command longer than 4095 bytes; nothing done"));
	else
		reply = answer_text(handle_command(line));
	if (reply) {
		iov[0] = (struct iovec){ .iov_base = reply, .iov_len = strlen(reply) };
		if (writev(fd, iov, 2) < 0) {
			/* The client went away; nothing to tell it. */
		}
	}
	free(reply);
	close(fd);
}

/* Stats go to stdout as one JSON line, and to --stats-out if given. */
static void write_stats(const char *stats_out)
{
	char tmp[4096], *json = answer_text(stats_answer());
	FILE *f;

	if (!json)
		return;
	printf("%s\n", json);
	fflush(stdout);
	if (!stats_out)
		return;
	/* Written beside and renamed, so a reader never sees half a file. */
	snprintf(tmp, sizeof(tmp), "%s.tmp", stats_out);
	f = fopen(tmp, "w");
	if (!f || fprintf(f, "%s\n", json) < 0 || fclose(f) || rename(tmp, stats_out))
		fprintf(stderr, "linkem: write --stats-out %s: %s\n", stats_out, strerror(errno));
	free(json);
}

static int open_ctl(const char *path)
{
	struct sockaddr_un sun = { .sun_family = AF_UNIX };
	int fd;

	if (strlen(path) >= sizeof(sun.sun_path))
		die("--ctl %s: path longer than %zu bytes", path, sizeof(sun.sun_path) - 1);
	strcpy(sun.sun_path, path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		die("open the control socket: %s", strerror(errno));
	/* A leftover socket file of a dead run is replaced; a live one is not. */
	if (connect(fd, (struct sockaddr *)&sun, sizeof(sun)) == 0)
		die("--ctl %s: another linkem answers there; stop it or pick another path", path);
	close(fd);
	unlink(path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || bind(fd, (struct sockaddr *)&sun, sizeof(sun)) < 0 || listen(fd, 16) < 0)
		die("--ctl %s: cannot listen there: %s", path, strerror(errno));
	chmod(path, 0600);
	return fd;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "a", required_argument, NULL, 'a' },
		{ "b", required_argument, NULL, 'b' },
		{ "ctl", required_argument, NULL, 'c' },
		{ "duration", required_argument, NULL, 'd' },
		{ "pool-mb", required_argument, NULL, 'p' },
		{ "seed", required_argument, NULL, 's' },
		{ "stats-out", required_argument, NULL, 'o' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *ctl = NULL, *stats_out = NULL;
	double duration = 0;
	unsigned long long pool_mb = 64, seed = 0;
	int have_seed = 0, opt, ifindex[NDIRS], max_mtu = 0, lfd = -1, sfd, exit_code = 0;
	char err[1024], *end;
	pthread_t thr[NDIRS];
	sigset_t sigs;

	while ((opt = getopt_long(argc, argv, "a:b:h", opts, NULL)) != -1) {
		switch (opt) {
		case 'a': if_name[0] = optarg; break;
		case 'b': if_name[1] = optarg; break;
		case 'c': ctl = optarg; break;
		case 'o': stats_out = optarg; break;
		case 'd':
			duration = strtod(optarg, &end);
			if (*end || duration <= 0)
				die("--duration %s: want a positive number of seconds", optarg);
			break;
		case 'p':
			pool_mb = strtoull(optarg, &end, 10);
			if (*end || pool_mb < 1 || pool_mb > 2048)
				die("--pool-mb %s: want 1..2048 (MiB per direction)", optarg);
			break;
		case 's':
			seed = strtoull(optarg, &end, 0);
			if (*end)
				die("--seed %s: want an integer", optarg);
			have_seed = 1;
			break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (!if_name[0] || !if_name[1]) {
		usage(stderr);
		die("both -a IFACE and -b IFACE are required");
	}
	if (!strcmp(if_name[0], if_name[1]))
		die("-a and -b are both %s; they must be two interfaces", if_name[0]);
	for (int d = 0; d < NDIRS; d++)
		params_default(&cur[d]);
	for (int i = optind; i < argc; i++)
		if (params_apply_kv(cur, argv[i], err, sizeof(err)))
			die("argument %d: %s", i, err);
	if (!have_seed && getrandom(&seed, sizeof(seed), 0) != sizeof(seed))
		seed = now_ns();

	for (int d = 0; d < NDIRS; d++) {
		int mtu;

		ifindex[d] = (int)if_nametoindex(if_name[d]);
		if (!ifindex[d])
			die("-%c %s: no such interface in this network namespace", "ab"[d], if_name[d]);
		mtu = if_mtu(if_name[d]);
		if (mtu < 0)
			die("read the MTU of %s: %s", if_name[d], strerror(errno));
		if (mtu > max_mtu)
			max_mtu = mtu;
		gro_off(if_name[d]);
	}
	/* Pool rounded up to a power of two so ring offsets are a mask. */
	uint64_t pool_bytes = 1;
	while (pool_bytes < (uint64_t)pool_mb << 20)
		pool_bytes <<= 1;

	/* Signals go to the signalfd only, never to the path threads. */
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGINT);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGHUP);
	sigaddset(&sigs, SIGUSR1);
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);
	signal(SIGPIPE, SIG_IGN);
	sfd = signalfd(-1, &sigs, SFD_CLOEXEC);
	if (sfd < 0)
		die("signalfd: %s", strerror(errno));
	/* Departures are timed by ppoll: the default 50 us timer slack would be
	 * added to every delay. */
	prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);

	for (int d = 0; d < NDIRS; d++) {
		struct path *p = &paths[d];
		int in = d, out = 1 - d;

		/* Room for a VLAN tag on top of the MTU-sized frame. */
		if (path_init(p, d, pool_bytes, (size_t)max_mtu + ETH_HLEN + 4, seed))
			die("allocate the %llu MiB pool for %s: %s", (unsigned long long)(pool_bytes >> 20),
			    dir_names[d], strerror(errno));
		p->in_name = if_name[in];
		p->out_name = if_name[out];
		p->rx_fd = open_rx(if_name[in], ifindex[in]);
		p->tx_fd = open_tx(if_name[out], ifindex[out]);
		p->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
		if (p->wake_fd < 0)
			die("eventfd: %s", strerror(errno));
		p->stop = &stop_flag;
		path_publish(p, &cur[d]);
	}
	json_t *warnings = pool_warnings(), *w;
	size_t i;

	json_array_foreach(warnings, i, w)
		fprintf(stderr, "linkem: warning: %s\n", json_string_value(w));
	json_decref(warnings);
	start_ns = now_ns();
	for (int d = 0; d < NDIRS; d++) {
		int rc = pthread_create(&thr[d], NULL, path_thread, &paths[d]);

		if (rc)
			die("start the %s thread: %s", dir_names[d], strerror(rc));
	}
	/* The control socket appears last: once it answers, frames are moving. */
	if (ctl)
		lfd = open_ctl(ctl);
	fprintf(stderr, "linkem: %s <-> %s, pool %llu MiB per direction, seed %llu%s%s\n",
		if_name[0], if_name[1], (unsigned long long)(pool_bytes >> 20), seed,
		ctl ? ", control " : "", ctl ? ctl : "");

	while (!stop_flag) {
		struct pollfd pfd[2] = { { .fd = sfd, .events = POLLIN }, { .fd = lfd, .events = POLLIN } };
		int timeout = 1000, gone = -1;
		char name[IF_NAMESIZE];

		if (duration > 0) {
			double left = duration - (double)(now_ns() - start_ns) / 1e9;

			if (left <= 0)
				break;
			if (left * 1000 < timeout)
				timeout = (int)(left * 1000) + 1;
		}
		/* A lab torn down around us must not leave an idle emulator behind. */
		for (int d = 0; d < NDIRS; d++)
			if (!if_indextoname((unsigned)ifindex[d], name) || strcmp(name, if_name[d]))
				gone = d;
		if (gone >= 0) {
			fprintf(stderr, "linkem: interface %s is gone; stopping\n", if_name[gone]);
			exit_code = 1;
			break;
		}
		if (poll(pfd, lfd >= 0 ? 2 : 1, timeout) < 0 && errno != EINTR)
			die("poll: %s", strerror(errno));
		if (pfd[0].revents & POLLIN) {
			struct signalfd_siginfo si;

			/* SIGHUP is ignored: a closing terminal must not end a running lab. */
			if (read(sfd, &si, sizeof(si)) != sizeof(si) || si.ssi_signo == SIGHUP)
				si.ssi_signo = 0;
			if (si.ssi_signo == SIGINT || si.ssi_signo == SIGTERM)
				break;
			if (si.ssi_signo == SIGUSR1)
				write_stats(stats_out);
		}
		if (lfd >= 0 && (pfd[1].revents & POLLIN))
			serve_one(lfd);
	}

	stop_flag = 1;
	for (int d = 0; d < NDIRS; d++) {
		uint64_t one = 1;

		if (write(paths[d].wake_fd, &one, sizeof(one)) < 0)
			perror("linkem: wake path thread");
	}
	for (int d = 0; d < NDIRS; d++)
		pthread_join(thr[d], NULL);
	if (ctl) {
		close(lfd);
		unlink(ctl);
	}
	write_stats(stats_out);
	for (int d = 0; d < NDIRS; d++) {
		if (paths[d].last_errno)
			fprintf(stderr, "linkem: %s: last socket error: %s\n", dir_names[d],
				strerror(paths[d].last_errno));
		path_free(&paths[d]);
	}
	return exit_code;
}
