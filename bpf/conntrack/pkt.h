/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* pkt.h: what the parser learns about one packet, and its canonical key. */
#ifndef FLOWPLANE_CT_PKT_H
#define FLOWPLANE_CT_PKT_H

#include "common.h"
#include "conntrack.h"

/* What the parser learnt about one packet. */
struct pkt {
	struct ct_key key; /* canonical */
	__u32 seq;	   /* TCP, host order */
	__u32 ack;
	__u32 end; /* seq + payload + SYN + FIN */
	__u32 win; /* unscaled */
	__u32 l3len;
	__u8 fwd; /* the packet's source is the key's lo endpoint */
	__u8 tcp_index;
	__u8 tcp_syn;
	__u8 tcp_ack;
	__u8 tcp_rst;
	__u8 has_opts; /* the TCP header has options (nf's tcp_options then resets a SYN's) */
	__u32 sack;    /* ack raised to the highest SACK block's end, as nf's tcp_sack */
	__u8 wscale;   /* from a SYN's options */
	__u8 has_wscale;
	__u8 sack_perm; /* from a SYN's options */
	__u8 new_ok;	/* may open a connection (TCP SYN, UDP, echo request) */
	__u8 shorten;	/* refused, and the timeout is to be shortened (nf_tcp_handle_invalid) */
};

/* The furthest transport header ct_track takes: past anything the parse accepts (2 VLAN tags,
 * an IPv6 header and FP_IPV6_EXT_MAX extension headers of at most 2 KiB each). */
#define CT_L4AT_MAX 0x3fff

/* Where ct_track finds the packet, and what the parse learnt of it. */
struct track_in {
	__u32 src[4]; /* addresses, as the key's (IPv4: the first word) */
	__u32 dst[4];
	__u64 now;    /* ct_now() */
	__u32 l4at;   /* the transport header's offset from the start of the frame */
	__u32 l4off;  /* ... from the L3 header */
	__u8 family;  /* 4 or 6 */
	__u8 l4proto; /* IPPROTO_TCP, _UDP, _ICMP or _ICMPV6 */
	__u8 looked;  /* route_lookup built p->key and looked it up in ct_main */
	__u8 pad[5];
};

enum verdict {
	V_ALLOW,
	V_DROP,
};

/* ---- keys ---- */

static __always_inline void make_key(struct pkt *p, __u8 family, __u8 proto, const __u32 *src,
				     const __u32 *dst, __u16 sport, __u16 dport)
{
	int lo = 1;

#pragma unroll
	for (int i = 0; i < 4; i++) {
		if (src[i] != dst[i]) {
			lo = bpf_ntohl(src[i]) < bpf_ntohl(dst[i]);
			goto decided;
		}
	}
	lo = bpf_ntohs(sport) <= bpf_ntohs(dport);
decided:
	p->key.family = family;
	p->key.proto = proto;
	p->fwd = lo;
	if (lo) {
		__builtin_memcpy(p->key.lo_addr, src, 16);
		__builtin_memcpy(p->key.hi_addr, dst, 16);
		p->key.lo_port = sport;
		p->key.hi_port = dport;
	} else {
		__builtin_memcpy(p->key.lo_addr, dst, 16);
		__builtin_memcpy(p->key.hi_addr, src, 16);
		p->key.lo_port = dport;
		p->key.hi_port = sport;
	}
}

#endif
