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
	[[ -f $dir/main.go ]] || continue
	if [[ -n ${BENCH:-} && ",$BENCH," != *",$name,"* ]]; then continue; fi
	echo "## $name"
	go run "./bench/$name" || failed+=("$name")
done
if ((${#failed[@]})); then
	echo "bench: failed: ${failed[*]}" >&2
	exit 1
fi
