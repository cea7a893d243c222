package topo

import (
	"math"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/flowplane/flowplane/internal/impair"
)

func TestParseBadFiles(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, yaml string
		want       []string // every line of the error, exactly
	}{
		{"empty", ``, []string{"bad.yaml: the file is empty; a topology needs nodes and links (see docs/lab.md)"}},
		{"not yaml", "nodes: [", []string{"bad.yaml:1: not valid YAML: did not find expected node content"}},
		{"unknown top key", "name: x\nnodes: {a: {}, b: {}}\nlinks: [{endpoints: [a, b]}]\nlnks: []\n",
			[]string{`bad.yaml:4: lnks: unknown key "lnks"; known keys here: links, name, nodes`}},
		{"missing sections", "name: x\n", []string{
			"bad.yaml:1: nodes: missing; list the hosts and routers, e.g. nodes: {h1: {}, r1: {kind: router}}",
			"bad.yaml:1: links: missing; list the links, e.g. links: [{endpoints: [h1, r1]}]"}},
		{"bad name", "name: My-Lab\nnodes: {a: {}, b: {}}\nlinks: [{endpoints: [a, b]}]\n",
			[]string{`bad.yaml:1: name: topology name "My-Lab" must be 1-12 lowercase letters and digits, starting with a letter`}},
		{"unknown node", "name: x\nnodes: {a: {}, b: {}}\nlinks:\n  - endpoints: [a, c]\n",
			[]string{`bad.yaml:4: links[0].endpoints[1]: unknown node "c"; nodes are: a, b`}},
		{"unknown node and a bad value", "name: x\nnodes: {a: {kind: switch}, b: {}}\nlinks:\n  - endpoints: [a, c]\n    rate: fast\n  - endpoints: [{node: b, ipv4: 1}, a]\n", []string{
			`bad.yaml:2: nodes.a.kind: unknown kind "switch"; use host or router`,
			`bad.yaml:4: links[0].endpoints[1]: unknown node "c"; nodes are: a, b`,
			`bad.yaml:5: links[0].rate: "fast" is not a rate; write a number and a unit, e.g. 100mbit or 1gbit`,
			`bad.yaml:6: links[1].endpoints[0].ipv4: "1" is not an address with prefix length, e.g. 198.18.1.1/24 or fd00:1::1/64`}},
		{"self link", "name: x\nnodes: {a: {}, b: {}}\nlinks:\n  - endpoints: [a, a]\n",
			[]string{`bad.yaml:4: links[0].endpoints: both endpoints are "a"; a link joins two different nodes`}},
		{"unknown kind", "name: x\nnodes:\n  a: {kind: switch}\n  b: {}\nlinks: [{endpoints: [a, b]}]\n",
			[]string{`bad.yaml:3: nodes.a.kind: unknown kind "switch"; use host or router`}},
		{"xdp not a boolean", "name: x\nnodes:\n  a: {xdp: yes}\n  b: {}\nlinks: [{endpoints: [a, b]}]\n",
			[]string{`bad.yaml:3: nodes.a.xdp: "yes" is not a boolean; write true or false`}},
		{"unknown link key", "name: x\nnodes: {a: {}, b: {}}\nlinks:\n  - endpoints: [a, b]\n    bandwidth: 1gbit\n",
			[]string{`bad.yaml:5: links[0].bandwidth: unknown key "bandwidth"; known keys here: corrupt, delay, distribution, duplicate, endpoints, jitter, loss, mtu, rate, reorder`}},
		{"bad rate", "name: x\nnodes: {a: {}, b: {}}\nlinks:\n  - endpoints: [a, b]\n    rate: fast\n",
			[]string{`bad.yaml:5: links[0].rate: "fast" is not a rate; write a number and a unit, e.g. 100mbit or 1gbit`}},
		{"bps rate", "name: x\nnodes: {a: {}, b: {}}\nlinks:\n  - endpoints: [a, b]\n    rate: 10mbps\n",
			[]string{`bad.yaml:5: links[0].rate: "10mbps" is ambiguous: tc reads bps as bytes per second; write bits: kbit, mbit, gbit`}},
		{"rate unit", "name: x\nnodes: {a: {}, b: {}}\nlinks:\n  - endpoints: [a, b]\n    rate: 10furlongs\n",
			[]string{`bad.yaml:5: links[0].rate: "10furlongs" has unknown unit "furlongs"; use bit, kbit, mbit, gbit or tbit`}},
		{"loss too big", "name: x\nnodes: {a: {}, b: {}}\nlinks:\n  - endpoints: [a, b]\n    loss: 120%\n",
			[]string{`bad.yaml:5: links[0].loss: "120%" is out of range; a percentage is from 0 to 100`}},
		{"loss not a number", "name: x\nnodes: {a: {}, b: {}}\nlinks:\n  - endpoints: [a, b]\n    loss: some\n",
			[]string{`bad.yaml:5: links[0].loss: "some" is not a percentage; write a number from 0 to 100, e.g. 1 or 0.5%`}},
		{"bad mtu", "name: x\nnodes: {a: {}, b: {}}\nlinks:\n  - endpoints: [a, b]\n    mtu: 576\n",
			[]string{`bad.yaml:5: links[0].mtu: "576" is not an MTU from 1280 (the IPv6 minimum) to 65535`}},
		{"duplicate address", "name: x\nnodes: {a: {kind: router}, b: {}, c: {}}\nlinks:\n" +
			"  - endpoints: [{node: a, ipv4: 198.18.5.1/24}, {node: b, ipv4: 198.18.5.2/24}]\n" +
			"  - endpoints: [{node: a, ipv4: 198.18.5.1/24}, {node: c, ipv4: 198.18.5.3/24}]\n",
			[]string{`bad.yaml:5: links[1].endpoints[0]: address 198.18.5.1 is already used by links[0].endpoints[0] (line 4)`}},
		{"overlapping subnets", "name: x\nnodes: {a: {kind: router}, b: {}, c: {}}\nlinks:\n" +
			"  - endpoints: [{node: a, ipv4: 198.18.5.1/24}, {node: b, ipv4: 198.18.5.2/24}]\n" +
			"  - endpoints: [{node: a, ipv4: 198.18.5.9/25}, {node: c, ipv4: 198.18.5.10/25}]\n",
			[]string{`bad.yaml:5: links[1].endpoints[0]: subnet 198.18.5.0/25 overlaps 198.18.5.0/24 of links[0]; give each link its own subnet`}},
		{"one-sided address", "name: x\nnodes: {a: {}, b: {}}\nlinks:\n  - endpoints: [{node: a, ipv6: 'fd00:9::1/64'}, b]\n",
			[]string{`bad.yaml:4: links[0].endpoints: ipv6 is set on one endpoint only; set it on both (same subnet) or on neither to have it assigned`}},
		{"address family", "name: x\nnodes: {a: {}, b: {}}\nlinks:\n  - endpoints: [{node: a, ipv4: 'fd00::1/64'}, {node: b, ipv4: 'fd00::2/64'}]\n",
			[]string{`bad.yaml:4: links[0].endpoints[0].ipv4: "fd00::1/64" is not an IPv4 address`, `bad.yaml:4: links[0].endpoints[1].ipv4: "fd00::2/64" is not an IPv4 address`}},
		{"different subnets", "name: x\nnodes: {a: {}, b: {}}\nlinks:\n  - endpoints: [{node: a, ipv4: 198.18.1.1/24}, {node: b, ipv4: 198.18.2.1/24}]\n",
			[]string{`bad.yaml:4: links[0].endpoints: ipv4 addresses 198.18.1.1/24 and 198.18.2.1/24 are not in one subnet`}},
		{"network address", "name: x\nnodes: {a: {}, b: {}}\nlinks:\n  - endpoints: [{node: a, ipv4: 198.18.1.0/24}, {node: b, ipv4: 198.18.1.1/24}]\n",
			[]string{`bad.yaml:4: links[0].endpoints[0].ipv4: "198.18.1.0/24" is the network address of its prefix; give an interface address, e.g. 198.18.1.1`}},
		{"two endpoints", "name: x\nnodes: {a: {}, b: {}}\nlinks:\n  - endpoints: [a]\n",
			[]string{`bad.yaml:4: links[0].endpoints: must list exactly two endpoints, e.g. [h1, r1] or [{node: h1, ipv4: 198.18.1.1/24}, …]`}},
		{"missing endpoints", "name: x\nnodes: {a: {}, b: {}}\nlinks:\n  - rate: 1gbit\n",
			[]string{`bad.yaml:4: links[0].endpoints: missing; name the two nodes the link joins, e.g. endpoints: [h1, r1]`}},
		{"jitter over delay", "name: x\nnodes: {a: {}, b: {}}\nlinks:\n  - endpoints: [a, b]\n    delay: 1ms\n    jitter: 5ms\n",
			[]string{`bad.yaml:4: links[0].jitter: jitter 5ms is larger than delay 1ms; jitter varies the delay and cannot make it negative`}},
		{"jitter over an endpoint's delay", "name: x\nnodes: {a: {}, b: {}}\nlinks:\n  - endpoints: [{node: a, delay: 1ms}, b]\n    delay: 10ms\n    jitter: 2ms\n",
			[]string{`bad.yaml:4: links[0].endpoints[0].jitter: jitter 2ms is larger than delay 1ms; jitter varies the delay and cannot make it negative`}},
		{"unknown distribution", "name: x\nnodes: {a: {}, b: {}}\nlinks:\n  - endpoints: [a, b]\n    delay: 10ms\n    jitter: 1ms\n    distribution: gamma\n",
			[]string{`bad.yaml:7: links[0].distribution: unknown distribution "gamma"; use uniform, normal or pareto`}},
		{"absurd delay", "name: x\nnodes: {a: {}, b: {}}\nlinks:\n  - endpoints: [a, {node: b, delay: 11s}]\n",
			[]string{`bad.yaml:4: links[0].endpoints[1].delay: "11s" is out of range; a delay is from 0 to 10s`}},
		{"negative delay", "name: x\nnodes: {a: {}, b: {}}\nlinks:\n  - endpoints: [a, b]\n    delay: -1ms\n",
			[]string{`bad.yaml:5: links[0].delay: "-1ms" is out of range; a delay is from 0 to 10s`}},
		{"delay too long for Go", "name: x\nnodes: {a: {}, b: {}}\nlinks:\n  - endpoints: [a, b]\n    delay: 3000000h\n",
			[]string{`bad.yaml:5: links[0].delay: "3000000h" is out of range; a delay is from 0 to 10s`}},
		{"bad duplicate", "name: x\nnodes: {a: {}, b: {}}\nlinks:\n  - endpoints: [a, b]\n    duplicate: 101%\n",
			[]string{`bad.yaml:5: links[0].duplicate: "101%" is out of range; a percentage is from 0 to 100`}},
		{"gemodel without r", "name: x\nnodes: {a: {}, b: {}}\nlinks:\n  - endpoints: [a, b]\n    loss: gemodel 1%\n",
			[]string{`bad.yaml:5: links[0].loss: "gemodel 1%": write gemodel P R [1-H [1-K]] in percent, e.g. gemodel 1% 25%: P and R the chances of entering and leaving the bad state, 1-H and 1-K the loss in the bad (default 100%) and good (default 0%) states`}},
		{"gemodel r 0", "name: x\nnodes: {a: {}, b: {}}\nlinks:\n  - endpoints: [a, b]\n    loss: gemodel 1% 0\n",
			[]string{`bad.yaml:5: links[0].loss: "gemodel 1% 0": R is 0, so a burst would never end; write gemodel P R [1-H [1-K]] in percent, e.g. gemodel 1% 25%: P and R the chances of entering and leaving the bad state, 1-H and 1-K the loss in the bad (default 100%) and good (default 0%) states`}},
		{"bad node name", "name: x\nnodes: {A_1: {}, b: {}}\nlinks: [{endpoints: [A_1, b]}]\n",
			[]string{`bad.yaml:2: nodes.A_1: node name "A_1" must be 1-15 lowercase letters, digits or dashes, starting with a letter`}},
		{"duplicate key", "name: x\nnodes: {a: {}, b: {}}\nlinks:\n  - endpoints: [a, b]\n    rate: 1gbit\n    rate: 2gbit\n",
			[]string{`bad.yaml:6: links[0].rate: key "rate" given twice`}},
		{"several at once", "name: x\nnodes: {a: {}, b: {}}\nlinks:\n  - endpoints: [a, b]\n    rate: 0mbit\n    loss: -1\n",
			[]string{`bad.yaml:5: links[0].rate: "0mbit": a rate of 0 sends nothing; give one above 0, e.g. 100mbit`,
				`bad.yaml:6: links[0].loss: "-1" is out of range; a percentage is from 0 to 100`}},
		{"bad endpoint rate and loss", "name: x\nnodes: {a: {}, b: {}}\nlinks:\n  - endpoints:\n      - {node: a, rate: 0kbit}\n      - {node: b, loss: gemodel 1%}\n",
			[]string{`bad.yaml:5: links[0].endpoints[0].rate: "0kbit": a rate of 0 sends nothing; give one above 0, e.g. 100mbit`,
				`bad.yaml:6: links[0].endpoints[1].loss: "gemodel 1%": write gemodel P R [1-H [1-K]] in percent, e.g. gemodel 1% 25%: P and R the chances of entering and leaving the bad state, 1-H and 1-K the loss in the bad (default 100%) and good (default 0%) states`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse("bad.yaml", []byte(c.yaml))
			if err == nil {
				t.Fatal("no error")
			}
			if got := err.Error(); got != strings.Join(c.want, "\n") {
				t.Errorf("got:\n%s\nwant:\n%s", got, strings.Join(c.want, "\n"))
			}
		})
	}
}

