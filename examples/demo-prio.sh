#!/usr/bin/env bash
# demo-prio.sh: the prio step of the demo, in a lab of its own (examples/prio-demo.yaml:
# h1 — r1 — h2; the demo lab's r1—h2 link already carries the lab's HTB). h1's connections
# advertise their send backlog (prio host apply on a cgroup); r1 runs prio router apply at 20 Mbit/s
# towards h2. A backlogged flow (iperf3) runs while a short one sends 100 KB, first under fifo,
# then under backlog; `prio status` shows the classes and flows, and the short flow's
# completion time (connect, 100 KB, a 1-byte reply) is printed for both.
# Env: FLOWPLANE (the binary).
set -euo pipefail
cd "$(dirname "$0")/.."
: "${FLOWPLANE:?set FLOWPLANE to the flowplane binary}"
lab=priodemo
cg_root=$(awk '$3 == "cgroup2" {print $2; exit}' /proc/mounts)
cg="$cg_root/fpdemo-prio"
r1() { "$FLOWPLANE" lab exec "$lab" r1 -- "$FLOWPLANE" prio "$@"; }
# in_cgroup runs a command with h1's advertising cgroup (children inherit it).
in_cgroup() { bash -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$cg" "$@"; }
cleanup() {
	[[ -n ${srv:-} ]] && kill "$srv" 2>/dev/null
	pkill -f "iperf3 -s -p 5281" 2>/dev/null || true
	"$FLOWPLANE" prio host remove --name fpdemo >/dev/null 2>&1 || true
	"$FLOWPLANE" lab down "$lab" >/dev/null 2>&1 || true
	rmdir "$cg" 2>/dev/null || true
}
trap cleanup EXIT

"$FLOWPLANE" lab up --config examples/prio-demo.yaml >/dev/null
mkdir -p "$cg"
echo "== prio host apply: h1's connections advertise their backlog (cgroup $cg)"
"$FLOWPLANE" prio host apply --name fpdemo --cgroup "$cg" --config examples/prio-host.yaml
status=$("$FLOWPLANE" lab status "$lab" --json)
h2=$(jq -r '.nodes[] | select(.name == "h2") | .interfaces[0].ipv4' <<<"$status" | cut -d/ -f1)
dev=$(jq -r '.nodes[] | select(.name == "r1") | .interfaces[] | select(.peer == "h2:eth0") | .device' <<<"$status")
# The short flow's server answers 1 byte once it has read 100 KB; the client times it.
"$FLOWPLANE" lab exec "$lab" h2 -- iperf3 -s -p 5281 -D
"$FLOWPLANE" lab exec "$lab" h2 -- python3 -c '
import socket
s = socket.create_server(("0.0.0.0", 5291))
while True:
    c, _ = s.accept()
    n = 0
    while n < 100000:
        n += len(c.recv(65536))
    c.sendall(b"k"); c.close()' &
srv=$!
short_flow() {
	in_cgroup "$FLOWPLANE" lab exec "$lab" h1 -- python3 -c '
import socket, sys, time
t = time.monotonic()
c = socket.create_connection((sys.argv[1], 5291))
c.sendall(b"x" * 100000); c.recv(1)
print(round((time.monotonic() - t) * 1000))' "$h2"
}
for _ in $(seq 50); do
	[[ $("$FLOWPLANE" lab exec "$lab" h2 -- ss -Hltn '( sport = :5281 or sport = :5291 )' | grep -c LISTEN) == 2 ]] && break
	sleep 0.1
done

for scheme in fifo backlog; do
	printf 'scheme: %s\ntrust: [198.18.0.0/24]\nthresholds: [200KB]\nleaves: 2\nlimit: 100\n' "$scheme" >"/tmp/fpdemo-prio-$scheme.yaml"
	echo
	echo "== prio router apply --rate 20mbit, scheme $scheme"
	r1 router apply --dev "$dev" --rate 20mbit --config "/tmp/fpdemo-prio-$scheme.yaml"
	echo "-- prio status before the flows"
	r1 status | sed -n '1,3p'
	# The backlogged flow: 6 s of iperf3 from h1, advertising.
	in_cgroup "$FLOWPLANE" lab exec "$lab" h1 -- iperf3 -c "$h2" -p 5281 -t 6 >/dev/null &
	bulk=$!
	sleep 2
	short=$(short_flow)
	echo "short flow (100 KB) beside the backlogged one: completed in $short ms"
	wait "$bulk" || true
	echo "-- prio status after"
	r1 status | sed '/^host /,$d' # the router's part (the host attachment is the machine's)
	r1 router remove --dev "$dev" >/dev/null
done
