#!/usr/bin/env bash
# demo-tune.sh: the tune step of the demo. Applies examples/tune-dc.yaml for the sender h1 of
# the running lab $LAB (h1 — r1 — h2), shows `tune explain` for a connection h1→h2 and the
# values the kernel applied to a live connection (`ss -tinm`), then removes the policy.
# Env: FLOWPLANE (the binary), LAB (the running demo lab).
set -euo pipefail
cd "$(dirname "$0")/.."
: "${FLOWPLANE:?set FLOWPLANE to the flowplane binary}" "${LAB:?set LAB to the running lab}"
tune() { "$FLOWPLANE" tune --name "fpdemo-$LAB" "$@"; }
h2=$("$FLOWPLANE" lab status "$LAB" --json | jq -r '.nodes[] | select(.name == "h2") | .interfaces[0].ipv4' | cut -d/ -f1)
port=5291
srv=""
cleanup() {
	[[ -n $srv ]] && kill "$srv" 2>/dev/null && wait "$srv" 2>/dev/null
	tune remove >/dev/null 2>&1 || true
}
trap cleanup EXIT

echo "== tune apply --config examples/tune-dc.yaml (cgroup for h1's processes)"
tune apply --config examples/tune-dc.yaml # warnings (fixed buffers switch off autotuning) go to stderr
echo
echo "== tune explain $h2:$port (which rule, which values)"
tune explain "$h2:$port"
echo
echo "== a connection h1 → h2 started inside the tuned cgroup; ss -tinm on h1 shows what the kernel applied"
"$FLOWPLANE" lab exec "$LAB" h2 -- iperf3 -s -1 -p "$port" >/dev/null 2>&1 &
srv=$!
for _ in $(seq 50); do
	"$FLOWPLANE" lab exec "$LAB" h2 -- ss -Hltn "sport = :$port" | grep -q LISTEN && break
	sleep 0.1
done
"$FLOWPLANE" lab exec "$LAB" h1 -- "$FLOWPLANE" tune --name "fpdemo-$LAB" exec -- iperf3 -c "$h2" -p "$port" -t 2 >/dev/null &
client=$!
sleep 1
"$FLOWPLANE" lab exec "$LAB" h1 -- ss -tinm "dst $h2:$port" | awk '/skmem/ {
	out = ""
	for (i = 1; i <= NF; i++)
		if ($i ~ /^(skmem|rto|cwnd|ssthresh|mss):/ || $i ~ /^(cubic|reno|bbr)$/) out = out " " $i
	print "  applied:" out
}'
echo "  (rb/tb = 2 × 150KB buffers; ssthresh ≤ cwnd_clamp 100 (cubic's HyStart may lower it); rto ≥ rto_min 20ms instead of 200ms)"
wait "$client" || true
echo
echo "== tune status"
tune status
echo
echo "== tune remove"
tune remove
