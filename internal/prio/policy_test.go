package prio

import (
	"bytes"
	"errors"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flowplane/flowplane/internal/attach"
	"github.com/flowplane/flowplane/internal/cgroup"
	"github.com/flowplane/flowplane/internal/cli"
	"github.com/flowplane/flowplane/internal/nsrun"
	"github.com/flowplane/flowplane/internal/pin"
	"github.com/flowplane/flowplane/internal/testenv"
	"github.com/vishvananda/netlink"
)

// TestHostPolicy: every bad host policy names the file, line and field; refresh defaults to
// DefaultRefresh and min_interval to DefaultMinInterval when the refresh is longer, and 0
// (every data segment, every change) is kept.
func TestHostPolicy(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ yaml, want string }{
		{"refresh: 10ms\n", "p.yaml:1: advertise: missing"},
		{"advertise: {remote: 198.18.1.0/24}\n", "p.yaml:1: advertise: must be a list"},
		{"advertise: [{remote: 198.18.1.0/33}]\n", "p.yaml:1: advertise[0].remote"},
		{"advertise: [{}]\nrefresh: often\n", `p.yaml:2: refresh: "often" is not a duration`},
		{"advertise: [{}]\nrefresh: -1ms\n", `p.yaml:2: refresh: "-1ms" is not a duration`},
		{"advertise: [{}]\nrefresh: 3000000h\n", `p.yaml:2: refresh: "3000000h" is too long; the most is 2562047h47m16.854775807s`},
		{"advertise: [{}]\nrefesh: 1ms\n", "p.yaml:2: refesh"},
		{"advertise: [{}]\nmin_interval: -1ms\n", `p.yaml:2: min_interval: "-1ms" is not a duration`},
		{"advertise: [{}]\nmin_interval: 2ms\nrefresh: 0\n", "p.yaml:2: min_interval: 2ms with refresh 0"},
		{"advertise: [{}]\nrefresh: 5ms\nmin_interval: 5ms\n", "p.yaml:3: min_interval: 5ms is not below refresh (5ms)"},
	} {
		_, err := ParseHostPolicy("p.yaml", []byte(c.yaml))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: got %v, want an error containing %q", c.yaml, err, c.want)
		}
	}
	for yaml, want := range map[string][2]time.Duration{
		"":                    {DefaultRefresh, DefaultMinInterval},
		"refresh: 0\n":        {0, 0},
		"refresh: 50ms\n":     {50 * time.Millisecond, DefaultMinInterval},
		"refresh: 1ms\n":      {time.Millisecond, 0},
		"min_interval: 0\n":   {DefaultRefresh, 0},
		"min_interval: 3ms\n": {DefaultRefresh, 3 * time.Millisecond},
	} {
		p, err := ParseHostPolicy("p.yaml", []byte("advertise: [{remote_port: 5201}]\n"+yaml))
		if err != nil || p.Refresh != want[0] || p.MinInterval != want[1] || len(p.Advertise) != 1 {
			t.Errorf("%q: %+v, %v; want refresh %v, min_interval %v", yaml, p, err, want[0], want[1])
		}
	}
}

