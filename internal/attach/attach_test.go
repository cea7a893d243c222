package attach_test

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/flowplane/flowplane/internal/attach"
	"github.com/flowplane/flowplane/internal/nsrun"
	"github.com/flowplane/flowplane/internal/pin"
	"github.com/flowplane/flowplane/internal/runstate"
	"github.com/flowplane/flowplane/internal/testenv"
)

// prog loads a program of type typ that returns ret.
func prog(t *testing.T, typ ebpf.ProgramType, ret int32) *ebpf.Program {
	t.Helper()
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: typ, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, ret), asm.Return()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func counterMap(t *testing.T) *ebpf.Map {
	t.Helper()
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// testInstance is an instance of a subsystem of the test's own, its pins and records removed
// at cleanup.
func testInstance(t *testing.T) attach.Instance {
	t.Helper()
	sub := testenv.Name("attach")
	t.Cleanup(func() {
		_ = pin.Remove(sub)
		_ = os.RemoveAll(filepath.Join(runstate.Root, sub))
	})
	return attach.Instance{Pin: []string{sub, "x"}, What: "test attachment"}
}

// pinnedLink is the ID and program ID of the instance's pinned link.
func pinnedLink(t *testing.T, in attach.Instance) (link.ID, ebpf.ProgramID) {
	t.Helper()
	l, err := link.LoadPinnedLink(filepath.Join(in.Dir(), "link"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil {
		t.Fatal(err)
	}
	return info.ID, info.Program
}

const tcxNext = -1 // TCX_NEXT

// TestReplace: a re-apply swaps the program on the same link (the hook never empties); a new
// program that fails to load or to take the hook leaves the old one attached and says so;
// remove takes everything; a second remove is ErrAbsent naming the instance.
func TestReplace(t *testing.T) {
	testenv.Privileged(t)
	ns := testenv.Netns(t)
	veth, _ := testenv.VethPair(t, ns, testenv.Netns(t), netip.MustParsePrefix("198.18.20.1/24"), netip.MustParsePrefix("198.18.20.2/24"))
	in := testInstance(t)
	err := nsrun.Do(ns, func() error {
		stats := counterMap(t)
		spec := func(p *ebpf.Program, maps map[string]*ebpf.Map) func(bool) (*attach.Spec, error) {
			return func(bool) (*attach.Spec, error) {
				return &attach.Spec{Links: []attach.Link{{Name: "link", Hook: attach.TCXEgress(veth.Index), Program: p}},
					Maps: maps, Record: map[string]int{"n": 1}}, nil
			}
		}
		res, err := in.Apply(spec(prog(t, ebpf.SchedCLS, tcxNext), map[string]*ebpf.Map{"stats": stats, "flows": counterMap(t)}))
		if err != nil || res.Replaced || res.Cleaned != nil {
			t.Fatalf("first apply: %+v %v", res, err)
		}
		id, p1 := pinnedLink(t, in)

		_, err = in.Apply(func(bool) (*attach.Spec, error) { return nil, errors.New("the verifier said no") })
		if err == nil || !strings.Contains(err.Error(), "the verifier said no; the attached test attachment stays as it was") {
			t.Errorf("a load that fails: %v", err)
		}
		_, err = in.Apply(spec(prog(t, ebpf.XDP, 2), map[string]*ebpf.Map{"stats": stats, "flows": counterMap(t)}))
		if err == nil || !strings.Contains(err.Error(), "link.Update") || !strings.Contains(err.Error(), "stays as it was") {
			t.Errorf("an update that fails: %v", err)
		}
		if id2, p2 := pinnedLink(t, in); id2 != id || p2 != p1 {
			t.Errorf("after failed replacements the link is %d with program %d, want %d with %d", id2, p2, id, p1)
		}
		if entries, _ := os.ReadDir(in.Dir()); len(entries) != 3 {
			t.Errorf("pins after failed replacements: %v, want link, stats, flows", entries)
		}

		flows := counterMap(t)
		res, err = in.Apply(spec(prog(t, ebpf.SchedCLS, tcxNext), map[string]*ebpf.Map{"stats": stats, "flows": flows}))
		if err != nil || !res.Replaced {
			t.Fatalf("replacement: %+v %v", res, err)
		}
		if id2, p2 := pinnedLink(t, in); id2 != id || p2 == p1 {
			t.Errorf("after the replacement the link is %d with program %d, want link %d with a new program", id2, p2, id)
		}
		m, err := ebpf.LoadPinnedMap(filepath.Join(in.Dir(), "flows"), nil)
		if err != nil {
			t.Fatal(err)
		}
		a, _ := m.Info()
		b, _ := flows.Info()
		ida, _ := a.ID()
		idb, _ := b.ID()
		m.Close()
		if ida != idb {
			t.Errorf("the new flows map is not pinned in place of the old")
		}

		if _, err := in.Remove(); err != nil {
			t.Fatal(err)
		}
		q, err := link.QueryPrograms(link.QueryOptions{Target: veth.Index, Attach: ebpf.AttachTCXEgress})
		if err != nil || len(q.Programs) != 0 {
			t.Errorf("after remove: %v %v", q, err)
		}
		_, err = in.Remove()
		if !errors.Is(err, attach.ErrAbsent) || !errors.Is(err, os.ErrNotExist) || err.Error() != "no test attachment" {
			t.Errorf("second remove: %v", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestLeftovers: a record whose link lost its device, and pins without a record, are
// reported by Leftover and Leftovers, and cleaned by the next Apply or Remove.
func TestLeftovers(t *testing.T) {
	testenv.Privileged(t)
	ns := testenv.Netns(t)
	veth, _ := testenv.VethPair(t, ns, testenv.Netns(t), netip.MustParsePrefix("198.18.21.1/24"), netip.MustParsePrefix("198.18.21.2/24"))
	in := testInstance(t)
	apply := func(ifindex int) (attach.Result, error) {
		return in.Apply(func(bool) (*attach.Spec, error) {
			return &attach.Spec{Links: []attach.Link{{Name: "link", Hook: attach.TCXIngress(ifindex), Program: prog(t, ebpf.SchedCLS, tcxNext)}},
				Record: map[string]int{"n": 1}}, nil
		})
	}
	leftovers := func() []attach.Problem {
		ps, err := attach.Leftovers(in.Pin[0], func(n string) (attach.Instance, bool) { return in, n == "x" })
		if err != nil {
			t.Fatal(err)
		}
		return ps
	}
	err := nsrun.Do(ns, func() error {
		if _, err := apply(veth.Index); err != nil {
			return err
		}
		if p, err := in.Leftover(); err != nil || p != nil || len(leftovers()) != 0 {
			t.Errorf("a whole instance: %v %v %v", p, err, leftovers())
		}
		// The device goes: the link holds no hook.
		dev, err := netlink.LinkByIndex(veth.Index)
		if err != nil {
			return err
		}
		if err := netlink.LinkDel(dev); err != nil {
			return err
		}
		if p, err := in.Leftover(); err != nil || p == nil || !strings.Contains(p.Why, "holds no hook") {
			t.Errorf("link without a device: %v %v", p, err)
		}
		if ps := leftovers(); len(ps) != 1 {
			t.Errorf("Leftovers: %v", ps)
		}
		// The next apply cleans it first.
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		res, err := apply(lo.Attrs().Index)
		if err != nil || res.Cleaned == nil || res.Replaced {
			t.Errorf("apply over a leftover: %+v %v", res, err)
		}
		// Pins without a record (a kill -9 after pinning).
		if err := os.Remove(runstate.Path(in.Pin[0], "x")); err != nil {
			return err
		}
		if ps := leftovers(); len(ps) != 1 || !strings.Contains(ps[0].Why, "without a record") {
			t.Errorf("Leftovers of pins without a record: %v", ps)
		}
		res, err = in.Remove()
		if err != nil || res.Cleaned == nil {
			t.Errorf("remove of a leftover: %+v %v", res, err)
		}
		q, err := link.QueryPrograms(link.QueryOptions{Target: lo.Attrs().Index, Attach: ebpf.AttachTCXIngress})
		if err != nil || len(q.Programs) != 0 {
			t.Errorf("after remove: %v %v", q, err)
		}
		if ps := leftovers(); len(ps) != 0 {
			t.Errorf("Leftovers after remove: %v", ps)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
