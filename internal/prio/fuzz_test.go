package prio

import (
	"bytes"
	"math/rand"
	"testing"

	"github.com/flowplane/flowplane/internal/packet"
	"github.com/flowplane/flowplane/internal/progrun"
)

// optionsVerdict is the reference reading of a TCP option list (RFC 9293 3.2): our option's
// backlog if the list holds it before any end-of-list, found=false if it does not, malformed
// for a length below 2 or one running past the list.
func optionsVerdict(o []byte) (backlog uint32, found, malformed bool) {
	for i := 0; i < len(o); {
		switch o[i] {
		case 0:
			return 0, false, false
		case 1:
			i++
			continue
		}
		if i+1 >= len(o) || o[i+1] < 2 || i+int(o[i+1]) > len(o) {
			return 0, false, true
		}
		if opt, ok := Decode(o[i : i+int(o[i+1])]); ok {
			return opt.Backlog, true, false
		}
		i += int(o[i+1])
	}
	return 0, false, false
}

// TestFuzzOptions: mutated option lists, starting from the layouts Linux sends (which the
// classifier reads straight from the packet) and others (which it walks), get the class the
// reference reading gives, and only malformed lists count as malformed.
func TestFuzzOptions(t *testing.T) {
	t.Parallel()
	thresholds := []uint64{10e3, 100e3, 1e6}
	objs := classifier(t, &RouterPolicy{Scheme: Backlog, Leaves: 1, Thresholds: thresholds})
	bandOf := func(backlog uint32) int {
		for i, th := range thresholds {
			if uint64(backlog) < th {
				return i
			}
		}
		return len(thresholds)
	}
	def := class(len(thresholds)+1, 0)
	seeds := [][]byte{
		nil,
		opts(optNOP, optNOP, optTS),
		ours(10, 5000),
		opts(optNOP, optNOP, optTS, ours(10, 50e3)),
		opts(optNOP, optNOP, optSACK, ours(10, 500e3)),
		opts(optMSS, optSACKP, optTS, ours(10, 5e6), optNOP, optWS),
		opts(ours(10, 5000), optNOP, optNOP, optTS),
	}
	r := rand.New(rand.NewSource(1))
	var malformed, found uint64
	for i := range 3000 {
		o := append([]byte(nil), seeds[r.Intn(len(seeds))]...)
		for len(o)%4 != 0 {
			o = append(o, 1)
		}
		switch r.Intn(4) {
		case 0: // flip bytes
			for range 1 + r.Intn(3) {
				if len(o) > 0 {
					o[r.Intn(len(o))] = byte(r.Intn(256))
				}
			}
		case 1: // cut the list at a word
			o = o[:4*r.Intn(len(o)/4+1)]
		case 2: // a kind or length byte of ours or of the timestamps
			if len(o) >= 2 {
				o[r.Intn(2)+4*r.Intn(len(o)/4)] = []byte{0, 1, 2, 8, 10, 12, 253, 255}[r.Intn(8)]
			}
		default: // random bytes
			o = make([]byte, 4*r.Intn(11))
			r.Read(o)
		}
		backlog, ok, bad := optionsVerdict(o)
		want := def
		switch {
		case bad:
			malformed++
		case ok:
			found++
			want = class(bandOf(backlog), 0)
		}
		sport := uint16(10000 + i) // a new flow each: its first packet decides its band
		if got := classify(t, objs, tcpFrame(trusted, server, sport, 80, o)); got != want {
			t.Fatalf("options %x: class %x, want %x (reference: backlog %d, found %v, malformed %v)", o, got, want, backlog, ok, bad)
		}
		if n := counter(t, objs, classifierPrioStatPRIO_STAT_MALFORMED); n != malformed {
			t.Fatalf("options %x: %d counted malformed, want %d", o, n, malformed)
		}
	}
	if n := counter(t, objs, classifierPrioStatPRIO_STAT_PARSED); n != found {
		t.Errorf("%d counted parsed, want %d", n, found)
	}
	t.Logf("3000 option lists: %d with our option, %d malformed", found, malformed)
}

// fuzzSchemes are the classifiers FuzzPrioClassifier runs, one per scheme (the input picks).
var fuzzSchemes = []*RouterPolicy{
	{Scheme: Backlog, Leaves: 2, Thresholds: []uint64{10e3, 100e3, 1e6}},
	{Scheme: PIAS, Leaves: 2, Thresholds: []uint64{1000, 5000}},
	{Scheme: Occupancy, Leaves: 2},
	{Scheme: Fair, Leaves: 4},
	{Scheme: FIFO, Leaves: 1},
}

// classStats are the counters of which every packet increments exactly one (prio.h).
var classStats = []classifierPrioStat{classifierPrioStatPRIO_STAT_FIFO, classifierPrioStatPRIO_STAT_PARSED,
	classifierPrioStatPRIO_STAT_SCTP, classifierPrioStatPRIO_STAT_NO_OPTION, classifierPrioStatPRIO_STAT_MALFORMED,
	classifierPrioStatPRIO_STAT_OTHER}

