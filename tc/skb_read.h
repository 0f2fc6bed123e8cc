/* SPDX-License-Identifier: GPL-2.0 */
/* Reading packet headers, shared by the steering and flow programs. */
#ifndef PEP_SKB_READ_H
#define PEP_SKB_READ_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

/*
 * Copies len header bytes at off into to. Headers this short sit in the
 * linear area on every path we know, so direct access is the rule; the
 * helper copy covers a frame whose headers are paged. Non-zero: the frame
 * ends before off + len. off is bounded by the callers (at most
 * ETH_HLEN + 60), which the verifier needs for the direct access.
 */
static __always_inline int load_hdr(struct __sk_buff *skb, __u32 off, void *to, __u32 len)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;

	if (data + off + len <= data_end) {
		__builtin_memcpy(to, data + off, len);
		return 0;
	}
	return bpf_skb_load_bytes(skb, off, to, len);
}

#endif /* PEP_SKB_READ_H */
