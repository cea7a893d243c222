package ctperf

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/flowplane/flowplane/internal/nsrun"
	"github.com/flowplane/flowplane/internal/testenv"
)

// BenchmarkEstablishedTCP is the ns/packet part of bench/conntrack alone, repeated: the median
// of the iterations' NsPerPacket, which the machine's load disturbs less than one run.
//
//	go test -run '^$' -bench EstablishedTCP -benchtime 10x ./internal/conntrack/ctperf/
func BenchmarkEstablishedTCP(b *testing.B) {
	rt := testenv.NewRouter(b)
	client, server := netip.MustParseAddr(testenv.RouterInHost), netip.MustParseAddr(testenv.RouterOutHost)
	var samples []time.Duration
	for b.Loop() {
		err := nsrun.Do(rt.NS, func() error {
			per, err := NsPerPacket(client, server, rt.In.Index, rt.Out.Index, 5000)
			samples = append(samples, per)
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	slices.Sort(samples)
	b.ReportMetric(float64(samples[len(samples)/2].Nanoseconds()), "ns/packet")
}
