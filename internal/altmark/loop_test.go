package altmark

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/flowplane/flowplane/internal/config"
)

func TestLoopRecordsWholePeriodsOnly(t *testing.T) {
	const c = 1_000_000
	for _, tc := range []struct {
		name   string
		offset int64 // where in period c the probe starts
	}{{"first half", sec / 5}, {"second half", sec * 7 / 10}} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t, "periods: 3\n")
			clock := newFakeClock(c*sec+tc.offset, 1<<62)
			r, dps := testRunner(t, cfg, clock)
			if err := r.Start(); err != nil {
				t.Fatal(err)
			}
			r.Wait()
			dp := (*dps)[0]
			// c-1 clears the color c+1 counts with, c is partial, c+1..c+3 are recorded.
			if got, want := dp.readList(), []int64{c - 1, c, c + 1, c + 2, c + 3}; !slices.Equal(got, want) {
				t.Errorf("reads %v, want %v", got, want)
			}
			if !dp.closed {
				t.Error("datapath not closed")
			}
			ps, err := r.Store().Periods()
			if err != nil {
				t.Fatal(err)
			}
			if want := []int64{c + 1, c + 2, c + 3}; !slices.Equal(ps, want) {
				t.Errorf("periods %v, want %v", ps, want)
			}
			st := r.Status()
			if st.State != "finished" || st.PeriodsWritten != 3 || *st.FirstPeriod != c+1 || *st.LastPeriod != c+3 || st.LastError != "" {
				t.Errorf("status %+v", st)
			}
			p, err := r.Store().Read(c + 2)
			if err != nil {
				t.Fatal(err)
			}
			checkRecord(t, p, cfg, c+2)
		})
	}
}

// checkRecord checks what the loop fills in around the datapath's counts.
func checkRecord(t *testing.T, p *Period, cfg *Config, n int64) {
	t.Helper()
	L := cfg.PeriodNs()
	if p.Probe != cfg.ProbeID || p.Period != n || p.PeriodNs != L || p.StartTAINs != n*L || p.Color != int32(n&1) || p.SchemaVersion != 1 {
		t.Errorf("period header %+v", p)
	}
	if len(p.Counters) != 3 {
		t.Fatalf("%d counters, want 3 (eth0 in, eth0 out, eth1 in)", len(p.Counters))
	}
	for i, want := range []Point{{"eth0", "in"}, {"eth0", "out"}, {"eth1", "in"}} {
		c := p.Counters[i]
		if c.Ifname != want.Ifname || c.Direction != want.Direction {
			t.Errorf("counter %d is %s/%s, want %v (sorted)", i, c.Ifname, c.Direction, want)
		}
		if c.Packets != wantPackets(n, want) || c.Samples != 2 || c.Carrier != "dscp" || c.Color != p.Color ||
			c.PeriodNs != L || c.StartTAINs != n*L || c.HashRef != int64(cfg.HashRef) || c.SchemaVersion != 1 {
			t.Errorf("counter %d: %+v", i, c)
		}
	}
	if len(p.Samples) != 7 || !slices.IsSortedFunc(p.Samples, func(a, b Sample) int { return int(a.TAINs - b.TAINs) }) {
		t.Errorf("samples %d, sorted by time: %v", len(p.Samples), p.Samples)
	}
}

func TestStopReadsTheEndedPeriodAndRestartResumesAtTheNextWholeOne(t *testing.T) {
	const c = 2_000_000
	cfg := testConfig(t, "")
	// Time runs to a quarter into period c+5: c+4 has ended but is not read yet.
	clock := newFakeClock(c*sec+sec/5, (c+5)*sec+sec/4)
	r, dps := testRunner(t, cfg, clock)
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { s := r.Status(); return s.LastPeriod != nil && *s.LastPeriod == c+3 })
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	if got, want := (*dps)[0].readList(), []int64{c - 1, c, c + 1, c + 2, c + 3, c + 4}; !slices.Equal(got, want) {
		t.Errorf("first run read %v, want %v", got, want)
	}
	if err := r.Stop(); !errors.Is(err, ErrNotRunning) {
		t.Errorf("second stop: %v, want ErrNotRunning", err)
	}
	// Restart at (c+5)L + L/2: c+5 is partial, c+6 is the next whole period.
	cfg.Periods = 2
	clock.setLimit(1 << 62)
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	r.Wait()
	ps, _ := r.Store().Periods()
	if want := []int64{c + 1, c + 2, c + 3, c + 4, c + 6, c + 7}; !slices.Equal(ps, want) {
		t.Errorf("periods %v, want %v", ps, want)
	}
	if got, want := (*dps)[1].readList(), []int64{c + 4, c + 5, c + 6, c + 7}; !slices.Equal(got, want) {
		t.Errorf("second run read %v, want %v", got, want)
	}
	// The partial period c+5 is the gap between the runs.
	if st := r.Status(); st.GapFirst == nil || *st.GapFirst != c+5 || *st.GapLast != c+5 {
		t.Errorf("gap %v–%v, want period %d", st.GapFirst, st.GapLast, c+5)
	}
}

