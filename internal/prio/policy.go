package prio

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/flowplane/flowplane/internal/config"
	"github.com/flowplane/flowplane/internal/match"
	"github.com/flowplane/flowplane/internal/units"
)

// Scheme is how the router orders flows (docs/prio.md, "Schemes").
type Scheme string

// The schemes, in the values of enum prio_scheme.
const (
	FIFO      Scheme = "fifo"
	Fair      Scheme = "fair"
	Occupancy Scheme = "occupancy"
	Backlog   Scheme = "backlog"
	PIAS      Scheme = "pias"
)

var schemes = []Scheme{FIFO, Fair, Occupancy, Backlog, PIAS}

func (s Scheme) code() uint32 { return uint32(slices.Index(schemes, s)) }

// HostPolicy says which connections advertise their backlog.
type HostPolicy struct {
	File      string
	Advertise []match.Match
	// Refresh is the longest a sending connection goes without writing the option; between
	// refreshes it writes only a change (0: every data segment).
	Refresh time.Duration
	// MinInterval is the shortest a connection goes between two writes of a change after its
	// first data segment's (0: every change). Only with a Refresh.
	MinInterval time.Duration
}

// DefaultRefresh is the host policy's refresh unless it says otherwise: a router that lost a
// flow's state (LRU eviction, a restart, a new path) learns its backlog again within 10 ms (and
// a coarse-clock tick) of its sending; at a few hundred thousand segments a second that is one
// segment in thousands. Keep it below the routers' move_gap (docs/prio.md, "Configuration").
const DefaultRefresh = 10 * time.Millisecond

// DefaultMinInterval is the host policy's min_interval unless it says otherwise (or its refresh
// is this short or shorter): a bulk flow that the CPU limits advertises the whole of its next
// GSO packet, then the tail, a change at every send, and without it carried the option on
// most of its segments, each off the receiver's header-prediction fast path (docs/prio.md,
// "Rationale"). A router moves a flow at most once per band_change_interval (10 ms by default).
const DefaultMinInterval = time.Millisecond

// duration reads a non-negative duration into to.
func duration(el *config.Collector, v *yaml.Node, f string, to *time.Duration, example string) {
	s, ok := el.Scalar(v, f)
	if !ok {
		return
	}
	d, err := units.ParseDuration(s)
	if errors.Is(err, units.ErrDurationRange) {
		el.Add(v.Line, f, "%q is %v", s, err)
		return
	}
	if err != nil || d < 0 {
		el.Add(v.Line, f, "%q is not a duration; write e.g. %s", s, example)
		return
	}
	*to = d
}

// RouterPolicy is a router's scheme and its parameters.
type RouterPolicy struct {
	File           string
	Scheme         Scheme
	Leaves         int            // K leaves per band (flows take them in turn)
	Trust          []netip.Prefix // senders whose information counts
	MaxClaim       int            // the best band host information can claim
	MinRate        float64        // share of the link each band is guaranteed, 0-1
	ChangeInterval time.Duration  // at most one band change per flow per interval
	Thresholds     []uint64       // backlog / pias band edges, bytes, ascending
	Limit          int            // packets per leaf queue (default: bandQueue / Leaves)
	IdleReset      time.Duration  // pias: a flow idle this long starts over in band 0 (0: never)
	MoveGap        time.Duration  // a flow changes band only after sending nothing this long
	Weighted       bool           // bands share the link by weight instead of strict priority
}

// Defaults of the router policy.
const (
	// defaultLeaves: flows that share a leaf share its FIFO, and among TCP flows in one
	// FIFO some lose out. At 200 flows 64 leaves (~3 flows per leaf) lifted fair's and
	// occupancy's Jain index by several hundredths over 32 (bench/prio). 64 is
	// also the most a band takes (PRIO_MAX_LEAVES).
	defaultLeaves = 64
	// bandQueue is a band's packets over all its leaves unless the policy sets limit: fifo's
	// one queue and fair's leaves then hold as much, so schemes compare at one buffer
	// (2048 packets: 250 ms at 100 Mbit/s, 25 ms at 1 Gbit/s).
	bandQueue = 2048
)

