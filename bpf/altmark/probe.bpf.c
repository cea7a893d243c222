// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* probe.bpf.c: the alternate-marking probe (RFC 9341), on tcx ingress and egress of every
 * monitored interface. For each packet it reads the carrier's color (carrier.h) and counts
 * packets and L3 bytes per (interface, direction, color) in a per-CPU array (per FlowMonID too
 * in a per-CPU hash when the carrier has one), so no count is lost however many CPUs add at
 * once; Go sums the CPUs when it reads a color, L/2 after the color's period ended
 * (docs/altmark.md, read rule). Packets whose hash (hash.h) matches hash_ref in the current
 * number of low bits are sampled into the ring of their color, with
 * their TAI timestamp; after NMAX samples in a period the number of bits grows by one (dynamic
 * hash length). Malformed packets are counted per point and passed. Every path returns
 * TCX_NEXT: the probe never drops, a bug costs a count, not traffic. */
#include "common.h"
#include "parse.h"
#include "stats.h"
#include "altmark.h"
#include "carrier.h"
#include "hash.h"

/* The configuration, set by the loader from ProbeSpec. */
volatile const __u32 carrier = AM_CARRIER_DSCP;
volatile const __u32 color_bit = 0; /* dscp: DSCP bit numbers */
volatile const __u32 delay_bit = 1;
volatile const __u32 hash_ref = 0;
volatile const __u32 start_mask = 0xff; /* low bits of the starting hash length */
volatile const __u32 nmax = 1000;
volatile const __u32 sampling = 1;	     /* 0: count only */
volatile const __u32 proto_filter = 0;	     /* 1: count only the protocols in proto_mask */
volatile const __u32 proto_mask[8] = {};     /* bit p: protocol p is counted */
volatile const __u32 backbone = 0;	     /* 1: look up am_backbone */
volatile const __u64 period_ns = 1000000000; /* for the color of a malformed packet */
volatile const __u32 start_color = 0;

/* key = ifindex (below AM_IFINDEX_MAX), value = struct am_ifslots: the interface's points */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct am_ifslots);
	__uint(max_entries, AM_IFINDEX_MAX);
} am_ifslots SEC(".maps");

/* key = point * 2 + color, value = per-CPU struct am_count: the counters of a carrier without
 * FlowMonID (dscp, ipv4-flag) at a point found in am_ifslots. Array lookups are inlined by the
 * verifier (no call), where a hash lookup is a call and a hash computation. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct am_count);
	__uint(max_entries, 2 * AM_MAX_POINTS);
} am_point_counts SEC(".maps");

/* key = struct am_count_key, value = per-CPU struct am_count: the counters per FlowMonID
 * (ipv6-altmark) and the malformed packets of every carrier */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__type(key, struct am_count_key);
	__type(value, struct am_count);
	__uint(max_entries, AM_MAX_COUNTERS);
} am_counts SEC(".maps");

/* key = struct am_point_key (point and color), value = struct am_point (hash length state) */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct am_point_key);
	__type(value, struct am_point);
	__uint(max_entries, 2 * AM_MAX_POINTS);
} am_points SEC(".maps");

/* Samples of color 0 and of color 1: struct am_sample records. One ring per color, so Go drains
 * the color it reads while the other fills; a full ring counts AM_STAT_SAMPLE_LOST. The loader
 * sizes them (max_entries) for NMAX and the number of points. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);
} am_samples0 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);
} am_samples1 SEC(".maps");

/* key = struct am_lpm_key (IPv4 prefix), value = 1: backbone prefixes, neither counted nor
 * sampled (ipv4-flag) */
struct am_lpm_key {
	__u32 prefixlen;
	__u32 addr; /* network order */
};

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct am_lpm_key);
	__type(value, __u8);
	__uint(max_entries, 256);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} am_backbone SEC(".maps");

/* key = enum am_stat, value = per-CPU count */
FP_COUNTERS(am_stats, enum am_stat, AM_STAT_MAX);

const enum am_carrier *unused_carrier __attribute__((unused)); /* keep the enums in BTF */
const enum am_dir *unused_dir __attribute__((unused));
const enum am_limit *unused_limit __attribute__((unused));
const enum am_kind *unused_kind __attribute__((unused));
const struct am_sample *unused_sample __attribute__((unused));

/* am_match is the number of low bits in which hash equals hash_ref (32: all): the trailing
 * zeros of their difference, as the population count of the bits below the lowest set one. */
static __always_inline __u32 am_match(__u32 hash)
{
	__u32 x = hash ^ hash_ref, v;

	if (!x)
		return AM_HASH_LEN_MAX;
	v = (x & -x) - 1;
	v = v - ((v >> 1) & 0x55555555);
	v = (v & 0x33333333) + ((v >> 2) & 0x33333333);
	return (((v + (v >> 4)) & 0x0f0f0f0f) * 0x01010101) >> 24;
}

