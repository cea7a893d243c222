/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* conntrack.h: the structures the conntrack programs (XDP and tc) share with Go (bpf2go -type).
 * Fields are ordered largest first so both sides agree on the layout without padding surprises. */
#ifndef FLOWPLANE_CONNTRACK_H
#define FLOWPLANE_CONNTRACK_H

#include "common.h"

/* TCP states, numbered as nf_conntrack's enum tcp_conntrack. */
enum ct_tcp_state {
	CT_TCP_NONE,
	CT_TCP_SYN_SENT,
	CT_TCP_SYN_RECV,
	CT_TCP_ESTABLISHED,
	CT_TCP_FIN_WAIT,
	CT_TCP_CLOSE_WAIT,
	CT_TCP_LAST_ACK,
	CT_TCP_TIME_WAIT,
	CT_TCP_CLOSE,
	CT_TCP_SYN_SENT2,
	CT_TCP_MAX,    /* sIV: invalid transition */
	CT_TCP_IGNORE, /* sIG: pass, change nothing */
};

/* Timeout slots of struct ct_config: the TCP states first (same numbers), then the rest. */
enum ct_timeout {
	CT_TO_UDP_UNREPLIED = CT_TCP_MAX,
	CT_TO_UDP_STREAM,
	CT_TO_ICMP,
	CT_TO_TCP_UNACK,   /* nf's tcp_timeout_unacknowledged: cap while data is unacknowledged */
	CT_TO_TCP_RETRANS, /* nf's tcp_timeout_max_retrans: cap after max_retrans retransmissions */
	CT_TO_MAX,
};

/* Per-CPU counters (key of ct_stats). */
enum ct_stat {
	CT_STAT_NEW,	       /* connection created */
	CT_STAT_ESTABLISHED,   /* connection confirmed: first valid reply */
	CT_STAT_RELATED,       /* ICMP error matching a tracked connection */
	CT_STAT_FORWARDED,     /* packets redirected (XDP or tc) */
	CT_STAT_PASSED,	       /* packets handed to the kernel (not trackable, no neighbour, ...) */
	CT_STAT_POLICY_DROP,   /* new connection not allowed by policy */
	CT_STAT_TABLE_FULL,    /* confirmed table full: connection refused */
	CT_STAT_EXPIRED,       /* entry found expired on lookup and removed */
	CT_STAT_SWEPT,	       /* entry removed by the user-space sweep */
	CT_STAT_INV_NO_CONN,   /* not a connection-opening packet and no entry */
	CT_STAT_INV_TCP_STATE, /* TCP flags invalid in the connection's state */
	CT_STAT_INV_WINDOW,    /* TCP segment outside the tracked window */
	CT_STAT_INV_RST,       /* TCP RST with a stale sequence number */
	CT_STAT_INV_SYNACK,    /* SYN-ACK not acknowledging SYN+1 */
	CT_STAT_INV_ICMP,      /* ICMP error matching nothing, or untracked ICMP type */
	CT_STAT_INV_MALFORMED, /* truncated or inconsistent transport header */
	CT_STAT_WINDOW_IGNORED, /* TCP old retransmission / delayed ACK: passed untouched (nf) */
	CT_STAT_TCP_IGNORED,	/* TCP packet nf's state table ignores (a SYN on a live tuple, ...):
				 * passed and remembered, the timeout not refreshed (nf) */
	CT_STAT_EMB_REMOVED,	/* unconfirmed entries deleted (confirmed, expired, swept, flushed,
				 * ...):    new - this - entries left = what the LRU evicted */
	CT_STAT_MAX,
};

/* Interface roles (value of ct_ifaces). */
enum ct_role {
	CT_ROLE_NONE,
	CT_ROLE_INSIDE,
	CT_ROLE_OUTSIDE,
};

/* Event types sent on ct_events. */
enum ct_event_type {
	CT_EVENT_NEW = 1,
	CT_EVENT_DESTROY,
};

/* Entry status bits (ct_entry.status). */
#define CT_F_SEEN_REPLY 0x1
#define CT_F_ASSURED	0x2
#define CT_F_ORIG_LO	0x4 /* the original direction's sender is the key's lo endpoint */

/* TCP per-direction flags (ct_tcp_dir.flags), as nf's IP_CT_TCP_FLAG_*. */
enum ct_tcp_flag {
	CT_TCP_F_WSCALE = 0x01,
	CT_TCP_F_CLOSE_INIT = 0x02, /* this direction sent the FIN that began the close */
	CT_TCP_F_SACK_PERM = 0x04,
	CT_TCP_F_BE_LIBERAL = 0x08, /* no window checks: picked up mid-stream, or restarted */
	CT_TCP_F_DATA_UNACK = 0x10, /* this direction sent data the other has not acknowledged */
	CT_TCP_F_MAXACK_SET = 0x20,
};
/* In ct_entry.last_flags only, as nf's IP_CT_EXP_CHALLENGE_ACK: the ignored SYN came in
 * LAST_ACK, so the other side may answer it with an RFC 5961 challenge ACK. */
#define CT_TCP_F_EXP_CHALLENGE_ACK 0x40
/* In ct_entry.last_flags only, as nf's IP_CT_TCP_SIMULTANEOUS_OPEN: the connection went through
 * SYN_SENT2, so the reply's ACK in SYN_RECV establishes it (the state table cannot tell). */
