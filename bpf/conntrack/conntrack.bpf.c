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
#include "hook.h"
#include "maps.h"
#include "pkt.h"
#include "tcp.h"
#include "table.h"
#include "icmp.h"
#include "route.h"

/* What the main program learns of one packet, kept off its stack (main's frame, ct_track's and
 * ct_tcp_update's must fit the verifier's 512 bytes together). */
struct ct_work {
	struct pkt p;
	struct track_in in;
	struct ct_fwd fwd;
};

/* key = 0, value = struct ct_work: per-CPU room for the packet being decided */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct ct_work);
	__uint(max_entries, 1);
} ct_work SEC(".maps");

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

/* ct_account counts a passed packet on its entry and refreshes the entry's timeout for the
 * connection's state (nf's nf_ct_refresh_acct); an ignored packet only marks the reply seen. */
static __always_inline void ct_account(struct ct_entry *e, struct pkt *p, __u32 dir, __u32 state,
				       int ignored, struct ct_config *cfg, __u64 now, __u32 ifindex,
				       int l4proto)
{
	/* nf's protocol handlers see the status from before the packet: the first reply is not
	 * yet a reply. UDP is a stream (udp_stream, assured) only from a packet after the reply
	 * more than 2 s after the first packet (nf's stream_ts). */
	__u32 replied = e->status & CT_F_SEEN_REPLY;
	__u32 stream = replied && now > e->created + 2 * NSEC_PER_SEC ? CT_F_SEEN_REPLY : 0;
	__u64 expires;

	if (!ignored) {
		__sync_fetch_and_add(&e->packets[dir & 1], 1);
		__sync_fetch_and_add(&e->bytes[dir & 1], p->l3len);
	}
	if (dir == 1 && !replied) {
		__sync_fetch_and_or(&e->status, CT_F_SEEN_REPLY);
		e->ifindex[1] = ifindex;
	}
	if (!ignored) {
		if ((state == CT_TCP_ESTABLISHED && replied) || (l4proto == IPPROTO_UDP && stream))
			if (!(e->status & CT_F_ASSURED))
				__sync_fetch_and_or(&e->status, CT_F_ASSURED);
		__u64 to = timeout_ns(cfg, entry_timeout_slot(l4proto, state, stream));

		/* nf: while either side has data the other has not acknowledged, the timeout is
		 * capped at tcp_timeout_unacknowledged (a peer gone mid-transfer ages out soon). */
		if (l4proto == IPPROTO_TCP) {
			__u64 re = timeout_ns(cfg, CT_TO_TCP_RETRANS),
			      un = timeout_ns(cfg, CT_TO_TCP_UNACK);

			/* nf's order: retransmissions, a RST (CLOSE's timeout, even one that left
			 * the state alone), unacknowledged data, a zero window (or none seen yet)
			 * in the last plain ACK segment. */
			if (e->retrans >= tcp_max_retrans && to > re)
				to = re;
			else if (p->tcp_rst)
				to = timeout_ns(cfg, CT_TCP_CLOSE);
			else if (((e->tcp[0].flags | e->tcp[1].flags) & CT_TCP_F_DATA_UNACK) &&
				 to > un)
				to = un;
			else if (e->last_win == 0 && to > re)
				to = re;
			/* nf: ESTABLISHED without a reply (a pickup) is capped too. */
			if (!replied && state == CT_TCP_ESTABLISHED && to > un)
				to = un;
		}
		expires = now + to;
		if (e->expires != expires) /* the clock ticks per jiffy: spare the store */
			e->expires = expires;
	}
}

/* est_fast is track for the most common packet, inline: an ACK segment (no options, or NOP NOP
 * timestamp) of a confirmed ESTABLISHED TCP connection whose route route_lookup found cached in
 * e, which nf's state table leaves ESTABLISHED in either direction, so that of ct_tcp_update
 * only the window check remains (tcp_established_ack). It spares a call and return (~10 ns on
 * this CPU) and track's general path. Returns -1 for anything else (track then decides from
 * scratch: nothing was changed), else the same verdict, counters and entry update as track. */
