// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* classifier.bpf.c: the router side of prio, on the bottleneck interface's tcx egress (before
 * the qdisc). It reads what a sender advertises — our TCP option (prio.h) or the original
 * scheme's SCTP chunk 150 — keeps per-flow state in an LRU hash and sets skb->priority to the
 * HTB class of the flow's band and leaf, which HTB then honours (htb_classify looks at
 * skb->priority before any filter). Packets it knows nothing about go to the default band.
 * It never drops: every path ends in TCX_NEXT, so a bug costs priority, not traffic. */
#include "common.h"
#include "parse.h"
#include "stats.h"
#include "prio.h"

#define TCP_OPTS_MAX 40

/* The policy, set by the loader (docs/prio.md). */
volatile const __u32 scheme = PRIO_SCHEME_FIFO;
volatile const __u32 major = 0xfa;		   /* the HTB qdisc's handle */
volatile const __u32 nleaves = 1;		   /* K leaves per band */
volatile const __u32 default_band = 0;		   /* where packets without information go */
volatile const __u32 max_claim = 0;		   /* the best band host information can claim */
volatile const __u32 nthresh = 0;		   /* backlog / pias thresholds in use */
volatile const __u64 thresh[PRIO_MAX_THRESH] = {}; /* bytes, ascending */
/* Intervals on the coarse clock, one tick added (0: off). */
volatile const __u64 change_interval_ns = 0; /* at most one band change per interval */
volatile const __u64 idle_reset_ns = 0;	     /* pias: an idle gap ends a message */
volatile const __u64 move_gap_ns = 0;	     /* a flow moves only after this silence */
volatile const __u32 cache_slots = 0; /* flow cache slots per CPU, a power of two (0: none) */

/* key = struct prio_flow_key, value = struct prio_flow */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct prio_flow_key);
	__type(value, struct prio_flow);
	__uint(max_entries, 65536);
} prio_flows SEC(".maps");

/* key = struct prio_lpm_key (IPv4-mapped source), value = 1: senders whose information counts */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct prio_lpm_key);
	__type(value, __u8);
	__uint(max_entries, 256);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} prio_trust SEC(".maps");

/* key = 0, value = flows created: new flows take leaves in turn (leaf = count mod K), so K
 * leaves hold flows within one of each other; a hash would pile some up (SFQ's collisions). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 1);
} prio_next_leaf SEC(".maps");

/* key = slot (a hash of the flow key, cache_slots of them), value = struct prio_flow_cached
 * per CPU: each CPU's direct-mapped flow cache. A flow's packets stay on a CPU (RSS, XPS, the
 * sender's own CPU), so its state is read and written there instead of in the shared table:
 * the table lookup (a jhash over the 40-byte key, a bucket and an element) was most of the
 * classifier's time per packet in a live flow. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct prio_flow_cached);
	__uint(max_entries, 1); /* set by the loader */
} prio_cache SEC(".maps");

/* key = slot, value = generation, bumped when a flow of that slot changes band or is made on
 * any CPU: every CPU's copy made before is stale, so no CPU keeps a flow in its old class. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 1); /* set by the loader */
} prio_gen SEC(".maps");

/* key = enum prio_stat, value = per-CPU count */
FP_COUNTERS(prio_stats, enum prio_stat, PRIO_STAT_MAX);

const enum prio_scheme *unused_scheme __attribute__((unused)); /* keep the enums in BTF */
const enum prio_source *unused_source __attribute__((unused));
const enum prio_wire *unused_wire __attribute__((unused));
const enum prio_limit *unused_limit __attribute__((unused));

/* What a packet told us. */
struct info {
	__u32 backlog;
	__u8 occupancy;
	__u8 source; /* enum prio_source; PRIO_SRC_NONE: nothing */
};

static __always_inline __u32 classid(__u32 band, __u32 leaf)
{
	return major << 16 | ((band + 1) << 8 | leaf);
}

