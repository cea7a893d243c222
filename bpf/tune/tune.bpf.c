// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* tune.bpf.c: per-connection TCP tuning from a declarative policy. A sock_ops program on a
 * cgroup v2 picks the first rule whose prefixes (two LPM tries: remote and local address, each
 * answering "which rules contain this address" as a bit set), ports, direction and sample
 * select the connection, and applies the rule's profile at the callbacks where the kernel
 * accepts each setting. Every bpf_setsockopt result is counted per setting and errno. Policies
 * live in two generations; user space fills the idle one and flips tune_gen, so a re-apply
 * never detaches and never leaves a window with no policy. The program always returns 1. */
#include "common.h"
#include "stats.h"
#include "tune.h"

#define SOL_SOCKET	   1
#define SO_SNDBUF	   7
#define SO_RCVBUF	   8
#define SO_KEEPALIVE	   9
#define SO_PRIORITY	   12
#define SO_MARK		   36
#define SO_MAX_PACING_RATE 47
#define SOL_TCP		   6
#define TCP_NODELAY	   1
#define TCP_MAXSEG	   2
#define TCP_KEEPIDLE	   4
#define TCP_KEEPINTVL	   5
#define TCP_KEEPCNT	   6
#define TCP_WINDOW_CLAMP   10
#define TCP_CONGESTION	   13
#define TCP_USER_TIMEOUT   18
#define TCP_NOTSENT_LOWAT  25
#define TCP_RTO_MAX_MS	   44
#define SOL_IP		   0
#define IP_TOS		   1
#define SOL_IPV6	   41
#define IPV6_TCLASS	   67

/* Jiffies per second of the running kernel (CONFIG_HZ), set by the loader from the kernel's
 * config or, where there is none, by calibrating jiffies against the clock (never a constant). */
volatile const __u32 hz = 0;

/* key = 0, value = the callbacks the live policy needs, its generation and flags (tune.h) */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 1);
} tune_gen SEC(".maps");

/* key = gen * TUNE_MAX_RULES + rule, value = struct tune_rule */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct tune_rule);
	__uint(max_entries, 2 * TUNE_MAX_RULES);
} tune_rules SEC(".maps");

/* key = gen * TUNE_MAX_PROFILES + profile, value = struct tune_profile */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct tune_profile);
	__uint(max_entries, 2 * TUNE_MAX_PROFILES);
} tune_profiles SEC(".maps");

/* One trie per side: key = struct tune_lpm_key of the remote (local) address, value = struct
 * tune_ruleset of the rules whose remote (local) prefix contains it. */
#define TUNE_ADDR_TRIE(name)                                                                       \
	struct {                                                                                   \
		__uint(type, BPF_MAP_TYPE_LPM_TRIE);                                               \
		__type(key, struct tune_lpm_key);                                                  \
		__type(value, struct tune_ruleset);                                                \
		__uint(max_entries, 2 * (TUNE_MAX_RULES + 2));                                     \
		__uint(map_flags, BPF_F_NO_PREALLOC);                                              \
	} name SEC(".maps")

TUNE_ADDR_TRIE(tune_remote);
TUNE_ADDR_TRIE(tune_local);

/* key = gen * 2 + side (TUNE_SIDE_*), value = struct tune_side: the first bytes the side's
 * prefixes cover, and the rules without a prefix on that side, which are the rules of an
 * address no entry of the side's trie contains (the tries hold no /0 entries for them, so a
 * lookup walks only the nodes of real prefixes) */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct tune_side);
	__uint(max_entries, 4);
} tune_sides SEC(".maps");

/* key = (gen * TUNE_MAX_RULES + rule) * 2 + arm (0 treated, 1 sampled out), value = per-CPU
 * connection count */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 4 * TUNE_MAX_RULES);
} tune_hits SEC(".maps");

/* key = enum tune_stat, value = per-CPU count */
FP_COUNTERS(tune_stats, enum tune_stat, TUNE_STAT_MAX);

/* key = enum tune_setting, value = per-CPU count of settings the kernel accepted */
FP_COUNTERS(tune_applied, enum tune_setting, TUNE_SET_MAX);

