/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* csum.h: Internet checksum arithmetic (RFC 1071, incremental update per RFC 1624). */
#ifndef FLOWPLANE_CSUM_H
#define FLOWPLANE_CSUM_H

#include "common.h"

static __always_inline __u16 csum_fold(__u32 sum)
{
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)~sum;
}

/* csum_replace2 updates checksum *csum (network order) for a 16-bit field changing from old to
 * new (both network order): HC' = ~(~HC + ~m + m') (RFC 1624 eqn. 3). */
static __always_inline void csum_replace2(__sum16 *csum, __be16 old, __be16 new)
{
	__u32 sum = (__u16) ~*csum;

	sum += (__u16)~old;
	sum += new;
	*csum = csum_fold(sum);
}

/* csum_replace4 is csum_replace2 for a 32-bit field (an IPv4 address, a TCP sequence number):
 * both of its 16-bit words change at once. */
static __always_inline void csum_replace4(__sum16 *csum, __be32 old, __be32 new)
{
	__u32 sum = (__u16) ~*csum;

	sum += (__u16)~old + (__u16) ~(old >> 16);
	sum += (__u16) new + (__u16)(new >> 16);
	*csum = csum_fold(sum);
}

/* ip_decrease_ttl decrements the TTL and patches the header checksum in place. */
static __always_inline void ip_decrease_ttl(struct iphdr *iph)
{
	__be16 old = *(__be16 *)&iph->ttl; /* ttl and protocol share one 16-bit word */

	iph->ttl--;
	csum_replace2(&iph->check, old, *(__be16 *)&iph->ttl);
}

#endif
