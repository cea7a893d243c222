// Command release writes a flowplane release into a directory (default dist/; docs/release.md):
//
//	flowplane_<version>_linux_<arch>.tar.gz   the static binary, man pages, completions, README, LICENSE
//	flowplane_analytics-<pyversion>-py3-none-any.whl, flowplane_analytics-<pyversion>.tar.gz
//	SHA256SUMS
//
// Run it from a checkout (`make release`, or go run ./scripts/release -out DIR). Everything it
// writes is a function of the commit: the version comes from `git describe`, every date from
// the commit's, and the archives are written with fixed owners, modes and times, so two runs of
// one commit give byte-identical files (repro_test.go checks it).
//
// It imports the command tree (internal/commands) to generate the man pages and completions,
// so the documentation generators are linked into this program, never into bin/flowplane.
package main

import (
	"context"
	"flag"
	"log"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

func main() {
	log.SetFlags(0)
	log.SetPrefix("release: ")
	var o Options
	var arches string
	flag.StringVar(&o.Out, "out", "dist", "directory to write (replaced: it may hold only a previous release's files)")
	flag.StringVar(&o.Version, "version", "", "version (default: git describe --tags --always --dirty)")
	flag.StringVar(&o.Commit, "commit", "", "commit (default: git rev-parse HEAD)")
	flag.StringVar(&o.Date, "date", "", "the commit's date, RFC 3339 UTC (default: from git)")
	flag.StringVar(&arches, "arch", "amd64,arm64", "architectures of the binaries, comma-separated")
	flag.StringVar(&o.Python, "python", "", "Python with the build package and setuptools (default: analytics/.venv/bin/python, `make setup` makes it)")
	flag.BoolVar(&o.NoPython, "no-python", false, "leave out the analytics wheel and sdist")
	flag.Parse()
	if flag.NArg() != 0 {
		log.Fatalf("unexpected arguments %q", flag.Args())
	}
	o.Arches = strings.Split(arches, ",")
	o.Log = func(format string, args ...any) { log.Printf(format, args...) }
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	r, err := Run(ctx, o)
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("wrote %s (%s, python %s) in %.1fs:", r.Dir, r.Info.Version, r.Info.PyVersion, time.Since(start).Seconds())
	for _, f := range r.Files {
		st, err := os.Stat(f)
		if err != nil {
			log.Fatal(err)
		}
		log.Printf("  %10d  %s", st.Size(), f)
	}
}
