// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* host.bpf.c: advertises a TCP connection's send backlog in its data segments. A sock_ops
 * program on a cgroup v2: a connection that a selector takes (remote/local prefix, port ranges,
 * direction) gets socket storage and turns on the header-option callbacks, an active opener
 * before its SYN, a passive one when it is established. The option (RFC 6994, prio.h) carries
 * unsent bytes (write_seq - snd_nxt, the segment itself included) and the share of the send
 * buffer they occupy (near 100 %: the writer is blocked behind data the network does not take).
 * The SYN carries it so a router knows the flow from its first packet (a new connection's
 * handshake must not wait in the default band); pure ACKs carry nothing. A data segment carries
 * it when the advertisement changed by a step since the connection last wrote it, no sooner than
 * min_interval_ns after that write (its first data segment excepted), or when it last wrote it
 * refresh_ns ago (refresh_ns 0: every data segment): any option past timestamps takes a plain
 * Linux receiver off its header-prediction fast path, so a segment that tells the router nothing
 * new goes without, and a flow whose backlog swings with every send does not carry it on most
 * of its segments (docs/prio.md, "Cost"). The length callback decides and records the
 * advertisement; the write callback writes what it recorded, and only into room it reserved itself
 * (another program's reservation reaches the write callback too). Segments keep the room only
 * when the kernel sized their MSS around a write (size_room). Always returns 1: it never
 * refuses what another program on the cgroup allows. */
#include "common.h"
#include "stats.h"
#include "prio.h"

#define TCPHDR_SYN 0x02 /* skb_tcp_flags bit, include/net/tcp.h */

/* Number of valid entries in prio_selectors, set by the loader. */
volatile const __u32 nselectors = 0;
/* The longest a sending connection goes without writing the option, on the coarse clock; 0:
 * write it on every data segment. */
volatile const __u64 refresh_ns = 0;
/* The shortest a connection goes between two writes after its first data segment's, on the
 * coarse clock (the loader adds a tick); 0: every step. Only with refresh_ns. */
volatile const __u64 min_interval_ns = 0;

/* A step worth writing: backlog by an eighth of what was last written, occupancy by 5 points.
 * The truth then differs from what the router holds by less than an eighth of it (backlog) and
 * 5 points (occupancy) (docs/prio.md, "How it works"). */
#define BACKLOG_STEP_SHIFT 3
#define OCC_STEP	   5

/* A selected connection's advertisement. */
struct written {
	__u64 at;    /* coarse clock ns of the last write; 0: none yet */
	__u32 units; /* backlog of the last write, or the one about to be written */
	__u8 occ;
	__u8 pending; /* the length callback reserved room for it on the segment being built */
	__u8 data;    /* a data segment carried it */
	__u8 room;    /* the kernel's last MSS sizing left room for it */
};

/* key = a socket the selectors took, value = struct written */
struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct written);
} prio_written SEC(".maps");

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

/* backlog computes the advertisement of tp: unsent bytes in PRIO_BACKLOG_UNIT units and the
 * occupancy %. */
static __always_inline void backlog(struct tcp_sock *tp, __u32 *units, __u8 *occ)
{
	__u32 unsent = tp->write_seq - tp->snd_nxt, sndbuf, wmem, queued;

	/* Occupancy: the share of the send buffer that backlog occupies, in the memory the kernel
	 * counts against sk_sndbuf (sk_wmem_queued: segments with their overhead, unsent and in
	 * flight), apportioned to the unsent bytes. A blocked writer with a small window (starved)
	 * reads near 100 %; one whose data is mostly in flight reads low. Unsent bytes over
	 * sk_sndbuf alone would never pass about 50 %: SO_SNDBUF is doubled for the overhead. */
	sndbuf = tp->inet_conn.icsk_inet.sk.sk_sndbuf;
	wmem = tp->inet_conn.icsk_inet.sk.sk_wmem_queued;
	queued = tp->write_seq - tp->snd_una;
	*occ = PRIO_OCC_UNKNOWN;
	if (sndbuf > 0 && wmem > 0 && queued >= unsent && queued > 0) {
		__u64 share = (__u64)wmem * unsent / queued * 100 / sndbuf;

		*occ = share > 100 ? 100 : share;
	}
	*units = (unsent + PRIO_BACKLOG_UNIT - 1) / PRIO_BACKLOG_UNIT;
	if (*units > PRIO_BACKLOG_MAX)
		*units = PRIO_BACKLOG_MAX;
}

