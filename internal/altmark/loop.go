package altmark

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/flowplane/flowplane/internal/config"
)

// The read rule (RFC 9341, docs/altmark.md "The read rule"): period n (TAI in [nL, (n+1)L)) is read
// at (n+1)L + L/2, when packets of n still in flight have arrived and the other color has been
// counting for half a period; Datapath.Read(n) then zeroes n's color, which counts n+2 next.
// A probe attached during period c records from c+1 on: c itself is partial, and the color of
// c+1 may hold stragglers of c-1 until it is cleared at cL + L/2 (or at once, later than that).

// Runner owns the probe's lifecycle: configuration, the datapath, the period loop, the
// records, the export. The REST API and the command drive it.
type Runner struct {
	Open    func(ProbeSpec) (Datapath, error) // the kernel side's OpenProbe
	Check   func(*Config) error               // optional: checks before anything attaches
	Clock   Clock
	Metrics *Metrics
	Log     *slog.Logger
	OnEnd   func(state string) // optional: called when a loop has ended (stopped, finished)

	writeHook func(*Period) // tests: called before each write (a slow disk)

	mu     sync.Mutex
	cfg    *Config
	cur    *run
	status Status
}

// maxPending bounds the records read but not yet written (a slow or full disk): the
// writer's queue holds this many, and so does its list of records whose write failed.
const maxPending = 64

// Status is what GET /status answers.
type Status struct {
	State          string `json:"state"` // stopped, running, stopping, finished, failed
	Probe          string `json:"probe"`
	PeriodNs       int64  `json:"period_ns"`
	Now            int64  `json:"now_tai_ns"`
	CurrentPeriod  int64  `json:"current_period"`
	StartedAt      int64  `json:"started_tai_ns,omitempty"`
	FirstPeriod    *int64 `json:"first_period,omitempty"` // the first whole period since the probe started
	LastPeriod     *int64 `json:"last_period,omitempty"`  // the latest period written
	PeriodsWritten int64  `json:"periods_written"`        // in this run
	PeriodsSkipped int64  `json:"periods_skipped"`        // whole periods without a record, in this run
	GapFirst       *int64 `json:"gap_first,omitempty"`    // the first whole period after the last record on disk, when the probe was not running
	GapLast        *int64 `json:"gap_last,omitempty"`     // the last one without a record before FirstPeriod
	PendingWrites  int    `json:"pending_writes"`         // read, not yet written
	WriteErrors    int64  `json:"write_errors"`
	ExportErrors   int64  `json:"export_errors"`
	LastError      string `json:"last_error,omitempty"`
	LastErrorAt    int64  `json:"last_error_tai_ns,omitempty"`
}

// Errors of Start, Stop and SetConfig.
var (
	ErrRunning    = errors.New("the probe is running; POST /stop first")
	ErrNotRunning = errors.New("the probe is not running")
)

// run is one attachment, from Start to the end of its loop.
type run struct {
	cfg     *Config
	dp      Datapath
	store   Store
	export  *ipfixExporter
	stop    chan struct{}
	stopped bool
	done    chan struct{}
	// The loop reads on time and queues each record; the writer writes them in order, so a
	// slow or full disk delays files, never a read.
	queue   chan *Period
	written chan struct{} // closed when the writer has ended
}

// NewRunner returns a stopped runner with configuration cfg.
func NewRunner(cfg *Config, open func(ProbeSpec) (Datapath, error)) *Runner {
	r := &Runner{Open: open, Clock: taiClock{}, Metrics: NewMetrics(), Log: slog.Default(), cfg: cfg}
	r.status = Status{State: "stopped"}
	return r
}

// Config is the current configuration.
func (r *Runner) Config() *Config {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cfg
}

// SetConfig replaces the configuration of a stopped probe.
func (r *Runner) SetConfig(cfg *Config) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cur != nil {
		return ErrRunning
	}
	r.cfg = cfg
	return nil
}

// Store is the record store of the current configuration.
func (r *Runner) Store() Store {
	cfg := r.Config()
	return Store{Dir: cfg.DataDir, Probe: cfg.ProbeID}
}

