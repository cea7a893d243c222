/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* marker.bpf.c: the alternate-marking marker (RFC 9341, RFC 9343) at tcx egress of a network
 * edge. Each selected packet gets the color of its period, color = (⌊TAI / L⌋ + start_color)
 * mod 2, in one carrier:
 *
 *   dscp          two DSCP bits (color, delay) of the IPv4 TOS / IPv6 traffic class; the ECN
 *                 bits are never touched; the IPv4 header checksum is updated incrementally.
 *   ipv4-flag     the IPv4 reserved flag bit (0x8000 of frag_off), checksum updated; traffic
 *                 from or to a backbone prefix is left alone.
 *   ipv6-altmark  the RFC 9343 AltMark option (type 0x12, data length 4: FlowMonID 20 bits,
 *                 L, D, 10 reserved bits): updated in place where the packet has one, else an
 *                 8-byte Destination Options (default) or Hop-by-Hop header inserted right
 *                 after the IPv6 header (insert_altmark lists the positions handled).
 *
 * Double marking (RFC 9341 §3.2): the delay bit / D flag goes on the first double_packets
 * packets of each flow in each period that leave in the central half of the period, far from
 * the color changes. The marker never drops: what it cannot mark it passes and counts. */
#include "common.h"
#include "stats.h"
#include "carrier.h"
#include "mark.h"

/* carrier.h has the carriers' constants and the parser; these are the marker's own. */
#define ALTMARK_HDR_LEN 8 /* next header, length 0, AltMark option (type, length, 4 bytes) */
#define IPV6_TC_SHIFT	4 /* traffic class: bits 4-11 of the first 16-bit word */

/* Configuration, set from Go before load. */
volatile const __u64 period_ns = 1000000000; /* L */
volatile const __u32 start_color = 0;
volatile const __u32 carrier = AM_CARRIER_DSCP; /* enum am_carrier */
volatile const __u8 color_mask = 0x04;		/* dscp: the TOS/traffic-class bit of the color */
volatile const __u8 delay_mask = 0x08;		/* dscp: the bit of the delay mark */
volatile const __u32 hop_by_hop = 0;  /* ipv6-altmark: insert Hop-by-Hop, not Dest. Options */
volatile const __u32 mtu = 0;	      /* ipv6-altmark: L3 MTU; 0 = the device's (bpf_check_mtu) */
volatile const __u32 flowmon_id = 0;  /* fixed FlowMonID (per_flow_id = 0) */
volatile const __u32 per_flow_id = 0; /* allocate FlowMonIDs per flow from flowmon_first */
volatile const __u32 flowmon_first = 1;
volatile const __u32 flowmon_count = 0xfffff; /* IDs flowmon_first … +count-1 */
volatile const __u32 double_packets = 0;      /* per flow and period; 0 = no double marking */
volatile const __u32 any_proto = 1;
volatile const __u32 proto_mask[8] = {}; /* bit p set: IP protocol p is selected */
volatile const __u32 sel_src = 0;	 /* mark_src holds the selected source prefixes */
volatile const __u32 sel_dst = 0;	 /* mark_dst holds the selected destination prefixes */
volatile const __u32 sel_backbone = 0;	 /* mark_backbone holds prefixes left alone */
volatile const __u32 sel_ports =
    0; /* a port range is set: packets without ports are not selected */
volatile const __u16 sport_lo = 0, sport_hi = 0xffff;
volatile const __u16 dport_lo = 0, dport_hi = 0xffff;

/* key = struct mark_flow_key, value = struct mark_flow: FlowMonID and delay count per flow */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct mark_flow_key);
	__type(value, struct mark_flow);
	__uint(max_entries, 65536);
} mark_flows SEC(".maps");

/* key = 0, value = FlowMonIDs allocated so far (atomic; the next one is first + n mod count) */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 1);
} mark_next_id SEC(".maps");

/* key = struct mark_lpm_key (source prefix), value = 1: traffic the marker selects */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct mark_lpm_key);
	__type(value, __u8);
	__uint(max_entries, 256);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} mark_src SEC(".maps");

/* key = struct mark_lpm_key (destination prefix), value = 1: traffic the marker selects */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct mark_lpm_key);
	__type(value, __u8);
	__uint(max_entries, 256);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} mark_dst SEC(".maps");

/* key = struct mark_lpm_key (IPv4-mapped backbone prefix), value = 1: never marked */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct mark_lpm_key);
	__type(value, __u8);
	__uint(max_entries, 256);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} mark_backbone SEC(".maps");

