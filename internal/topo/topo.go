// Package topo reads the YAML topology format shared by the kernel lab and vnet: nodes, links,
// addresses and link properties, validated as a whole, with every error tied to its line.
package topo

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"time"

	"github.com/flowplane/flowplane/internal/config"
	"github.com/flowplane/flowplane/internal/impair"
)

// Kind says whether a node forwards packets.
type Kind string

const (
	Host   Kind = "host"
	Router Kind = "router"
)

// Topology is a validated topology with every address assigned.
type Topology struct {
	Name  string
	File  string
	Nodes []*Node // in file order
	Links []*Link // in file order
}

// Node is a host or router.
type Node struct {
	Name string
	Kind Kind
	// XDP says the node forwards with XDP redirects: the kernel lab prepares its link peers to
	// exchange such frames (full checksums, NAPI receive). vnet has no offloads and ignores it.
	XDP    bool
	Env    map[string]string
	Ifaces []*Iface // in link order
}

// Iface is one end of a link.
type Iface struct {
	Name string // eth0, eth1, … in the order the node's links appear
	Node *Node
	Link *Link
	IPv4 netip.Prefix // address and prefix length of the link
	IPv6 netip.Prefix
	// Egress is what the link does in user space to the packets this end sends: the link's
	// delay, jitter, distribution, reorder, duplicate and corrupt keys, each overridden by the
	// endpoint's own.
	Egress Impairment
	// Rate, Loss, HasLoss and LossGE are the rate and loss of what this end sends: the link's
	// (Link.Rate …) unless the endpoint gives its own. Dataplanes read these, not the link's.
	Rate    uint64 // bits per second, 0: unlimited
	Loss    float64
	HasLoss bool
	LossGE  *impair.GilbertElliott
}

// Impairment is what a link does to one direction's packets beyond rate and loss: netem's
// delay, jitter, reordering, duplication and corruption. Percentages are 0..100.
type Impairment struct {
	Delay        time.Duration
	Jitter       time.Duration
	Distribution impair.Distribution // of the jitter; "" until build sets the default
	Reorder      float64
	Duplicate    float64
	Corrupt      float64
	// Given is true when the file sets any of these keys for this direction, even to 0 (as
	// `loss: 0` attaches the loss stage): the link is then impaired, with a relay in the lab.
	Given bool
}

// Peer is the other end of the link.
func (i *Iface) Peer() *Iface {
	if i.Link.A == i {
		return i.Link.B
	}
	return i.Link.A
}

// Link joins two interfaces. Zero values mean "not set": no shaping, no impairment.
type Link struct {
	Index int
	Line  int // line of the link in the file, for messages
	A, B  *Iface
	MTU   int
	// Rate and loss as the link's keys give them, for both directions; an endpoint can override
	// them for what it sends (Iface.Rate …, which dataplanes use).
	Rate uint64 // bits per second
	// Loss is a probability in percent. HasLoss is true when the file sets loss, even to 0, so a
	// dataplane can attach its loss stage and count. LossGE, when set, replaces Loss by burst
	// loss (`loss: gemodel …`); Loss is then its mean.
	Loss    float64
	HasLoss bool
	LossGE  *impair.GilbertElliott
}

// Impaired reports whether the link needs more than rate and Bernoulli loss: delay, jitter,
// distribution, reordering, duplication or corruption given on it or an end (even at 0), or
// burst loss in either direction.
func (l *Link) Impaired() bool {
	return l.A.Egress.Given || l.B.Egress.Given || l.A.LossGE != nil || l.B.LossGE != nil
}

// DefaultMTU is the MTU of a link that does not set one.
const DefaultMTU = 1500

var (
	nameRE     = regexp.MustCompile(`^[a-z][a-z0-9]{0,11}$`)
	nodeNameRE = regexp.MustCompile(`^[a-z][a-z0-9-]{0,14}$`)
)

// ValidName reports whether name can name a topology: it becomes part of kernel object names, so
// it is short and has no dash (the dash separates lab and node in namespace names).
func ValidName(name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("topology name %q must be 1-12 lowercase letters and digits, starting with a letter", name)
	}
	return nil
}

// Error and Errors are the problems Parse reports, each with its line.
type (
	Error  = config.Error
	Errors = config.Errors
)

// Load reads and validates a topology file. The name comes from the file's "name" key, else
// from the file name without its extension.
func Load(path string) (*Topology, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, data)
}

// Parse validates a topology held in memory; file is used in messages and as the default name.
func Parse(file string, data []byte) (*Topology, error) {
	return ParseNamed(file, data, "")
}

// ParseNamed is Parse with the name given by the caller (a --name flag) instead of the file's.
func ParseNamed(file string, data []byte, name string) (*Topology, error) {
	spec, errs := decode(file, data)
	if name != "" {
		if err := ValidName(name); err != nil {
			errs = append(errs, config.Error{File: file, Field: "--name", Msg: err.Error()})
		}
		spec.name, spec.nameLine = name, -1
	}
	if len(errs) > 0 {
		// The links' node names too, so that one run reports every mistake a user can fix.
		if spec.nodes != nil {
			el := &config.Collector{File: file}
			for i := range spec.links {
				checkEnds(el, spec, i)
			}
			// each in its place among the others, by line
			for _, e := range el.Errs {
				i := len(errs)
				for i > 0 && errs[i-1].Line > e.Line {
					i--
				}
				errs = slices.Insert(errs, i, e)
			}
		}
		return nil, errs
	}
	if spec.name == "" {
		base := filepath.Base(file)
		spec.name = base[:len(base)-len(filepath.Ext(base))]
	}
	return build(file, spec)
}

// Node returns the node called name, or nil.
func (t *Topology) Node(name string) *Node {
	for _, n := range t.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// Params is what this end's egress does in internal/impair's terms: its loss, rate and Egress.
func (i *Iface) Params(seed uint64) impair.Params {
	e := i.Egress
	return impair.Params{Loss: i.Loss / 100, GE: i.LossGE, Rate: i.Rate, Seed: seed,
		Delay: e.Delay, Jitter: e.Jitter, Distribution: e.Distribution,
		Reorder: e.Reorder / 100, Duplicate: e.Duplicate / 100, Corrupt: e.Corrupt / 100}
}