/* key = struct tune_err_key (errno, setting), value = per-CPU count of kernel refusals */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__type(key, struct tune_err_key);
	__type(value, __u64);
	__uint(max_entries, 1024);
} tune_errors SEC(".maps");

/* socket storage: key = the socket, value = struct tune_sk (its reactive settings) */
struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct tune_sk);
} tune_sks SEC(".maps");

/* A connection as the rules see it; an IPv4-mapped IPv6 address counts as IPv4. */
struct flow {
	__u32 raddr[4];
	__u32 laddr[4];
	__u16 rport;
	__u16 lport;
	__u8 family; /* 4 or 6 */
	__u8 dir;    /* TUNE_DIR_* */
};

static __always_inline int is_v4mapped(const __u32 *a)
{
	return a[0] == 0 && a[1] == 0 && a[2] == bpf_htonl(0xffff);
}

static __always_inline void flow_of(struct bpf_sock_ops *s, struct flow *f, __u8 dir)
{
	__builtin_memset(f, 0, sizeof(*f));
	f->dir = dir;
	f->rport = bpf_ntohl(s->remote_port);
	f->lport = s->local_port;
	if (s->family == AF_INET) {
		f->family = 4;
		f->raddr[0] = s->remote_ip4;
		f->laddr[0] = s->local_ip4;
		return;
	}
	f->raddr[0] = s->remote_ip6[0];
	f->raddr[1] = s->remote_ip6[1];
	f->raddr[2] = s->remote_ip6[2];
	f->raddr[3] = s->remote_ip6[3];
	f->laddr[0] = s->local_ip6[0];
	f->laddr[1] = s->local_ip6[1];
	f->laddr[2] = s->local_ip6[2];
	f->laddr[3] = s->local_ip6[3];
	f->family = 6;
	if (is_v4mapped(f->raddr)) {
		f->family = 4;
		f->raddr[0] = f->raddr[3];
		f->laddr[0] = f->laddr[3];
		f->raddr[1] = f->raddr[2] = f->raddr[3] = 0;
		f->laddr[1] = f->laddr[2] = f->laddr[3] = 0;
	}
}

/* flow_hash mixes the 4-tuple (murmur3 steps and finalizer); Go's flowHash is the same. */
static __always_inline __u32 mix(__u32 h, __u32 w)
{
	w *= 0xcc9e2d51;
	w = (w << 15) | (w >> 17);
	w *= 0x1b873593;
	h ^= w;
	h = (h << 13) | (h >> 19);
	return h * 5 + 0xe6546b64;
}

static __always_inline __u32 flow_hash(const struct flow *f)
{
	__u32 h = 0x666c6f77; /* "flow" */

#pragma unroll
	for (int i = 0; i < 4; i++)
		h = mix(h, f->raddr[i]);
#pragma unroll
	for (int i = 0; i < 4; i++)
		h = mix(h, f->laddr[i]);
	h = mix(h, ((__u32)f->rport << 16) | f->lport);
	h ^= h >> 16;
	h *= 0x85ebca6b;
	h ^= h >> 13;
	h *= 0xc2b2ae35;
	h ^= h >> 16;
	return h;
}

/* de Bruijn table: the index of a 64-bit word's only set bit. */
static const __u8 debruijn[64] = {
    0,	1,  48, 2,  57, 49, 28, 3,  61, 58, 50, 42, 38, 29, 17, 4,  62, 55, 59, 36, 53, 51,
    43, 22, 45, 39, 33, 30, 24, 18, 12, 5,  63, 47, 56, 27, 60, 41, 37, 16, 54, 35, 52, 21,
    44, 32, 23, 11, 46, 26, 40, 15, 34, 20, 31, 10, 25, 14, 19, 9,  13, 8,  7,	6,
};

static __always_inline int rule_selects(const struct tune_rule *r, const struct flow *f)
{
	return (r->dir & f->dir) && f->rport >= r->rport_lo && f->rport <= r->rport_hi &&
	       f->lport >= r->lport_lo && f->lport <= r->lport_hi;
}

