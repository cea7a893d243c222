// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* conntrack.bpf.c: a stateful XDP (or, built with -DCT_HOOK_TC, tcx ingress) forwarder. Every
 * IPv4/IPv6 TCP, UDP and ICMP packet routed between the attached interfaces is tracked with
 * nf_conntrack's semantics (TCP state table and van Rooij window tracking, UDP replied/unreplied,
 * ICMP echo by id, ICMP errors related by their quoted header), filtered by an inside/outside
 * policy and forwarded with bpf_fib_lookup + bpf_redirect_map (TC: bpf_redirect). Anything it
 * cannot handle goes to the kernel (XDP_PASS, TC_ACT_OK).
 *
 * Tables: connections live in ct_emb (LRU) until a valid reply confirms them, then move to
 * ct_main (plain hash): a flood of unconfirmed connections can only evict other unconfirmed
 * ones. Entries are updated without locks: the state word changes by cmpxchg, sequence
 * maxima only grow (cmpxchg loops), counters use atomic adds (docs/conntrack.md). */
#include "common.h"
#include "parse.h"
#include "csum.h"
#include "stats.h"
#include "conntrack.h"

#define AF_INET	       2
#define AF_INET6       10
#define NSEC_PER_SEC   1000000000ULL
#define MAXACKWINCONST 66000
#define ROUTE_CACHE_NS NSEC_PER_SEC /* how long a connection reuses its FIB result */

/* One source, two programs: the XDP build (default) and, with -DCT_HOOK_TC, a tcx ingress
 * program that runs on the skb after GRO (docs/conntrack.md, "Hooks"). These macros are all
 * that differs between the two contexts. */
#ifdef CT_HOOK_TC
#define CT_CTX		struct __sk_buff
#define CT_PASS		TC_ACT_OK
#define CT_DROP		TC_ACT_SHOT
#define CT_REDIRECT	TC_ACT_REDIRECT
#define ct_load_bytes	bpf_skb_load_bytes
#define CT_SEC		"tc"
#define CT_TC_ICMP_PULL 256 /* linear bytes wanted after an ICMP header (quoted packet) */
#else
#define CT_CTX	      struct xdp_md
#define CT_PASS	      XDP_PASS
#define CT_DROP	      XDP_DROP
#define CT_REDIRECT   XDP_REDIRECT
#define ct_load_bytes bpf_xdp_load_bytes
#define CT_SEC	      "xdp"
#endif
#define CT_INGRESS(ctx) ((ctx)->ingress_ifindex)

#define ICMP_ECHOREPLY	    0
#define ICMP_DEST_UNREACH   3
#define ICMP_SOURCE_QUENCH  4
#define ICMP_REDIRECT	    5
#define ICMP_ECHO	    8
#define ICMP_TIME_EXCEEDED  11
#define ICMP_PARAMETERPROB  12
#define ICMPV6_ECHO_REQUEST 128
#define ICMPV6_ECHO_REPLY   129

/* 0: firewall (drop what the policy refuses); 1: track only (never drop). */
volatile const __u32 track_only = 0;
/* Length of a jiffy in ns (10^9 / CONFIG_HZ) and jiffies at boot (INITIAL_JIFFIES), set by the
 * loader: ct_now is then close to CLOCK_MONOTONIC, the clock of tables pinned by older builds. */
volatile const __u64 jiffy_ns = 0;
volatile const __u64 jiffies_base = 0;

/* key = struct ct_key, value = struct ct_entry: confirmed connections (reply seen) */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct ct_key);
	__type(value, struct ct_entry);
	__uint(max_entries, 262144);
} ct_main SEC(".maps");

/* key = struct ct_key, value = struct ct_entry: unconfirmed connections, LRU-evicted */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ct_key);
	__type(value, struct ct_entry);
	__uint(max_entries, 65536);
} ct_emb SEC(".maps");

/* key = 0, value = struct ct_config: timeouts and options, rewritten at run time */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct ct_config);
	__uint(max_entries, 1);
} ct_settings SEC(".maps");

/* key = ingress ifindex, value = enum ct_role */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 64);
} ct_ifaces SEC(".maps");

/* key = egress ifindex, value = ifindex: where bpf_redirect_map may send */
struct {
	__uint(type, BPF_MAP_TYPE_DEVMAP_HASH);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 64);
} tx_ports SEC(".maps");

/* key = struct ct_port_key, value = 1: outside may open connections to this port */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct ct_port_key);
	__type(value, __u8);
	__uint(max_entries, 1024);
} ct_allow_port SEC(".maps");

/* key = struct ct_lpm_key, value = 1: outside may open connections to this prefix */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct ct_lpm_key);
	__type(value, __u8);
	__uint(max_entries, 1024);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} ct_allow_net SEC(".maps");

/* ring buffer of struct ct_event: connection created / destroyed */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} ct_events SEC(".maps");

/* key = 0, value = struct ct_entry: per-CPU scratch space to build a new entry in (the stack is
 * too small for it next to everything else) */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct ct_entry);
	__uint(max_entries, 1);
} ct_scratch SEC(".maps");

/* key = enum ct_stat, value = per-CPU count */
FP_COUNTERS(ct_stats, enum ct_stat, CT_STAT_MAX);

/* Keep the enums in BTF for bpf2go -type. */
const enum ct_tcp_state *unused_state __attribute__((unused));
const enum ct_timeout *unused_timeout __attribute__((unused));
const enum ct_role *unused_role __attribute__((unused));
const enum ct_event_type *unused_event __attribute__((unused));
const struct ct_event *unused_ev __attribute__((unused));

/* ct_now is the entries' clock: nf_conntrack's jiffies, in ns. bpf_jiffies64 is a plain read;
 * the ktime helpers cost several times more, per packet. User space reads the same clock. */
static __always_inline __u64 ct_now(void)
{
	return (bpf_jiffies64() - jiffies_base) * jiffy_ns;
}

/* TCP flag classes (the rows of the state table) are vmlinux.h's enum tcp_bit_set:
 * TCP_SYN_SET, TCP_SYNACK_SET, TCP_FIN_SET, TCP_ACK_SET, TCP_RST_SET, TCP_NONE_SET. */

#define sNO CT_TCP_NONE
#define sSS CT_TCP_SYN_SENT
#define sSR CT_TCP_SYN_RECV
#define sES CT_TCP_ESTABLISHED
#define sFW CT_TCP_FIN_WAIT
#define sCW CT_TCP_CLOSE_WAIT
#define sLA CT_TCP_LAST_ACK
#define sTW CT_TCP_TIME_WAIT
#define sCL CT_TCP_CLOSE
#define sS2 CT_TCP_SYN_SENT2
#define sIV CT_TCP_MAX
#define sIG CT_TCP_IGNORE