func TestParseAssignsAddresses(t *testing.T) {
	t.Parallel()
	top, err := Parse("x.yaml", []byte(`
nodes:
  h1: {}
  r1: {kind: router, env: {ROLE: core}}
  h2: {}
links:
  - endpoints: [h1, r1]
  - endpoints:
      - {node: r1, ipv4: 198.18.0.1/24, ipv6: "fd00::1/64"}
      - {node: h2, ipv4: 198.18.0.2/24, ipv6: "fd00::2/64"}
    rate: 100mbit
    loss: 0.5%
    mtu: 9000
`))
	if err != nil {
		t.Fatal(err)
	}
	if top.Name != "x" {
		t.Errorf("name %q, want x (from the file name)", top.Name)
	}
	l0, l1 := top.Links[0], top.Links[1]
	// The user's link took 198.18.0.0/24 and fd00::/64, so the auto link gets the next ones.
	for _, c := range []struct {
		got  netip.Prefix
		want string
	}{
		{l0.A.IPv4, "198.18.1.1/24"}, {l0.B.IPv4, "198.18.1.2/24"},
		{l0.A.IPv6, "fd00:0:0:1::1/64"}, {l0.B.IPv6, "fd00:0:0:1::2/64"},
		{l1.A.IPv4, "198.18.0.1/24"},
	} {
		if c.got.String() != c.want {
			t.Errorf("address %s, want %s", c.got, c.want)
		}
	}
	if l1.Rate != 100e6 || l1.Loss != 0.5 || !l1.HasLoss || l1.MTU != 9000 || l0.MTU != DefaultMTU || l0.HasLoss {
		t.Errorf("link properties: %+v", *l1)
	}
	r1 := top.Node("r1")
	if r1.Kind != Router || r1.Env["ROLE"] != "core" || r1.Ifaces[0].Name != "eth0" || r1.Ifaces[1].Name != "eth1" {
		t.Errorf("r1: %+v", *r1)
	}
	if r1.Ifaces[1].Peer().Node.Name != "h2" {
		t.Errorf("peer of r1 eth1 is %s", r1.Ifaces[1].Peer().Node.Name)
	}
}

