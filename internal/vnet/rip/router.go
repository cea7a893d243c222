package rip

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/flowplane/flowplane/internal/vnet/clock"
)

// Config sets the protocol timers.
type Config struct {
	Period     time.Duration // full update interval
	Expire     time.Duration // a route not refreshed for this long becomes unreachable
	GC         time.Duration // an unreachable route is advertised at infinity this long, then deleted
	TriggerMin time.Duration // minimum spacing of triggered updates
	Advertise  bool          // routers advertise; hosts only ask and listen
}

// DefaultConfig is the timer set of the issue: 5 s updates, 12 s expiry.
func DefaultConfig() Config {
	return Config{Period: 5 * time.Second, Expire: 12 * time.Second, GC: 8 * time.Second,
		TriggerMin: 50 * time.Millisecond, Advertise: true}
}

// Iface is an interface RIP runs on.
type Iface struct {
	Prefix netip.Prefix // the interface address and the link's prefix length
	Peer   netip.Addr   // the neighbour on the link
	Up     bool
	// Passive interfaces have their subnet advertised elsewhere but no RIP sent on them: the
	// neighbour does not speak RIP (a Linux host behind a TAP device).
	Passive bool
}

// Route is a routing table entry.
type Route struct {
	Prefix    netip.Prefix
	NextHop   netip.Addr // invalid for connected routes
	Iface     int
	Metric    int
	Connected bool
}

type route struct {
	Route
	expires time.Duration
	gcAt    time.Duration
	changed bool
}

// Stats counts protocol events.
type Stats struct {
	Requests, Responses, Sent, Triggered, Malformed, Ignored uint64
	TableFull                                                uint64 // new routes refused at MaxRoutes
}

// Router is one node's RIP instance. It is safe for concurrent use; the send and install
// callbacks are called with its lock held and must not call back into it.
type Router struct {
	mu      sync.Mutex
	clk     clock.Clock
	cfg     Config
	ifaces  []Iface
	send    func(iface int, dst netip.Addr, msg []byte)
	install func([]Route)
	routes  map[netip.Prefix]*route
	timer   clock.Timer
	running bool

	nextPeriodic   time.Duration
	lastTriggered  time.Duration
	triggerPending bool
	// lostRoute asks neighbours for their tables: an alternative path to a route we just lost
	// would otherwise only be heard at the next periodic update, seconds later.
	lostRoute bool
	stats     Stats
	rng       *rand.Rand
}

// New creates a router; call Start to begin.
func New(clk clock.Clock, cfg Config, ifaces []Iface, send func(int, netip.Addr, []byte), install func([]Route)) *Router {
	r := &Router{clk: clk, cfg: cfg, ifaces: slices.Clone(ifaces), send: send, install: install,
		routes: map[netip.Prefix]*route{}, rng: rand.New(rand.NewPCG(rand.Uint64(), 1)), lastTriggered: -time.Hour}
	for i, ifc := range r.ifaces {
		if ifc.Up {
			r.connect(i)
		}
	}
	return r
}

func (r *Router) connect(i int) {
	p := r.ifaces[i].Prefix.Masked()
	r.routes[p] = &route{Route: Route{Prefix: p, Iface: i, Connected: true}, changed: true}
}

// Start sends a request on every interface and starts periodic updates.
func (r *Router) Start() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.running = true
	now := r.clk.Now()
	for i, ifc := range r.ifaces {
		if ifc.Up {
			r.sendMsg(i, &Message{Command: CmdRequest})
		}
	}
	r.nextPeriodic = now
	r.installLocked()
	r.schedule(now)
}

// Stop halts timers.
func (r *Router) Stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.running = false
	if r.timer != nil {
		r.timer.Stop()
	}
}

func (r *Router) sendMsg(i int, m *Message) {
	if r.ifaces[i].Passive {
		return
	}
	r.stats.Sent++
	r.send(i, r.ifaces[i].Peer, Append(nil, m))
}

