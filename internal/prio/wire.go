package prio

// The wire format and table sizes, from prio.h through bpf2go (docs/prio.md, "Wire format").
const (
	OptKind        = uint8(classifierPrioWirePRIO_OPT_KIND)
	OptLen         = int(classifierPrioWirePRIO_OPT_LEN)
	ExID           = uint16(classifierPrioWirePRIO_EXID)
	BacklogUnit    = uint32(classifierPrioWirePRIO_BACKLOG_UNIT)
	OccUnknown     = uint8(classifierPrioWirePRIO_OCC_UNKNOWN)
	SCTPChunkType  = uint8(classifierPrioWirePRIO_SCTP_CHUNK_TYPE)
	PrioMaxLeaves  = int(classifierPrioLimitPRIO_MAX_LEAVES)
	PrioMaxBands   = int(classifierPrioLimitPRIO_MAX_BANDS)
	PrioMaxThresh  = int(classifierPrioLimitPRIO_MAX_THRESH)
	prioMaxSelects = int(classifierPrioLimitPRIO_MAX_SELECTORS)
)

// Option is what one advertisement says.
type Option struct {
	Occupancy uint8  // % of sk_sndbuf, OccUnknown if the sender could not tell
	Backlog   uint32 // unsent bytes, rounded up to BacklogUnit
}

// Decode reads an option's 8 bytes (kind, length, ExID, data); ok is false for anything else.
func Decode(b []byte) (Option, bool) {
	if len(b) < OptLen || b[0] != OptKind || int(b[1]) != OptLen || uint16(b[2])<<8|uint16(b[3]) != ExID {
		return Option{}, false
	}
	units := uint32(b[5])<<16 | uint32(b[6])<<8 | uint32(b[7])
	return Option{Occupancy: b[4], Backlog: units * BacklogUnit}, true
}

// Encode writes o as the host program does.
func (o Option) Encode() []byte {
	units := min((o.Backlog+BacklogUnit-1)/BacklogUnit, 0xffffff)
	return []byte{OptKind, byte(OptLen), byte(ExID >> 8), byte(ExID & 0xff), o.Occupancy, byte(units >> 16), byte(units >> 8), byte(units)}
}

// ClassID is the HTB class of band b's leaf l under the qdisc with handle major:
// major:(b+1)<<8|l, so `tc class show` reads band and leaf off the minor (fa:203 is band 1,
// leaf 3). The classifier computes the same.
func ClassID(major uint16, band, leaf int) uint32 {
	return uint32(major)<<16 | uint32(band+1)<<8 | uint32(leaf)
}
