package conntrack

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/cilium/ebpf"

	"github.com/flowplane/flowplane/internal/ipnet"
	"github.com/flowplane/flowplane/internal/stats"
)

// Tables are the maps user space reads and changes: the program's, or pinned ones.
type Tables struct {
	Main, Emb, Stats, Settings, Events *ebpf.Map

	sweep    *ebpf.Program // ct_sweep: the program's own, or loaded for pinned tables
	ownSweep bool          // sweep was loaded here: Close closes it
}

// ErrNoInstance: this network namespace has no pinned conntrack tables. The commands that
// need them exit with code 2, as for any other usage error.
var ErrNoInstance = errors.New("no conntrack instance in this network namespace")

// OpenPinned opens the tables of the calling thread's namespace's instance.
func OpenPinned() (*Tables, error) {
	dir, err := PinDir()
	if err != nil {
		return nil, err
	}
	t := &Tables{}
	for _, m := range []struct {
		name string
		dst  **ebpf.Map
	}{{"ct_main", &t.Main}, {"ct_emb", &t.Emb}, {"ct_stats", &t.Stats}, {"ct_settings", &t.Settings}, {"ct_events", &t.Events}} {
		mp, err := ebpf.LoadPinnedMap(filepath.Join(dir, m.name), nil)
		if err != nil {
			t.Close()
			if errors.Is(err, os.ErrNotExist) {
				return nil, fmt.Errorf("%w (%s): start `flowplane conntrack run` here", ErrNoInstance, dir)
			}
			return nil, fmt.Errorf("open %s: %w", m.name, err)
		}
		*m.dst = mp
	}
	return t, nil
}

// Close closes the maps (pins stay).
func (t *Tables) Close() {
	for _, m := range []*ebpf.Map{t.Main, t.Emb, t.Stats, t.Settings, t.Events} {
		if m != nil {
			m.Close()
		}
	}
	if t.ownSweep && t.sweep != nil {
		t.sweep.Close()
		t.sweep = nil
	}
}

// sweeper returns ct_sweep for these tables: the loaded program's, or for pinned tables a
// copy loaded onto them (the same object file, the same clock settings).
func (t *Tables) sweeper() (*ebpf.Program, error) {
	if t.sweep != nil {
		return t.sweep, nil
	}
	spec, err := loadCt()
	if err != nil {
		return nil, fmt.Errorf("load conntrack spec: %w", err)
	}
	if err := setClock(spec); err != nil {
		return nil, err
	}
	opts := &ebpf.CollectionOptions{MapReplacements: map[string]*ebpf.Map{}}
	for n, m := range map[string]*ebpf.Map{"ct_main": t.Main, "ct_emb": t.Emb, "ct_stats": t.Stats, "ct_events": t.Events} {
		info, err := m.Info()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", n, err)
		}
		spec.Maps[n].MaxEntries = info.MaxEntries
		opts.MapReplacements[n] = m
	}
	var objs struct {
		Sweep *ebpf.Program `ebpf:"ct_sweep"`
	}
	if err := spec.LoadAndAssign(&objs, opts); err != nil {
		return nil, fmt.Errorf("load ct_sweep onto the pinned tables: %w", err)
	}
	t.sweep, t.ownSweep = objs.Sweep, true
	return t.sweep, nil
}

// Tuple is one direction of a connection.
type Tuple struct {
	Src   netip.Addr `json:"src"`
	Dst   netip.Addr `json:"dst"`
	Sport uint16     `json:"sport,omitempty"`
	Dport uint16     `json:"dport,omitempty"`
	ID    uint16     `json:"id,omitempty"` // ICMP echo identifier
}

// Entry is one tracked connection as `list` shows it.
type Entry struct {
	Proto     string    `json:"proto"`
	State     string    `json:"state"`
	Orig      Tuple     `json:"orig"`
	Reply     Tuple     `json:"reply"`
	Timeout   float64   `json:"timeout_seconds"`
	Packets   [2]uint64 `json:"packets"` // original, reply
	Bytes     [2]uint64 `json:"bytes"`
	Confirmed bool      `json:"confirmed"`
	SeenReply bool      `json:"seen_reply"`
	Assured   bool      `json:"assured"`

	key ctCtKey
	raw ctCtEntry
}