/* can_loop is true until the loop budget the verifier gives the program runs out: the may_goto
 * instruction (Linux >= 6.9; written as bytes so that clang 14 assembles it). The verifier
 * checks a loop it guards until its states converge, as for an open-coded iterator, and at run
 * time it costs a decrement of a stack counter instead of a kfunc call per iteration. */
#define can_loop                                                                                   \
	({                                                                                         \
		__label__ l_break, l_continue;                                                     \
		int ok = 1;                                                                        \
		asm volatile goto(                                                                 \
		    "1: .byte 0xe5; .byte 0;"                                                      \
		    ".long ((%l[l_break] - 1b - 8) / 8) & 0xffff; .short 0" :: ::l_break);         \
		goto l_continue;                                                                   \
	l_break:                                                                                   \
		ok = 0;                                                                            \
	l_continue:                                                                                \
		ok;                                                                                \
	})

/* lowest_bit is the index of the lowest set bit of x (x != 0). */
static __always_inline __u32 lowest_bit(__u64 x)
{
	return debruijn[((x & -x) * 0x03f79d71b4ca8b09ULL) >> 58];
}

/* scan returns the index of the first rule in both sets that also selects the flow's ports and
 * direction, or -1. Only the words both sets mark in nz are visited. A global function: the
 * verifier checks it once, and it runs only when the sets do not start with one rule that
 * selects the flow (see match). */
__noinline int scan(const struct tune_ruleset *rs, const struct tune_ruleset *ls,
		    const struct flow *f, __u32 base)
{
	__u64 nz, bits = 0;
	__u32 i = 0;

	if (!rs || !ls || !f)
		return -1;
	nz = rs->nz & ls->nz;
	while (can_loop) {
		struct tune_rule *r;
		__u32 n, key;

		if (!bits) {
			if (!nz)
				return -1;
			i = lowest_bit(nz) & (TUNE_WORDS - 1);
			nz &= nz - 1;
			bits = rs->w[i] & ls->w[i];
			continue;
		}
		n = i * 64 + lowest_bit(bits);
		bits &= bits - 1;
		key = base + n;
		r = bpf_map_lookup_elem(&tune_rules, &key);
		if (r && rule_selects(r, f))
			return n;
	}
	return -1;
}

static __always_inline void lpm_key(struct tune_lpm_key *k, __u32 gen, const struct flow *f,
				    const __u32 *addr)
{
	__builtin_memset(k, 0, sizeof(*k));
	k->prefixlen = 16 + (f->family == 4 ? 32 : 128);
	k->gen = gen;
	k->family = f->family;
	__builtin_memcpy(k->addr, addr, 16);
}

/* rules_of returns the rules of one side whose prefix contains addr: the longest entry of the
 * side's trie that contains it, or, when none does, the side's rules without a prefix. An
 * address whose first byte no prefix covers skips the trie (a lookup is a call, dear on hosts
 * with return-stack mitigations). */
static __always_inline struct tune_ruleset *rules_of(void *trie, __u32 side, __u32 g,
						     const struct flow *f, const __u32 *addr)
{
	struct tune_ruleset *rs;
	struct tune_lpm_key k;
	struct tune_side *sd;
	__u32 key = g * 2 + side;
	__u8 first = *(const __u8 *)addr;

	sd = bpf_map_lookup_elem(&tune_sides, &key);
	if (!sd)
		return NULL;
	if (!((sd->octets[f->family == 6][first >> 6] >> (first & 63)) & 1))
		return &sd->any;
	lpm_key(&k, g, f, addr);
	rs = bpf_map_lookup_elem(trie, &k);
	return rs ? rs : &sd->any;
}

/* match finds the connection's rule in the generation of gen (the tune_gen word, read once per
 * program run by the caller, so every table it reads belongs to one policy). It returns the
 * profile (or NULL: no rule, or sampled out) and sets *rule_key to the rule's absolute index
 * (-1 without one) and *arm to the arm. A side no rule constrains (TUNE_*_ANY) is not looked
 * up: the other side's set is the intersection. When both sets start with the same rule and it
 * selects the flow's ports and direction, that rule is the answer without a scan (the common
 * case: a rule with no ports, or a policy matching on one side only). */
