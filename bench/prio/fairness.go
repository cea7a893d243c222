package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/flowplane/flowplane/bench/report"
	"github.com/flowplane/flowplane/internal/nsrun"
	"github.com/flowplane/flowplane/internal/prio"
)

// fairness is experiment 1, the original experiment scaled: N long-lived flows, half from each
// sender, per scheme, the schemes taking turns in each of -runs rounds.
func (b *bench) fairness(ctx context.Context) error {
	for _, n := range b.c.flows {
		title := fmt.Sprintf("Fairness: %d long-lived flows, %s bottleneck%s, %s window", n, fmtRate(b.c.rate), b.delayNote(), b.c.dur)
		cols := []string{"scheme", "mean Mbit/s", "std Mbit/s", "std / fair", "Jain", "utilization", "utilization / fair", "band changes / flow / s", "retransmitted %", "received twice %", "flows measured"}
		if b.c.runs > 1 {
			title += fmt.Sprintf(", median of %d runs", b.c.runs)
			cols = append(cols, "Jain min–max", "runs with std ≤ fair")
		}
		t := &report.Table{Title: title, Columns: cols}
		runs := map[string][]fairRun{}
		for round := range b.c.runs {
			for _, scheme := range b.c.schemes {
				slog.Info("fairness", "flows", n, "scheme", scheme, "run", round+1)
				r, err := b.fairRun(ctx, n, scheme)
				if err != nil {
					return err
				}
				s := summarize(r.bps)
				slog.Info("fairness run", "flows", n, "scheme", scheme, "run", round+1, "jain", fmt.Sprintf("%.3f", s.jain), "std_mbps", fmt.Sprintf("%.3f", s.std/1e6), "utilization", fmt.Sprintf("%.3f", s.sum/float64(b.c.rate)))
				runs[scheme] = append(runs[scheme], r)
			}
		}
		pooled := map[string][]float64{} // every run's flows, for the plot and the JSON
		for _, scheme := range b.c.schemes {
			var col [9][]float64
			var jains []float64
			failed, measured, fairer := 0, 0, 0
			for i, r := range runs[scheme] {
				s, fair := summarize(r.bps), summary{}
				if fr := runs["fair"]; i < len(fr) {
					fair = summarize(fr[i].bps)
				}
				for j, v := range []float64{s.mean / 1e6, s.std / 1e6, div(s.std, fair.std), s.jain, s.sum / float64(b.c.rate), div(s.sum, fair.sum), r.flips, r.retrans, r.dups} {
					col[j] = append(col[j], v)
				}
				if s.std <= fair.std {
					fairer++
				}
				jains = append(jains, s.jain)
				failed += r.failed
				measured += len(r.bps)
				pooled[scheme] = append(pooled[scheme], r.bps...)
			}
			cells := []any{scheme}
			for _, c := range col {
				if slices.ContainsFunc(c, math.IsNaN) {
					cells = append(cells, "—") // a ratio to a fair run that is missing or 0
					continue
				}
				cells = append(cells, report.Median(c))
			}
			cells = append(cells, measured/b.c.runs)
			if b.c.runs > 1 {
				cells = append(cells, fmt.Sprintf("%.3f–%.3f", slices.Min(jains), slices.Max(jains)))
				if len(runs["fair"]) == 0 || scheme == "fair" {
					cells = append(cells, "—")
				} else {
					cells = append(cells, fmt.Sprintf("%d of %d", fairer, b.c.runs))
				}
			}
			t.Add(cells...)
			if n == 200 && scheme == "occupancy" {
				// docs/prio.md's goals: occupancy at 200 flows at least as fair as fair,
				// at 0.98 of its utilization.
				med := func(c []float64) float64 {
					if len(c) == 0 || slices.ContainsFunc(c, math.IsNaN) {
						return math.NaN()
					}
					return report.Median(c)
				}
				t.Goal(report.AtLeast("Jain (median)", med(col[3]), 0.95), report.AtMost("std / fair", med(col[2]), 1),
					report.AtLeast("utilization / fair", med(col[5]), 0.98))
			}
			if failed > 0 {
				t.Notes = append(t.Notes, fmt.Sprintf("%s: %d of %d flows could not connect.", scheme, failed, n*b.c.runs))
			}
		}
		t.Notes = append(t.Notes, "Goodput: bytes acknowledged (TCP_INFO) over the window, after "+fairWarmUp.String()+" of warm-up. Received twice: segments the receivers reported with DSACK, link capacity spent on data already delivered (a lower bound: receivers do not report every duplicate, docs/prio.md). Ratios against fair of the same run; — where fair did not run.")
		if b.c.runs > 1 {
			t.Notes = append(t.Notes, "Each cell is the median over the runs; the schemes took turns in every run.")
		}
		b.table(t)
		b.res.Data[b.key(fmt.Sprintf("fairness_%d_bps", n))] = pooled
		file, title := fmt.Sprintf("fairness-%d%s.png", n, b.tag()), fmt.Sprintf("Per-flow goodput, %d flows", n)
		if err := plotCDFs(b.out, file, title, "Mbit/s", pooled, b.c.schemes, 1e-6); err != nil {
			return err
		}
		t.Plots = append(t.Plots, report.Plot{Title: title, File: b.name + "/" + file})
	}
	return nil
}