// Status reports the state of the probe.
func (r *Runner) Status() Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.status
	s.Probe = r.cfg.ProbeID
	s.PeriodNs = r.cfg.PeriodNs()
	s.Now = r.Clock.Now()
	s.CurrentPeriod = floorDiv(s.Now, s.PeriodNs)
	return s
}

// Start validates what can be checked, prepares the data directory and the export, attaches
// the datapath and starts the period loop. On error nothing stays attached.
func (r *Runner) Start() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cur != nil {
		return ErrRunning
	}
	cfg := r.cfg
	if r.Check != nil {
		if err := r.Check(cfg); err != nil {
			return err
		}
	}
	store := Store{Dir: cfg.DataDir, Probe: cfg.ProbeID}
	if err := prepareDir(store); err != nil {
		return err
	}
	rn := &run{cfg: cfg, store: store, stop: make(chan struct{}), done: make(chan struct{}),
		queue: make(chan *Period, maxPending), written: make(chan struct{})}
	if cfg.IPFIX != nil {
		x, err := newExporter(cfg.IPFIX, cfg.ProbeID, r.Clock.TAIMinusUTC())
		if err != nil {
			return fmt.Errorf("ipfix.collector: %w", err)
		}
		rn.export = x
	}
	dp, err := r.Open(cfg.Spec())
	if err != nil {
		if rn.export != nil {
			rn.export.Close()
		}
		return fmt.Errorf("attach the probe: %w", err)
	}
	rn.dp = dp
	r.cur = rn
	r.status = Status{State: "running", StartedAt: r.Clock.Now()}
	r.Metrics.Running.Set(1)
	r.Metrics.PendingWrites.Set(0)
	r.Metrics.GapPeriods.Set(0)
	go r.writer(rn)
	go r.loop(rn)
	return nil
}

// prepareDir creates the data directory, removes what a crash left (temporary files, the files
// of a period whose counters file was never renamed into place), and checks
// that a file can be created there, so a bad data_dir fails Start instead of the first period.
// A directory that cannot be made or written is the configuration's error (exit 2, 400).
func prepareDir(s Store) error {
	unusable := func(err error) error {
		return config.Errors{{File: startCheck, Field: "data_dir", Msg: fmt.Sprintf("cannot hold the records: %v; give a writable directory", err)}}
	}
	if err := os.MkdirAll(s.Dir, 0o755); err != nil {
		return unusable(err)
	}
	if err := s.RemoveIncomplete(); err != nil {
		return fmt.Errorf("data_dir: remove what an interrupted write left: %w", err)
	}
	f, err := os.CreateTemp(s.Dir, ".probe-write-check-*"+tmpSuffix)
	if err != nil {
		return unusable(err)
	}
	f.Close()
	return os.Remove(filepath.Clean(f.Name()))
}

// Stop ends the loop: a period that has ended but is not read yet is still read and written
// (waiting at most L/2), the current partial one is not. Then the datapath detaches.
func (r *Runner) Stop() error {
	r.mu.Lock()
	rn := r.cur
	if rn == nil {
		r.mu.Unlock()
		return ErrNotRunning
	}
	if !rn.stopped {
		rn.stopped = true
		close(rn.stop)
		r.status.State = "stopping"
	}
	r.mu.Unlock()
	<-rn.done
	return nil
}

// Wait returns when the current loop (if any) has ended: stopped, finished or failed.
func (r *Runner) Wait() {
	r.mu.Lock()
	rn := r.cur
	r.mu.Unlock()
	if rn != nil {
		<-rn.done
	}
}

// Done is closed when the current loop ends; nil when none runs.
func (r *Runner) Done() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cur == nil {
		return nil
	}
	return r.cur.done
}