static __always_inline __u32 next_leaf(void)
{
	__u32 zero = 0;
	__u64 *n = bpf_map_lookup_elem(&prio_next_leaf, &zero);

	if (!n || nleaves <= 1)
		return 0;
	return __sync_fetch_and_add(n, 1) % nleaves;
}

/* read_option: if the 8 bytes at o are our option, it fills in and returns 1; otherwise 0. */
static __always_inline int read_option(const __u8 *o, struct info *in)
{
	if (o[0] != PRIO_OPT_KIND || o[1] != PRIO_OPT_LEN || (o[2] << 8 | o[3]) != PRIO_EXID)
		return 0;
	in->occupancy = o[4];
	in->backlog = ((__u32)o[5] << 16 | (__u32)o[6] << 8 | o[7]) * PRIO_BACKLOG_UNIT;
	in->source = PRIO_SRC_TCP_OPTION;
	return 1;
}

/* prio_tcp_option finds our option among the optlen bytes of TCP options at offset off.
 * Returns 1 and fills in if found, 0 if the options hold none, -1 if they are malformed (a
 * length of 0 or 1, or one running past the header). A global function, verified once: it
 * copies the options to the stack and walks them by index, which keeps the verifier's states
 * few (a walk over packet pointers does not fit in its budget). */
__noinline int prio_tcp_option(struct __sk_buff *skb, __u32 off, __u32 optlen, struct info *in)
{
	__u8 o[64 + PRIO_OPT_LEN] = {}; /* room for an option read at any index below 64 */
	__u32 i = 0;

	if (!skb || !in || optlen == 0 || optlen > TCP_OPTS_MAX || off > 0xffff)
		return 0;
	if (bpf_skb_load_bytes(skb, off, o, optlen) < 0)
		return -1;
	/* Bounded by i, which grows every round. */
	while (i < optlen && i < TCP_OPTS_MAX) {
		__u8 kind = o[i & 63], len;

		if (kind == 0)
			return 0; /* end of options */
		if (kind == 1) {
			i++;
			continue;
		}
		if (i + 1 >= optlen)
			return -1;
		len = o[(i + 1) & 63];
		if (len < 2 || i + len > optlen)
			return -1;
		if (read_option(&o[i & 63], in))
			return 1;
		i += len;
	}
	return 0;
}

/* usual_layout reads the options straight from the packet when they are laid out as Linux
 * sends a data segment: none, NOP NOP timestamps, and either followed by our option (the
 * kernel writes its options first, a BPF program's after them). It returns what
 * prio_tcp_option would (1 found, 0 none), or -1 for any other layout (SACK blocks, a SYN's
 * MSS...), which takes the walk. Skipping the copy and the walk for nearly every packet is
 * most of what the classifier saves per packet. */
static __always_inline int usual_layout(const struct tcphdr *th, const void *end, struct info *in)
{
	const __u8 *o = (const __u8 *)(th + 1);
	__u32 optlen = th->doff * 4 - sizeof(*th);

	if (optlen == 0)
		return 0;
	if (optlen == PRIO_OPT_LEN)
		return (void *)(o + PRIO_OPT_LEN) <= end && read_option(o, in) ? 1 : -1;
	if (optlen != 12 && optlen != 12 + PRIO_OPT_LEN)
		return -1;
	if ((void *)(o + 12) > end || o[0] != 1 || o[1] != 1 || o[2] != 8 || o[3] != 10)
		return -1;
	if (optlen == 12)
		return 0;
	return (void *)(o + 12 + PRIO_OPT_LEN) <= end && read_option(o + 12, in) ? 1 : -1;
}

/* band_of is the band the scheme gives a flow with information in (or none), bytes seen; a
 * claim above max_claim is lowered to it and *capped set. */