// fairWarmUp is how long flows run before the measured window.
const fairWarmUp = 5 * time.Second

// fairRun is one scheme's run of experiment 1.
type fairRun struct {
	bps           []float64 // per-flow goodput over the window
	failed        int       // flows that could not connect
	flips         float64   // band changes per flow per second
	retrans, dups float64   // % of data segments retransmitted / received twice (DSACK)
}

func (b *bench) fairRun(ctx context.Context, n int, scheme string) (fairRun, error) {
	var r fairRun
	p, err := b.policy(scheme, nil)
	if err != nil {
		return r, err
	}
	err = b.withRouter(p, b.c.rate, func() error {
		at := strconv.FormatInt(time.Now().Add(fairWarmUp).UnixMilli(), 10)
		outs, err := b.onSenders(ctx, func(i int) []string {
			k := n / len(b.senders)
			if i < n%len(b.senders) {
				k++
			}
			return []string{"long", "-dst", b.dsts, "-n", strconv.Itoa(k), "-at", at, "-d", b.c.dur.String()}
		})
		if err != nil {
			return err
		}
		var resent, dup, sent uint64
		for _, o := range outs {
			var lr LongResult
			if err := json.Unmarshal(o, &lr); err != nil {
				return fmt.Errorf("generator output: %w", err)
			}
			r.bps = append(r.bps, lr.Bps...)
			r.failed += lr.Failed
			resent, dup, sent = resent+lr.Retrans, dup+lr.Dups, sent+lr.DataSegs
		}
		if sent > 0 {
			r.retrans = 100 * float64(resent) / float64(sent)
			r.dups = 100 * float64(dup) / float64(sent)
		}
		// How often flows changed band (each change can reorder a flow's packets between two
		// queues): the flows' counters on r1, over warm-up and window.
		return nsrun.Do(b.l.Netns("r1"), func() error {
			st, err := prio.ReadStatus()
			if err != nil || len(st.Routers) == 0 {
				return fmt.Errorf("prio status on r1: %v", err)
			}
			var n, changes float64
			for _, f := range st.Routers[0].Flows {
				if f.Proto == 6 && f.Bytes > 0 {
					n, changes = n+1, changes+float64(f.BandChanges)
				}
			}
			if n > 0 {
				r.flips = changes / n / (fairWarmUp + b.c.dur).Seconds()
			}
			return nil
		})
	})
	return r, err
}

type summary struct{ sum, mean, std, jain float64 }

func summarize(x []float64) summary {
	var s summary
	if len(x) == 0 {
		return s
	}
	var sq float64
	for _, v := range x {
		s.sum += v
		sq += v * v
	}
	n := float64(len(x))
	s.mean = s.sum / n
	s.std = math.Sqrt(max(sq/n-s.mean*s.mean, 0))
	if sq > 0 {
		s.jain = s.sum * s.sum / (n * sq)
	}
	return s
}

// div is a/b, NaN when there is no b.
func div(a, b float64) float64 {
	if b == 0 {
		return math.NaN()
	}
	return a / b
}

// ratio is a/b as a table cell, "—" when there is no b.
func ratio(a, b float64) any {
	if b == 0 {
		return "—"
	}
	return a / b
}

// percentile is the p-th percentile (0-100) of x, nearest rank.
func percentile(x []float64, p float64) float64 {
	if len(x) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(x))
	i := int(math.Ceil(p/100*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func fmtRate(bps uint64) string { return fmt.Sprintf("%g Mbit/s", float64(bps)/1e6) }
