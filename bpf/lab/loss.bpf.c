// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* loss.bpf.c: random packet loss on a lab link's egress (the kernel here has no netem), a
 * cls_bpf program in direct-action mode on the clsact egress hook. Each packet is dropped with
 * probability loss_threshold / 2^32, decided per packet with bpf_get_prandom_u32, so losses are
 * independent (Bernoulli), as netem's "loss random".
 *
 * A lost packet is consumed with TC_ACT_STOLEN, not TC_ACT_SHOT: SHOT makes the send fail
 * (NET_XMIT_DROP), and the sender's TCP then takes it for local congestion and requeues the
 * segment instead of losing it on the wire; STOLEN reports success, as netem does. (tcx turns
 * STOLEN into "next program", hence cls_bpf.) */
#include "common.h"
#include "stats.h"

enum loss_stat {
	LOSS_STAT_PASSED,
	LOSS_STAT_DROPPED,
	LOSS_STAT_MAX,
};

/* Drop probability scaled to 2^32: 0 never drops, 1<<32 always does. Set from Go at load. */
volatile const __u64 loss_threshold = 0;

/* key = enum loss_stat, value = per-CPU packet count */
FP_COUNTERS(loss_stats, enum loss_stat, LOSS_STAT_MAX);

SEC("tc")
int lab_loss(struct __sk_buff *skb)
{
	if ((__u64)bpf_get_prandom_u32() < loss_threshold) {
		fp_count(&loss_stats, LOSS_STAT_DROPPED);
		return TC_ACT_STOLEN;
	}
	fp_count(&loss_stats, LOSS_STAT_PASSED);
	return TC_ACT_UNSPEC; /* let later filters run */
}

/* The same loss as an XDP program, on the receiving end of a link whose sender forwards with
 * XDP redirects (topology `xdp: true`): a redirected frame skips the sender's clsact and
 * qdiscs, so the link's loss is applied where it arrives, per frame, before GRO can merge
 * frames into one skb (which would turn single losses into bursts). An XDP program on the
 * receiving veth also lets it receive the redirects. */
SEC("xdp")
int lab_loss_xdp(struct xdp_md *ctx)
{
	if ((__u64)bpf_get_prandom_u32() < loss_threshold) {
		fp_count(&loss_stats, LOSS_STAT_DROPPED);
		return XDP_DROP;
	}
	fp_count(&loss_stats, LOSS_STAT_PASSED);
	return XDP_PASS;
}

char _license[] SEC("license") = "Dual BSD/GPL";
