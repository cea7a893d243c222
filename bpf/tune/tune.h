/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* tune.h: what the sock_ops tuning program and its Go loader share. Every struct here is
 * mirrored by bpf2go (-type), fields largest first so neither side needs padding rules. */
#ifndef FLOWPLANE_TUNE_H
#define FLOWPLANE_TUNE_H

#define TUNE_MAX_RULES	  1024			/* rules per policy generation */
#define TUNE_WORDS	  (TUNE_MAX_RULES / 64) /* u64 words in a rule set */
#define TUNE_MAX_PROFILES 256			/* profiles per policy generation */
#define TUNE_CC_LEN	  16			/* TCP_CA_NAME_MAX */

/* tune_gen's value: bit 1 << op for each callback (BPF_SOCK_OPS_*, op < TUNE_OP_BITS) the live
 * policy needs a run of (the others return first thing), the live generation in the top bit,
 * and: */
#define TUNE_OP_BITS   29
#define TUNE_GEN_SHIFT 31
/* No rule of the generation has a remote (local) prefix: that side's trie answers "every rule"
 * for any address, so a match skips its lookup. */
#define TUNE_REMOTE_ANY (1U << 30)
#define TUNE_LOCAL_ANY	(1U << 29)

/* The sides of a connection, in tune_sides' key. */
#define TUNE_SIDE_REMOTE 0
#define TUNE_SIDE_LOCAL	 1

/* tune_profile.react_on: what triggers the reactive settings */
#define TUNE_REACT_RETRANS 1 /* more than react_retrans segments retransmitted */
#define TUNE_REACT_RTO	   2 /* more than react_rtos consecutive retransmission timeouts */

#define TUNE_DIR_ACTIVE	 1
#define TUNE_DIR_PASSIVE 2

/* One bit per setting in tune_profile.set, and the key of the per-setting counters. */
enum tune_setting {
	TUNE_SET_SYN_RTO,
	TUNE_SET_INIT_RWND,
	TUNE_SET_ECN,
	TUNE_SET_SNDBUF,
	TUNE_SET_RCVBUF,
	TUNE_SET_INIT_CWND,
	TUNE_SET_CWND_CLAMP,
	TUNE_SET_CONGESTION,
	TUNE_SET_RTO_MIN,
	TUNE_SET_DELACK_MAX,
	TUNE_SET_RTO_MAX,
	TUNE_SET_PACING,
	TUNE_SET_MARK,
	TUNE_SET_PRIORITY,
	TUNE_SET_TOS,
	TUNE_SET_NOTSENT_LOWAT,
	TUNE_SET_NODELAY,
	TUNE_SET_WINDOW_CLAMP,
	TUNE_SET_MSS,
	TUNE_SET_KEEPALIVE,
	TUNE_SET_KEEPIDLE,
	TUNE_SET_KEEPINTVL,
	TUNE_SET_KEEPCNT,
	TUNE_SET_USER_TIMEOUT,
	TUNE_SET_REACT_CONGESTION,
	TUNE_SET_REACT_CWND_CLAMP,
	TUNE_SET_REACT_CALLBACKS, /* enabling RETRANS / RTO callbacks for reactive settings */
	TUNE_SET_MAX,
	/* Masks of the settings apply_socket makes (socket options, before the SYN on an active
	 * open) and of those apply_established makes: a profile with none of either skips that
	 * call. They sit in this enum (past TUNE_SET_MAX, so no counter has them as key) because
	 * tune_applied puts the enum in BTF and bpf2go -type hands it to Go, whose compiler sorts
	 * the settings by them. */
	TUNE_SOCKET_SETTINGS =
	    (1U << TUNE_SET_CONGESTION) | (1U << TUNE_SET_SNDBUF) | (1U << TUNE_SET_RCVBUF) |
	    (1U << TUNE_SET_MSS) | (1U << TUNE_SET_WINDOW_CLAMP) | (1U << TUNE_SET_PACING) |
	    (1U << TUNE_SET_MARK) | (1U << TUNE_SET_PRIORITY) | (1U << TUNE_SET_TOS) |
	    (1U << TUNE_SET_NOTSENT_LOWAT) | (1U << TUNE_SET_NODELAY) | (1U << TUNE_SET_KEEPALIVE) |
	    (1U << TUNE_SET_KEEPIDLE) | (1U << TUNE_SET_KEEPINTVL) | (1U << TUNE_SET_KEEPCNT) |
	    (1U << TUNE_SET_USER_TIMEOUT) | (1U << TUNE_SET_RTO_MAX),
	TUNE_ESTABLISHED_SETTINGS = (1U << TUNE_SET_INIT_CWND) | (1U << TUNE_SET_CWND_CLAMP) |
				    (1U << TUNE_SET_RTO_MIN) | (1U << TUNE_SET_DELACK_MAX) |
				    (1U << TUNE_SET_REACT_CALLBACKS),
};

/* Program-wide counters. */
enum tune_stat {
	TUNE_STAT_ACTIVE,      /* active opens established (ACTIVE_ESTABLISHED_CB) */
	TUNE_STAT_PASSIVE,     /* passive opens established (PASSIVE_ESTABLISHED_CB) */
	TUNE_STAT_MATCHED,     /* connections a rule selected and tuned */
	TUNE_STAT_SAMPLED_OUT, /* connections a sampled rule selected but left alone */
	TUNE_STAT_UNMATCHED,   /* connections no rule selected */
	TUNE_STAT_REACTED,     /* reactive rules fired */
	TUNE_STAT_NO_STORAGE,  /* socket storage could not be created */
	TUNE_STAT_RETRANS_CB,  /* retransmission callbacks run (reactive rules only) */
	TUNE_STAT_RTO_CB,      /* RTO callbacks run (reactive rules only) */
	TUNE_STAT_MAX,
};

