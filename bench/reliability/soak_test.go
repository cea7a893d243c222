package main

import (
	"context"
	"testing"
	"time"

	"github.com/flowplane/flowplane/internal/testenv"
)

// TestSoakShort is the soak part in short form (make test; the bench runs it for 30 minutes):
// 10 s of iperf3 at 10 Mbit/s per stream through the demo lab with every subsystem attached
// at once. Every attach succeeds beside the others, no iperf3 run fails, the probe writes its
// periods without a write error, and conntrack exits 0 on SIGTERM. Needs bin/flowplane (make
// build).
func TestSoakShort(t *testing.T) {
	testenv.Privileged(t)
	testenv.Need(t, "iperf3", "tc")
	t.Chdir("../..")
	fig, err := runSoak(context.Background(), 10*time.Second, "10M")
	if err != nil {
		t.Fatal(err)
	}
	for name, s := range fig.Procs {
		start, end := s[0], s[len(s)-1]
		t.Logf("%s: RSS %d → %d KiB, open files %d → %d", name, start.RSSKiB, end.RSSKiB, start.FDs, end.FDs)
	}
	if len(fig.Procs) != 2 {
		t.Errorf("processes %v, want conntrack run and altmark probe run", fig.Procs)
	}
	// The probe exits 1 when it skipped a period, which a loaded machine's late read does
	// (counted, and no failure of the soak); conntrack has no such case.
	if e := fig.Exits["conntrack run"]; e != "0" {
		t.Errorf("conntrack run after SIGTERM: %s", e)
	}
	t.Logf("altmark probe run after SIGTERM: %s %v", fig.Exits["altmark probe run"], fig.ExitLogs)
	if fig.RunsFailed != 0 || fig.RunsOK == 0 {
		t.Errorf("iperf3 runs: %d completed, %d failed; the first: %s", fig.RunsOK, fig.RunsFailed, fig.FirstFail)
	}
	if w, _ := fig.Probe["periods_written"].(float64); w == 0 || fig.Probe["write_errors"] != float64(0) {
		t.Errorf("the probe's status at the end: %v", fig.Probe)
	}
}
