// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* host.bpf.c: advertises a TCP connection's send backlog in its data segments. A sock_ops
 * program on a cgroup v2: a connection that a selector takes (remote/local prefix, port ranges,
 * direction) turns on the header-option callbacks, an active opener before its SYN, a passive one
 * when it is established; then its SYN and every segment that carries data (and the MSS
 * computation, so segments stay within the MTU) reserve 8 bytes,
 * and the write callback fills them with the RFC 6994 option of prio.h: unsent bytes
 * (write_seq - snd_nxt, the segment itself included) and the share of the send buffer they
 * occupy (near 100 %: the writer is blocked behind data the network does not take). The SYN
 * carries it so a router knows the flow from its first packet (a new connection's handshake
 * must not wait in the default band); pure ACKs carry nothing. Always returns 1: it never refuses
 * what another program on the cgroup allows. */
#include "common.h"
#include "stats.h"
#include "prio.h"

#define TCPHDR_SYN 0x02 /* skb_tcp_flags bit, include/net/tcp.h */

/* Number of valid entries in prio_selectors, set by the loader. */
volatile const __u32 nselectors = 0;

/* key = index < nselectors, value = struct prio_selector */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct prio_selector);
	__uint(max_entries, PRIO_MAX_SELECTORS);
} prio_selectors SEC(".maps");

/* key = enum prio_host_stat, value = per-CPU count */
FP_COUNTERS(prio_host_stats, enum prio_host_stat, PRIO_HOST_STAT_MAX);

const enum prio_scheme *unused_scheme __attribute__((unused)); /* keep the enums in BTF */
const struct prio_flow_key *unused_flow_key __attribute__((unused));
const struct prio_flow *unused_flow __attribute__((unused));
const struct prio_lpm_key *unused_lpm __attribute__((unused));
const enum prio_source *unused_source __attribute__((unused));

/* prefix_match: the first len bits of a and p agree. */
static __always_inline int prefix_match(const __u8 *a, const __u8 *p, __u32 len)
{
#pragma unroll
	for (int i = 0; i < 16; i++) {
		__u32 bits = len > (__u32)i * 8 ? len - i * 8 : 0;
		__u8 mask;

		if (bits == 0)
			break;
		mask = bits >= 8 ? 0xff : (__u8)(0xff << (8 - bits));
		if ((a[i] ^ p[i]) & mask)
			return 0;
	}
	return 1;
}

/* selected: a selector takes the connection of skops established in direction dir. */
static __always_inline int selected(struct bpf_sock_ops *skops, __u8 dir)
{
	__u32 remote[4] = {}, local[4] = {}; /* IPv4 mapped into IPv6, as the selectors */
	/* remote_port is a 32-bit word in network order: bpf_ntohl gives the port */
	__u16 rport = bpf_ntohl(skops->remote_port), lport = skops->local_port;

	if (skops->family == AF_INET) {
		__u32 rip4 = skops->remote_ip4, lip4;

		barrier_var(rip4); /* keep the two loads apart: no derived context pointer */
		lip4 = skops->local_ip4;
		barrier_var(lip4);
		remote[2] = local[2] = bpf_htonl(0xffff);
		remote[3] = rip4;
		local[3] = lip4;
	} else if (skops->family == AF_INET6) {
		/* one plain load per field: the verifier refuses derived context pointers */
		remote[0] = skops->remote_ip6[0];
		remote[1] = skops->remote_ip6[1];
		remote[2] = skops->remote_ip6[2];
		remote[3] = skops->remote_ip6[3];
		local[0] = skops->local_ip6[0];
		local[1] = skops->local_ip6[1];
		local[2] = skops->local_ip6[2];
		local[3] = skops->local_ip6[3];
	} else {
		return 0;
	}
	for (__u32 i = 0; i < PRIO_MAX_SELECTORS; i++) {
		struct prio_selector *s;
		__u32 k = i;

		if (i >= nselectors)
			break;
		s = bpf_map_lookup_elem(&prio_selectors, &k);
		if (!s)
			break;
		if (!(s->directions & dir) || rport < s->remote_lo || rport > s->remote_hi ||
		    lport < s->local_lo || lport > s->local_hi)
			continue;
		if (prefix_match((__u8 *)remote, s->remote, s->remote_len) &&
		    prefix_match((__u8 *)local, s->local, s->local_len))
			return 1;
	}
	return 0;
}