// FuzzPrioClassifier runs the classifier of the scheme the input picks on a fuzzer-made frame:
// the verdict is TCX_NEXT and the packet leaves unchanged (the classifier only sets
// skb->priority), and the packet is counted under the one reason the reference reading of its
// headers and TCP options (optionsVerdict) gives: fifo, parsed, sctp, no_option, malformed or
// other.
func FuzzPrioClassifier(f *testing.F) {
	objs := make([]*classifierObjects, len(fuzzSchemes)) // once per fuzzing process
	for i, p := range fuzzSchemes {
		objs[i] = classifier(f, p)
	}
	for i, fr := range [][]byte{
		tcpFrame(trusted, server, 1000, 80, nil),
		tcpFrame(trusted, server, 1001, 80, opts(optNOP, optNOP, optTS, ours(10, 50e3))),
		tcpFrame(trusted, server, 1002, 80, opts(optMSS, optSACKP, optTS, ours(10, 5e6), optNOP, optWS)),
		tcpFrame(untrusted, server, 1003, 80, ours(50, 5000)),
		tcpFrame(trusted6, server6, 1004, 80, opts(optNOP, optNOP, optSACK, ours(10, 500e3))),
		udpFrame(trusted, server, 1005, 53),
		udpFrame(trusted6, server6, 1006, 53),
		sctpFrame(trusted, server, 1007, 80, 150, 40, 4),
		sctpFrame(trusted6, server6, 1008, 80, 0, 0, 16),
		icmpFrame(trusted, server),
		ipFrame(trusted6, server6, 0, append([]byte{6, 0, 1, 4, 0, 0, 0, 0}, tcpSeg(1009, 80, ours(1, 1), 10, 0)...)),
	} {
		f.Add(fr, uint8(i))
	}
	f.Fuzz(func(t *testing.T, frame []byte, scheme uint8) {
		p, o := fuzzSchemes[int(scheme)%len(fuzzSchemes)], objs[int(scheme)%len(fuzzSchemes)]
		if !progrun.Accepts(o.PrioClassify, frame) {
			return
		}
		before := make([]uint64, len(classStats))
		for i, s := range classStats {
			before[i] = counter(t, o, s)
		}
		r, _, err := progrun.ExecSKB(o.PrioClassify, frame, progrun.SKBMD{})
		if err != nil {
			t.Fatal(err)
		}
		if int32(r.Ret) != -1 {
			t.Fatalf("%s: verdict %d, want TCX_NEXT (-1)\n%x", p.Scheme, int32(r.Ret), frame)
		}
		if !bytes.Equal(r.Out, frame) {
			t.Fatalf("%s: the classifier changed the packet\nin:  %x\nout: %x", p.Scheme, frame, r.Out)
		}
		want := referenceStat(p.Scheme, frame)
		for i, s := range classStats {
			d := counter(t, o, s) - before[i]
			if (s == want) != (d == 1) || d > 1 {
				t.Fatalf("%s: %v +%d; the reference reading counts it under %v\n%x", p.Scheme, s, d, want, frame)
			}
		}
	})
}

// referenceStat is the counter a frame belongs under, by packet.ReadHeaders and
// optionsVerdict.
func referenceStat(s Scheme, frame []byte) classifierPrioStat {
	if s == FIFO {
		return classifierPrioStatPRIO_STAT_FIFO
	}
	h := packet.ReadHeaders(frame)
	switch {
	case h.Malformed != "":
		return classifierPrioStatPRIO_STAT_MALFORMED
	case h.Family == 0, h.Fragment:
		return classifierPrioStatPRIO_STAT_OTHER
	}
	l4 := frame[h.L4:]
	switch h.Proto {
	case 6:
		if len(l4) < 20 || l4[12]>>4 < 5 || int(l4[12]>>4)*4 > len(l4) {
			return classifierPrioStatPRIO_STAT_MALFORMED
		}
		switch _, found, bad := optionsVerdict(l4[20 : int(l4[12]>>4)*4]); {
		case bad:
			return classifierPrioStatPRIO_STAT_MALFORMED
		case found:
			return classifierPrioStatPRIO_STAT_PARSED
		}
	case 17:
		if len(l4) < 8 {
			return classifierPrioStatPRIO_STAT_MALFORMED
		}
	case 132:
		if len(l4) < 16 {
			return classifierPrioStatPRIO_STAT_MALFORMED
		}
		if l4[12] == 150 { // the original scheme's chunk: length 4
			if l4[14] != 0 || l4[15] != 4 {
				return classifierPrioStatPRIO_STAT_MALFORMED
			}
			return classifierPrioStatPRIO_STAT_SCTP
		}
	default:
		return classifierPrioStatPRIO_STAT_OTHER
	}
	return classifierPrioStatPRIO_STAT_NO_OPTION
}