/* am_count_add adds segs packets of bytes to this CPU's counter c, at TAI time now. */
static __always_inline void am_count_add(struct am_count *c, __u64 segs, __u64 bytes, __u64 now)
{
	__u64 hi, mid, lo;

	if (!c->packets)
		c->first_ns = now;
	c->last_ns = now;
	c->packets += segs;
	c->bytes += bytes;
	/* sum += now * segs in 128 bits: now = a << 32 | b, segs < 2^16 */
	mid = (now >> 32) * segs; /* < 2^48 */
	lo = (now & 0xffffffff) * segs;
	hi = mid >> 32;
	mid <<= 32;
	lo += mid;
	if (lo < mid)
		hi++;
	c->sum_ns_lo += lo;
	if (c->sum_ns_lo < lo)
		hi++;
	c->sum_ns_hi += hi;
}

/* am_add adds segs packets of bytes to the counter of k on this CPU, at time now. A global
 * function: the verifier checks it once, not once on every path that leads to it (the
 * points' array and this hash together would exceed its limit). Returns 0. */
__attribute__((noinline)) int am_add(struct am_count_key *k, __u64 segs, __u64 bytes, __u64 now)
{
	struct am_count *c;

	if (!k)
		return 0;
	c = bpf_map_lookup_elem(&am_counts, k);
	if (!c) {
		struct am_count z = {};

		/* EEXIST: another CPU inserted it meanwhile; its value here is zeros */
		bpf_map_update_elem(&am_counts, k, &z, BPF_NOEXIST);
		c = bpf_map_lookup_elem(&am_counts, k);
		if (!c) {
			fp_count(&am_stats, AM_STAT_TABLE_FULL);
			return 0;
		}
	}
	am_count_add(c, segs, bytes, now);
	return 0;
}

/* am_add_point adds segs packets of bytes of color to the counter of the point (ifindex, dir):
 * in am_point_counts when am_ifslots has the point, else in am_counts. */
static __always_inline void am_add_point(__u32 ifindex, __u32 dir, __u32 color, __u64 segs,
					 __u64 bytes, __u64 now)
{
	struct am_ifslots *s = bpf_map_lookup_elem(&am_ifslots, &ifindex);
	struct am_count_key k = {};
	struct am_count *c;
	__u32 idx;

	if (s && s->slot[dir & 1]) {
		idx = ((s->slot[dir & 1] - 1) % AM_MAX_POINTS) * 2 + (color & 1);
		c = bpf_map_lookup_elem(&am_point_counts, &idx);
		if (c) {
			am_count_add(c, segs, bytes, now);
			return;
		}
	}
	k.ifindex = ifindex;
	k.flowmon = AM_FLOWMON_NONE;
	k.dir = dir;
	k.color = color;
	k.kind = AM_KIND_COUNTED;
	am_add(&k, segs, bytes, now);
}

/* am_malformed counts a packet the parser refused, for its point, in the color of the period the
 * probe's clock is in (it has no color of its own). */
static __always_inline void am_malformed(struct __sk_buff *skb, __u32 dir, int reason)
{
	__u64 now = bpf_ktime_get_tai_ns();
	struct am_count_key k = {
	    .ifindex = skb->ifindex,
	    .flowmon = AM_FLOWMON_NONE,
	    .dir = dir,
	    .color = (now / period_ns + start_color) & 1,
	    .kind = AM_KIND_MALFORMED,
	};

	fp_count(&am_stats, reason);
	am_add(&k, 1, skb->len, now);
}

/* am_backbone_hit is true when the source or destination is in a backbone prefix. */
static __always_inline int am_backbone_hit(const struct am_pkt *p)
{
	struct iphdr *iph = p->l3;
	struct am_lpm_key k = {.prefixlen = 32};

	if (p->family != 4)
		return 0;
	k.addr = iph->saddr;
	if (bpf_map_lookup_elem(&am_backbone, &k))
		return 1;
	k.addr = iph->daddr;
	return bpf_map_lookup_elem(&am_backbone, &k) != NULL;
}

/* am_sample decides under the point's lock whether a packet whose hash matches hash_ref in match
 * low bits is taken at the current hash length (growing it after NMAX), and writes it to the
 * ring of its color. */
