/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* icmp.h: ICMP(v6) errors related to a tracked connection by the header they quote. */
#ifndef FLOWPLANE_CT_ICMP_H
#define FLOWPLANE_CT_ICMP_H

#include "hook.h"
#include "table.h"

#define ICMP_ECHOREPLY	    0
#define ICMP_DEST_UNREACH   3
#define ICMP_SOURCE_QUENCH  4
#define ICMP_REDIRECT	    5
#define ICMP_ECHO	    8
#define ICMP_TIME_EXCEEDED  11
#define ICMP_PARAMETERPROB  12
#define ICMPV6_ECHO_REQUEST 128
#define ICMPV6_ECHO_REPLY   129

/* ct_ipv6_skip_ext skips the extension headers of the IPv6 packet quoted by an ICMPv6 error,
 * starting with header type next at offset off. Returns the upper-layer offset << 8 | protocol,
 * or -1 for a fragment other than the first (it has no ports to match), too many headers or a
 * truncated one. A global function, so the rare error path costs the main program no verifier
 * states. */
__noinline int ct_ipv6_skip_ext(CT_CTX *ctx, __u32 off, __u32 next)
{
	struct ipv6_opt_hdr_ oh;

	if (!ctx)
		return -1;
	for (int i = 0; i < FP_IPV6_EXT_MAX; i++) {
		if (off > 0xfff)
			return -1;
		switch (next) {
		case NEXTHDR_HOP:
		case NEXTHDR_ROUTING:
		case NEXTHDR_DEST:
		case NEXTHDR_AUTH:
			if (ct_load_bytes(ctx, off, &oh, sizeof(oh)) < 0)
				return -1;
			off += ipv6_opt_len(next, oh.hdrlen);
			next = oh.nexthdr;
			break;
		case NEXTHDR_FRAGMENT: {
			struct frag_hdr_ fh;

			/* A first fragment still carries the ports (nf's ipv6_skip_exthdr). */
			if (ct_load_bytes(ctx, off, &fh, sizeof(fh)) < 0 ||
			    (fh.frag_off & bpf_htons(0xfff8)))
				return -1;
			off += sizeof(fh);
			next = fh.nexthdr;
			break;
		}
		default:
			return off << 8 | (next & 0xff);
		}
	}
	return -1;
}

/* related_at handles an ICMP(v6) error: allowed only if the header it quotes belongs to a tracked
 * connection. c points after the 8-byte ICMP header; p's key is rebuilt for the quoted packet
 * (the error itself has no key of its own); odst is the error's destination. */
static __always_inline int related_at(CT_CTX *ctx, struct hdr_cursor *c, struct pkt *inner,
				      __u8 family, __u64 now, const __u32 *odst)
{
	__u32 src[4] = {}, dst[4] = {};
	__u16 sport, dport;
	__u8 proto;
	__u8 *l4;
	int confirmed;

	if (family == 4) {
		struct iphdr *iph = c->pos;

		if ((void *)(iph + 1) > c->end || iph->version != 4 || iph->ihl < 5)
			return CT_STAT_INV_ICMP;
		proto = iph->protocol;
		src[0] = iph->saddr;
		dst[0] = iph->daddr;
		l4 = c->pos + iph->ihl * 4;
	} else {
		struct ipv6hdr *ip6 = c->pos;
		void *data = (void *)(long)ctx->data;
		int at;

		if ((void *)(ip6 + 1) > c->end || ip6->version != 6)
			return CT_STAT_INV_ICMP;
		at = ct_ipv6_skip_ext(ctx, (void *)(ip6 + 1) - data, ip6->nexthdr);
		if (at < 0)
			return CT_STAT_INV_ICMP;
		proto = at & 0xff;
		__builtin_memcpy(src, &ip6->saddr, 16);
		__builtin_memcpy(dst, &ip6->daddr, 16);
		l4 = data + ((at >> 8) & 0xfff);
	}
	/* nf: the error goes to the quoted packet's sender; one to anyone else is invalid. */
	if ((void *)(l4 + 8) > c->end || src[0] != odst[0] ||
	    (family == 6 && (src[1] != odst[1] || src[2] != odst[2] || src[3] != odst[3])))
		return CT_STAT_INV_ICMP;
	if (proto == IPPROTO_TCP || proto == IPPROTO_UDP) {
		sport = *(__u16 *)l4;
		dport = *(__u16 *)(l4 + 2);
	} else if ((proto == IPPROTO_ICMP && family == 4 && l4[0] == ICMP_ECHO) ||
		   (proto == IPPROTO_ICMPV6_ && family == 6 && l4[0] == ICMPV6_ECHO_REQUEST)) {
		sport = dport = *(__u16 *)(l4 + 4);
	} else {
		return CT_STAT_INV_ICMP;
	}
	make_key(inner, family, proto, src, dst, sport, dport);
	if (!lookup(&inner->key, now, &confirmed, NULL, 0))
		return CT_STAT_INV_ICMP;
	fp_count(&ct_stats, CT_STAT_RELATED);
	return 0;
}

#endif
