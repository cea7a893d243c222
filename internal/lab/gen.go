package lab

//go:generate go tool bpf2go -tags linux -target bpfel -cflags "-O2 -g -Wall -Werror -mcpu=v3" -type loss_stat loss ../../bpf/lab/loss.bpf.c -- -I../../bpf/include