func TestRoutesShortestPathThroughRoutersOnly(t *testing.T) {
	t.Parallel()
	// h1 — r1 — r2 — h2, plus a shortcut h1 — h3 — h2 through a host, which must not be used.
	top, err := Parse("x.yaml", []byte(`
name: x
nodes: {h1: {}, r1: {kind: router}, r2: {kind: router}, h2: {}, h3: {}}
links:
  - endpoints: [h1, r1]
  - endpoints: [r1, r2]
  - endpoints: [r2, h2]
  - endpoints: [h1, h3]
  - endpoints: [h3, h2]
`))
	if err != nil {
		t.Fatal(err)
	}
	routes := map[string]Route{}
	for _, r := range top.Routes(top.Node("h1")) {
		routes[r.Dst.String()] = r
	}
	r := routes["198.18.2.0/24"] // r2 — h2
	if r.Via.String() != "198.18.0.2" || r.Dev.Name != "eth0" || r.Hops != 1 {
		t.Errorf("route to r2—h2: via %s dev %s hops %d, want via 198.18.0.2 dev eth0 hops 1", r.Via, r.Dev.Name, r.Hops)
	}
	if r6 := routes["fd00:0:0:2::/64"]; r6.Via.String() != "fd00::2" {
		t.Errorf("IPv6 route via %s, want fd00::2", r6.Via)
	}
	// h3 — h2 is reachable through h3 (directly attached neighbour), not through h2 via routers.
	if r := routes["198.18.4.0/24"]; r.Via.String() != "198.18.3.2" {
		t.Errorf("route to h3—h2 via %s, want 198.18.3.2 (h3)", r.Via)
	}
	if len(top.Routes(top.Node("h1"))) != 2*3 {
		t.Errorf("h1 has %d routes, want 6 (3 subnets × 2 families)", len(top.Routes(top.Node("h1"))))
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte("name: x\nnodes: {a: {}, b: {}}\nlinks: [{endpoints: [a, b], rate: 1gbit, loss: 1}]\n"))
	f.Add([]byte("nodes: {a: {kind: router}}\nlinks: [{endpoints: [{node: a, ipv4: 1.2.3.4/24}, a]}]"))
	f.Fuzz(func(t *testing.T, data []byte) {
		top, err := Parse("f.yaml", data)
		if err != nil {
			return
		}
		for _, n := range top.Nodes {
			top.Routes(n) // must not panic on any accepted topology
		}
	})
}

