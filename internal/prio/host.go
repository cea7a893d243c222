package prio

import (
	"fmt"
	"io"
	"net/netip"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/rlimit"

	"github.com/flowplane/flowplane/internal/attach"
	"github.com/flowplane/flowplane/internal/cgroup"
)

const subsystem = "prio"

// HostRecord is what `prio host` leaves for status and remove.
type HostRecord struct {
	Name        string        `json:"name"`
	Cgroup      string        `json:"cgroup"`
	File        string        `json:"file"`
	Refresh     time.Duration `json:"refresh_ns"`      // 0: the option on every data segment
	MinInterval time.Duration `json:"min_interval_ns"` // 0: every change
}

func hostPin(name string) []string { return []string{subsystem, "host-" + name} }

// DefaultHost is the name of a host attachment when none is given.
const DefaultHost = "default"

// hostInstance is a host attachment as internal/attach knows it.
func hostInstance(name string) attach.Instance {
	return attach.Instance{Pin: hostPin(name), What: fmt.Sprintf("prio host attachment %q", name)}
}

// selectors expands a policy into the program's table: one entry per remote prefix × local
// prefix × family, each with its port ranges and direction.
func selectors(p *HostPolicy) ([]hostPrioSelector, error) {
	var out []hostPrioSelector
	for _, m := range p.Advertise {
		remotes, locals := prefixesOrAny(m.Remote), prefixesOrAny(m.Local)
		for _, r := range remotes {
			for _, l := range locals {
				if r.IsValid() && l.IsValid() && r.Addr().Is4() != l.Addr().Is4() {
					continue
				}
				s := hostPrioSelector{RemoteLo: m.RemotePort.Lo, RemoteHi: m.RemotePort.Hi, LocalLo: m.LocalPort.Lo, LocalHi: m.LocalPort.Hi, Directions: uint8(m.Dir)}
				s.Remote, s.RemoteLen = mapped(r)
				s.Local, s.LocalLen = mapped(l)
				out = append(out, s)
			}
		}
	}
	if len(out) > prioMaxSelects {
		return nil, fmt.Errorf("the selectors expand to %d entries (one per remote × local prefix); at most %d fit", len(out), prioMaxSelects)
	}
	return out, nil
}

func prefixesOrAny(ps []netip.Prefix) []netip.Prefix {
	if len(ps) == 0 {
		return []netip.Prefix{{}} // any address of either family
	}
	return ps
}

// mapped is p as the programs hold addresses: IPv4 mapped into IPv6, the length over 128 bits.
func mapped(p netip.Prefix) ([16]uint8, uint8) {
	if !p.IsValid() {
		return [16]uint8{}, 0
	}
	a := p.Addr()
	bits := p.Bits()
	if a.Is4() {
		a = netip.AddrFrom16(a.As16())
		bits += 96
	}
	return a.As16(), uint8(bits)
}

// Host attaches the option writer to a cgroup v2 (beside any other sock_ops program, tune's
// included) and pins it under name. A second Host with the same name replaces the program in
// place (ApplyHost).
func Host(name, cgroupPath string, p *HostPolicy) error {
	_, err := ApplyHost(name, cgroupPath, p)
	return err
}

// ApplyHost is Host, saying whether it replaced an attached writer (link.Update on the pinned
// link: no moment without a writer, the counters carry on; if the new one fails to load or
// attach, the old one stays) and what a crash had left that it cleaned first.
func ApplyHost(name, cgroupPath string, p *HostPolicy) (attach.Result, error) {
	in := hostInstance(name)
	return in.Apply(func(bool) (*attach.Spec, error) {
		objs, err := loadHostReusing(p, in.Dir())
		if err != nil {
			return nil, err
		}
		return &attach.Spec{
			Objects: objs,
			Links:   []attach.Link{{Name: "link", Hook: attach.SockOps(cgroupPath), Program: objs.PrioHost}},
			Maps:    map[string]*ebpf.Map{"stats": objs.PrioHostStats},
			Record:  &HostRecord{Name: name, Cgroup: cgroup.HostPath(cgroupPath), File: p.File, Refresh: p.Refresh, MinInterval: p.MinInterval},
		}, nil
	})
}

// HostProgram loads the option writer for p without attaching it, for benchmarks; close the
// closer when done.
func HostProgram(p *HostPolicy) (*ebpf.Program, io.Closer, error) {
	objs, err := loadHostReusing(p, "")
	if err != nil {
		return nil, nil, err
	}
	return objs.PrioHost, objs, nil
}

// loadHostReusing loads the option writer with p's selectors and intervals, on the counters
// pinned in dir if there are any (dir "": fresh ones).
func loadHostReusing(p *HostPolicy, dir string) (*hostObjects, error) {
	sels, err := selectors(p)
	if err != nil {
		return nil, err
	}
	if p.Refresh < 0 || p.MinInterval < 0 {
		return nil, fmt.Errorf("refresh %v, min_interval %v: give durations of 0 or more", p.Refresh, p.MinInterval)
	}
	if p.MinInterval > 0 && p.Refresh == 0 {
		return nil, fmt.Errorf("min_interval %v with refresh 0 (every data segment): give a refresh or no min_interval", p.MinInterval)
	}
	tick, err := coarseTick()
	if err != nil {
		return nil, err
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("remove memlock limit: %w", err)
	}
	spec, err := loadHost()
	if err != nil {
		return nil, fmt.Errorf("load host program spec: %w", err)
	}
	if err := spec.Variables["nselectors"].Set(uint32(len(sels))); err != nil {
		return nil, fmt.Errorf("set nselectors: %w", err)
	}
	if err := spec.Variables["refresh_ns"].Set(uint64(p.Refresh.Nanoseconds())); err != nil {
		return nil, fmt.Errorf("set refresh_ns: %w", err)
	}
	if err := spec.Variables["min_interval_ns"].Set(onCoarseClock(p.MinInterval, tick)); err != nil {
		return nil, fmt.Errorf("set min_interval_ns: %w", err)
	}
	var objs hostObjects
	if err := attach.Load(spec, &objs, dir, map[string]string{"stats": "prio_host_stats"}); err != nil {
		return nil, fmt.Errorf("load host program: %w", err)
	}
	for i, s := range sels {
		if err := objs.PrioSelectors.Update(uint32(i), s, ebpf.UpdateAny); err != nil {
			objs.Close()
			return nil, fmt.Errorf("fill selectors: %w", err)
		}
	}
	return &objs, nil
}

// RemoveHost detaches and unpins a host attachment; an error matching os.ErrNotExist if there
// is none.
func RemoveHost(name string) error {
	_, err := hostInstance(name).Remove()
	return err
}
