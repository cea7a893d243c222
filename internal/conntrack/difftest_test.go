package conntrack

// The random differential: conversations from convGen (randconv_test.go), each packet sent
// through two labs side by side — nftables over nf_conntrack, and flowplane — comparing per
// packet delivered or not and, at the end of each sequence, every connection's state.
//
// It lives with the tests, not in a package of its own, because it is built on the scripted
// differential's harness (diffLab, ctLab, labtest: testing.T helpers) and must stay out of
// bin/flowplane; `make difftest` and the reliability bench run it through `go test` and read
// the summary it writes to $DIFFJSON.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/flowplane/flowplane/internal/lab/labtest"
	"github.com/flowplane/flowplane/internal/packet"
)

// deliver sends s and reports whether the other host received it. Behind s goes an echo
// request to r1 on the same link: once r1's reply is back, r1 has handled s (the same queue,
// in order), so a frame not at the other host within a short grace was dropped. Much faster
// than waiting out a timeout for every dropped packet.
func (d *diffLab) deliver(s dstep) bool {
	to := other(s.from)
	routerSide := map[string]string{"h1": "r1:in", "h2": "r1:out"}[s.from]
	frame := s.frame(d).MAC(d.mac[s.from], d.mac[routerSide]).Bytes()
	d.marker++
	const markerID = 0xfd17
	mark := packet.IP(d.addr(s.from).String(), d.r1[s.from].String()).Echo(markerID, d.marker, false).
		MAC(d.mac[s.from], d.mac[routerSide]).Bytes()
	for _, h := range []string{to, s.from} { // drain
		d.await(h, 0, func([]byte) bool { return false })
	}
	for _, f := range [][]byte{frame, mark} {
		if err := unix.Send(d.tx[s.from], f, 0); err != nil {
			d.t.Fatalf("%s: send: %v", s.name, err)
		}
	}
	// The echo reply: IPv4 from r1, type 0, our identifier and sequence number.
	isReply := func(b []byte) bool {
		return len(b) >= 14+20+8 && b[12] == 0x08 && b[13] == 0 && b[14+9] == 1 &&
			bytes.Equal(b[14+12:14+16], d.r1[s.from].AsSlice()) && b[14+20] == 0 &&
			int(b[14+24])<<8|int(b[14+25]) == markerID && int(b[14+26])<<8|int(b[14+27]) == int(d.marker)
	}
	d.await(s.from, time.Second, isReply)
	off, end := 14+12, 14+int(frame[16])<<8|int(frame[17])
	if frame[12] == 0x86 {
		off, end = 14+8, 14+40+int(frame[18])<<8|int(frame[19])
	}
	want := frame[off:end]
	return d.await(to, 10*time.Millisecond, func(b []byte) bool { return len(b) >= end && bytes.Equal(b[off:end], want) })
}

func (d *diffLab) addr(h string) netip.Addr {
	if h == "h1" {
		return d.h1
	}
	return d.h2
}

// await reads h's capture until a frame matches (true) or wait has passed (false).
func (d *diffLab) await(h string, wait time.Duration, match func([]byte) bool) bool {
	buf := make([]byte, 2048)
	deadline := time.Now().Add(wait)
	for {
		n, _, err := unix.Recvfrom(d.rx[h], buf, unix.MSG_DONTWAIT)
		if err == nil {
			if match(buf[:n]) {
				return true
			}
			continue
		}
		left := time.Until(deadline)
		if left <= 0 {
			return false
		}
		fds := []unix.PollFd{{Fd: int32(d.rx[h]), Events: unix.POLLIN}}
		_, _ = unix.Poll(fds, int(max(left.Milliseconds(), 1)))
	}
}

// pairLab is two labs fed the same packets: r1 runs nftables over nf_conntrack in one,
// flowplane in the other.
type pairLab struct {
	t      *testing.T
	nf, fp *diffLab
	tables *Tables
}

func newPairLab(t *testing.T) *pairLab {
	p := &pairLab{t: t, nf: newDiffLab(t), fp: newDiffLab(t)}
	labtest.Run(t, p.nf.l, "r1", "sysctl", "-qw", "net.netfilter.nf_conntrack_tcp_loose=1")
	nft(t, p.nf.l, "r1", fmt.Sprintf(nftRules, p.nf.dev["r1:in"]))
	p.tables = startFlowplane(t, p.fp.l, &Config{}).tables()
	return p
}