/* key = enum mark_reason, value = per-CPU count */
FP_COUNTERS(mark_stats, enum mark_reason, MARK_REASON_MAX);

const enum am_carrier *unused_carrier __attribute__((unused)); /* keep the enums in BTF */

static __always_inline int in_prefixes(void *map, const __u8 addr[16])
{
	struct mark_lpm_key k = {.prefixlen = 128};

	__builtin_memcpy(k.addr, addr, 16);
	return bpf_map_lookup_elem(map, &k) != NULL;
}

static __always_inline void map4(__u8 dst[16], __be32 a)
{
	__builtin_memset(dst, 0, 10);
	dst[10] = 0xff;
	dst[11] = 0xff;
	__builtin_memcpy(dst + 12, &a, 4);
}

/* is_ext is true for the IPv6 extension headers carrier.h walks. */
static __always_inline int is_ext(__u8 next)
{
	return next == NEXTHDR_HOP || next == NEXTHDR_DEST || next == NEXTHDR_ROUTING ||
	       next == NEXTHDR_AUTH || next == NEXTHDR_FRAGMENT;
}

static __always_inline int selected(const struct mark_flow_key *k, int has_ports)
{
	__u16 sp = bpf_ntohs(k->sport), dp = bpf_ntohs(k->dport);

	if (!any_proto && !(proto_mask[(k->proto >> 5) & 7] & (1u << (k->proto & 31))))
		return 0;
	if (sel_ports && !has_ports)
		return 0;
	if (sp < sport_lo || sp > sport_hi || dp < dport_lo || dp > dport_hi)
		return 0;
	if (sel_src && !in_prefixes(&mark_src, k->saddr))
		return 0;
	if (sel_dst && !in_prefixes(&mark_dst, k->daddr))
		return 0;
	return 1;
}

/* flow_state returns the flow's state, creating it (with a new FlowMonID) at its first packet;
 * NULL when the table refuses it. */
static __always_inline struct mark_flow *flow_state(const struct mark_flow_key *k)
{
	struct mark_flow *f = bpf_map_lookup_elem(&mark_flows, k);
	struct mark_flow nf = {};
	__u32 zero = 0;
	__u64 *next, n;

	if (f)
		return f;
	if (per_flow_id) {
		next = bpf_map_lookup_elem(&mark_next_id, &zero);
		if (!next)
			return NULL;
		n = __sync_fetch_and_add(next, 1);
		nf.flowmon_id = flowmon_first + (__u32)(n % flowmon_count);
	} else {
		nf.flowmon_id = flowmon_id;
	}
	nf.period = ~0ULL;
	/* A flow that starts on two CPUs at once: the first insert wins, both use its ID. */
	bpf_map_update_elem(&mark_flows, k, &nf, BPF_NOEXIST);
	return bpf_map_lookup_elem(&mark_flows, k);
}

/* insert_altmark adds an 8-byte Destination Options (or Hop-by-Hop) header holding only the
 * AltMark option right after the IPv6 header at nh. The caller inserts only into packets whose
 * IPv6 header is followed directly by the upper layer (TCP, UDP, ICMPv6, ESP, …): the new header
 * is then the only extension header, so a Hop-by-Hop header is first (RFC 8200 §4.1) and a
 * Destination Options header is the one before the upper layer with no routing header before
 * it; there is no AH whose ICV would cover the option. A packet with extension headers and no
 * AltMark option where carrier.h looks (first header, or Destination Options right after
 * Hop-by-Hop) is passed unmarked (MARK_NO_POSITION). */