func (r *Runner) loop(rn *run) {
	L := rn.cfg.PeriodNs()
	now := r.Clock.Now()
	c := floorDiv(now, L)
	first := c + 1
	last, ok, err := rn.store.Last()
	switch {
	case err != nil:
		r.report("list the periods already written: %v", err)
	case ok && last >= first:
		first = last + 1 // never overwrite a record (a clock stepped back)
	}
	r.mu.Lock()
	r.status.FirstPeriod = &first
	r.mu.Unlock()
	if ok && last < first-1 {
		r.reportGap(rn, last, first)
	}
	r.Log.Info("altmark probe running", "probe", rn.cfg.ProbeID, "period", time.Duration(L), "first_period", first)

	state := "stopped"
	recorded := int64(0)
	flowmons := newFlowmonRows(rn.cfg)
	for n := c - 1; ; n++ {
		due := (n+1)*L + L/2
		stopping := false
		if !r.Clock.Until(due, rn.stop) {
			// Stopped: a period that has ended is still read when its stragglers are in; the
			// current one is partial. n = c-1 only clears counters, so it need not wait.
			if n < first || r.Clock.Now() < (n+1)*L {
				break
			}
			r.Clock.Until(due, nil)
			stopping = true
		}
		lag := r.Clock.Now() - due // when the read starts: the maps are read from here on
		counters, samples, err := rn.dp.Read(n)
		r.Metrics.ReadLag.Observe(float64(lag) / 1e9)
		r.Metrics.observeDatapath(rn.dp)
		if n >= first {
			recorded++
			switch {
			case err != nil:
				r.skip("read_error", "period %d: read the counters: %v", n, err)
			case lag >= L/2:
				// Read after (n+2)L: n's color was counting n+2 already, the counts are mixed.
				r.skip("late", "period %d: read %v after its read time, when its color counted period %d already; no record", n, time.Duration(lag), n+2)
			default:
				r.enqueue(rn, r.record(rn.cfg, n, counters, samples, flowmons.ids(n, counters)))
			}
		} else if err != nil {
			r.report("clear period %d (before the first whole period): %v", n, err)
		}
		if stopping {
			break
		}
		if rn.cfg.Periods > 0 && recorded >= rn.cfg.Periods {
			state = "finished"
			break
		}
	}
	close(rn.queue)
	if err := rn.dp.Close(); err != nil {
		r.report("detach the probe: %v", err)
	}
	<-rn.written
	if rn.export != nil {
		rn.export.Close()
	}
	r.Metrics.Running.Set(0)
	r.mu.Lock()
	r.status.State = state
	r.cur = nil
	r.mu.Unlock()
	r.Log.Info("altmark probe "+state, "probe", rn.cfg.ProbeID, "periods", recorded)
	close(rn.done)
	if r.OnEnd != nil {
		r.OnEnd(state)
	}
}

// reportGap says which whole periods before first have no record because the probe was not
// running: those after last, the latest record on disk, if it has the same period length
// (with another, its period numbers are on another scale).
func (r *Runner) reportGap(rn *run, last, first int64) {
	L, err := rn.store.PeriodNs(last)
	if err != nil {
		r.Log.Warn("altmark probe: read the last record on disk to find the periods missed", "period", last, "err", err)
		return
	}
	if L != rn.cfg.PeriodNs() {
		r.Log.Info("altmark probe: the records on disk have another period length; no gap computed",
			"last_period", last, "their_period", time.Duration(L), "period", time.Duration(rn.cfg.PeriodNs()))
		return
	}
	gapFirst, gapLast := last+1, first-1
	r.mu.Lock()
	r.status.GapFirst, r.status.GapLast = &gapFirst, &gapLast
	r.mu.Unlock()
	r.Metrics.GapPeriods.Set(float64(gapLast - gapFirst + 1))
	r.Log.Warn(fmt.Sprintf("altmark probe: periods %d to %d (%d) have no record: the probe was not running after period %d, its last record",
		gapFirst, gapLast, gapLast-gapFirst+1, last), "gap_first", gapFirst, "gap_last", gapLast)
}

// enqueue hands a record to the writer. A full queue means the writer is maxPending records
// behind: the record is dropped and said so, because waiting would make the next read late.
func (r *Runner) enqueue(rn *run, p *Period) {
	select {
	case rn.queue <- p:
		r.addPending(1)
	default:
		r.skip("write_backlog", "period %d: dropped: %d records are waiting for a slow or failing disk", p.Period, maxPending)
	}
}