static __always_inline struct tune_profile *match(const struct flow *f, __u32 gen, __s32 *rule_key,
						  __u32 *arm)
{
	struct tune_ruleset *remote = NULL, *local = NULL;
	__u32 g = gen >> TUNE_GEN_SHIFT, key;
	struct tune_rule *r;
	__s32 n;

	*rule_key = -1;
	*arm = 0;
	if (!(gen & TUNE_REMOTE_ANY)) {
		remote = rules_of(&tune_remote, TUNE_SIDE_REMOTE, g, f, f->raddr);
		if (!remote)
			return NULL;
	}
	if (!(gen & TUNE_LOCAL_ANY)) {
		local = rules_of(&tune_local, TUNE_SIDE_LOCAL, g, f, f->laddr);
		if (!local)
			return NULL;
	}
	if (!remote && !local) {
		/* no rule has a prefix: every rule of the generation */
		struct tune_side *sd;

		key = g * 2 + TUNE_SIDE_REMOTE;
		sd = bpf_map_lookup_elem(&tune_sides, &key);
		if (!sd)
			return NULL;
		remote = &sd->any;
	}
	if (!remote)
		remote = local;
	if (!local)
		local = remote;
	/* an empty set on either side: no rule contains the address, nothing to scan */
	if (remote->first < 0 || local->first < 0)
		return NULL;
	n = remote->first;
	r = NULL;
	if (n == local->first) {
		key = g * TUNE_MAX_RULES + (n & (TUNE_MAX_RULES - 1));
		r = bpf_map_lookup_elem(&tune_rules, &key);
		if (r && !rule_selects(r, f))
			r = NULL;
	}
	if (!r) {
		n = scan(remote, local, f, g * TUNE_MAX_RULES);
		if (n < 0)
			return NULL;
		key = g * TUNE_MAX_RULES + (n & (TUNE_MAX_RULES - 1));
		r = bpf_map_lookup_elem(&tune_rules, &key);
		if (!r)
			return NULL;
	}
	*rule_key = key;
	if (r->sample < (1ULL << 32) && (__u64)flow_hash(f) >= r->sample) {
		*arm = 1;
		return NULL;
	}
	key = g * TUNE_MAX_PROFILES + (r->profile & (TUNE_MAX_PROFILES - 1));
	return bpf_map_lookup_elem(&tune_profiles, &key);
}

static __always_inline void count_hit(__s32 rule_key, __u32 arm)
{
	if (rule_key < 0) {
		fp_count(&tune_stats, TUNE_STAT_UNMATCHED);
		return;
	}
	fp_count(&tune_stats, arm ? TUNE_STAT_SAMPLED_OUT : TUNE_STAT_MATCHED);
	fp_count(&tune_hits, (__u32)rule_key * 2 + arm);
}

static __always_inline void result(enum tune_setting which, long err)
{
	struct tune_err_key k = {.err = err, .setting = which};
	__u64 one = 1, *v;

	if (err == 0) {
		fp_count(&tune_applied, which);
		return;
	}
	v = bpf_map_lookup_elem(&tune_errors, &k);
	if (v)
		*v += 1;
	else
		bpf_map_update_elem(&tune_errors, &k, &one, BPF_NOEXIST);
}

static __always_inline int has(const struct tune_profile *p, enum tune_setting which)
{
	return p->set & (1U << which);
}

static __always_inline void set_int(struct bpf_sock_ops *s, int level, int opt, int val,
				    enum tune_setting which)
{
	result(which, bpf_setsockopt(s, level, opt, &val, sizeof(val)));
}

static __always_inline void set_cc(struct bpf_sock_ops *s, const char *name,
				   enum tune_setting which)
{
	char cc[TUNE_CC_LEN];

