package altmark

import (
	"testing"

	"github.com/flowplane/flowplane/internal/testenv"
)

func TestMarkerLoadsTmp(t *testing.T) {
	testenv.Privileged(t)
	for _, c := range []string{"dscp", "ipv4-flag", "ipv6-altmark"} {
		o, err := openMarker(MarkSpec{PeriodNs: 1e9, Carrier: c, FlowMonCount: 10, PerFlow: true, DoublePackets: 2})
		if err != nil {
			t.Fatalf("%s: %v", c, err)
		}
		o.Close()
	}
}
