/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* tcp.h: TCP state and window tracking, as nf_conntrack_proto_tcp.c. */
#ifndef FLOWPLANE_CT_TCP_H
#define FLOWPLANE_CT_TCP_H

#include "hook.h"
#include "maps.h"
#include "pkt.h"

#define MAXACKWINCONST 66000

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

/* A direction's flags change by atomic or / and on the 32-bit word they share with td_scale
 * (flags is its second byte, little endian), so concurrent updates of different bits keep
 * each other. */
static __always_inline void dir_flag_set(struct ct_tcp_dir *d, __u8 f)
{
	__sync_fetch_and_or((__u32 *)&d->td_scale, (__u32)f << 8);
}

static __always_inline void dir_flag_clear(struct ct_tcp_dir *d, __u8 f)
{
	__sync_fetch_and_and((__u32 *)&d->td_scale, ~((__u32)f << 8));
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
__noinline int ct_sack_blocks(struct tcp_opts *o, __u32 at, __u32 n, struct pkt *p)
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
__noinline int ct_tcp_options(CT_CTX *ctx, __u32 off, __u32 len, __u32 first, struct pkt *p)
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

/* tcp_in_window is nf's (Linux 6.x) tcp_in_window, SACK blocks included (p->sack): checks (I)-(IV)
 * of van Rooij and updates both directions' state. */
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
			/* nf sets td_end, even backwards, and marks the data unacknowledged */
			sender->td_end = end;
			dir_flag_set(sender, CT_TCP_F_DATA_UNACK);
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
	if (after(end, sender->td_end) && !(sender->flags & CT_TCP_F_DATA_UNACK))
		dir_flag_set(sender, CT_TCP_F_DATA_UNACK); /* nf: new data, not acknowledged yet */
	seq_max(&sender->td_end, end);
	if (p->tcp_ack) {
		if (!(sender->flags & CT_TCP_F_MAXACK_SET)) {
			sender->td_maxack = ack;
			dir_flag_set(sender, CT_TCP_F_MAXACK_SET);
		} else {
			seq_max(&sender->td_maxack, ack);
		}
	}
	if (receiver->td_maxwin != 0 && after(end, sender->td_maxend))
		__sync_fetch_and_add(&receiver->td_maxwin, end - sender->td_maxend);
	seq_max(&receiver->td_maxend, sack + (win ? win : 1));
	if (ack == receiver->td_end && (receiver->flags & CT_TCP_F_DATA_UNACK))
		dir_flag_clear(receiver,
			       CT_TCP_F_DATA_UNACK); /* all of the receiver's data acked */
	/* nf's retransmission check: the same ACK segment (dir, seq, ack, end, raw window) again
	 * counts a retransmission, anything else starts over; a RST may answer its end. */
	if (p->tcp_index == TCP_ACK_SET) {
		if (e->last_dir == dir && e->last_seq == seq && e->last_ack == ack &&
		    e->last_end == end && e->last_win == (__u16)p->win) {
			if (e->retrans < 255)
				e->retrans++;
		} else {
			e->last_dir = dir;
			e->last_seq = seq;
			e->last_ack = ack;
			e->last_end = end;
			e->last_win = p->win;
			e->retrans = 0;
		}
	}
	return WIN_ACCEPT;
}

#define LAST(index) ((index) + 1) /* ct_entry.last_index of a flag class */

/* tcp_established_ack is ct_tcp_update for its most common case, inline (a call and return
 * cost ~10 ns here): a plain ACK on an ESTABLISHED connection, which nf's state table leaves
 * ESTABLISHED in either direction, so only the window check and nf's last_* memory remain.
 * Same results as ct_tcp_update for that case. */
static __always_inline int tcp_established_ack(struct ct_entry *e, struct pkt *p, __u32 dir,
					       __u32 liberal)
{
	switch (tcp_in_window(e, p, dir, CT_TCP_ESTABLISHED, liberal)) {
	case WIN_INVALID:
		return CT_STAT_INV_WINDOW; /* nf_tcp_handle_invalid remembers only FIN and RST */
	case WIN_IGNORE:
		return -2;
	}
	if (e->last_index != LAST(TCP_ACK_SET))
		e->last_index = LAST(TCP_ACK_SET);
	if (e->last_dir != dir)
		e->last_dir = dir;
	return 0;
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
	e->last_flags &= ~CT_TCP_F_EXP_CHALLENGE_ACK; /* answered by a SYN-ACK, not challenged */
	s->flags = e->last_flags;
	r->td_end = 0;
	r->td_maxend = 0;
	r->td_maxwin = 0;
	r->td_maxack = 0;
	r->td_scale = 0;
	r->flags &= CT_TCP_F_BE_LIBERAL;
}

/* ct_tcp_update moves the connection through nf's state table. Returns 0 to allow, a CT_STAT_INV_*
 * reason to refuse, -2 to pass untouched (nf's NFCT_TCP_IGNORE), -3 to pass a packet the state
 * table ignores (nf's TCP_CONNTRACK_IGNORE: remembered in last_*, nothing refreshed) or an RFC 5961
 * challenge ACK in LAST_ACK (passed, the state kept, nothing refreshed), or -1 when
 * the entry goes: a SYN reopens a closed connection (the caller deletes the entry and starts a new
 * one), or a RST ends a connection that never had a reply (the caller deletes it and passes the
 * RST). */