static __always_inline int est_fast(CT_CTX *ctx, struct hdr_cursor *c, struct pkt *p, __u32 l4off,
				    __u64 now, struct ct_entry *e)
{
	struct tcphdr *th = c->pos;
	struct ct_config *cfg;
	__u32 zero = 0, dir;
	__s32 plen;
	int reason;

	/* ACK without SYN, FIN or RST (PSH, URG, ECE, CWR aside): nf's ACK class, valid flags. */
	if ((void *)(th + 1) > c->end ||
	    (((__u8 *)th)[13] & (TCP_F_FIN | TCP_F_SYN | TCP_F_RST | TCP_F_ACK)) != TCP_F_ACK)
		return -1;
	if (th->doff != 5) {
		__be32 *first = (void *)(th + 1);

		if (th->doff != 8 || (void *)(first + 1) > c->end ||
		    *first != bpf_htonl(0x0101080a))
			return -1;
	}
	plen = (__s32)p->l3len - (__s32)l4off - (__s32)(th->doff * 4);
	if (plen < 0 || *(volatile __u32 *)&e->state != CT_TCP_ESTABLISHED)
		return -1;
	p->seq = bpf_ntohl(th->seq);
	p->ack = bpf_ntohl(th->ack_seq);
	p->win = bpf_ntohs(th->window);
	p->tcp_ack = 1;
	p->end = p->seq + plen;
	p->tcp_index = TCP_ACK_SET;
	p->sack = p->ack;
	p->has_opts = th->doff != 5;
	cfg = bpf_map_lookup_elem(&ct_settings, &zero);
	dir = p->fwd == !!(e->status & CT_F_ORIG_LO) ? 0 : 1;
	reason = tcp_established_ack(e, p, dir, cfg ? cfg->liberal : 0);
	if (reason == -2) {
		fp_count(&ct_stats, CT_STAT_WINDOW_IGNORED);
		return V_ALLOW;
	}
	if (reason) {
		fp_count(&ct_stats, CT_STAT_INV_WINDOW);
		return V_DROP;
	}
	ct_account(e, p, dir, CT_TCP_ESTABLISHED, 0, cfg, now, CT_INGRESS(ctx), IPPROTO_TCP);
	return V_ALLOW;
}

/* ct_track decides one forwarded packet, from scratch; in says where its transport header is.
 * If in->looked, route_lookup has built p->key and looked it up in ct_main (main, NULL if
 * absent). A global function: verified once, not once per path of the parse and the route
 * lookup before it (inline, it took the program to ~890k of the verifier's 1M instructions);
 * the most common packet never gets here (est_fast). */
