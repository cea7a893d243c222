#!/usr/bin/env bash
# demo-altmark.sh: the altmark step of the demo. Called by examples/demo.sh with FLOWPLANE (the
# binary) and LAB (a running lab h1 — r1 — h2 whose r1—h2 link loses packets). Probes r1's
# egress towards h2 and h2's ingress with `altmark probe run` (1 s periods), while h1 sends UDP that
# `altmark mark apply` on h1's egress colors by period (DSCP), and reads the lab's loss counter at
# every period boundary. Prints, per period, the two probes'
# counts, the loss they give and the loss program's drops in that period. Takes about 15 s.
set -euo pipefail
: "${FLOWPLANE:?set FLOWPLANE to the flowplane binary}" "${LAB:?set LAB to the running lab}"
fp() { "$FLOWPLANE" "$@"; }

status=$(fp lab status "$LAB" --json)
dev() { jq -r --arg n "$1" --arg i "$2" '.nodes[] | select(.name==$n) | .interfaces[] | select(.name==$i) | .device' <<<"$status"; }
addr() { jq -r --arg n "$1" '.nodes[] | select(.name==$n) | .interfaces[0].ipv4' <<<"$status" | cut -d/ -f1; }
r1out=$(dev r1 eth1) h2in=$(dev h2 eth0) h1out=$(dev h1 eth0) h2=$(addr h2)
tmp=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	fp lab exec "$LAB" h1 -- "$FLOWPLANE" altmark mark remove --dev "$h1out" >/dev/null 2>&1 || true
	rm -rf "$tmp"
}
trap cleanup EXIT

periods=10
# Probes on every interface of h1, r1 and h2, both directions: every RFC 9342 cluster of the
# demo topology (hosts probed too) has all its measurement points.
for node in h1 r1 h2; do
	ifaces=$(jq -r --arg n "$node" '[.nodes[] | select(.name==$n) | .interfaces[] | "{name: \(.device), direction: both}"] | join(", ")' <<<"$status")
	cat >"$tmp/$node.yaml" <<-EOF
		probe_id: $node
		interfaces: [$ifaces]
		period: 1s
		periods: $periods
		carrier: dscp
		hash_bits: 4
		data_dir: $tmp/data
	EOF
done
# Only IP may cross the lossy link while its drops are compared: r1's neighbour entry for h2
# becomes permanent, so no ARP goes out there.
mac=$(fp lab exec "$LAB" h2 -- ip -j link show "$h2in" | jq -r ".[0].address")
fp lab exec "$LAB" r1 -- ip neigh replace "$h2" lladdr "$mac" dev "$r1out" nud permanent
printf 'period: 1s\ncarrier: dscp\ndscp_bits: [0, 1]\n' >"$tmp/mark.yaml"
echo "== altmark mark apply on h1 ($h1out out): DSCP bit 0 = the period's color"
fp lab exec "$LAB" h1 -- "$FLOWPLANE" altmark mark apply --dev "$h1out" --config "$tmp/mark.yaml"
echo "== altmark probe run on every interface of h1, r1 and h2 (in and out), $periods periods of 1 s"
for node in h1 r1 h2; do
	fp lab exec "$LAB" "$node" -- "$FLOWPLANE" altmark probe run --config "$tmp/$node.yaml" 2>"$tmp/$node.log" &
	pids+=($!)
done

# The sender (in h1, uncolored: the marker colors) and the drop-counter reader (here): CLOCK_TAI,
# the marker's and probes' clock. No packet leaves within 100 ms of a boundary, when the loss
# counter is read.
cat >"$tmp/send.py" <<'EOF'
import socket, sys, time
dst, seconds = sys.argv[1], float(sys.argv[2])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
end, seq = time.clock_gettime_ns(time.CLOCK_TAI) + int(seconds * 1e9), 0
while (now := time.clock_gettime_ns(time.CLOCK_TAI)) < end:
    phase = now % 1_000_000_000
    if phase < 100_000_000 or phase > 900_000_000:
        time.sleep(0.005)
        continue
    s.sendto(b"seq %d" % seq + bytes(100), (dst, 9))
    seq += 1
    time.sleep(0.0005)
