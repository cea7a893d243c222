#!/usr/bin/env bash
# make bench: runs every benchmark program under bench/<name>/ (one per subsystem). Each prints
# markdown tables of ratios against baselines measured in the same run, with their goals, and
# writes bench/results/<name>.json. BENCH=name1,name2 runs a subset. At the end the sections of
# docs/benchmarks.md of the benchmarks that succeeded are rewritten from their results (the
# others are kept as they are); a failed benchmark still makes the run fail. BENCH_ARGS: the
# arguments of a Go benchmark program (one, in BENCH), e.g. BENCH=prio BENCH_ARGS='-flows 200'.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -n ${BENCH_ARGS:-} && ( -z ${BENCH:-} || $BENCH == *,* || ! -f bench/$BENCH/main.go ) ]]; then
	echo "bench: BENCH_ARGS needs one Go benchmark in BENCH (BENCH=prio BENCH_ARGS='-flows 200');" \
		"the Python ones take environment variables (bench/NAME/bench.py)" >&2
	exit 2
fi
mkdir -p bench/results
ok=()
failed=()
for dir in bench/*/; do
	name=$(basename "$dir")
	[[ -f $dir/main.go || -f $dir/bench.py ]] || continue
	if [[ -n ${BENCH:-} && ",$BENCH," != *",$name,"* ]]; then continue; fi
	echo "## $name"
	start=$SECONDS
	if [[ -f $dir/bench.py ]]; then
		# Python benchmarks run in the analytics venv (make setup), on this checkout's package
		# (the venv's editable install may point at another checkout).
		if PYTHONPATH=analytics/src${PYTHONPATH:+:$PYTHONPATH} analytics/.venv/bin/python "$dir/bench.py"; then
			ok+=("$name")
		else
			failed+=("$name")
		fi
	# shellcheck disable=SC2086 # split into arguments on purpose
	elif go run "./bench/$name" ${BENCH_ARGS:-}; then
		ok+=("$name")
	else
		failed+=("$name")
	fi
	echo "## $name: $((SECONDS - start)) s" >&2
done
if ((${#ok[@]})); then
	echo "## docs/benchmarks.md: ${ok[*]}"
	go run ./bench/report/cmd/benchpage -benches "$(IFS=,; echo "${ok[*]}")" || failed+=("docs/benchmarks.md")
fi
if ((${#failed[@]})); then
	echo "bench: failed: ${failed[*]}" >&2
	exit 1
fi