/* nf_conntrack_proto_tcp.c's tcp_conntracks[direction][flag class][old state]. */
static const __u8 tcp_conntracks[2][6][10] = {
    {
	/* ORIGINAL: sNO, sSS, sSR, sES, sFW, sCW, sLA, sTW, sCL, sS2 */
	/*syn*/ {sSS, sSS, sIG, sIG, sIG, sIG, sIG, sSS, sSS, sS2},
	/*synack*/ {sIV, sIV, sSR, sIV, sIV, sIV, sIV, sIV, sIV, sSR},
	/*fin*/ {sIV, sIV, sFW, sFW, sLA, sLA, sLA, sTW, sCL, sIV},
	/*ack*/ {sES, sIV, sES, sES, sCW, sCW, sTW, sTW, sCL, sIV},
	/*rst*/ {sIV, sCL, sCL, sCL, sCL, sCL, sCL, sCL, sCL, sCL},
	/*none*/ {sIV, sIV, sIV, sIV, sIV, sIV, sIV, sIV, sIV, sIV},
    },
    {
	/* REPLY: sNO, sSS, sSR, sES, sFW, sCW, sLA, sTW, sCL, sS2 */
	/*syn*/ {sIV, sS2, sIV, sIV, sIV, sIV, sIV, sSS, sIV, sS2},
	/*synack*/ {sIV, sSR, sIG, sIG, sIG, sIG, sIG, sIG, sIG, sSR},
	/*fin*/ {sIV, sIV, sFW, sFW, sLA, sLA, sLA, sTW, sCL, sIV},
	/*ack*/ {sIV, sIG, sSR, sES, sCW, sCW, sTW, sTW, sCL, sIG},
	/*rst*/ {sIV, sCL, sCL, sCL, sCL, sCL, sCL, sCL, sCL, sCL},
	/*none*/ {sIV, sIV, sIV, sIV, sIV, sIV, sIV, sIV, sIV, sIV},
    },
};

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
};

enum verdict {
	V_ALLOW,
	V_DROP,
};

#define TCP_F_FIN 0x01
#define TCP_F_SYN 0x02
#define TCP_F_RST 0x04
#define TCP_F_ACK 0x10
#define TCP_F_URG 0x20
#define VF(f)	  (1ULL << (f))
#define TCP_VALID_FLAGS                                                                            \
	(VF(TCP_F_SYN) | VF(TCP_F_SYN | TCP_F_URG) | VF(TCP_F_SYN | TCP_F_ACK) | VF(TCP_F_RST) |   \
	 VF(TCP_F_RST | TCP_F_ACK) | VF(TCP_F_FIN | TCP_F_ACK) |                                   \
	 VF(TCP_F_FIN | TCP_F_ACK | TCP_F_URG) | VF(TCP_F_ACK) | VF(TCP_F_ACK | TCP_F_URG))

/* ---- sequence arithmetic (host order, modulo 2^32) ---- */

static __always_inline int before(__u32 a, __u32 b)
{
	return (__s32)(a - b) < 0;
}

static __always_inline int after(__u32 a, __u32 b)
{
	return before(b, a);
}

/* seq_max raises *p to v if v is after it; concurrent callers never move it backwards. */
static __always_inline void seq_max(__u32 *p, __u32 v)
{
#pragma unroll
	for (int i = 0; i < 4; i++) {
		__u32 old = *(volatile __u32 *)p;

		if (!after(v, old))
			return;
		if (__sync_val_compare_and_swap(p, old, v) == old)
			return;
	}
}

/* num_max raises *p to v (plain unsigned order), never lowering it. */
static __always_inline void num_max(__u32 *p, __u32 v)
{
#pragma unroll
	for (int i = 0; i < 4; i++) {
		__u32 old = *(volatile __u32 *)p;

		if (v <= old)
			return;
		if (__sync_val_compare_and_swap(p, old, v) == old)
			return;
	}
}

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

/* ---- timeouts ---- */

static __always_inline __u64 timeout_ns(struct ct_config *cfg, __u32 slot)
{
	if (!cfg || slot >= CT_TO_MAX)
		return 30 * NSEC_PER_SEC;
	return (__u64)cfg->timeout[slot] * NSEC_PER_SEC;
}

static __always_inline void emit(struct ct_key *key, __u32 type, __u32 status, __u32 state)
{
	struct ct_event *ev = bpf_ringbuf_reserve(&ct_events, sizeof(*ev), 0);

	if (!ev)
		return;
	ev->ts = bpf_ktime_get_ns();
	ev->key = *key;
	ev->type = type;
	ev->status = status;
	ev->state = state;
	ev->pad = 0;
	bpf_ringbuf_submit(ev, 0);
}

/* ---- TCP ---- */

static __always_inline __u8 tcp_flag_index(const struct tcphdr *th)
{
	if (th->rst)
		return TCP_RST_SET;
	if (th->syn)
		return th->ack ? TCP_SYNACK_SET : TCP_SYN_SET;
	if (th->fin)
		return TCP_FIN_SET;
	if (th->ack)
		return TCP_ACK_SET;
	return TCP_NONE_SET;
}

/* Per-CPU room to copy TCP options into, off the stack. */
struct tcp_opts {
	__u8 b[40];
};

/* key = 0, value = struct tcp_opts */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct tcp_opts);
	__uint(max_entries, 1);
} ct_opts_scratch SEC(".maps");

/* ct_sack_blocks raises p->sack to the highest right edge of the n SACK blocks at o->b[at]
 * (nf's tcp_sack). A global function, so the option loop stays cheap to verify. */
__attribute__((noinline)) int ct_sack_blocks(struct tcp_opts *o, __u32 at, __u32 n, struct pkt *p)
{
	if (!o || !p || at >= sizeof(o->b))
		return 0;
	for (int k = 0; k < 4; k++) {
		__u32 edge, off = (at + k * 8 + 4) & 63;

		if (k >= n || off > sizeof(o->b) - 4)
			break;
		edge = (__u32)o->b[off] << 24 | (__u32)o->b[off + 1] << 16 |
		       (__u32)o->b[off + 2] << 8 | o->b[off + 3];
		if (after(edge, p->sack))
			p->sack = edge;
	}
	return 0;
}

/* ct_tcp_options reads the len bytes of TCP options at offset off of the packet into p: a SYN's
 * window scale and SACK permission, any segment's SACK blocks (p->sack). first is the options'
 * first word: the usual options of an established segment (NOP, NOP, timestamp) need no parse.
 * A global function: verified once, whatever the path that reaches it (checking those options
 * inline costs the main program ~200k verifier steps). Malformed options end the parse, as in
 * nf. */
__attribute__((noinline)) int ct_tcp_options(CT_CTX *ctx, __u32 off, __u32 len, __u32 first,
					     struct pkt *p)
{
	struct tcp_opts *o;
	__u32 i_off = 0, zero = 0;

