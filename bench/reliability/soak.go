package main

// The soak part: `make demo`'s lab (examples/demo.yaml: h1 — r1 — h2, the r1—h2 link at
// 1 Gbit/s losing 1 %) with every subsystem attached at once — conntrack run on r1 (tcx, so
// the others see its traffic), prio router on r1's interface towards h1, a tune policy on h1's
// senders, altmark mark on h1 and altmark probe run on r1 — and iperf3 both ways for SOAK_TIME
// (default 30m). It reports the flowplane processes' memory, open files and threads and every
// pinned map's entries at start and end.

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/flowplane/flowplane/bench/report"
	"github.com/flowplane/flowplane/internal/cgroup"
	"github.com/flowplane/flowplane/internal/lab"
)

func init() { register(part{name: "soak", title: "soak: ", run: soak}) }

const (
	soakProbeAddr = "127.0.0.1:19465" // in r1's namespace
	soakIperfPort = "5401"
	soakIperfRun  = 20 * time.Second // per iperf3 run (at most half the soak); runs follow each other, every other one -R
	soakRate      = "100M"           // per stream, 2 streams
)

// soakFigures are the part's raw figures.
type soakFigures struct {
	Duration    string            `json:"duration"`
	IperfRun    string            `json:"iperf_run"`
	SampleEvery string            `json:"sample_every"`
	Rate        string            `json:"rate"`        // iperf3 -b, per stream
	Procs       map[string]series `json:"processes"`   // from start to end
	Maps        map[string][3]int `json:"map_entries"` // start, end, max entries
	RunsOK      int               `json:"iperf_runs_ok"`
	RunsFailed  int               `json:"iperf_runs_failed"`
	FirstFail   string            `json:"first_failure,omitempty"`
	Bytes       float64           `json:"bytes_received"`
	Probe       map[string]any    `json:"probe_status"`
	Exits       map[string]string `json:"exits"`               // process: its exit after SIGTERM
	ExitLogs    []string          `json:"exit_logs,omitempty"` // the last log line of those that failed
}

// soakProc is a flowplane process the soak keeps running.
type soakProc struct {
	name string
	cmd  *lab.NodeCmd
	log  string
}

func soak(ctx context.Context) ([]*report.Table, any, error) {
	d, err := envDuration("SOAK_TIME", 30*time.Minute)
	if err != nil {
		return nil, nil, err
	}
	fig, err := runSoak(ctx, d, soakRate)
	if err != nil {
		return nil, nil, err
	}
	return soakTables(fig), fig, nil
}

