package altmark

import (
	"context"
	"net/http"
	"slices"
	"testing"
	"time"
)

// The command on the real TAI clock with an in-memory datapath: without --listen it records
// the configured periods and returns; with --listen it serves the API until cancelled.
func TestRunProbeOnTheTAIClock(t *testing.T) {
	cfg := testConfig(t, "periods: 3\n")
	// 200 ms: a period is read up to L/2 after it ends, and a loaded CI machine read a 20-ms
	// period 60 ms late (the command then reports the skipped periods as an error, as it should)
	cfg.Period = Duration(200 * time.Millisecond)
	cfg.Interfaces = []Interface{{Name: "lo", Direction: "both"}} // exists in every namespace
	var dp *memDatapath
	open := func(s ProbeSpec) (Datapath, error) { dp = &memDatapath{spec: s}; return dp, nil }
	start := taiClock{}.Now()
	if err := runProbe(context.Background(), cfg, "", "", false, open, nil); err != nil {
		t.Fatal(err)
	}
	ps, _ := (Store{Dir: cfg.DataDir, Probe: cfg.ProbeID}).Periods()
	c := floorDiv(start, cfg.PeriodNs())
	// A slow machine may skip a late period (reported); the records are whole periods after c.
	if len(ps) == 0 || ps[0] < c+1 || !slices.IsSorted(ps) {
		t.Errorf("periods %v, started in %d", ps, c)
	}
	if !dp.closed {
		t.Error("datapath not closed")
	}

	cfg.Periods = 0
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- runProbe(ctx, cfg, "127.0.0.1:0", "", false, open, func(a string) { addr <- a }) }()
	url := "http://" + <-addr
	waitFor(t, func() bool {
		resp, err := http.Get(url + "/status")
		if err != nil {
			return false
		}
		resp.Body.Close()
		n, _ := (Store{Dir: cfg.DataDir, Probe: cfg.ProbeID}).Periods()
		return len(n) > len(ps)
	})
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the probe did not stop")
	}
	if _, err := http.Get(url + "/status"); err == nil {
		t.Error("the API still answers after the probe stopped")
	}
}