/* stepped: the advertisement moved by a step from the last one written. */
static __always_inline int stepped(const struct written *w, __u32 units, __u8 occ)
{
	__u32 d = units > w->units ? units - w->units : w->units - units;

	if (d && d << BACKLOG_STEP_SHIFT >= w->units)
		return 1; /* a change from or to 0 included */
	if (occ == w->occ)
		return 0;
	if (occ > 100 || w->occ > 100)
		return 1; /* known <-> unknown */
	return occ + OCC_STEP <= w->occ || w->occ + OCC_STEP <= occ;
}

/* due decides whether an advertisement of units and occ is worth writing at now (0: no refresh
 * clock), and if not why: PRIO_HOST_UNCHANGED or PRIO_HOST_HELD; PRIO_HOST_WRITTEN if it is. */
static __always_inline int due(const struct written *w, __u32 units, __u8 occ, __u64 now)
{
	if (!refresh_ns || !w->at || now - w->at >= refresh_ns)
		return PRIO_HOST_WRITTEN;
	if (!stepped(w, units, occ))
		return PRIO_HOST_UNCHANGED;
	/* A step, too soon: a CPU-bound bulk flow's backlog swings between a whole GSO packet
	 * and its tail at every send, a step each time. */
	if (w->data && now - w->at < min_interval_ns)
		return PRIO_HOST_HELD;
	return PRIO_HOST_WRITTEN;
}

/* size_room decides, when the kernel sizes the MSS of the segments it is about to build or send,
 * whether they leave room for the option: when a write is due, before the connection's first data
 * segment, when nothing is queued (a new write, such as a request on a persistent connection,
 * comes next) and the last write is min_interval old, and while data cut with it is unsent (so a
 * flow whose queue never drains keeps it, as every flow once did). Room on every segment costs
 * every segment 8 bytes, and a Linux receiver whose segments come in below its own MSS grows
 * its receive buffer less: 6-10 % of a CPU-bound flow's throughput (docs/prio.md, "Cost"). */
static __always_inline void size_room(struct bpf_sock_ops *skops, struct bpf_sock *sk,
				      struct written *w)
{
	struct tcp_sock *tp = bpf_skc_to_tcp_sock(sk);
	__u64 now = refresh_ns ? bpf_ktime_get_coarse_ns() : 0;
	__u32 units;
	__u8 occ;

	if (!tp) {
		w->room = 0;
		return;
	}
	backlog(tp, &units, &occ);
	/* Unsent data cut with the room keeps it until sent: segments cut at one MSS and sent at
	 * another end in runts, and a runt in flight makes Linux hold a write's last partial
	 * segment until it is acknowledged (Nagle, Minshall's variant). */
	if (w->room && units && bpf_reserve_hdr_opt(skops, PRIO_OPT_LEN, 0) == 0)
		return;
	w->room = 0;
	/* Where the kernel probes the path MTU, tcp_mtu_probe sizes the MSS again inside
	 * tcp_write_xmit, after the sizing whose MSS the segments it sends were cut to: the room
	 * is reserved at every sizing there, so that the last one never claims room the
	 * segments lack. */
	if (!tp->inet_conn.icsk_mtup.enabled && w->data &&
	    due(w, units, occ, now) != PRIO_HOST_WRITTEN &&
	    (units || now - w->at < min_interval_ns))
		return;
	w->room = bpf_reserve_hdr_opt(skops, PRIO_OPT_LEN, 0) == 0;
}

/* A segment of at most this much payload under the MSS (tp->mss_cache, for the header without
 * SACK blocks) has room for the option however the MSS was sized: the option and the most SACK
 * blocks that leave room for it (two, 20 bytes). */
#define SMALL_SEGMENT_SLACK (PRIO_OPT_LEN + 20)

/* reserve decides whether the segment being built carries the option and, if so, reserves
 * room for it and records the advertisement in w. A data segment carries it only if the MSS it
 * was sized with left room for it (or it is small enough): room reserved now on a segment sized
 * without it would make it outgrow the MTU. */
static __always_inline void reserve(struct bpf_sock_ops *skops, struct bpf_sock *sk,
				    struct written *w, int syn)
{
	struct tcp_sock *tp = bpf_skc_to_tcp_sock(sk);
	__u64 now = 0;
	__u32 units;
	__u8 occ;
	int why;

