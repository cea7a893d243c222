package prio

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/flowplane/flowplane/internal/attach"
	"github.com/flowplane/flowplane/internal/pin"
	"github.com/flowplane/flowplane/internal/runstate"
	"github.com/flowplane/flowplane/internal/stats"
)

// ClassStatus is one HTB class as `tc -s class` shows it.
type ClassStatus struct {
	Class   string `json:"class"` // fa:201
	Band    int    `json:"band"`
	Leaf    int    `json:"leaf"`
	Packets uint32 `json:"packets"`
	Bytes   uint64 `json:"bytes"`
	Drops   uint32 `json:"drops"`
	Backlog uint32 `json:"backlog_packets"`
}

// FlowStatus is one flow the classifier keeps, as `ss` would list it.
type FlowStatus struct {
	Src            string `json:"src"`
	Dst            string `json:"dst"`
	Proto          uint8  `json:"proto"`
	Class          string `json:"class"`
	Band           int    `json:"band"`
	Backlog        uint32 `json:"advertised_backlog"`
	Occupancy      int    `json:"advertised_occupancy"` // -1: none
	Bytes          uint64 `json:"bytes"`
	BandChanges    uint32 `json:"band_changes"`
	InfoFromOption string `json:"information"` // "tcp-option", "sctp-chunk" or "none"
}

// RouterStatus is a router's classes, flows and classifier counters.
type RouterStatus struct {
	RouterRecord
	Classes  []ClassStatus     `json:"classes"`
	Flows    []FlowStatus      `json:"flows"`
	Counters map[string]uint64 `json:"counters"`
}

// HostStatus is a host attachment and its counters.
type HostStatus struct {
	HostRecord
	Counters map[string]uint64 `json:"counters"`
}

// Status is everything `prio status` reports for the calling namespace.
type Status struct {
	Routers []RouterStatus `json:"routers"`
	Hosts   []HostStatus   `json:"hosts"`
	// Leftovers are routers and host attachments a crash left half made or half removed:
	// the next apply or remove of each cleans it.
	Leftovers []attach.Problem `json:"leftovers,omitempty"`
}

// routerStatNames name the classifier's counters (enum prio_stat); routerCounterNames are
// what status reports, packets and cached added up from them (routerCounters).
var (
	routerStatNames    = sync.OnceValue(func() []string { return enumNames(loadClassifier, "prio_stat", "PRIO_STAT_") })
	routerCounterNames = []string{"packets", "parsed", "sctp", "no_option", "malformed", "untrusted", "capped", "other", "band_change", "change_held", "no_state", "idle_reset", "move_wait", "cached"}
)

// enumNames names a program's counters from its object's enum (stats.EnumNames): C alone
// defines them. The objects are embedded, so an error is a build's, caught by the tests.
func enumNames(load func() (*ebpf.CollectionSpec, error), enum, prefix string) []string {
	spec, err := load()
	if err == nil {
		var names []string
		if names, err = stats.EnumNames(spec, enum, prefix); err == nil {
			return names
		}
	}
	panic(fmt.Sprintf("prio: the names of enum %s: %v", enum, err))
}

// routerCounters turns the classifier's counters into status's: every packet is under exactly
// one of fifo, parsed, sctp, no_option, malformed and other, and a flow's packet that did not
// take the table came from the cache. The programs count no total, to save a counter update per
// packet (a sixth of the classifier's time went to three).
func routerCounters(raw map[string]uint64) map[string]uint64 {
	out := map[string]uint64{}
	for k, v := range raw {
		if k != "fifo" && k != "table" {
			out[k] = v
		}
	}
	flows := raw["parsed"] + raw["sctp"] + raw["no_option"]
	out["packets"] = raw["fifo"] + flows + raw["malformed"] + raw["other"]
	out["cached"] = flows - min(raw["table"], flows) // per-CPU sums read apart: never below 0
	return out
}

// hostCounterNames name the host program's counters (enum prio_host_stat).
var hostCounterNames = sync.OnceValue(func() []string { return enumNames(loadHost, "prio_host_stat", "PRIO_HOST_") })

