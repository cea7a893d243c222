package prio

//go:generate go tool bpf2go -tags linux -target bpfel -cflags "-O2 -g -Wall -Werror -mcpu=v3" -type prio_selector -type prio_host_stat host ../../bpf/prio/host.bpf.c -- -I../../bpf/include
//go:generate go tool bpf2go -tags linux -target bpfel -cflags "-O2 -g -Wall -Werror -mcpu=v3" -type prio_flow_key -type prio_flow -type prio_flow_cached -type prio_lpm_key -type prio_stat -type prio_scheme -type prio_source -type prio_wire -type prio_limit classifier ../../bpf/prio/classifier.bpf.c -- -I../../bpf/include