// writer exports and writes the records the loop queues, in order. A record whose write
// fails is kept and retried (after retryWrite, or with the next record); past maxPending kept
// records the oldest is dropped, and said so. When the loop closes the queue, what is left is
// tried once more.
func (r *Runner) writer(rn *run) {
	defer close(rn.written)
	var failed []*Period
	retry := time.Duration(min(rn.cfg.PeriodNs(), int64(retryWrite)))
	for {
		var again <-chan time.Time
		if len(failed) > 0 {
			again = time.After(retry)
		}
		select {
		case p, ok := <-rn.queue:
			if !ok {
				failed = r.flush(rn, failed)
				for _, p := range failed {
					r.skip("write_failed", "period %d: not written before the probe stopped", p.Period)
				}
				r.addPending(-len(failed))
				return
			}
			if rn.export != nil {
				r.exportPeriod(rn, p)
			}
			failed = r.flush(rn, append(failed, p))
		case <-again:
			failed = r.flush(rn, failed)
		}
	}
}

// retryWrite is how soon a failed write is tried again (a period, if that is shorter).
const retryWrite = time.Second

// flush writes the records in order and returns those not written (the first failure stops it).
func (r *Runner) flush(rn *run, ps []*Period) []*Period {
	for len(ps) > 0 {
		p := ps[0]
		if err := r.write(rn.store, p); err != nil {
			r.Metrics.WriteErrors.Inc()
			r.mu.Lock()
			r.status.WriteErrors++
			r.mu.Unlock()
			r.report("write %v", err)
			break
		}
		ps = ps[1:]
		r.addPending(-1)
		r.Metrics.observe(p)
		r.mu.Lock()
		n := p.Period
		r.status.LastPeriod = &n
		r.status.PeriodsWritten++
		r.mu.Unlock()
	}
	for len(ps) > maxPending {
		r.skip("write_failed", "period %d: dropped after %d periods of write errors", ps[0].Period, maxPending)
		ps = ps[1:]
		r.addPending(-1)
	}
	return ps
}

// write stores a record, after the test hook if one is set.
func (r *Runner) write(s Store, p *Period) error {
	if r.writeHook != nil {
		r.writeHook(p)
	}
	return s.Write(p)
}

// addPending counts records read but not yet written (queued, or kept after a failed write);
// status and gauge change together under the lock, so neither is left behind by a race.
func (r *Runner) addPending(delta int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.status.PendingWrites += delta
	r.Metrics.PendingWrites.Set(float64(r.status.PendingWrites))
}

// record builds period n's record from what the datapath read, filling in what the loop knows.
// Every point has a row with flowmon_id -1 (the point's own: its counts with carriers that
// have no FlowMonID, its malformed packets with all) and, with ipv6-altmark, a row for each
// FlowMonID in ids, zeros when none came: a missing row is not a zero to a reader.
func (r *Runner) record(cfg *Config, n int64, counters []Counter, samples []Sample, ids []int64) *Period {
	L := cfg.PeriodNs()
	color := int32((n + int64(cfg.StartColor)) & 1)
	type key struct {
		ifname, dir string
		flow        int64
	}
	kept := map[key]int64{}
	for _, s := range samples {
		kept[key{s.Ifname, s.Direction, s.FlowMonID}]++
	}
	p := &Period{SchemaVersion: SchemaVersion, Probe: cfg.ProbeID, Period: n, PeriodNs: L, Color: color, StartTAINs: n * L,
		Counters: slices.Clone(counters), Samples: slices.Clone(samples)}
	rows := map[key]bool{}
	for _, c := range p.Counters {
		rows[key{c.Ifname, c.Direction, c.FlowMonID}] = true
	}
	for _, pt := range cfg.Points() {
		// The zero rows take the point's interface index and hash length from its own row.
		zero := Counter{Ifname: pt.Ifname, Direction: pt.Direction, FlowMonID: -1, HashBits: int32(cfg.HashBits)}
		if i := slices.IndexFunc(p.Counters, func(c Counter) bool {
			return c.Ifname == pt.Ifname && c.Direction == pt.Direction
		}); i >= 0 {
			zero.Ifindex, zero.HashBits = p.Counters[i].Ifindex, p.Counters[i].HashBits
		}
		for _, id := range append([]int64{-1}, ids...) {
			if !rows[key{pt.Ifname, pt.Direction, id}] {
				zero.FlowMonID = id
				p.Counters = append(p.Counters, zero)
			}
		}
	}
	for i := range p.Samples {
		p.Samples[i].Color = color // a sample of period n has n's color
	}
	for i := range p.Counters {
		c := &p.Counters[i]
		c.PeriodNs, c.Color, c.StartTAINs = L, color, n*L
		c.Carrier = cfg.Carrier
		c.HashRef = int64(cfg.HashRef)
		c.Samples = kept[key{c.Ifname, c.Direction, c.FlowMonID}]
		c.SchemaVersion = SchemaVersion
	}
	slices.SortFunc(p.Counters, func(a, b Counter) int {
		return cmp.Or(cmp.Compare(a.Ifname, b.Ifname), cmp.Compare(a.Direction, b.Direction), cmp.Compare(a.FlowMonID, b.FlowMonID))
	})
	slices.SortStableFunc(p.Samples, func(a, b Sample) int { return cmp.Compare(a.TAINs, b.TAINs) })
	if p.Samples == nil {
		p.Samples = []Sample{}
	}
	return p
}

