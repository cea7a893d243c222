package tune

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/flowplane/flowplane/internal/attach"
	"github.com/flowplane/flowplane/internal/cgroup"
	"github.com/flowplane/flowplane/internal/kernel"
	"github.com/flowplane/flowplane/internal/pin"
	"github.com/flowplane/flowplane/internal/runstate"
)

// DefaultName is the policy instance the commands act on without --name.
const DefaultName = "default"

// A record per applied policy (internal/runstate) keeps its file, YAML and cgroup, so status,
// explain and remove work from any shell.
const subsystem = "tune"

// Record is what apply leaves behind for the other commands.
type Record struct {
	Name          string    `json:"name"`
	File          string    `json:"file"`
	YAML          string    `json:"yaml"`
	Cgroup        string    `json:"cgroup"`
	CreatedCgroup bool      `json:"created_cgroup"`
	Generation    uint32    `json:"generation"`
	Applied       time.Time `json:"applied"`
}

// LoadRecord reads an instance's record; os.ErrNotExist when none is applied.
func LoadRecord(name string) (*Record, error) {
	var r Record
	if err := runstate.Load(subsystem, name, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

func pinParts(name string) []string { return []string{"tune", name} }

// mapPins names the pinned maps (files under the instance's pin directory).
var mapPins = []struct {
	file string
	get  func(*tuneMaps) **ebpf.Map
}{
	{"gen", func(m *tuneMaps) **ebpf.Map { return &m.TuneGen }},
	{"rules", func(m *tuneMaps) **ebpf.Map { return &m.TuneRules }},
	{"profiles", func(m *tuneMaps) **ebpf.Map { return &m.TuneProfiles }},
	{"remote", func(m *tuneMaps) **ebpf.Map { return &m.TuneRemote }},
	{"local", func(m *tuneMaps) **ebpf.Map { return &m.TuneLocal }},
	{"sides", func(m *tuneMaps) **ebpf.Map { return &m.TuneSides }},
	{"hits", func(m *tuneMaps) **ebpf.Map { return &m.TuneHits }},
	{"stats", func(m *tuneMaps) **ebpf.Map { return &m.TuneStats }},
	{"applied", func(m *tuneMaps) **ebpf.Map { return &m.TuneApplied }},
	{"errors", func(m *tuneMaps) **ebpf.Map { return &m.TuneErrors }},
}

// openPinned opens an applied instance's maps.
func openPinned(name string) (*tuneMaps, error) {
	dir := pin.Path(pinParts(name)...)
	m := &tuneMaps{}
	for _, mp := range mapPins {
		em, err := ebpf.LoadPinnedMap(filepath.Join(dir, mp.file), nil)
		if err != nil {
			m.Close()
			return nil, fmt.Errorf("open pinned map %s: %w", mp.file, err)
		}
		*mp.get(m) = em
	}
	return m, nil
}

// ErrOtherCgroup is returned when a policy instance is re-applied to a different cgroup.
var ErrOtherCgroup = errors.New("policy is applied to another cgroup")

// ErrNotApplied is returned by Remove for a policy instance that is not applied.
var ErrNotApplied = errors.New("not applied")

// ApplyOptions say where and under which name a policy goes.
type ApplyOptions struct {
	Name   string // instance, DefaultName when empty
	Cgroup string // absolute cgroup v2 path; empty: create <cgroup2 mount>/fptune[-name]
}

// instance is a policy instance as internal/attach knows it; its Teardown removes the cgroup
// if apply created it.
func instance(name string) attach.Instance {
	in := attach.Instance{Pin: pinParts(name), What: fmt.Sprintf("policy %q", name)}
	if rec, err := LoadRecord(name); err == nil && rec.CreatedCgroup {
		in.Teardown = func() error { return cgroup.Remove(cgroup.Reach(rec.Cgroup)) }
	}
	return in
}

// Apply loads pol into the kernel: the first time it creates (or takes) the cgroup, loads the
// program with the tables filled, then attaches and pins; later it rewrites the idle
// generation of the tables and flips tune_gen, so the attached program never goes away and
// every program run sees one whole policy or the other.
func Apply(pol *Policy, src []byte, opt ApplyOptions) (*Record, error) {
	rec, _, err := ApplyResult(pol, src, opt)
	return rec, err
}

// ApplyResult is Apply, also saying whether it replaced an applied policy and what a crash
// had left that it cleaned first.
func ApplyResult(pol *Policy, src []byte, opt ApplyOptions) (*Record, attach.Result, error) {
	if opt.Name == "" {
		opt.Name = DefaultName
	}
	c := compile(pol)
	var out *Record
	var m *tuneMaps
	var objs *tuneObjects
	var created string // a cgroup this apply made
	defer func() {
		if m != nil {
			m.Close()
		}
		if objs != nil {
			objs.Close()
		}
	}()
	res, err := instance(opt.Name).Apply(func(replacing bool) (*attach.Spec, error) {
		if replacing {
			rec, err := LoadRecord(opt.Name)
			if err != nil {
				return nil, err
			}
			if opt.Cgroup != "" && cgroup.HostPath(opt.Cgroup) != cgroup.HostPath(rec.Cgroup) {
				return nil, fmt.Errorf("%w: %s is on %s; run `flowplane tune remove --name %[2]s` first, or give this policy another --name, to apply to %[4]s", ErrOtherCgroup, opt.Name, cgroup.HostPath(rec.Cgroup), cgroup.HostPath(opt.Cgroup))
			}
			if m, err = openPinned(opt.Name); err != nil {
				return nil, err
			}
			return swap(m, rec, c, pol, src, &out)
		}
		return applyNew(c, pol, src, opt, &objs, &created, &out)
	})
	if err != nil {
		if created != "" {
			_ = cgroup.Remove(created)
		}
		return nil, res, err
	}
	if res.Replaced {
		// No run reads the old generation any more: take its prefixes out of the tries, so
		// lookups walk the live policy's nodes only (the next apply would clear them anyway).
		if err := clearTries(m, (out.Generation ^ 1)); err != nil {
			slog.Warn("old policy's prefixes stay in the address tries", "name", out.Name, "err", err)
		}
		slog.Debug("policy swapped", "name", out.Name, "generation", out.Generation)
	}
	return out, res, nil
}

// swap is the replacement of an applied policy: it writes c into the idle generation of the
// attached instance and flips tune_gen to it, in the Setup of the Spec it returns (no program
// changes). The live generation is read from the map, not the record, so a record left behind
// by a failed apply cannot make us overwrite the live half.
func swap(m *tuneMaps, rec *Record, c *compiled, pol *Policy, src []byte, out **Record) (*attach.Spec, error) {
	var old uint32
	if err := m.TuneGen.Lookup(uint32(0), &old); err != nil {
		return nil, fmt.Errorf("read the live generation: %w", err)
	}
	next := old>>genShift ^ 1
	if err := fill(m, next, c); err != nil {
		return nil, err
	}
	rec.Generation, rec.File, rec.YAML, rec.Applied = next, pol.File, string(src), time.Now()
	*out = rec
	saved := *rec
	saved.Cgroup = cgroup.HostPath(rec.Cgroup)
	return &attach.Spec{
		Setup: func(bool) error {
			if err := m.TuneGen.Update(uint32(0), next<<genShift|c.needs, ebpf.UpdateAny); err != nil {
				return fmt.Errorf("switch to the new policy: %w", err)
			}
			// Program runs that read the old generation before the flip may still be reading
			// its tables; wait them out so the next apply can overwrite that half.
			return rcuGracePeriod()
		},
		// Nothing half-applied: status and explain read the record, so go back to the policy
		// it describes.
		Undo:   func() { _ = m.TuneGen.Update(uint32(0), old, ebpf.UpdateAny) },
		Record: &saved,
	}, nil
}

// rcuGracePeriod returns once every BPF program run that started before the call has ended:
// programs run under rcu_read_lock, and membarrier(MEMBARRIER_CMD_GLOBAL) is synchronize_rcu.
func rcuGracePeriod() error {
	const membarrierCmdGlobal = 1
	if _, _, errno := unix.Syscall(unix.SYS_MEMBARRIER, membarrierCmdGlobal, 0, 0); errno != 0 {
		if errno != unix.EINVAL {
			return fmt.Errorf("membarrier (wait for program runs on the old policy): %w", errno)
		}
		// nohz_full kernels refuse the global command; a program run lasts microseconds.
		time.Sleep(100 * time.Millisecond)
	}
	return nil
}

// applyNew loads and fills the program for a first apply, creating the cgroup if none is
// given (created names it); the Spec it returns attaches, pins and records it.
func applyNew(c *compiled, pol *Policy, src []byte, opt ApplyOptions, objsOut **tuneObjects, created *string, out **Record) (*attach.Spec, error) {
	rec := &Record{Name: opt.Name, File: pol.File, YAML: string(src), Cgroup: opt.Cgroup, Applied: time.Now()}
	*out = rec
	if rec.Cgroup == "" {
		root, err := cgroup.Mount()
		if err != nil {
			return nil, err
		}
		base := "fptune"
		if opt.Name != DefaultName {
			base += "-" + opt.Name
		}
		rec.Cgroup = filepath.Join(root, base)
		if err := os.Mkdir(rec.Cgroup, 0o755); err == nil {
			rec.CreatedCgroup = true
			*created = rec.Cgroup
		} else if !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("create cgroup %s: %w", rec.Cgroup, err)
		}
	}
	spec, err := loadTune()
	if err != nil {
		return nil, fmt.Errorf("load tune program spec: %w", err)
	}
	hz, err := kernel.HZ()
	if err != nil {
		return nil, err
	}
	if err := spec.Variables["hz"].Set(uint32(hz)); err != nil {
		return nil, fmt.Errorf("set hz: %w", err)
	}
	objs := &tuneObjects{}
	if err := spec.LoadAndAssign(objs, nil); err != nil {
		return nil, fmt.Errorf("load tune program: %w", err)
	}
	*objsOut = objs
	if err := fill(&objs.tuneMaps, 0, c); err != nil {
		return nil, err
	}
	if err := objs.TuneGen.Update(uint32(0), c.needs, ebpf.UpdateAny); err != nil {
		return nil, fmt.Errorf("set generation: %w", err)
	}
	maps := map[string]*ebpf.Map{}
	for _, mp := range mapPins {
		maps[mp.file] = *mp.get(&objs.tuneMaps)
	}
	// The record names the cgroup by the host's name, as prio's host record has it: a path
	// taken under `ip netns exec` goes through an ancestor's root, gone once that process
	// exits (readers reach it again with cgroup.Reach).
	saved := *rec
	saved.Cgroup = cgroup.HostPath(rec.Cgroup)
	return &attach.Spec{
		Links:  []attach.Link{{Name: "link", Hook: attach.SockOps(rec.Cgroup), Program: objs.TuneSockops}},
		Maps:   maps,
		Record: &saved,
	}, nil
}

// fill writes compiled policy c into generation gen of the tables, clearing what an earlier
// policy left there first.
func fill(m *tuneMaps, gen uint32, c *compiled) error {
	base := gen * maxRules
	zr := make([]tuneTuneRule, maxRules)
	keys := make([]uint32, maxRules)
	for i := range keys {
		keys[i] = base + uint32(i)
	}
	copy(zr, c.bpfRules)
	if _, err := m.TuneRules.BatchUpdate(keys, zr, nil); err != nil {
		return fmt.Errorf("write rules: %w", err)
	}
	zp := make([]tuneTuneProfile, maxProfiles)
	pkeys := make([]uint32, maxProfiles)
	for i := range pkeys {
		pkeys[i] = gen*maxProfiles + uint32(i)
	}
	copy(zp, c.profiles)
	if _, err := m.TuneProfiles.BatchUpdate(pkeys, zp, nil); err != nil {
		return fmt.Errorf("write profiles: %w", err)
	}
	// Hits of this generation start from zero.
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		return err
	}
	zeros := make([]uint64, cpus)
	for i := uint32(0); i < 2*maxRules; i++ {
		if err := m.TuneHits.Update((gen*maxRules)*2+i, zeros, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("reset hits: %w", err)
		}
	}
	if err := clearTries(m, gen); err != nil {
		return err
	}
	for _, side := range []struct {
		m  *ebpf.Map
		es []trieEntry
	}{{m.TuneRemote, c.remote}, {m.TuneLocal, c.local}} {
		for _, e := range side.es {
			if err := side.m.Update(lpmKey(uint8(gen), e.prefix), e.rules.value(), ebpf.UpdateAny); err != nil {
				return fmt.Errorf("write address trie entry %s: %w", e.prefix, err)
			}
		}
	}
	for side := range c.any {
		v := tuneTuneSide{Octets: c.octets[side], Any: c.any[side].value()}
		if err := m.TuneSides.Update(gen*2+uint32(side), v, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("write the rules without a prefix: %w", err)
		}
	}
	return nil
}