var tcpStateNames = []string{"NONE", "SYN_SENT", "SYN_RECV", "ESTABLISHED", "FIN_WAIT", "CLOSE_WAIT", "LAST_ACK", "TIME_WAIT", "CLOSE", "SYN_SENT2"}

// protoNumber is the number of a protocol name toEntry gave (0 for none).
func protoNumber(name string) uint8 {
	p, _ := ipnet.ProtoNumber(name)
	return p
}

func toEntry(k ctCtKey, v ctCtEntry, confirmed bool, now uint64) Entry {
	e := Entry{Proto: ipnet.ProtoName(k.Proto), Confirmed: confirmed, key: k, raw: v,
		Packets: v.Packets, Bytes: v.Bytes,
		SeenReply: v.Status&ctFSeenReply != 0, Assured: v.Status&ctFAssured != 0}
	lo := Tuple{Src: addrOf(k.LoAddr, k.Family), Dst: addrOf(k.HiAddr, k.Family), Sport: htons(k.LoPort), Dport: htons(k.HiPort)}
	hi := Tuple{Src: lo.Dst, Dst: lo.Src, Sport: lo.Dport, Dport: lo.Sport}
	if v.Status&ctFOrigLo != 0 {
		e.Orig, e.Reply = lo, hi
	} else {
		e.Orig, e.Reply = hi, lo
	}
	if k.Proto == 1 || k.Proto == 58 {
		for _, t := range []*Tuple{&e.Orig, &e.Reply} {
			t.ID, t.Sport, t.Dport = t.Sport, 0, 0
		}
	}
	switch {
	case k.Proto == 6 && int(v.State) < len(tcpStateNames):
		e.State = tcpStateNames[v.State]
	case e.SeenReply:
		e.State = "ESTABLISHED"
	default:
		e.State = "NEW"
	}
	if v.Expires > now {
		e.Timeout = float64(v.Expires-now) / 1e9
	}
	return e
}

// Entry status bits (CT_F_* of conntrack.h).
const (
	ctFSeenReply = 0x1
	ctFAssured   = 0x2
	ctFOrigLo    = 0x4
)

// List returns every live entry of both tables, confirmed first, each table sorted.
func (t *Tables) List() ([]Entry, error) {
	return t.list(true)
}

// ListConfirmed is List of the confirmed table alone: cheap while a flood fills the other.
func (t *Tables) ListConfirmed() ([]Entry, error) {
	return t.list(false)
}

func (t *Tables) list(unconfirmed bool) ([]Entry, error) {
	now, err := clockNow()
	if err != nil {
		return nil, err
	}
	var out []Entry
	tables := []struct {
		m         *ebpf.Map
		confirmed bool
	}{{t.Main, true}, {t.Emb, false}}
	if !unconfirmed {
		tables = tables[:1]
	}
	for _, tb := range tables {
		var part []Entry
		err := dump(tb.m, func(k ctCtKey, v ctCtEntry) {
			if v.Expires > now {
				part = append(part, toEntry(k, v, tb.confirmed, now))
			}
		})
		if err != nil {
			return nil, err
		}
		sort.Slice(part, func(i, j int) bool { return part[i].less(&part[j]) })
		out = append(out, part...)
	}
	return out, nil
}

func (e *Entry) less(o *Entry) bool {
	if e.Proto != o.Proto {
		return e.Proto < o.Proto
	}
	if c := e.Orig.Src.Compare(o.Orig.Src); c != 0 {
		return c < 0
	}
	if c := e.Orig.Dst.Compare(o.Orig.Dst); c != 0 {
		return c < 0
	}
	if e.Orig.Sport != o.Orig.Sport {
		return e.Orig.Sport < o.Orig.Sport
	}
	return e.Orig.Dport < o.Orig.Dport || e.Orig.ID < o.Orig.ID
}

