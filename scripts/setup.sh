#!/usr/bin/env bash
# Installs what flowplane needs on Debian 12 and is a no-op when everything is there.
set -euo pipefail
cd "$(dirname "$0")/.."

apt_packages=(
	clang llvm libbpf-dev bpftool clang-format   # BPF build and lint
	iproute2 iputils-ping ethtool procps         # lab plumbing (procps: sysctl)
	iperf3 tcpdump tshark jq              # traffic, capture, demo
	conntrack nftables                           # nf_conntrack reference
	python3-venv openjdk-17-jre-headless         # analytics (venv; the JVM for Spark)
	maven                                        # analytics: Spark's S3A jars (analytics/jars)
	man-db groff-base bash-completion            # the release smoke test: a man page, a completion
	ca-certificates                              # HTTPS: the Go toolchain, pip, Maven
)
missing=()
for p in "${apt_packages[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
	echo "setup: installing ${missing[*]}"
	if [[ $EUID -ne 0 ]]; then
		echo "setup: installing packages needs root (sudo make setup)" >&2
		exit 1
	fi
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Go: a go 1.21 or newer on the PATH fetches the toolchain go.mod asks for by itself. Without one
# (a fresh Debian 12 has none; its golang-go, 1.19, cannot fetch), that toolchain is installed in
# /usr/local/go from the Go module proxy, checked against the Go checksum database, and linked
# into /usr/local/bin.
go_fetches() { command -v go >/dev/null && go version | grep -Eq ' go(1\.(2[1-9]|[3-9][0-9])|[2-9])'; }
if ! go_fetches; then
	want_go=$(sed -n 's/^toolchain go//p' go.mod)
	want_go=${want_go:-$(sed -n 's/^go //p' go.mod)}
	if [[ ! -x /usr/local/go/bin/go ]] || ! /usr/local/go/bin/go version | grep -q " go$want_go "; then
		if [[ $EUID -ne 0 ]]; then
			echo "setup: installing Go $want_go in /usr/local/go needs root (sudo make setup)" >&2
			exit 1
		fi
		echo "setup: installing Go $want_go in /usr/local/go"
		python3 scripts/install-go.py "$want_go" /usr/local/go
	fi
	if [[ $EUID -eq 0 ]]; then
		ln -sf /usr/local/go/bin/go /usr/local/go/bin/gofmt /usr/local/bin/
	fi
	export PATH=/usr/local/go/bin:$PATH
fi
go mod download

# analytics/: a venv with the package (editable, with Spark and the dev tools, among them the
# build package and setuptools `make release` builds with) and the tested set of dependencies
# (analytics/constraints.txt), reinstalled only when pyproject.toml or the constraints change
# (the stamp holds their hash).
venv=analytics/.venv
stamp=$venv/.installed
want=$(cat analytics/pyproject.toml analytics/constraints.txt | sha256sum | cut -d' ' -f1)
if [[ ! -x $venv/bin/python ]]; then
	echo "setup: creating $venv"
	python3 -m venv "$venv"
fi
if [[ ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
	echo "setup: installing analytics into $venv (pip)"
	"$venv/bin/python" -m pip install -q --upgrade pip
	"$venv/bin/python" -m pip install -q -c analytics/constraints.txt -e 'analytics[dev,spark]'
	echo "$want" >"$stamp"
fi

# analytics/.wheelhouse: the package's dependencies (no extras) at the tested versions, as wheels
# for this Python, so the release smoke test (scripts/release) installs the built wheel into a
# fresh venv offline: pip install --no-index --find-links analytics/.wheelhouse
# -c analytics/constraints.txt dist/flowplane_analytics-…whl. Downloaded again when
# pyproject.toml or the constraints change; pip's cache serves what it already has.
wheelhouse=analytics/.wheelhouse
if [[ ! -f $wheelhouse/.installed || $(cat "$wheelhouse/.installed") != "$want" ]]; then
	echo "setup: downloading the analytics' dependencies into $wheelhouse (pip)"
	rm -rf "$wheelhouse"
	mkdir -p "$wheelhouse"
	"$venv/bin/python" -c 'import sys, tomllib; print(*tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"], sep="\n")' \
		analytics/pyproject.toml >"$wheelhouse/requirements.txt"
	"$venv/bin/python" -m pip download -q --only-binary=:all: -d "$wheelhouse" -c analytics/constraints.txt -r "$wheelhouse/requirements.txt"
	echo "$want" >"$wheelhouse/.installed"
fi

# analytics/.jars: what Spark needs to read s3:// (hadoop-aws matching pyspark's Hadoop and the
# AWS SDK modules S3A uses; analytics/jars/pom.xml), from Maven Central, fetched again when the
# pom changes. storage.spark_jars() puts them on every Spark session's classpath.
jars=analytics/.jars
want_jars=$(sha256sum analytics/jars/pom.xml | cut -d' ' -f1)
if [[ ! -f $jars/.installed || $(cat "$jars/.installed") != "$want_jars" ]]; then
	echo "setup: downloading Spark's S3A jars into $jars (mvn)"
	rm -rf "$jars"
	mvn -q -B -Dstyle.color=never -f analytics/jars/pom.xml dependency:copy-dependencies \
		-DoutputDirectory="$PWD/$jars" -DexcludeGroupIds=io.netty,org.slf4j
	echo "$want_jars" >"$jars/.installed"
fi
