package lab

import (
	"bytes"
	"testing"

	"github.com/flowplane/flowplane/internal/packet"
	"github.com/flowplane/flowplane/internal/progrun"
	"github.com/flowplane/flowplane/internal/stats"
	"github.com/flowplane/flowplane/internal/testenv"
)

const (
	xdpDrop = 1
	xdpPass = 2
)

// fuzzLoss are the loss rates FuzzLabLoss runs; the input picks one and the hook.
var fuzzLoss = []float64{0, 50, 100}

// FuzzLabLoss runs the loss program (tc or XDP, at 0, 50 or 100 %, as the input picks) on a
// fuzzer-made frame: it never changes the packet, passes or drops it (never drops at 0 %, always
// at 100 %), and counts it once, as passed or dropped as its verdict says. The program reads
// nothing of the packet: the frame's bytes must make no difference.
func FuzzLabLoss(f *testing.F) {
	testenv.Privileged(f)
	objs := make([]*lossObjects, len(fuzzLoss)) // once per fuzzing process
	for i, percent := range fuzzLoss {
		spec, err := loadLoss()
		if err != nil {
			f.Fatal(err)
		}
		if err := spec.Variables["loss_threshold"].Set(lossThreshold(percent)); err != nil {
			f.Fatal(err)
		}
		objs[i] = &lossObjects{}
		if err := spec.LoadAndAssign(objs[i], nil); err != nil {
			f.Fatal(err)
		}
		f.Cleanup(func() { objs[i].Close() })
	}
	for _, fr := range [][]byte{
		packet.IP("198.18.0.1", "198.18.0.2").UDP(1000, 2000).Payload([]byte("hello")).Bytes(),
		packet.IP("fd00::1", "fd00::2").TCP(1000, 80, "S").Bytes(),
		make([]byte, 14),
	} {
		for pick := range 2 * len(objs) {
			f.Add(fr, uint8(pick))
		}
	}
	f.Fuzz(func(t *testing.T, frame []byte, pick uint8) {
		i := int(pick>>1) % len(objs)
		prog, pass, drop := objs[i].LabLoss, uint32(tcActUnspec), uint32(tcActStolen)
		if pick&1 == 1 {
			prog, pass, drop = objs[i].LabLossXdp, xdpPass, xdpDrop
		}
		if !progrun.Accepts(prog, frame) {
			return
		}
		before, err := stats.All(objs[i].LossStats)
		if err != nil {
			t.Fatal(err)
		}
		r, err := progrun.Exec(prog, frame, 0)
		if err != nil {
			t.Fatal(err)
		}
		after, err := stats.All(objs[i].LossStats)
		if err != nil {
			t.Fatal(err)
		}
		passed := after[lossLossStatLOSS_STAT_PASSED] - before[lossLossStatLOSS_STAT_PASSED]
		dropped := after[lossLossStatLOSS_STAT_DROPPED] - before[lossLossStatLOSS_STAT_DROPPED]
		switch {
		case r.Ret != pass && r.Ret != drop:
			t.Fatalf("%s at %g%%: verdict %d", prog, fuzzLoss[i], int32(r.Ret))
		case !bytes.Equal(r.Out, frame):
			t.Fatalf("%s changed the packet\nin:  %x\nout: %x", prog, frame, r.Out)
		case r.Ret == pass && (passed != 1 || dropped != 0), r.Ret == drop && (dropped != 1 || passed != 0):
			t.Fatalf("%s: verdict %d counted passed +%d, dropped +%d", prog, int32(r.Ret), passed, dropped)
		case fuzzLoss[i] == 0 && r.Ret == drop, fuzzLoss[i] == 100 && r.Ret == pass:
			t.Fatalf("%s at %g%%: verdict %d", prog, fuzzLoss[i], int32(r.Ret))
		}
	})
}