	if (!tp) {
		fp_count(&prio_host_stats, PRIO_HOST_NO_TCP_SOCK);
		return;
	}
	backlog(tp, &units, &occ);
	if (refresh_ns)
		now = bpf_ktime_get_coarse_ns();
	if (!syn) {
		why = due(w, units, occ, now);
		if (why != PRIO_HOST_WRITTEN) {
			fp_count(&prio_host_stats, why);
			return;
		}
		if (!w->room && skops->skb_len + SMALL_SEGMENT_SLACK > tp->mss_cache) {
			fp_count(&prio_host_stats, PRIO_HOST_DEFERRED);
			return; /* the next MSS sizing leaves room */
		}
		/* An MTU probe (tcp_mtu_probe): one segment longer than the MSS, sized for the
		 * path MTU without the room. A packet of two segments is told from it only by
		 * length, and waits too. */
		if (tp->inet_conn.icsk_mtup.enabled &&
		    skops->skb_len + PRIO_OPT_LEN > tp->mss_cache &&
		    skops->skb_len < 2 * tp->mss_cache) {
			fp_count(&prio_host_stats, PRIO_HOST_DEFERRED);
			return;
		}
	}
	if (bpf_reserve_hdr_opt(skops, PRIO_OPT_LEN, 0) != 0) {
		fp_count(&prio_host_stats, PRIO_HOST_NO_ROOM);
		return; /* not written: the next segment compares with the last write */
	}
	w->at = now;
	w->units = units;
	w->occ = occ;
	w->pending = 1;
	w->data |= !syn;
}

/* advertise writes the option the length callback recorded, into the room it reserved. */
static __always_inline void advertise(struct bpf_sock_ops *skops, struct written *w)
{
	__u8 opt[PRIO_OPT_LEN];

	if (!w->pending)
		return;
	w->pending = 0;
	opt[0] = PRIO_OPT_KIND;
	opt[1] = PRIO_OPT_LEN;
	opt[2] = PRIO_EXID >> 8;
	opt[3] = PRIO_EXID & 0xff;
	opt[4] = w->occ;
	opt[5] = w->units >> 16;
	opt[6] = w->units >> 8;
	opt[7] = w->units;
	if (bpf_store_hdr_opt(skops, opt, sizeof(opt), 0) == 0)
		fp_count(&prio_host_stats, PRIO_HOST_WRITTEN);
}

SEC("sockops")
int prio_host(struct bpf_sock_ops *skops)
{
	struct bpf_sock *sk = skops->sk;
	struct written *w;
	__u8 dir = 0;

	if (!sk)
		return 1;
	switch (skops->op) {
	case BPF_SOCK_OPS_TCP_CONNECT_CB: /* before the SYN is built */
		dir = PRIO_DIR_ACTIVE;
		break;
	case BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB:
		dir = PRIO_DIR_PASSIVE;
		break;
	case BPF_SOCK_OPS_HDR_OPT_LEN_CB:
		w = bpf_sk_storage_get(&prio_written, sk, 0, 0);
		if (!w)
			return 1; /* a connection the selectors did not take */
		if (skops->args[0] & BPF_WRITE_HDR_TCP_CURRENT_MSS) {
			size_room(skops, sk, w); /* the kernel sizing the MSS (no skb) */
			return 1;
		}
		if (skops->skb_len == 0 && !(skops->skb_tcp_flags & TCPHDR_SYN))
			return 1; /* a pure ACK */
		reserve(skops, sk, w, skops->skb_tcp_flags & TCPHDR_SYN);
		return 1;
	case BPF_SOCK_OPS_WRITE_HDR_OPT_CB:
		w = bpf_sk_storage_get(&prio_written, sk, 0, 0);
		if (w)
			advertise(skops, w);
		return 1;
	default:
		return 1;
	}
	if (!selected(skops, dir)) {
		fp_count(&prio_host_stats, PRIO_HOST_UNMATCHED);
		return 1;
	}
	if (!bpf_sk_storage_get(&prio_written, sk, 0, BPF_SK_STORAGE_GET_F_CREATE)) {
		fp_count(&prio_host_stats, PRIO_HOST_NO_STORAGE);
		return 1;
	}
	fp_count(&prio_host_stats, PRIO_HOST_MATCHED);
	bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags |
					     BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG);
	return 1;
}

char _license[] SEC("license") = "Dual BSD/GPL";
