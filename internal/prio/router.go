package prio

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/flowplane/flowplane/internal/pin"
	"github.com/flowplane/flowplane/internal/runstate"
)

// Major is the handle of the HTB qdisc `prio router` builds (fa:), so a device that carries
// one is recognised as flowplane's.
const Major = 0xfa

// RouterRecord is what `prio router` leaves for status and remove.
type RouterRecord struct {
	Dev    string `json:"dev"`
	Rate   uint64 `json:"rate"`
	File   string `json:"file"`
	Scheme Scheme `json:"scheme"`
	Bands  int    `json:"bands"`
	Leaves int    `json:"leaves"`
}

func routerPin(ns, dev string) []string { return []string{subsystem, ns, dev} }

func routerRecordName(ns, dev string) string { return ns + "-" + dev }

// ErrBusy says the device already has a qdisc that `prio router` must not replace.
var ErrBusy = errors.New("device busy")

// replaceable root qdiscs: the defaults a device comes with.
var replaceable = map[string]bool{"noqueue": true, "pfifo_fast": true, "mq": true}

// CheckDevice returns the device, or a usage-grade error: missing, or carrying a qdisc that
// is flowplane's already or someone else's.
func CheckDevice(dev string) (netlink.Link, error) {
	l, err := netlink.LinkByName(dev)
	if err != nil {
		return nil, fmt.Errorf("interface %q: no such network interface", dev)
	}
	qs, err := netlink.QdiscList(l)
	if err != nil {
		return nil, fmt.Errorf("list qdiscs of %s: %w", dev, err)
	}
	for _, q := range qs {
		a := q.Attrs()
		if a.Parent != netlink.HANDLE_ROOT {
			continue
		}
		if a.Handle>>16 == Major && q.Type() == "htb" {
			return nil, fmt.Errorf("%w: %s already carries a flowplane prio qdisc; run `flowplane prio router remove --dev %s` first", ErrBusy, dev, dev)
		}
		if !replaceable[q.Type()] {
			return nil, fmt.Errorf("%w: %s has a %s root qdisc (handle %x:) that prio would replace; remove it first (tc qdisc del dev %s root)", ErrBusy, dev, q.Type(), a.Handle>>16, dev)
		}
	}
	return l, nil
}

// Router builds the policy's HTB tree on dev's egress at rate (bits/s), loads the classifier
// and attaches it at tcx egress, all pinned per network namespace and device. Anything that
// fails undoes what came before it.
func Router(dev string, rate uint64, p *RouterPolicy) (err error) {
	l, err := CheckDevice(dev)
	if err != nil {
		return err
	}
	ns, err := pin.ThisNetns()
	if err != nil {
		return err
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return fmt.Errorf("remove memlock limit: %w", err)
	}
	objs, err := loadClassifierFor(p)
	if err != nil {
		return err
	}
	defer objs.Close()
	if err := buildHTB(l, rate, p); err != nil {
		_ = deleteHTB(l)
		return err
	}
	defer func() {
		if err != nil {
			_ = deleteHTB(l)
			_ = pin.Remove(routerPin(ns, dev)...)
		}
	}()
	tl, err := link.AttachTCX(link.TCXOptions{Interface: l.Attrs().Index, Program: objs.PrioClassify, Attach: ebpf.AttachTCXEgress})
	if err != nil {
		return fmt.Errorf("attach classifier to %s egress: %w", dev, err)
	}
	defer tl.Close()
	dir, err := pin.Dir(routerPin(ns, dev)...)
	if err != nil {
		return err
	}
	for name, pinner := range map[string]interface{ Pin(string) error }{"link": tl, "flows": objs.PrioFlows, "cache": objs.PrioCache, "stats": objs.PrioStats} {
		if err := pinner.Pin(filepath.Join(dir, name)); err != nil {
			return fmt.Errorf("pin %s: %w", name, err)
		}
	}
	return runstate.Save(subsystem, routerRecordName(ns, dev), &RouterRecord{Dev: dev, Rate: rate, File: p.File, Scheme: p.Scheme, Bands: p.Bands(), Leaves: p.Leaves})
}

// ClassifierProgram loads the classifier for p, with or without its flow cache, without
// attaching it, for benchmarks; close the closer when done.
func ClassifierProgram(p *RouterPolicy, cache bool) (*ebpf.Program, io.Closer, error) {
	slots := uint32(0)
	if cache {
		slots = cacheSlots
	}
	objs, err := loadClassifierWith(p, slots)
	if err != nil {
		return nil, nil, err
	}
	return objs.PrioClassify, objs, nil
}