	__builtin_memcpy(cc, name, TUNE_CC_LEN);
	cc[TUNE_CC_LEN - 1] = 0;
	result(which, bpf_setsockopt(s, SOL_TCP, TCP_CONGESTION, cc, sizeof(cc)));
}

/* apply_socket applies what must precede the SYN on an active open (buffers, MSS, congestion
 * control); a passive open gets them once established. A global function: the verifier checks
 * it once, not at every call site. */
__noinline int apply_socket(struct bpf_sock_ops *s, const struct tune_profile *p)
{
	if (!p)
		return 0;
	if (has(p, TUNE_SET_CONGESTION))
		set_cc(s, p->congestion, TUNE_SET_CONGESTION);
	if (has(p, TUNE_SET_SNDBUF))
		set_int(s, SOL_SOCKET, SO_SNDBUF, p->snd_buf, TUNE_SET_SNDBUF);
	if (has(p, TUNE_SET_RCVBUF))
		set_int(s, SOL_SOCKET, SO_RCVBUF, p->rcv_buf, TUNE_SET_RCVBUF);
	if (has(p, TUNE_SET_MSS))
		set_int(s, SOL_TCP, TCP_MAXSEG, p->mss, TUNE_SET_MSS);
	if (has(p, TUNE_SET_WINDOW_CLAMP))
		set_int(s, SOL_TCP, TCP_WINDOW_CLAMP, p->window_clamp, TUNE_SET_WINDOW_CLAMP);
	if (has(p, TUNE_SET_PACING))
		set_int(s, SOL_SOCKET, SO_MAX_PACING_RATE, p->max_pacing_rate, TUNE_SET_PACING);
	if (has(p, TUNE_SET_MARK))
		set_int(s, SOL_SOCKET, SO_MARK, p->mark, TUNE_SET_MARK);
	if (has(p, TUNE_SET_PRIORITY))
		set_int(s, SOL_SOCKET, SO_PRIORITY, p->priority, TUNE_SET_PRIORITY);
	if (has(p, TUNE_SET_TOS)) {
		if (s->family == AF_INET)
			set_int(s, SOL_IP, IP_TOS, p->tos, TUNE_SET_TOS);
		else
			set_int(s, SOL_IPV6, IPV6_TCLASS, p->tos, TUNE_SET_TOS);
	}
	if (has(p, TUNE_SET_NOTSENT_LOWAT))
		set_int(s, SOL_TCP, TCP_NOTSENT_LOWAT, p->notsent_lowat, TUNE_SET_NOTSENT_LOWAT);
	if (has(p, TUNE_SET_NODELAY))
		set_int(s, SOL_TCP, TCP_NODELAY, p->nodelay, TUNE_SET_NODELAY);
	if (has(p, TUNE_SET_KEEPALIVE))
		set_int(s, SOL_SOCKET, SO_KEEPALIVE, 1, TUNE_SET_KEEPALIVE);
	if (has(p, TUNE_SET_KEEPIDLE))
		set_int(s, SOL_TCP, TCP_KEEPIDLE, p->keep_idle, TUNE_SET_KEEPIDLE);
	if (has(p, TUNE_SET_KEEPINTVL))
		set_int(s, SOL_TCP, TCP_KEEPINTVL, p->keep_intvl, TUNE_SET_KEEPINTVL);
	if (has(p, TUNE_SET_KEEPCNT))
		set_int(s, SOL_TCP, TCP_KEEPCNT, p->keep_cnt, TUNE_SET_KEEPCNT);
	if (has(p, TUNE_SET_USER_TIMEOUT))
		set_int(s, SOL_TCP, TCP_USER_TIMEOUT, p->user_timeout_ms, TUNE_SET_USER_TIMEOUT);
	if (has(p, TUNE_SET_RTO_MAX))
		set_int(s, SOL_TCP, TCP_RTO_MAX_MS, p->rto_max_ms, TUNE_SET_RTO_MAX);
	return 0;
}

/* apply_established applies what the kernel takes only on an established connection. Inlined:
 * its one call site runs on every tuned connection, and a call is dear on hosts with
 * return-stack mitigations. */