const batchSize = 256

// dump calls fn for every entry of m, in batches; it falls back to iteration where batch
// lookups are unsupported.
func dump(m *ebpf.Map, fn func(ctCtKey, ctCtEntry)) error {
	keys := make([]ctCtKey, batchSize)
	vals := make([]ctCtEntry, batchSize)
	var cursor ebpf.MapBatchCursor
	for {
		n, err := m.BatchLookup(&cursor, keys, vals, nil)
		for i := 0; i < n; i++ {
			fn(keys[i], vals[i])
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil
		}
		if errors.Is(err, ebpf.ErrNotSupported) {
			var k ctCtKey
			var v ctCtEntry
			it := m.Iterate()
			for it.Next(&k, &v) {
				fn(k, v)
			}
			return it.Err()
		}
		if err != nil {
			return fmt.Errorf("dump %s: %w", m, err)
		}
	}
}

// Flush deletes every entry and returns how many. It deletes through ct_sweep, so each entry
// removed is reported on the event ring ([DESTROY]) as nf reports `conntrack -F`; an entry
// created while it runs may survive, as in nf.
func (t *Tables) Flush() (int, error) {
	prog, err := t.sweeper()
	if err != nil {
		return 0, err
	}
	total := 0
	for table, m := range []*ebpf.Map{t.Main, t.Emb} {
		var keys []ctCtKey
		if err := dump(m, func(k ctCtKey, _ ctCtEntry) { keys = append(keys, k) }); err != nil {
			return total, err
		}
		n, err := runSweep(prog, uint32(table), keys, true)
		total += n
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// runSweep runs ct_sweep over keys of table (0: ct_main, 1: ct_emb) in batches; flush removes
// them whether or not they have expired. It returns how many it removed.
func runSweep(prog *ebpf.Program, table uint32, keys []ctCtKey, flush bool) (int, error) {
	removed := 0
	for len(keys) > 0 {
		b := ctCtSweepBatch{Table: table, Flush: boolU32(flush)}
		b.Count = uint32(copy(b.Keys[:], keys))
		keys = keys[b.Count:]
		if _, err := prog.Run(&ebpf.RunOptions{Context: b, ContextOut: &b}); err != nil {
			return removed, fmt.Errorf("sweep: %w", err)
		}
		removed += int(b.Removed)
	}
	return removed, nil
}

// Sweep removes expired entries from both tables and returns how many it removed and how many
// live ones it saw. The dump only finds candidates: ct_sweep decides each with the data path's
// clock, so an entry refreshed since the dump survives, and reports what it removes on the
// event ring like the data path does.
func (t *Tables) Sweep() (removed, live int, err error) {
	prog, err := t.sweeper()
	if err != nil {
		return 0, 0, err
	}
	for table, m := range []*ebpf.Map{t.Main, t.Emb} {
		now, err := clockNow()
		if err != nil {
			return removed, live, err
		}
		var expired []ctCtKey
		if err := dump(m, func(k ctCtKey, v ctCtEntry) {
			if v.Expires <= now {
				expired = append(expired, k)
			} else {
				live++
			}
		}); err != nil {
			return removed, live, err
		}
		n, err := runSweep(prog, uint32(table), expired, false)
		removed += n
		if err != nil {
			return removed, live, err
		}
	}
	return removed, live, nil
}

// Counters are the program's per-CPU counters summed over CPUs, by name.
type Counters map[string]uint64

// StatNames are the counters in enum ct_stat order.
var StatNames = []string{"new", "established", "related", "forwarded", "passed", "policy_drop", "table_full",
	"expired", "swept", "invalid_no_conn", "invalid_tcp_state", "invalid_window", "invalid_rst",
	"invalid_synack", "invalid_icmp", "invalid_malformed", "window_ignored", "tcp_ignored", "unconfirmed_removed"}

// Evicted is how many unconfirmed entries the LRU table evicted to make room for new ones
// (the kernel evicts silently): every entry created there was either removed by conntrack
// (counted), evicted, or is still there. Exact when no packet is in flight; c and
// unconfirmed from one moment.
func Evicted(c Counters, unconfirmed int) uint64 {
	gone := c["unconfirmed_removed"] + uint64(unconfirmed)
	if c["new"] < gone {
		return 0
	}
	return c["new"] - gone
}

// ReadCounters sums the per-CPU counters.
func (t *Tables) ReadCounters() (Counters, error) {
	c := Counters{}
	for i, n := range StatNames {
		v, err := stats.Sum(t.Stats, uint32(i))
		if err != nil {
			return nil, fmt.Errorf("read counter %s: %w", n, err)
		}
		c[n] = v
	}
	return c, nil
}

// Count returns the number of entries (live or not yet swept) per table.
func (t *Tables) Count() (confirmed, unconfirmed int, err error) {
	for _, x := range []struct {
		m *ebpf.Map
		n *int
	}{{t.Main, &confirmed}, {t.Emb, &unconfirmed}} {
		if err := dump(x.m, func(ctCtKey, ctCtEntry) { *x.n++ }); err != nil {
			return 0, 0, err
		}
	}
	return confirmed, unconfirmed, nil
}

// SetTimeouts changes timeouts of a running instance by name.
func (t *Tables) SetTimeouts(over map[string]time.Duration) error {
	var c ctCtConfig
	if err := t.Settings.Lookup(uint32(0), &c); err != nil {
		return fmt.Errorf("read settings: %w", err)
	}
	for name, d := range over {
		for i, n := range timeoutNames {
			if n == name {
				c.Timeout[i] = uint32(d / time.Second)
			}
		}
	}
	if err := t.Settings.Put(uint32(0), &c); err != nil {
		return fmt.Errorf("write settings: %w", err)
	}
	return nil
}

// Timeouts reads the current timeouts.
func (t *Tables) Timeouts() (map[string]time.Duration, bool, error) {
	var c ctCtConfig
	if err := t.Settings.Lookup(uint32(0), &c); err != nil {
		return nil, false, fmt.Errorf("read settings: %w", err)
	}
	out := map[string]time.Duration{}
	for i, n := range timeoutNames {
		out[n] = time.Duration(c.Timeout[i]) * time.Second
	}
	return out, c.Liberal != 0, nil
}

// Resync makes every confirmed TCP connection from ESTABLISHED to TIME_WAIT a mid-stream pickup,
// as nf's tcp_loose makes one: each direction learns its window again from its next packet and
// neither is checked against the window any more (be_liberal). `run` calls it before it attaches
// to tables a previous run left: while no program was attached the kernel forwarded the
// connections' packets, so their sequence numbers moved past the windows the entries remember,
// and while the two directions re-learn them, one side's ACKs may cover data the other sent
// during the gap. Each direction keeps its window scale and its other flags, the entry its
// state, counters and timeout. Returns how many entries changed.
func (t *Tables) Resync() (int, error) {
	type kv struct {
		k ctCtKey
		v ctCtEntry
	}
	var stale []kv
	if err := dump(t.Main, func(k ctCtKey, v ctCtEntry) {
		if k.Proto == 6 && v.State >= uint32(ctCtTcpStateCT_TCP_ESTABLISHED) && v.State <= uint32(ctCtTcpStateCT_TCP_TIME_WAIT) {
			stale = append(stale, kv{k, v})
		}
	}); err != nil {
		return 0, fmt.Errorf("read the confirmed table: %w", err)
	}
	n := 0
	for _, e := range stale {
		for i := range e.v.Tcp {
			e.v.Tcp[i].TdEnd, e.v.Tcp[i].TdMaxend, e.v.Tcp[i].TdMaxwin = 0, 0, 0
			e.v.Tcp[i].Flags |= uint8(ctCtTcpFlagCT_TCP_F_BE_LIBERAL)
		}
		err := t.Main.Update(e.k, e.v, ebpf.UpdateExist)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			continue // removed meanwhile
		}
		if err != nil {
			return n, fmt.Errorf("update a confirmed entry: %w", err)
		}
		n++
	}
	return n, nil
}
