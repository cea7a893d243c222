package prio

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"

	"github.com/flowplane/flowplane/internal/cgroup"
	"github.com/flowplane/flowplane/internal/pin"
	"github.com/flowplane/flowplane/internal/runstate"
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

// HostAttached says whether a host attachment called name exists (its pins or its record).
func HostAttached(name string) bool {
	if _, err := os.Stat(pin.Path(hostPin(name)...)); err == nil {
		return true
	}
	_, err := os.Stat(runstate.Path(subsystem, "host-"+name))
	return err == nil
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
// included) and pins it under name. A second Host with the same name replaces the first.
func Host(name, cgroupPath string, p *HostPolicy) (err error) {
	objs, err := loadHostFor(p)
	if err != nil {
		return err
	}
	defer objs.Close()
	_ = RemoveHost(name) // a re-apply replaces the old attachment
	l, err := link.AttachCgroup(link.CgroupOptions{Path: cgroupPath, Attach: ebpf.AttachCGroupSockOps, Program: objs.PrioHost})
	if err != nil {
		return fmt.Errorf("attach sock_ops to %s: %w", cgroupPath, err)
	}
	defer l.Close()
	dir, err := pin.Dir(hostPin(name)...)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = pin.Remove(hostPin(name)...)
		}
	}()
	if err := l.Pin(filepath.Join(dir, "link")); err != nil {
		return fmt.Errorf("pin host link: %w", err)
	}
	if err := objs.PrioHostStats.Pin(filepath.Join(dir, "stats")); err != nil {
		return fmt.Errorf("pin host counters: %w", err)
	}
	return runstate.Save(subsystem, "host-"+name, &HostRecord{Name: name, Cgroup: cgroup.HostPath(cgroupPath), File: p.File, Refresh: p.Refresh, MinInterval: p.MinInterval})
}

// HostProgram loads the option writer for p without attaching it, for benchmarks; close the
// closer when done.
func HostProgram(p *HostPolicy) (*ebpf.Program, io.Closer, error) {
	objs, err := loadHostFor(p)
	if err != nil {
		return nil, nil, err
	}
	return objs.PrioHost, objs, nil
}

// loadHostFor loads the option writer with p's selectors and intervals.
func loadHostFor(p *HostPolicy) (*hostObjects, error) {
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
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
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

// RemoveHost detaches and unpins a host attachment; os.ErrNotExist if there is none.
func RemoveHost(name string) error {
	dir := pin.Path(hostPin(name)...)
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		if _, err := os.Stat(runstate.Path(subsystem, "host-"+name)); errors.Is(err, os.ErrNotExist) {
			return os.ErrNotExist
		}
	}
	// The record goes first, so that a concurrent status stops listing what is being removed.
	recErr := runstate.Remove(subsystem, "host-"+name)
	if l, err := link.LoadPinnedLink(filepath.Join(dir, "link"), nil); err == nil {
		_ = l.Unpin()
		_ = l.Close() // the last reference: the program leaves the cgroup
	}
	return errors.Join(recErr, pin.Remove(hostPin(name)...))
}
