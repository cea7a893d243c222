/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* parse.h: bounds-checked header parsing with a cursor. Every helper checks the header fits
 * before it reads, advances the cursor past it, and returns a negative value on anything
 * malformed, so a caller can count and pass or drop instead of misparsing. */
#ifndef FLOWPLANE_PARSE_H
#define FLOWPLANE_PARSE_H

#include "common.h"

#define FP_VLAN_MAX	2 /* 802.1ad + 802.1Q */
#define FP_IPV6_EXT_MAX 6 /* extension headers skipped before giving up */

#define NEXTHDR_HOP	 0
#define NEXTHDR_ROUTING	 43
#define NEXTHDR_FRAGMENT 44
#define NEXTHDR_AUTH	 51
#define NEXTHDR_DEST	 60
#define NEXTHDR_NONE	 59

#define IP_MF	  0x2000
#define IP_OFFSET 0x1FFF

struct hdr_cursor {
	void *pos;
	void *end;
};

struct fp_vlan_hdr { /* vmlinux.h has its own struct vlan_hdr */
	__be16 tci;
	__be16 encap_proto;
};

/* parse_ethhdr returns the EtherType (network order) after up to FP_VLAN_MAX VLAN tags. */
static __always_inline int parse_ethhdr(struct hdr_cursor *c, struct ethhdr **ethp)
{
	struct ethhdr *eth = c->pos;
	__be16 proto;

	if ((void *)(eth + 1) > c->end)
		return -1;
	c->pos = eth + 1;
	*ethp = eth;
	proto = eth->h_proto;
#pragma unroll
	for (int i = 0; i < FP_VLAN_MAX; i++) {
		struct fp_vlan_hdr *vh = c->pos;

		if (proto != bpf_htons(ETH_P_8021Q) && proto != bpf_htons(ETH_P_8021AD))
			break;
		if ((void *)(vh + 1) > c->end)
			return -1;
		proto = vh->encap_proto;
		c->pos = vh + 1;
	}
	return proto;
}

/* parse_iphdr returns the IP protocol; the cursor ends at the transport header. */
static __always_inline int parse_iphdr(struct hdr_cursor *c, struct iphdr **iphp)
{
	struct iphdr *iph = c->pos;
	int len;

	if ((void *)(iph + 1) > c->end)
		return -1;
	if (iph->version != 4 || iph->ihl < 5)
		return -1;
	len = iph->ihl * 4;
	if (c->pos + len > c->end)
		return -1;
	c->pos += len;
	*iphp = iph;
	return iph->protocol;
}

/* ip_is_fragment is true for any fragment of a datagram (first or later). */
static __always_inline int ip_is_fragment(const struct iphdr *iph)
{
	return (iph->frag_off & bpf_htons(IP_MF | IP_OFFSET)) != 0;
}

struct ipv6_opt_hdr_ {
	__u8 nexthdr;
	__u8 hdrlen;
};

struct frag_hdr_ {
	__u8 nexthdr;
	__u8 reserved;
	__be16 frag_off;
	__be32 identification;
};

/* ipv6_opt_len is the length of a hop-by-hop, routing, destination options or authentication
 * header from its type and length field (AH counts 4-byte units less 2, the others 8-byte units
 * less 1). */
static __always_inline __u32 ipv6_opt_len(__u8 type, __u8 hdrlen)
{
	return type == NEXTHDR_AUTH ? (hdrlen + 2) * 4 : (hdrlen + 1) * 8;
}

/* parse_ipv6hdr skips extension headers and returns the upper-layer protocol, with *frag set
 * when a fragment header was seen (the caller decides what it can do with a fragment). */
static __always_inline int parse_ipv6hdr(struct hdr_cursor *c, struct ipv6hdr **ip6p, int *frag)
{
	struct ipv6hdr *ip6 = c->pos;
	__u8 next;

	*frag = 0;
	if ((void *)(ip6 + 1) > c->end)
		return -1;
	if (ip6->version != 6)
		return -1;
	c->pos = ip6 + 1;
	*ip6p = ip6;
	next = ip6->nexthdr;
#pragma unroll
	for (int i = 0; i < FP_IPV6_EXT_MAX; i++) {
		struct ipv6_opt_hdr_ *oh = c->pos;

		switch (next) {
		case NEXTHDR_HOP:
		case NEXTHDR_ROUTING:
		case NEXTHDR_DEST:
		case NEXTHDR_AUTH:
			if ((void *)(oh + 1) > c->end)
				return -1;
			c->pos += ipv6_opt_len(next, oh->hdrlen);
			next = oh->nexthdr;
			break;
		case NEXTHDR_FRAGMENT: {
			struct frag_hdr_ *fh = c->pos;

			if ((void *)(fh + 1) > c->end)
				return -1;
			*frag = 1;
			next = fh->nexthdr;
			c->pos = fh + 1;
			break;
		}
		default:
			return next;
		}
		if (c->pos > c->end)
			return -1;
	}
	return -1; /* too many extension headers to look through */
}

#endif
