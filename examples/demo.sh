#!/usr/bin/env bash
# make demo: the main job. Brings up examples/demo.yaml (h1 — r1 — h2, the r1—h2 link at
# 1 Gbit/s with 1% loss), runs iperf3 h1 → h2, prints throughput, retransmits and the lab's drop
# counters, runs each subsystem's demo step (examples/demo-*.sh), and tears the lab down.
set -euo pipefail
cd "$(dirname "$0")/.."
export FLOWPLANE="$PWD/bin/flowplane" LAB=demo
# `altmark analyze` runs flowplane-analytics from $FLOWPLANE_ANALYTICS or PATH: here, the one
# make setup installed in this checkout.
export FLOWPLANE_ANALYTICS="${FLOWPLANE_ANALYTICS:-$PWD/analytics/.venv/bin/flowplane-analytics}"

if "$FLOWPLANE" lab list | awk 'NR > 1 {print $1}' | grep -qx "$LAB"; then
	echo "demo: a lab called $LAB is running; remove it with: $FLOWPLANE lab down $LAB" >&2
	exit 1
fi
trap '"$FLOWPLANE" lab down "$LAB" >/dev/null' EXIT

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "flowplane lab up --config examples/demo.yaml"
"$FLOWPLANE" lab up --config examples/demo.yaml
"$FLOWPLANE" lab status "$LAB"

h2=$("$FLOWPLANE" lab status "$LAB" --json | jq -r '.nodes[] | select(.name == "h2") | .interfaces[0].ipv4 | split("/")[0]')
step "iperf3 h1 → h2 ($h2) for 5 s over the 1 Gbit/s, 1%-loss link"
"$FLOWPLANE" lab exec "$LAB" h2 -- iperf3 -s -1 -D -p 5201
for _ in $(seq 50); do
	"$FLOWPLANE" lab exec "$LAB" h2 -- ss -Hltn 'sport = :5201' | grep -q LISTEN && break
	sleep 0.1
done
result=$("$FLOWPLANE" lab exec "$LAB" h1 -- iperf3 -c "$h2" -p 5201 -t 5 -J)
jq -r '.end | "throughput: \(.sum_received.bits_per_second / 1e6 | floor) Mbit/s received, retransmits: \(.sum_sent.retransmits)"' <<<"$result"

step "drop counters"
"$FLOWPLANE" lab status "$LAB" --json | jq -r '
	.nodes[] | .name as $n | .interfaces[] | select(.loss) |
	"\($n):\(.name) loss program dropped \(.loss.dropped) of \(.loss.dropped + .loss.passed) packets (\(.loss.dropped * 10000 / (.loss.dropped + .loss.passed) | floor / 100)%), qdisc drops \(.qdisc_drops)"'

for s in examples/demo-*.sh; do
	[[ -e $s ]] || continue
	step "$(basename "$s" .sh)"
	bash "$s"
done

step "flowplane lab down $LAB"
trap - EXIT
"$FLOWPLANE" lab down "$LAB"
ls /run/netns 2>/dev/null | grep -q "^fp-$LAB-" || echo "nothing left behind"