func TestParseNamed(t *testing.T) {
	t.Parallel()
	data := []byte("nodes: {a: {}, b: {}}\nlinks: [{endpoints: [a, b], rate: x}]\n")
	_, err := ParseNamed("My File.yaml", data, "Bad-Name")
	want := "My File.yaml:2: links[0].rate: \"x\" is not a rate; write a number and a unit, e.g. 100mbit or 1gbit\n" +
		"My File.yaml: --name: topology name \"Bad-Name\" must be 1-12 lowercase letters and digits, starting with a letter"
	if err == nil || err.Error() != want {
		t.Errorf("got %v\nwant %s", err, want)
	}
	top, err := ParseNamed("My File.yaml", []byte("nodes: {a: {}, b: {}}\nlinks: [{endpoints: [a, b]}]\n"), "good")
	if err != nil || top.Name != "good" {
		t.Errorf("ParseNamed: %v, name %v", err, top)
	}
	if _, err := Parse("My File.yaml", []byte("nodes: {a: {}, b: {}}\nlinks: [{endpoints: [a, b]}]\n")); err == nil ||
		err.Error() != `My File.yaml: name: topology name "My File" must be 1-12 lowercase letters and digits, starting with a letter; add a name: key` {
		t.Errorf("file name as lab name: %v", err)
	}
}

