package ctperf

//go:generate go tool bpf2go -tags linux -target bpfel -cflags "-O2 -g -Wall -Werror -mcpu=v3" -type ct_key -type ct_entry floor ../../../bpf/conntrack/floor.bpf.c -- -I../../../bpf/include
