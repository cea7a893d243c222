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
// sender, per scheme.
func (b *bench) fairness(ctx context.Context) error {
	warm := 5 * time.Second
	for _, n := range b.c.flows {
		t := &report.Table{
			Title:   fmt.Sprintf("Fairness: %d long-lived flows, %s bottleneck, %s window", n, fmtRate(b.c.rate), b.c.dur),
			Columns: []string{"scheme", "mean Mbit/s", "std Mbit/s", "std / fair", "Jain", "utilization", "utilization / fair", "band changes / flow / s", "retransmitted %", "received twice %", "flows measured"},
		}
		perScheme := map[string][]float64{}
		flips := map[string]float64{}   // band changes per flow per second
		retrans := map[string]float64{} // share of data segments that were retransmissions
		dups := map[string]float64{}    // share the receivers got twice (reported by DSACK)
		for _, scheme := range b.c.schemes {
			p, err := b.policy(scheme, nil)
			if err != nil {
				return err
			}
			slog.Info("fairness", "flows", n, "scheme", scheme)
			var bps []float64
			var resent, dup, sent uint64
			failed := 0
			err = b.withRouter(p, b.c.rate, func() error {
				at := strconv.FormatInt(time.Now().Add(warm).UnixMilli(), 10)
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
				for _, o := range outs {
					var r LongResult
					if err := json.Unmarshal(o, &r); err != nil {
						return fmt.Errorf("generator output: %w", err)
					}
					bps = append(bps, r.Bps...)
					failed += r.Failed
					resent, dup, sent = resent+r.Retrans, dup+r.Dups, sent+r.DataSegs
				}
				if sent > 0 {
					retrans[scheme] = 100 * float64(resent) / float64(sent)
					dups[scheme] = 100 * float64(dup) / float64(sent)
				}
				// How often flows changed band (each change can reorder a flow's packets
				// between two queues): the flows' counters on r1, over warm-up and window.
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
						flips[scheme] = changes / n / (warm + b.c.dur).Seconds()
					}
					return nil
				})
			})
			if err != nil {
				return err
			}
			if failed > 0 {
				t.Notes = append(t.Notes, fmt.Sprintf("%s: %d of %d flows could not connect.", scheme, failed, n))
			}
			perScheme[scheme] = bps
		}
		fair := summarize(perScheme["fair"])
		for _, scheme := range b.c.schemes {
			s := summarize(perScheme[scheme])
			util := s.sum / float64(b.c.rate)
			t.Add(scheme, s.mean/1e6, s.std/1e6, ratio(s.std, fair.std), s.jain, util, ratio(s.sum, fair.sum), flips[scheme], retrans[scheme], dups[scheme], len(perScheme[scheme]))
		}
		t.Notes = append(t.Notes, "Goodput: bytes acknowledged (TCP_INFO) over the window, after "+warm.String()+" of warm-up. Received twice: segments the receivers reported with DSACK, link capacity spent on data already delivered (a lower bound: receivers do not report every duplicate, docs/prio.md). Ratios against fair of the same run; — where fair did not run.")
		b.table(t)
		b.res.Data[fmt.Sprintf("fairness_%d_bps", n)] = perScheme
		if err := plotCDFs(b.out, fmt.Sprintf("fairness-%d.png", n), fmt.Sprintf("Per-flow goodput, %d flows", n), "Mbit/s", perScheme, b.c.schemes, 1e-6); err != nil {
			return err
		}
	}
	return nil
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