// Impairment keys on a link apply to both directions; an endpoint's own override them for what
// that end sends.
func TestImpairmentPerDirection(t *testing.T) {
	t.Parallel()
	top, err := Parse("ok.yaml", []byte(`name: x
nodes: {a: {}, b: {}}
links:
  - endpoints: [{node: a, delay: 20ms, distribution: pareto}, b]
    delay: 10ms
    jitter: 2ms
    duplicate: 1%
    loss: gemodel 1% 25% 100% 0%
`))
	if err != nil {
		t.Fatal(err)
	}
	l := top.Links[0]
	a, b := l.A.Egress, l.B.Egress
	if a.Delay != 20*time.Millisecond || a.Jitter != 2*time.Millisecond || a.Distribution != impair.Pareto || a.Duplicate != 1 {
		t.Errorf("a's egress %+v", a)
	}
	if b.Delay != 10*time.Millisecond || b.Jitter != 2*time.Millisecond || b.Distribution != impair.Uniform || b.Duplicate != 1 {
		t.Errorf("b's egress %+v", b)
	}
	if l.LossGE == nil || l.LossGE.P != 0.01 || l.LossGE.R != 0.25 || !l.Impaired() || math.Abs(l.Loss-100*0.01/0.26) > 1e-9 {
		t.Errorf("gemodel loss: %+v, mean %g%%", l.LossGE, l.Loss)
	}
	if p := l.A.Params(1); p.Delay != 20*time.Millisecond || p.Duplicate != 0.01 || p.GE != l.LossGE {
		t.Errorf("a's params %+v", p)
	}
}

