package vnet

import (
	"net/netip"
	"slices"
)

// Route is a forwarding table entry.
type Route struct {
	Prefix    netip.Prefix
	NextHop   netip.Addr // invalid: the destination is on the link
	Iface     *Iface
	Metric    int
	Connected bool
}

// table is an immutable forwarding table sorted longest prefix first, swapped atomically when
// RIP changes it so the per-packet lookup takes no lock.
type table []Route

func newTable(rs []Route) *table {
	t := table(slices.Clone(rs))
	slices.SortStableFunc(t, func(a, b Route) int {
		if a.Prefix.Bits() != b.Prefix.Bits() {
			return b.Prefix.Bits() - a.Prefix.Bits()
		}
		return a.Prefix.Addr().Compare(b.Prefix.Addr())
	})
	return &t
}

// lookup is longest-prefix match over routes whose interface is up.
func (t *table) lookup(dst netip.Addr) (Route, bool) {
	if t == nil {
		return Route{}, false
	}
	for _, r := range *t {
		if r.Prefix.Contains(dst) && r.Iface.Up() {
			return r, true
		}
	}
	return Route{}, false
}
