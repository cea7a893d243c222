package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/flowplane/flowplane/bench/report"
)

// Size classes of the FCT tables (PIAS's): small < 100 KB ≤ medium < 10 MB ≤ large.
const smallMax, mediumMax = 100e3, 10e6

// fct is experiment 2: flow completion times per workload, load and scheme.
func (b *bench) fct(ctx context.Context) error {
	for _, w := range b.c.workloads {
		file := filepath.Join("bench/prio/cdf", w+".txt")
		cdf, err := LoadCDF(w, file, b.c.capBytes)
		if err != nil {
			return err
		}
		// PIAS's edges come from the workload, for 4 bands.
		pias := cdf.PIASThresholds(4)
		for _, load := range b.c.loads {
			t := &report.Table{
				Title: fmt.Sprintf("FCT: %s, load %g%%, %s bottleneck%s (ratios to fifo; fifo in ms)", w, load*100, fmtRate(b.c.rate), b.delayNote()),
				Columns: []string{"scheme", "small mean", "small p99", "medium mean", "medium p99", "large mean",
					"flows done", "unfinished"},
			}
			flows := map[string][]Flow{}
			for _, scheme := range b.c.fctSchemes {
				p, err := b.policy(scheme, pias)
				if err != nil {
					return err
				}
				slog.Info("fct", "workload", w, "load", load, "scheme", scheme)
				err = b.withRouter(p, b.c.rate, func() error {
					outs, err := b.onSenders(ctx, func(i int) []string {
						return []string{"fct", "-dst", b.dsts, "-cdf", file, "-cap", strconv.FormatFloat(b.c.capBytes, 'f', 0, 64),
							"-load", strconv.FormatFloat(load/float64(len(b.senders)), 'f', 4, 64),
							"-rate", strconv.FormatUint(b.c.rate, 10), "-d", b.c.fctDur.String(),
							"-bg", strconv.Itoa(b.c.bg), "-seed", strconv.Itoa(i + 1), "-drain", (30 * time.Second).String()}
					})
					if err != nil {
						return err
					}
					var raw []json.RawMessage
					for _, o := range outs {
						for _, line := range bytes.Split(bytes.TrimSpace(o), []byte("\n")) {
							var f Flow
							if err := json.Unmarshal(line, &f); err != nil {
								return fmt.Errorf("generator output: %w", err)
							}
							flows[scheme] = append(flows[scheme], f)
							raw = append(raw, line)
						}
					}
					return b.saveJSONL(fmt.Sprintf("fct-%s-%g-%s%s.jsonl", w, load*100, filepath.Base(scheme), b.tag()), raw)
				})
				if err != nil {
					return err
				}
			}
			base, fair := classes(flows["fifo"]), classes(flows["fair"])
			for _, scheme := range b.c.fctSchemes {
				c := classes(flows[scheme])
				done, unfinished := 0, 0
				for _, f := range flows[scheme] {
					if f.Done {
						done++
					} else {
						unfinished++
					}
				}
				if scheme == "fifo" {
					t.Add(scheme, c.smallMean, c.smallP99, c.medMean, c.medP99, c.largeMean, done, unfinished)
					continue
				}
				t.Add(scheme, ratio(c.smallMean, base.smallMean), ratio(c.smallP99, base.smallP99),
					ratio(c.medMean, base.medMean), ratio(c.medP99, base.medP99), ratio(c.largeMean, base.largeMean), done, unfinished)
				if scheme == "backlog" && load == 0.8 && b.delay == 0 {
					// docs/prio.md's goals: at 80 % load backlog cuts small flows' tail below
					// fifo's and fair's, large flows paying at most 10 % against fair.
					t.Goal(report.AtMost("small p99 / fifo's", div(c.smallP99, base.smallP99), 0.5),
						report.AtMost("small p99 / fair's", div(c.smallP99, fair.smallP99), 0.8),
						report.AtMost("large mean / fair's", div(c.largeMean, fair.largeMean), 1.1))
				}
			}
			t.Notes = append(t.Notes, fmt.Sprintf("Arrivals for %v per scheme; sizes capped at %g MB; %d background flows per sender; pias edges from the CDF (equal bytes per band): %v bytes. An unfinished flow (still running 30 s after arrivals stopped) counts in no mean.", b.c.fctDur, b.c.capBytes/1e6, b.c.bg, pias))
			if b.delay > 0 {
				t.Notes = append(t.Notes, "No goals here: docs/prio.md's FCT goals are stated for the lab's microsecond RTT; these rows are for comparison with it.")
			}
			b.table(t)
			small := map[string][]float64{}
			for s, fs := range flows {
				for _, f := range fs {
					if f.Done && f.Size < smallMax {
						small[s] = append(small[s], f.FCTMs)
					}
				}
			}
			file, title := fmt.Sprintf("fct-%s-%g%s.png", w, load*100, b.tag()), fmt.Sprintf("Small-flow FCT, %s, load %g%%%s", w, load*100, b.delayNote())
			if err := plotCDFs(b.out, file, title, "ms", small, b.c.fctSchemes, 1); err != nil {
				return err
			}
			t.Plots = append(t.Plots, report.Plot{Title: title, File: b.name + "/" + file})
		}
	}
	return nil
}

type fctClasses struct{ smallMean, smallP99, medMean, medP99, largeMean float64 }

// classes summarizes the finished flows per size class.
func classes(flows []Flow) fctClasses {
	var small, med, large []float64
	for _, f := range flows {
		if !f.Done {
			continue
		}
		switch {
		case f.Size < smallMax:
			small = append(small, f.FCTMs)
		case f.Size < mediumMax:
			med = append(med, f.FCTMs)
		default:
			large = append(large, f.FCTMs)
		}
	}
	return fctClasses{summarize(small).mean, percentile(small, 99), summarize(med).mean, percentile(med, 99), summarize(large).mean}
}

// delayNote names the receivers' links' delay in titles, if any.
func (b *bench) delayNote() string {
	if b.delay == 0 {
		return ""
	}
	return fmt.Sprintf(", receivers' links delayed %v each way", b.delay)
}

// tag tells apart the files of runs at different delays ("" at none, "-250us").
func (b *bench) tag() string {
	if b.delay == 0 {
		return ""
	}
	return "-" + strings.ReplaceAll(b.delay.String(), "µ", "u")
}

// key is a results' data key, told apart by delay as the files are.
func (b *bench) key(k string) string { return k + strings.ReplaceAll(b.tag(), "-", "_") }