EOF
cat >"$tmp/drops.py" <<'EOF'
import json, subprocess, sys, time
flowplane, lab, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
n = time.clock_gettime_ns(time.CLOCK_TAI) // 1_000_000_000 + 1
for n in range(n, n + int(seconds) + 1):
    while time.clock_gettime_ns(time.CLOCK_TAI) < n * 1_000_000_000:
        time.sleep(0.001)
    st = json.loads(subprocess.run([flowplane, "lab", "status", lab, "--json"], capture_output=True, check=True).stdout)
    for node in st["nodes"]:
        for i in node["interfaces"]:
            if node["name"] == "r1" and i["name"] == "eth1":
                print(n, i["loss"]["dropped"], flush=True)
EOF
sleep 3 # the probes load and wait for their first whole period
run=6
python3 "$tmp/drops.py" "$FLOWPLANE" "$LAB" "$run" >"$tmp/drops" &
pids+=($!)
fp lab exec "$LAB" h1 -- python3 "$tmp/send.py" "$h2" "$run"
for p in "${pids[@]}"; do wait "$p" || true; done
pids=()

echo "== per period: r1 out − h2 in = loss, beside the lab loss program's drops in the period"
printf '%-12s %5s %8s %8s %6s %6s %8s\n' period color "r1 out" "h2 in" loss drops samples
for f in "$tmp"/data/jsonl/r1/*.jsonl; do
	n=$(basename "$f" .jsonl)
	[[ -f $tmp/data/jsonl/h2/$n.jsonl ]] || continue
	pick() { jq --arg i "$2" --arg d "$3" "[.$4[] | select(.ifname == \$i and .direction == \$d)$5] | add // 0" "$1"; }
	out=$(pick "$f" "$r1out" out counters " | .packets") in=$(pick "$tmp/data/jsonl/h2/$n.jsonl" "$h2in" in counters " | .packets")
	color=$(jq .color "$f")
	samples="$(pick "$f" "$r1out" out samples " | 1")/$(pick "$tmp/data/jsonl/h2/$n.jsonl" "$h2in" in samples " | 1")"
	d0=$(awk -v n="$n" '$1 == n {print $2}' "$tmp/drops") d1=$(awk -v n="$((n + 1))" '$1 == n {print $2}' "$tmp/drops")
	[[ -n $d0 && -n $d1 ]] || continue # not a period of the sender's
	drops=$((d1 - d0))
	printf '%-12s %5s %8s %8s %6s %6s %8s\n' "$n" "$color" "$out" "$in" "$((out - in))" "$drops" "$samples"
done

echo "== altmark analyze: RFC 9342 clusters of the demo topology (hosts probed too), loss per cluster"
topo=(--topology examples/demo.yaml --probe-hosts)
"$FLOWPLANE" altmark analyze clusters "${topo[@]}"
# awk keeps the first 30 rows but reads to the end: a reader that quits early (head) would
# stop the writer with SIGPIPE, and the demo with it.
"$FLOWPLANE" altmark analyze loss --data "$tmp/data" "${topo[@]}" 2>&1 | awk '(NR == 1 || ($7 != 0 && $7 != "-")) && n++ < 30'
echo "(rows with loss 0 left out; C6 is the lossy wire r1 → h2; a node cluster's loss of 1 or 2 is"
echo " traffic addressed to r1 itself, e.g. neighbour discovery, which enters r1 and leaves nowhere)"
report=${ALTMARK_REPORT:-/tmp/flowplane-altmark-demo.html}
"$FLOWPLANE" altmark analyze report --data "$tmp/data" "${topo[@]}" --html "$report" >/dev/null 2>&1 &&
	echo "HTML report (tables, loss per cluster over periods, delay distributions, the clustered graph): $report"
