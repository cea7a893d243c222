package conntrack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/flowplane/flowplane/internal/attach"
	"github.com/flowplane/flowplane/internal/cli"
	"github.com/flowplane/flowplane/internal/pin"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Sweep interval bounds: the sweep adapts between them to how much it finds expired.
const (
	minSweep = 1 * time.Second
	maxSweep = 30 * time.Second
)

// Run loads the program, attaches it to the interfaces, sweeps expired entries until ctx is
// done, then detaches. The pinned tables outlive it.
func Run(ctx context.Context, cfg *resolved, inside, outside []*net.Interface, metricsAddr string) error {
	return run(ctx, cfg, inside, outside, metricsAddr, nil)
}

// run is Run calling ready (if set) once the program is attached.
func run(ctx context.Context, cfg *resolved, inside, outside []*net.Interface, metricsAddr string, ready func()) error {
	plan, err := planHooks(cfg.hook, inside, outside)
	if err != nil {
		return err
	}
	inst, err := Instance()
	if err != nil {
		return err
	}
	// Refused before Load: Load and Resync write into the pinned tables the running one uses.
	ri := runInstance(inst)
	if live, err := ri.Running(); err != nil {
		return err
	} else if live {
		return cli.Usagef("%s: %v: stop that run first", ri.What, attach.ErrRunning)
	}
	lc := *cfg
	lc.hook = plan.build()
	d, err := Load(&lc)
	if err != nil {
		return err
	}
	defer func() {
		if err := d.Close(); err != nil {
			slog.Warn("detach conntrack", "err", err)
		}
		slog.Info("conntrack detached; the table stays pinned", "dir", d.dir)
	}()
	// The tables may be a previous run's: the kernel moved their TCP windows meanwhile.
	if n, err := d.Tables().Resync(); err != nil {
		return err
	} else if n > 0 {
		slog.Info("conntrack: TCP connections of the previous run picked up mid-stream (windows re-learnt, not checked)", "connections", n)
	}
	var links []attach.Link
	rec := &RunRecord{PID: os.Getpid()}
	for _, p := range plan {
		l, err := d.link(p.ifc, p.inside, p.hook)
		if err != nil {
			return err
		}
		links = append(links, l)
		rec.Interfaces = append(rec.Interfaces, IfaceHook{Interface: p.ifc.Name, Index: p.ifc.Index, Role: role(p.inside), Hook: p.hook})
	}
	r, res, err := ri.Start(&attach.Spec{Links: links, Record: rec})
	if res.Cleaned != nil {
		slog.Warn("cleaned what was left of "+res.Cleaned.What, "why", res.Cleaned.Why)
	}
	if errors.Is(err, attach.ErrRunning) {
		return cli.Usagef("%v: stop that run first", err)
	}
	if err != nil {
		return err
	}
	defer func() {
		if err := r.Stop(); err != nil {
			slog.Warn("detach conntrack", "err", err)
		}
	}()
	for _, p := range plan {
		if p.why != "" {
			slog.Info("conntrack hook", "interface", p.ifc.Name, "hook", p.hook, "why", p.why)
		} else {
			slog.Info("conntrack hook", "interface", p.ifc.Name, "hook", p.hook)
		}
	}
	mode := "firewall"
	if cfg.trackOnly {
		mode = "track"
	}
	slog.Info("conntrack running", "inside", names(inside), "outside", names(outside), "mode", mode, "hooks", plan.String(), "pins", d.dir)
	t := d.Tables()
	if metricsAddr != "" {
		reg := prometheus.NewRegistry()
		reg.MustRegister(NewCollector(t))
		srv := &http.Server{Addr: metricsAddr, Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 5 * time.Second}
		ln, err := net.Listen("tcp", metricsAddr)
		if err != nil {
			return fmt.Errorf("metrics listener: %w", err)
		}
		go func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				slog.Error("metrics server", "err", err)
			}
		}()
		defer srv.Close()
		slog.Info("serving metrics", "addr", ln.Addr().String())
	}
	if ready != nil {
		ready()
	}
	return sweepLoop(ctx, t)
}

// RunRecord is what a running `conntrack run` records (/run/flowplane/conntrack/<netns>.json,
// with its links' IDs): status tells a run that is attached from one that was killed.
type RunRecord struct {
	PID        int         `json:"pid"`
	Interfaces []IfaceHook `json:"interfaces"`
}

// runInstance is a namespace's `conntrack run` as internal/attach knows it: in the foreground,
// its links held by the process; Teardown drops ct_hooks, which lists them for status.
func runInstance(inst string) attach.Instance {
	return attach.Instance{Pin: []string{"conntrack", inst}, What: "conntrack run in this network namespace", Foreground: true,
		Teardown: func() error {
			if err := os.Remove(filepath.Join(pin.Path("conntrack", inst), "ct_hooks")); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
			return nil
		}}
}

func role(inside bool) string {
	if inside {
		return "inside"
	}
	return "outside"
}

func names(ifs []*net.Interface) []string {
	var n []string
	for _, i := range ifs {
		n = append(n, i.Name)
	}
	return n
}

// sweepLoop removes expired entries. The interval starts at a quarter of the shortest timeout
// (within [minSweep, maxSweep]), halves while sweeps find many expired entries and doubles
// back while they find none.
func sweepLoop(ctx context.Context, t *Tables) error {
	interval := baseInterval(t)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(interval):
		}
		start := time.Now()
		removed, live, err := t.Sweep()
		if err != nil {
			return fmt.Errorf("sweep: %w", err)
		}
		base := baseInterval(t) // timeouts may have changed at run time
		switch {
		case removed > 0 && removed*4 >= live:
			interval = max(interval/2, minSweep)
		case removed == 0:
			interval = min(interval*2, base)
		default:
			interval = min(interval, base)
		}
		slog.Debug("swept", "removed", removed, "live", live, "took", time.Since(start), "next", interval)
	}
}

func baseInterval(t *Tables) time.Duration {
	to, _, err := t.Timeouts()
	if err != nil {
		return minSweep
	}
	shortest := maxSweep * 4
	for name, d := range to {
		if name != "tcp_none" && d > 0 && d < shortest {
			shortest = d
		}
	}
	return min(max(shortest/4, minSweep), maxSweep)
}

// Serve checks cfg, finds its interfaces in the calling thread's namespace and runs until ctx
// is done, calling ready (if set) once attached. Bad configuration returns an error before
// anything is loaded.
func Serve(ctx context.Context, cfg *Config, metricsAddr string, ready func()) error {
	r, err := cfg.resolve()
	if err != nil {
		return err
	}
	in, err := interfaces(cfg.Inside)
	if err != nil {
		return err
	}
	out, err := interfaces(cfg.Outside)
	if err != nil {
		return err
	}
	return run(ctx, r, in, out, metricsAddr, ready)
}
