package prio

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/flowplane/flowplane/internal/attach"
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

// ErrTreeChanged says a re-apply would need another HTB tree: the classes can change their
// rates in place, but not come or go under live traffic.
var ErrTreeChanged = errors.New("the HTB tree would change")

// CheckDevice returns the device, or a usage-grade error: missing, or carrying a root qdisc
// that is someone else's. flowplane's own (fa:) is fine: apply replaces in place, or cleans
// what a crash left.
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
		if a.Parent != netlink.HANDLE_ROOT || (a.Handle>>16 == Major && q.Type() == "htb") {
			continue
		}
		if !replaceable[q.Type()] {
			return nil, fmt.Errorf("%w: %s has a %s root qdisc (handle %x:) that prio would replace; remove it first (tc qdisc del dev %s root)", ErrBusy, dev, q.Type(), a.Handle>>16, dev)
		}
	}
	return l, nil
}

// routerInstance is a router as internal/attach knows it: the HTB tree is its Teardown.
func routerInstance(ns, dev string) attach.Instance {
	return attach.Instance{Pin: routerPin(ns, dev), What: fmt.Sprintf("prio router on %s in this network namespace", dev),
		Teardown: func() error {
			l, err := netlink.LinkByName(dev)
			if err != nil {
				return nil // the device is gone, and its qdiscs with it
			}
			return deleteHTB(l)
		}}
}

// Router builds the policy's HTB tree on dev's egress at rate (bits/s), loads the classifier
// and attaches it at tcx egress, all pinned per network namespace and device (ApplyRouter).
func Router(dev string, rate uint64, p *RouterPolicy) error {
	_, err := ApplyRouter(dev, rate, p)
	return err
}

// ApplyRouter is Router, saying whether it replaced an attached router in place and what a
// crash had left that it cleaned first. A replacement swaps the classifier with link.Update
// (the counters carry on; the flow table starts afresh) and changes the classes' rates and
// queue limits in place; a policy that needs other classes is refused (ErrTreeChanged), the
// router staying as it was. Anything that fails undoes what came before it.
func ApplyRouter(dev string, rate uint64, p *RouterPolicy) (attach.Result, error) {
	l, err := CheckDevice(dev)
	if err != nil {
		return attach.Result{}, err
	}
	ns, err := attach.ThisNetns()
	if err != nil {
		return attach.Result{}, err
	}
	in := routerInstance(ns, dev)
	tree := newHTB(l, rate, p)
	return in.Apply(func(replacing bool) (*attach.Spec, error) {
		if replacing {
			if err := tree.sameShape(); err != nil {
				return nil, err
			}
		}
		objs, err := loadClassifierReusing(p, cacheSlots, in.Dir())
		if err != nil {
			return nil, err
		}
		return &attach.Spec{
			Objects: objs,
			Links:   []attach.Link{{Name: "link", Hook: attach.TCXEgress(l.Attrs().Index), Program: objs.PrioClassify}},
			Maps:    map[string]*ebpf.Map{"flows": objs.PrioFlows, "cache": objs.PrioCache, "stats": objs.PrioStats},
			Setup: func(replacing bool) error {
				if replacing {
					return tree.change()
				}
				if err := tree.build(); err != nil {
					_ = deleteHTB(l)
					return err
				}
				return nil
			},
			Record: &RouterRecord{Dev: dev, Rate: rate, File: p.File, Scheme: p.Scheme, Bands: p.Bands(), Leaves: p.Leaves},
		}, nil
	})
}

// ClassifierProgram loads the classifier for p, with or without its flow cache, without
// attaching it, for benchmarks; close the closer when done.
func ClassifierProgram(p *RouterPolicy, cache bool) (*ebpf.Program, io.Closer, error) {
	slots := uint32(0)
	if cache {
		slots = cacheSlots
	}
	objs, err := loadClassifierReusing(p, slots, "")
	if err != nil {
		return nil, nil, err
	}
	return objs.PrioClassify, objs, nil
}

// cacheSlots is the size of each CPU's flow cache (a power of two): 1024 slots of 88 bytes.
const cacheSlots = 1024

