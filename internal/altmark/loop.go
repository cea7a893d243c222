package altmark

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"
)

// The read rule (RFC 9341, docs/altmark.md "Read rule"): period n (TAI in [nL, (n+1)L)) is read
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

	mu     sync.Mutex
	cfg    *Config
	cur    *run
	status Status
}

// maxPending bounds the records kept in memory while writing fails.
const maxPending = 64

// Status is what GET /status answers.
type Status struct {
	State          string `json:"state"` // stopped, running, stopping, finished, failed
	Probe          string `json:"probe"`
	PeriodNs       int64  `json:"period_ns"`
	Now            int64  `json:"now_tai_ns"`
	CurrentPeriod  int64  `json:"current_period"`
	StartedAt      int64  `json:"started_tai_ns,omitempty"`
	FirstPeriod    *int64 `json:"first_period,omitempty"` // the first whole period of this run
	LastPeriod     *int64 `json:"last_period,omitempty"`  // the latest period written
	PeriodsWritten int64  `json:"periods_written"`        // in this run
	PeriodsSkipped int64  `json:"periods_skipped"`        // whole periods without a record, in this run
	PendingWrites  int    `json:"pending_writes"`
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
	pending []*Period
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
	rn := &run{cfg: cfg, store: store, stop: make(chan struct{}), done: make(chan struct{})}
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
	go r.loop(rn)
	return nil
}

// prepareDir creates the data directory, removes temporary files a crash left, and checks
// that a file can be created there, so a bad data_dir fails Start instead of the first period.
func prepareDir(s Store) error {
	if err := os.MkdirAll(s.Dir, 0o755); err != nil {
		return fmt.Errorf("data_dir: %w", err)
	}
	if err := s.RemoveTemporary(); err != nil {
		return fmt.Errorf("data_dir: remove temporary files: %w", err)
	}
	f, err := os.CreateTemp(s.Dir, ".probe-write-check-*"+tmpSuffix)
	if err != nil {
		return fmt.Errorf("data_dir: %w", err)
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
	if last, ok, err := rn.store.Last(); err != nil {
		r.report("list the periods already written: %v", err)
	} else if ok && last >= first {
		first = last + 1 // never overwrite a record (a clock stepped back)
	}
	r.mu.Lock()
	r.status.FirstPeriod = &first
	r.mu.Unlock()
	r.Log.Info("altmark probe running", "probe", rn.cfg.ProbeID, "period", time.Duration(L), "first_period", first)

	state := "stopped"
	recorded := int64(0)
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
				p := r.record(rn.cfg, n, counters, samples)
				rn.pending = append(rn.pending, p)
				r.flush(rn)
				if rn.export != nil {
					r.exportPeriod(rn, p)
				}
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
	r.flush(rn)
	for _, p := range rn.pending {
		r.skip("write_failed", "period %d: not written before the probe stopped", p.Period)
	}
	if err := rn.dp.Close(); err != nil {
		r.report("detach the probe: %v", err)
	}
	if rn.export != nil {
		rn.export.Close()
	}
	r.Metrics.Running.Set(0)
	r.Metrics.PendingWrites.Set(0)
	r.mu.Lock()
	r.status.State = state
	r.status.PendingWrites = 0
	r.cur = nil
	r.mu.Unlock()
	r.Log.Info("altmark probe "+state, "probe", rn.cfg.ProbeID, "periods", recorded)
	close(rn.done)
}

// record builds period n's record from what the datapath read, filling in what the loop knows.
func (r *Runner) record(cfg *Config, n int64, counters []Counter, samples []Sample) *Period {
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
	// Every point has a row even when the datapath gave none (no packet): a missing row is not
	// a zero to a reader. Carriers with FlowMonIDs have rows per flow seen only.
	if cfg.Carrier != carrierIPv6AltMrk {
		for _, pt := range cfg.Points() {
			if !slices.ContainsFunc(p.Counters, func(c Counter) bool { return c.Ifname == pt.Ifname && c.Direction == pt.Direction }) {
				p.Counters = append(p.Counters, Counter{Ifname: pt.Ifname, Direction: pt.Direction, FlowMonID: -1, HashBits: int32(cfg.HashBits)})
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
	if p.Counters == nil {
		p.Counters = []Counter{}
	}
	if p.Samples == nil {
		p.Samples = []Sample{}
	}
	return p
}

// flush writes the pending records in order; a failure keeps them for the next period.
func (r *Runner) flush(rn *run) {
	for len(rn.pending) > 0 {
		p := rn.pending[0]
		if err := rn.store.Write(p); err != nil {
			r.Metrics.WriteErrors.Inc()
			r.mu.Lock()
			r.status.WriteErrors++
			r.mu.Unlock()
			r.report("write %v", err)
			break
		}
		rn.pending = rn.pending[1:]
		r.Metrics.observe(p)
		r.mu.Lock()
		n := p.Period
		r.status.LastPeriod = &n
		r.status.PeriodsWritten++
		r.mu.Unlock()
	}
	for len(rn.pending) > maxPending {
		r.skip("write_failed", "period %d: dropped after %d periods of write errors", rn.pending[0].Period, maxPending)
		rn.pending = rn.pending[1:]
	}
	r.Metrics.PendingWrites.Set(float64(len(rn.pending)))
	r.mu.Lock()
	r.status.PendingWrites = len(rn.pending)
	r.mu.Unlock()
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
