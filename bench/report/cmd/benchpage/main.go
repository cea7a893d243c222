// Command benchpage writes docs/benchmarks.md from bench/results/*.json (bench/run.sh runs it
// after the benchmarks): the sections of the benches named, or of every bench with a results
// file, are rewritten, every other section is kept as it is.
//
//	go run ./bench/report/cmd/benchpage [-benches lab,altmark-mark]
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/flowplane/flowplane/bench/report"
)

func main() {
	benches := flag.String("benches", "", "comma-separated benches whose sections to rewrite (default: every bench with a bench/results/<name>.json)")
	root := flag.String("root", report.Root(), "the repository's root")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "benchpage: no arguments expected (-benches names the sections)")
		os.Exit(2)
	}
	names := strings.FieldsFunc(*benches, func(r rune) bool { return r == ',' })
	if err := report.Generate(*root, names); err != nil {
		fmt.Fprintln(os.Stderr, "benchpage:", err)
		os.Exit(1)
	}
}
