package main

// The altmark-api part: `altmark probe run --listen` on a lab router, recording 1-s periods of
// colored pings, under 50 API clients for API_LOAD_TIME (default 10m); the probe process's
// memory, open files (by kind) and threads before the clients come, under the load and after
// they leave.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/flowplane/flowplane/bench/report"
	"github.com/flowplane/flowplane/internal/altmark"
	"github.com/flowplane/flowplane/internal/lab"
)

func init() { register(part{name: "altmark-api", title: "altmark-api: ", run: altmarkAPILoad}) }

const (
	apiClients  = 50
	apiInterval = 100 * time.Millisecond // per client: 500 requests/s in all
	apiAddr     = "127.0.0.1:19464"      // in r1's namespace, which is the lab's own
)

// apiFigures are the part's raw figures.
type apiFigures struct {
	Duration  string             `json:"duration"`
	Load      altmark.LoadResult `json:"load"`
	Before    procFigures        `json:"before_clients"`
	Samples   series             `json:"samples"` // from 10 s into the load, every 30 s under it
	After     procFigures        `json:"after_clients"`
	Status    map[string]any     `json:"status"` // GET /status at the end
	ExitError string             `json:"exit_error,omitempty"`
}

func altmarkAPILoad(ctx context.Context) ([]*report.Table, any, error) {
	d, err := envDuration("API_LOAD_TIME", 10*time.Minute)
	if err != nil {
		return nil, nil, err
	}
	bin, err := flowplaneBin()
	if err != nil {
		return nil, nil, err
	}
	l, down, err := faultLab("rapi", "altmark-api.yaml", []byte(lab.HostRouterHost))
	if err != nil {
		return nil, nil, err
	}
	defer down()
	in, err := labDevice(l, "r1", "h1")
	if err != nil {
		return nil, nil, err
	}
	out, err := labDevice(l, "r1", "h2")
	if err != nil {
		return nil, nil, err
	}
	h2, err := labIface(l, "h2", "r1")
	if err != nil {
		return nil, nil, err
	}
	dir, err := os.MkdirTemp("", "fp-reliability-api-")
	if err != nil {
		return nil, nil, err
	}
	defer os.RemoveAll(dir)
	cfg := fmt.Sprintf("probe_id: r1\ninterfaces: [{name: %s, direction: both}, {name: %s, direction: both}]\nperiod: 1s\ncarrier: dscp\nhash_bits: 2\ndata_dir: %s/data\n", in, out, dir)
	tok := make([]byte, 16)
	_, _ = rand.Read(tok)
	token := hex.EncodeToString(tok)
	for name, data := range map[string]string{"probe.yaml": cfg, "token": token} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o600); err != nil {
			return nil, nil, err
		}
	}

	// Colored pings h1 → h2 (DSCP bit 0: color 1), 100 a second, for the records.
	pctx, stopPing := context.WithCancel(ctx)
	defer stopPing()
	ping, err := l.Command(pctx, "h1", "ping", "-q", "-Q", "4", "-i", "0.01", h2.IPv4.Addr().String())
	if err != nil {
		return nil, nil, err
	}
	if err := ping.Start(); err != nil {
		return nil, nil, fmt.Errorf("ping: %w", err)
	}
	defer func() { stopPing(); _ = ping.Wait() }()

	probe, err := l.Command(context.Background(), "r1", bin, "altmark", "probe", "run", "--config", filepath.Join(dir, "probe.yaml"),
		"--listen", apiAddr, "--token-file", filepath.Join(dir, "token"))
	if err != nil {
		return nil, nil, err
	}
	logf, err := os.Create(filepath.Join(dir, "probe.log"))
	if err != nil {
		return nil, nil, err
	}
	defer logf.Close()
	probe.Stdout, probe.Stderr = logf, logf
	if err := probe.Start(); err != nil {
		return nil, nil, fmt.Errorf("altmark probe run: %w", err)
	}
	defer func() { _ = probe.Process.Kill(); _ = probe.Wait() }()
	pid := probe.Process.Pid
	dial := dialIn(l.Netns("r1"))
	status := func() (map[string]any, error) { return probeStatus(l, apiAddr, token) }
	// Running, and a few periods written, before the load.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		st, err := status()
		if err == nil && st["periods_written"].(float64) >= 3 {
			break
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(logf.Name())
			return nil, nil, fmt.Errorf("the probe's API did not come up with 3 periods written in 30 s: %v\n%s", err, log)
		}
	}

	fig := apiFigures{Duration: d.String()}
	time.Sleep(time.Second) // the status checks' connections closed at the probe's end too
	if fig.Before, err = procStat(pid); err != nil {
		return nil, nil, err
	}
	slog.Info("altmark-api: load", "clients", apiClients, "interval", apiInterval, "for", d)
	lctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	done := make(chan altmark.LoadResult, 1)
	go func() {
		done <- altmark.Load{Base: "http://" + apiAddr, Token: token, Clients: apiClients, Interval: apiInterval, Dial: dial}.Run(lctx)
	}()
	// From when every client has connected and asked a few times, to the end of the load.
	time.Sleep(min(10*time.Second, d/4))
	first, err := procStat(pid)
	if err != nil {
		return nil, nil, err
	}
	fig.Samples = series{first}
	tick := time.NewTicker(sampleEvery(d))
	defer tick.Stop()
	var res altmark.LoadResult
