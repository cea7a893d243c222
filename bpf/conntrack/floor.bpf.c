// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* floor.bpf.c: the floor of conntrack's per-packet cost on this machine, for the benchmark
 * (internal/conntrack/ctperf, make bench). It does what any stateful XDP forwarder must do for
 * an established TCP segment and nothing else: conntrack's parsing (Ethernet with VLAN tags,
 * IPv4 or IPv6 with extension headers, the same fragment, TTL and length checks, the ports),
 * its canonical key, one lookup in a hash table of conntrack's size, key and value, and its
 * forwarding from the route the entry caches (devmap redirect, TTL or hop limit, MACs). No
 * state, window, counter, expiry or policy work: conntrack's cost over this one is what the
 * tracking itself costs. */
#include "common.h"
#include "parse.h"
#include "csum.h"
#include "conntrack.h"
#include "pkt.h"

/* key = struct ct_key, value = struct ct_entry: conntrack's ct_main, same size */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct ct_key);
	__type(value, struct ct_entry);
	__uint(max_entries, 262144);
} floor_table SEC(".maps");

/* key = egress ifindex, value = ifindex: where bpf_redirect_map may send */
struct {
	__uint(type, BPF_MAP_TYPE_DEVMAP_HASH);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 64);
} floor_ports SEC(".maps");

SEC("xdp")
int ct_floor(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct hdr_cursor c = {.pos = data, .end = data_end};
	struct iphdr *iph = NULL;
	struct ipv6hdr *ip6 = NULL;
	__u32 src[4] = {}, dst[4] = {};
	struct pkt p = {};
	struct ct_entry *e;
	struct ct_route *r;
	struct ethhdr *eth;
	__u16 *ports;
	__u8 family;
	int eproto, l4;

	eproto = parse_ethhdr(&c, &eth);
	if (eproto == bpf_htons(ETH_P_IP)) {
		void *l3 = c.pos;

		l4 = parse_iphdr(&c, &iph);
		if (l4 < 0 || ip_is_fragment(iph) || iph->ttl <= 1)
			return XDP_PASS;
		if (l3 + bpf_ntohs(iph->tot_len) > data_end || bpf_ntohs(iph->tot_len) < c.pos - l3)
			return XDP_PASS;
		family = 4;
		src[0] = iph->saddr;
		dst[0] = iph->daddr;
	} else if (eproto == bpf_htons(ETH_P_IPV6)) {
		void *l3 = c.pos;
		int frag;

		l4 = parse_ipv6hdr(&c, &ip6, &frag);
		if (l4 < 0 || frag || ip6->hop_limit <= 1)
			return XDP_PASS;
		if (l3 + bpf_ntohs(ip6->payload_len) + sizeof(*ip6) > data_end)
			return XDP_PASS;
		family = 6;
		__builtin_memcpy(src, &ip6->saddr, 16);
		__builtin_memcpy(dst, &ip6->daddr, 16);
	} else {
		return XDP_PASS;
	}
	if (l4 != IPPROTO_TCP && l4 != IPPROTO_UDP)
		return XDP_PASS;
	ports = c.pos;
	if ((void *)(ports + 2) > data_end)
		return XDP_PASS;
	make_key(&p, family, l4, src, dst, ports[0], ports[1]);
	e = bpf_map_lookup_elem(&floor_table, &p.key);
	if (!e)
		return XDP_PASS;
	r = &e->route[(p.fwd == !!(e->status & CT_F_ORIG_LO) ? 0 : 1) & 1];
	if (bpf_redirect_map(&floor_ports, r->ifindex, XDP_PASS) != XDP_REDIRECT)
		return XDP_PASS;
	if (iph)
		ip_decrease_ttl(iph);
	else if (ip6)
		ip6->hop_limit--;
	__builtin_memcpy(eth->h_dest, r->dmac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, r->smac, ETH_ALEN);
	return XDP_REDIRECT;
}

char _license[] SEC("license") = "Dual BSD/GPL";
