#!/usr/bin/env bash
# demo-conntrack.sh: conntrack on the demo lab's router. Called by examples/demo.sh with
# FLOWPLANE (the binary) and LAB (a running lab with h1 — r1 — h2; r1:eth0 faces h1 = inside,
# r1:eth1 faces h2 = outside). Starts conntrack on r1 (default hook auto: XDP on both, as the
# lab prepared r1's neighbours), lists the table during an iperf3 over the lossy, shaped r1—h2
# link — whose rate and loss still apply to what XDP redirects (the lab impairs that direction
# where it arrives, on h2) — shows an unsolicited connection from h2 being refused, and stops
# conntrack. Takes about 10 s.
set -euo pipefail
: "${FLOWPLANE:?set FLOWPLANE to the flowplane binary}" "${LAB:?set LAB to the running lab}"
fp() { "$FLOWPLANE" "$@"; }
on() { local node=$1; shift; fp lab exec "$LAB" "$node" -- "$@"; }

status=$(fp lab status "$LAB" --json)
dev() { jq -r --arg n "$1" --arg i "$2" '.nodes[] | select(.name==$n) | .interfaces[] | select(.name==$i) | .device' <<<"$status"; }
addr() { jq -r --arg n "$1" '.nodes[] | select(.name==$n) | .interfaces[0].ipv4' <<<"$status" | cut -d/ -f1; }
inside=$(dev r1 eth0) outside=$(dev r1 eth1) h1=$(addr h1) h2=$(addr h2)

echo "== conntrack run on r1: inside $inside, outside $outside"
# lab exec execs the command, so $! is conntrack itself (SIGTERM: background jobs of a script
# ignore SIGINT).
"$FLOWPLANE" lab exec "$LAB" r1 -- "$FLOWPLANE" conntrack run --inside "$inside" --outside "$outside" &
ct=$!
stop() { kill -TERM "$ct" 2>/dev/null && wait "$ct" 2>/dev/null || true; } # lab down removes the pinned table
trap stop EXIT
for _ in $(seq 150); do on r1 "$FLOWPLANE" conntrack status 2>/dev/null | grep -q '^interface' && break; sleep 0.1; done
on r1 "$FLOWPLANE" conntrack status | grep '^interface'
loss_of() { fp lab status "$LAB" --json | jq '[.nodes[] | select(.name == "r1") | .interfaces[] | select(.name == "eth1") | .loss.dropped, .loss.passed]'; }
before=$(loss_of)

echo "== iperf3 h1 → h2 through conntrack over the 1 Gbit/s, 1%-loss link; the table meanwhile:"
on h2 iperf3 -s -1 -p 5301 >/dev/null 2>&1 &
srv=$!
sleep 0.5
on h1 iperf3 -c "$h2" -p 5301 -t 4 -J >/tmp/fp-demo-ct-iperf.$$ 2>&1 &
cli=$!
sleep 1.5
on h1 ping -c 1 -W 1 "$h2" >/dev/null || true
on r1 "$FLOWPLANE" conntrack list
wait "$cli" || true
wait "$srv" || true
jq -r '.end | "throughput through conntrack: \(.sum_received.bits_per_second / 1e6 | floor) Mbit/s received, retransmits: \(.sum_sent.retransmits)"' \
	/tmp/fp-demo-ct-iperf.$$ || cat /tmp/fp-demo-ct-iperf.$$
rm -f /tmp/fp-demo-ct-iperf.$$
jq -rn --argjson a "$before" --argjson b "$(loss_of)" \
	'($b[0] - $a[0]) as $d | ($b[1] - $a[1]) as $p | "r1:eth1 (XDP-redirected traffic, lost on arrival at h2): \($d) of \($d + $p) packets dropped (\(if $d + $p > 0 then $d * 10000 / ($d + $p) | floor / 100 else 0 end)%)"'

echo "== unsolicited connection from h2 (outside) to h1:"
if on h2 timeout 2 bash -c "exec 3<>/dev/tcp/$h1/22" 2>/dev/null; then
	echo "   connected (unexpected!)"
else
	echo "   refused: the SYN was dropped on r1"
fi
on r1 "$FLOWPLANE" conntrack status | grep -E 'new|established|forwarded|policy_drop|invalid_window'

echo "== stopping conntrack"
stop
trap - EXIT