// seqResult is what one sequence gave.
type seqResult struct {
	nf, fp         []bool   // delivered, per packet
	nfSt, fpSt     []string // final states (detailed), sorted
	states, agreed int      // connections in either tracker; in both with the same state
}

func (r *seqResult) packetsAgreed() int {
	n := 0
	for i := range r.nf {
		if r.nf[i] == r.fp[i] {
			n++
		}
	}
	return n
}

func (r *seqResult) ok() bool { return r.packetsAgreed() == len(r.nf) && r.agreed == r.states }

// run flushes both trackers and sends seq, each packet to both labs after its gap.
func (p *pairLab) run(seq []rpkt) *seqResult {
	t := p.t
	labtest.Run(t, p.nf.l, "r1", "conntrack", "-F")
	if _, err := p.tables.Flush(); err != nil {
		t.Fatal(err)
	}
	r := &seqResult{}
	for i := range seq {
		time.Sleep(seq[i].gap)
		s := seq[i].step()
		r.nf = append(r.nf, p.nf.deliver(s))
		r.fp = append(r.fp, p.fp.deliver(s))
	}
	nfList := nfStateList(t, p.nf.l)
	es, err := p.tables.List()
	if err != nil {
		t.Fatal(err)
	}
	r.nfSt, r.fpSt = stateStrings(withoutRouter(nfList, p.nf), true), stateStrings(fpStateList(es), true)
	// Both sorted: count the common ones.
	i, j := 0, 0
	for i < len(r.nfSt) && j < len(r.fpSt) {
		switch c := strings.Compare(r.nfSt[i], r.fpSt[j]); {
		case c == 0:
			r.agreed++
			i, j = i+1, j+1
		case c < 0:
			i++
		default:
			j++
		}
	}
	r.states = len(r.nfSt) + len(r.fpSt) - r.agreed
	return r
}

// withoutRouter drops the barrier echoes' entries (to r1 itself).
func withoutRouter(ss []state, d *diffLab) []state {
	var out []state
	for _, s := range ss {
		if s.dst != d.r1["h1"].String() && s.dst != d.r1["h2"].String() {
			out = append(out, s)
		}
	}
	return out
}

// ddmin is delta debugging: a smallest subsequence of seq (no packet can be removed) that
// still fails.
func ddmin(seq []rpkt, fails func([]rpkt) bool) []rpkt {
	n := 2
	for len(seq) >= 2 {
		size := (len(seq) + n - 1) / n
		var chunks, rests [][]rpkt
		for i := 0; i < len(seq); i += size {
			end := min(i+size, len(seq))
			chunks = append(chunks, seq[i:end])
			rests = append(rests, append(append([]rpkt(nil), seq[:i]...), seq[end:]...))
		}
		reduced := false
		for _, c := range chunks {
			if len(c) < len(seq) && fails(c) {
				seq, n, reduced = c, 2, true
				break
			}
		}
		for i := 0; !reduced && n > 2 && i < len(rests); i++ {
			if fails(rests[i]) {
				seq, n, reduced = rests[i], max(n-1, 2), true
			}
		}
		if !reduced {
			if n >= len(seq) {
				break
			}
			n = min(2*n, len(seq))
		}
	}
	return seq
}

// describe prints a sequence's packets with both trackers' verdicts, and the final states.
func describe(seq []rpkt, r *seqResult) string {
	var b strings.Builder
	for i := range seq {
		mark := "  "
		if r.nf[i] != r.fp[i] {
			mark = "≠ "
		}
		fmt.Fprintf(&b, "%s%2d nf=%-5v fp=%-5v %s\n", mark, i, r.nf[i], r.fp[i], &seq[i])
	}
	fmt.Fprintf(&b, "nf_conntrack:\n  %s\nflowplane:\n  %s\nas a table test:\n", strings.Join(r.nfSt, "\n  "), strings.Join(r.fpSt, "\n  "))
	for i := range seq {
		fmt.Fprintf(&b, "\t%#v,\n", &seq[i])
	}
	return b.String()
}

