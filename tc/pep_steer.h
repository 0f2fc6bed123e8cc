/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The contract between the tc steering datapath (tc/steer.c) and the control
 * plane (pepctl/steering.py). Map names, struct layouts and reason codes live
 * here and only here.
 *
 * If you change this file, change with it:
 *   - pepctl/steering.py   (struct formats, REASONS list, map names)
 *   - tests/bpf/test_steer_golden.py (expected reasons)
 *
 * The picture, per host (or per lab switch, which runs the same program):
 *
 *   trunk NIC ingress  --[trunk_ingress]-->  tagged VID v: pop tag, redirect to
 *                                            vlan_ports[v].ifindex (egress)
 *   port ingress       --[port_ingress]--->  push port_vlans[ifindex].vid,
 *   (c_out / s_out)                          redirect to its trunk (egress)
 *
 * Untagged frames and unknown VLANs on the trunk go to the host's own stack
 * untouched: management traffic shares the NIC.
 */
#ifndef PEP_STEER_H
#define PEP_STEER_H

#define PEP_VLAN_MAX 4096      /* VIDs 0..4095; 0 and 4095 are reserved */
#define PEP_PORTS_MAX 8192     /* c_out + s_out of up to 4094 graphs */

/* vlan_ports: ARRAY indexed by VID. ifindex 0 means "no graph owns this VID". */
struct vlan_port {
	__u32 ifindex;  /* where the untagged frame goes (egress of c_out/s_out) */
	__u32 flags;    /* reserved, 0 */
};

/* port_vlans: HASH keyed by the ifindex of a port (c_out/s_out) */
struct port_vlan {
	__u32 vid;            /* tag pushed on frames leaving by the trunk */
	__u32 trunk_ifindex;  /* the NIC they leave by */
};

/* vlan_stats: PERCPU_ARRAY indexed by VID. "in" is trunk -> graph (popped),
 * "out" is graph -> trunk (pushed). A graph is its access and origin VIDs, so
 * the four directions of a graph are in/out of each of its two VIDs.
 * Bytes are the frame as the port sees it: L2, untagged, no FCS. */
struct vlan_stats {
	__u64 in_packets;
	__u64 in_bytes;
	__u64 out_packets;
	__u64 out_bytes;
};

/* reason_stats: PERCPU_ARRAY of __u64 packet counts indexed by reason. */
enum steer_reason {
	REASON_PASS_UNTAGGED = 0,  /* no tag: the host's own traffic */
	REASON_PASS_UNKNOWN_VLAN,  /* 802.1Q tag of a VID no graph owns */
	REASON_PASS_OTHER_TPID,    /* outer tag is not 802.1Q (e.g. 802.1ad QinQ) */
	REASON_DROP_RUNT,          /* too short to hold the header it claims */
	REASON_DROP_NESTED_TAG,    /* a graph's VID carrying another tag: the
				    * proxy namespace has no VLAN devices */
	REASON_DROP_POP_FAILED,    /* bpf_skb_vlan_pop() failed */
	REASON_DROP_PUSH_FAILED,   /* bpf_skb_vlan_push() failed */
	REASON_DROP_UNKNOWN_PORT,  /* port_ingress on an ifindex with no entry */
	REASON_MAX
};

#endif /* PEP_STEER_H */