// TestRestartReportsThePeriodsWithoutARecord: a probe started after a stop or a crash says
// which whole periods since its last record on disk have none (status, metric, log), unless
// that record has another period length.
func TestRestartReportsThePeriodsWithoutARecord(t *testing.T) {
	const c = 4_000_000
	for _, tc := range []struct {
		name     string
		periodNs int64
		gap      bool
	}{{"same period", sec, true}, {"another period length", 2 * sec, false}} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t, "periods: 1\n")
			if err := (Store{Dir: cfg.DataDir, Probe: cfg.ProbeID}).Write(&Period{Period: c, PeriodNs: tc.periodNs, Probe: cfg.ProbeID,
				Counters: []Counter{{PeriodNs: tc.periodNs, Ifname: "eth0", Direction: "in", FlowMonID: -1}}}); err != nil {
				t.Fatal(err)
			}
			// Started in period c+10: c+11 is the first record, c+1 to c+10 have none.
			r, _ := testRunner(t, cfg, newFakeClock((c+10)*sec+sec/5, 1<<62))
			var log strings.Builder
			r.Log = slog.New(slog.NewTextHandler(&log, nil))
			if err := r.Start(); err != nil {
				t.Fatal(err)
			}
			r.Wait()
			st := r.Status()
			gauge := testutil.ToFloat64(r.Metrics.GapPeriods)
			if !tc.gap {
				if st.GapFirst != nil || gauge != 0 || !strings.Contains(log.String(), "another period length") {
					t.Errorf("gap %v, gauge %v, log %s", st.GapFirst, gauge, log.String())
				}
				return
			}
			if st.GapFirst == nil || *st.GapFirst != c+1 || *st.GapLast != c+10 || gauge != 10 {
				t.Errorf("gap %v–%v (gauge %v), want %d–%d (10)", st.GapFirst, st.GapLast, gauge, c+1, c+10)
			}
			if want := fmt.Sprintf("periods %d to %d (10) have no record", c+1, c+10); !strings.Contains(log.String(), want) {
				t.Errorf("log %q lacks %q", log.String(), want)
			}
			if st.LastError != "" || st.PeriodsSkipped != 0 {
				t.Errorf("a gap before the run is no error of the run: %+v", st)
			}
		})
	}
}

func TestRestartNeverOverwritesARecord(t *testing.T) {
	const c = 3_000_000
	cfg := testConfig(t, "periods: 1\n")
	// A record ahead of the clock (a clock stepped back): the run starts after it.
	if err := (Store{Dir: cfg.DataDir, Probe: cfg.ProbeID}).Write(&Period{Period: c + 5, Probe: cfg.ProbeID}); err != nil {
		t.Fatal(err)
	}
	r, dps := testRunner(t, cfg, newFakeClock(c*sec, 1<<62))
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	r.Wait()
	if st := r.Status(); *st.FirstPeriod != c+6 || *st.LastPeriod != c+6 {
		t.Errorf("first %d last %d, want %d", *st.FirstPeriod, *st.LastPeriod, c+6)
	}
	if got := (*dps)[0].readList(); got[len(got)-1] != c+6 {
		t.Errorf("reads %v", got)
	}
}

