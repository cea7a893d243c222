package lab

import (
	"testing"

	"github.com/flowplane/flowplane/internal/packet"
	"github.com/flowplane/flowplane/internal/progtest"
	"github.com/flowplane/flowplane/internal/stats"
	"github.com/flowplane/flowplane/internal/testenv"
)

const (
	tcActStolen = 4
	tcActUnspec = 0xffffffff // -1: pass on to the next filter
)

// TestLossProgram runs the loss program on crafted packets at 0% and 100% and checks verdict,
// that the packet is untouched, and the counters.
func TestLossProgram(t *testing.T) {
	t.Parallel()
	testenv.Privileged(t)
	frame := packet.IP("198.18.0.1", "198.18.0.2").UDP(1000, 2000).Payload([]byte("hello")).Bytes()
	for _, c := range []struct {
		percent   float64
		verdict   uint32
		passed    uint64
		dropped   uint64
		runs      int
		wantFrame bool
	}{
		{percent: 0, verdict: tcActUnspec, passed: 50, runs: 50, wantFrame: true},
		{percent: 100, verdict: tcActStolen, dropped: 50, runs: 50},
	} {
		spec, err := loadLoss()
		if err != nil {
			t.Fatal(err)
		}
		if err := spec.Variables["loss_threshold"].Set(lossThreshold(c.percent)); err != nil {
			t.Fatal(err)
		}
		var objs lossObjects
		if err := spec.LoadAndAssign(&objs, nil); err != nil {
			t.Fatal(err)
		}
		defer objs.Close()
		cases := make([]progtest.Case, c.runs)
		for i := range cases {
			cases[i] = progtest.Case{Name: "packet", In: frame, Ret: c.verdict}
			if c.wantFrame {
				cases[i].Out = frame
			}
		}
		progtest.RunTable(t, objs.LabLoss, cases)
		counts, err := stats.All(objs.LossStats)
		if err != nil {
			t.Fatal(err)
		}
		if counts[lossLossStatLOSS_STAT_PASSED] != c.passed || counts[lossLossStatLOSS_STAT_DROPPED] != c.dropped {
			t.Errorf("%g%%: passed %d dropped %d, want %d and %d", c.percent, counts[0], counts[1], c.passed, c.dropped)
		}
	}
}

func TestLossThreshold(t *testing.T) {
	t.Parallel()
	for percent, want := range map[float64]uint64{0: 0, 100: 1 << 32, 50: 1 << 31, 1: 42949673} {
		if got := lossThreshold(percent); got != want {
			t.Errorf("lossThreshold(%g) = %d, want %d", percent, got, want)
		}
	}
}