#define CT_TCP_F_SIMULTANEOUS_OPEN 0x80

/* Canonical 5-tuple: the lower (address, port) endpoint first, so both directions of a
 * connection build the same key. IPv4 addresses use the first word, the rest zero. ICMP echo
 * puts the identifier in both ports. */
struct ct_key {
	__u32 lo_addr[4];
	__u32 hi_addr[4];
	__u16 lo_port; /* network order */
	__u16 hi_port; /* network order */
	__u8 proto;
	__u8 family; /* 4 or 6 */
	__u8 pad[2];
};

/* van Rooij window state of one direction's sender, as nf's struct ip_ct_tcp_state. */
struct ct_tcp_dir {
	__u32 td_end;	 /* max of seq + len */
	__u32 td_maxend; /* max of ack + max(win, 1) */
	__u32 td_maxwin; /* max(win) */
	__u32 td_maxack; /* max of ack */
	__u8 td_scale;	 /* window scale factor */
	__u8 flags;	 /* CT_TCP_F_* */
	__u8 pad[2];
};

/* The FIB result for one direction of a confirmed connection, reused for up to a second. */
struct ct_route {
	__u64 checked; /* ct_now() of the lookup; 0: none */
	__u32 ifindex; /* egress interface */
	__u32 ingress; /* the ingress interface it was looked up for */
	__u16 len_ok;  /* the L3 length whose MTU check passed */
	__u8 smac[6];
	__u8 dmac[6];
	__u8 pad[2];
};

/* One connection. Index 0 of the arrays is the original direction, 1 the reply. */
struct ct_entry {
	__u64 expires;		  /* ct_now() after which the entry is dead */
	__u64 created;		  /* ct_now() at creation */
	__u64 packets[2];	  /* per direction */
	__u64 bytes[2];		  /* per direction, L3 bytes */
	struct ct_route route[2]; /* per direction, set for confirmed entries */
	struct ct_tcp_dir tcp[2];
	__u32 state;	  /* enum ct_tcp_state for TCP; 0 otherwise. Changed with cmpxchg only */
	__u32 status;	  /* CT_F_* */
	__u32 ifindex[2]; /* ingress interface per direction, 0 if not seen yet */
	/* nf's last_* memory of the last TCP packet passed: set by an ignored packet (with its
	 * end and window) and by an accepted one (its end if a plain ACK). A SYN-ACK acknowledging
	 * an ignored SYN re-syncs; a RST answering an ignored SYN or ACK closes. */
	__u32 last_end;	  /* that packet's seq + len (+SYN/FIN) */
	__u32 last_seq;	  /* its seq (nf's retransmission check: the same ACK segment again) */
	__u32 last_ack;	  /* an accepted plain ACK's ack */
	__u16 last_win;	  /* an ignored packet's window */
	__u8 last_index;  /* its flag class (enum tcp_bit_set) + 1; 0: none yet */
	__u8 last_dir;	  /* its direction */
	__u8 last_wscale; /* an ignored SYN's window scale */
	__u8 last_flags;  /* an ignored SYN's CT_TCP_F_WSCALE | CT_TCP_F_SACK_PERM, and
			   * CT_TCP_F_EXP_CHALLENGE_ACK, CT_TCP_F_SIMULTANEOUS_OPEN */
	__u8 retrans;	  /* the last plain ACK segment seen again in a row, as nf's retrans */
	__u8 pad;
};

/* Run-time configuration (ct_config[0]): changed by user space without reloading. */
struct ct_config {
	__u32 timeout[CT_TO_MAX]; /* seconds, per enum ct_timeout */
	__u32 liberal;		  /* 1: do not drop TCP segments outside the window */
	__u32 loose;		  /* 1: an ACK from inside picks up a connection (nf's tcp_loose) */
};

/* Key of ct_allow_port: connections from outside to this port are allowed. */
struct ct_port_key {
	__u16 port; /* network order */
	__u8 proto;
	__u8 pad;
};

/* Value of ct_ifmac: the MAC address of an attached interface, for XDP's stand-in for the
 * kernel's pkt_type check (only frames addressed to the router are forwarded). */
#define CT_IFMAC_MAX 4096 /* interfaces with a larger ifindex go unchecked (fail open) */
struct ct_ifmac {
	__u8 mac[6];
	__u8 set;
	__u8 pad;
};

/* Key of ct_allow_net: connections from outside to this destination prefix are allowed. IPv4
 * is mapped into ::ffff:0:0/96. */
struct ct_lpm_key {
	__u32 prefixlen;
	__u8 addr[16];
};

/* Context of ct_sweep, run by user space with BPF_PROG_RUN: candidate keys in, count out. */
#define CT_SWEEP_BATCH 32
struct ct_sweep_batch {
	struct ct_key keys[CT_SWEEP_BATCH];
	__u32 count;   /* keys in use */
	__u32 table;   /* 0: ct_main, 1: ct_emb */
	__u32 removed; /* out: entries found expired (or flushed) and removed */
	__u32 flush;   /* 1: remove the entries whether or not they have expired */
};

/* Record sent on ct_events. */
struct ct_event {
	__u64 ts; /* CLOCK_MONOTONIC ns */
	struct ct_key key;
	__u32 type;   /* enum ct_event_type */
	__u32 status; /* CT_F_* of the entry */
	__u32 state;
	__u32 pad;
};

#endif