static __always_inline enum mark_reason insert_altmark(struct __sk_buff *skb, __u32 nh, __u8 next,
						       __u16 plen, __be32 data, __u32 hdrs)
{
	__u8 hdr[ALTMARK_HDR_LEN] = {next, 0, AM_OPT_TYPE, AM_OPT_DATA_LEN};
	__u8 nexthdr = hop_by_hop ? NEXTHDR_HOP : NEXTHDR_DEST;
	__be16 nplen = bpf_htons(plen + ALTMARK_HDR_LEN);
	__u32 gso = skb->gso_size, len = 0, flags = 0;

	/* The L3 length one packet on the wire will have: the packet's own, or for UDP GSO
	 * (whose gso_size delimits datagrams, so the kernel grows it only with a fixed
	 * gso_size) the IPv6 and UDP headers and one segment's payload. TCP GSO needs no check:
	 * adjust_room lowers the MSS by 8, so every segment keeps its length. */
	if (gso && next == IPPROTO_UDP) {
		len = hdrs + gso;
		flags = BPF_F_ADJ_ROOM_FIXED_GSO;
	} else if (!gso) {
		len = skb->len - nh;
	}
	if (len) {
		__u32 lim = mtu;

		/* bpf_check_mtu passes any GSO packet: ask it for the device's MTU only */
		if (!lim)
			bpf_check_mtu(skb, 0, &lim, 0, 0);
		if (len + ALTMARK_HDR_LEN > lim)
			return MARK_TOO_BIG;
	}
	__builtin_memcpy(hdr + 4, &data, 4);
	if (bpf_skb_adjust_room(skb, ALTMARK_HDR_LEN, BPF_ADJ_ROOM_NET, flags))
		return MARK_ADJUST_FAILED;
	if (bpf_skb_store_bytes(skb, nh + sizeof(struct ipv6hdr), hdr, sizeof(hdr), 0) ||
	    bpf_skb_store_bytes(skb, nh + offsetof(struct ipv6hdr, payload_len), &nplen,
				sizeof(nplen), 0) ||
	    bpf_skb_store_bytes(skb, nh + offsetof(struct ipv6hdr, nexthdr), &nexthdr,
				sizeof(nexthdr), 0)) {
		/* cannot happen (the room was just made); if it did, take the room out again */
		bpf_skb_adjust_room(skb, -ALTMARK_HDR_LEN, BPF_ADJ_ROOM_NET, flags);
		return MARK_ADJUST_FAILED;
	}
	return MARK_INSERTED;
}

/* opts_rest_ok: the option TLVs after the AltMark option carrier.h found, to the end of the
 * extension header holding it, parse (RFC 8200 4.2), so the marker writes into a header only if
 * all of it does (carrier.h stops at the AltMark option). At most AM_TLV_MAX more options; the
 * step as in am_find_opt. Reads with bpf_skb_load_bytes: offsets, no packet pointers. */
static __always_inline int opts_rest_ok(struct __sk_buff *skb, const struct am_pkt *p)
{
	__u32 off = p->opt_off + AM_OPT_SIZE, hend;
	__u8 b[2];

	if (bpf_skb_load_bytes(skb, p->ext_off + 1, b, 1))
		return 0;
	hend = p->ext_off + ((__u32)b[0] + 1) * 8;
#pragma unroll
	for (int i = 0; i < AM_TLV_MAX; i++) {
		if (off >= hend)
			return off == hend;
		if (off + 1 == hend) /* the last byte: only a Pad1 fits */
			return !bpf_skb_load_bytes(skb, off, b, 1) && b[0] == AM_OPT_PAD1;
		if (bpf_skb_load_bytes(skb, off, b, 2))
			return 0;
		off += 1 + ((b[0] + 0xff) >> 8) * (1 + b[1]); /* Pad1: 1, others: 2 + length */
	}
	return off == hend;
}

static __always_inline int unmarked(enum mark_reason why)
{
	fp_count(&mark_stats, why);
	return TCX_NEXT;
}

