/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The steering maps and the counters kept in them. Layouts and meanings are
 * in pep_steer.h (the contract with pepctl); this file only declares them.
 *
 * The maps carry no `pinning` attribute on purpose: a loader pins them
 * where it chooses (`bpftool prog loadall ... pinmaps DIR`). With
 * LIBBPF_PIN_BY_NAME every loader on the host would share one set under
 * /sys/fs/bpf, and two labs (or two test runs) would steer each other.
 */
#ifndef PEP_STEER_MAPS_H
#define PEP_STEER_MAPS_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "pep_steer.h"

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, PEP_VLAN_MAX);
	__type(key, __u32);              /* VID */
	__type(value, struct vlan_port);
} vlan_ports SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, PEP_PORTS_MAX);
	__type(key, __u32);              /* ifindex of c_out / s_out */
	__type(value, struct port_vlan);
} port_vlans SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, PEP_VLAN_MAX);
	__type(key, __u32);              /* VID */
	__type(value, struct vlan_stats);
} vlan_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, REASON_MAX);
	__type(key, __u32);              /* enum steer_reason */
	__type(value, __u64);
} reason_stats SEC(".maps");

/* Per-CPU slots: plain increments, no atomics needed. */
static __always_inline void count_reason(__u32 reason)
{
	__u64 *n = bpf_map_lookup_elem(&reason_stats, &reason);

	if (n)
		*n += 1;
}

static __always_inline void count_in(__u32 vid, __u32 len)
{
	struct vlan_stats *s = bpf_map_lookup_elem(&vlan_stats, &vid);

	if (s) {
		s->in_packets += 1;
		s->in_bytes += len;
	}
}

static __always_inline void count_out(__u32 vid, __u32 len)
{
	struct vlan_stats *s = bpf_map_lookup_elem(&vlan_stats, &vid);

	if (s) {
		s->out_packets += 1;
		s->out_bytes += len;
	}
}

#endif /* PEP_STEER_MAPS_H */