// runSoak is the soak for d, each iperf3 stream at rate (iperf3's -b).
func runSoak(ctx context.Context, d time.Duration, rate string) (fig soakFigures, err error) {
	bin, err := flowplaneBin()
	if err != nil {
		return fig, err
	}
	yaml, err := os.ReadFile("examples/demo.yaml")
	if err != nil {
		return fig, err
	}
	l, down, err := faultLab("soak", "examples/demo.yaml", yaml)
	if err != nil {
		return fig, err
	}
	defer down()
	dir, err := os.MkdirTemp("", "fp-reliability-soak-")
	if err != nil {
		return fig, err
	}
	defer os.RemoveAll(dir)
	fp := func(node string, args ...string) error {
		c, err := l.Command(context.Background(), node, bin, args...)
		if err != nil {
			return err
		}
		if out, err := c.CombinedOutput(); err != nil {
			return fmt.Errorf("flowplane %v on %s: %w: %s", args, node, err, out)
		}
		return nil
	}
	var devs struct{ r1in, r1out, h1 string }
	for _, x := range []struct {
		to         *string
		node, peer string
	}{{&devs.r1in, "r1", "h1"}, {&devs.r1out, "r1", "h2"}, {&devs.h1, "h1", "r1"}} {
		if *x.to, err = labDevice(l, x.node, x.peer); err != nil {
			return fig, err
		}
	}
	h2, err := labIface(l, "h2", "r1")
	if err != nil {
		return fig, err
	}

	// The long-running processes, stopped by SIGTERM at the end (killed if the part fails).
	var procs []*soakProc
	start := func(name, node string, args ...string) error {
		c, err := l.Command(context.Background(), node, bin, args...)
		if err != nil {
			return err
		}
		p := &soakProc{name: name, cmd: c, log: filepath.Join(dir, name+".log")}
		f, err := os.Create(p.log)
		if err != nil {
			return err
		}
		defer f.Close()
		c.Stdout, c.Stderr = f, f
		if err := c.Start(); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		procs = append(procs, p)
		return nil
	}
	defer func() {
		for _, p := range procs {
			if p.cmd.ProcessState == nil {
				_ = p.cmd.Process.Kill()
				_ = p.cmd.Wait()
			}
		}
	}()

	// conntrack at tcx ingress (not XDP: redirected packets would bypass the others' hooks).
	if err := start("conntrack run", "r1", "conntrack", "run", "--inside", devs.r1in, "--outside", devs.r1out, "--hook", "tc"); err != nil {
		return fig, err
	}
	if err := waitFor(60*time.Second, "conntrack run attached", func() bool {
		c, err := l.Command(context.Background(), "r1", bin, "conntrack", "status")
		if err != nil {
			return false
		}
		out, _ := c.Output()
		return strings.Contains(string(out), "\ninterface") || strings.HasPrefix(string(out), "interface")
	}); err != nil {
		return fig, err
	}
	// prio router towards h1 (the r1—h2 link has the lab's own HTB): iperf3 -R runs fill it.
	if err := fp("r1", "prio", "router", "apply", "--dev", devs.r1in, "--rate", "500mbit", "--config", "examples/prio-router.yaml"); err != nil {
		return fig, err
	}
	defer fp("r1", "prio", "router", "remove", "--dev", devs.r1in)
	// tune on a cgroup of its own, which h1's iperf3 clients join (tune exec).
	root, err := cgroup.Mount()
	if err != nil {
		return fig, err
	}
	cg := filepath.Join(root, "fp"+l.Name())
	if err := os.Mkdir(cg, 0o755); err != nil {
		return fig, err
	}
	defer func() {
		if err := cgroup.Remove(cg); err != nil {
			slog.Error("soak: remove the cgroup", "cgroup", cg, "err", err)
		}
	}()
	tuneName := "fp" + l.Name()
	if err := fp("h1", "tune", "--name", tuneName, "apply", "--cgroup", cg, "--config", "examples/tune-dc.yaml"); err != nil {
		return fig, err
	}
	defer fp("h1", "tune", "--name", tuneName, "remove")
	// altmark: the marker on h1's egress, the probe on both of r1's interfaces.
	markCfg, probeCfg := filepath.Join(dir, "mark.yaml"), filepath.Join(dir, "probe.yaml")
	if err := os.WriteFile(markCfg, []byte("period: 1s\ncarrier: dscp\n"), 0o644); err != nil {
		return fig, err
	}
	if err := os.WriteFile(probeCfg, []byte(fmt.Sprintf("probe_id: r1\ninterfaces: [{name: %s, direction: both}, {name: %s, direction: both}]\nperiod: 1s\ncarrier: dscp\ndata_dir: %s/data\n",
		devs.r1in, devs.r1out, dir)), 0o644); err != nil {
		return fig, err
	}
	if err := fp("h1", "altmark", "mark", "apply", "--dev", devs.h1, "--config", markCfg); err != nil {
		return fig, err
	}
	defer fp("h1", "altmark", "mark", "remove", "--dev", devs.h1)
	if err := start("altmark probe run", "r1", "altmark", "probe", "run", "--config", probeCfg, "--listen", soakProbeAddr); err != nil {
		return fig, err
	}

	if err := waitFor(60*time.Second, "altmark probe run answering", func() bool { _, err := probeStatus(l, soakProbeAddr, ""); return err == nil }); err != nil {
		return fig, err
	}

	// Traffic: an iperf3 server on h2; h1's clients run one after the other, in the tuned
	// cgroup, every other one reversed (h2 sends, through prio's bottleneck).
	srv, err := l.Command(ctx, "h2", "iperf3", "-s", "-p", soakIperfPort)
	if err != nil {
		return fig, err
	}
	if err := srv.Start(); err != nil {
		return fig, fmt.Errorf("iperf3 server: %w", err)
	}
	defer func() { _ = srv.Process.Kill(); _ = srv.Wait() }()
	time.Sleep(time.Second)
	run := max(min(soakIperfRun, d/2), time.Second)
	fig = soakFigures{Duration: d.String(), IperfRun: run.String(), SampleEvery: sampleEvery(d).String(), Rate: rate, Procs: map[string]series{}, Maps: map[string][3]int{}, Exits: map[string]string{}}
	tctx, stopTraffic := context.WithTimeout(ctx, d)
	defer stopTraffic()
	var mu sync.Mutex
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; tctx.Err() == nil; i++ {
			args := []string{"tune", "--name", tuneName, "exec", "--", "iperf3", "-c", h2.IPv4.Addr().String(), "-p", soakIperfPort,
				"-t", fmt.Sprint(int(run.Seconds())), "-b", rate, "-P", "2", "-J"}
			if i%2 == 1 {
				args = append(args, "-R")
			}
			c, err := l.Command(context.Background(), "h1", bin, args...)
			if err != nil {
				return
			}
			out, err := c.Output()
			var r struct {
				End struct {
					SumReceived struct {
						Bytes float64 `json:"bytes"`
					} `json:"sum_received"`
				} `json:"end"`
				Error string `json:"error"`
			}
			_ = json.Unmarshal(out, &r)
			mu.Lock()
			if err != nil || r.Error != "" || r.End.SumReceived.Bytes == 0 {
				fig.RunsFailed++
				if fig.FirstFail == "" {
					fig.FirstFail = fmt.Sprintf("run %d: %v %s", i, err, r.Error)
				}
				mu.Unlock()
				time.Sleep(time.Second) // the server may be finishing the last test
				continue
			}
			fig.RunsOK++
			fig.Bytes += r.End.SumReceived.Bytes
			mu.Unlock()
		}
	}()

	tokens := []string{l.Name(), tuneName}
	for _, n := range []string{"h1", "r1", "h2"} {
		ns, err := netnsPin(l, n)
		if err != nil {
			return fig, err
		}
		tokens = append(tokens, ns)
	}
	sample := func() error {
		for _, p := range procs {
			s, err := procStat(p.cmd.Process.Pid)
			if err != nil {
				return fmt.Errorf("%s: %w", p.name, err)
			}
			fig.Procs[p.name] = append(fig.Procs[p.name], s)
		}
		return nil
	}
	measure := func(at int) error {
		if err := sample(); err != nil {
			return err
		}
		m, err := mapEntries(tokens)
		if err != nil {
			return err
		}
		for k, n := range m {
			v := fig.Maps[k]
			v[at], v[2] = n[0], n[1]
			fig.Maps[k] = v
		}
		return nil
	}
	slog.Info("soak: every subsystem attached, traffic running", "lab", l.Name(), "for", d)
	time.Sleep(min(15*time.Second, d/4)) // the first connections are up, the tables filled
	if err := measure(0); err != nil {
		return fig, err
	}
	tick := time.NewTicker(sampleEvery(d))
	defer tick.Stop()
	for tctx.Err() == nil {
		select {
		case <-tick.C:
			if err := sample(); err != nil {
				return fig, err
			}
		case <-tctx.Done():
		}
	}
	if err := measure(1); err != nil {
		return fig, err
	}
	wg.Wait()
	fig.Probe, err = probeStatus(l, soakProbeAddr, "")
	if err != nil {
		slog.Error("soak: the probe's status", "err", err)
	}
	for _, p := range procs {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		err := p.cmd.Wait()
		fig.Exits[p.name] = "0"
		if err != nil {
			log, _ := os.ReadFile(p.log)
			fig.Exits[p.name] = err.Error()
			fig.ExitLogs = append(fig.ExitLogs, p.name+": "+lastLine(log))
		}
	}
	return fig, nil
}

