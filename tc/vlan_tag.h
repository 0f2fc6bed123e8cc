/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Reading the outer VLAN tag of a frame from either of its two homes:
 *
 *   - skb metadata (vlan_present, vlan_tci, vlan_proto). On a live receive
 *     path the kernel untags one level before tc ingress runs
 *     (skb_vlan_untag() in __netif_receive_skb_core), so the packet bytes
 *     are the MACs followed by the inner ethertype.
 *   - in-band, right after the MACs. BPF_PROG_TEST_RUN hands the program
 *     the bytes as given, and its __sk_buff ctx may not set vlan_* fields,
 *     so this is the form the golden-packet tests exercise.
 *
 * Only the outer tag is read: a graph's VLAN carries untagged IP, and
 * anything deeper is the caller's business (it drops it).
 */
#ifndef PEP_VLAN_TAG_H
#define PEP_VLAN_TAG_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>
#include "skb_read.h"

#define VLAN_VID_MASK 0x0fff
#define ETH_TYPE_OFF 12        /* ethertype (or TPID) after the two MACs */

enum tag_kind {
	TAG_NONE,   /* no tag: plain Ethernet */
	TAG_8021Q,  /* outer tag is 802.1Q; tci and inner are valid */
	TAG_OTHER,  /* outer tag with another TPID (802.1ad) */
	TAG_RUNT,   /* shorter than the header it claims */
};

struct outer_tag {
	__u16 tci;    /* host order, PCP/DEI bits included */
	__u16 inner;  /* host order ethertype that follows the tag */
};


static __always_inline enum tag_kind read_outer_tag(struct __sk_buff *skb, struct outer_tag *tag)
{
	__be16 h[3];  /* ethertype; then TCI and inner ethertype when in-band */

	if (skb->vlan_present) {
		/* vlan_proto is in network order, vlan_tci in host order */
		if (skb->vlan_proto != bpf_htons(ETH_P_8021Q))
			return TAG_OTHER;
		if (load_hdr(skb, ETH_TYPE_OFF, h, sizeof(h[0])))
			return TAG_RUNT;
		tag->tci = skb->vlan_tci;
		tag->inner = bpf_ntohs(h[0]);
		return TAG_8021Q;
	}

	if (load_hdr(skb, ETH_TYPE_OFF, h, sizeof(h[0])))
		return TAG_RUNT;
	/* Same TPIDs the kernel's own untagging knows (eth_type_vlan()) */
	if (h[0] == bpf_htons(ETH_P_8021AD))
		return TAG_OTHER;
	if (h[0] != bpf_htons(ETH_P_8021Q))
		return TAG_NONE;
	if (load_hdr(skb, ETH_TYPE_OFF + 2, &h[1], 2 * sizeof(h[0])))
		return TAG_RUNT;
	tag->tci = bpf_ntohs(h[1]);
	tag->inner = bpf_ntohs(h[2]);
	return TAG_8021Q;
}

#endif /* PEP_VLAN_TAG_H */