// Input handles a RIP message that arrived on interface i from src.
func (r *Router) Input(i int, src netip.Addr, b []byte) {
	m, err := Parse(b)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.stats.Malformed++
		return
	}
	if i < 0 || i >= len(r.ifaces) || !r.ifaces[i].Up || !r.running || src != r.ifaces[i].Peer {
		r.stats.Ignored++ // only the neighbour on the link may speak RIP to us there
		return
	}
	now := r.clk.Now()
	switch m.Command {
	case CmdRequest:
		r.stats.Requests++
		if r.cfg.Advertise {
			r.update(i, false)
		}
	case CmdResponse:
		r.stats.Responses++
		changed := false
		for _, e := range m.Entries {
			if r.learn(i, src, e, now) {
				changed = true
			}
		}
		if changed {
			r.installLocked()
			r.trigger(now)
		}
		r.schedule(now)
	}
}

// learn applies one advertised entry (RFC 2453 3.9.2); it reports a change.
func (r *Router) learn(i int, src netip.Addr, e Entry, now time.Duration) bool {
	metric := min(int(e.Cost)+1, Infinity)
	cur := r.routes[e.Prefix]
	switch {
	case cur != nil && cur.Connected && cur.Metric < Infinity:
		return false // our own link beats anything a neighbour says, while it is up
	case cur == nil:
		if metric >= Infinity {
			return false
		}
		if len(r.routes) >= MaxRoutes {
			r.stats.TableFull++
			return false
		}
		r.routes[e.Prefix] = &route{Route: Route{Prefix: e.Prefix, NextHop: src, Iface: i, Metric: metric},
			expires: now + r.cfg.Expire, changed: true}
		return true
	case cur.NextHop == src && cur.Iface == i:
		if metric < Infinity {
			cur.expires = now + r.cfg.Expire
		}
		if metric == cur.Metric {
			return false
		}
		wasReachable := cur.Metric < Infinity
		cur.Metric, cur.changed = metric, true
		if metric >= Infinity && wasReachable {
			cur.gcAt = now + r.cfg.GC
			r.lostRoute = true
		}
		return true
	case metric < cur.Metric:
		// This also replaces the poisoned route of a downed interface: its subnet may still be
		// reachable through another neighbour. connect restores it when the interface comes up.
		cur.NextHop, cur.Iface, cur.Metric, cur.Connected, cur.changed = src, i, metric, false, true
		cur.expires = now + r.cfg.Expire
		return true
	}
	return false
}

// SetIfaceUp brings an interface up or down; routes through it are poisoned at once.
func (r *Router) SetIfaceUp(i int, up bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if i < 0 || i >= len(r.ifaces) || r.ifaces[i].Up == up {
		return
	}
	r.ifaces[i].Up = up
	now := r.clk.Now()
	if up {
		r.connect(i)
		if r.running {
			r.sendMsg(i, &Message{Command: CmdRequest})
		}
	} else {
		for _, rt := range r.routes {
			if rt.Iface == i && rt.Metric < Infinity {
				rt.Metric, rt.changed, rt.gcAt = Infinity, true, now+r.cfg.GC
				r.lostRoute = true
			}
		}
	}
	r.installLocked()
	r.trigger(now)
	r.schedule(now)
}

func (r *Router) trigger(now time.Duration) {
	if !r.running {
		return
	}
	if r.lostRoute {
		r.lostRoute = false
		for i, ifc := range r.ifaces {
			if ifc.Up {
				r.sendMsg(i, &Message{Command: CmdRequest})
			}
		}
	}
	if !r.cfg.Advertise {
		return
	}
	if now-r.lastTriggered >= r.cfg.TriggerMin {
		r.sendTriggered(now)
		return
	}
	r.triggerPending = true
}

func (r *Router) sendTriggered(now time.Duration) {
	r.triggerPending = false
	r.lastTriggered = now
	r.stats.Triggered++
	r.updateAll(true)
}

