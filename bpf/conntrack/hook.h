/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* hook.h: what differs between the XDP and the tc build of conntrack.bpf.c. */
#ifndef FLOWPLANE_CT_HOOK_H
#define FLOWPLANE_CT_HOOK_H

#include "common.h"

/* One source, two programs: the XDP build (default) and, with -DCT_HOOK_TC, a tcx ingress
 * program that runs on the skb after GRO (docs/conntrack.md, "Hooks"). These macros are all
 * that differs between the two contexts. */
#ifdef CT_HOOK_TC
#define CT_CTX		struct __sk_buff
#define CT_PASS		TC_ACT_OK
#define CT_DROP		TC_ACT_SHOT
#define CT_REDIRECT	TC_ACT_REDIRECT
#define ct_load_bytes	bpf_skb_load_bytes
#define CT_SEC		"tc"
#define CT_TC_ICMP_PULL 256 /* linear bytes wanted after an ICMP header (quoted packet) */
#else
#define CT_CTX	      struct xdp_md
#define CT_PASS	      XDP_PASS
#define CT_DROP	      XDP_DROP
#define CT_REDIRECT   XDP_REDIRECT
#define ct_load_bytes bpf_xdp_load_bytes
#define CT_SEC	      "xdp"
#endif
#define CT_INGRESS(ctx) ((ctx)->ingress_ifindex)

#endif
