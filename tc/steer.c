// SPDX-License-Identifier: GPL-2.0
/*
 * VLAN steering between a trunk NIC and the c_out/s_out ports of the proxy
 * graphs. Two tc direct-action programs sharing the maps of steer_maps.h:
 *
 *   trunk_ingress  on the trunk's clsact ingress: an 802.1Q frame of a VID
 *                  some graph owns loses its tag and leaves by that graph's
 *                  port; everything else goes to the host's stack untouched.
 *   port_ingress   on each port's clsact ingress: the frame gets its port's
 *                  tag and leaves by the trunk.
 *
 * Both are one array or hash lookup per frame, whatever the number of graphs.
 * The verdicts and reason counters are in pep_steer.h.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "pep_steer.h"
#include "steer_maps.h"
#include "vlan_tag.h"

char _license[] SEC("license") = "GPL";

static __always_inline int pass(__u32 reason)
{
	count_reason(reason);
	return TC_ACT_OK;
}

static __always_inline int drop(__u32 reason)
{
	count_reason(reason);
	return TC_ACT_SHOT;
}

SEC("tc")
int trunk_ingress(struct __sk_buff *skb)
{
	const struct vlan_port *port;
	struct outer_tag tag;
	__u32 vid, ifindex;

	switch (read_outer_tag(skb, &tag)) {
	case TAG_NONE:
		return pass(REASON_PASS_UNTAGGED);
	case TAG_OTHER:
		return pass(REASON_PASS_OTHER_TPID);
	case TAG_RUNT:
		/* It says 802.1Q but ends before the tag does: there is no
		 * VID to steer by, and the stack would discard it anyway. */
		return drop(REASON_DROP_RUNT);
	case TAG_8021Q:
		break;
	}

	vid = tag.tci & VLAN_VID_MASK;
	port = bpf_map_lookup_elem(&vlan_ports, &vid);
	if (!port || !port->ifindex)
		return pass(REASON_PASS_UNKNOWN_VLAN);
	ifindex = port->ifindex;

	/* A graph's VLAN carries untagged IP and the proxy namespace has no
	 * VLAN devices: a second tag could only be misdelivered, or hop into
	 * another VLAN on the way back. */
	if (tag.inner == ETH_P_8021Q || tag.inner == ETH_P_8021AD)
		return drop(REASON_DROP_NESTED_TAG);

	/* Delivering it still tagged would put it in the wrong VLAN's
	 * namespace as garbage; the sender retransmits. */
	if (bpf_skb_vlan_pop(skb))
		return drop(REASON_DROP_POP_FAILED);

	count_in(vid, skb->len);
	return bpf_redirect(ifindex, 0);
}

SEC("tc")
int port_ingress(struct __sk_buff *skb)
{
	const struct port_vlan *pv;
	__u32 ifindex = skb->ifindex;
	__u32 vid, trunk, len;

	pv = bpf_map_lookup_elem(&port_vlans, &ifindex);
	/* Attached to a port the control plane has not registered (or has
	 * just removed): with no VID to tag it by, the frame can only go
	 * wrong: untagged onto the trunk, or into the host's own stack. */
	if (!pv)
		return drop(REASON_DROP_UNKNOWN_PORT);
	vid = pv->vid & VLAN_VID_MASK;  /* never let a bad entry set PCP bits */
	trunk = pv->trunk_ifindex;
	len = skb->len;                 /* counted untagged, like "in" */

	/* Sent untagged, it would land in the trunk peer's native VLAN. */
	if (bpf_skb_vlan_push(skb, bpf_htons(ETH_P_8021Q), vid))
		return drop(REASON_DROP_PUSH_FAILED);

	count_out(vid, len);
	return bpf_redirect(trunk, 0);
}