// TestRouterPolicyErrors: every bad router policy names the file, line and field.
func TestRouterPolicyErrors(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ yaml, want string }{
		{"leaves: 4\n", "p.yaml:1: scheme: missing"},
		{"scheme: sfq\n", `p.yaml:1: scheme: "sfq" is not a scheme`},
		{"scheme: fair\nquantum: 3\n", "p.yaml:2: quantum"},
		{"scheme: fair\nleaves: 0\n", `p.yaml:2: leaves: "0" is out of range`},
		{"scheme: fair\nleaves: 65\n", `p.yaml:2: leaves: "65" is out of range`},
		{"scheme: pias\nmin_rate: 0%\n", `p.yaml:2: min_rate: "0%" is not a share`},
		{"scheme: pias\nthresholds: [1MB, 100KB]\n", "p.yaml:2: thresholds[1]: 100KB is not above the edge before it"},
		{"scheme: pias\nthresholds: []\n", "p.yaml:2: thresholds: must be a list of 1 to 8 sizes"},
		{"scheme: backlog\n", "p.yaml:1: trust: missing"},
		{"scheme: pias\nmax_claim: 4\n", "p.yaml:2: max_claim: 4 is past the last band (4 bands)"},
		{"scheme: pias\nmax_claim: -1\n", `p.yaml:2: max_claim: "-1" is not a band; give a whole number from 0 (the best band) to the number of bands − 1`},
		{"scheme: occupancy\ntrust: [198.18.0.0/15]\nservice: strict\nmin_rate: 10%\n", "p.yaml:4: min_rate: 11 bands × 10% is more than the link"},
		{"scheme: backlog\ntrust: [198.18.0.0/15]\nservice: fast\n", `p.yaml:3: service: "fast" is not a band service; use strict or weighted`},
		{"scheme: pias\nidle_reset: soon\n", `p.yaml:2: idle_reset: "soon" is not a duration`},
		{"scheme: occupancy\ntrust: [198.18.0.0/15]\nmove_gap: 2\n", `p.yaml:3: move_gap: "2" is not a duration`},
		{"scheme: fair\nband_change_interval: -1s\n", `p.yaml:2: band_change_interval: "-1s" is not a duration`},
		{"scheme: fair\ntrust: [10.0.0.0/33]\n", "p.yaml:2: trust"},
		{"scheme: fair\ntrust: [198.18.1.5/24]\n", "p.yaml:2: trust: 198.18.1.5/24 has host bits set; write 198.18.1.0/24"},
	} {
		_, err := ParseRouterPolicy("p.yaml", []byte(c.yaml))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: got %v, want an error containing %q", c.yaml, err, c.want)
		}
	}
	p, err := ParseRouterPolicy("p.yaml", []byte("scheme: pias\n"))
	if err != nil {
		t.Fatal(err)
	}
	if p.Leaves != 64 || p.Limit != 32 || p.MinRate != 0.25 || p.ChangeInterval != 10*time.Millisecond ||
		p.IdleReset != 100*time.Millisecond || len(p.Thresholds) != 3 || p.Bands() != 4 || p.DefaultBand() != 0 {
		t.Errorf("defaults: %+v", p)
	}
	// fifo's one queue holds what a band of the others holds.
	if p, err := ParseRouterPolicy("p.yaml", []byte("scheme: fifo\n")); err != nil || p.Leaves != 1 || p.Limit != 2048 {
		t.Errorf("fifo defaults: %+v, %v", p, err)
	}
	// backlog (and pias, above): every band guaranteed an equal share unless the policy says otherwise.
	for yaml, want := range map[string]float64{"": 0.25, "thresholds: [10KB]\n": 1.0 / 3, "min_rate: 1%\n": 0.01} {
		p, err := ParseRouterPolicy("p.yaml", []byte("scheme: backlog\ntrust: [198.18.0.0/15]\n"+yaml))
		if err != nil {
			t.Fatal(err)
		}
		if p.MinRate != want {
			t.Errorf("backlog with %q: min_rate %g, want %g", yaml, p.MinRate, want)
		}
	}
	// occupancy: weighted bands, one move per 5 s and only after 200 ms of silence, unless
	// the policy says otherwise.
	for yaml, want := range map[string]RouterPolicy{
		"":                             {Weighted: true, ChangeInterval: 5 * time.Second, MoveGap: 200 * time.Millisecond},
		"service: strict\n":            {Weighted: false, ChangeInterval: 5 * time.Second, MoveGap: 200 * time.Millisecond},
		"band_change_interval: 10ms\n": {Weighted: true, ChangeInterval: 10 * time.Millisecond, MoveGap: 200 * time.Millisecond},
		"move_gap: 0s\n":               {Weighted: true, ChangeInterval: 5 * time.Second},
	} {
		p, err := ParseRouterPolicy("p.yaml", []byte("scheme: occupancy\ntrust: [198.18.0.0/15]\n"+yaml))
		if err != nil {
			t.Fatal(err)
		}
		if p.Weighted != want.Weighted || p.ChangeInterval != want.ChangeInterval || p.MoveGap != want.MoveGap {
			t.Errorf("occupancy with %q: weighted %v, interval %v, move gap %v; want %v, %v, %v", yaml, p.Weighted, p.ChangeInterval, p.MoveGap, want.Weighted, want.ChangeInterval, want.MoveGap)
		}
	}
}

// runCLI runs `flowplane prio args...` under the binary's root.
func runCLI(args ...string) (string, error) {
	cmd := cli.Root("flowplane", "", Command())
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(append([]string{"prio"}, args...))
	err := cmd.Execute()
	return out.String(), err
}