static __always_inline __u32 band_of(struct info *in, __u64 bytes, int trusted, int *capped)
{
	__u32 band = default_band;

	switch (scheme) {
	case PRIO_SCHEME_OCCUPANCY:
		if (in->source == PRIO_SRC_NONE || !trusted || in->occupancy > 100)
			return default_band;
		/* the fullest buffers get band 0 */
		band = (100 - in->occupancy) / (100 / PRIO_OCC_BANDS);
		if (band > PRIO_OCC_BANDS - 1)
			band = PRIO_OCC_BANDS - 1;
		break;
	case PRIO_SCHEME_BACKLOG:
		if (in->source != PRIO_SRC_TCP_OPTION || !trusted)
			return default_band;
		band = nthresh;
		for (__u32 i = 0; i < PRIO_MAX_THRESH; i++) {
			if (i < nthresh && in->backlog < thresh[i]) {
				band = i;
				break;
			}
		}
		break;
	case PRIO_SCHEME_PIAS:
		band = 0;
		for (__u32 i = 0; i < PRIO_MAX_THRESH; i++)
			if (i < nthresh && bytes >= thresh[i])
				band = i + 1;
		return band;
	default:
		return 0;
	}
	if (band < max_claim) {
		*capped = 1;
		band = max_claim;
	}
	return band;
}

/* target_band is where this packet would move a flow now in band, whose earlier packets did
 * (informed) or did not carry information, having seen bytes with this one. */
static __always_inline __u32 target_band(struct info *in, __u32 band, int informed, __u64 bytes,
					 int trusted, int *capped)
{
	__u32 target;

	if (scheme == PRIO_SCHEME_FAIR)
		return 0;
	if (scheme == PRIO_SCHEME_PIAS) {
		target = band_of(in, bytes, 0, capped);
		return target < band ? band : target; /* never promoted */
	}
	if (in->source == PRIO_SRC_NONE)
		return band; /* a segment without the option keeps the flow where it is */
	target = band_of(in, bytes, trusted, capped);
	/* Occupancy is noisy from segment to segment: an informed flow moves only to a band two
	 * deciles away, so it does not flip between neighbours (each flip can reorder its
	 * packets between two queues). */
	if (scheme == PRIO_SCHEME_OCCUPANCY && informed && target != default_band &&
	    band != default_band && target + 1 >= band && target <= band + 1)
		target = band;
	return target;
}

static __always_inline int is_trusted(const __u8 *saddr)
{
	struct prio_lpm_key k = {.prefixlen = 128};

	__builtin_memcpy(k.addr, saddr, 16);
	return bpf_map_lookup_elem(&prio_trust, &k) != NULL;
}

/* clock reads the time once per packet, and only if the packet needs it: most packets of a
 * flow stay in its band and need none. It is the coarse clock (the last tick's time, a load):
 * a flow swinging across a band edge weighs a held move at every other packet, and the
 * precise clock's TSC reads took ~0.8 % of a loaded CPU in perf. The loader adds one tick to
 * every nonzero interval, so each stays a lower bound (router.go). */
static __always_inline __u64 clock(__u64 *now)
{
	if (!*now)
		*now = bpf_ktime_get_coarse_ns();
	return *now;
}

/* The flow key, filled in whole 64-bit words: the flow cache hashes and compares it as words,
 * and a word read back over narrower stores waits for them to retire (no store-to-load
 * forwarding); filled byte by byte, that wait was a fifth of the classifier's time per packet
 * (perf over a BPF_PROG_TEST_RUN loop). The words hold the key's bytes in memory order on this
 * little-endian target. */
union key_words {
	struct prio_flow_key k;
	__u64 w[sizeof(struct prio_flow_key) / 8];
};

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "union key_words assumes a little-endian target (bpf2go -target bpfel)"
#endif

/* An IPv4-mapped address's second word, before the address: bytes 10 and 11 are 0xff. */
#define V4MAPPED_WORD 0xffff0000ULL

/* move_refused: a move of a flow last moved at last_change, gap after its previous packet, is
 * refused now, *why says why; an uninformed flow's first information always moves it. */