var (
	// occupancyChangeInterval: occupancy changes with every segment, and every move can
	// reorder a flow's packets between queues. One move per flow per 5 s keeps the fairness
	// the moves buy; longer holds trade it away (bench/prio; docs/prio.md, "Rationale").
	occupancyChangeInterval = 5 * time.Second
	// occupancyMoveGap: a flow moves only after falling silent this long, once its packets
	// have left the old queue. Moving mid-burst cost ~8 % of utilization at 200 flows in
	// data received twice; 200 ms (TCP's minimum RTO: the silence of a flow that waits
	// out a timeout, i.e. a starved one) gave it back (bench/prio; docs/prio.md, "Rationale").
	occupancyMoveGap = 200 * time.Millisecond

	// A bulk flow's advertised backlog saturates at its send buffer (hundreds of KB to
	// tcp_wmem's 4 MB as autotuning grows it), so an edge near that size would split bulk
	// flows by buffer, not by what is left to send, and strict priority between those bands
	// starves the flows above the edge (bench/prio; docs/prio.md, "Rationale"). The edges stay well below.
	defaultBacklogThresholds = []uint64{10e3, 100e3}
	// PIAS's thresholds for the web-search workload at 60-80 % load are around 1 and 5
	// packets' worth for two queues; these three edges (short, medium, long) follow the
	// size classes of the flow-completion benchmark (bench/prio).
	defaultPIASThresholds = []uint64{100e3, 1e6, 10e6}
)

// Bands is how many bands the policy's scheme uses.
func (p *RouterPolicy) Bands() int {
	switch p.Scheme {
	case Occupancy:
		return int(classifierPrioLimitPRIO_OCC_BANDS) + 1 // one per tenth, and the default band
	case Backlog:
		return len(p.Thresholds) + 2 // one per edge, one past the last, the default band
	case PIAS:
		return len(p.Thresholds) + 1
	}
	return 1
}

// DefaultBand is where packets without information go.
func (p *RouterPolicy) DefaultBand() int {
	switch p.Scheme {
	case Occupancy, Backlog:
		return p.Bands() - 1
	}
	return 0 // fifo and fair have one band; pias starts every flow at the top
}

// LoadHostPolicy reads and checks a host policy file.
func LoadHostPolicy(file string) (*HostPolicy, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("read policy: %w", err)
	}
	return ParseHostPolicy(file, data)
}

// hostKeys are the keys of a host policy; a selector's are match.Keys. The decoder refuses
// any other key, and docs_test.go checks that docs/prio.md documents each.
var hostKeys = []string{"advertise", "refresh", "min_interval"}

// ParseHostPolicy checks a host policy: every problem at once, with its line.
func ParseHostPolicy(file string, data []byte) (*HostPolicy, error) {
	el := &config.Collector{File: file}
	p := &HostPolicy{File: file, Refresh: DefaultRefresh}
	minLine := 0 // where min_interval is set, if it is
	root := el.Root(data, "a host policy needs `advertise:`, a list of selectors (docs/prio.md)")
	if root != nil {
		el.EachKey(root, "", hostKeys, func(key string, v *yaml.Node) {
			switch key {
			case "refresh":
				duration(el, v, key, &p.Refresh, "10ms (0: on every data segment)")
				return
			case "min_interval":
				minLine = v.Line
				duration(el, v, key, &p.MinInterval, "1ms (0: every change)")
				return
			}
			if v.Kind != yaml.SequenceNode {
				el.Add(v.Line, "advertise", "must be a list of selectors, e.g. [{remote: 198.18.1.0/24, remote_port: 5201}]")
				return
			}
			for i, sv := range v.Content {
				f := fmt.Sprintf("advertise[%d]", i)
				m := match.Any()
				el.EachKey(sv, f, match.Keys, func(key string, kv *yaml.Node) {
					m.DecodeKey(el, key, kv, config.Join(f, key))
				})
				m.CheckFamilies(el, sv.Line, f)
				p.Advertise = append(p.Advertise, m)
			}
		})
		if !config.HasKey(root, "advertise") && root.Kind == yaml.MappingNode {
			el.Add(root.Line, "advertise", "missing; list the selectors whose connections advertise")
		}
	}
	switch {
	case minLine == 0 && p.Refresh > DefaultMinInterval:
		p.MinInterval = DefaultMinInterval
	case minLine != 0 && p.MinInterval > 0 && p.Refresh == 0:
		el.Add(minLine, "min_interval", "%v with refresh 0, which writes the option on every data segment; remove one of them", p.MinInterval)
	case minLine != 0 && p.MinInterval > 0 && p.MinInterval >= p.Refresh:
		el.Add(minLine, "min_interval", "%v is not below refresh (%v): a change would wait for the refresh; give less", p.MinInterval, p.Refresh)
	}
	if err := el.Err(); err != nil {
		return nil, err
	}
	if _, err := selectors(p); err != nil {
		return nil, config.Errors{{File: file, Field: "advertise", Msg: err.Error()}}
	}
	return p, nil
}