/* A profile: the settings bit n of set selects are applied, the others left alone. */
struct tune_profile {
	char congestion[TUNE_CC_LEN];	    /* TCP_CONGESTION */
	char react_congestion[TUNE_CC_LEN]; /* TCP_CONGESTION after react_retrans retransmissions */
	__u32 set;			    /* bit (1 << enum tune_setting) per setting given */
	__u32 syn_rto_ms;		    /* SYN / SYN-ACK RTO; jiffies computed with CONFIG_HZ */
	__u32 init_rwnd;		    /* initial receive window, segments */
	__u32 init_cwnd;		    /* TCP_BPF_IW, segments */
	__u32 cwnd_clamp;		    /* TCP_BPF_SNDCWND_CLAMP, segments */
	__u32 snd_buf;			    /* SO_SNDBUF, bytes (the kernel doubles it) */
	__u32 rcv_buf;			    /* SO_RCVBUF, bytes (the kernel doubles it) */
	__u32 rto_min_us;		    /* TCP_BPF_RTO_MIN */
	__u32 delack_max_us;		    /* TCP_BPF_DELACK_MAX */
	__u32 rto_max_ms;		    /* TCP_RTO_MAX_MS */
	__u32 max_pacing_rate;		    /* SO_MAX_PACING_RATE, bytes per second */
	__u32 mark;			    /* SO_MARK */
	__u32 priority;			    /* SO_PRIORITY */
	__u32 notsent_lowat;		    /* TCP_NOTSENT_LOWAT, bytes */
	__u32 window_clamp;		    /* TCP_WINDOW_CLAMP, bytes */
	__u32 mss;			    /* TCP_MAXSEG, bytes */
	__u32 keep_idle;		    /* TCP_KEEPIDLE, seconds */
	__u32 keep_intvl;		    /* TCP_KEEPINTVL, seconds */
	__u32 keep_cnt;			    /* TCP_KEEPCNT */
	__u32 user_timeout_ms;		    /* TCP_USER_TIMEOUT */
	__u32 react_retrans;		    /* react when total retransmissions exceed this */
	__u32 react_cwnd_clamp;		    /* TCP_BPF_SNDCWND_CLAMP after react_retrans */
	__u32 react_rtos;		    /* react after more than this many consecutive RTOs */
	__u8 tos;			    /* IP_TOS / IPV6_TCLASS */
	__u8 nodelay;			    /* TCP_NODELAY */
	__u8 react_on;			    /* TUNE_REACT_* triggers */
	__u8 pad[1];
};

/* A rule: ports, direction and sampling; its prefixes live in the LPM tries. */
struct tune_rule {
	__u64 sample;	/* treated when flow hash < sample (1 << 32 = every flow) */
	__u32 profile;	/* index into the generation's profiles */
	__u16 rport_lo; /* remote port range, inclusive */
	__u16 rport_hi;
	__u16 lport_lo; /* local port range, inclusive */
	__u16 lport_hi;
	__u8 dir; /* TUNE_DIR_ACTIVE | TUNE_DIR_PASSIVE */
	__u8 pad[7];
};

/* LPM key: generation and family bytes, then the address (IPv4 in the first 4 bytes). The
 * prefix length counts the 16 bits of generation and family. */
struct tune_lpm_key {
	__u32 prefixlen;
	__u8 gen;
	__u8 family;
	__u8 addr[16];
};

/* The rules (bit i = rule i) whose prefix contains the looked-up address; bit i of nz is set
 * when w[i] is not zero, so a match visits only the words that can hold a rule. first is the
 * lowest rule of the set (-1: none); it comes first, next to the key the trie lookup has just
 * compared. */
struct tune_ruleset {
	__s32 first;
	__u32 pad;
	__u64 nz;
	__u64 w[TUNE_WORDS];
};

/* One side (remote or local address) of a policy generation. */
struct tune_side {
	struct tune_ruleset any; /* the rules without a prefix on this side */
	/* Bit n of octets[0] (IPv4) or octets[1] (IPv6) is set when a prefix of the side's trie
	 * covers addresses whose first byte is n: an address whose bit is clear is in no prefix,
	 * and its rules are any's without a trie lookup. */
	__u64 octets[2][4];
};

/* Key of the kernel-refusal counters. */
struct tune_err_key {
	__s32 err;     /* negative errno from bpf_setsockopt */
	__u32 setting; /* enum tune_setting */
};

/* What a socket with reactive settings keeps (socket storage; other sockets get none): a copy
 * of its profile's reactive settings, so a later policy cannot change what it was given. */
struct tune_sk {
	char congestion[TUNE_CC_LEN]; /* react_congestion */
	__u32 set;		      /* the profile's set (TUNE_SET_REACT_* bits used) */
	__u32 retrans;		      /* react_retrans */
	__u32 rtos;		      /* react_rtos */
	__u32 cwnd_clamp;	      /* react_cwnd_clamp */
	__u8 on;		      /* react_on */
	__u8 reacted;		      /* reactive settings already applied */
	__u8 pad[2];
};

#endif