static __always_inline int move_refused(int informed, __u64 last_change, __u64 gap, __u64 *now,
					enum prio_stat *why)
{
	if (!informed)
		return 0;
	if (clock(now) - last_change < change_interval_ns) {
		*why = PRIO_STAT_CHANGE_HELD;
		return 1;
	}
	if (gap < move_gap_ns) {
		/* Mid-burst, the flow's last packets still wait in the old band's queue and would
		 * be overtaken: the sender takes the reordering for loss and resends data that was
		 * not lost. After a gap they have left. */
		*why = PRIO_STAT_MOVE_WAIT;
		return 1;
	}
	return 0;
}

/* The flow cache (prio_cache). A slot serves a packet only if it holds the packet's flow,
 * was filled after the last band change of any flow in its slot (gen), has not gone
 * PRIO_CACHE_SYNC packets without a sync, brings no new information, and the packet leaves the
 * flow in its band, or wants a move that move_refused refuses: every decision that moves a
 * flow or makes one is taken on the table, by the code that takes it without a cache. A refusal
 * reads what the copy holds exactly (last_change: a move bumps gen) or no later than the table
 * (last_seen: the gap is no shorter, so a move the copy puts off the table would too). */

/* cache_slot hashes the flow key to a slot: its five 64-bit words folded by XOR, the halves
 * folded, then one multiply, whose bits 32 and up mix every bit below them. A multiply-add per
 * word was a chain of five dependent multiplications ahead of every lookup. Flows whose words
 * fold alike share a slot and take turns in it: a copy serves only its own key. */
static __always_inline __u32 cache_slot(const struct prio_flow_key *key)
{
	__u64 w[sizeof(*key) / 8], h;

	__builtin_memcpy(w, key, sizeof(w));
	h = (w[0] ^ w[1]) ^ (w[2] ^ w[3]) ^ w[4];
	h ^= h >> 32;
	return (h * 0x9e3779b97f4a7c15ULL >> 32) & (cache_slots - 1);
}

static __always_inline int same_key(const struct prio_flow_key *a, const struct prio_flow_key *b)
{
	__u64 x[sizeof(*a) / 8], y[sizeof(*a) / 8], d = 0;

	__builtin_memcpy(x, a, sizeof(x));
	__builtin_memcpy(y, b, sizeof(y));
#pragma unroll
	for (int i = 0; i < sizeof(x) / 8; i++)
		d |= x[i] ^ y[i];
	return d == 0;
}

/* flush_slot empties the slot, first adding what it did since its last sync to its flow's
 * state: f if it holds key's flow, the table's entry otherwise. A copy of a flow the table let
 * go is dropped with it, as the table dropped the flow's state. */
static __always_inline void flush_slot(struct prio_flow_cached *c, const struct prio_flow_key *key,
				       struct prio_flow *f)
{
	if (!c->packets)
		return;
	if (!same_key(&c->key, key))
		f = c->unsynced ? bpf_map_lookup_elem(&prio_flows, &c->key) : NULL;
	if (f) {
		f->bytes += c->unsynced;
		if (c->last_seen > f->last_seen)
			f->last_seen = c->last_seen;
	}
	c->unsynced = 0;
	c->packets = 0;
}

/* fill_slot makes the slot a copy of flow key's state f, made at generation gen. */
static __always_inline void fill_slot(struct prio_flow_cached *c, __u32 gen,
				      const struct prio_flow_key *key, struct prio_flow *f)
{
	__builtin_memcpy(&c->key, key, sizeof(*key));
	c->bytes = f->bytes;
	c->last_seen = f->last_seen;
	c->last_change = f->last_change;
	c->unsynced = 0;
	c->backlog = f->backlog;
	c->classid = f->classid;
	c->gen = gen;
	c->band = f->band;
	c->occupancy = f->occupancy;
	c->source = f->source;
	c->trusted = f->trusted;
	c->packets = 1;
}

