package altmark

// The marker's bindings (the probe's are in gen.go); the same -cflags as every bpf2go line.
//go:generate go tool bpf2go -tags linux -target bpfel -cflags "-O2 -g -Wall -Werror -mcpu=v3" -type mark_flow_key -type mark_flow -type mark_lpm_key -type mark_reason -type am_carrier marker ../../bpf/altmark/marker.bpf.c -- -I../../bpf/include
