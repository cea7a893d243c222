/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* maps.h: conntrack's configuration, maps and clock, and the helpers that only touch them. */
#ifndef FLOWPLANE_CT_MAPS_H
#define FLOWPLANE_CT_MAPS_H

#include "common.h"
#include "stats.h"
#include "conntrack.h"

#define NSEC_PER_SEC 1000000000ULL

#define ICMP_ECHOREPLY	    0
#define ICMP_DEST_UNREACH   3
#define ICMP_SOURCE_QUENCH  4
#define ICMP_REDIRECT	    5
#define ICMP_ECHO	    8
#define ICMP_TIME_EXCEEDED  11
#define ICMP_PARAMETERPROB  12
#define ICMPV6_ECHO_REQUEST 128
#define ICMPV6_ECHO_REPLY   129

/* 0: firewall (drop what the policy refuses); 1: track only (never drop). */
volatile const __u32 track_only = 0;
/* nf_conntrack_tcp_max_retrans: after this many identical ACK segments in a row the timeout is
 * capped at tcp_retrans. */
volatile const __u32 tcp_max_retrans = 3;
/* Length of a jiffy in ns (10^9 / CONFIG_HZ) and jiffies at boot (INITIAL_JIFFIES), set by the
 * loader: ct_now is then close to CLOCK_MONOTONIC, the clock of tables pinned by older builds. */
volatile const __u64 jiffy_ns = 0;
volatile const __u64 jiffies_base = 0;

/* key = struct ct_key, value = struct ct_entry: confirmed connections (reply seen) */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct ct_key);
	__type(value, struct ct_entry);
	__uint(max_entries, 262144);
} ct_main SEC(".maps");

/* key = struct ct_key, value = struct ct_entry: unconfirmed connections, LRU-evicted */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ct_key);
	__type(value, struct ct_entry);
	__uint(max_entries, 65536);
} ct_emb SEC(".maps");

/* key = 0, value = struct ct_config: timeouts and options, rewritten at run time */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct ct_config);
	__uint(max_entries, 1);
} ct_settings SEC(".maps");

/* key = ingress ifindex, value = enum ct_role */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 64);
} ct_ifaces SEC(".maps");

/* key = egress ifindex, value = ifindex: where bpf_redirect_map may send */
struct {
	__uint(type, BPF_MAP_TYPE_DEVMAP_HASH);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 64);
} tx_ports SEC(".maps");

/* key = ifindex (< CT_IFMAC_MAX), value = struct ct_ifmac: attached interfaces' MACs */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct ct_ifmac);
	__uint(max_entries, CT_IFMAC_MAX);
} ct_ifmac SEC(".maps");

/* key = struct ct_port_key, value = 1: outside may open connections to this port */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct ct_port_key);
	__type(value, __u8);
	__uint(max_entries, 1024);
} ct_allow_port SEC(".maps");

/* key = struct ct_lpm_key, value = 1: outside may open connections to this prefix */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct ct_lpm_key);
	__type(value, __u8);
	__uint(max_entries, 1024);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} ct_allow_net SEC(".maps");

/* ring buffer of struct ct_event: connection created / destroyed */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} ct_events SEC(".maps");

/* key = 0, value = struct ct_entry: per-CPU scratch space to build a new entry in (the stack is
 * too small for it next to everything else) */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct ct_entry);
	__uint(max_entries, 1);
} ct_scratch SEC(".maps");

/* key = enum ct_stat, value = per-CPU count */
FP_COUNTERS(ct_stats, enum ct_stat, CT_STAT_MAX);

/* Keep the enums in BTF for bpf2go -type. */
const enum ct_tcp_state *unused_state __attribute__((unused));
const enum ct_timeout *unused_timeout __attribute__((unused));
const enum ct_role *unused_role __attribute__((unused));
const enum ct_tcp_flag *unused_tcp_flag __attribute__((unused));
const enum ct_event_type *unused_event __attribute__((unused));
const struct ct_event *unused_ev __attribute__((unused));

/* ct_now is the entries' clock: nf_conntrack's jiffies, in ns. bpf_jiffies64 is a plain read;
 * the ktime helpers cost several times more, per packet. User space reads the same clock. */
static __always_inline __u64 ct_now(void)
{
	return (bpf_jiffies64() - jiffies_base) * jiffy_ns;
}

/* ---- timeouts ---- */

static __always_inline __u64 timeout_ns(struct ct_config *cfg, __u32 slot)
{
	if (!cfg || slot >= CT_TO_MAX)
		return 30 * NSEC_PER_SEC;
	return (__u64)cfg->timeout[slot] * NSEC_PER_SEC;
}

static __always_inline void emit(struct ct_key *key, __u32 type, __u32 status, __u32 state)
{
	struct ct_event *ev = bpf_ringbuf_reserve(&ct_events, sizeof(*ev), 0);

	if (!ev)
		return;
	ev->ts = bpf_ktime_get_ns();
	ev->key = *key;
	ev->type = type;
	ev->status = status;
	ev->state = state;
	ev->pad = 0;
	bpf_ringbuf_submit(ev, 0);
}

#endif