static __always_inline void apply_established(struct bpf_sock_ops *s, const struct tune_profile *p)
{
	if (has(p, TUNE_SET_INIT_CWND)) {
		/* TCP_BPF_IW only sets snd_cwnd (accepted while no data has been sent): when it
		 * already holds the value, the call would succeed and change nothing, so count it
		 * as applied without making it */
		if (s->snd_cwnd == p->init_cwnd && s->data_segs_out == 0)
			fp_count(&tune_applied, TUNE_SET_INIT_CWND);
		else
			set_int(s, SOL_TCP, TCP_BPF_IW, p->init_cwnd, TUNE_SET_INIT_CWND);
	}
	if (has(p, TUNE_SET_CWND_CLAMP))
		set_int(s, SOL_TCP, TCP_BPF_SNDCWND_CLAMP, p->cwnd_clamp, TUNE_SET_CWND_CLAMP);
	if (has(p, TUNE_SET_RTO_MIN))
		set_int(s, SOL_TCP, TCP_BPF_RTO_MIN, p->rto_min_us, TUNE_SET_RTO_MIN);
	if (has(p, TUNE_SET_DELACK_MAX))
		set_int(s, SOL_TCP, TCP_BPF_DELACK_MAX, p->delack_max_us, TUNE_SET_DELACK_MAX);
	if (p->react_on) {
		__u32 flags = s->bpf_sock_ops_cb_flags;

		if (p->react_on & TUNE_REACT_RETRANS)
			flags |= BPF_SOCK_OPS_RETRANS_CB_FLAG;
		if (p->react_on & TUNE_REACT_RTO)
			flags |= BPF_SOCK_OPS_RTO_CB_FLAG;
		result(TUNE_SET_REACT_CALLBACKS, bpf_sock_ops_cb_flags_set(s, flags));
	}
}

/* remember copies a reactive connection's reactive settings into its socket storage for its
 * RETRANS / RTO callbacks. Other connections store nothing: matching again is cheaper than
 * socket storage. */
static __always_inline void remember(struct bpf_sock_ops *s, const struct tune_profile *p)
{
	struct bpf_sock *sk = s->sk;
	struct tune_sk *ts;

	if (!sk || !p->react_on)
		return;
	ts = bpf_sk_storage_get(&tune_sks, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!ts) {
		fp_count(&tune_stats, TUNE_STAT_NO_STORAGE);
		return;
	}
	__builtin_memcpy(ts->congestion, p->react_congestion, TUNE_CC_LEN);
	ts->set = p->set;
	ts->retrans = p->react_retrans;
	ts->rtos = p->react_rtos;
	ts->cwnd_clamp = p->react_cwnd_clamp;
	ts->on = p->react_on;
	ts->reacted = 0;
}

/* react applies a connection's reactive settings once, when a trigger it enabled passes its
 * threshold; then it stops the connection's callbacks. */
static __always_inline void react(struct bpf_sock_ops *s, __u32 trigger, __u32 count)
{
	struct bpf_sock *sk = s->sk;
	struct tune_sk *ts;

	if (!sk)
		return;
	ts = bpf_sk_storage_get(&tune_sks, sk, 0, 0);
	if (!ts || ts->reacted || !(ts->on & trigger))
		return;
	if (count <= (trigger == TUNE_REACT_RTO ? ts->rtos : ts->retrans))
		return;
	ts->reacted = 1;
	fp_count(&tune_stats, TUNE_STAT_REACTED);
	if (ts->set & (1U << TUNE_SET_REACT_CONGESTION))
		set_cc(s, ts->congestion, TUNE_SET_REACT_CONGESTION);
	if (ts->set & (1U << TUNE_SET_REACT_CWND_CLAMP))
		set_int(s, SOL_TCP, TCP_BPF_SNDCWND_CLAMP, ts->cwnd_clamp,
			TUNE_SET_REACT_CWND_CLAMP);
	result(
	    TUNE_SET_REACT_CALLBACKS,
	    bpf_sock_ops_cb_flags_set(s, s->bpf_sock_ops_cb_flags & ~(BPF_SOCK_OPS_RETRANS_CB_FLAG |
								      BPF_SOCK_OPS_RTO_CB_FLAG)));
}

