package altmark

import (
	"context"
	"encoding/json"
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
	if err := runProbe(context.Background(), cfg, probeOptions{}, open, nil); err != nil {
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
	go func() {
		done <- runProbe(ctx, cfg, probeOptions{listen: "127.0.0.1:0"}, open, func(a string) { addr <- a })
	}()
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

// With --listen and periods: N the probe keeps serving its records after the last period and
// says so in /status ("finished"); with --exit-when-done it exits by itself.
func TestListeningProbeFinishes(t *testing.T) {
	cfg := testConfig(t, "periods: 2\n")
	cfg.Period = Duration(100 * time.Millisecond)
	cfg.Interfaces = []Interface{{Name: "lo", Direction: "both"}}
	open := func(s ProbeSpec) (Datapath, error) { return &memDatapath{spec: s}, nil }
	for _, exit := range []bool{false, true} {
		ctx, cancel := context.WithCancel(context.Background())
		addr := make(chan string, 1)
		done := make(chan error, 1)
		go func() {
			done <- runProbe(ctx, cfg, probeOptions{listen: "127.0.0.1:0", exitWhenDone: exit}, open, func(a string) { addr <- a })
		}()
		url := "http://" + <-addr
		if exit {
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("--exit-when-done: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("--exit-when-done: the probe did not exit after its periods")
			}
			cancel()
			continue
		}
		waitFor(t, func() bool {
			resp, err := http.Get(url + "/status")
			if err != nil {
				return false
			}
			defer resp.Body.Close()
			var st Status
			return json.NewDecoder(resp.Body).Decode(&st) == nil && st.State == "finished"
		})
		select {
		case err := <-done:
			t.Fatalf("the probe exited after its periods without --exit-when-done: %v", err)
		case <-time.After(300 * time.Millisecond):
		}
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
}
