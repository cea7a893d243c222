/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* table.h: an entry's life: lookup, creation, confirmation, expiry. */
#ifndef FLOWPLANE_CT_TABLE_H
#define FLOWPLANE_CT_TABLE_H

#include "maps.h"
#include "pkt.h"
#include "tcp.h"

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
static __always_inline int destroy(void *map, struct ct_key *key, struct ct_entry *e, int emb)
{
	__u32 status = e->status, state = e->state; /* e may be reused once deleted */

	if (bpf_map_delete_elem(map, key))
		return 0;
	if (emb)
		fp_count(&ct_stats, CT_STAT_EMB_REMOVED);
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
		if (destroy(&ct_main, key, e, 0))
			fp_count(&ct_stats, CT_STAT_EXPIRED);
		return NULL;
	}
	*confirmed = 0;
	e = bpf_map_lookup_elem(&ct_emb, key);
	if (e) {
		if (e->expires > now)
			return e;
		if (destroy(&ct_emb, key, e, 1))
			fp_count(&ct_stats, CT_STAT_EXPIRED);
	}
	return NULL;
}

/* ct_create opens a connection for a packet allowed to, with the connection's first timeout in
 * ns. A global function: the new entry is built in its own stack frame. */
__noinline int ct_create(struct pkt *p, __u64 now, __u64 timeouts, __u32 ifindex)
{
	__u32 state = 0, zero = 0;
	struct ct_entry *np;

	np = bpf_map_lookup_elem(&ct_scratch, &zero);
	if (!p || !np)
		return V_ALLOW; /* fail open */
	__builtin_memset(np, 0, sizeof(*np));
	np->created = now;
	np->status = p->fwd ? CT_F_ORIG_LO : 0;
	np->packets[0] = 1;
	np->bytes[0] = p->l3len;
	np->ifindex[0] = ifindex;
	if (p->key.proto == IPPROTO_TCP && p->tcp_index == TCP_SYN_SET) {
		state = CT_TCP_SYN_SENT;
		np->state = state;
		tcp_init_sender(&np->tcp[0], &np->tcp[1], p, 0);
	} else if (p->key.proto == IPPROTO_TCP) {
		/* Pickup of a connection already established (nf_conntrack_tcp_loose): its window
		 * scale and SACK permission are unknown, so nf assumes SACK and checks neither
		 * direction's window. */
		state = CT_TCP_ESTABLISHED;
		np->state = state;
		np->tcp[0].td_end = p->end;
		np->tcp[0].td_maxwin = p->win ? p->win : 1;
		np->tcp[0].td_maxend = p->end + np->tcp[0].td_maxwin;
		np->tcp[0].flags = CT_TCP_F_SACK_PERM | CT_TCP_F_BE_LIBERAL;
		np->tcp[1].flags = CT_TCP_F_SACK_PERM | CT_TCP_F_BE_LIBERAL;
	}
	if (p->key.proto == IPPROTO_TCP)
		np->last_index = LAST(p->tcp_index); /* its first packet passed (last_dir 0) */
	/* timeouts: the SYN_SENT timeout in the low half, the pickup's (or UDP / ICMP) in the
	 * high half, in seconds. */
	np->expires = now + (__u64)(state == CT_TCP_SYN_SENT ? (__u32)timeouts : timeouts >> 32) *
				NSEC_PER_SEC;
	if (bpf_map_update_elem(&ct_emb, &p->key, np, BPF_NOEXIST) == 0) {
		fp_count(&ct_stats, CT_STAT_NEW);
		emit(&p->key, CT_EVENT_NEW, np->status, state);
	}
	/* else another CPU created it a moment ago: this packet is its retransmission */
	return V_ALLOW;
}

/* confirm moves an entry that has seen its first valid reply into the confirmed table. */
static __always_inline int confirm(struct pkt *p, struct ct_entry *e)
{
	long err;

	err = bpf_map_update_elem(&ct_main, &p->key, e, BPF_NOEXIST); /* copies e */
	if (err == 0 || err == -EEXIST /* another CPU confirmed it */) {
		if (bpf_map_delete_elem(&ct_emb, &p->key) == 0)
			fp_count(&ct_stats, CT_STAT_EMB_REMOVED);
		if (err == 0)
			fp_count(&ct_stats, CT_STAT_ESTABLISHED);
		return V_ALLOW;
	}
	fp_count(&ct_stats, CT_STAT_TABLE_FULL);
	return V_DROP;
}

#endif
