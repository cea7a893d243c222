package altmark

import "net/netip"

// The seam between the period loop (config, records, REST, export) and the kernel side
// (marker and probe programs, their maps). The kernel side implements OpenProbe.

// Point is one monitored interface and direction.
type Point struct {
	Ifname    string
	Direction string // "in" (tcx ingress) or "out" (tcx egress)
}

// ProbeSpec is a validated probe configuration, as the kernel side needs it.
type ProbeSpec struct {
	Points     []Point
	PeriodNs   int64
	StartColor int            // 0 or 1: color = (period + StartColor) mod 2
	Carrier    string         // "dscp", "ipv4-flag" or "ipv6-altmark"
	DSCPBits   [2]uint8       // dscp carrier: bit numbers (0-5) of the DSCP field: color, delay
	HashRef    uint32         // sampling reference value
	HashBits   int            // starting hash length in bits
	NMax       int            // samples per period and point before one more hash bit is matched
	Protocols  []uint8        // IP protocols counted; empty = all
	Backbone   []netip.Prefix // ipv4-flag: traffic from/to these prefixes is neither marked nor counted
}

// Datapath is what the period loop needs from the kernel side.
type Datapath interface {
	// Read returns what the probe gathered in period n at every point (the counters of n's
	// color and the samples still matching the final hash length), then zeroes that color's
	// state so it counts period n+2 from nothing. The loop calls it L/2 after n ended.
	Read(n int64) ([]Counter, []Sample, error)
	// Close detaches the programs and frees their maps.
	Close() error
}