// disagreement is one sequence the trackers disagree on, minimized.
type disagreement struct {
	Seed     uint64 `json:"seed"`
	Class    string `json:"class"` // "accepted" or "open"
	Reason   string `json:"reason,omitempty"`
	Packets  int    `json:"packets"`
	Minimal  int    `json:"minimal_packets"`
	Detail   string `json:"detail"`
	Repeated bool   `json:"reproduced"`
}

// difftestSummary is what $DIFFJSON receives.
type difftestSummary struct {
	Seeds          []uint64       `json:"seeds"` // the first sequence's seed of each run (the rest follow by one)
	Sequences      int            `json:"sequences"`
	Packets        int            `json:"packets"`
	PacketsAgreed  int            `json:"packets_agreed"`
	States         int            `json:"states"`
	StatesAgreed   int            `json:"states_agreed"`
	Seconds        float64        `json:"seconds"`
	Disagreements  []disagreement `json:"disagreements"`
	NotReproduced  int            `json:"not_reproduced"`
	Fixed          int            `json:"fixed"` // found earlier, fixed: TestDifferentialMinimized's cases
	DeliveredBoth  int            `json:"delivered_both"`
	DroppedBoth    int            `json:"dropped_both"`
	SequenceLength [2]int         `json:"sequence_length"` // min, max
}

// acceptedDiffs are the documented differences (docs/conntrack.md, "Accepted differences from
// nf_conntrack"): a minimized disagreement matching one is not a failure.
var acceptedDiffs = []struct {
	reason string
	match  func(seq []rpkt, r *seqResult) bool
}{
	{"the SYN-ACK must acknowledge SYN+1", func(seq []rpkt, r *seqResult) bool {
		i := firstDisagreement(r)
		if i < 0 || !r.nf[i] || r.fp[i] || seq[i].proto != "tcp" || seq[i].flags != "SA" {
			return false
		}
		for j := i - 1; j >= 0; j-- { // the latest SYN of the connection
			q := seq[j]
			if q.proto == "tcp" && q.flags == "S" && q.v6 == seq[i].v6 && q.from != seq[i].from &&
				q.sport == seq[i].dport && q.dport == seq[i].sport {
				return seq[i].ack != q.seq+1
			}
		}
		return false
	}},
	{"a pickup's first packet is not checked against the window", func(seq []rpkt, _ *seqResult) bool {
		// A minimized sequence: every packet matters, so one such pickup is the cause.
		first := map[string]bool{}
		for _, q := range seq {
			if q.proto != "tcp" {
				continue
			}
			lo, hi := min(q.sport, q.dport), max(q.sport, q.dport)
			key := fmt.Sprint(q.v6, lo, hi)
			if !first[key] && !strings.Contains(q.flags, "S") && (q.ack == 0 || q.ack > math.MaxUint32-1<<17) {
				return true
			}
			first[key] = true
		}
		return false
	}},
}

// firstDisagreement is the index of the first packet the trackers disagree on, or -1.
func firstDisagreement(r *seqResult) int {
	for i := range r.nf {
		if r.nf[i] != r.fp[i] {
			return i
		}
	}
	return -1
}