	if (!ctx || !p || len == 0 || len > sizeof(o->b) || off > 0xffff)
		return 0;
	if (!p->tcp_syn && len == 12 && first == bpf_htonl(0x0101080a))
		return 0; /* NOP, NOP, timestamp: most established segments */
	o = bpf_map_lookup_elem(&ct_opts_scratch, &zero);
	if (!o)
		return 0;
	asm volatile("" : "+r"(len)); /* keep the checked copy for the verifier */
	if (len < 1 || len > sizeof(o->b))
		return 0;
	if (ct_load_bytes(ctx, off, o->b, len) < 0)
		return 0;
	/* Bounded by i_off, which grows every round: states with the same i_off prune. */
	while (i_off < len && i_off < sizeof(o->b) - 1) {
		__u8 kind = o->b[i_off], olen;

		if (kind == 0)
			return 0;
		if (kind == 1) {
			i_off++;
			continue;
		}
		olen = o->b[i_off + 1];
		if (olen < 2 || i_off + olen > len)
			return 0;
		if (kind == 3 && olen == 3) {
			__u8 ws;

			if (i_off + 2 >= sizeof(o->b))
				return 0;
			ws = o->b[i_off + 2];
			p->has_wscale = 1;
			p->wscale = ws > 14 ? 14 : ws;
		} else if (kind == 4 && olen == 2) {
			p->sack_perm = 1;
		} else if (kind == 5 && olen >= 10 && (olen - 2) % 8 == 0) {
			ct_sack_blocks(o, i_off + 2, (olen - 2) / 8, p);
		}
		i_off += olen;
	}
	return 0;
}

/* tcp_options fills p from th's options (see ct_tcp_options). */
static __always_inline void tcp_options(CT_CTX *ctx, struct hdr_cursor *c, struct pkt *p,
					struct tcphdr *th)
{
	__be32 *first = (void *)(th + 1);
	__u32 word = 0;

	p->sack = p->ack;
	if (th->doff == 5)
		return; /* no options: spare the call */
	p->has_opts = 1;
	if ((void *)(first + 1) <= c->end)
		word = *first;
	ct_tcp_options(ctx, (void *)first - (void *)(long)ctx->data, th->doff * 4 - sizeof(*th),
		       word, p);
}

/* tcp_init_sender is nf's: the sender's window state from its SYN (or SYN-ACK). Options, if the
 * segment has any, replace its scale and its flags but BE_LIBERAL (nf's tcp_options); a segment
 * without options leaves both. Scaling needs both sides' option: checked on the reply's SYN. */
static __always_inline void tcp_init_sender(struct ct_tcp_dir *s, struct ct_tcp_dir *r,
					    struct pkt *p, __u32 dir)
{
	s->td_end = p->end;
	s->td_maxend = p->end;
	s->td_maxwin = p->win ? p->win : 1;
	if (p->has_opts) {
		s->td_scale = p->has_wscale ? p->wscale : 0;
		s->flags = (s->flags & CT_TCP_F_BE_LIBERAL) |
			   (p->has_wscale ? CT_TCP_F_WSCALE : 0) |
			   (p->sack_perm ? CT_TCP_F_SACK_PERM : 0);
	}
	if (dir == 1 && !((s->flags & CT_TCP_F_WSCALE) && (r->flags & CT_TCP_F_WSCALE))) {
		s->td_scale = 0;
		r->td_scale = 0;
	}
}

/* Results of tcp_in_window, as nf's enum nf_ct_tcp_action. */
enum win_result {
	WIN_ACCEPT,
	WIN_IGNORE,  /* pass, change nothing */
	WIN_INVALID, /* refuse */
};

/* tcp_in_window is nf's (Linux 6.x) tcp_in_window without SACK blocks: checks (I)-(IV) of van
 * Rooij and updates both directions' state. */
static __always_inline int tcp_in_window(struct ct_entry *e, struct pkt *p, __u32 dir, __u32 state,
					 __u32 liberal)
{
	struct ct_tcp_dir *sender = &e->tcp[dir & 1];
	struct ct_tcp_dir *receiver = &e->tcp[(dir ^ 1) & 1];
	__u32 seq = p->seq, ack = p->ack, end = p->end, win = p->win, sack;
	__u32 maxack;
	int be_liberal;

	/* nf reads SACK blocks only towards a receiver that permitted them. */
	sack = (receiver->flags & CT_TCP_F_SACK_PERM) ? p->sack : ack;
	if (sender->td_maxwin == 0) {
		/* First packet of this direction. */
		if (p->tcp_syn) {
			tcp_init_sender(sender, receiver, p, dir);
			if (!p->tcp_ack)
				return WIN_ACCEPT; /* simultaneous open */
		} else {
			/* Mid-connection pickup: the receiver starts at what this packet acks. */
			__u32 swin = win << sender->td_scale;

			sender->td_end = end;
			sender->td_maxwin = swin ? swin : 1;
			sender->td_maxend = end + sender->td_maxwin;
			if (receiver->td_maxwin == 0)
				receiver->td_end = receiver->td_maxend = sack;
			else if (sack == receiver->td_end + 1)
				receiver->td_end++; /* likely a reply to a keepalive */
		}
	} else if (p->tcp_syn && after(end, sender->td_end) &&
		   (state == CT_TCP_SYN_SENT || state == CT_TCP_SYN_RECV)) {
		/* A reinitialised connection (new ISN on a retransmitted SYN or SYN-ACK); only a
		 * SYN carries the window scale, so nothing else may reinitialise the sender (nf).
		 */
		tcp_init_sender(sender, receiver, p, dir);
		if (dir == 1 && !p->tcp_ack)
			return WIN_ACCEPT;
	}

	if (!p->tcp_ack)
		ack = sack = receiver->td_end;
	else if (ack == 0 && p->tcp_rst)
		ack = sack = receiver->td_end; /* broken stacks send RST with ACK 0 */
	if (p->tcp_rst && seq == 0 && state == CT_TCP_SYN_SENT)
		seq = end = sender->td_end; /* RST answering a SYN */

	maxack = sender->td_maxwin > MAXACKWINCONST ? sender->td_maxwin : MAXACKWINCONST;
	be_liberal = liberal || (sender->flags & CT_TCP_F_BE_LIBERAL);
	if (!before(seq, sender->td_maxend + 1)) {
		/* (I) fails. nf accepts a sender overshooting the window by at most what the
		 * receiver can take (and moves td_end) if everything else is right. */
		__u32 overshot = end - sender->td_maxend + 1;

		if (receiver->td_maxwin && after(end, sender->td_end - receiver->td_maxwin - 1) &&
		    after(sack, receiver->td_end - maxack - 1) && overshot <= receiver->td_maxwin &&
		    before(sack, receiver->td_end + 1)) {
			seq_max(&sender->td_end, end);
			return be_liberal ? WIN_ACCEPT
					  : WIN_IGNORE; /* passed, nothing else updated */
		}
		return be_liberal ? WIN_ACCEPT : WIN_INVALID;
	}
	if (!before(sack, receiver->td_end + 1)) /* (III): acks data not seen yet */
		return be_liberal ? WIN_ACCEPT : WIN_INVALID;
	/* (II) and (IV) fail for old retransmissions and delayed ACKs: nf ignores those (passes
	 * them without touching the state) instead of calling them invalid. */
	if ((receiver->td_maxwin && !after(end, sender->td_end - receiver->td_maxwin - 1)) ||
	    !after(sack, receiver->td_end - maxack - 1))
		return be_liberal ? WIN_ACCEPT : WIN_IGNORE;

	if (!p->tcp_syn)
		win <<= sender->td_scale;
	num_max(&sender->td_maxwin, win + (sack - ack));
	seq_max(&sender->td_end, end);
	if (p->tcp_ack) {
		if (!(sender->flags & CT_TCP_F_MAXACK_SET)) {
			sender->td_maxack = ack;
			sender->flags |= CT_TCP_F_MAXACK_SET;
		} else {
			seq_max(&sender->td_maxack, ack);
		}
	}
	if (receiver->td_maxwin != 0 && after(end, sender->td_maxend))
		__sync_fetch_and_add(&receiver->td_maxwin, end - sender->td_maxend);
	seq_max(&receiver->td_maxend, sack + (win ? win : 1));
	/* nf's retransmission bookkeeping keeps a plain ACK's end (a RST may answer it). */
	if (p->tcp_index == TCP_ACK_SET && e->last_end != end)
		e->last_end = end;
	return WIN_ACCEPT;
}

