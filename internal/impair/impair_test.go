package impair

import (
	"testing"
	"time"
)

// The shaper is tested on its own with virtual time: no sleeping, no timing assertions.
func TestShaperImpairments(t *testing.T) {
	t.Parallel()
	mk := func(n int) *[]byte { b := make([]byte, 100); b[0] = byte(n); return &b }
	run := func(im Params, n int) (out []*[]byte, s *Shaper) {
		s = New(im)
		emit := func(b *[]byte) { out = append(out, b) }
		clone := func(b *[]byte) *[]byte { c := append([]byte(nil), *b...); return &c }
		for i := 0; i < n; i++ {
			s.Admit(mk(i), time.Duration(i)*time.Millisecond, emit, clone, func(*[]byte) {})
		}
		s.Due(time.Hour, emit)
		return out, s
	}
	out, s := run(Params{Loss: 0.1, Seed: 1}, 10000)
	if s.Lost < 800 || s.Lost > 1200 || len(out) != 10000-int(s.Lost) {
		t.Fatalf("loss 10%%: lost %d, delivered %d", s.Lost, len(out))
	}
	out, s = run(Params{Duplicate: 0.05, Seed: 2}, 10000)
	if len(out) != 10000+int(s.Duplicated) || s.Duplicated < 400 {
		t.Fatalf("duplicate: %d out, %d duplicated", len(out), s.Duplicated)
	}
	out, s = run(Params{Corrupt: 0.5, Seed: 3}, 1000)
	bad := 0
	for _, b := range out {
		for _, x := range (*b)[1:] {
			if x != 0 {
				bad++
				break
			}
		}
	}
	if s.Corrupted < 400 || bad == 0 {
		t.Fatalf("corrupt: %d corrupted, %d seen", s.Corrupted, bad)
	}
	out, s = run(Params{Reorder: 0.2, Seed: 4}, 1000)
	inversions := 0
	for i := 1; i < len(out); i++ {
		if (*out[i])[0] < (*out[i-1])[0] {
			inversions++
		}
	}
	if len(out) != 1000 || inversions == 0 || s.Reordered == 0 {
		t.Fatalf("reorder: %d out, %d inversions", len(out), inversions)
	}
	// Delay and rate: nothing leaves early; the rate spaces packets by their size.
	sh := New(Params{Delay: 10 * time.Millisecond, Rate: 8e6, Seed: 5})
	var got []*[]byte
	emit := func(b *[]byte) { got = append(got, b) }
	for i := 0; i < 10; i++ {
		sh.Admit(mk(i), 0, emit, nil, nil)
	}
	if len(got) != 0 {
		t.Fatal("delayed packets left at once")
	}
	if next := sh.Due(10*time.Millisecond+50*time.Microsecond, emit); len(got) != 0 || next != 10*time.Millisecond+100*time.Microsecond {
		t.Fatalf("rate: %d sent, next due %v", len(got), next)
	}
	sh.Due(time.Second, emit)
	if len(got) != 10 {
		t.Fatalf("%d of 10 delivered", len(got))
	}
	// The delay queue is bounded: beyond DefaultLimit waiting packets the shaper drops at the tail.
	sh = New(Params{Rate: 8e3, Seed: 6})
	got = got[:0]
	for i := 0; i < DefaultLimit+10; i++ {
		sh.Admit(mk(i), 0, emit, nil, func(*[]byte) {})
	}
	if len(sh.q)+len(got) != DefaultLimit || sh.Overflow != 10 {
		t.Fatalf("rate queue: %d waiting, %d sent, %d dropped; want %d kept, 10 dropped", len(sh.q), len(got), sh.Overflow, DefaultLimit)
	}
}

// Every distribution's samples pass a KS test against its own CDF, with the configured mean
// (delay) and spread.
func TestJitterDistributions(t *testing.T) {
	t.Parallel()
	const n = 20000
	delay, jitter := 10*time.Millisecond, 2*time.Millisecond
	for i, dist := range Distributions {
		s := New(Params{Delay: delay, Jitter: jitter, Distribution: dist, Seed: uint64(i + 1)})
		samples := make([]time.Duration, n)
		var sum float64
		for k := range samples {
			samples[k] = s.Sample()
			sum += float64(samples[k])
		}
		mean := time.Duration(sum / n)
		d := KS(samples, func(x time.Duration) float64 { return CDF(dist, delay, jitter, x) })
		t.Logf("%s: mean %v, KS %.4f (bound %.4f)", dist, mean, d, KSCritical(n, 0.001))
		if d > KSCritical(n, 0.001) {
			t.Errorf("%s: KS statistic %.4f above %.4f", dist, d, KSCritical(n, 0.001))
		}
		if mean < delay-100*time.Microsecond || mean > delay+100*time.Microsecond {
			t.Errorf("%s: mean delay %v, want %v", dist, mean, delay)
		}
		// A wrong distribution fails the same test: the check has power.
		other := Distributions[(i+1)%len(Distributions)]
		if d := KS(samples, func(x time.Duration) float64 { return CDF(other, delay, jitter, x) }); d < 2*KSCritical(n, 0.001) {
			t.Errorf("%s samples pass as %s (KS %.4f)", dist, other, d)
		}
	}
}

// Gilbert–Elliott loss has the model's mean loss and mean burst length.
func TestGilbertElliottLoss(t *testing.T) {
	t.Parallel()
	g := &GilbertElliott{P: 0.01, R: 0.25, LossBad: 1}
	s := New(Params{GE: g, Seed: 7})
	const n = 200000
	lost, bursts, run := 0, 0, 0
	for range n {
		if s.lose() {
			lost++
			run++
			continue
		}
		if run > 0 {
			bursts++
		}
		run = 0
	}
	rate, mean := float64(lost)/n, float64(lost)/float64(bursts)
	t.Logf("loss %.4f (model %.4f), mean burst %.2f (model %.2f)", rate, g.MeanLoss(), mean, 1/g.R)
	if rate < g.MeanLoss()*0.85 || rate > g.MeanLoss()*1.15 {
		t.Errorf("loss %.4f, want %.4f ±15%%", rate, g.MeanLoss())
	}
	if mean < 3.5 || mean > 4.5 {
		t.Errorf("mean burst %.2f packets, want 4 ±0.5", mean)
	}
}
