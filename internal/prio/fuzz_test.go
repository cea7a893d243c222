package prio

import (
	"math/rand"
	"testing"
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