/* moved makes every CPU's copy of the flows in a slot stale after one of them changed band or
 * was made anew. *fill is the generation this CPU read before the table: its new copy may
 * carry the next one only if no other CPU bumped it since, else it is stale at once. */
static __always_inline void moved(__u32 *gen, __u32 *fill)
{
	if (gen && __sync_fetch_and_add(gen, 1) == *fill)
		(*fill)++;
}

/* fast_path classifies the packet from the CPU's copy of its flow and returns 1, or returns 0
 * (nothing counted or changed) for the table to take it. */
static __always_inline int fast_path(struct __sk_buff *skb, struct prio_flow_cached *c, __u32 gen,
				     const struct prio_flow_key *key, struct info *in, __u64 *now)
{
	int trusted = c->trusted && in->source != PRIO_SRC_NONE, capped = 0;
	int informed = c->source != PRIO_SRC_NONE;
	__u64 bytes = c->bytes + c->unsynced + skb->len, gap = ~0ULL;
	enum prio_stat why;

	if (!c->packets || c->packets >= PRIO_CACHE_SYNC || c->gen != gen ||
	    !same_key(&c->key, key))
		return 0;
	/* New information goes to the table, where it is the flow's latest: a copy could not
	 * tell whether another CPU's was newer. A sender repeats it until it changes (all the
	 * segments of a TSO packet, refreshes). */
	if (trusted &&
	    (in->source != c->source || in->backlog != c->backlog || in->occupancy != c->occupancy))
		return 0;
	if (scheme == PRIO_SCHEME_PIAS && idle_reset_ns &&
	    clock(now) - c->last_seen > idle_reset_ns)
		return 0; /* an idle reset */
	if (target_band(in, c->band, informed, bytes, trusted, &capped) != c->band) {
		if (move_gap_ns)
			gap = clock(now) - c->last_seen;
		if (!move_refused(informed, c->last_change, gap, now, &why))
			return 0; /* a move: the table's */
		fp_count(&prio_stats, why);
	}
	c->unsynced += skb->len;
	c->packets++;
	if (move_gap_ns || (scheme == PRIO_SCHEME_PIAS && idle_reset_ns))
		c->last_seen = clock(now);
	if (in->source != PRIO_SRC_NONE && !c->trusted)
		fp_count(&prio_stats, PRIO_STAT_UNTRUSTED);
	if (capped)
		fp_count(&prio_stats, PRIO_STAT_CAPPED);
	skb->priority = c->classid; /* not counted: parsed/no_option less table is the cache's */
	return 1;
}

static __always_inline int deflt(struct __sk_buff *skb, enum prio_stat why)
{
	fp_count(&prio_stats, why);
	skb->priority = classid(default_band, 0);
	return TCX_NEXT;
}

