# flowplane — `make help` lists the targets.
SHELL := /bin/bash
GO ?= go
BIN := bin/flowplane
VMLINUX := bpf/include/vmlinux.h
BPF_SRC := $(shell find bpf -name '*.bpf.c' -o -name '*.h' ! -name vmlinux.h)
GO_SRC := $(shell find cmd internal -name '*.go' ! -name '*_bpfel.go' 2>/dev/null)
# Each line of the test run's output goes to the terminal; the whole log also to this file.
TEST_FLAGS ?= -count=1 -timeout 40m

.PHONY: help setup vmlinux generate check-generated build release test bench difftest fuzz lint demo clean

help: ## list the targets
	@grep -E '^[a-z]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

setup: ## install what a fresh Debian 12 machine lacks (idempotent)
	@scripts/setup.sh

# vmlinux.h (the kernel's types, for CO-RE) and bpf2go's outputs (*_bpfel.go, *_bpfel.o) are
# committed, so `go install` builds without clang; `make generate` remakes the outputs from the
# C sources and `make test` fails when they differ from what is committed (docs/release.md).
vmlinux: ## refresh bpf/include/vmlinux.h from the running kernel's BTF
	bpftool btf dump file /sys/kernel/btf/vmlinux format c > $(VMLINUX).tmp && mv $(VMLINUX).tmp $(VMLINUX)

# Rerun bpf2go when any BPF source changes.
.gen.stamp: $(VMLINUX) $(BPF_SRC)
	$(GO) generate ./...
	@touch $@

generate: .gen.stamp ## compile the BPF programs into their Go bindings (committed)

check-generated: .gen.stamp ## fail when bpf2go's committed outputs differ from the C sources
	@git diff --quiet -- '*_bpfel.go' '*_bpfel.o' && test -z "$$(git ls-files --others --exclude-standard -- '*_bpfel.go' '*_bpfel.o')" || { git status --short -- '*_bpfel.go' '*_bpfel.o'; echo 'check-generated: the BPF bindings are not what the C sources compile to: run make generate and commit them'; exit 1; }

# The version, commit and commit date `flowplane version` prints (docs/release.md): from git.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null)
DATE ?= $(shell TZ=UTC0 git log -1 --format=%cd --date=format-local:%Y-%m-%dT%H:%M:%SZ 2>/dev/null)
LDFLAGS := -X github.com/flowplane/flowplane/internal/version.Version=$(VERSION) \
	-X github.com/flowplane/flowplane/internal/version.Commit=$(COMMIT) \
	-X github.com/flowplane/flowplane/internal/version.Date=$(DATE)

build: .gen.stamp ## build bin/flowplane
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/flowplane

# dist/: the tarballs of the static binary (amd64, arm64) with man pages and completions, the
# analytics' wheel and sdist, SHA256SUMS; byte-identical for one commit (docs/release.md).
release: setup check-generated ## write dist/: binary tarballs, analytics wheel and sdist, SHA256SUMS
	$(GO) run ./scripts/release -out dist -version '$(VERSION)' -commit '$(COMMIT)' -date '$(DATE)'

# The release smoke test and the reproducibility check (scripts/release) read the dist/ built
# here and write their step times to bin/release-test.log, printed at the end. They run after
# the other packages, not beside them: their pip install and Go builds would load the CPU under
# the timing-sensitive lab tests (2 cores).
test: setup build check-generated release ## run every test, privileged ones included (needs root)
	$(GO) vet ./...
	$(GO) test $(TEST_FLAGS) $$($(GO) list ./... | grep -v '/scripts/release$$')
	@rm -f bin/release-test.log
	FLOWPLANE_DIST=$(CURDIR)/dist FLOWPLANE_RELEASE_LOG=$(CURDIR)/bin/release-test.log $(GO) test $(TEST_FLAGS) ./scripts/release
	@if [ -f bin/release-test.log ]; then cat bin/release-test.log; fi
	analytics/.venv/bin/python -m pytest --durations=10 analytics/tests

bench: setup build ## run the benchmarks (BENCH=a,b: some); JSON under bench/results/, docs/benchmarks.md
	@bench/run.sh

# conntrack against nf_conntrack on random conversations (docs/conntrack.md#random-differential):
# for DIFFTIME from DIFFSEED (default: a random seed, printed); DIFFTIME=0 DIFFSEED=N reruns
# the one sequence N. The summary goes to bin/difftest.json.
DIFFTIME ?= 5m
difftest: build ## conntrack against nf_conntrack on random conversations for DIFFTIME (needs root)
	@mkdir -p bin
	DIFFTIME=$(DIFFTIME) DIFFSEED=$(DIFFSEED) DIFFJSON=$(CURDIR)/bin/difftest.json \
		$(GO) test -count=1 -v -timeout 0 -run '^TestDifferentialRandom$$' ./internal/conntrack

# Coverage-guided fuzzing (docs/architecture.md, "Fuzzing"): every Fuzz* target under internal/
# (the BPF programs' and the parsers') whose name matches the regexp FUZZ, FUZZTIME each (go test
# runs one target per -fuzz), with FUZZPARALLEL workers, minimizing each new input for at most
# FUZZMINIMIZETIME (go's default, 60s, would take most of a short run's time on the slower
# targets). A failing input is written to the package's testdata/fuzz/<target>/ and fails the
# run; commit it with the fix. `make test` runs the seeds and that corpus only.
FUZZ ?= .
FUZZTIME ?= 30s
FUZZPARALLEL ?= 1
FUZZMINIMIZETIME ?= 5s
fuzz: .gen.stamp ## fuzz every target (FUZZ=regexp: some) for FUZZTIME each (default 30s; root)
	@set -e; for pkg in $$(grep -l '^func Fuzz' $$(find internal -name '*_test.go') | xargs -n1 dirname | sort -u); do \
		list=$$($(GO) test -list '^Fuzz' ./$$pkg); \
		for target in $$(echo "$$list" | grep '^Fuzz' | grep -E '$(FUZZ)'); do \
			echo "== $$target (./$$pkg, $(FUZZTIME))"; \
			$(GO) test -run '^$$' -fuzz "^$$target\$$" -fuzztime $(FUZZTIME) \
				-fuzzminimizetime $(FUZZMINIMIZETIME) -parallel $(FUZZPARALLEL) ./$$pkg; \
		done; \
	done

lint: setup generate ## gofmt, go vet, staticcheck, clang-format
	@test -z "$$(gofmt -l cmd internal bench scripts)" || { gofmt -l cmd internal bench scripts; echo 'gofmt: run gofmt -w on the files above'; exit 1; }
	$(GO) vet ./...
	$(GO) tool staticcheck ./...
	analytics/.venv/bin/ruff check analytics bench/analytics scripts
	analytics/.venv/bin/ruff format --check analytics bench/analytics scripts
	clang-format --dry-run --Werror $$(find bpf -name '*.c' -o -name '*.h' | grep -v vmlinux.h)
	@# One BPF flag set: every bpf2go line carries the same -cflags.
	@test "$$(grep -ho -- '-cflags "[^"]*"' internal/*/*gen.go | sort -u | wc -l)" = 1 || { grep -H -- '-cflags' internal/*/*gen.go; echo 'lint: the go:generate lines differ in -cflags; use one set'; exit 1; }

demo: setup build ## run the main job: a lab, iperf3 through it, the figures, teardown
	@examples/demo.sh

clean: ## remove build outputs and running labs
	-@[ -x $(BIN) ] && $(BIN) lab down --all 2>/dev/null; true
	rm -rf bin dist .gen.stamp bench/results