// TestRouterBadInputAppliesNothing: `prio router` with a bad rate, policy or device exits 2
// naming what is wrong, and leaves the device's qdisc and the pins as they were.
func TestRouterBadInputAppliesNothing(t *testing.T) {
	t.Parallel()
	testenv.Privileged(t)
	testenv.Need(t, "tc")
	ns := testenv.Netns(t)
	other := testenv.Netns(t)
	dev, _ := testenv.VethPair(t, ns, other, netip.MustParsePrefix("198.18.0.1/24"), netip.MustParsePrefix("198.18.0.2/24"))
	busy, _ := testenv.VethPair(t, ns, other, netip.MustParsePrefix("198.18.1.1/24"), netip.MustParsePrefix("198.18.1.2/24"))
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(good, []byte("scheme: fair\nleaves: 2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte("scheme: fair\nleaves: 99\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := nsrun.Do(ns, func() error {
		if out, err := exec.Command("tc", "qdisc", "add", "dev", busy.Name, "root", "tbf", "rate", "1mbit", "burst", "10k", "latency", "10ms").CombinedOutput(); err != nil {
			return errors.New(string(out))
		}
		for _, c := range []struct {
			args []string
			want string
		}{
			{[]string{"--dev", dev.Name, "--rate", "0", "--config", good}, "--rate: \"0\": a rate of 0 sends nothing"},
			{[]string{"--dev", dev.Name, "--rate", "fast", "--config", good}, "--rate"},
			{[]string{"--dev", dev.Name, "--rate", "10mbit", "--config", bad}, "bad.yaml:2: leaves"},
			{[]string{"--dev", dev.Name, "--rate", "10mbit", "--config", filepath.Join(dir, "none.yaml")}, "none.yaml"},
			{[]string{"--dev", "fpnosuch0", "--rate", "10mbit", "--config", good}, `interface "fpnosuch0": no such network interface`},
			{[]string{"--dev", busy.Name, "--rate", "10mbit", "--config", good}, "has a tbf root qdisc"},
			{[]string{"--rate", "10mbit", "--config", good}, "needs --dev"},
		} {
			_, err := runCLI(append([]string{"router", "apply"}, c.args...)...)
			if cli.ExitCode(err) != 2 || !strings.Contains(err.Error(), c.want) {
				t.Errorf("prio router apply %v: exit %d, %v; want exit 2 with %q", c.args, cli.ExitCode(err), err, c.want)
			}
		}
		for _, c := range []struct {
			args []string
			want string
		}{
			{[]string{"router", "remove"}, "needs --dev"},
			{[]string{"host", "remove", "--name", "fpnosuch"}, `no prio host attachment "fpnosuch"`},
			{[]string{"router", "remove", "--dev", dev.Name}, "no prio router on " + dev.Name},
		} {
			_, err := runCLI(c.args...)
			if cli.ExitCode(err) != 2 || !strings.Contains(err.Error(), c.want) {
				t.Errorf("prio %v: exit %d, %v; want exit 2 with %q", c.args, cli.ExitCode(err), err, c.want)
			}
		}
		for _, d := range []string{dev.Name, busy.Name} {
			out, err := exec.Command("tc", "qdisc", "show", "dev", d).CombinedOutput()
			if err != nil || strings.Contains(string(out), "htb") {
				t.Errorf("%s after rejected runs: %s %v", d, out, err)
			}
		}
		ino, err := attach.ThisNetns()
		if err != nil {
			return err
		}
		if _, err := os.Stat(pin.Path(routerPin(ino, dev.Name)...)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("pins left by rejected runs: %v", err)
		}
		// The same device twice: the second replaces the first in place; one that needs other
		// classes is refused (exit 2) and the first stays.
		if out, err := runCLI("router", "apply", "--dev", dev.Name, "--rate", "10mbit", "--config", good); err != nil {
			return err
		} else if want := "prio router: applied scheme fair on " + dev.Name + " at 10mbit"; !strings.HasPrefix(out, want) || strings.Count(out, "\n") != 1 {
			t.Errorf("router apply printed %q, want one line %q…", out, want)
		}
		defer func() { _ = RemoveRouter(dev.Name) }()
		if out, err := runCLI("router", "apply", "--dev", dev.Name, "--rate", "20mbit", "--config", good); err != nil || !strings.HasPrefix(out, "prio router: replaced scheme fair on "+dev.Name+" at 20mbit") {
			t.Errorf("a second router on %s: %v, %q; want it replaced", dev.Name, err, out)
		}
		wider := filepath.Join(dir, "wider.yaml")
		if err := os.WriteFile(wider, []byte("scheme: fair\nleaves: 3\n"), 0o644); err != nil {
			return err
		}
		if _, err := runCLI("router", "apply", "--dev", dev.Name, "--rate", "10mbit", "--config", wider); cli.ExitCode(err) != 2 || !errors.Is(err, ErrTreeChanged) || !strings.Contains(err.Error(), "stays as it was") {
			t.Errorf("a router with other classes on %s: exit %d, %v; want exit 2, ErrTreeChanged", dev.Name, cli.ExitCode(err), err)
		}
		if out, err := runCLI("router", "remove", "--dev", dev.Name); err != nil || out != "prio router: removed from "+dev.Name+"\n" {
			t.Errorf("router remove: %v, %q", err, out)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestRouterServiceTree: strict bands borrow in band order (HTB prio = band, capped at 7) with
// min_rate each; weighted bands share one HTB prio, band b of B guaranteed (B-b)/(1+…+B) of the
// link and served with a quantum of (B-b) × 1514 bytes.
func TestRouterServiceTree(t *testing.T) {
	t.Parallel()
	testenv.Privileged(t)
	testenv.Need(t, "tc")
	ns := testenv.Netns(t)
	dev, _ := testenv.VethPair(t, ns, testenv.Netns(t), netip.MustParsePrefix("198.18.0.1/24"), netip.MustParsePrefix("198.18.0.2/24"))
	const rate = 66e6 // 11 bands: 1+…+11 = 66, so band b is guaranteed (11-b) Mbit/s
	for _, service := range []string{"strict", "weighted"} {
		p, err := ParseRouterPolicy("p.yaml", []byte("scheme: occupancy\ntrust: [198.18.0.0/15]\nleaves: 2\nservice: "+service+"\n"))
		if err != nil {
			t.Fatal(err)
		}
		err = nsrun.Do(ns, func() error {
			if err := Router(dev.Name, rate, p); err != nil {
				return err
			}
			defer func() {
				if err := RemoveRouter(dev.Name); err != nil {
					t.Errorf("remove: %v", err)
				}
			}()
			l, err := netlink.LinkByName(dev.Name)
			if err != nil {
				return err
			}
			classes, err := netlink.ClassList(l, netlink.MakeHandle(Major, 0))
			if err != nil {
				return err
			}
			leaves := 0
			for _, c := range classes {
				h, ok := c.(*netlink.HtbClass)
				id := c.Attrs().Handle & 0xffff
				if !ok || id < 0x100 {
					continue
				}
				leaves++
				band := int(id>>8) - 1
				wantPrio, wantQuantum, wantRate := uint32(min(band, 7)), uint32(1514), uint64(rate*p.MinRate/2)
				if service == "weighted" {
					w := uint64(11 - band)
					wantPrio, wantQuantum, wantRate = 0, uint32(1514*w), w*1e6/2
				}
				// netlink reads rates back in bytes per second
				if h.Prio != wantPrio || h.Quantum != wantQuantum || h.Rate != wantRate/8 || h.Ceil != rate/8 {
					t.Errorf("%s: class %x:%x (band %d): prio %d quantum %d rate %d ceil %d B/s; want prio %d quantum %d rate %d ceil %d B/s",
						service, Major, id, band, h.Prio, h.Quantum, h.Rate, h.Ceil, wantPrio, wantQuantum, wantRate/8, uint64(rate/8))
				}
			}
			if leaves != 22 {
				t.Errorf("%s: %d leaf classes, want 11 bands × 2", service, leaves)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("%s: %v", service, err)
		}
	}
}

// TestHostCLI: `prio host apply` says what it did in one line, and says "replaced" when an
// attachment of the same name existed; remove says so too, and a second remove exits 2.
func TestHostCLI(t *testing.T) {
	t.Parallel()
	testenv.Privileged(t)
	cg := testCgroup(t)
	name := testenv.Name("host")
	t.Cleanup(func() { _ = RemoveHost(name) })
	for _, verb := range []string{"applied", "replaced"} {
		out, err := runCLI("host", "apply", "--cgroup", cg, "--config", "../../examples/prio-host.yaml", "--name", name)
		want := "prio host: " + verb + " \"" + name + "\" on " + cgroup.HostPath(cg) + ", 1 selector"
		if err != nil || !strings.HasPrefix(out, want) || strings.Count(out, "\n") != 1 {
			t.Errorf("host apply: %v, %q; want one line %q…", err, out, want)
		}
	}
	if out, err := runCLI("host", "remove", "--name", name); err != nil || out != "prio host: removed \""+name+"\"\n" {
		t.Errorf("host remove: %v, %q", err, out)
	}
	if _, err := runCLI("host", "remove", "--name", name); cli.ExitCode(err) != 2 {
		t.Errorf("second host remove: %v, want exit 2", err)
	}
}
