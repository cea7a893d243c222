/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* hash.h: the packet hash of RFC 5475 hash-based selection, computed identically at every
 * altmark measurement point (internal/altmark/hash.go is the same function in Go; a test keeps
 * them equal). It covers only fields that do not change in transit, as 7 64-bit words:
 *
 *   w0, w1  source address, bytes 0-7 and 8-15 (IPv4 as ::ffff:a.b.c.d), little-endian reads
 *   w2, w3  destination address, likewise
 *   w4      protocol | source port << 8 | destination port << 24 | ident << 40 | npl << 60,
 *           ident = IPv4 identification / IPv6 flow label (20 bits), npl = payload bytes (0-8)
 *   w5      TCP sequence number | ack number << 32 (0 for other protocols)
 *   w6      the first 8 payload bytes after the transport header (zero-padded), little-endian
 *
 * never TTL / hop limit, DSCP / ECN, checksums or extension headers (the AltMark option, which
 * a marker writes, included). The TCP sequence and ack numbers make pure ACKs of one IPv6 flow
 * (same flow label, no payload) hash apart. hash = the low 32 bits of fmix64(sum of w_i * K_i
 * mod 2^64), K_i odd constants, fmix64 MurmurHash3's 64-bit finalizer: the products are
 * independent (no chain through the words: a few cycles, where a word-by-word MurmurHash3 body
 * is a chain of 16 rounds), a difference in one word never cancels (K_i is odd, so invertible
 * mod 2^64), and fmix64 spreads every bit of the sum over the low 32 bits the sampling uses. */
#ifndef FLOWPLANE_ALTMARK_HASH_H
#define FLOWPLANE_ALTMARK_HASH_H

#include "carrier.h"

#define AM_HASH_K0 0x9e3779b97f4a7c15ULL
#define AM_HASH_K1 0xc2b2ae3d27d4eb4fULL
#define AM_HASH_K2 0x165667b19e3779f9ULL
#define AM_HASH_K3 0x85ebca77c2b2ae63ULL
#define AM_HASH_K4 0x27d4eb2f165667c5ULL
#define AM_HASH_K5 0xd6e8feb86659fd93ULL
#define AM_HASH_K6 0xa0761d6478bd642fULL

/* am_fmix64 is MurmurHash3's 64-bit finalizer. */
static __always_inline __u64 am_fmix64(__u64 h)
{
	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdULL;
	h ^= h >> 33;
	h *= 0xc4ceb9fe1a85ec53ULL;
	h ^= h >> 33;
	return h;
}

/* am_le64 reads 8 bytes as a little-endian word (one load on a little-endian CPU). */
static __always_inline __u64 am_le64(const __u8 *b)
{
	__u64 w;

	__builtin_memcpy(&w, b, 8);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
	w = __builtin_bswap64(w);
#endif
	return w;
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
		f->ident = ((__u32)ip6->flow_lbl[0] & 0xf) << 16 | (__u32)ip6->flow_lbl[1] << 8 |
			   ip6->flow_lbl[2];
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
	__u64 w4 = p->proto | (__u64)p->sport << 8 | (__u64)p->dport << 24 |
		   (__u64)(f->ident & 0xfffff) << 40 | (__u64)(f->npl & 0xf) << 60;
	__u64 w5 = p->tcp_seq | (__u64)p->tcp_ack << 32;
	__u64 h;

	h = am_le64(f->saddr) * AM_HASH_K0 + am_le64(f->saddr + 8) * AM_HASH_K1 +
	    am_le64(f->daddr) * AM_HASH_K2 + am_le64(f->daddr + 8) * AM_HASH_K3 + w4 * AM_HASH_K4 +
	    w5 * AM_HASH_K5 + am_le64(f->pl) * AM_HASH_K6;
	return am_fmix64(h);
}

#endif