func TestLateAndFailedReadsAreReported(t *testing.T) {
	const c = 4_000_000
	cfg := testConfig(t, "periods: 4\n")
	clock := newFakeClock(c*sec, 1<<62)
	// The read of c+2 comes a whole period late: its color is counting c+4 already.
	clock.stall = func(t int64) int64 {
		if t == (c+3)*sec+sec/2 {
			return t + sec
		}
		return t
	}
	r, dps := testRunner(t, cfg, clock)
	r.Open = func(s ProbeSpec) (Datapath, error) {
		dp := &memDatapath{spec: s, fail: map[int64]error{c + 3: errors.New("map lookup: EPERM")}}
		*dps = append(*dps, dp)
		return dp, nil
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	r.Wait()
	ps, _ := r.Store().Periods()
	if want := []int64{c + 1, c + 4}; !slices.Equal(ps, want) {
		t.Errorf("periods %v, want %v", ps, want)
	}
	st := r.Status()
	if st.PeriodsSkipped != 2 || st.PeriodsWritten != 2 {
		t.Errorf("status %+v", st)
	}
	m := r.Metrics.PeriodsSkipped
	if testutil.ToFloat64(m.WithLabelValues("late")) != 1 || testutil.ToFloat64(m.WithLabelValues("read_error")) != 1 {
		t.Errorf("skipped metrics: late %v, read_error %v", testutil.ToFloat64(m.WithLabelValues("late")), testutil.ToFloat64(m.WithLabelValues("read_error")))
	}
	if !strings.Contains(st.LastError, "EPERM") && !strings.Contains(st.LastError, "late") {
		t.Errorf("last error %q", st.LastError)
	}
}

func TestStartFailsBeforeAttachingOnABadDataDir(t *testing.T) {
	cfg := testConfig(t, "")
	file := cfg.DataDir + "/file"
	if err := writeAtomic(file, []byte("x")); err != nil {
		t.Fatal(err)
	}
	cfg.DataDir = file + "/records"
	r, dps := testRunner(t, cfg, newFakeClock(sec, 1<<62))
	err := r.Start()
	var es config.Errors // exit 2 from probe run, 400 from POST /start
	if !errors.As(err, &es) || !strings.Contains(err.Error(), "data_dir: cannot hold the records") {
		t.Fatalf("start: %v, want a data_dir configuration error", err)
	}
	if len(*dps) != 0 {
		t.Error("the datapath was opened")
	}
	if r.Status().State != "stopped" {
		t.Errorf("state %s", r.Status().State)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 10s")
		}
		time.Sleep(time.Millisecond)
	}
}

// A point the datapath gave no row for (no packet in the period) gets a zero row.
func TestRecordHasARowPerPoint(t *testing.T) {
	cfg := testConfig(t, "")
	p := (&Runner{}).record(cfg, 10, []Counter{{Ifname: "eth0", Direction: "out", Ifindex: 2, FlowMonID: -1, Packets: 5}}, nil, nil)
	var got []string
	for _, c := range p.Counters {
		got = append(got, c.Ifname+"/"+c.Direction)
		if c.Carrier != "dscp" || c.PeriodNs != sec || c.SchemaVersion != 1 || c.FlowMonID != -1 {
			t.Errorf("row %+v", c)
		}
	}
	if want := []string{"eth0/in", "eth0/out", "eth1/in"}; !slices.Equal(got, want) {
		t.Errorf("rows %v, want %v", got, want)
	}
	if p.Samples == nil || len(p.Samples) != 0 {
		t.Errorf("samples %v, want empty", p.Samples)
	}
}

// flowDatapath counts FlowMonID 5 on eth0 in, in the periods of on only, as the kernel probe
// reports ipv6-altmark: rows for the FlowMonIDs seen, none for the points' own counts.
type flowDatapath struct {
	memDatapath
	on func(n int64) bool
}

func (d *flowDatapath) Read(n int64) ([]Counter, []Sample, error) {
	d.memDatapath.Read(n)
	if !d.on(n) {
		return nil, nil, nil
	}
	return []Counter{{Ifname: "eth0", Ifindex: 2, Direction: "in", FlowMonID: 5, Packets: 10, HashBits: 9}}, nil, nil
}