// routerKeys are the keys of a router policy: the decoder refuses any other, and docs_test.go
// checks that docs/prio.md documents each.
var routerKeys = []string{"scheme", "leaves", "trust", "max_claim", "min_rate", "band_change_interval", "thresholds", "limit", "idle_reset", "move_gap", "service"}

// LoadRouterPolicy reads and checks a router policy file.
func LoadRouterPolicy(file string) (*RouterPolicy, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("read policy: %w", err)
	}
	return ParseRouterPolicy(file, data)
}

// ParseRouterPolicy checks a router policy: every problem at once, with its line.
func ParseRouterPolicy(file string, data []byte) (*RouterPolicy, error) {
	el := &config.Collector{File: file}
	p := &RouterPolicy{File: file, Leaves: defaultLeaves, MinRate: 0.01, ChangeInterval: 10 * time.Millisecond, IdleReset: 100 * time.Millisecond}
	root := el.Root(data, "a router policy needs at least `scheme:` (docs/prio.md)")
	if root == nil {
		return nil, el.Err()
	}
	positive := func(v *yaml.Node, f string, lo, hi int) int {
		s, ok := el.Scalar(v, f)
		if !ok {
			return 0
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < lo || n > hi {
			el.Add(v.Line, f, "%q is out of range; give a whole number from %d to %d", s, lo, hi)
			return 0
		}
		return n
	}
	el.EachKey(root, "", routerKeys, func(key string, v *yaml.Node) {
		switch key {
		case "scheme":
			if s, ok := el.Scalar(v, key); ok {
				if !slices.Contains(schemes, Scheme(s)) {
					el.Add(v.Line, key, "%q is not a scheme; use fifo, fair, occupancy, backlog or pias", s)
				}
				p.Scheme = Scheme(s)
			}
		case "leaves":
			p.Leaves = positive(v, key, 1, PrioMaxLeaves)
		case "max_claim":
			// The bands are known once every key is read: the check against them comes below.
			if s, ok := el.Scalar(v, key); ok {
				n, err := strconv.Atoi(s)
				if err != nil || n < 0 {
					el.Add(v.Line, key, "%q is not a band; give a whole number from 0 (the best band) to the number of bands − 1", s)
				}
				p.MaxClaim = max(n, 0)
			}
		case "limit":
			p.Limit = positive(v, key, 1, 100000)
		case "trust":
			p.Trust = match.Prefixes(el, v, key)
		case "min_rate":
			if s, ok := el.Scalar(v, key); ok {
				pct, err := units.ParsePercent(s)
				if err != nil || pct <= 0 {
					el.Add(v.Line, key, "%q is not a share of the link above 0%%, e.g. 1%%", s)
					return
				}
				p.MinRate = pct / 100
			}
		case "service":
			if s, ok := el.Scalar(v, key); ok {
				switch s {
				case "strict":
				case "weighted":
					p.Weighted = true
				default:
					el.Add(v.Line, key, "%q is not a band service; use strict or weighted", s)
				}
			}
		case "band_change_interval":
			duration(el, v, key, &p.ChangeInterval, "10ms (0 lets flows move at every packet)")
		case "idle_reset":
			duration(el, v, key, &p.IdleReset, "100ms (0: a flow is never promoted again)")
		case "move_gap":
			duration(el, v, key, &p.MoveGap, "200ms (0: mid-burst too)")
		case "thresholds":
			if v.Kind != yaml.SequenceNode || len(v.Content) == 0 || len(v.Content) > PrioMaxThresh {
				el.Add(v.Line, key, "must be a list of 1 to %d sizes, ascending, e.g. [100KB, 1MB]", PrioMaxThresh)
				return
			}
			for i, tv := range v.Content {
				f := fmt.Sprintf("%s[%d]", key, i)
				if s, ok := el.Scalar(tv, f); ok {
					n, err := units.ParseSize(s)
					if err != nil || n == 0 {
						el.Add(tv.Line, f, "%q is not a size above 0, e.g. 100KB", s)
						continue
					}
					if len(p.Thresholds) > 0 && n <= p.Thresholds[len(p.Thresholds)-1] {
						el.Add(tv.Line, f, "%s is not above the edge before it; thresholds ascend", s)
					}
					p.Thresholds = append(p.Thresholds, n)
				}
			}
		}
	})
	if root.Kind == yaml.MappingNode && !config.HasKey(root, "scheme") {
		el.Add(root.Line, "scheme", "missing; choose fifo, fair, occupancy, backlog or pias")
	}
	if err := el.Err(); err != nil {
		return nil, err
	}
	if p.Scheme == FIFO {
		p.Leaves = 1
	}
	if !config.HasKey(root, "limit") {
		p.Limit = max(bandQueue/p.Leaves, 1)
	}
	switch p.Scheme {
	case Occupancy:
		// Strict priority between deciles gives the link to whichever flow reads fullest,
		// and a flow that moves at every segment reorders its packets between queues; both
		// cost the original scheme its fairness and throughput (docs/prio.md, "Rationale").
		if !config.HasKey(root, "service") {
			p.Weighted = true
		}
		if !config.HasKey(root, "band_change_interval") {
			p.ChangeInterval = occupancyChangeInterval
		}
		if !config.HasKey(root, "move_gap") {
			p.MoveGap = occupancyMoveGap
		}
	case Backlog:
		if p.Thresholds == nil {
			p.Thresholds = defaultBacklogThresholds
		}
	case PIAS:
		if p.Thresholds == nil {
			p.Thresholds = defaultPIASThresholds
		}
	}
	// backlog and pias: each band guaranteed an equal share. An idle leaf of the top band
	// then holds a full bucket of tokens, so a new short flow's first packets go out at once,
	// ahead of everything that borrows (HTB serves classes within their rate first); strict
	// priority orders only what bands borrow beyond it. With 1 % each, short flows waited
	// behind the borrowers (docs/prio.md, "Rationale").
	if (p.Scheme == Backlog || p.Scheme == PIAS) && !config.HasKey(root, "min_rate") {
		p.MinRate = 1 / float64(p.Bands())
	}
	var problems []string
	if (p.Scheme == Occupancy || p.Scheme == Backlog) && len(p.Trust) == 0 {
		problems = append(problems, "trust: missing; the "+string(p.Scheme)+" scheme uses what senders advertise, so name the prefixes whose advertisements count (e.g. trust: [198.18.0.0/16])")
	}
	if p.MaxClaim >= p.Bands() {
		problems = append(problems, fmt.Sprintf("max_claim: %d is past the last band (%d bands)", p.MaxClaim, p.Bands()))
	}
	if p.Scheme != FIFO && p.Scheme != Fair && !p.Weighted && p.MinRate*float64(p.Bands()) > 1+1e-9 {
		problems = append(problems, fmt.Sprintf("min_rate: %d bands × %g%% is more than the link", p.Bands(), p.MinRate*100))
	}
	if len(problems) > 0 {
		es := config.Errors{}
		for _, m := range problems {
			field, msg, _ := strings.Cut(m, ": ")
			// the key's line; a key the file lacks (trust, a default min_rate): the top level's
			es = append(es, config.Error{File: file, Line: config.KeyLine(root, field), Field: field, Msg: msg})
		}
		return nil, es
	}
	return p, nil
}