// cacheSlots is the size of each CPU's flow cache (a power of two): 1024 slots of 88 bytes.
const cacheSlots = 1024

// loadClassifierFor loads the classifier with p's constants and trusted prefixes.
func loadClassifierFor(p *RouterPolicy) (*classifierObjects, error) {
	return loadClassifierWith(p, cacheSlots)
}

// loadClassifierWith is loadClassifierFor with slots flow cache slots per CPU (a power of
// two; 0: no cache, every packet reads the flow table).
func loadClassifierWith(p *RouterPolicy, slots uint32) (*classifierObjects, error) {
	spec, err := loadClassifier()
	if err != nil {
		return nil, fmt.Errorf("load classifier spec: %w", err)
	}
	if slots&(slots-1) != 0 {
		return nil, fmt.Errorf("flow cache of %d slots: not a power of two", slots)
	}
	spec.Maps["prio_cache"].MaxEntries = max(slots, 1)
	spec.Maps["prio_gen"].MaxEntries = max(slots, 1)
	var thresh [8]uint64
	copy(thresh[:], p.Thresholds)
	tick, err := coarseTick()
	if err != nil {
		return nil, err
	}
	for name, v := range map[string]any{
		"scheme": p.Scheme.code(), "major": uint32(Major), "nleaves": uint32(p.Leaves),
		"default_band": uint32(p.DefaultBand()), "max_claim": uint32(p.MaxClaim),
		"nthresh": uint32(len(p.Thresholds)), "thresh": thresh,
		"change_interval_ns": onCoarseClock(p.ChangeInterval, tick),
		"idle_reset_ns":      onCoarseClock(p.IdleReset, tick),
		"move_gap_ns":        onCoarseClock(p.MoveGap, tick),
		"cache_slots":        slots,
	} {
		if err := spec.Variables[name].Set(v); err != nil {
			return nil, fmt.Errorf("set %s: %w", name, err)
		}
	}
	objs := &classifierObjects{}
	if err := spec.LoadAndAssign(objs, nil); err != nil {
		return nil, fmt.Errorf("load classifier: %w", err)
	}
	for _, t := range p.Trust {
		addr, bits := mapped(t)
		if err := objs.PrioTrust.Update(classifierPrioLpmKey{Prefixlen: uint32(bits), Addr: addr}, uint8(1), ebpf.UpdateAny); err != nil {
			objs.Close()
			return nil, fmt.Errorf("add trusted prefix %s: %w", t, err)
		}
	}
	return objs, nil
}

// coarseTick is the resolution of the classifier's clock (bpf_ktime_get_coarse_ns, which is
// CLOCK_MONOTONIC_COARSE): one scheduler tick.
func coarseTick() (time.Duration, error) {
	var ts unix.Timespec
	if err := unix.ClockGetres(unix.CLOCK_MONOTONIC_COARSE, &ts); err != nil {
		return 0, fmt.Errorf("the coarse clock's resolution: %w", err)
	}
	return time.Duration(ts.Nano()), nil
}

// onCoarseClock is interval d as the classifier compares it: a time read on the coarse clock
// lags the true time by up to a tick, so two readings differ from the true elapsed time by up
// to a tick either way; one tick more keeps d a lower bound ("at most one change per d"). 0
// stays 0 (off).
func onCoarseClock(d, tick time.Duration) uint64 {
	if d <= 0 {
		return 0
	}
	return uint64((d + tick).Nanoseconds())
}

