package tune

//go:generate go tool bpf2go -tags linux -target bpfel -cflags "-O2 -g -Wall -Werror -mcpu=v3" -type tune_profile -type tune_rule -type tune_lpm_key -type tune_ruleset -type tune_side -type tune_err_key -type tune_sk -type tune_stat -type tune_setting tune ../../bpf/tune/tune.bpf.c -- -I../../bpf/include
