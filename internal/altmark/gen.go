package altmark

//go:generate go tool bpf2go -tags linux -target bpfel -cflags "-O2 -g -Wall -Werror -mcpu=v3" -type am_count_key -type am_count -type am_sample -type am_point -type am_point_key -type am_stat -type am_carrier -type am_dir -type am_limit -type am_kind probe ../../bpf/altmark/probe.bpf.c -- -I../../bpf/include