SEC("sockops")
int tune_sockops(struct bpf_sock_ops *s)
{
	__u32 op = s->op, dir = TUNE_DIR_ACTIVE, arm, zero = 0, gen;
	struct tune_profile *p;
	struct flow f;
	__s32 rule_key;
	__u32 *g;

	/* One read of tune_gen per run: the callbacks it names and every table this run reads
	 * belong to the same generation, whatever user space flips meanwhile. */
	g = bpf_map_lookup_elem(&tune_gen, &zero);
	if (!g)
		return 1;
	gen = *(volatile __u32 *)g;
	/* A callback the live policy does not need returns first thing: most runs of a
	 * connection (a connection is counted once established, so TCP_CONNECT_CB is needed only
	 * for socket options, set before the SYN). */
	if (op >= TUNE_OP_BITS || !(gen & (1U << op)))
		return 1;
	switch (op) {
	case BPF_SOCK_OPS_RETRANS_CB:
		/* __tcp_retransmit_skb adds this retransmission's segments (args[1]) to
		 * total_retrans before the callback: adding args[1] again would count them twice */
		fp_count(&tune_stats, TUNE_STAT_RETRANS_CB);
		react(s, TUNE_REACT_RETRANS, s->total_retrans);
		return 1;
	case BPF_SOCK_OPS_RTO_CB:
		/* args[0] counts the earlier consecutive timeouts; this one makes one more */
		fp_count(&tune_stats, TUNE_STAT_RTO_CB);
		react(s, TUNE_REACT_RTO, s->args[0] + 1);
		return 1;
	case BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB:
		dir = TUNE_DIR_PASSIVE;
		break;
	case BPF_SOCK_OPS_TIMEOUT_INIT:
	case BPF_SOCK_OPS_RWND_INIT:
	case BPF_SOCK_OPS_NEEDS_ECN:
		/* before the connection exists: the socket of an active open, or the request
		 * socket of a passive one */
		if (!s->is_fullsock)
			dir = TUNE_DIR_PASSIVE;
		break;
	}
	flow_of(s, &f, dir);
	p = match(&f, gen, &rule_key, &arm);
	if (op == BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB || op == BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB) {
		fp_count(&tune_stats,
			 dir == TUNE_DIR_ACTIVE ? TUNE_STAT_ACTIVE : TUNE_STAT_PASSIVE);
		count_hit(rule_key, arm);
	}
	if (!p)
		return 1;

	switch (op) {
	case BPF_SOCK_OPS_TCP_CONNECT_CB:
		if (p->set & TUNE_SOCKET_SETTINGS)
			apply_socket(s, p);
		break;
	case BPF_SOCK_OPS_TIMEOUT_INIT:
		if (has(p, TUNE_SET_SYN_RTO)) {
			s->reply = ((__u64)p->syn_rto_ms * hz + 999) / 1000;
			fp_count(&tune_applied, TUNE_SET_SYN_RTO);
		}
		break;
	case BPF_SOCK_OPS_RWND_INIT:
		if (has(p, TUNE_SET_INIT_RWND)) {
			s->reply = p->init_rwnd;
			fp_count(&tune_applied, TUNE_SET_INIT_RWND);
		}
		break;
	case BPF_SOCK_OPS_NEEDS_ECN:
		if (has(p, TUNE_SET_ECN)) {
			s->reply = 1;
			fp_count(&tune_applied, TUNE_SET_ECN);
		}
		break;
	default: /* established, either direction */
		/* the profile's set word says which calls have work to do (each costs a call) */
		if (has(p, TUNE_SET_REACT_CALLBACKS))
			remember(s, p);
		if (dir == TUNE_DIR_PASSIVE && (p->set & TUNE_SOCKET_SETTINGS))
			apply_socket(s, p);
		if (p->set & TUNE_ESTABLISHED_SETTINGS)
			apply_established(s, p);
		break;
	}
	return 1;
}

char _license[] SEC("license") = "Dual BSD/GPL";
