#!/usr/bin/env bash
# Demo step for vnet (user space, independent of the kernel lab): a file crosses a lossy, delayed
# link with its goodput printed, then the link goes down and RIP routes round it.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
head -c 8000000 /dev/urandom >"$tmp/file"
"$FLOWPLANE" vnet exec --config examples/vnet-demo.yaml \
	-c "h2 recvfile $tmp/copy 9000" \
	-c "h1 sendfile $tmp/file 198.18.2.2 9000" \
	-c "h1 traceroute 198.18.2.2" \
	-c "link 1 down" \
	-c "sleep 1s" \
	-c "r1 routes" \
	-c "h1 traceroute 198.18.2.2"
cmp -s "$tmp/file" "$tmp/copy" && echo "the copy on h2 is byte-exact"