SEC("tcx/egress")
int altmark_mark(struct __sk_buff *skb)
{
	struct mark_flow_key key = {};
	struct mark_flow *f = NULL;
	struct am_pkt p;
	void *data, *end;
	__u64 now, period, pos;
	__u32 color, delay = 0, id = flowmon_id, nh;
	int r;

	fp_count(&mark_stats, MARK_SEEN);
	data = (void *)(long)skb->data;
	end = (void *)(long)skb->data_end;
	if (end - data < AM_PULL_LEN && skb->len > end - data) {
		bpf_skb_pull_data(skb, skb->len < AM_PULL_LEN ? skb->len : AM_PULL_LEN);
		data = (void *)(long)skb->data;
		end = (void *)(long)skb->data_end;
	}
	r = am_parse(data, end, skb->len, &p);
	if (r == AM_STAT_NOT_IP)
		return unmarked(MARK_NOT_IP);
	if (r)
		return unmarked(MARK_MALFORMED);
	nh = p.l3_off;
	if (p.family == 4) {
		struct iphdr *iph = p.l3;

		if ((void *)(iph + 1) > end)
			return unmarked(MARK_MALFORMED);
		map4(key.saddr, iph->saddr);
		map4(key.daddr, iph->daddr);
	} else {
		struct ipv6hdr *ip6 = p.l3;

		if ((void *)(ip6 + 1) > end)
			return unmarked(MARK_MALFORMED);
		__builtin_memcpy(key.saddr, &ip6->saddr, 16);
		__builtin_memcpy(key.daddr, &ip6->daddr, 16);
	}
	key.proto = p.proto;
	if (p.has_ports) {
		key.sport = bpf_htons(p.sport);
		key.dport = bpf_htons(p.dport);
	}
	if (!selected(&key, p.has_ports))
		return unmarked(MARK_NOT_SELECTED);
	if (carrier == AM_CARRIER_IPV4_FLAG && p.family != 4)
		return unmarked(MARK_WRONG_FAMILY);
	if (carrier == AM_CARRIER_IPV6_ALTMARK && p.family != 6)
		return unmarked(MARK_WRONG_FAMILY);
	if (sel_backbone &&
	    (in_prefixes(&mark_backbone, key.saddr) || in_prefixes(&mark_backbone, key.daddr)))
		return unmarked(MARK_BACKBONE);

	now = bpf_ktime_get_tai_ns();
	period = now / period_ns;
	pos = now - period * period_ns;
	color = (period + start_color) & 1;
	if (per_flow_id || double_packets) {
		f = flow_state(&key);
		if (f) {
			id = f->flowmon_id;
		} else {
			id = 0;
			fp_count(&mark_stats, MARK_FLOW_FULL);
		}
	}
	if (f && double_packets && pos >= period_ns / 4 && pos < period_ns - period_ns / 4) {
		if (f->period != period) { /* racy across CPUs: at worst a few more marks */
			f->period = period;
			f->delay_marked = 0;
		}
		delay = __sync_fetch_and_add(&f->delay_marked, 1) < double_packets;
	}

	if (carrier == AM_CARRIER_DSCP) {
		__u8 set = (color ? color_mask : 0) | (delay ? delay_mask : 0);
		__u8 clear = color_mask | delay_mask;

		if (p.family == 4) {
			struct iphdr *iph = p.l3;
			__u8 *vihl, tos;
			__be16 old, new;

			if ((void *)(iph + 1) > end)
				return unmarked(MARK_MALFORMED);
			vihl = (__u8 *)iph;
			tos = (iph->tos & ~clear) | set;
			old = bpf_htons(*vihl << 8 | iph->tos);
			new = bpf_htons(*vihl << 8 | tos);
			iph->tos = tos;
			bpf_l3_csum_replace(skb, nh + offsetof(struct iphdr, check), old, new, 2);
		} else {
			__be16 *w = p.l3;
			__u16 old, tc;

			if ((void *)(w + 1) > end)
				return unmarked(MARK_MALFORMED);
			old = bpf_ntohs(*w);
			tc = (((old >> IPV6_TC_SHIFT) & 0xff) & ~clear) | set;
			*w = bpf_htons((old & 0xf00f) | (tc << IPV6_TC_SHIFT));
		}
	} else if (carrier == AM_CARRIER_IPV4_FLAG) {
		struct iphdr *iph = p.l3;
		__be16 old, new;

		if ((void *)(iph + 1) > end)
			return unmarked(MARK_MALFORMED);
		old = iph->frag_off;
		new =
		    color ? old | bpf_htons(AM_IPV4_RESERVED) : old & ~bpf_htons(AM_IPV4_RESERVED);
		iph->frag_off = new;
		bpf_l3_csum_replace(skb, nh + offsetof(struct iphdr, check), old, new, 2);
	} else {
		struct ipv6hdr *ip6 = p.l3;
		__u32 word = ((id & AM_FLOWMON_MAX) << AM_FLOWMON_SHIFT) | (color << AM_L_SHIFT) |
			     (delay << AM_D_SHIFT);
		__be32 be = bpf_htonl(word);

		if ((void *)(ip6 + 1) > end)
			return unmarked(MARK_MALFORMED);
		if (p.opt) {
			/* where carrier.h finds it: first extension header, or a Destination
			 * Options header right after a Hop-by-Hop one */
			if (!opts_rest_ok(skb, &p) ||
			    bpf_skb_store_bytes(skb, p.opt_off + 2, &be, 4, 0))
				return unmarked(MARK_MALFORMED);
			fp_count(&mark_stats, MARK_UPDATED);
		} else {
			if (is_ext(ip6->nexthdr))
				return unmarked(MARK_NO_POSITION);
			r = insert_altmark(skb, nh, ip6->nexthdr, bpf_ntohs(ip6->payload_len), be,
					   p.pl_off - nh);
			if (r != MARK_INSERTED)
				return unmarked(r);
			fp_count(&mark_stats, MARK_INSERTED);
		}
	}
	fp_count(&mark_stats, color ? MARK_COLOR1 : MARK_COLOR0);
	if (delay)
		fp_count(&mark_stats, MARK_DOUBLE);
	fp_count(&mark_stats, MARK_MARKED);
	return TCX_NEXT;
}

char _license[] SEC("license") = "Dual BSD/GPL";