// clearTries deletes generation gen's entries from both address tries.
func clearTries(m *tuneMaps, gen uint32) error {
	for _, trie := range []*ebpf.Map{m.TuneRemote, m.TuneLocal} {
		var stale []tuneTuneLpmKey
		var k tuneTuneLpmKey
		var v tuneTuneRuleset
		it := trie.Iterate()
		for it.Next(&k, &v) {
			if uint32(k.Gen) == gen {
				stale = append(stale, k)
			}
		}
		if err := it.Err(); err != nil {
			return fmt.Errorf("list address tries: %w", err)
		}
		for _, k := range stale {
			if err := trie.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return fmt.Errorf("clear address trie: %w", err)
			}
		}
	}
	return nil
}

// Remove detaches and unpins an instance, and removes the cgroup if apply created it.
func Remove(name string) error {
	_, err := RemoveResult(name)
	return err
}

// RemoveResult is Remove, saying what a crash had left (if it was not whole). An instance that
// is not there is ErrNotApplied.
func RemoveResult(name string) (attach.Result, error) {
	if name == "" {
		name = DefaultName
	}
	res, err := instance(name).Remove()
	if errors.Is(err, attach.ErrAbsent) {
		return res, fmt.Errorf("policy %q: %w", name, ErrNotApplied)
	}
	return res, err
}
