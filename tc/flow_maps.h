/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The maps of the flow datapath and its per-graph counters. Layouts and
 * meanings are in pep_flow.h (the contract with pepctl); this file only
 * declares them.
 *
 * No `pinning` attribute, as in steer_maps.h: the loader pins them per
 * instance (`bpftool prog loadall ... pinmaps DIR/maps`). Every graph of the
 * instance shares them; keys carry the graph slot.
 *
 * Hash maps of rules and addresses are allocated on demand
 * (BPF_F_NO_PREALLOC): they are sized for all graphs together and mostly
 * empty, and they change only when pepctl writes them. flows_new is
 * preallocated: it takes a SYN flood's inserts.
 */
#ifndef PEP_FLOW_MAPS_H
#define PEP_FLOW_MAPS_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "pep_flow.h"

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, PEP_GRAPHS_MAX);
	__type(key, __u32);                  /* graph slot */
	__type(value, struct graph_config);
} graphs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, ADDRS_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct addr_key);
	__type(value, __u32);
} graph_addrs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, PORTS_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct port_key);
	__type(value, __u32);
} bypass_ports SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, PORTS_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct port_key);
	__type(value, __u32);
} intercept_ports SEC(".maps");

/* Rule sets: the value is non-zero when the rule is present, so a more
 * specific prefix stored with 0 carves an exception out of a wider one. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, RULES_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);  /* the kernel requires it of LPM tries */
	__type(key, struct lpm4_key);
	__type(value, __u32);
} bypass_client4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, RULES_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct lpm4_key);
	__type(value, __u32);
} bypass_server4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, RULES_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct lpm6_key);
	__type(value, __u32);
} bypass_client6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, RULES_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct lpm6_key);
	__type(value, __u32);
} bypass_server6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, FLOWS_NEW_MAX);
	__type(key, struct flow_key);
	__type(value, struct flow_new);
} flows_new SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, FLOWS_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct flow_key);
	__type(value, struct flow_est);
} flows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, SYNS_MAX);
	__type(key, struct flow_key);
	__type(value, struct flow_syn);
} syns SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MARKS_MAX);
	__type(key, struct flow_key);
	__type(value, struct flow_marks);
} marks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MEASURED_MAX);
	__type(key, struct flow_key);
	__type(value, struct flow_meas);
} measured SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_QUEUE);
	__uint(max_entries, RECORDS_MAX);
	__type(value, struct flow_record);
} flow_records SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, PEP_GRAPHS_MAX);
	__type(key, __u64);                  /* netns cookie */
	__type(value, __u32);                /* graph slot */
} netns_slots SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, PEP_GRAPHS_MAX + 1);
	__type(key, __u32);                  /* graph slot; PEP_GRAPHS_MAX: all graphs */
	__type(value, __u64);
} conns SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);  /* the kernel requires it of socket storage */
	__type(key, int);
	__type(value, struct conn_tag);
} conn_tags SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, PEP_GRAPHS_MAX * CNT_MAX);
	__type(key, __u32);                  /* graph slot * CNT_MAX + enum flow_counter */
	__type(value, __u64);
} flow_stats SEC(".maps");

/* Per-CPU slots: plain increments, no atomics needed. */
static __always_inline void count(__u32 slot, __u32 counter)
{
	__u32 idx = slot * CNT_MAX + counter;
	__u64 *n = bpf_map_lookup_elem(&flow_stats, &idx);

	if (n)
		*n += 1;
}

/* A rule or address map's answer: present when stored non-zero. */
static __always_inline int present(const __u32 *v)
{
	return v && *v;
}

#endif /* PEP_FLOW_MAPS_H */