// rate and loss on a link apply to both directions; an endpoint's own override them for what that
// end sends, and a burst-loss model on one end makes the link impaired.
func TestRateLossPerDirection(t *testing.T) {
	t.Parallel()
	top, err := Parse("ok.yaml", []byte(`name: x
nodes: {a: {}, b: {}, c: {}}
links:
  - endpoints: [a, {node: b, rate: 10mbit, loss: 0}]
    rate: 100mbit
    loss: 2%
  - endpoints: [{node: a, loss: gemodel 1% 25%}, c]
`))
	if err != nil {
		t.Fatal(err)
	}
	l0, l1 := top.Links[0], top.Links[1]
	if a := l0.A; a.Rate != 100e6 || a.Loss != 2 || !a.HasLoss || a.LossGE != nil {
		t.Errorf("a → b: rate %d, loss %g (%v, %v)", a.Rate, a.Loss, a.HasLoss, a.LossGE)
	}
	if b := l0.B; b.Rate != 10e6 || b.Loss != 0 || !b.HasLoss {
		t.Errorf("b → a: rate %d, loss %g (%v)", b.Rate, b.Loss, b.HasLoss)
	}
	if p := l0.B.Params(1); p.Rate != 10e6 || p.Loss != 0 {
		t.Errorf("b's params %+v", p)
	}
	if l0.Impaired() {
		t.Error("rate and Bernoulli loss alone need no relay")
	}
	if a, c := l1.A, l1.B; a.LossGE == nil || c.LossGE != nil || c.HasLoss || !l1.Impaired() || l1.A.Params(1).GE != a.LossGE {
		t.Errorf("gemodel on one end: a %+v, c %+v, impaired %v", a.LossGE, c.LossGE, l1.Impaired())
	}
}
