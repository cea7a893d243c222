package conntrack

import (
	"net/netip"
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