// flowmonRows says which FlowMonIDs every point writes a row for (ipv6-altmark): the
// configured ones, and those counted at any of the probe's points in the last keep periods.
type flowmonRows struct {
	fixed []IDRange
	keep  int64
	last  map[int64]int64 // FlowMonID → the last period it was counted in
}

// maxLearnedFlowMons bounds the learned FlowMonIDs; past it the longest silent are forgotten.
const maxLearnedFlowMons = 1 << 16

func newFlowmonRows(cfg *Config) *flowmonRows {
	if cfg.Carrier != carrierIPv6AltMrk {
		return nil
	}
	f := &flowmonRows{fixed: cfg.FlowMonIDs, last: map[int64]int64{}}
	if cfg.FlowMonKeep != nil {
		f.keep = *cfg.FlowMonKeep
	}
	return f
}

// ids learns from period n's counters and returns the FlowMonIDs that get rows in n, sorted.
func (f *flowmonRows) ids(n int64, counters []Counter) []int64 {
	if f == nil {
		return nil
	}
	for _, c := range counters {
		if c.FlowMonID >= 0 && c.Packets > 0 {
			f.last[c.FlowMonID] = n
		}
	}
	maps.DeleteFunc(f.last, func(_, last int64) bool { return n-last > f.keep })
	if len(f.last) > maxLearnedFlowMons {
		byAge := slices.SortedFunc(maps.Keys(f.last), func(a, b int64) int { return cmp.Compare(f.last[a], f.last[b]) })
		for _, id := range byAge[:len(byAge)-maxLearnedFlowMons] {
			delete(f.last, id)
		}
	}
	set := maps.Clone(f.last)
	for _, r := range f.fixed {
		for id := int64(r.First); id <= int64(r.Last); id++ {
			set[id] = n
		}
	}
	return slices.Sorted(maps.Keys(set))
}

func (r *Runner) exportPeriod(rn *run, p *Period) {
	nc, ns, err := rn.export.Export(p)
	r.Metrics.ExportedRecs.WithLabelValues("counters").Add(float64(nc))
	r.Metrics.ExportedRecs.WithLabelValues("samples").Add(float64(ns))
	if err != nil {
		r.Metrics.ExportErrors.Inc()
		r.mu.Lock()
		r.status.ExportErrors++
		r.mu.Unlock()
		r.report("period %d: IPFIX export: %v", p.Period, err)
	}
}

// skip reports a whole period that gets no record.
func (r *Runner) skip(reason, format string, args ...any) {
	r.Metrics.PeriodsSkipped.WithLabelValues(reason).Inc()
	r.mu.Lock()
	r.status.PeriodsSkipped++
	r.mu.Unlock()
	r.report(format, args...)
}

// report makes an error visible: log, status (and the caller's metric).
func (r *Runner) report(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	r.Log.Error("altmark probe: " + msg)
	r.mu.Lock()
	r.status.LastError = msg
	r.status.LastErrorAt = r.Clock.Now()
	r.mu.Unlock()
}

// floorDiv is ⌊a/b⌋ for b > 0, also for negative a.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}
