/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* hash.h: the packet hash of RFC 5475 hash-based selection, computed identically at every
 * altmark measurement point (internal/altmark/hash.go is the same function in Go; a test keeps
 * them equal). It covers only fields that do not change in transit, as 16 32-bit words
 * (big-endian reads of the packet):
 *
 *   0-3   source address (IPv4 as ::ffff:a.b.c.d)      4-7   destination address
 *   8     IP protocol                                   9     source port << 16 | dest port
 *   10    IPv4 identification / IPv6 flow label         11-12 TCP sequence and ack numbers
 *   13-14 the first 8 payload bytes after the transport header (zero-padded)
 *   15    how many payload bytes there were (0-8)
 *
 * never TTL / hop limit, DSCP / ECN, checksums or extension headers (the AltMark option, which
 * a marker writes, included). The TCP sequence and ack numbers make pure ACKs of one IPv6 flow
 * (same flow label, no payload) hash apart. Words are mixed with MurmurHash3's 32-bit body and
 * finalizer (seed 0). */
#ifndef FLOWPLANE_ALTMARK_HASH_H
#define FLOWPLANE_ALTMARK_HASH_H

#include "carrier.h"

#define AM_HASH_WORDS 16

static __always_inline __u32 am_rotl(__u32 x, __u32 r)
{
	return x << r | x >> (32 - r);
}

static __always_inline __u32 am_mix(__u32 h, __u32 k)
{
	k *= 0xcc9e2d51;
	k = am_rotl(k, 15);
	k *= 0x1b873593;
	h ^= k;
	h = am_rotl(h, 13);
	return h * 5 + 0xe6546b64;
}

static __always_inline __u32 am_fmix(__u32 h)
{
	h ^= h >> 16;
	h *= 0x85ebca6b;
	h ^= h >> 13;
	h *= 0xc2b2ae35;
	h ^= h >> 16;
	return h;
}

/* am_be32 reads 4 bytes as a big-endian word: one load and one byte swap. */
static __always_inline __u32 am_be32(const __u8 *b)
{
	__u32 w;

	__builtin_memcpy(&w, b, 4);
	return bpf_ntohl(w);
}

/* The invariant fields of a packet, copied out of it (after this, nothing reads the packet). */
struct am_fields {
	__u8 saddr[16]; /* IPv4 as ::ffff:a.b.c.d */
	__u8 daddr[16];
	__u8 pl[8];  /* the first payload bytes after the transport header, zero-padded */
	__u32 ident; /* IPv4 identification / IPv6 flow label */
	__u32 npl;   /* bytes in pl */
};

/* am_copy_pl copies the n (1-8) payload bytes at p->pl_off into pl, zero-padded, straight from
 * the packet when 8 bytes from there are in its linear part (no helper call). Returns 0 when
 * they are not (the caller reads them with bpf_skb_load_bytes). */
static __always_inline int am_copy_pl(const struct am_pkt *p, __u8 *pl, __u32 n)
{
	__u32 off = p->pl_off;
	__u64 w;
	__u8 *b;

	if (off > 0xfff)
		return 0;
	b = p->data + off;
	if ((void *)(b + 8) > p->end)
		return 0;
	__builtin_memcpy(&w, b, 8);
	if (n < 8) /* keep the first n bytes in memory */
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
		w &= (1ULL << (8 * n)) - 1;
#else
		w &= ~0ULL << (64 - 8 * n);
#endif
	__builtin_memcpy(pl, &w, 8);
	return 1;
}

/* am_fields_of copies the invariant fields of p, parsed from skb, into f. */
static __always_inline void am_fields_of(struct __sk_buff *skb, const struct am_pkt *p,
					 struct am_fields *f)
{
	__u32 n = 0;

	__builtin_memset(f, 0, sizeof(*f));
	if (p->family == 4) {
		struct iphdr *iph = p->l3;

		f->saddr[10] = f->saddr[11] = f->daddr[10] = f->daddr[11] = 0xff;
		__builtin_memcpy(f->saddr + 12, &iph->saddr, 4);
		__builtin_memcpy(f->daddr + 12, &iph->daddr, 4);
		f->ident = bpf_ntohs(iph->id);
	} else {
		struct ipv6hdr *ip6 = p->l3;

		__builtin_memcpy(f->saddr, &ip6->saddr, 16);
		__builtin_memcpy(f->daddr, &ip6->daddr, 16);
		f->ident = am_be32((void *)ip6) & 0xfffff;
	}
	if (p->pl_off < p->l3_off + p->l3_len) {
		n = p->l3_off + p->l3_len - p->pl_off;
		if (n > 8)
			n = 8;
	}
	asm volatile("" : "+r"(n)); /* keep the check below for the verifier */
	if (n >= 1 && n <= 8 && !am_copy_pl(p, f->pl, n) &&
	    bpf_skb_load_bytes(skb, p->pl_off, f->pl, n) < 0)
		n = 0;
	f->npl = n;
}

/* am_hash hashes the packet p whose fields are f. */
static __always_inline __u32 am_hash(const struct am_pkt *p, const struct am_fields *f)
{
	__u32 h = 0;

#pragma unroll
	for (int i = 0; i < 4; i++)
		h = am_mix(h, am_be32(f->saddr + 4 * i));
#pragma unroll
	for (int i = 0; i < 4; i++)
		h = am_mix(h, am_be32(f->daddr + 4 * i));
	h = am_mix(h, p->proto);
	h = am_mix(h, (__u32)p->sport << 16 | p->dport);
	h = am_mix(h, f->ident);
	h = am_mix(h, p->tcp_seq);
	h = am_mix(h, p->tcp_ack);
	h = am_mix(h, am_be32(f->pl));
	h = am_mix(h, am_be32(f->pl + 4));
	h = am_mix(h, f->npl);
	return am_fmix(h ^ (AM_HASH_WORDS * 4));
}

#endif
