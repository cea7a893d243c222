// Package xdpgen is a packet generator and counter for benchmarks in the lab. Send transmits a
// template Ethernet frame many times from an interface with BPF_PROG_TEST_RUN in XDP live-frames
// mode (the kernel runs bpf/xdpgen/xdpgen.bpf.c once per frame and transmits what it
// redirects: no socket, no skb, no qdisc on the sending side), optionally rotating source ports,
// source addresses and TCP sequence numbers, at full speed or at a fixed rate. A Sink counts and
// drops one port's packets in XDP on the receiving interface (bpf/xdpgen/sink.bpf.c).
//
// Frames redirected into a veth reach its peer only if the peer runs NAPI: an XDP program on
// the peer (a Sink, a router's XDP forwarder) or GRO enabled on it (ethtool -K PEER gro on).
// Without either the kernel drops them silently.
package xdpgen

//go:generate go tool bpf2go -tags linux -target bpfel -cflags "-O2 -g -Wall -Werror -mcpu=v3" -type xdpgen_stat xdpgen ../../bpf/xdpgen/xdpgen.bpf.c -- -I../../bpf/include
//go:generate go tool bpf2go -tags linux -target bpfel -cflags "-O2 -g -Wall -Werror -mcpu=v3" -type sink_stat sink ../../bpf/xdpgen/sink.bpf.c -- -I../../bpf/include
