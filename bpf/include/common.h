/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* common.h: what every flowplane BPF program includes: kernel types (CO-RE), libbpf helpers,
 * and the #define constants vmlinux.h cannot carry. */
#ifndef FLOWPLANE_COMMON_H
#define FLOWPLANE_COMMON_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_core_read.h>

#define TC_ACT_UNSPEC	(-1)
#define TC_ACT_OK	0
#define TC_ACT_SHOT	2
#define TC_ACT_STOLEN	4
#define TC_ACT_REDIRECT 7

#define ETH_P_IP     0x0800
#define ETH_P_IPV6   0x86DD
#define ETH_P_ARP    0x0806
#define ETH_P_8021Q  0x8100
#define ETH_P_8021AD 0x88A8
#define ETH_ALEN     6

#define AF_INET	 2
#define AF_INET6 10

#define EEXIST 17 /* errno values BPF helpers return negated; vmlinux.h has no macros */

#define IPPROTO_ICMPV6_ 58 /* vmlinux.h has IPPROTO_* for v4 protocols only */

#ifndef likely
#define likely(x) __builtin_expect(!!(x), 1)
#endif
#ifndef unlikely
#define unlikely(x) __builtin_expect(!!(x), 0)
#endif

#endif
