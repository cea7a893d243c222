// Command prio-wan runs prio's flow-completion-time experiment (bench/prio) with the receivers'
// links delayed each way through the lab's relay, for round-trip times of a data center's
// (docs/prio.md, "Goals"): bench/prio -exp fct -delay 250us, saved as bench/results/prio-wan.json
// (a delayed run never replaces prio's own section). Arguments are passed on to bench/prio after
// these defaults, so any of them can be changed: go run ./bench/prio-wan -delay 250us,500us.
package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
)

var defaults = []string{"-exp", "fct", "-delay", "250us", "-workloads", "websearch,datamining", "-loads", "0.5,0.8"}

func main() {
	// Built, then run in this process's place: signals reach bench/prio, which cleans its lab up.
	bin, err := filepath.Abs("bench/results/prio-wan/prio")
	if err == nil {
		err = os.MkdirAll(filepath.Dir(bin), 0o755)
	}
	if err == nil {
		build := exec.Command("go", "build", "-o", bin, "./bench/prio")
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		err = build.Run()
	}
	if err == nil {
		err = syscall.Exec(bin, append(append([]string{bin}, defaults...), os.Args[1:]...), os.Environ())
	}
	fmt.Fprintln(os.Stderr, "prio-wan:", err)
	os.Exit(1)
}
