/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Reading the headers the flow datapath needs from an untagged Ethernet
 * frame: IPv4 or IPv6, then TCP. The steering datapath has already popped
 * the VLAN tag, so the ethertype sits right after the MACs.
 *
 * What is not read as TCP (and so goes to the stack untouched):
 *   - IPv4 fragments, the first one included: the later ones have no TCP
 *     header, and the pieces of one datagram must all take one path (the
 *     stack's, which reassembles when it needs to);
 *   - IPv6 with any extension header before TCP (hop-by-hop, routing,
 *     fragment, ...): TCP is looked for right after the fixed header only;
 *   - anything shorter than the headers it claims: the stack judges it.
 *
 * The fixed IP header and the first 20 bytes of the TCP header are kept as
 * copies on the stack: bpf_tcp_check_syncookie reads them from there.
 */
#ifndef PEP_FLOW_PARSE_H
#define PEP_FLOW_PARSE_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/tcp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>
#include "skb_read.h"

#define IP4_MF 0x2000        /* more fragments */
#define IP4_OFFSET 0x1fff    /* fragment offset, in 8-byte units */
#define IP6_FLOWINFO 0x0fffffff
#define TCP_FLAGS_OFF 13     /* the byte holding CWR..FIN */
#define TCP_FLAG_FIN 0x01
#define TCP_FLAG_SYN 0x02
#define TCP_FLAG_RST 0x04
#define TCP_FLAG_PSH 0x08
#define TCP_FLAG_ACK 0x10
#define TCP_FLAG_ECE 0x40
#define TCP_FLAG_CWR 0x80

#define TCP_OPTS_MAX 40      /* a TCP header holds at most 40 bytes of options */
#define TCP_OPTS_BUF 64      /* room for them, a power of two: indexes are masked for the verifier */

/* x & mask, done where the verifier sees it: the compiler, knowing x is in range already,
 * would drop a plain mask and leave the verifier with a register it has no bounds for. */
#define MASKED(x, mask) ({ __u32 __v = (x); asm volatile("" : "+r"(__v)); __v & (mask); })
#define TCPOPT_EOL 0
#define TCPOPT_NOP 1
#define TCPOPT_MSS 2         /* kind 2, length 4 */
#define TCPOPT_SACK_PERM 4   /* kind 4, length 2 */
#define TCPOPT_TIMESTAMP 8   /* kind 8, length 10: TSval, TSecr */
#define TCPOPT_MPTCP 30      /* RFC 8684: MP_CAPABLE, MP_JOIN, ... (any subtype) */

struct tcp_pkt {
	union {
		struct iphdr v4;   /* the fixed 20 bytes; options are not copied */
		struct ipv6hdr v6;
	} ip;
	struct tcphdr tcp;         /* the first 20 bytes; options are not copied */
	__u8 src[16];      /* IPv4 as ::ffff:a.b.c.d, as in struct flow_key */
	__u8 dst[16];
	__be16 sport;
	__be16 dport;
	__u32 seq;         /* host order */
	__u32 ack_seq;     /* host order */
	__u8 flags;        /* TCP flags byte */
	__u8 family;       /* 4 or 6 */
	__u8 ttl;          /* TTL or hop limit */
	__u8 tos;          /* IPv4 TOS, for the FIB lookup */
	__be32 flowinfo;   /* IPv6 traffic class + flow label, for the FIB lookup */
	__u32 l4_off;      /* where the TCP header starts */
};

static __always_inline void v4_mapped(__u8 *to, __be32 addr)
{
	__builtin_memset(to, 0, 10);
	to[10] = 0xff;
	to[11] = 0xff;
	__builtin_memcpy(to + 12, &addr, 4);
}

static __always_inline int parse_ip4(struct __sk_buff *skb, struct tcp_pkt *p)
{
	struct iphdr *ip = &p->ip.v4;
	__u32 ihl;

	if (load_hdr(skb, ETH_HLEN, ip, sizeof(*ip)))
		return -1;
	ihl = ip->ihl;
	if (ip->version != 4 || ihl < 5)
		return -1;
	if (ip->frag_off & bpf_htons(IP4_MF | IP4_OFFSET))
		return -1;
	if (ip->protocol != IPPROTO_TCP)
		return -1;
	p->family = 4;
	p->ttl = ip->ttl;
	p->tos = ip->tos;
	p->l4_off = ETH_HLEN + ihl * 4;  /* options honoured: at most 60 bytes */
	v4_mapped(p->src, ip->saddr);
	v4_mapped(p->dst, ip->daddr);
	return 0;
}

static __always_inline int parse_ip6(struct __sk_buff *skb, struct tcp_pkt *p)
{
	struct ipv6hdr *ip6 = &p->ip.v6;

	if (load_hdr(skb, ETH_HLEN, ip6, sizeof(*ip6)))
		return -1;
	if (ip6->version != 6 || ip6->nexthdr != IPPROTO_TCP)
		return -1;
	p->family = 6;
	p->ttl = ip6->hop_limit;
	p->flowinfo = *(__be32 *)ip6 & bpf_htonl(IP6_FLOWINFO);
	p->l4_off = ETH_HLEN + sizeof(*ip6);
	__builtin_memcpy(p->src, &ip6->saddr, 16);
	__builtin_memcpy(p->dst, &ip6->daddr, 16);
	return 0;
}

/* Zero: p describes a TCP segment. Non-zero: not one we read (see top). */
static __always_inline int parse_tcp(struct __sk_buff *skb, struct tcp_pkt *p)
{
	__be16 proto;

	if (load_hdr(skb, offsetof(struct ethhdr, h_proto), &proto, sizeof(proto)))
		return -1;
	if (proto == bpf_htons(ETH_P_IP)) {
		if (parse_ip4(skb, p))
			return -1;
	} else if (proto == bpf_htons(ETH_P_IPV6)) {
		if (parse_ip6(skb, p))
			return -1;
	} else {
		return -1;
	}
	if (load_hdr(skb, p->l4_off, &p->tcp, sizeof(p->tcp)))
		return -1;
	p->sport = p->tcp.source;
	p->dport = p->tcp.dest;
	p->seq = bpf_ntohl(p->tcp.seq);
	p->ack_seq = bpf_ntohl(p->tcp.ack_seq);
	p->flags = ((const __u8 *)&p->tcp)[TCP_FLAGS_OFF];
	return 0;
}

/* The options of a SYN, kept as they came (the honest handshake replays them)
 * and read for what the decision needs. read_syn_opts fills every field but
 * the bytes past len (kept per CPU: flow_craft.h, struct craft_buf). */
struct syn_opts {
	__u8 bytes[TCP_OPTS_BUF];
	__u32 len;         /* bytes of options: doff * 4 - 20, at most TCP_OPTS_MAX */
	__u32 tsval;       /* host order, when has_ts */
	__u8 mptcp;        /* an MPTCP option is present */
	__u8 has_ts;
	__u16 payload;     /* bytes of data after the header (a Fast Open SYN carries some) */
	__u32 scan;        /* scan_one_opt's place in bytes */
	__u16 mss;         /* host order; 0: no MSS option */
	__u8 has_sack;     /* SACK permitted */
	__u8 pad;
};

/* One option of o->bytes at o->scan: noted, and o->scan moved past it.
 * Non-zero ends the scan. A bpf_loop callback, verified once: an unrolled
 * or bounded loop here made the verifier follow every mix of option lengths
 * (two paths an option, forty options) past its limit. */
struct scan_ctx {
	struct syn_opts *o;   /* bpf_loop takes a context on the stack only: o itself may be elsewhere */
};

static long scan_one_opt(__u32 index, void *ctx)
{
	struct syn_opts *o = ((struct scan_ctx *)ctx)->o;
	__u8 kind, olen;
	__u32 off;

	(void)index;
	if (!o)
		return 1;
	off = o->scan;
	if (off >= o->len || off >= TCP_OPTS_MAX - 1)
		return 1;
	kind = o->bytes[MASKED(off, TCP_OPTS_BUF - 1)];
	if (kind == TCPOPT_EOL)
		return 1;
	if (kind == TCPOPT_NOP) {
		o->scan = off + 1;
		return 0;
	}
	olen = o->bytes[MASKED(off + 1, TCP_OPTS_BUF - 1)];
	if (olen < 2 || off + olen > o->len)
		return 1;   /* malformed: what was read so far stands */
	if (kind == TCPOPT_MPTCP) {
		o->mptcp = 1;
	} else if (kind == TCPOPT_MSS && olen == 4) {
		o->mss = (o->bytes[MASKED(off + 2, TCP_OPTS_BUF - 1)] << 8) | o->bytes[MASKED(off + 3, TCP_OPTS_BUF - 1)];
	} else if (kind == TCPOPT_SACK_PERM && olen == 2) {
		o->has_sack = 1;
	} else if (kind == TCPOPT_TIMESTAMP && olen == 10) {
		__builtin_memcpy(&o->tsval, &o->bytes[MASKED(off + 2, TCP_OPTS_BUF / 2 - 1)], 4);
		o->tsval = bpf_ntohl(o->tsval);
		o->has_ts = 1;
	}
	o->scan = off + olen;
	return 0;
}

/* Edits a header's options in place (opt_edit_one, a bpf_loop callback like
 * scan_one_opt): SACK permitted and timestamps made NOPs when dropped, an MSS
 * above mss_max lowered to it. changed says whether anything was. */
struct opt_edit {
	__u8 *bytes;       /* the options (a stack or map buffer of TCP_OPTS_BUF bytes) */
	__u32 len;
	__u32 off;
	__u16 mss_max;     /* host order; 0: leave the MSS */
	__u8 drop_sack;
	__u8 drop_ts;
	__u8 changed;
};

static long opt_edit_one(__u32 index, void *ctx)
{
	struct opt_edit *e = ctx;
	__u8 *b = e->bytes, kind, olen;
	__u32 off = e->off, i;
	__u16 mss;

	(void)index;
	if (!b || off >= e->len || off >= TCP_OPTS_MAX - 1)
		return 1;
	kind = b[MASKED(off, TCP_OPTS_BUF - 1)];
	if (kind == TCPOPT_EOL)
		return 1;
	if (kind == TCPOPT_NOP) {
		e->off = off + 1;
		return 0;
	}
	olen = b[MASKED(off + 1, TCP_OPTS_BUF - 1)];
	if (olen < 2 || off + olen > e->len)
		return 1;
	if ((kind == TCPOPT_SACK_PERM && olen == 2 && e->drop_sack) ||
	    (kind == TCPOPT_TIMESTAMP && olen == 10 && e->drop_ts)) {
		for (i = 0; i < 10; i++)
			if (i < olen)
				b[MASKED(off + i, TCP_OPTS_BUF - 1)] = TCPOPT_NOP;
		e->changed = 1;
	} else if (kind == TCPOPT_MSS && olen == 4 && e->mss_max) {
		mss = (b[MASKED(off + 2, TCP_OPTS_BUF - 1)] << 8) | b[MASKED(off + 3, TCP_OPTS_BUF - 1)];
		if (mss > e->mss_max) {
			b[MASKED(off + 2, TCP_OPTS_BUF - 1)] = e->mss_max >> 8;
			b[MASKED(off + 3, TCP_OPTS_BUF - 1)] = e->mss_max & 0xff;
			e->changed = 1;
		}
	}
	e->off = off + olen;
	return 0;
}

/* Whether edit e changed the len bytes of options at bytes. */
static __always_inline int edit_opts(__u8 *bytes, __u32 len, __u16 mss_max, int drop_sack, int drop_ts)
{
	struct opt_edit e = { .bytes = bytes, .len = len, .mss_max = mss_max, .drop_sack = drop_sack,
			      .drop_ts = drop_ts };

	if (!mss_max && !drop_sack && !drop_ts)
		return 0;
	bpf_loop(TCP_OPTS_MAX, opt_edit_one, &e, 0);
	return e.changed;
}

/* TCP payload bytes of the segment (the IP header's length, less both headers). */
static __always_inline __u32 payload_len(const struct tcp_pkt *p)
{
	__u32 ip_len, hdrs = p->tcp.doff * 4;

	if (p->family == 4) {
		ip_len = bpf_ntohs(p->ip.v4.tot_len);
		hdrs += p->l4_off - ETH_HLEN;
	} else {
		ip_len = bpf_ntohs(p->ip.v6.payload_len);
	}
	return ip_len > hdrs ? ip_len - hdrs : 0;
}

/* Zero: o holds p's options, read and scanned. Non-zero: the header's data
 * offset is out of range (less than 5 words, or past the packet's end). */
static __always_inline int read_syn_opts(struct __sk_buff *skb, const struct tcp_pkt *p, struct syn_opts *o)
{
	__u32 hdr = p->tcp.doff * 4;

	o->mptcp = 0;
	o->has_ts = 0;
	o->tsval = 0;
	o->mss = 0;
	o->has_sack = 0;
	if (hdr < sizeof(struct tcphdr) || hdr > sizeof(struct tcphdr) + TCP_OPTS_MAX)
		return -1;
	o->len = hdr - sizeof(struct tcphdr);
	o->payload = payload_len(p);
	if (o->len && bpf_skb_load_bytes(skb, p->l4_off + sizeof(struct tcphdr), o->bytes, o->len))
		return -1;
	struct scan_ctx ctx = { .o = o };

	o->scan = 0;
	bpf_loop(TCP_OPTS_MAX, scan_one_opt, &ctx, 0);
	return 0;
}

/* a is after b in sequence space */
static __always_inline int seq_after(__u32 a, __u32 b)
{
	return (__s32)(a - b) > 0;
}

/* A connection's opening SYN (or its retransmission): SYN without ACK. */
static __always_inline int is_first_syn(const struct tcp_pkt *p)
{
	return (p->flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN;
}

static __always_inline int is_syn_ack(const struct tcp_pkt *p)
{
	return (p->flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == (TCP_FLAG_SYN | TCP_FLAG_ACK);
}

/* An ACK of no handshake's first two segments and no reset: what answers a
 * SYN cookie. */
static __always_inline int is_bare_ack(const struct tcp_pkt *p)
{
	return (p->flags & (TCP_FLAG_SYN | TCP_FLAG_RST | TCP_FLAG_ACK)) == TCP_FLAG_ACK;
}

#endif /* PEP_FLOW_PARSE_H */