SEC("tc")
int prio_classify(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct hdr_cursor c = {.pos = data, .end = end};
	union key_words kw;
	struct prio_flow_key *key = &kw.k;
	struct info in = {.occupancy = PRIO_OCC_UNKNOWN};
	struct prio_flow *f;
	struct prio_flow_cached *cf = NULL;
	struct ethhdr *eth;
	__u64 now = 0, gap = ~0ULL;
	__u32 band, target, slot, ports, *gen = NULL, fill_gen = 0;
	int proto, frag = 0, informed, capped = 0;

	if (scheme == PRIO_SCHEME_FIFO) {
		fp_count(&prio_stats, PRIO_STAT_FIFO);
		skb->priority = classid(0, 0);
		return TCX_NEXT;
	}
	proto = parse_ethhdr(&c, &eth);
	if (proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *iph;

		proto = parse_iphdr(&c, &iph);
		if (proto < 0)
			return deflt(skb, PRIO_STAT_MALFORMED);
		frag = ip_is_fragment(iph);
		kw.w[0] = kw.w[2] = 0;
		kw.w[1] = V4MAPPED_WORD | (__u64)iph->saddr << 32;
		kw.w[3] = V4MAPPED_WORD | (__u64)iph->daddr << 32;
	} else if (proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6;
		const __u32 *a, *b;

		proto = parse_ipv6hdr(&c, &ip6, &frag);
		if (proto < 0)
			return deflt(skb, PRIO_STAT_MALFORMED);
		a = ip6->saddr.in6_u.u6_addr32;
		b = ip6->daddr.in6_u.u6_addr32;
		kw.w[0] = a[0] | (__u64)a[1] << 32;
		kw.w[1] = a[2] | (__u64)a[3] << 32;
		kw.w[2] = b[0] | (__u64)b[1] << 32;
		kw.w[3] = b[2] | (__u64)b[3] << 32;
	} else {
		return deflt(skb, proto < 0 ? PRIO_STAT_MALFORMED : PRIO_STAT_OTHER);
	}
	if (frag || (proto != IPPROTO_TCP && proto != IPPROTO_UDP && proto != IPPROTO_SCTP))
		return deflt(skb, PRIO_STAT_OTHER);
	if (proto == IPPROTO_TCP) {
		struct tcphdr *th = c.pos;
		int r;

		if ((void *)(th + 1) > end || th->doff < 5 || c.pos + th->doff * 4 > end)
			return deflt(skb, PRIO_STAT_MALFORMED);
		ports = *(__u32 *)th;
		r = usual_layout(th, end, &in);
		if (r < 0)
			r = prio_tcp_option(skb, (void *)(th + 1) - data,
					    th->doff * 4 - sizeof(*th), &in);
		if (r < 0)
			return deflt(skb, PRIO_STAT_MALFORMED);
	} else if (proto == IPPROTO_UDP) {
		struct udphdr *uh = c.pos;

		if ((void *)(uh + 1) > end)
			return deflt(skb, PRIO_STAT_MALFORMED);
		ports = *(__u32 *)uh;
	} else {
		/* SCTP: 12-byte common header, then the first chunk (type, flags, length). The
		 * original scheme put its 4-byte chunk 150 first, flags = occupancy %. */
		__u8 *sh = c.pos;

		if ((void *)(sh + 16) > end)
			return deflt(skb, PRIO_STAT_MALFORMED);
		ports = *(__u32 *)sh;
		if (sh[12] == PRIO_SCTP_CHUNK_TYPE) {
			if (sh[14] != 0 || sh[15] != 4)
				return deflt(skb, PRIO_STAT_MALFORMED);
			in.occupancy = sh[13];
			in.source = PRIO_SRC_SCTP_CHUNK;
		}
	}
	kw.w[4] = ports | (__u64)proto << 32; /* sport, dport, proto, pad */
	if (in.source == PRIO_SRC_TCP_OPTION)
		fp_count(&prio_stats, PRIO_STAT_PARSED);
	else if (in.source == PRIO_SRC_SCTP_CHUNK)
		fp_count(&prio_stats, PRIO_STAT_SCTP);
	else
		fp_count(&prio_stats, PRIO_STAT_NO_OPTION);

	if (cache_slots) {
		slot = cache_slot(key);
		cf = bpf_map_lookup_elem(&prio_cache, &slot);
		gen = bpf_map_lookup_elem(&prio_gen, &slot);
		if (!cf || !gen) {
			cf = NULL;
			gen = NULL;
		} else {
			/* read before the table: a move after this read stales the copy */
			fill_gen = *gen;
			if (fast_path(skb, cf, fill_gen, key, &in, &now))
				return TCX_NEXT;
		}
	}

	fp_count(&prio_stats, PRIO_STAT_TABLE);
	/* Whether a flow's source is trusted is looked up once, when the flow is new: its source
	 * address does not change, nor does prio_trust after loading. */
	f = bpf_map_lookup_elem(&prio_flows, key);
	int src_trusted = f ? f->trusted : is_trusted(key->saddr);

	/* What this CPU's copy did goes to the table before the table is used: the copy of this
	 * packet's flow, or of the flow it gives the slot up to this one. */
	if (cf)
		flush_slot(cf, key, f);
	/* this packet's information counts */
	int trusted = src_trusted && in.source != PRIO_SRC_NONE;

	if (in.source != PRIO_SRC_NONE && !src_trusted)
		fp_count(&prio_stats, PRIO_STAT_UNTRUSTED);
	if (!f) {
		struct prio_flow nf = {};

		nf.bytes = skb->len;
		nf.last_seen = nf.last_change = clock(&now);
		nf.occupancy = PRIO_OCC_UNKNOWN;
		nf.trusted = src_trusted;
		if (trusted) {
			nf.backlog = in.backlog;
			nf.occupancy = in.occupancy;
			nf.source = in.source;
		}
		if (scheme == PRIO_SCHEME_FAIR)
			nf.band = 0;
		else
			nf.band = band_of(&in, nf.bytes, trusted, &capped);
		if (capped)
			fp_count(&prio_stats, PRIO_STAT_CAPPED);
		capped = 0;
		nf.classid = classid(nf.band, next_leaf());
		if (bpf_map_update_elem(&prio_flows, key, &nf, BPF_NOEXIST) != 0) {
			/* another CPU made it a moment ago, or no room: classify this one packet */
			f = bpf_map_lookup_elem(&prio_flows, key);
			if (!f)
				return deflt(skb, PRIO_STAT_NO_STATE);
		} else {
			if (cf) {
				moved(gen, &fill_gen); /* copies of an earlier flow of this key */
				fill_slot(cf, fill_gen, key, &nf);
			}
			skb->priority = nf.classid;
			return TCX_NEXT;
		}
	}
	/* PIAS tags each message at its sender; a router sees only the connection, so an idle gap
	 * stands for a message boundary: a persistent connection starts its next message in band
	 * 0 instead of staying demoted for life. */
	if (scheme == PRIO_SCHEME_PIAS && idle_reset_ns &&
	    clock(&now) - f->last_seen > idle_reset_ns) {
		f->bytes = 0;
		if (f->band != 0)
			moved(gen, &fill_gen);
		f->band = 0;
		f->last_change = now;
		f->classid = classid(0, f->classid & 0xff);
		fp_count(&prio_stats, PRIO_STAT_IDLE_RESET);
	}
	/* Not atomic: a locked add is a full barrier on every packet. Two CPUs adding to one
	 * flow at once may lose a packet's bytes: a pias flow moves a packet late at worst. */
	f->bytes += skb->len;
	if (move_gap_ns || (scheme == PRIO_SCHEME_PIAS && idle_reset_ns)) {
		gap = clock(&now) - f->last_seen;
		f->last_seen = now;
	}
	informed = f->source != PRIO_SRC_NONE;
	if (trusted) {
		f->backlog = in.backlog;
		f->occupancy = in.occupancy;
		f->source = in.source;
	}
	band = f->band;
	target = target_band(&in, band, informed, f->bytes, trusted, &capped);
	if (capped)
		fp_count(&prio_stats, PRIO_STAT_CAPPED);
	if (target != band) {
		enum prio_stat why;

		/* A flow's first information moves it at once: only its handshake went through
		 * the default band, and a new connection must not wait out the interval there. */
		if (move_refused(informed, f->last_change, gap, &now, &why)) {
			fp_count(&prio_stats, why);
		} else {
			band = target;
			f->band = band;
			f->last_change = clock(&now);
			f->changes++;
			f->classid = classid(band, f->classid & 0xff);
			moved(gen, &fill_gen);
			fp_count(&prio_stats, PRIO_STAT_BAND_CHANGE);
		}
	}
	if (cf)
		fill_slot(cf, fill_gen, key, f);
	skb->priority = f->classid;
	return TCX_NEXT;
}

char _license[] SEC("license") = "Dual BSD/GPL";