static __always_inline void am_sample(struct __sk_buff *skb, const struct am_pkt *p,
				      const struct am_fields *f, __u32 dir, __u32 hash, __u64 now)
{
	struct am_point_key pk = {.ifindex = skb->ifindex, .dir = dir, .color = p->color & 1};
	__u32 match = am_match(hash), take = 0, grew = 0;
	struct am_point *pt;
	struct am_sample *s;

	pt = bpf_map_lookup_elem(&am_points, &pk);
	if (!pt) {
		fp_count(&am_stats, AM_STAT_NO_POINT);
		return;
	}
	if (match > AM_HASH_LEN_MAX)
		match = AM_HASH_LEN_MAX;
	bpf_spin_lock(&pt->lock);
	if (match >= pt->bits) {
		take = 1;
		pt->hist[match]++;
		pt->taken++;
		if (pt->taken >= nmax && pt->bits < AM_HASH_LEN_MAX) {
			pt->taken -= pt->hist[pt->bits & 31];
			pt->bits++;
			pt->grown++;
			grew = 1;
		}
	}
	bpf_spin_unlock(&pt->lock);
	if (grew)
		fp_count(&am_stats, AM_STAT_HASH_GROWN);
	if (!take)
		return;
	if (p->color)
		s = bpf_ringbuf_reserve(&am_samples1, sizeof(*s), 0);
	else
		s = bpf_ringbuf_reserve(&am_samples0, sizeof(*s), 0);
	if (!s) {
		fp_count(&am_stats, AM_STAT_SAMPLE_LOST);
		return;
	}
	s->tai_ns = now;
	__builtin_memcpy(s->saddr, f->saddr, 16);
	__builtin_memcpy(s->daddr, f->daddr, 16);
	s->hash = hash;
	s->ifindex = skb->ifindex;
	s->flowmon = p->flowmon;
	s->length = p->l3_len;
	s->sport = p->sport;
	s->dport = p->dport;
	s->proto = p->proto;
	s->dir = dir;
	s->color = p->color;
	s->match = match;
	bpf_ringbuf_submit(s, BPF_RB_NO_WAKEUP); /* Go drains the ring when it reads the color */
	fp_count(&am_stats, AM_STAT_SAMPLED);
}

static __always_inline int am_probe(struct __sk_buff *skb, __u32 dir)
{
	struct am_count_key k = {};
	struct am_fields f;
	struct am_pkt p;
	__u64 segs, bytes, now;
	__u32 len = skb->len, hash;
	int r;

	fp_count(&am_stats, AM_STAT_SEEN);
	r = am_parse((void *)(long)skb->data, (void *)(long)skb->data_end, len, &p);
	/* Headers past the linear part (rare: a sender's TCP segments carry theirs linear, and
	 * pulling them would copy each cloned skb): make up to AM_PULL_LEN bytes linear, parse
	 * again. */
	if (r && r != AM_STAT_NOT_IP && skb->data_end - skb->data < AM_PULL_LEN &&
	    len > skb->data_end - skb->data) {
		bpf_skb_pull_data(skb, len < AM_PULL_LEN ? len : AM_PULL_LEN);
		asm volatile("" : "+r"(skb)); /* read data and data_end anew, as ctx loads */
		r = am_parse((void *)(long)skb->data, (void *)(long)skb->data_end, len, &p);
	}
	if (r == AM_STAT_NOT_IP) {
		fp_count(&am_stats, AM_STAT_NOT_IP);
		return TCX_NEXT;
	}
	if (r) {
		am_malformed(skb, dir, r);
		return TCX_NEXT;
	}
	if (!am_read_carrier(&p, carrier, color_bit, delay_bit)) {
		fp_count(&am_stats, AM_STAT_UNMARKED);
		return TCX_NEXT;
	}
	if (proto_filter && !((proto_mask[(p.proto >> 5) & 7] >> (p.proto & 31)) & 1)) {
		fp_count(&am_stats, AM_STAT_FILTERED);
		return TCX_NEXT;
	}
	if (backbone && am_backbone_hit(&p)) {
		fp_count(&am_stats, AM_STAT_BACKBONE);
		return TCX_NEXT;
	}
	/* What the rest needs from the packet, copied: the packet pointers die here, and the paths
	 * the parser took meet again in the verifier. */
	if (sampling)
		am_fields_of(skb, &p, &f);
	/* A GSO/GRO packet stands for gso_segs packets on the wire, each with its own headers. */
	segs = skb->gso_segs > 1 ? skb->gso_segs : 1;
	bytes = p.l3_len;
	if (segs > 1) {
		bytes = len - p.l3_off + (segs - 1) * (p.pl_off - p.l3_off);
		fp_count(&am_stats, AM_STAT_GSO);
	}
	now = bpf_ktime_get_tai_ns();
	if (carrier == AM_CARRIER_IPV6_ALTMARK) {
		k.ifindex = skb->ifindex;
		k.flowmon = p.flowmon;
		k.dir = dir;
		k.color = p.color;
		k.kind = AM_KIND_COUNTED;
		am_add(&k, segs & 0xffff, bytes, now);
	} else {
		am_add_point(skb->ifindex, dir, p.color, segs & 0xffff, bytes, now);
	}
	fp_count(&am_stats, AM_STAT_COUNTED);
	if (!sampling)
		return TCX_NEXT;
	hash = am_hash(&p, &f);
	if ((hash ^ hash_ref) & start_mask)
		return TCX_NEXT; /* cannot match: the length only grows */
	am_sample(skb, &p, &f, dir, hash, now);
	return TCX_NEXT;
}

SEC("tcx/ingress")
int altmark_probe_in(struct __sk_buff *skb)
{
	return am_probe(skb, AM_DIR_IN);
}

SEC("tcx/egress")
int altmark_probe_out(struct __sk_buff *skb)
{
	return am_probe(skb, AM_DIR_OUT);
}

char _license[] SEC("license") = "Dual BSD/GPL";