// ReadStatus reads every router of this network namespace and every host attachment.
func ReadStatus() (*Status, error) {
	ns, err := attach.ThisNetns()
	if err != nil {
		return nil, err
	}
	st := &Status{Routers: []RouterStatus{}, Hosts: []HostStatus{}}
	err = runstate.Each(subsystem, func(n string) error {
		in, ok := instanceOf(ns, n)
		if !ok {
			return nil
		}
		err := readOne(st, ns, n)
		if err != nil {
			if p, lerr := in.Leftover(); lerr == nil && p != nil {
				return nil // listed with the leftovers below
			}
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	if st.Leftovers, err = attach.Leftovers(subsystem, func(n string) (attach.Instance, bool) { return instanceOf(ns, n) }); err != nil {
		return nil, err
	}
	return st, nil
}

// instanceOf is the router of namespace ns or the host attachment a record name stands for.
func instanceOf(ns, record string) (attach.Instance, bool) {
	if dev, ok := strings.CutPrefix(record, ns+"-"); ok {
		return routerInstance(ns, dev), true
	}
	if name, ok := strings.CutPrefix(record, "host-"); ok {
		return hostInstance(name), true
	}
	return attach.Instance{}, false
}

// readOne adds the router or host attachment of record n to st.
func readOne(st *Status, ns, n string) error {
	if strings.HasPrefix(n, "host-") {
		var rec HostRecord
		if err := runstate.Load(subsystem, n, &rec); err != nil {
			return err
		}
		counters, err := readCounters(filepath.Join(pin.Path(hostPin(rec.Name)...), "stats"), hostCounterNames())
		if err != nil {
			return err
		}
		st.Hosts = append(st.Hosts, HostStatus{HostRecord: rec, Counters: counters})
		return nil
	}
	var rec RouterRecord
	if err := runstate.Load(subsystem, n, &rec); err != nil {
		return err
	}
	rs, err := routerStatus(ns, rec)
	if err != nil {
		return err
	}
	st.Routers = append(st.Routers, *rs)
	return nil
}

func readCounters(path string, names []string) (map[string]uint64, error) {
	m, err := ebpf.LoadPinnedMap(path, nil)
	if err != nil {
		return nil, fmt.Errorf("open counters: %w", err)
	}
	defer m.Close()
	all, err := stats.All(m)
	if err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	for i, n := range names {
		if i < len(all) { // a map pinned by an older flowplane has fewer counters
			out[n] = all[i]
		}
	}
	return out, nil
}

func minorString(id uint32) string { return fmt.Sprintf("%x:%x", id>>16, id&0xffff) }

func routerStatus(ns string, rec RouterRecord) (*RouterStatus, error) {
	rs := &RouterStatus{RouterRecord: rec, Classes: []ClassStatus{}, Flows: []FlowStatus{}}
	dir := pin.Path(routerPin(ns, rec.Dev)...)
	raw, err := readCounters(filepath.Join(dir, "stats"), routerStatNames())
	if err != nil {
		return nil, err
	}
	rs.Counters = routerCounters(raw)
	l, err := netlink.LinkByName(rec.Dev)
	if err != nil {
		return nil, fmt.Errorf("interface %q: no such network interface", rec.Dev)
	}
	classes, err := netlink.ClassList(l, netlink.MakeHandle(Major, 0))
	if err != nil {
		return nil, fmt.Errorf("list classes of %s: %w", rec.Dev, err)
	}
	for _, c := range classes {
		a := c.Attrs()
		if a.Handle>>16 != Major || a.Handle&0xffff < 0x100 {
			continue // the root class
		}
		cs := ClassStatus{Class: minorString(a.Handle), Band: int(a.Handle>>8&0xff) - 1, Leaf: int(a.Handle & 0xff)}
		if s := a.Statistics; s != nil && s.Basic != nil {
			cs.Packets, cs.Bytes = s.Basic.Packets, s.Basic.Bytes
			if s.Queue != nil {
				cs.Drops, cs.Backlog = s.Queue.Drops, s.Queue.Qlen
			}
		}
		rs.Classes = append(rs.Classes, cs)
	}
	sort.Slice(rs.Classes, func(i, j int) bool { return rs.Classes[i].Class < rs.Classes[j].Class })
	flows, err := ebpf.LoadPinnedMap(filepath.Join(dir, "flows"), nil)
	if err != nil {
		return nil, fmt.Errorf("open flow table: %w", err)
	}
	defer flows.Close()
	table, err := flowTable(flows)
	if err != nil {
		return nil, err
	}
	// A router attached by a flowplane without the flow cache pinned none.
	cache, err := ebpf.LoadPinnedMap(filepath.Join(dir, "cache"), nil)
	switch {
	case err == nil:
		err = mergeCache(cache, table)
		cache.Close()
		if err != nil {
			return nil, err
		}
	case !errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("open flow cache: %w", err)
	}
	for k, v := range table {
		fs := FlowStatus{Src: endpoint(k.Saddr, k.Sport), Dst: endpoint(k.Daddr, k.Dport), Proto: k.Proto,
			Class: minorString(v.Classid), Band: int(v.Band), Backlog: v.Backlog, Occupancy: int(v.Occupancy),
			Bytes: v.Bytes, BandChanges: v.Changes, InfoFromOption: []string{"none", "tcp-option", "sctp-chunk"}[min(int(v.Source), 2)]}
		if v.Occupancy == OccUnknown {
			fs.Occupancy = -1
		}
		rs.Flows = append(rs.Flows, fs)
	}
	sort.Slice(rs.Flows, func(i, j int) bool { return rs.Flows[i].Bytes > rs.Flows[j].Bytes })
	return rs, nil
}

func endpoint(a [16]uint8, port uint16) string {
	p := uint16(port>>8 | port<<8) // network order in the key
	return netip.AddrPortFrom(netip.AddrFrom16(a).Unmap(), p).String()
}

// flowTable reads the classifier's flow table.
func flowTable(m *ebpf.Map) (map[classifierPrioFlowKey]classifierPrioFlow, error) {
	table := map[classifierPrioFlowKey]classifierPrioFlow{}
	var k classifierPrioFlowKey
	var v classifierPrioFlow
	it := m.Iterate()
	for it.Next(&k, &v) {
		table[k] = v
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read flow table: %w", err)
	}
	return table, nil
}

// mergeCache adds to the table the bytes each CPU's flow cache has not synced yet, so the
// table counts every packet the classifier took.
func mergeCache(cache *ebpf.Map, table map[classifierPrioFlowKey]classifierPrioFlow) error {
	var slot uint32
	var perCPU []classifierPrioFlowCached
	it := cache.Iterate()
	for it.Next(&slot, &perCPU) {
		for _, c := range perCPU {
			f, ok := table[c.Key]
			if c.Packets == 0 || !ok {
				continue
			}
			f.Bytes += uint64(c.Unsynced)
			table[c.Key] = f
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read flow cache: %w", err)
	}
	return nil
}