wait:
	for {
		select {
		case res = <-done:
			break wait
		case <-tick.C:
			if s, err := procStat(pid); err == nil {
				fig.Samples = append(fig.Samples, s)
			}
		}
	}
	fig.Load = res
	// After the clients have gone: their connections closed, the server's ends too.
	time.Sleep(2 * time.Second)
	if fig.After, err = procStat(pid); err != nil {
		return nil, nil, err
	}
	if fig.Status, err = status(); err != nil {
		return nil, nil, err
	}
	_ = probe.Process.Signal(syscall.SIGTERM)
	if err := probe.Wait(); err != nil {
		log, _ := os.ReadFile(logf.Name())
		fig.ExitError = fmt.Sprintf("%v (%s)", err, lastLine(log))
	}
	return apiTables(fig), fig, nil
}

func apiTables(f apiFigures) []*report.Table {
	res := f.Load
	load := &report.Table{
		Title:   fmt.Sprintf("altmark-api: %d clients, a request every %v each, for %s", res.Clients, apiInterval, f.Duration),
		Columns: []string{"requests", "errors", "p50", "p99", "max", "periods written", "periods skipped"},
		Rows: [][]string{{fmt.Sprint(res.Requests), fmt.Sprint(res.Errors), res.P50.Round(time.Microsecond).String(),
			res.P99.Round(time.Microsecond).String(), res.Max.Round(time.Microsecond).String(),
			fmt.Sprint(f.Status["periods_written"]), fmt.Sprint(f.Status["periods_skipped"])}},
		Goals: [][]report.Goal{{report.Check("errors", "0", res.Errors == 0)}},
		Notes: []string{"`altmark probe run --listen` on a lab router (two interfaces, both directions, 1-s periods of 100 colored pings a second); each client has a connection of its own and asks in turn for /status, /periods, the latest /periods/{n}, /metrics and /config. Latencies include the machine's other load."},
	}
	if res.FirstError != "" {
		load.Notes = append(load.Notes, "first error: "+res.FirstError)
	}
	if f.ExitError != "" {
		load.Notes = append(load.Notes, "the probe's exit after SIGTERM: "+f.ExitError)
	}
	s := f.Samples
	start, end := s[0], s[len(s)-1]
	count := func(name string, of func(procFigures) int64, show func(int64) string) []string {
		h1, h2 := s.halves(of)
		l1, l2 := s.floors(of)
		lo, hi := s.span(of)
		return []string{name, show(of(f.Before)), show(of(start)), show(of(end)), show(lo) + "–" + show(hi),
			show(h1) + ", " + show(l1), show(h2) + ", " + show(l2), show(of(f.After))}
	}
	num := func(v int64) string { return fmt.Sprint(v) }
	fdLow0, fdLow1 := s.floors(fdsOf)
	proc := &report.Table{
		Title:   "altmark-api: the probe process under the load",
		Columns: []string{"figure", "before the clients", "start", "end", "min–max", "1st half: median, fewest", "2nd half: median, fewest", "after the clients left"},
		Rows: [][]string{
			count("RSS", rssOf, mib),
			count("open files", fdsOf, num),
			count("of which sockets", socketsOf, num),
			count("threads", func(p procFigures) int64 { return int64(p.Threads) }, num),
		},
		Goals: [][]report.Goal{{flatGoals(s)[0]}, {
			report.AtMost("open files, after the clients left − before them", float64(f.After.FDs-f.Before.FDs), 0),
			report.AtMost("open files, fewest in the 2nd half − fewest in the 1st", float64(fdLow1-fdLow0), 0),
		}},
		Notes: []string{fmt.Sprintf("%d samples, from 10 s into the load (every client connected) to its end; before and after them, the probe runs without clients (just before they come, 2 s after they leave). Flat, for a server with 50 keep-alive clients, is its own files plus a socket per client while they are connected, all given back when they leave; a sample also catches the period files a request reads or the loop writes at that moment (the medians wander by a few), so the goals compare before with after, and the halves' floors (fewest).", len(s)),
			apiFilesNote(f)},
	}
	return []*report.Table{load, proc}
}

// apiFilesNote says what the probe's open files were under the load, by kind (the sample with
// the most, against the one before the clients came).
func apiFilesNote(f apiFigures) string {
	most := f.Samples[0]
	for _, x := range f.Samples {
		if x.FDs > most.FDs {
			most = x
		}
	}
	kinds := func(p procFigures) string {
		var ks []string
		for _, k := range slices.Sorted(maps.Keys(p.FDKinds)) {
			ks = append(ks, fmt.Sprintf("%d %s", p.FDKinds[k], k))
		}
		return strings.Join(ks, ", ")
	}
	return fmt.Sprintf("Open files by kind: before the clients %s; in the sample with the most (%d) %s.", kinds(f.Before), most.FDs, kinds(most))
}