// With ipv6-altmark every point writes its own row and a row for each configured FlowMonID and
// each one seen in the last flowmon_keep periods, zeros when nothing came: an outage of a
// flow reads as zero packets, not as a point gone.
func TestEveryPointWritesItsFlowMonIDsRowsInEveryPeriod(t *testing.T) {
	const c = 6_000_000
	cfg := testConfig(t, "periods: 8\n")
	cfg.Carrier = carrierIPv6AltMrk
	cfg.DSCPBits = nil
	cfg.FlowMonIDs = []IDRange{{100, 101}}
	keep := int64(3)
	cfg.FlowMonKeep = &keep
	r, dps := testRunner(t, cfg, newFakeClock(c*sec, 1<<62))
	r.Open = func(s ProbeSpec) (Datapath, error) {
		dp := &flowDatapath{memDatapath: memDatapath{spec: s}, on: func(n int64) bool { return n == c+2 }}
		*dps = append(*dps, &dp.memDatapath)
		return dp, nil
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	r.Wait()
	for n := int64(c + 1); n <= c+8; n++ {
		p, err := r.Store().Read(n)
		if err != nil {
			t.Fatal(err)
		}
		ids := []int64{-1, 100, 101}
		if n >= c+2 && n <= c+2+keep {
			ids = []int64{-1, 5, 100, 101} // seen in c+2, kept 3 periods more
		}
		var want, got []string
		for _, pt := range cfg.Points() {
			for _, id := range ids {
				want = append(want, fmt.Sprintf("%s/%s/%d", pt.Ifname, pt.Direction, id))
			}
		}
		for _, row := range p.Counters {
			got = append(got, fmt.Sprintf("%s/%s/%d", row.Ifname, row.Direction, row.FlowMonID))
			packets := int64(0)
			if n == c+2 && row.Ifname == "eth0" && row.Direction == "in" && row.FlowMonID == 5 {
				packets = 10
			}
			if row.Packets != packets || row.Carrier != carrierIPv6AltMrk || row.PeriodNs != sec {
				t.Errorf("period %d: row %+v", n, row)
			}
			if n == c+2 && row.Ifname == "eth0" && row.Direction == "in" && row.HashBits != 9 {
				t.Errorf("period %d: zero row %+v does not take the point's hash length", n, row)
			}
		}
		if !slices.Equal(got, want) { // sorted by point, then FlowMonID
			t.Errorf("period %d: rows %v, want %v", n, got, want)
		}
	}
}

// blockedWriter makes every write wait until release is closed: a disk that hangs.
func blockedWriter(r *Runner) (release func()) {
	ch := make(chan struct{})
	r.writeHook = func(*Period) { <-ch }
	return sync.OnceFunc(func() { close(ch) })
}

// Reads never wait on writes: with the writer stuck, every period is still read on time, and
// the records are written, in order and complete, once the disk moves again.
func TestReadsDoNotWaitForASlowWriter(t *testing.T) {
	const c = 7_000_000
	cfg := testConfig(t, "periods: 6\n")
	clock := newFakeClock(c*sec, 1<<62)
	r, dps := testRunner(t, cfg, clock)
	release := blockedWriter(r)
	t.Cleanup(release)
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	// c-1 and c clear; c+1..c+6 are read while the first write still hangs.
	waitFor(t, func() bool { return len((*dps)[0].readList()) == 8 })
	if st := r.Status(); st.PeriodsWritten != 0 || st.PendingWrites != 6 {
		t.Errorf("status while the disk hangs: %+v", st)
	}
	if v := testutil.ToFloat64(r.Metrics.PendingWrites); v != 6 {
		t.Errorf("pending metric %v", v)
	}
	release()
	r.Wait()
	ps, _ := r.Store().Periods()
	if want := []int64{c + 1, c + 2, c + 3, c + 4, c + 5, c + 6}; !slices.Equal(ps, want) {
		t.Errorf("periods %v, want %v", ps, want)
	}
	if st := r.Status(); st.PeriodsWritten != 6 || st.PendingWrites != 0 || st.PeriodsSkipped != 0 || st.State != "finished" {
		t.Errorf("status %+v", st)
	}
}

// A writer maxPending records behind: the records that do not fit are dropped, counted and
// said so (never silently), and the reads stay on time.
func TestAFullWriteQueueDropsLoudly(t *testing.T) {
	const c = 8_000_000
	const periods = maxPending + 10
	cfg := testConfig(t, fmt.Sprintf("periods: %d\n", periods))
	r, _ := testRunner(t, cfg, newFakeClock(c*sec, 1<<62))
	release := blockedWriter(r)
	t.Cleanup(release)
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return r.Status().PeriodsSkipped >= periods-maxPending-1 })
	release()
	r.Wait()
	st := r.Status()
	backlog := testutil.ToFloat64(r.Metrics.PeriodsSkipped.WithLabelValues("write_backlog"))
	if st.PeriodsWritten+st.PeriodsSkipped != periods || int64(backlog) != st.PeriodsSkipped || st.PeriodsWritten < maxPending {
		t.Errorf("status %+v, write_backlog %v", st, backlog)
	}
	if !strings.Contains(st.LastError, "slow or failing disk") {
		t.Errorf("last error %q", st.LastError)
	}
	ps, _ := r.Store().Periods()
	if int64(len(ps)) != st.PeriodsWritten || ps[0] != c+1 {
		t.Errorf("%d periods on disk from %d, %d written", len(ps), ps[0], st.PeriodsWritten)
	}
}