// waitFor polls cond every 200 ms for at most d.
func waitFor(d time.Duration, what string, cond func() bool) error {
	for deadline := time.Now().Add(d); !cond(); time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			return fmt.Errorf("soak: %s: not after %v", what, d)
		}
	}
	return nil
}

func soakTables(f soakFigures) []*report.Table {
	procs := &report.Table{
		Title: fmt.Sprintf("soak: the flowplane processes over %s", f.Duration),
		Columns: []string{"process", "RSS start", "RSS end", "RSS min–max", "open files start", "open files end",
			"threads start", "threads end", "exit after SIGTERM"},
	}
	for _, name := range slices.Sorted(maps.Keys(f.Procs)) {
		s := f.Procs[name]
		start, end := s[0], s[len(s)-1]
		lo, hi := s.span(rssOf)
		procs.Rows = append(procs.Rows, []string{name, mib(start.RSSKiB), mib(end.RSSKiB), mib(lo) + "–" + mib(hi),
			fmt.Sprint(start.FDs), fmt.Sprint(end.FDs), fmt.Sprint(start.Threads), fmt.Sprint(end.Threads), f.Exits[name]})
		procs.Goals = append(procs.Goals, flatGoals(s))
	}
	if len(f.Procs) > 0 {
		procs.Notes = append(procs.Notes, "Sampled every "+f.SampleEvery+" of the run.")
	}
	procs.Notes = append(procs.Notes, f.ExitLogs...)
	mapsT := &report.Table{
		Title:   "soak: entries of the pinned maps (hash, LRU and LPM maps; arrays are full by definition)",
		Columns: []string{"map", "start", "end", "max entries"},
		Notes:   []string{"Pins under /sys/fs/bpf/flowplane/: conntrack/ the connection table, prio/ the router's flow table (LRU: a flow stays until evicted, so it grows with the connections opened, up to its size), altmark-mark/ the marker's per-flow table (unused with dscp and no double marking), tune/ the policy's rules. The lab's loss maps are arrays; the probe's maps are not pinned (its programs go with its process)."},
	}
	for _, name := range slices.Sorted(maps.Keys(f.Maps)) {
		v := f.Maps[name]
		mapsT.Rows = append(mapsT.Rows, []string{"`" + name + "`", fmt.Sprint(v[0]), fmt.Sprint(v[1]), fmt.Sprint(v[2])})
	}
	st := func(k string) string {
		if v, ok := f.Probe[k]; ok {
			return fmt.Sprint(v)
		}
		return "—"
	}
	traffic := &report.Table{
		Title:   "soak: traffic and records",
		Columns: []string{"iperf3 runs completed", "failed", "GB received", "altmark periods written", "skipped", "write errors"},
		Rows: [][]string{{fmt.Sprint(f.RunsOK), fmt.Sprint(f.RunsFailed), fmt.Sprintf("%.1f", f.Bytes/1e9),
			st("periods_written"), st("periods_skipped"), st("write_errors")}},
		Goals: [][]report.Goal{{report.Check("failed iperf3 runs", "0", f.RunsFailed == 0 && f.RunsOK > 0)}},
		Notes: []string{fmt.Sprintf("`make demo`'s lab with conntrack run (tcx) and altmark probe run on r1, prio router (500 Mbit/s, examples/prio-router.yaml) on r1 towards h1, tune (examples/tune-dc.yaml) on h1's clients and altmark mark on h1; iperf3 runs of %s, 2 streams of %sbit/s each, every other one reversed.", f.IperfRun, f.Rate)},
	}
	if f.FirstFail != "" {
		traffic.Notes = append(traffic.Notes, "first failed run: "+f.FirstFail)
	}
	return []*report.Table{procs, mapsT, traffic}
}