// buildHTB makes the tree: root fa: → fa:1 (the link rate) → one leaf per band and
// slot, fa:(band+1)<<8|leaf, each with a pfifo of p.Limit packets. Leaves of one band share
// its guaranteed rate equally, may borrow up to the link rate, and borrow in band order (HTB
// prio = band, capped at HTB's 8 levels): the excess goes to the best band that wants it.
func buildHTB(l netlink.Link, rate uint64, p *RouterPolicy) error {
	idx := l.Attrs().Index
	root := netlink.NewHtb(netlink.QdiscAttrs{LinkIndex: idx, Handle: netlink.MakeHandle(Major, 0), Parent: netlink.HANDLE_ROOT})
	root.Defcls = ClassID(Major, p.DefaultBand(), 0) & 0xffff
	if err := netlink.QdiscReplace(root); err != nil {
		return fmt.Errorf("add htb qdisc to %s: %w", l.Attrs().Name, err)
	}
	mtu := uint64(l.Attrs().MTU)
	burst := func(r uint64) uint32 { return uint32(max(64<<10, r/8*2/1000) + mtu + 14) }
	top := netlink.NewHtbClass(netlink.ClassAttrs{LinkIndex: idx, Parent: netlink.MakeHandle(Major, 0), Handle: netlink.MakeHandle(Major, 1)},
		netlink.HtbClassAttrs{Rate: rate, Ceil: rate, Buffer: burst(rate), Cbuffer: burst(rate), Quantum: uint32(min(max(rate/8/10, 1514), 200000))})
	if err := netlink.ClassAdd(top); err != nil {
		return fmt.Errorf("add htb class %x:1: %w", Major, err)
	}
	bands := p.Bands()
	bandRate := rate // fifo: the one class has the link
	switch p.Scheme {
	case Fair:
	case FIFO:
	default:
		bandRate = uint64(float64(rate) * p.MinRate)
	}
	var batch bytes.Buffer
	for b := range bands {
		prio, quantum := uint32(min(b, 7)), uint32(1514)
		if p.Weighted {
			// Weighted: every band at one HTB priority, band b guaranteed and served (DRR
			// quantum) in proportion to bands-b, so the best band gets the most but none
			// takes the whole link.
			w := uint64(bands - b)
			bandRate = rate * w / uint64(bands*(bands+1)/2)
			prio, quantum = 0, uint32(1514*w)
		}
		for leaf := range p.Leaves {
			leafRate := max(bandRate/uint64(p.Leaves), 8000)
			id := ClassID(Major, b, leaf)
			c := netlink.NewHtbClass(netlink.ClassAttrs{LinkIndex: idx, Parent: netlink.MakeHandle(Major, 1), Handle: id},
				netlink.HtbClassAttrs{Rate: leafRate, Ceil: rate, Buffer: burst(leafRate), Cbuffer: burst(rate), Quantum: quantum, Prio: prio})
			if err := netlink.ClassAdd(c); err != nil {
				return fmt.Errorf("add htb class %x:%x: %w", Major, id&0xffff, err)
			}
			fmt.Fprintf(&batch, "qdisc add dev %s parent %x:%x pfifo limit %d\n", l.Attrs().Name, Major, id&0xffff, p.Limit)
		}
	}
	// netlink has no pfifo with a limit: one tc run adds every leaf queue.
	cmd := exec.Command("tc", "-batch", "-")
	cmd.Stdin = &batch
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("add leaf queues with tc: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// deleteHTB removes the root qdisc if it is ours (the device falls back to its default).
func deleteHTB(l netlink.Link) error {
	qs, err := netlink.QdiscList(l)
	if err != nil {
		return err
	}
	for _, q := range qs {
		if q.Attrs().Parent == netlink.HANDLE_ROOT && q.Attrs().Handle>>16 == Major {
			return netlink.QdiscDel(q)
		}
	}
	return nil
}

// RemoveRouter undoes Router on dev in this network namespace; os.ErrNotExist if nothing is
// there.
func RemoveRouter(dev string) error {
	ns, err := pin.ThisNetns()
	if err != nil {
		return err
	}
	dir := pin.Path(routerPin(ns, dev)...)
	_, statErr := os.Stat(dir)
	_, recErr := os.Stat(runstate.Path(subsystem, routerRecordName(ns, dev)))
	found := statErr == nil || recErr == nil
	// The record goes first, so that a concurrent status stops listing what is being removed.
	errs := []error{runstate.Remove(subsystem, routerRecordName(ns, dev))}
	if tl, err := link.LoadPinnedLink(filepath.Join(dir, "link"), nil); err == nil {
		errs = append(errs, tl.Unpin())
		tl.Close() // the last reference: detached
	}
	if l, err := net.InterfaceByName(dev); err == nil {
		if nl, err := netlink.LinkByIndex(l.Index); err == nil {
			qs, _ := netlink.QdiscList(nl)
			for _, q := range qs {
				found = found || (q.Attrs().Parent == netlink.HANDLE_ROOT && q.Attrs().Handle>>16 == Major)
			}
			errs = append(errs, deleteHTB(nl))
		}
	}
	if !found {
		return os.ErrNotExist
	}
	errs = append(errs, pin.Remove(routerPin(ns, dev)...))
	return errors.Join(errs...)
}
