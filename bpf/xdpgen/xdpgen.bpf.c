// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* xdpgen.bpf.c: a packet generator. User space runs this XDP program with BPF_PROG_TEST_RUN in
 * live-frames mode (BPF_F_TEST_XDP_LIVE_FRAMES): the kernel hands it one copy of a template frame
 * per repetition and transmits whatever it redirects, without a socket, an skb or a qdisc on the
 * way out. Per frame the program may rotate the TCP/UDP source port, the last 32 bits of the
 * source address and the TCP sequence number, patching the checksums incrementally.
 *
 * The kernel keeps its frame pages in a pool and recycles them without copying the template in
 * again: a recycled page holds whatever the last user left in it, which through a veth includes
 * the receiver's rewrites (a router's TTL decrement and new MACs). So every frame first gets the
 * template's headers written back (head, the first head_len bytes; nothing beyond the headers is
 * ever rewritten on the way), then its own fields on top. Configuration is set from Go at load. */
#include "common.h"
#include "csum.h"
#include "stats.h"

#define XDPGEN_HEAD_MAX 128 /* longest header part restored per frame */

enum xdpgen_stat {
	XDPGEN_STAT_SENT,  /* redirected to tx_ifindex */
	XDPGEN_STAT_SHORT, /* frame shorter than the template head: cannot happen, aborted */
	XDPGEN_STAT_MAX,
};

/* Where frames go (an interface of the namespace BPF_PROG_TEST_RUN is called from). */
volatile const __u32 tx_ifindex = 0;
/* The template's first head_len bytes (1..XDPGEN_HEAD_MAX), written back into every frame. */
volatile const __u32 head_len = 0;
volatile const __u8 head[XDPGEN_HEAD_MAX] = {};
/* Offsets into the frame, validated by Go against head_len; a zero count or offset turns the
 * rewrite off. */
volatile const __u32 l4_csum_off = 0; /* TCP/UDP checksum */
volatile const __u32 udp = 0;	      /* 1: UDP, whose zero checksum means "none" */
volatile const __u32 sport_off = 0;   /* TCP/UDP source port */
volatile const __u32 port_count = 0;  /* ports: template's, +1, … +port_count-1 */
volatile const __u32 saddr_off = 0;   /* last 32 bits of the source address */
volatile const __u32 addr_count = 0;  /* addresses: template's, +1, … +addr_count-1 */
volatile const __u32 ip_csum_off = 0; /* IPv4 header checksum (0 for IPv6) */
volatile const __u32 seq_off = 0;     /* TCP sequence number: template's + frame index */

/* Index of the next frame, shared by every CPU (a sender may migrate between runs); Go sets
 * where it starts. */
__u64 next_frame = 0;

/* key = enum xdpgen_stat, value = per-CPU frame count */
FP_COUNTERS(xdpgen_stats, enum xdpgen_stat, XDPGEN_STAT_MAX);

static __always_inline __u16 load16(void *p)
{
	return bpf_ntohs(*(__be16 *)p);
}

static __always_inline __u32 load32(void *p)
{
	return bpf_ntohl(*(__be32 *)p);
}

SEC("xdp")
int xdpgen(struct xdp_md *ctx)
{
	__u64 idx = __sync_fetch_and_add(&next_frame, 1);
	__u64 rest = idx;
	void *data, *end;
	__sum16 *l4_csum = 0, *ip_csum = 0;

	if (bpf_xdp_store_bytes(ctx, 0, (void *)head, head_len) < 0) {
		fp_count(&xdpgen_stats, XDPGEN_STAT_SHORT);
		return XDP_ABORTED;
	}
	data = (void *)(long)ctx->data;
	end = (void *)(long)ctx->data_end;
	/* head_len is a load-time constant, so this one check covers every offset below (Go keeps
	 * them inside the head; the verifier checks it again). */
	if (data + head_len > end) {
		fp_count(&xdpgen_stats, XDPGEN_STAT_SHORT);
		return XDP_ABORTED;
	}
	if (l4_csum_off) {
		l4_csum = data + l4_csum_off;
		if (udp && *l4_csum == 0)
			l4_csum = 0; /* no checksum to keep */
	}
	if (ip_csum_off)
		ip_csum = data + ip_csum_off;

	if (port_count > 1) {
		__be16 *p = data + sport_off;
		__be16 old = *p, new = bpf_htons(load16(p) + rest % port_count);

		rest /= port_count;
		*p = new;
		if (l4_csum)
			csum_replace2(l4_csum, old, new);
	}
	if (addr_count > 1) {
		__be32 *a = data + saddr_off;
		__be32 old = *a, new = bpf_htonl(load32(a) + (__u32)(rest % addr_count));

		*a = new;
		if (ip_csum)
			csum_replace4(ip_csum, old, new); /* IPv4 header */
		if (l4_csum)
			csum_replace4(l4_csum, old, new); /* pseudo-header */
	}
	if (seq_off) {
		__be32 *s = data + seq_off;
		__be32 old = *s, new = bpf_htonl(load32(s) + (__u32)idx);

		*s = new;
		if (l4_csum)
			csum_replace4(l4_csum, old, new);
	}
	if (udp && l4_csum && *l4_csum == 0)
		*l4_csum = 0xffff; /* a computed zero is sent as all ones (RFC 768) */

	fp_count(&xdpgen_stats, XDPGEN_STAT_SENT);
	return bpf_redirect(tx_ifindex, 0);
}

char _license[] SEC("license") = "Dual BSD/GPL";