/* tcp_resync takes the remembered SYN as the start of its sender's direction and resets the
 * other direction (nf's re-sync from last_end/last_win/last_wscale/last_flags). */
static __always_inline void tcp_resync(struct ct_entry *e, __u32 dir)
{
	struct ct_tcp_dir *s = &e->tcp[e->last_dir & 1];
	struct ct_tcp_dir *r = &e->tcp[dir & 1];

	s->td_end = e->last_end;
	s->td_maxend = e->last_end;
	s->td_maxwin = e->last_win ? e->last_win : 1;
	s->td_scale = e->last_wscale;
	s->flags = e->last_flags;
	r->td_end = 0;
	r->td_maxend = 0;
	r->td_maxwin = 0;
	r->td_maxack = 0;
	r->td_scale = 0;
	r->flags &= CT_TCP_F_BE_LIBERAL;
}

#define LAST(index) ((index) + 1) /* ct_entry.last_index of a flag class */

/* ct_tcp_update moves the connection through nf's state table. Returns 0 to allow, a CT_STAT_INV_*
 * reason to refuse, -2 to pass untouched (nf's NFCT_TCP_IGNORE), or -1 when the entry goes: a
 * SYN reopens a closed connection (the caller deletes the entry and starts a new one), or a RST
 * ends a connection that never had a reply (the caller deletes it and passes the RST). */
__attribute__((noinline)) int ct_tcp_update(struct ct_entry *e, struct pkt *p, __u32 dir,
					    __u32 liberal, __u32 *state_out)
{
	__u32 cur, old, idx, newst;

	/* A global function: the verifier checks it once, not once per caller's path. */
	if (!e || !p || !state_out)
		return CT_STAT_INV_TCP_STATE;
	cur = old = *(volatile __u32 *)&e->state;

	if (old >= 10)
		return CT_STAT_INV_TCP_STATE;
	idx = (dir & 1) * 60 + p->tcp_index * 10 + old;
	if (idx >= 120)
		return CT_STAT_INV_TCP_STATE;
	newst = ((const __u8 *)tcp_conntracks)[idx];

	switch (newst) {
	case CT_TCP_SYN_SENT:
		if (old >= CT_TCP_TIME_WAIT)
			return -1; /* RFC 1122: SYN reopens TIME_WAIT / CLOSE */
		break;
	case CT_TCP_IGNORE:
		if (p->tcp_index == TCP_SYNACK_SET && e->last_index == LAST(TCP_SYN_SET) &&
		    e->last_dir != dir && p->ack == e->last_end) {
			/* This SYN-ACK answers the SYN we let through: the endpoints are in sync,
			 * we are not. Take the SYN's side from what we remembered, start the
			 * SYN-ACK's side afresh, and go on as SYN_SENT → SYN_RECV (nf). */
			tcp_resync(e, dir);
			old = CT_TCP_SYN_SENT;
			newst = CT_TCP_SYN_RECV;
			break;
		}
		/* nf remembers every ignored packet; of a SYN also the options. */
		e->last_index = LAST(p->tcp_index);
		e->last_dir = dir;
		e->last_end = p->end;
		e->last_win = p->win;
		if (p->tcp_index == TCP_SYN_SET && dir == 0) {
			e->last_wscale = p->has_wscale ? p->wscale : 0;
			e->last_flags = (p->has_wscale ? CT_TCP_F_WSCALE : 0) |
					(p->sack_perm ? CT_TCP_F_SACK_PERM : 0);
		}
		*state_out = old;
		return 0;
	case CT_TCP_MAX:
		return CT_STAT_INV_TCP_STATE;
	case CT_TCP_SYN_RECV:
		/* The SYN-ACK must acknowledge the SYN. */
		if (p->tcp_index == TCP_SYNACK_SET && dir == 1 && p->ack != e->tcp[0].td_end)
			return CT_STAT_INV_SYNACK;
		break;
	case CT_TCP_CLOSE:
		if (p->tcp_index != TCP_RST_SET)
			break;
		/* Closing already: the tuple may be reused, the sequence state is stale (nf). */
		if (old >= CT_TCP_FIN_WAIT && old <= CT_TCP_CLOSE)
			goto in_window;
		/* td_maxack is stale if a SYN passed last. */
		if ((e->tcp[(dir ^ 1) & 1].flags & CT_TCP_F_MAXACK_SET) &&
		    e->last_index != LAST(TCP_SYN_SET)) {
			__u32 maxack = e->tcp[(dir ^ 1) & 1].td_maxack;
			int est = old == CT_TCP_ESTABLISHED && (e->status & CT_F_ASSURED);

			if (p->seq == 0 && !est)
				break; /* likely answering a SYN we let through */
			if (before(p->seq, maxack))
				return CT_STAT_INV_RST;
			if (!est || p->seq == maxack)
				break;
			/* A RST right after this side's last ACK, at its end (a RST train). */
			if (e->last_index == LAST(TCP_ACK_SET) && e->last_dir == dir &&
			    p->seq == e->last_end)
				break;
			newst = old; /* in-window but inexact: keep, allow a challenge ACK */
		}
		/* A RST answering a SYN (after a reply) or an ACK (before the connection was
		 * assured) that we let through: close, without a window check, for it may
		 * acknowledge what the window never saw (nf). */
		if ((((e->status & CT_F_SEEN_REPLY) && e->last_index == LAST(TCP_SYN_SET)) ||
		     (!(e->status & CT_F_ASSURED) && e->last_index == LAST(TCP_ACK_SET))) &&
		    p->ack == e->last_end)
			goto in_window;
		break;
	}

	switch (tcp_in_window(e, p, dir, old, liberal)) {
	case WIN_INVALID:
		/* nf_tcp_handle_invalid's memory of an out-of-window FIN or RST (its timeout
		 * shortening is not done here). */
		if ((e->status & CT_F_ASSURED) &&
		    (p->tcp_index == TCP_RST_SET || p->tcp_index == TCP_FIN_SET) &&
		    !(e->last_dir != dir &&
		      (e->last_index == LAST(TCP_RST_SET) || e->last_index == LAST(TCP_FIN_SET)))) {
			e->last_index = LAST(p->tcp_index);
			e->last_dir = dir;
		}
		return p->tcp_rst ? CT_STAT_INV_RST : CT_STAT_INV_WINDOW;
	case WIN_IGNORE:
		*state_out = old;
		return -2;
	}
in_window:
	/* nf's last_index: the flag class of the last packet passed. */
	if (e->last_index != LAST(p->tcp_index))
		e->last_index = LAST(p->tcp_index);
	if (e->last_dir != dir)
		e->last_dir = dir;
	if (newst != cur && __sync_val_compare_and_swap(&e->state, cur, newst) != cur)
		newst = *(volatile __u32 *)&e->state; /* another CPU moved it: its result stands */
	*state_out = newst;
	/* If the only reply is a RST, the connection never was: nf deletes it at once. */
	if (p->tcp_rst && !(e->status & CT_F_SEEN_REPLY))
		return -1;
	return 0;
}

