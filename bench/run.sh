#!/usr/bin/env bash
# make bench: runs every benchmark program under bench/<name>/ (one per subsystem). Each prints
# markdown tables of ratios against baselines measured in the same run and writes
# bench/results/<name>.json. BENCH=name1,name2 runs a subset.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p bench/results
failed=()
for dir in bench/*/; do
	name=$(basename "$dir")
	[[ -f $dir/main.go || -f $dir/bench.py ]] || continue
	if [[ -n ${BENCH:-} && ",$BENCH," != *",$name,"* ]]; then continue; fi
	echo "## $name"
	if [[ -f $dir/bench.py ]]; then
		# Python benchmarks run in the analytics venv (make setup).
		analytics/.venv/bin/python "$dir/bench.py" || failed+=("$name")
	else
		go run "./bench/$name" || failed+=("$name")
	fi
done
if ((${#failed[@]})); then
	echo "bench: failed: ${failed[*]}" >&2
	exit 1
fi