__noinline int ct_track(CT_CTX *ctx, struct pkt *p, struct track_in *in, struct ct_entry *main)
{
	struct hdr_cursor cur, *c = &cur;
	struct ct_config *cfg;
	struct ct_entry *e;
	__u32 zero = 0, *role, ifindex, l4off;
	__u16 sport = 0, dport = 0;
	__u32 dir, state = 0, *src, *dst;
	int confirmed, reason, ignored = 0, l4proto, looked;
	__u64 now;
	__u8 family;

	/* l4at is at most CT_L4AT_MAX: the bound the verifier needs to compare the packet
	 * pointers built from it with the packet's end. */
	if (!ctx || !p || !in || in->l4at > CT_L4AT_MAX)
		return V_ALLOW; /* fail open; never happens */
	c->pos = (void *)(long)ctx->data + in->l4at;
	c->end = (void *)(long)ctx->data_end;
	ifindex = CT_INGRESS(ctx);
	l4off = in->l4off;
	family = in->family;
	l4proto = in->l4proto;
	src = in->src;
	dst = in->dst;
	now = in->now;
	looked = in->looked;
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
			reason = related_at(ctx, c, p, family, now, dst);
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
		return ct_create(
		    p, now,
		    (__u64)(cfg ? cfg->timeout[CT_TCP_SYN_SENT] : 120) |
			(__u64)(cfg ? cfg->timeout[l4proto == IPPROTO_TCP
						       ? CT_TO_TCP_UNACK /* pickup, as above */
						       : entry_timeout_slot(l4proto, 0, 0)]
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
		if (reason == -3) {
			/* nf's TCP_CONNTRACK_IGNORE: passes, and a reply marks the reply seen, but
			 * nothing is counted or refreshed (nf returns before nf_ct_refresh_acct).
			 */
			fp_count(&ct_stats, CT_STAT_TCP_IGNORED);
			ignored = 1;
		} else if (reason < 0) {
			destroy(confirmed ? (void *)&ct_main : (void *)&ct_emb, &p->key, e,
				!confirmed);
			/* A RST ended a connection that never had a reply. */
			if (p->tcp_rst)
				return V_ALLOW;
			goto open;
		}
		if (reason > 0) {
			/* nf: an out-of-window FIN/RST answering one from the other side lowers a
			 * timeout of 120 s or more to tcp_unacknowledged, if that is shorter. */
			if (p->shorten) {
				__u64 un = timeout_ns(cfg, CT_TO_TCP_UNACK), exp = e->expires;

				if (exp >= now + 120 * NSEC_PER_SEC && exp > now + un)
					e->expires = now + un;
			}
			fp_count(&ct_stats, reason);
			return V_DROP;
		}
	}
	ct_account(e, p, dir, state, ignored, cfg, now, ifindex, l4proto);
	if (!confirmed && (e->status & CT_F_SEEN_REPLY))
		return confirm(p, e);
	return V_ALLOW;
}

/* ct_for_us: the frame is addressed to the ingress interface (the kernel's PACKET_HOST), the
 * only frames the kernel forwards. TC has the skb's pkt_type; XDP compares the destination MAC
 * with the interface's (ct_ifmac; unchecked where user space did not set it). */
static __always_inline int ct_for_us(CT_CTX *ctx, struct ethhdr *eth)
{
#ifdef CT_HOOK_TC
	return ctx->pkt_type == 0; /* PACKET_HOST */
#else
	__u32 in = ctx->ingress_ifindex;
	struct ct_ifmac *m;

	if (!eth)
		return 1;
	m = bpf_map_lookup_elem(&ct_ifmac, &in);
	if (!m || !m->set)
		return 1;
	return *(__u32 *)eth->h_dest == *(__u32 *)m->mac &&
	       *(__u16 *)(eth->h_dest + 4) == *(__u16 *)(m->mac + 4);
#endif
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
__noinline int ct_tc_seglen(struct __sk_buff *ctx, __u32 l4at, __u32 l4off, int l4, __u32 gso)
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
__noinline int ct_tc_headers(struct __sk_buff *ctx, __u32 len)
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
	struct ct_fwd *fwd;
	__be32 tosflow = 0;
	struct iphdr *iph = NULL;
	struct ipv6hdr *ip6 = NULL;
	struct ethhdr *eth = NULL;
	struct ct_entry *main = NULL;
	struct ct_work *w;
	struct pkt *p;
	struct track_in *in;
	__u32 *src, *dst, zero = 0;
	__u64 now;
	__u32 l4off, mtulen;
	int eproto, l4, rc, verdict, looked = 0, cached = 0;
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
	w = bpf_map_lookup_elem(&ct_work, &zero);
	if (!w)
		return pass(); /* never happens */
	__builtin_memset(w, 0, sizeof(*w));
	p = &w->p;
	in = &w->in;
	fwd = &w->fwd;
	src = in->src;
	dst = in->dst;
	c.pos = data;
	c.end = data_end;
	eproto = parse_ethhdr(&c, &eth);
	if (!ct_for_us(ctx, eth))
		return pass(); /* as ip_rcv: the kernel drops frames for other hosts */
	if (eproto == bpf_htons(ETH_P_IP)) {
		void *l3 = c.pos;

		l4 = parse_iphdr(&c, &iph);
		if (l4 < 0 || ip_is_fragment(iph) || iph->ttl <= 1)
			return pass();
		family = 4;
		p->l3len = bpf_ntohs(iph->tot_len);
		if (ct_beyond(ctx, l3, p->l3len, data, data_end) || p->l3len < c.pos - l3)
			return pass(); /* length beyond the frame: the kernel drops it */
		src[0] = iph->saddr;
		dst[0] = iph->daddr;
		tosflow = iph->tos;
		l4off = c.pos - l3;
	} else if (eproto == bpf_htons(ETH_P_IPV6)) {
		void *l3 = c.pos;
		int frag;

		l4 = parse_ipv6hdr(&c, &ip6, &frag);
		if (l4 < 0 || frag || ip6->hop_limit <= 1)
			return pass();
		family = 6;
		p->l3len = bpf_ntohs(ip6->payload_len) + sizeof(*ip6);
		if (ct_beyond(ctx, l3, p->l3len, data, data_end) || p->l3len < c.pos - l3)
			return pass(); /* beyond the frame, or a jumbogram */
		__builtin_memcpy(src, &ip6->saddr, 16);
		__builtin_memcpy(dst, &ip6->daddr, 16);
		tosflow = *(__be32 *)ip6 & bpf_htonl(0x0FFFFFFF);
		l4off = c.pos - l3;
	} else {
		return pass(); /* ARP, unknown EtherTypes, malformed Ethernet */
	}
	if (l4 != IPPROTO_TCP && l4 != IPPROTO_UDP && !(family == 4 && l4 == IPPROTO_ICMP) &&
	    !(family == 6 && l4 == IPPROTO_ICMPV6_))
		return pass();
	if (l4off > 0xffff || c.pos - data > CT_L4AT_MAX)
		return pass();

	mtulen = p->l3len;
#ifdef CT_HOOK_TC
	if (ctx->gso_size) {
		mtulen = ct_tc_seglen(ctx, c.pos - data, l4off, l4, ctx->gso_size);
		if (!mtulen)
			return pass();
	}
#endif
	now = ct_now();
	rc = route_lookup(ctx, &c, p, fwd, family, l4, src, dst, tosflow, mtulen, now, &main,
			  &looked, &cached);
	if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH)
		return pass(); /* for this host, unroutable, too big, ...: the kernel's job */

	verdict = -1;
	if (cached && l4 == IPPROTO_TCP) /* then main is the live entry */
		verdict = est_fast(ctx, &c, p, l4off, now, main);
	if (verdict < 0) {
		in->l4at = c.pos - data;
		in->l4off = l4off;
		in->family = family;
		in->l4proto = l4;
		in->now = now;
		in->looked = looked;
		verdict = ct_track(ctx, p, in, main);
	}
	if (verdict != V_ALLOW && !track_only)
		return CT_DROP;

#ifdef CT_HOOK_TC
	/* Only to the attached interfaces (ct_ifaces holds exactly them). bpf_redirect records
	 * the target, acted on after return. */
	if (rc != BPF_FIB_LKUP_RET_SUCCESS || !bpf_map_lookup_elem(&ct_ifaces, &fwd->ifindex))
		return pass(); /* the kernel resolves the neighbour or sends it elsewhere */
	bpf_redirect(fwd->ifindex, 0);
#else
	/* bpf_redirect_map only records the target (acted on after return), so it doubles as the
	 * devmap membership check before the packet is modified. */
	if (rc != BPF_FIB_LKUP_RET_SUCCESS ||
	    bpf_redirect_map(&tx_ports, fwd->ifindex, XDP_PASS) != XDP_REDIRECT)
		return pass(); /* the kernel resolves the neighbour or sends it elsewhere */
#endif
	if (iph)
		ip_decrease_ttl(iph);
	else if (ip6)
		ip6->hop_limit--;
	__builtin_memcpy(eth->h_dest, fwd->dmac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, fwd->smac, ETH_ALEN);
	fp_count(&ct_stats, CT_STAT_FORWARDED);
	return CT_REDIRECT;
}

/* ct_sweep_key removes key's entry from ct_main (table 0) or ct_emb if it has expired by now.
 * Returns 1 if it did. A global function: ct_sweep's unrolled loop calls it. */
__noinline int ct_sweep_key(struct ct_key *key, __u32 table, __u64 now)
{
	void *map = table ? (void *)&ct_emb : (void *)&ct_main;
	struct ct_entry *e;

	if (!key)
		return 0;
	e = bpf_map_lookup_elem(map, key);
	if (!e || e->expires > now)
		return 0;
	return destroy(map, key, e, table != 0);
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