/* ---- policy ---- */

static __always_inline int policy_allows(struct pkt *p, __u32 role, const __u32 *dst, __u16 dport)
{
	struct ct_port_key pk = {.port = dport, .proto = p->key.proto};
	struct ct_lpm_key lk = {};

	if (role != CT_ROLE_OUTSIDE)
		return 1;
	if (bpf_map_lookup_elem(&ct_allow_port, &pk))
		return 1;
	if (p->key.family == 4) {
		lk.prefixlen = 96 + 32;
		lk.addr[10] = 0xff;
		lk.addr[11] = 0xff;
		__builtin_memcpy(&lk.addr[12], dst, 4);
	} else {
		lk.prefixlen = 128;
		__builtin_memcpy(lk.addr, dst, 16);
	}
	return bpf_map_lookup_elem(&ct_allow_net, &lk) != NULL;
}

/* ---- the tracker ---- */

static __always_inline __u32 entry_timeout_slot(__u8 proto, __u32 state, __u32 status)
{
	if (proto == IPPROTO_TCP)
		return state;
	if (proto == IPPROTO_UDP)
		return (status & CT_F_SEEN_REPLY) ? CT_TO_UDP_STREAM : CT_TO_UDP_UNREPLIED;
	return CT_TO_ICMP;
}

/* destroy deletes key's entry e from map and reports it on ct_events; of several CPUs deleting
 * one entry, only the one whose delete succeeds reports it. Returns 1 if this call removed it. */
static __always_inline int destroy(void *map, struct ct_key *key, struct ct_entry *e)
{
	__u32 status = e->status, state = e->state; /* e may be reused once deleted */

	if (bpf_map_delete_elem(map, key))
		return 0;
	emit(key, CT_EVENT_DESTROY, status, state);
	return 1;
}

/* lookup finds the live entry of key in the confirmed table, then the unconfirmed one. An
 * expired entry is removed and never returned. main is the confirmed table's entry for key if
 * the caller already looked it up (looked != 0), so the hot path hashes the key once. */
static __always_inline struct ct_entry *lookup(struct ct_key *key, __u64 now, int *confirmed,
					       struct ct_entry *main, int looked)
{
	struct ct_entry *e = looked ? main : bpf_map_lookup_elem(&ct_main, key);

	*confirmed = 1;
	if (e) {
		if (e->expires > now)
			return e;
		if (destroy(&ct_main, key, e))
			fp_count(&ct_stats, CT_STAT_EXPIRED);
		return NULL;
	}
	*confirmed = 0;
	e = bpf_map_lookup_elem(&ct_emb, key);
	if (e) {
		if (e->expires > now)
			return e;
		if (destroy(&ct_emb, key, e))
			fp_count(&ct_stats, CT_STAT_EXPIRED);
	}
	return NULL;
}

/* ct_create opens a connection for a packet allowed to, with the connection's first timeout in
 * ns. A global function: the new entry is built in its own stack frame. */
__attribute__((noinline)) int ct_create(struct pkt *p, __u64 now, __u64 timeouts, __u32 ifindex)
{
	__u32 state = 0, zero = 0;
	struct ct_entry *np;

	np = bpf_map_lookup_elem(&ct_scratch, &zero);
	if (!p || !np)
		return V_ALLOW; /* fail open */
	__builtin_memset(np, 0, sizeof(*np));
#define n (*np)
	n.created = now;
	n.status = p->fwd ? CT_F_ORIG_LO : 0;
	n.packets[0] = 1;
	n.bytes[0] = p->l3len;
	n.ifindex[0] = ifindex;
	if (p->key.proto == IPPROTO_TCP && p->tcp_index == TCP_SYN_SET) {
		state = CT_TCP_SYN_SENT;
		n.state = state;
		tcp_init_sender(&n.tcp[0], &n.tcp[1], p, 0);
	} else if (p->key.proto == IPPROTO_TCP) {
		/* Pickup of a connection already established (nf_conntrack_tcp_loose): its window
		 * scale and SACK permission are unknown, so nf assumes SACK and checks neither
		 * direction's window. */
		state = CT_TCP_ESTABLISHED;
		n.state = state;
		n.tcp[0].td_end = p->end;
		n.tcp[0].td_maxwin = p->win ? p->win : 1;
		n.tcp[0].td_maxend = p->end + n.tcp[0].td_maxwin;
		n.tcp[0].flags = CT_TCP_F_SACK_PERM | CT_TCP_F_BE_LIBERAL;
		n.tcp[1].flags = CT_TCP_F_SACK_PERM | CT_TCP_F_BE_LIBERAL;
	}
	if (p->key.proto == IPPROTO_TCP)
		n.last_index = LAST(p->tcp_index); /* its first packet passed (last_dir 0) */
	/* timeouts: the SYN_SENT timeout in the low half, the pickup's (or UDP / ICMP) in the
	 * high half, in seconds. */
	n.expires = now + (__u64)(state == CT_TCP_SYN_SENT ? (__u32)timeouts : timeouts >> 32) *
			      NSEC_PER_SEC;
	if (bpf_map_update_elem(&ct_emb, &p->key, np, BPF_NOEXIST) == 0) {
		fp_count(&ct_stats, CT_STAT_NEW);
		emit(&p->key, CT_EVENT_NEW, n.status, state);
	}
#undef n
	/* else another CPU created it a moment ago: this packet is its retransmission */
	return V_ALLOW;
}

/* confirm moves an entry that has seen its first valid reply into the confirmed table. */
static __always_inline int confirm(struct pkt *p, struct ct_entry *e)
{
	long err;

	err = bpf_map_update_elem(&ct_main, &p->key, e, BPF_NOEXIST); /* copies e */
	if (err == 0 || err == -17 /* EEXIST: another CPU confirmed it */) {
		bpf_map_delete_elem(&ct_emb, &p->key);
		if (err == 0)
			fp_count(&ct_stats, CT_STAT_ESTABLISHED);
		return V_ALLOW;
	}
	fp_count(&ct_stats, CT_STAT_TABLE_FULL);
	return V_DROP;
}

/* ct_ipv6_skip_ext skips the extension headers of the IPv6 packet quoted by an ICMPv6 error,
 * starting with header type next at offset off. Returns the upper-layer offset << 8 | protocol,
 * or -1 for a fragment other than the first (it has no ports to match), too many headers or a
 * truncated one. A global function, so the rare error path costs the main program no verifier
 * states. */
__attribute__((noinline)) int ct_ipv6_skip_ext(CT_CTX *ctx, __u32 off, __u32 next)
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

/* related handles an ICMP(v6) error: allowed only if the header it quotes belongs to a tracked
 * connection. c points after the 8-byte ICMP header; p's key is rebuilt for the quoted packet
 * (the error itself has no key of its own). */
