package xdpgen

import (
	"fmt"
	"net"

	"github.com/cilium/ebpf/link"

	"github.com/flowplane/flowplane/internal/nsrun"
	"github.com/flowplane/flowplane/internal/stats"
)

// Sink counts the packets of one transport protocol and destination port arriving on an
// interface, in XDP, and drops them (or passes them on, with Pass); everything else goes to the
// kernel as usual. See sink.bpf.c for why a benchmark counts this way.
type Sink struct {
	objs sinkObjects
	link link.Link
}

// SinkConfig says where a Sink goes and what it counts.
type SinkConfig struct {
	Netns  string // named network namespace of the interface; "" is the caller's
	Ifname string
	Proto  uint8  // 6 (TCP) or 17 (UDP)
	Port   uint16 // destination port
	Pass   bool   // count only: pass matching packets on instead of dropping them
}

// AttachSink loads the sink and attaches it to the interface in native XDP mode (veth, physical
// NICs with XDP support). On a veth this also enables the NAPI that XDP-redirected frames need.
// Close detaches it.
func AttachSink(c SinkConfig) (*Sink, error) {
	if c.Proto != protoTCP && c.Proto != protoUDP {
		return nil, fmt.Errorf("xdpgen sink: protocol %d: want 6 (TCP) or 17 (UDP)", c.Proto)
	}
	spec, err := loadSink()
	if err != nil {
		return nil, fmt.Errorf("xdpgen sink: load program spec: %w", err)
	}
	drop := uint32(1)
	if c.Pass {
		drop = 0
	}
	for name, v := range map[string]any{
		"match_proto": uint32(c.Proto),
		"match_dport": uint32(c.Port),
		"match_drop":  drop,
	} {
		if err := spec.Variables[name].Set(v); err != nil {
			return nil, fmt.Errorf("xdpgen sink: set %s: %w", name, err)
		}
	}
	s := &Sink{}
	if err := spec.LoadAndAssign(&s.objs, nil); err != nil {
		return nil, fmt.Errorf("xdpgen sink: load program: %w", err)
	}
	attach := func() error {
		ifc, err := net.InterfaceByName(c.Ifname)
		if err != nil {
			return err
		}
		s.link, err = link.AttachXDP(link.XDPOptions{Program: s.objs.XdpgenSink, Interface: ifc.Index, Flags: link.XDPDriverMode})
		return err
	}
	if c.Netns == "" {
		err = attach()
	} else {
		err = nsrun.Do(c.Netns, attach)
	}
	if err != nil {
		s.objs.Close()
		return nil, fmt.Errorf("xdpgen sink: attach to %s: %w", c.Ifname, err)
	}
	return s, nil
}

// Count returns how many matching packets the sink has seen.
func (s *Sink) Count() (uint64, error) {
	return stats.Sum(s.objs.SinkStats, uint32(sinkSinkStatSINK_STAT_MATCHED))
}

// Close detaches the sink.
func (s *Sink) Close() error {
	err := s.link.Close()
	s.objs.Close()
	if err != nil {
		return fmt.Errorf("xdpgen sink: detach: %w", err)
	}
	return nil
}
