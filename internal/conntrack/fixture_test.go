package conntrack

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/flowplane/flowplane/internal/nsrun"
	"github.com/flowplane/flowplane/internal/testenv"
)

// Addresses of the PROG_TEST_RUN fixture: a router namespace with an inside and an outside
// veth, each with one neighbour host.
const (
	inHost   = "198.18.1.10"
	outHost  = "198.18.2.10"
	inHost6  = "fd00:1::10"
	outHost6 = "fd00:2::10"
)

var (
	inMAC  = net.HardwareAddr{0x02, 0, 0, 0, 1, 0x10}
	outMAC = net.HardwareAddr{0x02, 0, 0, 0, 2, 0x10}
)

// fixtureHook is the hook of fixtures whose Config names none (TestTCHook switches it).
var fixtureHook = HookXDP

// fixture is a loaded, unattached datapath in a router namespace whose routes and neighbours
// let bpf_fib_lookup succeed.
type fixture struct {
	t       testing.TB
	ns      string
	d       *Datapath
	in, out testenv.Veth // the router's ends
	tables  *Tables
}

func newFixture(t testing.TB, cfg *Config) *fixture {
	t.Helper()
	testenv.Privileged(t)
	if cfg == nil {
		cfg = &Config{}
	}
	if cfg.Hook == "" {
		cfg.Hook = fixtureHook
	}
	cfg.Inside, cfg.Outside = []string{"in"}, []string{"out"}
	r, err := cfg.resolve()
	if err != nil {
		t.Fatal(err)
	}
	rns, h1, h2 := testenv.Netns(t), testenv.Netns(t), testenv.Netns(t)
	in, _ := testenv.VethPair(t, rns, h1, netip.MustParsePrefix("198.18.1.1/24"), netip.MustParsePrefix("198.18.1.10/24"))
	out, _ := testenv.VethPair(t, rns, h2, netip.MustParsePrefix("198.18.2.1/24"), netip.MustParsePrefix("198.18.2.10/24"))
	f := &fixture{t: t, ns: rns, in: in, out: out}
	err = nsrun.Do(rns, func() error {
		for _, s := range []string{"ipv4/ip_forward", "ipv6/conf/all/forwarding"} {
			if err := os.WriteFile(filepath.Join("/proc/sys/net", s), []byte("1"), 0o644); err != nil {
				return err
			}
		}
		for _, x := range []struct {
			v    testenv.Veth
			addr string
			mac  net.HardwareAddr
			self string
		}{{in, inHost, inMAC, ""}, {in, inHost6, inMAC, "fd00:1::1/64"}, {out, outHost, outMAC, ""}, {out, outHost6, outMAC, "fd00:2::1/64"}} {
			l, err := netlink.LinkByIndex(x.v.Index)
			if err != nil {
				return err
			}
			if x.self != "" {
				a, _ := netlink.ParseAddr(x.self)
				a.Flags = 0x02
				if err := netlink.AddrAdd(l, a); err != nil {
					return err
				}
			}
			fam := netlink.FAMILY_V4
			if netip.MustParseAddr(x.addr).Is6() {
				fam = netlink.FAMILY_V6
			}
			if err := netlink.NeighSet(&netlink.Neigh{LinkIndex: x.v.Index, Family: fam, State: netlink.NUD_PERMANENT,
				IP: net.ParseIP(x.addr), HardwareAddr: x.mac}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("set up router namespace: %v", err)
	}
	d, err := LoadUnpinned(r)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	if err := d.AddInterface(in.Index, true); err != nil {
		t.Fatal(err)
	}
	if err := d.AddInterface(out.Index, false); err != nil {
		t.Fatal(err)
	}
	f.d, f.tables = d, d.Tables()
	return f
}

// xdpMD is struct xdp_md, the context of an XDP test run.
type xdpMD struct {
	Data, DataEnd, DataMeta, IngressIfindex, RxQueueIndex, EgressIfindex uint32
}

// skbMD is the head of struct __sk_buff, the context of a TC test run, up to ifindex (the
// kernel zero-fills the rest; len and pkt_type must be zero).
type skbMD struct {
	Len, PktType, Mark, QueueMapping, Protocol, VlanPresent, VlanTCI, VlanProto, Priority uint32
	IngressIfindex, Ifindex                                                               uint32
}

// TC verdicts (TC_ACT_*).
const (
	tcOK       = 0
	tcShot     = 2
	tcRedirect = 7
)

// xdpVerdict maps a TC verdict to the XDP verdict of the same meaning, so the scripted tests
// hold for both hooks.
func xdpVerdict(tc uint32) uint32 {
	switch tc {
	case tcOK:
		return xdpPass
	case tcShot:
		return xdpDrop
	case tcRedirect:
		return xdpRedirect
	}
	return 1000 + tc // no XDP equivalent: fails any comparison
}

// run runs the program on frame as if it arrived on ifindex; it returns the verdict (as XDP's,
// whatever the hook) and the frame after the program.
func (f *fixture) run(frame []byte, ifindex int) (uint32, []byte) {
	f.t.Helper()
	ret, out := f.runRaw(frame, ifindex)
	if f.d.Hook() == HookTC {
		ret = xdpVerdict(ret)
	}
	return ret, out
}

// runRaw is run with the program's own verdict.
func (f *fixture) runRaw(frame []byte, ifindex int) (uint32, []byte) {
	f.t.Helper()
	var ret uint32
	out := make([]byte, len(frame)+256)
	err := nsrun.Do(f.ns, func() error {
		var ctx any = xdpMD{DataEnd: uint32(len(frame)), IngressIfindex: uint32(ifindex)}
		if f.d.Hook() == HookTC {
			ctx = skbMD{IngressIfindex: uint32(ifindex), Ifindex: uint32(ifindex)}
		}
		opts := &ebpf.RunOptions{Data: frame, DataOut: out, Context: ctx}
		var err error
		ret, err = f.d.Program().Run(opts)
		out = opts.DataOut
		return err
	})
	if err != nil {
		f.t.Fatalf("BPF_PROG_TEST_RUN: %v", err)
	}
	return ret, out
}

// counters reads the program's counters.
func (f *fixture) counters() Counters {
	f.t.Helper()
	c, err := f.tables.ReadCounters()
	if err != nil {
		f.t.Fatal(err)
	}
	return c
}

// entries lists the table.
func (f *fixture) entries() []Entry {
	f.t.Helper()
	es, err := f.tables.List()
	if err != nil {
		f.t.Fatal(err)
	}
	return es
}

var _ = binary.BigEndian

func errorf(format string, args ...any) error { return fmt.Errorf(format, args...) }