static __always_inline int related_at(CT_CTX *ctx, struct hdr_cursor *c, struct pkt *inner,
				      __u8 family, __u64 now)
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
	if ((void *)(l4 + 8) > c->end)
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

/* track decides one forwarded packet; c points at the transport header. If looked, route_lookup
 * has built p->key and looked it up in ct_main (main, NULL if absent). */
static __always_inline int track(CT_CTX *ctx, struct hdr_cursor *c, struct pkt *p, __u8 family,
				 int l4proto, const __u32 *src, const __u32 *dst, __u32 l4off,
				 __u64 now, struct ct_entry *main, int looked)
{
	struct ct_config *cfg;
	struct ct_entry *e;
	__u32 zero = 0, *role, ifindex = CT_INGRESS(ctx);
	__u16 sport = 0, dport = 0;
	__u64 expires;
	__u32 dir, state = 0;
	int confirmed, reason;

	cfg = bpf_map_lookup_elem(&ct_settings, &zero);
	if (l4proto == IPPROTO_TCP) {
		struct tcphdr *th = c->pos;
		__s32 plen;
		__u8 flags;

		if ((void *)(th + 1) > c->end || th->doff < 5 || c->pos + th->doff * 4 > c->end) {
			fp_count(&ct_stats, CT_STAT_INV_MALFORMED);
			return V_DROP;
		}
		plen = (__s32)p->l3len - (__s32)l4off - (__s32)(th->doff * 4);
		if (plen < 0) {
			fp_count(&ct_stats, CT_STAT_INV_MALFORMED);
			return V_DROP;
		}
		/* nf's tcp_valid_flags: FIN, SYN, RST, ACK, URG combinations a TCP may send. */
		flags =
		    ((__u8 *)th)[13] & (TCP_F_FIN | TCP_F_SYN | TCP_F_RST | TCP_F_ACK | TCP_F_URG);
		if (!((TCP_VALID_FLAGS >> flags) & 1)) {
			fp_count(&ct_stats, CT_STAT_INV_MALFORMED);
			return V_DROP;
		}
		sport = th->source;
		dport = th->dest;
		p->seq = bpf_ntohl(th->seq);
		p->ack = bpf_ntohl(th->ack_seq);
		p->win = bpf_ntohs(th->window);
		p->tcp_syn = th->syn;
		p->tcp_ack = th->ack;
		p->tcp_rst = th->rst;
		p->end = p->seq + plen + th->syn + th->fin;
		p->tcp_index = tcp_flag_index(th);
		tcp_options(ctx, c, p, th);
		p->new_ok = p->tcp_index == TCP_SYN_SET ||
			    (p->tcp_index == TCP_ACK_SET && cfg && cfg->loose);
	} else if (l4proto == IPPROTO_UDP) {
		struct udphdr *uh = c->pos;

		if ((void *)(uh + 1) > c->end) {
			fp_count(&ct_stats, CT_STAT_INV_MALFORMED);
			return V_DROP;
		}
		if (bpf_ntohs(uh->len) < sizeof(*uh) || bpf_ntohs(uh->len) > p->l3len - l4off) {
			fp_count(&ct_stats, CT_STAT_INV_MALFORMED); /* as nf's udp_error */
			return V_DROP;
		}
		sport = uh->source;
		dport = uh->dest;
		p->new_ok = 1;
	} else {
		/* ICMP / ICMPv6: echo by identifier, errors by what they quote. */
		__u8 *ih = c->pos;
		__u8 type;

		if ((void *)(ih + 8) > c->end) {
			fp_count(&ct_stats, CT_STAT_INV_MALFORMED);
			return V_DROP;
		}
		type = ih[0];
		if (family == 4 && (type == ICMP_ECHO || type == ICMP_ECHOREPLY)) {
			p->new_ok = type == ICMP_ECHO;
		} else if (family == 6 &&
			   (type == ICMPV6_ECHO_REQUEST || type == ICMPV6_ECHO_REPLY)) {
			p->new_ok = type == ICMPV6_ECHO_REQUEST;
		} else if ((family == 4 &&
			    (type == ICMP_DEST_UNREACH || type == ICMP_SOURCE_QUENCH ||
			     type == ICMP_REDIRECT || type == ICMP_TIME_EXCEEDED ||
			     type == ICMP_PARAMETERPROB)) ||
			   (family == 6 && type >= 1 && type <= 4)) {
			c->pos = ih + 8;
			reason = related_at(ctx, c, p, family, now);
			if (reason) {
				fp_count(&ct_stats, reason);
				return V_DROP;
			}
			return V_ALLOW;
		} else {
			fp_count(&ct_stats, CT_STAT_INV_ICMP);
			return V_DROP;
		}
		sport = dport = *(__u16 *)(ih + 4);
	}
	if (!looked) /* the same ports route_lookup read, now validated */
		make_key(p, family, l4proto, src, dst, sport, dport);

	e = lookup(&p->key, now, &confirmed, main, looked);
	if (!e) {
	open:
		if (!p->new_ok) {
			fp_count(&ct_stats, CT_STAT_INV_NO_CONN);
			return V_DROP;
		}
		role = bpf_map_lookup_elem(&ct_ifaces, &ifindex);
		if (!policy_allows(p, role ? *role : CT_ROLE_NONE, dst,
				   l4proto == IPPROTO_TCP || l4proto == IPPROTO_UDP ? dport : 0)) {
			fp_count(&ct_stats, CT_STAT_POLICY_DROP);
			return V_DROP;
		}
		return ct_create(p, now,
				 (__u64)(cfg ? cfg->timeout[CT_TCP_SYN_SENT] : 120) |
				     (__u64)(cfg ? cfg->timeout[entry_timeout_slot(
						       l4proto, CT_TCP_ESTABLISHED, 0)]
						 : 30)
					 << 32,
				 ifindex);
	}

	dir = p->fwd == !!(e->status & CT_F_ORIG_LO) ? 0 : 1;
	if (l4proto == IPPROTO_TCP) {
		reason = ct_tcp_update(e, p, dir, cfg ? cfg->liberal : 0, &state);
		if (reason == -2) {
			fp_count(&ct_stats, CT_STAT_WINDOW_IGNORED);
			return V_ALLOW; /* nf's NFCT_TCP_IGNORE: passes, no refresh */
		}
		if (reason < 0) {
			destroy(confirmed ? (void *)&ct_main : (void *)&ct_emb, &p->key, e);
			/* A RST ended a connection that never had a reply. */
			if (p->tcp_rst)
				return V_ALLOW;
			goto open;
		}
		if (reason) {
			fp_count(&ct_stats, reason);
			return V_DROP;
		}
	}
	__sync_fetch_and_add(&e->packets[dir & 1], 1);
	__sync_fetch_and_add(&e->bytes[dir & 1], p->l3len);
	if (dir == 1 && !(e->status & CT_F_SEEN_REPLY)) {
		__sync_fetch_and_or(&e->status, CT_F_SEEN_REPLY);
		e->ifindex[1] = ifindex;
	}
	if (state == CT_TCP_ESTABLISHED && !(e->status & CT_F_ASSURED))
		__sync_fetch_and_or(&e->status, CT_F_ASSURED);
	expires = now + timeout_ns(cfg, entry_timeout_slot(l4proto, state, e->status));
	if (e->expires != expires) /* the clock ticks per jiffy: spare the store */
		e->expires = expires;
	if (!confirmed && (e->status & CT_F_SEEN_REPLY))
		return confirm(p, e);
	return V_ALLOW;
}

