package ctperf

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/flowplane/flowplane/internal/nsrun"
	"github.com/flowplane/flowplane/internal/testenv"
)

// BenchmarkEstablishedTCP is the ns/packet part of bench/conntrack alone, repeated: the medians
// of the iterations' Measure, for IPv4 and IPv6, conntrack and the floor program, and the
// ratio.
//
//	go test -run '^$' -bench EstablishedTCP -benchtime 10x ./internal/conntrack/ctperf/
func BenchmarkEstablishedTCP(b *testing.B) {
	rt := testenv.NewRouter(b)
	for _, fam := range []struct {
		name           string
		client, server netip.Addr
	}{
		{"ipv4", netip.MustParseAddr(testenv.RouterInHost), netip.MustParseAddr(testenv.RouterOutHost)},
		{"ipv6", netip.MustParseAddr(testenv.RouterInHost6), netip.MustParseAddr(testenv.RouterOutHost6)},
	} {
		b.Run(fam.name, func(b *testing.B) {
			var ct, fl, ratio []float64
			for b.Loop() {
				err := nsrun.Do(rt.NS, func() error {
					c, err := Measure(fam.client, fam.server, rt.In.Index, rt.Out.Index, 5000)
					ct, fl, ratio = append(ct, float64(c.Conntrack)), append(fl, float64(c.Floor)), append(ratio, c.Ratio())
					return err
				})
				if err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(median(ct)/float64(time.Nanosecond), "ns/packet")
			b.ReportMetric(median(fl)/float64(time.Nanosecond), "floor-ns/packet")
			b.ReportMetric(median(ratio), "x-floor")
		})
	}
}

func median(v []float64) float64 {
	slices.Sort(v)
	return v[len(v)/2]
}

// TestFloorForwards: the floor program forwards the same established segment conntrack does,
// to the same egress with the same rewrite (so the two are timed doing the same work).
func TestFloorForwards(t *testing.T) {
	t.Parallel()
	rt := testenv.NewRouter(t)
	for _, p := range [][2]string{{testenv.RouterInHost, testenv.RouterOutHost}, {testenv.RouterInHost6, testenv.RouterOutHost6}} {
		err := nsrun.Do(rt.NS, func() error {
			c, err := Measure(netip.MustParseAddr(p[0]), netip.MustParseAddr(p[1]), rt.In.Index, rt.Out.Index, 500)
			t.Logf("%s → %s: conntrack %v, floor %v, ratio %.2f", p[0], p[1], c.Conntrack, c.Floor, c.Ratio())
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}
