// Package testenv is the fixture for privileged tests: a guard that fails loudly in CI when a
// test cannot run, unique fp-prefixed names, and network namespaces and veth pairs removed in
// t.Cleanup.
package testenv

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/rlimit"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/flowplane/flowplane/internal/ipnet"
	"github.com/flowplane/flowplane/internal/nsrun"
)

// Privileged stops t unless it runs as root with BPF and network-namespace rights (see
// Unavailable).
func Privileged(t testing.TB) {
	t.Helper()
	if err := privileged(); err != nil {
		Unavailable(t, "needs root with CAP_BPF and CAP_NET_ADMIN: %v", err)
	}
}

// Unavailable stops t because the host lacks what it needs (the message says what, and how to
// get it). Outside CI the test is skipped; with CI=true it fails, so a CI run never passes by
// skipping. Every test that cannot run on a host stops through here.
func Unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("cannot run in CI (CI=true): "+format, args...)
	}
	t.Skipf(format, args...)
}

func privileged() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("not root (euid %d)", os.Geteuid())
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return fmt.Errorf("remove memlock limit: %w", err)
	}
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		return fmt.Errorf("create a BPF map: %w", err)
	}
	m.Close()
	return nil
}

// Need stops t (see Unavailable) unless every named program is on PATH.
func Need(t testing.TB, programs ...string) {
	t.Helper()
	for _, p := range programs {
		if _, err := exec.LookPath(p); err != nil {
			Unavailable(t, "%s is not installed; `make setup` installs it", p)
		}
	}
}

// Name returns "fp" + prefix + 6 random hex digits: unique across parallel tests and runs.
func Name(prefix string) string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return "fp" + prefix + hex.EncodeToString(b)
}

// netnsOwner reads the creating process's PID from a name Netns made (fpns<hex>-<pid>).
var netnsOwner = regexp.MustCompile(`^fpns[0-9a-f]{6}-([0-9]+)$`)

// Netns creates a named network namespace with loopback up, removed in t.Cleanup. Its name
// carries this process's PID, so that namespaces of a test process killed before its cleanup
// ran (go test -fuzz kills its workers at the end) are removed by the next one.
func Netns(t testing.TB) string {
	t.Helper()
	removeOrphanNetns(t)
	name := fmt.Sprintf("%s-%d", Name("ns"), os.Getpid())
	if err := nsrun.Create(name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := nsrun.Delete(name); err != nil {
			t.Error(err)
		}
	})
	if err := nsrun.Do(name, func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(lo)
	}); err != nil {
		t.Fatalf("bring up lo in %s: %v", name, err)
	}
	return name
}

// Veth is one end of a veth pair made by VethPair.
type Veth struct {
	Netns string
	Name  string
	Index int
	Addr  netip.Prefix
	MAC   []byte
}

// VethPair joins namespaces a and b with a veth pair, addresses them (no DAD for IPv6) and
// brings both ends up. The pair dies with its namespaces.
func VethPair(t testing.TB, a, b string, addrA, addrB netip.Prefix) (Veth, Veth) {
	t.Helper()
	ea, eb := Veth{Netns: a, Name: Name("a"), Addr: addrA}, Veth{Netns: b, Name: Name("b"), Addr: addrB}
	hA, err := netns.GetFromPath(nsrun.Path(a))
	if err != nil {
		t.Fatalf("open netns %s: %v", a, err)
	}
	defer hA.Close()
	hB, err := netns.GetFromPath(nsrun.Path(b))
	if err != nil {
		t.Fatalf("open netns %s: %v", b, err)
	}
	defer hB.Close()
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: ea.Name, Namespace: netlink.NsFd(hA)},
		PeerName:      eb.Name,
		PeerNamespace: netlink.NsFd(hB),
	}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatalf("add veth %s/%s: %v", ea.Name, eb.Name, err)
	}
	for _, e := range []*Veth{&ea, &eb} {
		if err := nsrun.Do(e.Netns, func() error { return setupEnd(e) }); err != nil {
			t.Fatalf("set up %s in %s: %v", e.Name, e.Netns, err)
		}
	}
	return ea, eb
}

func setupEnd(e *Veth) error {
	l, err := netlink.LinkByName(e.Name)
	if err != nil {
		return err
	}
	e.Index, e.MAC = l.Attrs().Index, l.Attrs().HardwareAddr
	if e.Addr.IsValid() {
		addr := &netlink.Addr{IPNet: ipnet.FromPrefix(e.Addr)}
		if e.Addr.Addr().Is6() {
			addr.Flags = 0x02 // IFA_F_NODAD: usable at once
		}
		if err := netlink.AddrAdd(l, addr); err != nil {
			return fmt.Errorf("add %s: %w", e.Addr, err)
		}
	}
	return netlink.LinkSetUp(l)
}

// removeOrphanNetns deletes the namespaces Netns made in processes that no longer run.
func removeOrphanNetns(t testing.TB) {
	names, err := os.ReadDir("/run/netns")
	if err != nil {
		return
	}
	for _, n := range names {
		m := netnsOwner.FindStringSubmatch(n.Name())
		if m == nil {
			continue
		}
		if _, err := os.Stat("/proc/" + m[1]); err == nil {
			continue
		}
		if err := nsrun.Delete(n.Name()); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Logf("remove namespace %s of an ended test process: %v", n.Name(), err)
		}
	}
}
