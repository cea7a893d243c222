/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* carrier.h: parsing shared by the altmark marker and probe. am_parse reads Ethernet (VLAN tags
 * skipped if in-band), IPv4 or IPv6 with its extension headers, and the transport header, and
 * finds the RFC 9343 AltMark option in a Hop-by-Hop or Destination Options header directly after
 * the IPv6 header (the first, or the second after a Hop-by-Hop header). am_read_carrier then
 * reads the color, the delay flag and the FlowMonID of the configured carrier. Every access is
 * bounds-checked; anything malformed returns the AM_STAT_MAL_* reason (altmark.h) instead of a
 * guess, so the caller counts it and passes the packet.
 *
 * Carrier layouts (read and written):
 *   dscp:         DSCP = ToS / Traffic Class >> 2 (the ECN bits 0-1 are never used); color is
 *                 DSCP bit color_bit, delay DSCP bit delay_bit (0 = the DSCP's lowest bit);
 *   ipv4-flag:    color = the reserved flag, bit 0x8000 of frag_off (network order);
 *   ipv6-altmark: option type 0x12, opt data len 4, data = FlowMonID (20 bits) | L | D |
 *                 reserved (10 bits), big-endian; color = L, delay = D. */
#ifndef FLOWPLANE_ALTMARK_CARRIER_H
#define FLOWPLANE_ALTMARK_CARRIER_H

#include "common.h"
#include "parse.h"
#include "altmark.h"

#define AM_DSCP_SHIFT	 2	/* DSCP bits in the ToS / Traffic Class byte: 7..2 */
#define AM_DSCP_BITS	 6	/* DSCP bit numbers 0..5 */
#define AM_IPV4_RESERVED 0x8000 /* frag_off, host order */

#define AM_OPT_PAD1	 0
#define AM_OPT_PADN	 1
#define AM_OPT_TYPE	 0x12 /* RFC 9343: skip if unknown, does not change en route */
#define AM_OPT_DATA_LEN	 4
#define AM_OPT_SIZE	 6  /* type, length, 4 bytes of data */
#define AM_FLOWMON_SHIFT 12 /* in the data word: FlowMonID << 12 | L << 11 | D << 10 */
#define AM_L_SHIFT	 11
#define AM_D_SHIFT	 10
#define AM_TLV_MAX	 8   /* options looked at in one header before giving up (MAL_OPT) */
#define AM_EXT_MAX	 6   /* extension headers skipped to reach the transport header */
#define AM_PULL_LEN	 128 /* bytes of headers a caller makes linear (bpf_skb_pull_data) */

/* A parsed packet. Offsets count from the start of the packet (skb->data); pointers are into the
 * packet and checked against end. */
struct am_pkt {
	void *data;
	void *end;
	void *l3;  /* struct iphdr or struct ipv6hdr */
	__u8 *opt; /* the AltMark option's type byte, NULL when absent */
	__u32 l3_off;
	__u32 l4_off;  /* the transport header; = pl_off when there is none to read */
	__u32 pl_off;  /* the payload after the transport header */
	__u32 ext_off; /* the extension header holding the AltMark option, 0 when absent */
	__u32 opt_off; /* the option's type byte, 0 when absent */
	__u32 l3_len;  /* IPv4 total length, IPv6 40 + payload length */
	__u32 flowmon; /* AM_FLOWMON_NONE unless the carrier has one */
	__u32 tcp_seq; /* TCP sequence and ack numbers (host order), 0 for other protocols */
	__u32 tcp_ack;
	__u16 sport; /* host order, 0 when the protocol has no ports */
	__u16 dport;
	__u8 family;	/* 4 or 6 */
	__u8 proto;	/* the upper-layer protocol */
	__u8 ext_type;	/* NEXTHDR_HOP or NEXTHDR_DEST holding the option, 0 when absent */
	__u8 frag;	/* 1: a fragment; 2: a later fragment (no transport header) */
	__u8 has_ports; /* sport and dport are the transport's */
	__u8 color;	/* set by am_read_carrier */
	__u8 delay;
	__u8 pad;
};

/* am_find_opt walks the option TLVs of the Hop-by-Hop or Destination Options header at hdr,
 * hl bytes long. Returns 1 with *rel = the AltMark option's offset in the header, 0 when the
 * header has none, -1 when malformed (a TLV overruns the header, the AltMark option has a bad
 * length, or more than AM_TLV_MAX options come before it). The step over an option is computed
 * without a branch (Pad1: 1 byte, others: 2 + length), so the verifier walks one path, not one
 * per mix of Pad1 and PadN. */
static __always_inline int am_find_opt(__u8 *hdr, __u32 hl, void *end, __u32 *rel)
{
	__u32 off = 2;

#pragma unroll
	for (int i = 0; i < AM_TLV_MAX; i++) {
		__u32 type, olen, notpad1;
		__u8 *t;

		if (off >= hl)
			return 0;
		t = hdr + off;
		if ((void *)(t + 2) > end) {
			/* only a Pad1 ending the header may end the packet too */
			if ((void *)(t + 1) <= end && t[0] == AM_OPT_PAD1 && off + 1 == hl)
				return 0;
			return -1;
		}
		type = t[0];
		olen = t[1];
		if (type == AM_OPT_TYPE) {
			if (olen != AM_OPT_DATA_LEN || off + AM_OPT_SIZE > hl ||
			    (void *)(t + AM_OPT_SIZE) > end)
				return -1;
			*rel = off;
			return 1;
		}
		notpad1 = (type + 0xff) >> 8; /* 0 for Pad1 (type 0), 1 for any other */
		off += 1 + notpad1 * (1 + olen);
		if (off > hl)
			return -1;
	}
	return off >= hl ? 0 : -1;
}

/* am_parse_l4 reads the transport header at l4, p->l4_off (ports, header length). */
static __always_inline int am_parse_l4(struct am_pkt *p, __u8 *l4)
{
	__u32 l3_end = p->l3_off + p->l3_len;
	__u32 hl;

	p->pl_off = p->l4_off;
	if (p->frag == 2)
		return 0; /* a later fragment: payload only */
	switch (p->proto) {
	case IPPROTO_TCP: {
		struct tcphdr *th = (void *)l4;

		if ((void *)(th + 1) > p->end)
			return AM_STAT_MAL_L4;
		hl = th->doff * 4;
		if (hl < sizeof(*th))
			return AM_STAT_MAL_L4;
		p->sport = bpf_ntohs(th->source);
		p->dport = bpf_ntohs(th->dest);
		p->tcp_seq = bpf_ntohl(th->seq);
		p->tcp_ack = bpf_ntohl(th->ack_seq);
		p->has_ports = 1;
		break;
	}
	case IPPROTO_UDP:
	case IPPROTO_UDPLITE: {
		struct udphdr *uh = (void *)l4;

		if ((void *)(uh + 1) > p->end)
			return AM_STAT_MAL_L4;
		hl = sizeof(*uh);
		p->sport = bpf_ntohs(uh->source);
		p->dport = bpf_ntohs(uh->dest);
		p->has_ports = 1;
		break;
	}
	case IPPROTO_SCTP: {
		__be16 *ports = (void *)l4;

		if ((void *)(l4 + 12) > p->end) /* common header: ports, tag, checksum */
			return AM_STAT_MAL_L4;
		hl = 12;
		p->sport = bpf_ntohs(ports[0]);
		p->dport = bpf_ntohs(ports[1]);
		p->has_ports = 1;
		break;
	}
	case IPPROTO_ICMP:
	case IPPROTO_ICMPV6_:
		if ((void *)(l4 + 8) > p->end) /* type, code, checksum, 4 bytes of rest */
			return AM_STAT_MAL_L4;
		hl = 8;
		break;
	default:
		return 0; /* no header we know: the payload starts here */
	}
	if (p->l4_off + hl > l3_end)
		return AM_STAT_MAL_L4;
	p->pl_off = p->l4_off + hl;
	return 0;
}

/* am_parse_ipv4 reads the IPv4 header at p->l3_off; pkt_len is the whole packet's length
 * (skb->len: the part past end, if any, is not linear but exists). */
static __always_inline int am_parse_ipv4(struct am_pkt *p, __u32 pkt_len)
{
	struct iphdr *iph = p->l3;
	__u32 hl, tot;
	__u16 frag;

	if ((void *)(iph + 1) > p->end)
		return AM_STAT_MAL_IPV4;
	if (iph->version != 4 || iph->ihl < 5)
		return AM_STAT_MAL_IPV4;
	hl = iph->ihl * 4;
	if ((void *)iph + hl > p->end)
		return AM_STAT_MAL_IPV4;
	tot = bpf_ntohs(iph->tot_len);
	if (tot == 0 && pkt_len > p->l3_off + 0xffff)
		tot = pkt_len - p->l3_off; /* BIG TCP: a GSO packet above 64 KiB */
	if (tot < hl || p->l3_off + tot > pkt_len)
		return AM_STAT_MAL_IPV4;
	p->family = 4;
	p->l3_len = tot;
	p->proto = iph->protocol;
	frag = bpf_ntohs(iph->frag_off);
	if (frag & (IP_MF | IP_OFFSET))
		p->frag = frag & IP_OFFSET ? 2 : 1;
	p->l4_off = p->l3_off + hl;
	return am_parse_l4(p, (void *)iph + hl);
}

/* am_opt_hdr looks for the AltMark option in the HBH or DOH header at hdr, which must lie
 * within the IPv6 packet. Returns 0 (absent or found) or AM_STAT_MAL_*. */
static __always_inline int am_opt_hdr(struct am_pkt *p, __u8 *hdr, __u8 type)
{
	__u32 hl, rel = 0;
	int r;

	if ((void *)(hdr + 8) > p->end)
		return AM_STAT_MAL_EXT;
	hl = ((__u32)hdr[1] + 1) * 8;
	if ((__u32)((void *)hdr - p->data) + hl > p->l3_off + p->l3_len)
		return AM_STAT_MAL_EXT;
	r = am_find_opt(hdr, hl, p->end, &rel);
	if (r < 0)
		return AM_STAT_MAL_OPT;
	if (r > 0) {
		p->opt = hdr + rel;
		p->ext_off = (void *)hdr - p->data;
		p->opt_off = p->ext_off + rel;
		p->ext_type = type;
	}
	return 0;
}

/* am_nonzero is 1 when x (below 2^24) is not 0, without a branch. */
static __always_inline __u32 am_nonzero(__u32 x)
{
	return (x + 0xffffff) >> 24;
}

/* am_parse_ipv6 reads the IPv6 header at p->l3_off, notes the AltMark option when the first
 * extension header (HBH or DOH), or a DOH right after a HBH, holds it, and skips the extension
 * headers to the transport header. The skip computes each header's length without branches
 * (8 for a fragment header, 4-byte units for AH, 8-byte units for the others), so the verifier
 * follows one path per header, not one per mix of header types. */
static __always_inline int am_parse_ipv6(struct am_pkt *p, __u32 pkt_len)
{
	struct ipv6hdr *ip6 = p->l3;
	__u8 *pos = (void *)(ip6 + 1);
	__u32 plen;
	__u8 next;
	int r;

	if ((void *)(ip6 + 1) > p->end)
		return AM_STAT_MAL_IPV6;
	if (ip6->version != 6)
		return AM_STAT_MAL_IPV6;
	plen = bpf_ntohs(ip6->payload_len);
	if (plen == 0 && pkt_len > p->l3_off + sizeof(*ip6) + 0xffff)
		plen = pkt_len - p->l3_off - sizeof(*ip6); /* BIG TCP */
	else if (plen == 0)
		return AM_STAT_MAL_IPV6; /* a jumbogram (RFC 2675) or nothing */
	if (p->l3_off + sizeof(*ip6) + plen > pkt_len)
		return AM_STAT_MAL_IPV6;
	p->family = 6;
	p->l3_len = sizeof(*ip6) + plen;
	next = ip6->nexthdr;

	if (next == NEXTHDR_HOP || next == NEXTHDR_DEST) {
		r = am_opt_hdr(p, pos, next);
		if (r)
			return r;
		if (!p->opt && next == NEXTHDR_HOP && pos[0] == NEXTHDR_DEST) {
			r = am_opt_hdr(p, pos + ((__u32)pos[1] + 1) * 8, NEXTHDR_DEST);
			if (r)
				return r;
		}
	}

#pragma unroll
	for (int i = 0; i < AM_EXT_MAX; i++) {
		__u32 hl, is_auth, is_frag, later;

		if (next != NEXTHDR_HOP && next != NEXTHDR_DEST && next != NEXTHDR_ROUTING &&
		    next != NEXTHDR_AUTH && next != NEXTHDR_FRAGMENT) {
			p->proto = next;
			p->l4_off = (void *)pos - p->data;
			if (p->l4_off > p->l3_off + p->l3_len)
				return AM_STAT_MAL_EXT;
			return am_parse_l4(p, pos);
		}
		if ((void *)(pos + 8) > p->end) /* every extension header has 8 bytes or more */
			return AM_STAT_MAL_EXT;
		is_auth = 1 - am_nonzero(next ^ NEXTHDR_AUTH);
		is_frag = 1 - am_nonzero(next ^ NEXTHDR_FRAGMENT);
		later = am_nonzero(((__u32)pos[2] << 8 | pos[3]) & ~7u);
		hl =
		    ((__u32)pos[1] + 1 + is_auth) * (8 - 4 * is_auth) * (1 - is_frag) + 8 * is_frag;
		hl &= 0xfff; /* at most 2048: tells the verifier */
		p->frag |= is_frag * (1 + later);
		if ((__u32)((void *)pos - p->data) + hl > p->l3_off + p->l3_len)
			return AM_STAT_MAL_EXT;
		next = pos[0];
		pos += hl;
	}
	return AM_STAT_MAL_EXT; /* too many extension headers to look through */
}

/* am_parse fills p from the packet [data, end) whose whole length is pkt_len. Returns 0, or
 * AM_STAT_NOT_IP, or the AM_STAT_MAL_* reason. */
static __always_inline int am_parse(void *data, void *end, __u32 pkt_len, struct am_pkt *p)
{
	struct hdr_cursor c = {.pos = data, .end = end};
	struct ethhdr *eth;
	int proto;

	__builtin_memset(p, 0, sizeof(*p));
	p->data = data;
	p->end = end;
	p->flowmon = AM_FLOWMON_NONE;
	proto = parse_ethhdr(&c, &eth);
	if (proto < 0)
		return AM_STAT_MAL_L2;
	p->l3 = c.pos;
	p->l3_off = c.pos - data;
	if (proto == bpf_htons(ETH_P_IP))
		return am_parse_ipv4(p, pkt_len);
	if (proto == bpf_htons(ETH_P_IPV6))
		return am_parse_ipv6(p, pkt_len);
	return AM_STAT_NOT_IP;
}

/* am_tclass is the IPv4 ToS or IPv6 Traffic Class byte (DSCP << 2 | ECN). */
static __always_inline __u8 am_tclass(const struct am_pkt *p)
{
	if (p->family == 4)
		return ((struct iphdr *)p->l3)->tos;
	return ((struct ipv6hdr *)p->l3)->priority << 4 |
	       ((struct ipv6hdr *)p->l3)->flow_lbl[0] >> 4;
}

/* am_read_carrier sets p->color, p->delay and p->flowmon from the carrier. Returns 1, or 0 when
 * the packet does not carry it (ipv4-flag on IPv6, ipv6-altmark without the option). color_bit
 * and delay_bit are DSCP bit numbers (0-5), used by the dscp carrier. */
static __always_inline int am_read_carrier(struct am_pkt *p, __u32 carrier, __u32 color_bit,
					   __u32 delay_bit)
{
	switch (carrier) {
	case AM_CARRIER_DSCP: {
		__u8 dscp = am_tclass(p) >> AM_DSCP_SHIFT;

		p->color = (dscp >> (color_bit % AM_DSCP_BITS)) & 1;
		p->delay = (dscp >> (delay_bit % AM_DSCP_BITS)) & 1;
		return 1;
	}
	case AM_CARRIER_IPV4_FLAG:
		if (p->family != 4)
			return 0;
		p->color = !!(((struct iphdr *)p->l3)->frag_off & bpf_htons(AM_IPV4_RESERVED));
		p->delay = 0;
		return 1;
	case AM_CARRIER_IPV6_ALTMARK: {
		__u8 *o = p->opt;
		__u32 w;

		if (p->family != 6 || !o || (void *)(o + AM_OPT_SIZE) > p->end)
			return 0;
		w = (__u32)o[2] << 24 | (__u32)o[3] << 16 | (__u32)o[4] << 8 | o[5];
		p->flowmon = w >> AM_FLOWMON_SHIFT;
		p->color = (w >> AM_L_SHIFT) & 1;
		p->delay = (w >> AM_D_SHIFT) & 1;
		return 1;
	}
	}
	return 0;
}

#endif
