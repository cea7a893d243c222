/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* route.h: bpf_fib_lookup with a per-connection route cache. */
#ifndef FLOWPLANE_CT_ROUTE_H
#define FLOWPLANE_CT_ROUTE_H

#include "hook.h"
#include "maps.h"
#include "pkt.h"

#define ROUTE_CACHE_NS NSEC_PER_SEC /* how long a connection reuses its FIB result */

/* Where a forwarded packet goes: the egress and the MACs of its route. */
struct ct_fwd {
	__u32 ifindex;
	__u8 smac[6];
	__u8 dmac[6];
	__u8 pad[2];
};

/* Room for a struct bpf_fib_lookup (whose anonymous unions bpf2go cannot express). */
struct ct_fib_room {
	__u64 w[8];
};
_Static_assert(sizeof(struct ct_fib_room) == sizeof(struct bpf_fib_lookup), "fib room");

/* key = 0, value = struct ct_fib_room: per-CPU room for the lookup's parameters, off the stack
 * (the main program's stack is near the verifier's limit) */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct ct_fib_room);
	__uint(max_entries, 1);
} ct_fib_scratch SEC(".maps");

/* route_lookup is bpf_fib_lookup with a per-connection cache: a confirmed TCP or UDP connection
 * reuses, for a second, the result of its last lookup in the same direction from the same
 * ingress for a packet at least as long (the MTU check). mtulen is the L3 length the route's
 * MTU applies to: the packet's, or one segment's of a GSO skb; tosflow is the IPv4 TOS or the
 * IPv6 flow label word. It fills fwd and returns the lookup's result (a cached route:
 * BPF_FIB_LKUP_RET_SUCCESS, *cached set; on the caller's stack, where the verifier follows it). c
 * points at the transport header. For TCP and UDP it builds p->key, sets *looked and leaves the
 * key's ct_main entry (live or not, NULL if none) in *mainp for track. */
static __always_inline int route_lookup(CT_CTX *ctx, struct hdr_cursor *c, struct pkt *p,
					struct ct_fwd *fwd, __u8 family, int l4proto,
					const __u32 *src, const __u32 *dst, __be32 tosflow,
					__u32 mtulen, __u64 now, struct ct_entry **mainp,
					int *looked, int *cached)
{
	struct bpf_fib_lookup *fib;
	struct ct_route *r = NULL;
	__u16 *ports = c->pos;
	struct ct_entry *e;
	__u32 zero = 0;
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
				fwd->ifindex = r->ifindex;
				__builtin_memcpy(fwd->smac, r->smac, ETH_ALEN);
				__builtin_memcpy(fwd->dmac, r->dmac, ETH_ALEN);
				*cached = 1;
				return BPF_FIB_LKUP_RET_SUCCESS;
			}
		}
	}
	fib = (struct bpf_fib_lookup *)bpf_map_lookup_elem(&ct_fib_scratch, &zero);
	if (!fib)
		return BPF_FIB_LKUP_RET_NOT_FWDED; /* fail open: the kernel forwards it */
	__builtin_memset(fib, 0, sizeof(*fib));
	if (family == 4) {
		fib->family = AF_INET;
		fib->tos = tosflow;
		fib->ipv4_src = src[0];
		fib->ipv4_dst = dst[0];
	} else {
		fib->family = AF_INET6;
		fib->flowinfo = tosflow;
		__builtin_memcpy(fib->ipv6_src, src, 16);
		__builtin_memcpy(fib->ipv6_dst, dst, 16);
	}
	fib->l4_protocol = l4proto;
	fib->tot_len = mtulen; /* checked against the route's MTU, as ip_forward does */
	fib->ifindex = CT_INGRESS(ctx);
	rc = bpf_fib_lookup(ctx, fib, sizeof(*fib), 0);
	fwd->ifindex = fib->ifindex;
	__builtin_memcpy(fwd->smac, fib->smac, ETH_ALEN);
	__builtin_memcpy(fwd->dmac, fib->dmac, ETH_ALEN);
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

#endif