// updateAll sends an update (triggered: only the changed routes) on every interface that is up;
// afterwards no route is changed any more.
func (r *Router) updateAll(triggered bool) {
	for i, ifc := range r.ifaces {
		if ifc.Up {
			r.update(i, triggered)
		}
	}
	for _, rt := range r.routes {
		rt.changed = false
	}
}

// update sends the table (or only changed routes) on interface i, applying split horizon with
// poisoned reverse: routes learned through i go back out with cost infinity.
func (r *Router) update(i int, onlyChanged bool) {
	prefixes := make([]netip.Prefix, 0, len(r.routes))
	for p, rt := range r.routes {
		if !onlyChanged || rt.changed {
			prefixes = append(prefixes, p)
		}
	}
	slices.SortFunc(prefixes, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	m := Message{Command: CmdResponse}
	for _, p := range prefixes {
		rt := r.routes[p]
		cost := uint32(rt.Metric)
		if rt.Iface == i && !rt.Connected {
			cost = Infinity
		}
		m.Entries = append(m.Entries, Entry{Prefix: p, Cost: cost})
		if len(m.Entries) == MaxEntries {
			r.sendMsg(i, &m)
			m.Entries = m.Entries[:0]
		}
	}
	if len(m.Entries) > 0 {
		r.sendMsg(i, &m)
	}
}

// tick runs expiry, garbage collection, periodic and pending triggered updates.
func (r *Router) tick() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.running {
		return
	}
	now := r.clk.Now()
	changed := false
	for p, rt := range r.routes {
		switch {
		case rt.Connected && rt.Metric < Infinity:
		case rt.Metric < Infinity && now >= rt.expires:
			rt.Metric, rt.changed, rt.gcAt = Infinity, true, now+r.cfg.GC
			changed = true
			r.lostRoute = true
		case rt.Metric >= Infinity && now >= rt.gcAt:
			delete(r.routes, p)
		}
	}
	if changed {
		r.installLocked()
		r.trigger(now)
	}
	if r.triggerPending && now-r.lastTriggered >= r.cfg.TriggerMin {
		r.sendTriggered(now)
	}
	if now >= r.nextPeriodic {
		if r.cfg.Advertise {
			r.updateAll(false)
			r.triggerPending = false
		}
		// A little jitter keeps routers from synchronising (RFC 2453 3.8).
		r.nextPeriodic = now + r.cfg.Period - time.Duration(r.rng.Int64N(int64(r.cfg.Period/10)+1))
	}
	r.schedule(now)
}

func (r *Router) schedule(now time.Duration) {
	if !r.running {
		return
	}
	next := r.nextPeriodic
	if r.triggerPending {
		next = min(next, r.lastTriggered+r.cfg.TriggerMin)
	}
	for _, rt := range r.routes {
		switch {
		case rt.Connected && rt.Metric < Infinity:
		case rt.Metric < Infinity:
			next = min(next, rt.expires)
		default:
			next = min(next, rt.gcAt)
		}
	}
	d := max(next-now, 0)
	if r.timer == nil {
		r.timer = r.clk.AfterFunc(d, r.tick)
	} else {
		r.timer.Reset(d)
	}
}

func (r *Router) installLocked() {
	if r.install != nil {
		r.install(r.routesLocked(false))
	}
}

func (r *Router) routesLocked(all bool) []Route {
	out := make([]Route, 0, len(r.routes))
	for _, rt := range r.routes {
		if all || rt.Metric < Infinity {
			out = append(out, rt.Route)
		}
	}
	slices.SortFunc(out, func(a, b Route) int {
		if c := a.Prefix.Addr().Compare(b.Prefix.Addr()); c != 0 {
			return c
		}
		return a.Prefix.Bits() - b.Prefix.Bits()
	})
	return out
}

// Routes returns the table, unreachable routes (being garbage collected) included.
func (r *Router) Routes() []Route {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.routesLocked(true)
}

// Stats returns the counters.
func (r *Router) Stats() Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stats
}
