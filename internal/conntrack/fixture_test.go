package conntrack

import (
	"bytes"
	"strings"
	"testing"

	"github.com/flowplane/flowplane/internal/nsrun"
	"github.com/flowplane/flowplane/internal/packet"
	"github.com/flowplane/flowplane/internal/progrun"
	"github.com/flowplane/flowplane/internal/progtest"
	"github.com/flowplane/flowplane/internal/testenv"
)

// Addresses of the PROG_TEST_RUN fixture (testenv.Router's).
const (
	inHost   = testenv.RouterInHost
	outHost  = testenv.RouterOutHost
	inHost6  = testenv.RouterInHost6
	outHost6 = testenv.RouterOutHost6
)

var inMAC, outMAC = testenv.RouterInMAC, testenv.RouterOutMAC

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
		// The scripted tests run again under TestTCHook, on the TC build.
		cfg.Hook = HookXDP
		if strings.HasPrefix(t.Name(), "TestTCHook/") {
			cfg.Hook = HookTC
		}
	}
	cfg.Inside, cfg.Outside = []string{"in"}, []string{"out"}
	rt := testenv.NewRouter(t)
	f := &fixture{t: t, ns: rt.NS, in: rt.In, out: rt.Out}
	d, err := LoadUnpinned(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	if err := d.AddInterface(f.in.Index, true); err != nil {
		t.Fatal(err)
	}
	if err := d.AddInterface(f.out.Index, false); err != nil {
		t.Fatal(err)
	}
	for _, v := range []testenv.Veth{f.in, f.out} {
		if err := d.SetMAC(v.Index, v.MAC); err != nil {
			t.Fatal(err)
		}
	}
	f.d, f.tables = d, d.Tables()
	return f
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

// runRaw is run with the program's own verdict. A frame to packet.DstMAC (the builder's
// default) is addressed to the interface it arrives on, as a neighbour would.
func (f *fixture) runRaw(frame []byte, ifindex int) (uint32, []byte) {
	f.t.Helper()
	frame = f.addressed(frame, ifindex)
	var r progtest.Result
	err := nsrun.Do(f.ns, func() error {
		var err error
		r, err = progrun.Exec(f.d.Program(), frame, ifindex)
		return err
	})
	if err != nil {
		f.t.Fatal(err)
	}
	return r.Ret, r.Out
}

// addressed returns frame addressed to the router's interface ifindex if it was built for
// packet.DstMAC (the builder's default), as a neighbour would send it.
func (f *fixture) addressed(frame []byte, ifindex int) []byte {
	if len(frame) < 6 || !bytes.Equal(frame[:6], packet.DstMAC) {
		return frame
	}
	frame = append([]byte(nil), frame...)
	for _, v := range []testenv.Veth{f.in, f.out} {
		if v.Index == ifindex {
			copy(frame[:6], v.MAC)
		}
	}
	return frame
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
