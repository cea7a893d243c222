/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* altmark.h: what the altmark programs (marker and probe) share with Go (bpf2go -type). Fields
 * largest first, no implicit padding. docs/altmark.md describes the carriers. */
#ifndef FLOWPLANE_ALTMARK_H
#define FLOWPLANE_ALTMARK_H

/* Carriers (configuration `carrier`). */
enum am_carrier {
	AM_CARRIER_DSCP,	 /* two DSCP bits: color and delay */
	AM_CARRIER_IPV4_FLAG,	 /* the IPv4 reserved flag bit: color */
	AM_CARRIER_IPV6_ALTMARK, /* RFC 9343 option: FlowMonID, L (color), D (delay) */
};

/* Directions of a measurement point. */
enum am_dir {
	AM_DIR_IN,  /* tcx ingress */
	AM_DIR_OUT, /* tcx egress */
};

/* Sizes and special values. */
enum am_limit {
	AM_MAX_POINTS = 64,	      /* (ifindex, direction) pairs one probe watches */
	AM_IFINDEX_MAX = 4096,	      /* interfaces below it count in am_point_counts */
	AM_MAX_COUNTERS = 16384,      /* counter keys (points x colors x FlowMonIDs) */
	AM_HASH_LEN_MAX = 32,	      /* hash length in bits */
	AM_FLOWMON_NONE = 0xffffffff, /* the carrier has no FlowMonID */
	AM_FLOWMON_MAX = 0xfffff,     /* 20 bits */
};

/* Kinds of counter rows. */
enum am_kind {
	AM_KIND_COUNTED,   /* marked packets of the key's color */
	AM_KIND_MALFORMED, /* packets the parser could not read; color = the probe's clock's */
};

/* Probe: value of am_ifslots, per interface index: its points (number + 1; 0: not a point) per
 * enum am_dir. */
struct am_ifslots {
	__u32 slot[2];
};

/* Probe counters: key of am_counts. */
struct am_count_key {
	__u32 ifindex;
	__u32 flowmon; /* FlowMonID, AM_FLOWMON_NONE when the carrier has none */
	__u8 dir;      /* enum am_dir */
	__u8 color;    /* 0 or 1 */
	__u8 kind;     /* enum am_kind */
	__u8 pad;
};

/* Probe counters: per-CPU value of am_counts and am_point_counts. sum_ns is a 128-bit sum of
 * the TAI timestamps (lo, hi) so that the mean is exact; first/last are this CPU's. */
struct am_count {
	__u64 packets; /* segments: a GSO/GRO packet counts gso_segs */
	__u64 bytes;   /* L3 bytes of those segments */
	__u64 first_ns;
	__u64 last_ns;
	__u64 sum_ns_lo;
	__u64 sum_ns_hi;
};

/* One hash-selected packet, as the probe writes it to the sample ring of its color. Addresses
 * are IPv4-mapped IPv6 for IPv4 (::ffff:a.b.c.d). */
struct am_sample {
	__u64 tai_ns; /* bpf_ktime_get_tai_ns() */
	__u8 saddr[16];
	__u8 daddr[16];
	__u32 hash;
	__u32 ifindex;
	__u32 flowmon; /* AM_FLOWMON_NONE when none */
	__u32 length;  /* L3 length */
	__u16 sport;   /* host order; 0 when the protocol has none */
	__u16 dport;
	__u8 proto;
	__u8 dir;
	__u8 color;
	__u8 match; /* low bits of hash equal to hash_ref's (0-32): kept when >= the final length */
};

/* Probe: value of am_points, one per point and color: the dynamic hash length. hist[k] counts
 * the samples written with exactly k low bits equal to hash_ref's (k = 32: all); taken counts
 * those matching the current length. Go resets a color's entries when it reads them. */
struct am_point {
	struct bpf_spin_lock lock;
	__u32 bits;  /* current hash length: the configured start after every read-out */
	__u32 taken; /* samples written that match the current length */
	__u32 grown; /* times the length grew in this period */
	__u32 hist[AM_HASH_LEN_MAX + 1];
};

/* Probe: key of am_points. */
struct am_point_key {
	__u32 ifindex;
	__u8 dir;   /* enum am_dir */
	__u8 color; /* 0 or 1 */
	__u8 pad[2];
};

/* Probe statistics (per-CPU, summed in Go): every packet the probe sees ends in exactly one of
 * SEEN's outcomes (COUNTED, NOT_IP, UNMARKED, FILTERED, BACKBONE, MAL_*, TABLE_FULL);
 * the rest are events. */
enum am_stat {
	AM_STAT_SEEN,
	AM_STAT_COUNTED,
	AM_STAT_NOT_IP,	     /* not IPv4 or IPv6: passed */
	AM_STAT_UNMARKED,    /* the carrier is absent (no AltMark option, IPv6 with ipv4-flag) */
	AM_STAT_FILTERED,    /* protocol not in the filter */
	AM_STAT_BACKBONE,    /* from or to a backbone prefix */
	AM_STAT_NO_POINT,    /* sampling: point not configured (counted, not sampled) */
	AM_STAT_MAL_L2,	     /* Ethernet/VLAN header truncated */
	AM_STAT_MAL_IPV4,    /* IPv4 header truncated or inconsistent */
	AM_STAT_MAL_IPV6,    /* IPv6 header truncated or inconsistent (jumbogram included) */
	AM_STAT_MAL_EXT,     /* extension header truncated or too many */
	AM_STAT_MAL_OPT,     /* option TLVs overrun their header, AltMark of a bad length */
	AM_STAT_MAL_L4,	     /* transport header truncated */
	AM_STAT_TABLE_FULL,  /* counter table full: the packet is not counted (see Go) */
	AM_STAT_SAMPLED,     /* samples written */
	AM_STAT_SAMPLE_LOST, /* a sample that matched but found its ring full */
	AM_STAT_HASH_GROWN,  /* hash length grew by a bit */
	AM_STAT_GSO,	     /* GSO/GRO packets counted as their gso_segs segments */
	AM_STAT_MAX,
};

#endif