// difftest runs sequences from seed on, one after the other, until the time is up (or n
// sequences, if n > 0), minimizing (for at most grace past until) and classifying every
// disagreement.
func (p *pairLab) difftest(seed uint64, n int, until time.Time, grace time.Duration, sum *difftestSummary) {
	t := p.t
	sum.Seeds = append(sum.Seeds, seed)
	for k := 0; (n <= 0 || k < n) && time.Now().Before(until); k++ {
		s := seed + uint64(k)
		seq := newConvGen(s).sequence()
		r := p.run(seq)
		sum.Sequences++
		sum.Packets += len(seq)
		sum.PacketsAgreed += r.packetsAgreed()
		sum.States += r.states
		sum.StatesAgreed += r.agreed
		if sum.SequenceLength[0] == 0 || len(seq) < sum.SequenceLength[0] {
			sum.SequenceLength[0] = len(seq)
		}
		sum.SequenceLength[1] = max(sum.SequenceLength[1], len(seq))
		for i := range r.nf {
			switch {
			case r.nf[i] && r.fp[i]:
				sum.DeliveredBoth++
			case !r.nf[i] && !r.fp[i]:
				sum.DroppedBoth++
			}
		}
		if r.ok() {
			continue
		}
		if p.run(seq).ok() {
			sum.NotReproduced++
			t.Logf("seed %d: a disagreement that did not reproduce (timing)\n%s", s, describe(seq, r))
			continue
		}
		// Minimizing stops (keeping what it has) at grace past the run's end.
		small := ddmin(seq, func(sub []rpkt) bool { return time.Now().Before(until.Add(grace)) && !p.run(sub).ok() })
		mr := p.run(small)
		if mr.ok() { // a timing flake steered the minimization
			sum.NotReproduced++
			t.Logf("seed %d: the minimized disagreement did not reproduce (timing)\n%s", s, describe(seq, r))
			continue
		}
		dis := disagreement{Seed: s, Class: "open", Packets: len(seq), Minimal: len(small), Detail: describe(small, mr), Repeated: true}
		for _, a := range acceptedDiffs {
			if a.match(small, mr) {
				dis.Class, dis.Reason = "accepted", a.reason
				break
			}
		}
		sum.Disagreements = append(sum.Disagreements, dis)
		if dis.Class == "open" {
			t.Errorf("seed %d (DIFFSEED=%d reproduces it): nf_conntrack and flowplane disagree; minimized from %d to %d packets:\n%s",
				s, s, len(seq), len(small), dis.Detail)
		} else {
			t.Logf("seed %d: accepted difference (%s), %d packets:\n%s", s, dis.Reason, len(small), dis.Detail)
		}
	}
}

// TestDifferentialRandom feeds random conversations to nf_conntrack and flowplane and compares
// them packet by packet. In CI: fixed seeds and one random seed, about 20 s. `make difftest`
// sets DIFFTIME (run that long from DIFFSEED, or a random seed) and DIFFJSON (the summary);
// DIFFSEED without DIFFTIME (or DIFFTIME=0) reruns one sequence.
func TestDifferentialRandom(t *testing.T) {
	t.Parallel()
	p := newPairLab(t)
	start := time.Now()
	sum := &difftestSummary{Fixed: len(minimizedCases())}
	envSeed := os.Getenv("DIFFSEED")
	haveSeed := envSeed != ""
	var seed uint64
	if haveSeed {
		var err error
		if seed, err = strconv.ParseUint(envSeed, 10, 64); err != nil {
			t.Fatalf("DIFFSEED=%q: not an unsigned integer", envSeed)
		}
	}
	switch dt := os.Getenv("DIFFTIME"); {
	case dt != "" && dt != "0":
		d, err := time.ParseDuration(dt)
		if err != nil {
			t.Fatalf("DIFFTIME=%q: %v (a Go duration, e.g. 5m)", dt, err)
		}
		if !haveSeed {
			seed = rand.Uint64() >> 16
		}
		t.Logf("difftest: seed %d for %v (DIFFSEED=%d DIFFTIME=%v reruns it)", seed, d, seed, d)
		p.difftest(seed, 0, start.Add(d), time.Minute, sum)
	case haveSeed:
		p.difftest(seed, 1, start.Add(time.Hour), time.Minute, sum)
	default:
		// Fixed seeds, then a random one, within a budget that keeps CI short.
		p.difftest(1, 30, start.Add(12*time.Second), 5*time.Second, sum)
		seed = rand.Uint64() >> 16
		t.Logf("difftest: random seed %d (DIFFSEED=%d reruns a sequence)", seed, seed)
		p.difftest(seed, 10, start.Add(18*time.Second), 5*time.Second, sum)
	}
	sum.Seconds = time.Since(start).Seconds()
	t.Logf("difftest: %d sequences (%d–%d packets), %d packets, %d agreed (%d delivered by both, %d dropped by both); %d connections, %d agreed; %d disagreements, %d not reproduced; %.0f s",
		sum.Sequences, sum.SequenceLength[0], sum.SequenceLength[1], sum.Packets, sum.PacketsAgreed, sum.DeliveredBoth, sum.DroppedBoth,
		sum.States, sum.StatesAgreed, len(sum.Disagreements), sum.NotReproduced, sum.Seconds)
	if path := os.Getenv("DIFFJSON"); path != "" {
		b, err := json.MarshalIndent(sum, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