/* route_lookup is bpf_fib_lookup with a per-connection cache: a confirmed TCP or UDP connection
 * reuses, for a second, the result of its last lookup in the same direction from the same
 * ingress for a packet at least as long (the MTU check). mtulen is the L3 length the route's
 * MTU applies to: the packet's, or one segment's of a GSO skb. It fills fib and returns the
 * lookup's result. c points at the transport header. For TCP and UDP it builds p->key, sets
 * *looked and leaves the key's ct_main entry (live or not, NULL if none) in *mainp for track. */
static __always_inline int route_lookup(CT_CTX *ctx, struct hdr_cursor *c, struct pkt *p,
					struct bpf_fib_lookup *fib, __u8 family, int l4proto,
					const __u32 *src, const __u32 *dst, __u32 mtulen, __u64 now,
					struct ct_entry **mainp, int *looked)
{
	struct ct_route *r = NULL;
	__u16 *ports = c->pos;
	struct ct_entry *e;
	int rc;

	if ((l4proto == IPPROTO_TCP || l4proto == IPPROTO_UDP) && (void *)(ports + 2) <= c->end) {
		make_key(p, family, l4proto, src, dst, ports[0], ports[1]);
		e = bpf_map_lookup_elem(&ct_main, &p->key);
		*mainp = e;
		*looked = 1;
		if (e && e->expires > now) {
			r = &e->route[(p->fwd == !!(e->status & CT_F_ORIG_LO) ? 0 : 1) & 1];
			if (r->checked && now - r->checked <= ROUTE_CACHE_NS &&
			    r->ingress == CT_INGRESS(ctx) && mtulen <= r->len_ok) {
				fib->ifindex = r->ifindex;
				__builtin_memcpy(fib->smac, r->smac, ETH_ALEN);
				__builtin_memcpy(fib->dmac, r->dmac, ETH_ALEN);
				return BPF_FIB_LKUP_RET_SUCCESS;
			}
		}
	}
	fib->l4_protocol = l4proto;
	fib->tot_len = mtulen; /* checked against the route's MTU, as ip_forward does */
	fib->ifindex = CT_INGRESS(ctx);
	rc = bpf_fib_lookup(ctx, fib, sizeof(*fib), 0);
	if (rc == BPF_FIB_LKUP_RET_SUCCESS && r) {
		/* Concurrent writers store the same lookup's result. */
		r->ifindex = fib->ifindex;
		r->ingress = CT_INGRESS(ctx);
		r->len_ok = mtulen;
		__builtin_memcpy(r->smac, fib->smac, ETH_ALEN);
		__builtin_memcpy(r->dmac, fib->dmac, ETH_ALEN);
		r->checked = now;
	}
	return rc;
}

/* ct_beyond: an L3 packet of l3len bytes at l3 would end past the packet. XDP's frame is all
 * in [data, data_end); an skb's may go on in pages, up to ctx->len. */
static __always_inline int ct_beyond(CT_CTX *ctx, void *l3, __u32 l3len, void *data, void *data_end)
{
#ifdef CT_HOOK_TC
	return (__u64)(l3 - data) + l3len > ctx->len;
#else
	return l3 + l3len > data_end;
#endif
}

#ifdef CT_HOOK_TC
/* ct_tc_seglen is the L3 length of one segment of a GSO skb (a GRO aggregate): its L3 and
 * transport headers and gso segment bytes, what the route's MTU applies to (the kernel's
 * skb_gso_validate_network_len); 0 if it cannot tell. l4at is the transport header's offset in
 * the skb, l4off its offset from the L3 header. A global function: its branches cost the main
 * program no verifier states. (gso is passed in: read here, the compiler may form a pointer
 * into the context, which the verifier refuses.) */
__attribute__((noinline)) int ct_tc_seglen(struct __sk_buff *ctx, __u32 l4at, __u32 l4off, int l4,
					   __u32 gso)
{
	__u8 doff;

	if (!ctx || l4off > 0xffff || gso > 0xffff)
		return 0;
	if (l4 == IPPROTO_UDP)
		return l4off + sizeof(struct udphdr) + gso;
	if (l4 != IPPROTO_TCP || bpf_skb_load_bytes(ctx, l4at + 12, &doff, 1) < 0)
		return 0;
	return l4off + (doff >> 4) * 4 + gso;
}
#endif

static __always_inline int pass(void)
{
	fp_count(&ct_stats, CT_STAT_PASSED);
	return CT_PASS;
}

#ifdef CT_HOOK_TC
/* ct_tc_headers returns how many bytes from the start of the skb the parse needs in its linear
 * part: up to the end of the transport header (for ICMP, of CT_TC_ICMP_PULL more, the quoted
 * packet), capped by len. It reads with bpf_skb_load_bytes, so it works on any skb; anything
 * it does not recognise asks for nothing (the parse then passes the packet to the kernel). A
 * global function: verified once, apart from the main program. */
__attribute__((noinline)) int ct_tc_headers(struct __sk_buff *ctx, __u32 len)
{
	__u32 off = sizeof(struct ethhdr), need;
	__be16 proto;
	__u8 b[2];
	int l4;

	if (!ctx || bpf_skb_load_bytes(ctx, 12, &proto, sizeof(proto)) < 0)
		return 0;
	for (int i = 0; i < FP_VLAN_MAX; i++) {
		if (proto != bpf_htons(ETH_P_8021Q) && proto != bpf_htons(ETH_P_8021AD))
			break;
		if (bpf_skb_load_bytes(ctx, off + 2, &proto, sizeof(proto)) < 0)
			return 0;
		off += sizeof(struct fp_vlan_hdr);
	}
	if (proto == bpf_htons(ETH_P_IP)) {
		if (bpf_skb_load_bytes(ctx, off, b, 1) < 0 ||
		    bpf_skb_load_bytes(ctx, off + 9, &b[1], 1) < 0)
			return 0;
		off += (b[0] & 0xf) * 4;
		l4 = b[1];
	} else if (proto == bpf_htons(ETH_P_IPV6)) {
		if (bpf_skb_load_bytes(ctx, off + 6, b, 1) < 0)
			return 0;
		l4 = ct_ipv6_skip_ext(ctx, off + sizeof(struct ipv6hdr), b[0]);
		if (l4 < 0)
			return off + sizeof(struct ipv6hdr); /* the parse looks at no more */
		off = (l4 >> 8) & 0xfff;
		l4 &= 0xff;
	} else {
		return 0;
	}
	need = off;
	if (l4 == IPPROTO_TCP) {
		if (bpf_skb_load_bytes(ctx, off + 12, b, 1) < 0)
			return len;
		need += (b[0] >> 4) * 4 < sizeof(struct tcphdr) ? sizeof(struct tcphdr)
								: (b[0] >> 4) * 4;
	} else if (l4 == IPPROTO_UDP) {
		need += sizeof(struct udphdr);
	} else if (l4 == IPPROTO_ICMP || l4 == IPPROTO_ICMPV6_) {
		need += 8 + CT_TC_ICMP_PULL;
	}
	return need < len ? need : len;
}
#endif

