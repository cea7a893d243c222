package conntrack

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/flowplane/flowplane/internal/nsrun"
)

func TestNsPerPacket(t *testing.T) {
	f := newFixture(t, nil)
	var per, base time.Duration
	start := time.Now()
	err := nsrun.Do(f.ns, func() error {
		var err error
		per, base, err = NsPerPacketWithBaseline(netip.MustParseAddr(inHost), netip.MustParseAddr(outHost), f.in.Index, f.out.Index, 5000)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%v per packet, XDP_PASS-only program %v (measured in %v)", per, base, time.Since(start))
}

// BenchmarkEstablishedTCP is the ns/packet part of bench/conntrack alone, repeated: the median
// of the iterations' NsPerPacket, which the machine's load disturbs less than one run.
//
//	go test -run '^$' -bench EstablishedTCP -benchtime 10x ./internal/conntrack/
func BenchmarkEstablishedTCP(b *testing.B) {
	f := newFixture(b, nil)
	var samples []time.Duration
	for b.Loop() {
		err := nsrun.Do(f.ns, func() error {
			per, err := NsPerPacket(netip.MustParseAddr(inHost), netip.MustParseAddr(outHost), f.in.Index, f.out.Index, 5000)
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
