// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* sink.bpf.c: the receiving end of a generated flood, attached in XDP to the receiver's
 * interface. It counts and drops the IPv4/IPv6 TCP or UDP packets for one destination port and
 * passes everything else (ARP, the benchmark's other traffic) to the kernel.
 *
 * Why an XDP sink rather than the interface's rx counters: the counter sees only the flood's
 * own packets (no ARP, no control connections), is exact (per-CPU, no sampling) and the packets
 * it counts cost the receiver a few tens of nanoseconds instead of a trip through its IP stack
 * (a closed UDP port answers with ICMP, a closed TCP port with RSTs that a tracker on the way
 * would act on): the receiver is never what limits the rate being measured. On a veth, an XDP
 * program on the receiving end also turns on the NAPI that frames redirected into its peer need.
 * Configuration is set from Go at load. */
#include "common.h"
#include "parse.h"
#include "stats.h"

enum sink_stat {
	SINK_STAT_MATCHED, /* counted and dropped */
	SINK_STAT_PASSED,  /* anything else, left to the kernel */
	SINK_STAT_MAX,
};

volatile const __u32 match_proto = 0; /* IPPROTO_TCP or IPPROTO_UDP */
volatile const __u32 match_dport = 0; /* destination port */
volatile const __u32 match_drop = 1;  /* 0: count only, pass matching packets on */

/* key = enum sink_stat, value = per-CPU packet count */
FP_COUNTERS(sink_stats, enum sink_stat, SINK_STAT_MAX);

SEC("xdp")
int xdpgen_sink(struct xdp_md *ctx)
{
	struct hdr_cursor c = {.pos = (void *)(long)ctx->data, .end = (void *)(long)ctx->data_end};
	struct ethhdr *eth;
	struct iphdr *iph;
	struct ipv6hdr *ip6;
	__be16 *ports;
	int proto, frag = 0;

	proto = parse_ethhdr(&c, &eth);
	if (proto == bpf_htons(ETH_P_IP)) {
		proto = parse_iphdr(&c, &iph);
		if (proto >= 0 && ip_is_fragment(iph))
			frag = 1;
	} else if (proto == bpf_htons(ETH_P_IPV6)) {
		proto = parse_ipv6hdr(&c, &ip6, &frag);
	} else {
		proto = -1;
	}
	ports = c.pos; /* source, destination: the same place in TCP and UDP */
	if (proto != (int)match_proto || frag || (void *)(ports + 2) > c.end ||
	    ports[1] != bpf_htons((__u16)match_dport)) {
		fp_count(&sink_stats, SINK_STAT_PASSED);
		return XDP_PASS;
	}
	fp_count(&sink_stats, SINK_STAT_MATCHED);
	return match_drop ? XDP_DROP : XDP_PASS;
}

char _license[] SEC("license") = "Dual BSD/GPL";
