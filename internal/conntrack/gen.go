// Package conntrack is flowplane's XDP (or tcx) connection-tracking forwarder: the loader and
// sweeper (run), the table readers (list, stats, flush, events) and the metrics of
// bpf/conntrack.
package conntrack

//go:generate go tool bpf2go -tags linux -target bpfel -cflags "-O2 -g -Wall -Werror -mcpu=v3" -type ct_key -type ct_entry -type ct_tcp_dir -type ct_config -type ct_stat -type ct_tcp_state -type ct_tcp_flag -type ct_timeout -type ct_role -type ct_event -type ct_event_type -type ct_port_key -type ct_lpm_key -type ct_sweep_batch ct ../../bpf/conntrack/conntrack.bpf.c -- -I../../bpf/include
//go:generate go tool bpf2go -tags linux -target bpfel -cflags "-O2 -g -Wall -Werror -mcpu=v3" ctTc ../../bpf/conntrack/conntrack.bpf.c -- -I../../bpf/include -DCT_HOOK_TC