// loadClassifierReusing loads the classifier with p's constants and trusted prefixes, slots
// flow cache slots per CPU (a power of two; 0: no cache, every packet reads the flow table),
// on the counters pinned in dir if there are any (dir "": fresh ones).
func loadClassifierReusing(p *RouterPolicy, slots uint32, dir string) (*classifierObjects, error) {
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
	if err := attach.Load(spec, objs, dir, map[string]string{"stats": "prio_stats"}); err != nil {
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

// htbTree is the tree a policy needs: root fa: → fa:1 (the link rate) → one leaf per band and
// slot, fa:(band+1)<<8|leaf, each with a pfifo of p.Limit packets. Leaves of one band share
// its guaranteed rate equally, may borrow up to the link rate, and borrow in band order (HTB
// prio = band, capped at HTB's 8 levels): the excess goes to the best band that wants it.
type htbTree struct {
	l       netlink.Link
	root    *netlink.Htb
	classes []*netlink.HtbClass // fa:1 first, then the leaves
	limit   int
}

// The HTB tree's numbers, with their reasons.
const (
	// minBurst: a class may send this many bytes at once (plus one frame) however slow it is;
	// below about 64 KB HTB's timer granularity keeps a class short of its rate.
	minBurst = 64 << 10
	// burstMs: otherwise the burst is the class's rate for this long (2 ms).
	burstMs = 2
	// ethFrame is the largest Ethernet frame without FCS (1500 + 14): HTB's DRR quantum of one
	// frame per turn, so bands share a link in frames, not in bytes rounded to a bigger unit.
	ethFrame = 1514
	// maxRootQuantum: the root class's quantum, rate/10 bytes, is capped at HTB's own limit
	// (200000, beyond which the kernel warns "quantum of class is big").
	maxRootQuantum = 200000
	// minLeafRate: 8 kbit/s, tc's smallest rate unit; a leaf's guaranteed share never rounds
	// to 0.
	minLeafRate = 8000
	// maxHTBPrio: HTB has priorities 0 to 7; bands past the eighth share the last.
	maxHTBPrio = 7
)

func newHTB(l netlink.Link, rate uint64, p *RouterPolicy) *htbTree {
	idx := l.Attrs().Index
	t := &htbTree{l: l, limit: p.Limit}
	t.root = netlink.NewHtb(netlink.QdiscAttrs{LinkIndex: idx, Handle: netlink.MakeHandle(Major, 0), Parent: netlink.HANDLE_ROOT})
	t.root.Defcls = ClassID(Major, p.DefaultBand(), 0) & 0xffff
	mtu := uint64(l.Attrs().MTU)
	burst := func(r uint64) uint32 { return uint32(max(minBurst, r/8*burstMs/1000) + mtu + 14) }
	t.classes = append(t.classes, netlink.NewHtbClass(netlink.ClassAttrs{LinkIndex: idx, Parent: netlink.MakeHandle(Major, 0), Handle: netlink.MakeHandle(Major, 1)},
		netlink.HtbClassAttrs{Rate: rate, Ceil: rate, Buffer: burst(rate), Cbuffer: burst(rate), Quantum: uint32(min(max(rate/8/10, ethFrame), maxRootQuantum))}))
	bands := p.Bands()
	bandRate := rate // fifo: the one class has the link
	switch p.Scheme {
	case Fair:
	case FIFO:
	default:
		bandRate = uint64(float64(rate) * p.MinRate)
	}
	for b := range bands {
		prio, quantum := uint32(min(b, maxHTBPrio)), uint32(ethFrame)
		if p.Weighted {
			// Weighted: every band at one HTB priority, band b guaranteed and served (DRR
			// quantum) in proportion to bands-b, so the best band gets the most but none
			// takes the whole link.
			w := uint64(bands - b)
			bandRate = rate * w / uint64(bands*(bands+1)/2)
			prio, quantum = 0, uint32(ethFrame*w)
		}
		for leaf := range p.Leaves {
			leafRate := max(bandRate/uint64(p.Leaves), minLeafRate)
			t.classes = append(t.classes, netlink.NewHtbClass(netlink.ClassAttrs{LinkIndex: idx, Parent: netlink.MakeHandle(Major, 1), Handle: ClassID(Major, b, leaf)},
				netlink.HtbClassAttrs{Rate: leafRate, Ceil: rate, Buffer: burst(leafRate), Cbuffer: burst(rate), Quantum: quantum, Prio: prio}))
		}
	}
	return t
}

// build makes the tree on the device.
func (t *htbTree) build() error {
	if err := netlink.QdiscReplace(t.root); err != nil {
		return fmt.Errorf("add htb qdisc to %s: %w", t.l.Attrs().Name, err)
	}
	for _, c := range t.classes {
		if err := netlink.ClassAdd(c); err != nil {
			return fmt.Errorf("add htb class %x:%x: %w", Major, c.Handle&0xffff, err)
		}
	}
	return t.leafQueues("add")
}

// leafQueues adds (or changes) every leaf's pfifo: netlink has no pfifo with a limit, so one
// tc run does them all.
func (t *htbTree) leafQueues(verb string) error {
	var batch bytes.Buffer
	for _, c := range t.classes[1:] {
		fmt.Fprintf(&batch, "qdisc %s dev %s parent %x:%x pfifo limit %d\n", verb, t.l.Attrs().Name, Major, c.Handle&0xffff, t.limit)
	}
	cmd := exec.Command("tc", "-batch", "-")
	cmd.Stdin = &batch
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s leaf queues with tc: %w: %s", verb, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// sameShape says whether the device's tree has t's classes and default class, so that change
// can turn it into t in place; ErrTreeChanged otherwise.
func (t *htbTree) sameShape() error {
	name := t.l.Attrs().Name
	qs, err := netlink.QdiscList(t.l)
	if err != nil {
		return fmt.Errorf("list qdiscs of %s: %w", name, err)
	}
	var root *netlink.Htb
	for _, q := range qs {
		if h, ok := q.(*netlink.Htb); ok && h.Parent == netlink.HANDLE_ROOT && h.Handle>>16 == Major {
			root = h
		}
	}
	if root == nil {
		return fmt.Errorf("%s has no prio HTB qdisc (fa:) to change", name)
	}
	have, err := netlink.ClassList(t.l, netlink.MakeHandle(Major, 0))
	if err != nil {
		return fmt.Errorf("list classes of %s: %w", name, err)
	}
	var a, b []uint32
	for _, c := range have {
		a = append(a, c.Attrs().Handle)
	}
	for _, c := range t.classes {
		b = append(b, c.Handle)
	}
	slices.Sort(a)
	slices.Sort(b)
	if !slices.Equal(a, b) || root.Defcls != t.root.Defcls {
		return fmt.Errorf("%w: %s has %d class(es), default %x:%x; the new policy needs %d, default %x:%x (a class cannot come or go under live traffic: remove the router first)",
			ErrTreeChanged, name, len(a), Major, root.Defcls, len(b), Major, t.root.Defcls)
	}
	return nil
}

// change gives the device's classes t's rates and its leaf queues t's limit, in place: nothing
// queued is dropped.
func (t *htbTree) change() error {
	for _, c := range t.classes {
		if err := netlink.ClassChange(c); err != nil {
			return fmt.Errorf("change htb class %x:%x: %w", Major, c.Handle&0xffff, err)
		}
	}
	return t.leafQueues("change")
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

// RemoveRouter undoes Router on dev in this network namespace; an error matching
// os.ErrNotExist if nothing is there.
func RemoveRouter(dev string) error {
	_, err := removeRouterInstance(dev)
	return err
}

// removeRouterInstance is RemoveRouter, saying what a crash had left. A prio HTB tree with no
// record and no pins (left by a flowplane before internal/attach) goes too.
func removeRouterInstance(dev string) (attach.Result, error) {
	ns, err := attach.ThisNetns()
	if err != nil {
		return attach.Result{}, err
	}
	in := routerInstance(ns, dev)
	res, err := in.Remove()
	if errors.Is(err, attach.ErrAbsent) && ownHTB(dev) {
		res.Cleaned = &attach.Problem{What: "prio HTB qdisc on " + dev, Why: "no record and no pins", Pin: in.Pin}
		return res, in.Teardown()
	}
	return res, err
}

// ownHTB says whether dev's root qdisc is prio's HTB.
func ownHTB(dev string) bool {
	l, err := netlink.LinkByName(dev)
	if err != nil {
		return false
	}
	qs, _ := netlink.QdiscList(l)
	for _, q := range qs {
		if q.Attrs().Parent == netlink.HANDLE_ROOT && q.Attrs().Handle>>16 == Major {
			return true
		}
	}
	return false
}
