package tcp

import "sort"

// oooQueue holds out-of-order data above rcvNxt as sorted, non-overlapping, non-adjacent runs.
type oooQueue struct {
	runs  []run
	bytes int
	last  int // index of the run that most recently grew, reported first in SACK (RFC 2018 4)
}

type run struct {
	seq  Seq
	data []byte
}

func (r run) end() Seq { return r.seq.Add(len(r.data)) }

// maxRuns bounds the holes a receiver tracks. A full 4 MiB window of 1448-byte segments with
// every other one lost has about 1450; without a bound a peer sending one byte into every other
// position would cost an allocation per byte and a quadratic insert.
const maxRuns = 2048

// Insert adds data at seq, merging with neighbours; data is copied. It reports false when the
// data would start a new run beyond maxRuns and was dropped (the peer will resend it).
func (q *oooQueue) Insert(seq Seq, data []byte) bool {
	if len(data) == 0 {
		return true
	}
	end := seq.Add(len(data))
	// The first run that ends at or after seq could merge; runs are sorted, so search.
	i := sort.Search(len(q.runs), func(k int) bool { return q.runs[k].end().GEQ(seq) })
	j := i
	for j < len(q.runs) && q.runs[j].seq.LEQ(end) {
		j++
	}
	if i == j { // no overlap or adjacency
		if len(q.runs) >= maxRuns {
			return false
		}
		nr := run{seq, append([]byte(nil), data...)}
		q.runs = append(q.runs, run{})
		copy(q.runs[i+1:], q.runs[i:])
		q.runs[i] = nr
		q.bytes += len(data)
		q.last = i
		return true
	}
	if j == i+1 && q.runs[i].seq.LEQ(seq) {
		// The usual case after a loss, segments arriving in order behind the hole: extend the
		// run in place (amortised by append) instead of copying it for every segment.
		r := &q.runs[i]
		if extra := end.Diff(r.end()); extra > 0 {
			r.data = append(r.data, data[len(data)-extra:]...)
			q.bytes += extra
		}
		q.last = i
		return true
	}
	// Merge runs i..j-1 with the new data.
	lo := minSeq(seq, q.runs[i].seq)
	hi := maxSeq(end, q.runs[j-1].end())
	merged := make([]byte, hi.Diff(lo))
	for k := i; k < j; k++ {
		copy(merged[q.runs[k].seq.Diff(lo):], q.runs[k].data)
		q.bytes -= len(q.runs[k].data)
	}
	copy(merged[seq.Diff(lo):], data)
	q.bytes += len(merged)
	q.runs[i] = run{lo, merged}
	q.runs = append(q.runs[:i+1], q.runs[j:]...)
	q.last = i
	return true
}

// PopAt removes and returns runs that start at or below rcvNxt, trimmed to start at rcvNxt.
func (q *oooQueue) PopAt(rcvNxt Seq) []byte {
	if len(q.runs) == 0 || q.runs[0].seq.GT(rcvNxt) {
		return nil
	}
	r := q.runs[0]
	q.runs = q.runs[1:]
	q.bytes -= len(r.data)
	if q.last > 0 {
		q.last--
	}
	if r.end().LEQ(rcvNxt) {
		return q.PopAt(rcvNxt)
	}
	return r.data[rcvNxt.Diff(r.seq):]
}

// Blocks fills SACK blocks, the most recently changed run first.
func (q *oooQueue) Blocks(dst []Block) int {
	n := 0
	if len(q.runs) == 0 {
		return 0
	}
	if q.last >= len(q.runs) {
		q.last = 0
	}
	dst[n] = Block{q.runs[q.last].seq, q.runs[q.last].end()}
	n++
	for k := len(q.runs) - 1; k >= 0 && n < len(dst); k-- {
		if k != q.last {
			dst[n] = Block{q.runs[k].seq, q.runs[k].end()}
			n++
		}
	}
	return n
}
