/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* prio.h: what the prio programs share with Go (bpf2go -type). Fields largest first. */
#ifndef FLOWPLANE_PRIO_H
#define FLOWPLANE_PRIO_H

/* The advertisement: an RFC 6994 experimental TCP option, kind 253, length 8:
 *   253 | 8 | ExID (2 bytes, PRIO_EXID) | occupancy % (1 byte) | backlog (3 bytes, 64-byte units)
 * Two 32-bit words: no padding. docs/prio.md says why this size. */
enum prio_wire {
	PRIO_OPT_KIND = 253,
	PRIO_OPT_LEN = 8,
	PRIO_EXID = 0x4650, /* "FP" */
	PRIO_BACKLOG_UNIT = 64,
	PRIO_BACKLOG_MAX = 0xffffff,
	PRIO_OCC_UNKNOWN = 0xff,
	PRIO_SCTP_CHUNK_TYPE = 150, /* the original scheme's chunk: flags = occupancy % */
};

/* Table sizes. */
enum prio_limit {
	PRIO_MAX_SELECTORS = 64, /* host: expanded selector entries */
	PRIO_MAX_THRESH = 8,	 /* router: band edges */
	PRIO_MAX_BANDS = 16,
	PRIO_MAX_LEAVES = 64,
	PRIO_CACHE_SYNC = 64, /* router: fast-path packets between two syncs of a cached flow */
	PRIO_OCC_BANDS =
	    10, /* occupancy: one band per tenth of the send buffer; the default band is one more */
};

/* Router schemes (policy `scheme`). */
enum prio_scheme {
	PRIO_SCHEME_FIFO,
	PRIO_SCHEME_FAIR,
	PRIO_SCHEME_OCCUPANCY,
	PRIO_SCHEME_BACKLOG,
	PRIO_SCHEME_PIAS,
};

/* Host: one expanded selector. Addresses are IPv4-mapped IPv6 for IPv4 (::ffff:a.b.c.d). */
struct prio_selector {
	__u8 remote[16];
	__u8 local[16];
	__u16 remote_lo, remote_hi; /* port range, host order; 0-65535 = any */
	__u16 local_lo, local_hi;
	__u8 remote_len, local_len; /* prefix lengths over the 128-bit form; 0 = any */
	__u8 directions;	    /* PRIO_DIR_* bits */
	__u8 pad;
};

#define PRIO_DIR_ACTIVE	 1 /* connections this host opened */
#define PRIO_DIR_PASSIVE 2 /* connections this host accepted */

/* Router: a flow, as the bottleneck's egress sees it (one direction). 8-byte aligned: the
 * flow cache hashes and compares it a 64-bit word at a time. */
struct prio_flow_key {
	__u8 saddr[16]; /* IPv4-mapped for IPv4 */
	__u8 daddr[16];
	__u16 sport, dport; /* network order */
	__u8 proto;
	__u8 pad[3];
} __attribute__((aligned(8)));

struct prio_flow {
	__u64 bytes;	   /* seen at this hook */
	__u64 last_seen;   /* coarse clock ns; kept only if move_gap or idle_reset is set */
	__u64 last_change; /* coarse clock ns of the last band change */
	__u32 backlog;	   /* last advertised unsent bytes */
	__u32 changes;	   /* band changes */
	__u32 classid;	   /* the HTB class its packets go to */
	__u8 band;
	__u8 occupancy; /* last advertised %, PRIO_OCC_UNKNOWN if none */
	__u8 source;	/* enum prio_source of the last information */
	__u8 trusted;	/* its source is in prio_trust (looked up once, at its first packet) */
};

/* Router: one slot of a CPU's flow cache (classifier.bpf.c, docs/prio.md "Flow cache"): a copy
 * of a flow's state that the fast path reads and writes instead of the flow table, synced back
 * to the table every PRIO_CACHE_SYNC packets and whenever the flow leaves the fast path. */
struct prio_flow_cached {
	__u64 bytes;	   /* the table's bytes when filled (this CPU's view adds unsynced) */
	__u64 last_seen;   /* as in prio_flow */
	__u64 last_change; /* as in prio_flow: a move anywhere makes the copy stale (gen) */
	struct prio_flow_key key; /* the flow this slot holds (valid while packets > 0) */
	__u32 unsynced;		  /* bytes not yet added to the table */
	__u32 backlog;		  /* as in prio_flow */
	__u32 classid;		  /* the flow's class when filled */
	__u32 gen;		  /* prio_gen of the slot when filled: a move anywhere bumps it */
	__u8 band, occupancy, source, trusted; /* as in prio_flow */
	__u8 packets;			       /* since the last sync; 0: an empty slot */
	__u8 pad[3];
};

enum prio_source {
	PRIO_SRC_NONE,
	PRIO_SRC_TCP_OPTION,
	PRIO_SRC_SCTP_CHUNK,
};

/* LPM key for the trusted source prefixes (IPv4-mapped). */
struct prio_lpm_key {
	__u32 prefixlen;
	__u8 addr[16];
};

/* Router counters. A packet costs one or two: every packet the classifier saw is under exactly
 * one of FIFO, PARSED, SCTP, NO_OPTION, MALFORMED and OTHER, and a flow's packets that did not
 * take the table (TABLE) came from the cache; `prio status` adds them up (status.go). */
enum prio_stat {
	PRIO_STAT_FIFO,	       /* fifo: a packet classified without parsing */
	PRIO_STAT_PARSED,      /* carried our TCP option */
	PRIO_STAT_SCTP,	       /* carried the original SCTP chunk */
	PRIO_STAT_NO_OPTION,   /* TCP/UDP/SCTP without information */
	PRIO_STAT_MALFORMED,   /* headers or options that do not parse: default class */
	PRIO_STAT_UNTRUSTED,   /* information from a source outside the trusted prefixes */
	PRIO_STAT_CAPPED,      /* a claim above max_claim, lowered */
	PRIO_STAT_OTHER,       /* not a flow (ARP, ICMP, fragments...): default class */
	PRIO_STAT_BAND_CHANGE, /* a flow moved band */
	PRIO_STAT_CHANGE_HELD, /* a move refused: too soon after the last */
	PRIO_STAT_NO_STATE,    /* the flow table refused an entry: default class */
	PRIO_STAT_IDLE_RESET,  /* pias: a flow idle for idle_reset started over in band 0 */
	PRIO_STAT_MOVE_WAIT,   /* a move put off: the flow sent within move_gap */
	PRIO_STAT_TABLE,       /* a flow's packet that took the flow table, not the cache */
	PRIO_STAT_MAX,
};

/* Host counters. */
enum prio_host_stat {
	PRIO_HOST_MATCHED,     /* connections that advertise */
	PRIO_HOST_UNMATCHED,   /* connections no selector takes */
	PRIO_HOST_WRITTEN,     /* segments that carry the option */
	PRIO_HOST_NO_ROOM,     /* the header had no room left for it */
	PRIO_HOST_NO_TCP_SOCK, /* bpf_skc_to_tcp_sock failed */
	PRIO_HOST_UNCHANGED,   /* data segments sent without it: nothing new to tell */
	PRIO_HOST_NO_STORAGE,  /* a selected connection got no socket storage: not advertised */
	PRIO_HOST_HELD,	       /* data segments sent without it: a step within min_interval */
	PRIO_HOST_DEFERRED,    /* data segments sent without it: sized without its room (the next
				* MSS sizing leaves it) */
	PRIO_HOST_STAT_MAX,
};

#endif