__noinline int ct_tcp_update(struct ct_entry *e, struct pkt *p, __u32 dir, __u32 liberal,
			     __u32 *state_out)
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
		if (old < CT_TCP_TIME_WAIT)
			break;
		/* RFC 1122: a SYN reopens TIME_WAIT / CLOSE — under nf's condition: the connection
		 * was closed by a FIN (CLOSE_INIT, either side) or aborted by a RST from the SYN's
		 * side. Otherwise (e.g. the other side's RST) the SYN is ignored, as in nf. */
		if (((e->tcp[0].flags | e->tcp[1].flags) & CT_TCP_F_CLOSE_INIT) ||
		    (e->last_dir == dir && e->last_index == LAST(TCP_RST_SET)))
			return -1;
		__attribute__((fallthrough));
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
		e->last_seq = p->seq;
		e->last_win = p->win;
		if (p->tcp_index == TCP_SYN_SET && dir == 0) {
			e->last_wscale = p->has_wscale ? p->wscale : 0;
			e->last_flags = (p->has_wscale ? CT_TCP_F_WSCALE : 0) |
					(p->sack_perm ? CT_TCP_F_SACK_PERM : 0);
			/* RFC 5961: a peer in LAST_ACK answers a new SYN with a challenge ACK,
			 * which must not pass for the ACK of its FIN (see TIME_WAIT below). */
			if (old == CT_TCP_LAST_ACK)
				e->last_flags |= CT_TCP_F_EXP_CHALLENGE_ACK;
		}
		/* A reply ACK in SYN_SENT may be the challenge ACK of a peer that still holds the
		 * tuple's previous connection: remember what it acknowledges, where the client's
		 * RST will be (see CLOSE below). */
		if (old == CT_TCP_SYN_SENT && p->tcp_index == TCP_ACK_SET && dir == 1)
			e->last_ack = p->ack;
		*state_out = old;
		return -3; /* passed, remembered; no refresh, no accounting (nf returns early) */
	case CT_TCP_MAX:
		return CT_STAT_INV_TCP_STATE;
	case CT_TCP_TIME_WAIT:
		/* nf's RFC 5961 rule: in LAST_ACK, an ACK answering the SYN just ignored (flagged
		 * then) is a challenge ACK, not the ACK of the last FIN: it passes without
		 * changing the state or refreshing the entry, once. */
		if (old == CT_TCP_LAST_ACK && p->tcp_index == TCP_ACK_SET && e->last_dir != dir &&
		    e->last_index == LAST(TCP_SYN_SET) &&
		    (e->last_flags & CT_TCP_F_EXP_CHALLENGE_ACK)) {
			e->last_flags &= ~CT_TCP_F_EXP_CHALLENGE_ACK;
			*state_out = old;
			return -3;
		}
		break;
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
		/* A RST at what the reply's challenge ACK in SYN_SENT acknowledged (remembered
		 * above): the client resets the old connection the peer still holds (nf). */
		if (old == CT_TCP_SYN_SENT && e->last_index == LAST(TCP_ACK_SET) &&
		    e->last_dir == 1 && p->seq == e->last_ack)
			goto in_window;
		break;
	}

	switch (tcp_in_window(e, p, dir, old, liberal)) {
	case WIN_INVALID:
		/* nf_tcp_handle_invalid: an assured connection's out-of-window FIN or RST is
		 * remembered; one answering the other side's remembered FIN or RST has the caller
		 * shorten the timeout (the endpoints and we are out of sync: let it age out). */
		if ((e->status & CT_F_ASSURED) &&
		    (p->tcp_index == TCP_RST_SET || p->tcp_index == TCP_FIN_SET)) {
			if (e->last_dir != dir && (e->last_index == LAST(TCP_RST_SET) ||
						   e->last_index == LAST(TCP_FIN_SET))) {
				p->shorten = 1;
			} else {
				e->last_index = LAST(p->tcp_index);
				e->last_dir = dir;
			}
		}
		return p->tcp_rst ? CT_STAT_INV_RST : CT_STAT_INV_WINDOW;
	case WIN_IGNORE:
		*state_out = old;
		return -2;
	}
in_window:
	/* The state table cannot tell a simultaneous open's SYN_RECV from a three-way
	 * handshake's: SYN_SENT2 is remembered, and then the reply's ACK in SYN_RECV establishes
	 * the connection too (nf). nf does both before the window check, which depends on
	 * neither and always passes the reply's first SYN, the only way into SYN_SENT2. */
	if (newst == CT_TCP_SYN_SENT2)
		e->last_flags |= CT_TCP_F_SIMULTANEOUS_OPEN;
	else if (newst == CT_TCP_SYN_RECV && p->tcp_index == TCP_ACK_SET && dir == 1 &&
		 (e->last_flags & CT_TCP_F_SIMULTANEOUS_OPEN))
		newst = CT_TCP_ESTABLISHED;
	/* nf's last_index: the flag class of the last packet passed. */
	if (e->last_index != LAST(p->tcp_index))
		e->last_index = LAST(p->tcp_index);
	if (e->last_dir != dir)
		e->last_dir = dir;
	if (newst != cur && __sync_val_compare_and_swap(&e->state, cur, newst) != cur)
		newst = *(volatile __u32 *)&e->state; /* another CPU moved it: its result stands */
	else if (newst == CT_TCP_FIN_WAIT && cur != CT_TCP_FIN_WAIT)
		dir_flag_set(&e->tcp[dir & 1],
			     CT_TCP_F_CLOSE_INIT); /* this CPU made the move (nf) */
	*state_out = newst;
	/* If the only reply is a RST, the connection never was: nf deletes it at once. */
	if (p->tcp_rst && !(e->status & CT_F_SEEN_REPLY))
		return -1;
	return 0;
}

#endif
