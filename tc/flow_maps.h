/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The maps of the per-flow bypass datapath and its counters. Layouts and
 * meanings are in pep_bypass.h (the contract with pepctl); this file only
 * declares them.
 *
 * No `pinning` attribute, as in steer_maps.h: the loader pins them per graph
 * (`bpftool prog loadall ... pinmaps DIR/maps`), so two graphs never share a
 * flow table or a rule set.
 */
#ifndef PEP_BYPASS_MAPS_H
#define PEP_BYPASS_MAPS_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "pep_bypass.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, __u32);                  /* ifindex of c_in / s_in */
	__type(value, struct side_config);
} side_config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, BYPASS_FLOWS_MAX);
	__type(key, struct flow_key);
	__type(value, struct flow_value);
} flow_table SEC(".maps");

/* Rule sets: the value is non-zero when the rule is present, so a more
 * specific prefix stored with 0 carves an exception out of a wider one. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, BYPASS_RULES_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);  /* the kernel requires it of LPM tries */
	__type(key, struct lpm4_key);
	__type(value, __u32);
} bypass_client4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, BYPASS_RULES_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct lpm4_key);
	__type(value, __u32);
} bypass_server4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, BYPASS_RULES_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct lpm6_key);
	__type(value, __u32);
} bypass_client6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, BYPASS_RULES_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct lpm6_key);
	__type(value, __u32);
} bypass_server6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, BYPASS_PORTS_MAX);
	__type(key, __u32);                  /* destination port of the SYN, host order */
	__type(value, __u32);
} bypass_ports SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct proxy_state);
} proxy_state SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, CNT_MAX);
	__type(key, __u32);                  /* enum bypass_counter */
	__type(value, __u64);
} bypass_stats SEC(".maps");

/* Per-CPU slots: plain increments, no atomics needed. */
static __always_inline void count(__u32 counter)
{
	__u64 *n = bpf_map_lookup_elem(&bypass_stats, &counter);

	if (n)
		*n += 1;
}

#endif /* PEP_BYPASS_MAPS_H */
