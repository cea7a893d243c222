package tcp

// Seq is a sequence number; comparisons are modulo 2^32 (RFC 9293 3.4) so wraparound is safe as
// long as compared numbers are within 2^31 of each other.
type Seq uint32

func (s Seq) LT(t Seq) bool  { return int32(s-t) < 0 }
func (s Seq) LEQ(t Seq) bool { return int32(s-t) <= 0 }
func (s Seq) GT(t Seq) bool  { return int32(s-t) > 0 }
func (s Seq) GEQ(t Seq) bool { return int32(s-t) >= 0 }
func (s Seq) Add(n int) Seq  { return s + Seq(uint32(n)) }
func (s Seq) Diff(t Seq) int { return int(int32(s - t)) } // s - t
func maxSeq(a, b Seq) Seq {
	if a.GT(b) {
		return a
	}
	return b
}
func minSeq(a, b Seq) Seq {
	if a.LT(b) {
		return a
	}
	return b
}

// inWindow reports lo <= s < lo+n.
func inWindow(s, lo Seq, n int) bool { return s.GEQ(lo) && s.LT(lo.Add(n)) }
