package lab

import (
	"fmt"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/flowplane/flowplane/internal/nsrun"
	"github.com/flowplane/flowplane/internal/topo"
	"github.com/flowplane/flowplane/internal/units"
)

// Status is a lab as `lab status` shows it.
type Status struct {
	Name    string       `json:"name"`
	File    string       `json:"file"`
	Created time.Time    `json:"created"`
	Nodes   []NodeStatus `json:"nodes"`
	Links   []LinkStatus `json:"links"`
}

// NodeStatus is a node and its interfaces.
type NodeStatus struct {
	Name   string        `json:"name"`
	Kind   topo.Kind     `json:"kind"`
	Netns  string        `json:"netns"`
	Ifaces []IfaceStatus `json:"interfaces"`
}

// IfaceStatus is one interface, its addresses and its counters.
type IfaceStatus struct {
	Name       string        `json:"name"`
	Device     string        `json:"device"`
	Peer       string        `json:"peer"`
	IPv4       string        `json:"ipv4"`
	IPv6       string        `json:"ipv6"`
	Up         bool          `json:"up"`
	TxPackets  uint64        `json:"tx_packets"`
	RxPackets  uint64        `json:"rx_packets"`
	QdiscDrops uint32        `json:"qdisc_drops"`
	Loss       *LossCounters `json:"loss,omitempty"`
}

// LinkStatus is a link and its properties. Rate and loss are what A sends, the BToA ones what B
// sends: the same unless an endpoint gives its own.
type LinkStatus struct {
	A           string  `json:"a"`
	B           string  `json:"b"`
	MTU         int     `json:"mtu"`
	Rate        string  `json:"rate,omitempty"`
	RateBPS     uint64  `json:"rate_bps,omitempty"`
	Loss        float64 `json:"loss_percent"`
	BToARate    string  `json:"b_to_a_rate,omitempty"`
	BToARateBPS uint64  `json:"b_to_a_rate_bps,omitempty"`
	BToALoss    float64 `json:"b_to_a_loss_percent"`
	// The user-space impairments, per direction, and the relay that applies them (nil for a
	// plain veth link).
	AToB  *Impairment  `json:"a_to_b,omitempty"`
	BToA  *Impairment  `json:"b_to_a,omitempty"`
	Relay *RelayStatus `json:"relay,omitempty"`
}

// Impairment is one direction's impairments as status shows them.
type Impairment struct {
	Delay        string  `json:"delay"`
	Jitter       string  `json:"jitter"`
	Distribution string  `json:"distribution"`
	Reorder      float64 `json:"reorder_percent"`
	Duplicate    float64 `json:"duplicate_percent"`
	Corrupt      float64 `json:"corrupt_percent"`
	LossModel    string  `json:"loss_model"` // random or gemodel
}

func impairmentStatus(ifc *topo.Iface) *Impairment {
	e := ifc.Egress
	im := &Impairment{Delay: e.Delay.String(), Jitter: e.Jitter.String(), Distribution: string(e.Distribution),
		Reorder: e.Reorder, Duplicate: e.Duplicate, Corrupt: e.Corrupt, LossModel: "random"}
	if g := ifc.LossGE; g != nil {
		im.LossModel = fmt.Sprintf("gemodel %s %s %s %s", percent(100*g.P), percent(100*g.R), percent(100*g.LossBad), percent(100*g.LossGood))
	}
	return im
}

// Status reads the lab's state from the kernel.
func (l *Lab) Status() (*Status, error) {
	s := &Status{Name: l.Name(), File: l.Topology.File, Created: l.Created}
	for _, n := range l.Topology.Nodes {
		ns := NodeStatus{Name: n.Name, Kind: n.Kind, Netns: l.Netns(n.Name)}
		for _, ifc := range n.Ifaces {
			st := IfaceStatus{Name: ifc.Name, Device: l.IfName(ifc), IPv4: ifc.IPv4.String(), IPv6: ifc.IPv6.String(),
				Peer: ifc.Peer().Node.Name + ":" + ifc.Peer().Name}
			if err := nsrun.Do(ns.Netns, func() error { return readIface(st.Device, &st) }); err != nil {
				return nil, fmt.Errorf("%s %s: %w", n.Name, ifc.Name, err)
			}
			if ifc.HasLoss { // the counters of what it sends
				c, ok, err := l.ReadLoss(ifc)
				if err != nil {
					return nil, err
				}
				if ok {
					st.Loss = &c
				}
			}
			ns.Ifaces = append(ns.Ifaces, st)
		}
		s.Nodes = append(s.Nodes, ns)
	}
	for _, link := range l.Topology.Links {
		ls := LinkStatus{A: link.A.Node.Name + ":" + link.A.Name, B: link.B.Node.Name + ":" + link.B.Name, MTU: link.MTU,
			Loss: link.A.Loss, RateBPS: link.A.Rate, BToALoss: link.B.Loss, BToARateBPS: link.B.Rate}
		if link.A.Rate > 0 {
			ls.Rate = units.FormatRate(link.A.Rate)
		}
		if link.B.Rate > 0 {
			ls.BToARate = units.FormatRate(link.B.Rate)
		}
		if link.Impaired() {
			ls.AToB, ls.BToA = impairmentStatus(link.A), impairmentStatus(link.B)
			r, err := l.Relay(link)
			if err != nil {
				// No counters file: the relay never started or its files are gone. Say so in the
				// status rather than failing it.
				r = &RelayStatus{Netns: l.relayNetns(link), Log: l.relayFile(link, "log")}
			}
			ls.Relay = r
		}
		s.Links = append(s.Links, ls)
	}
	return s, nil
}

func readIface(dev string, st *IfaceStatus) error {
	l, err := netlink.LinkByName(dev)
	if err != nil {
		return err
	}
	a := l.Attrs()
	st.Up = a.OperState == netlink.OperUp
	if a.Statistics != nil {
		st.TxPackets, st.RxPackets = a.Statistics.TxPackets, a.Statistics.RxPackets
	}
	qs, err := netlink.QdiscList(l)
	if err != nil {
		return fmt.Errorf("list qdiscs: %w", err)
	}
	for _, q := range qs {
		if q.Attrs().Parent == netlink.HANDLE_ROOT && q.Attrs().Statistics != nil && q.Attrs().Statistics.Queue != nil {
			st.QdiscDrops = q.Attrs().Statistics.Queue.Drops
		}
	}
	return nil
}
