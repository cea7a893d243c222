/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* mark.h: what the altmark marker (marker.bpf.c) shares with Go (bpf2go -type): its counter
 * reasons, per-flow state and prefix keys. The carriers (enum am_carrier) are in altmark.h. */
#ifndef FLOWPLANE_ALTMARK_MARK_H
#define FLOWPLANE_ALTMARK_MARK_H

/* Per-CPU counters of the marker: what happened to each packet it saw. Every packet counts once
 * in MARK_SEEN and once in exactly one of the outcomes from MARK_MARKED on; MARK_COLOR0/1,
 * MARK_DOUBLE, MARK_INSERTED, MARK_UPDATED and MARK_FLOW_FULL detail the marked ones. */
enum mark_reason {
	MARK_SEEN = 0,	    /* every packet the program ran on */
	MARK_COLOR0,	    /* marked with color 0 */
	MARK_COLOR1,	    /* marked with color 1 */
	MARK_DOUBLE,	    /* marked for delay too (D flag / delay bit) */
	MARK_INSERTED,	    /* an AltMark extension header was inserted */
	MARK_UPDATED,	    /* an AltMark option already present was updated in place */
	MARK_FLOW_FULL,	    /* marked, but the flow table refused the flow: FlowMonID 0, no D */
	MARK_MARKED,	    /* outcome: marked */
	MARK_NOT_IP,	    /* outcome: not IPv4 or IPv6 (ARP, …): passed */
	MARK_NOT_SELECTED,  /* outcome: IP but outside the selection: passed */
	MARK_BACKBONE,	    /* outcome: from or to a backbone prefix: passed unmarked */
	MARK_WRONG_FAMILY,  /* outcome: the carrier does not exist in this IP version */
	MARK_MALFORMED,	    /* outcome: truncated or malformed headers: passed unchanged */
	MARK_TOO_BIG,	    /* outcome: the AltMark header would exceed the MTU: unmarked */
	MARK_NO_POSITION,   /* outcome: extension headers where the option cannot go */
	MARK_ADJUST_FAILED, /* outcome: bpf_skb_adjust_room refused (e.g. unsupported GSO) */
	MARK_REASON_MAX,
};

/* A flow: the 5-tuple, addresses IPv4-mapped for IPv4. Ports are 0 for protocols without
 * them and for non-first fragments. */
struct mark_flow_key {
	__u8 saddr[16];
	__u8 daddr[16];
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 pad[3];
};

/* What the marker keeps per flow. */
struct mark_flow {
	__u64 period;	    /* absolute period number (TAI / L) delay_marked belongs to */
	__u32 flowmon_id;   /* allocated at the flow's first packet (per-flow FlowMonID) */
	__u32 delay_marked; /* packets double-marked in period */
};

/* LPM trie key: prefix length and address, IPv4 as IPv4-mapped IPv6 (length + 96). */
struct mark_lpm_key {
	__u32 prefixlen;
	__u8 addr[16];
};

#endif
