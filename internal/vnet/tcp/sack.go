package tcp

// scoreboard records SACKed ranges above SND.UNA (RFC 6675 data structure), sorted and merged.
type scoreboard struct {
	blocks []Block
}

// Add records a SACK block, ignoring blocks outside (una, max].
func (sb *scoreboard) Add(b Block, una, sndMax Seq) {
	if b.Right.LEQ(b.Left) || b.Right.LEQ(una) || b.Right.GT(sndMax) {
		return // D-SACK, stale or bogus
	}
	b.Left = maxSeq(b.Left, una)
	i := 0
	for i < len(sb.blocks) && sb.blocks[i].Right.LT(b.Left) {
		i++
	}
	j := i
	for j < len(sb.blocks) && sb.blocks[j].Left.LEQ(b.Right) {
		b.Left = minSeq(b.Left, sb.blocks[j].Left)
		b.Right = maxSeq(b.Right, sb.blocks[j].Right)
		j++
	}
	if i == j {
		if len(sb.blocks) >= maxRuns {
			return // a peer reporting more holes than a vnet receiver keeps: ignore the excess
		}
		sb.blocks = append(sb.blocks, Block{})
		copy(sb.blocks[i+1:], sb.blocks[i:])
		sb.blocks[i] = b
		return
	}
	sb.blocks[i] = b
	sb.blocks = append(sb.blocks[:i+1], sb.blocks[j:]...)
}

// Ack drops everything below una.
func (sb *scoreboard) Ack(una Seq) {
	k := 0
	for _, b := range sb.blocks {
		if b.Right.LEQ(una) {
			continue
		}
		b.Left = maxSeq(b.Left, una)
		sb.blocks[k] = b
		k++
	}
	sb.blocks = sb.blocks[:k]
}

// Sacked reports whether seq is covered, and the end of the covering block.
func (sb *scoreboard) Sacked(seq Seq) (bool, Seq) {
	for _, b := range sb.blocks {
		if seq.LT(b.Left) {
			return false, b.Left // next sacked block starts here: end of the hole
		}
		if seq.LT(b.Right) {
			return true, b.Right
		}
	}
	return false, seq
}

// bytesAbove is the number of SACKed bytes at or above seq.
func (sb *scoreboard) bytesAbove(seq Seq) int {
	n := 0
	for k := len(sb.blocks) - 1; k >= 0; k-- {
		b := sb.blocks[k]
		if b.Right.LEQ(seq) {
			break
		}
		n += b.Right.Diff(maxSeq(b.Left, seq))
	}
	return n
}

// lostBelow is the RFC 6675 IsLost boundary: every unSACKed byte below it has more than
// (DupThresh-1)*MSS SACKed bytes above it and is deemed lost.
func (sb *scoreboard) lostBelow(una Seq, mss int) Seq {
	limit := (dupThresh - 1) * mss
	acc := 0
	for k := len(sb.blocks) - 1; k >= 0; k-- {
		b := sb.blocks[k]
		size := b.Right.Diff(b.Left)
		if acc+size > limit {
			// The boundary is inside this block: bytes below Right-(limit-acc)-1 see enough.
			return b.Right.Add(-(limit - acc))
		}
		acc += size
	}
	return una
}

// unsacked counts bytes in [lo, hi) not covered by a block.
func (sb *scoreboard) unsacked(lo, hi Seq) int {
	if hi.LEQ(lo) {
		return 0
	}
	n := hi.Diff(lo)
	for _, b := range sb.blocks {
		l, r := maxSeq(b.Left, lo), minSeq(b.Right, hi)
		if r.GT(l) {
			n -= r.Diff(l)
		}
	}
	return n
}