/* advertise writes the option into the segment being sent. */
static __always_inline void advertise(struct bpf_sock_ops *skops)
{
	struct bpf_sock *sk = skops->sk;
	struct tcp_sock *tp;
	__u32 unsent, units, sndbuf, wmem, queued;
	__u8 opt[PRIO_OPT_LEN];
	__u8 occ = PRIO_OCC_UNKNOWN;

	struct tcphdr *th = skops->skb_data;

	/* The segment's TCP header is in [skb_data, skb_data_end); skb_len counts it too. */
	if ((void *)(th + 1) > skops->skb_data_end || (skops->skb_len <= th->doff * 4 && !th->syn))
		return; /* a pure ACK: nothing was reserved */
	if (!sk)
		return;
	tp = bpf_skc_to_tcp_sock(sk);
	if (!tp) {
		fp_count(&prio_host_stats, PRIO_HOST_NO_TCP_SOCK);
		return;
	}
	unsent = tp->write_seq - tp->snd_nxt;
	/* Occupancy: the share of the send buffer that backlog occupies, in the memory the kernel
	 * counts against sk_sndbuf (sk_wmem_queued: segments with their overhead, unsent and in
	 * flight), apportioned to the unsent bytes. A blocked writer with a small window (starved)
	 * reads near 100 %; one whose data is mostly in flight reads low. Unsent bytes over
	 * sk_sndbuf alone would never pass about 50 %: SO_SNDBUF is doubled for the overhead. */
	sndbuf = tp->inet_conn.icsk_inet.sk.sk_sndbuf;
	wmem = tp->inet_conn.icsk_inet.sk.sk_wmem_queued;
	queued = tp->write_seq - tp->snd_una;
	if (sndbuf > 0 && wmem > 0 && queued >= unsent && queued > 0) {
		__u64 share = (__u64)wmem * unsent / queued * 100 / sndbuf;

		occ = share > 100 ? 100 : share;
	}
	units = (unsent + PRIO_BACKLOG_UNIT - 1) / PRIO_BACKLOG_UNIT;
	if (units > PRIO_BACKLOG_MAX)
		units = PRIO_BACKLOG_MAX;
	opt[0] = PRIO_OPT_KIND;
	opt[1] = PRIO_OPT_LEN;
	opt[2] = PRIO_EXID >> 8;
	opt[3] = PRIO_EXID & 0xff;
	opt[4] = occ;
	opt[5] = units >> 16;
	opt[6] = units >> 8;
	opt[7] = units;
	if (bpf_store_hdr_opt(skops, opt, sizeof(opt), 0) == 0)
		fp_count(&prio_host_stats, PRIO_HOST_WRITTEN);
}

SEC("sockops")
int prio_host(struct bpf_sock_ops *skops)
{
	__u8 dir = 0;

	switch (skops->op) {
	case BPF_SOCK_OPS_TCP_CONNECT_CB: /* before the SYN is built */
		dir = PRIO_DIR_ACTIVE;
		break;
	case BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB:
		dir = PRIO_DIR_PASSIVE;
		break;
	case BPF_SOCK_OPS_HDR_OPT_LEN_CB:
		/* Reserve when the kernel sizes the MSS too (no skb then), or data segments would
		 * outgrow it. A pure ACK (no payload, no SYN) gets nothing. */
		if (!(skops->args[0] & BPF_WRITE_HDR_TCP_CURRENT_MSS) && skops->skb_len == 0 &&
		    !(skops->skb_tcp_flags & TCPHDR_SYN))
			return 1;
		if (bpf_reserve_hdr_opt(skops, PRIO_OPT_LEN, 0) != 0 &&
		    !(skops->args[0] & BPF_WRITE_HDR_TCP_CURRENT_MSS))
			fp_count(&prio_host_stats, PRIO_HOST_NO_ROOM);
		return 1;
	case BPF_SOCK_OPS_WRITE_HDR_OPT_CB:
		advertise(skops);
		return 1;
	default:
		return 1;
	}
	if (selected(skops, dir)) {
		fp_count(&prio_host_stats, PRIO_HOST_MATCHED);
		bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags |
						     BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG);
	} else {
		fp_count(&prio_host_stats, PRIO_HOST_UNMATCHED);
	}
	return 1;
}

char _license[] SEC("license") = "Dual BSD/GPL";