SEC(CT_SEC)
#ifdef CT_HOOK_TC
int conntrack_tc(CT_CTX *ctx)
#else
int conntrack_xdp(CT_CTX *ctx)
#endif
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct hdr_cursor c;
	struct bpf_fib_lookup fib = {};
	struct iphdr *iph = NULL;
	struct ipv6hdr *ip6 = NULL;
	struct ethhdr *eth;
	struct ct_entry *main = NULL;
	struct pkt p = {};
	__u32 src[4] = {}, dst[4] = {};
	__u64 now;
	__u32 l4off, mtulen;
	int eproto, l4, rc, looked = 0;
	__u8 family;

#ifdef CT_HOOK_TC
	/* A GRO aggregate (or any skb built from pages) may hold less than the headers in its
	 * linear part, the only part direct access reaches: pull them in first. */
	if (data_end - data < ctx->len) {
		int need = ct_tc_headers(ctx, ctx->len);

		if (need > data_end - data) {
			if (bpf_skb_pull_data(ctx, need) < 0)
				return pass();
			data = (void *)(long)ctx->data;
			data_end = (void *)(long)ctx->data_end;
		}
	}
	if (ctx->vlan_present)
		return pass(); /* the tag is out of band: the kernel's job */
#endif
	c.pos = data;
	c.end = data_end;
	eproto = parse_ethhdr(&c, &eth);
	if (eproto == bpf_htons(ETH_P_IP)) {
		void *l3 = c.pos;

		l4 = parse_iphdr(&c, &iph);
		if (l4 < 0 || ip_is_fragment(iph) || iph->ttl <= 1)
			return pass();
		family = 4;
		p.l3len = bpf_ntohs(iph->tot_len);
		if (ct_beyond(ctx, l3, p.l3len, data, data_end) || p.l3len < c.pos - l3)
			return pass(); /* length beyond the frame: the kernel drops it */
		src[0] = iph->saddr;
		dst[0] = iph->daddr;
		fib.family = AF_INET;
		fib.tos = iph->tos;
		fib.ipv4_src = iph->saddr;
		fib.ipv4_dst = iph->daddr;
		l4off = c.pos - l3;
	} else if (eproto == bpf_htons(ETH_P_IPV6)) {
		void *l3 = c.pos;
		int frag;

		l4 = parse_ipv6hdr(&c, &ip6, &frag);
		if (l4 < 0 || frag || ip6->hop_limit <= 1)
			return pass();
		family = 6;
		p.l3len = bpf_ntohs(ip6->payload_len) + sizeof(*ip6);
		if (ct_beyond(ctx, l3, p.l3len, data, data_end) || p.l3len < c.pos - l3)
			return pass(); /* beyond the frame, or a jumbogram */
		__builtin_memcpy(src, &ip6->saddr, 16);
		__builtin_memcpy(dst, &ip6->daddr, 16);
		fib.family = AF_INET6;
		fib.flowinfo = *(__be32 *)ip6 & bpf_htonl(0x0FFFFFFF);
		__builtin_memcpy(fib.ipv6_src, src, 16);
		__builtin_memcpy(fib.ipv6_dst, dst, 16);
		l4off = c.pos - l3;
	} else {
		return pass(); /* ARP, unknown EtherTypes, malformed Ethernet */
	}
	if (l4 != IPPROTO_TCP && l4 != IPPROTO_UDP && !(family == 4 && l4 == IPPROTO_ICMP) &&
	    !(family == 6 && l4 == IPPROTO_ICMPV6_))
		return pass();
	if (l4off > 0xffff)
		return pass();

	mtulen = p.l3len;
#ifdef CT_HOOK_TC
	if (ctx->gso_size) {
		mtulen = ct_tc_seglen(ctx, c.pos - data, l4off, l4, ctx->gso_size);
		if (!mtulen)
			return pass();
	}
#endif
	now = ct_now();
	rc = route_lookup(ctx, &c, &p, &fib, family, l4, src, dst, mtulen, now, &main, &looked);
	if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH)
		return pass(); /* for this host, unroutable, too big, ...: the kernel's job */

	if (track(ctx, &c, &p, family, l4, src, dst, l4off, now, main, looked) != V_ALLOW &&
	    !track_only)
		return CT_DROP;

#ifdef CT_HOOK_TC
	/* Only to the attached interfaces (ct_ifaces holds exactly them). bpf_redirect records
	 * the target, acted on after return. */
	if (rc != BPF_FIB_LKUP_RET_SUCCESS || !bpf_map_lookup_elem(&ct_ifaces, &fib.ifindex))
		return pass(); /* the kernel resolves the neighbour or sends it elsewhere */
	bpf_redirect(fib.ifindex, 0);
#else
	/* bpf_redirect_map only records the target (acted on after return), so it doubles as the
	 * devmap membership check before the packet is modified. */
	if (rc != BPF_FIB_LKUP_RET_SUCCESS ||
	    bpf_redirect_map(&tx_ports, fib.ifindex, XDP_PASS) != XDP_REDIRECT)
		return pass(); /* the kernel resolves the neighbour or sends it elsewhere */
#endif
	if (iph)
		ip_decrease_ttl(iph);
	else if (ip6)
		ip6->hop_limit--;
	__builtin_memcpy(eth->h_dest, fib.dmac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, fib.smac, ETH_ALEN);
	fp_count(&ct_stats, CT_STAT_FORWARDED);
	return CT_REDIRECT;
}

/* ct_sweep_key removes key's entry from ct_main (table 0) or ct_emb if it has expired by now.
 * Returns 1 if it did. A global function: ct_sweep's unrolled loop calls it. */
__attribute__((noinline)) int ct_sweep_key(struct ct_key *key, __u32 table, __u64 now)
{
	void *map = table ? (void *)&ct_emb : (void *)&ct_main;
	struct ct_entry *e;

	if (!key)
		return 0;
	e = bpf_map_lookup_elem(map, key);
	if (!e || e->expires > now)
		return 0;
	return destroy(map, key, e);
}

/* ct_sweep removes the batch's keys whose entries have expired, with DESTROY events: user space
 * finds candidates in a dump, this decides with the data path's own clock and delete. With
 * flush set it removes them whatever their expiry (`flush`, which reports DESTROY as nf's
 * `conntrack -F` does) and counts nothing as swept. */
SEC("syscall")
int ct_sweep(struct ct_sweep_batch *b)
{
	__u32 count = b->count, table = b->table, flush = b->flush, removed = 0;
	__u64 now = flush ? ~0ULL : ct_now();
	struct ct_key key;

	/* Unrolled: a syscall program reads its context at constant offsets only. */
#pragma unroll
	for (int i = 0; i < CT_SWEEP_BATCH; i++) {
		if (i < count) {
			__builtin_memcpy(&key, &b->keys[i], sizeof(key));
			removed += ct_sweep_key(&key, table, now);
		}
	}
	b->removed = removed;
	if (!flush)
		fp_count_n(&ct_stats, CT_STAT_SWEPT, removed);
	return 0;
}

char _license[] SEC("license") = "Dual BSD/GPL";
