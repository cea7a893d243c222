# flowplane — `make help` lists the targets.
SHELL := /bin/bash
GO ?= go
BIN := bin/flowplane
VMLINUX := bpf/include/vmlinux.h
BPF_SRC := $(shell find bpf -name '*.bpf.c' -o -name '*.h' ! -name vmlinux.h)
GO_SRC := $(shell find cmd internal -name '*.go' ! -name '*_bpfel.go' 2>/dev/null)
# Each line of the test run's output goes to the terminal; the whole log also to this file.
TEST_FLAGS ?= -count=1 -timeout 40m

.PHONY: help setup generate build test bench lint demo clean

help: ## list the targets
	@grep -E '^[a-z]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

setup: ## install what a fresh Debian 12 machine lacks (idempotent)
	@scripts/setup.sh

$(VMLINUX):
	bpftool btf dump file /sys/kernel/btf/vmlinux format c > $@.tmp && mv $@.tmp $@

# bpf2go compiles every *.bpf.c into Go bindings (not committed); rerun when any BPF source changes.
.gen.stamp: $(VMLINUX) $(BPF_SRC)
	$(GO) generate ./...
	@touch $@

generate: .gen.stamp ## compile the BPF programs and their Go bindings

build: .gen.stamp ## build bin/flowplane
	$(GO) build -o $(BIN) ./cmd/flowplane

test: setup build ## run every test, privileged ones included (needs root)
	$(GO) vet ./...
	$(GO) test $(TEST_FLAGS) ./...
	analytics/.venv/bin/python -m pytest analytics/tests

bench: setup build ## run the benchmarks (BENCH=a,b: some); JSON under bench/results/, docs/benchmarks.md
	@bench/run.sh

lint: setup generate ## gofmt, go vet, staticcheck, clang-format
	@test -z "$$(gofmt -l cmd internal bench)" || { gofmt -l cmd internal bench; echo 'gofmt: run gofmt -w on the files above'; exit 1; }
	$(GO) vet ./...
	$(GO) tool staticcheck ./...
	analytics/.venv/bin/ruff check analytics bench/analytics
	analytics/.venv/bin/ruff format --check analytics bench/analytics
	clang-format --dry-run --Werror $$(find bpf -name '*.c' -o -name '*.h' | grep -v vmlinux.h)
	@# One BPF flag set: every bpf2go line carries the same -cflags.
	@test "$$(grep -ho -- '-cflags "[^"]*"' internal/*/*gen.go | sort -u | wc -l)" = 1 || { grep -H -- '-cflags' internal/*/*gen.go; echo 'lint: the go:generate lines differ in -cflags; use one set'; exit 1; }

demo: setup build ## run the main job: a lab, iperf3 through it, the figures, teardown
	@examples/demo.sh

clean: ## remove build outputs and running labs
	-@[ -x $(BIN) ] && $(BIN) lab down --all 2>/dev/null; true
	rm -rf bin .gen.stamp $(VMLINUX) bench/results
	find internal -name '*_bpfel.go' -delete -o -name '*_bpfel.o' -delete
