// Package attach is the one way flowplane's subsystems attach programs, pin them, record them
// and remove them again (tune, prio host and router, altmark's marker, conntrack's run; the
// foreground altmark probe uses its Attach too).
//
// An Instance is one named attachment: its pins under pin.Dir(Instance.Pin...) and its record
// under /run/flowplane (internal/runstate). Apply attaches it, or when it is attached already
// replaces its programs in place with link.Update on the pinned links: no moment with nothing
// attached, and if the new programs fail to load or to take the hook, the old ones stay.
// Remove takes it all away in the one order below. Both find what a crash left (Leftover) and
// clean it first; status commands list it with Leftovers.
//
// The one order. Apply: load, attach (the links are only file descriptors yet: a crash here
// detaches them with the process), pin the maps then the links, set up what is not a BPF
// object (Spec.Setup: a qdisc, classes), and write the record last. Remove: the record first,
// then detach the links (BPF_LINK_DETACH, which detaches now even while a status command or
// another tool holds the link open), then take down what is not a BPF object (Instance.Teardown),
// and unpin last. Why: the record is the promise "this is attached and whole", so it is written
// when everything is there and withdrawn before anything goes — status, which lists records
// (runstate.Each), then never shows a half-made or half-removed instance. The pins are how the
// kernel objects are found again, so they are made first and dropped last: whatever a crash
// (kill -9) interrupts, what it leaves is pins without a record, or a record whose links are
// gone — both found by Leftover, reported by status and cleaned by the next Apply or Remove.
// Apply and Remove of one subsystem hold its lock (/run/flowplane/<subsystem>/.lock), so a
// status that reads while another command works waits for it rather than calling its pins a
// leftover, and a kill -9 drops the lock with the process.
package attach

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"

	"github.com/flowplane/flowplane/internal/pin"
	"github.com/flowplane/flowplane/internal/runstate"
)

// Instance is one named attachment of a subsystem.
type Instance struct {
	// Pin is the pin directory's parts under pin.Root: the subsystem first, then the instance
	// (e.g. prio, ns4026531840, eth0). The record is runstate's Pin[0] / Pin[1:] joined by "-".
	Pin []string
	// What names it in errors and reports: `prio host attachment "default"`.
	What string
	// Teardown removes what the subsystem made that is not a BPF object (a qdisc, a cgroup);
	// Remove and the cleaning of leftovers call it after the links are detached. Optional.
	Teardown func() error
	// Foreground instances pin no link: their process holds them, and its end detaches them.
	// Their record lists the links' IDs, which is how a record outliving its process is told.
	Foreground bool
}

// ErrAbsent is what Remove returns (wrapped, naming the instance) when there is nothing to
// remove; it matches os.ErrNotExist too.
var ErrAbsent = errors.New("nothing attached")

type absentError struct{ what string }

func (e *absentError) Error() string        { return "no " + e.what }
func (e *absentError) Is(target error) bool { return target == ErrAbsent || target == os.ErrNotExist }

// Link is a program to attach at a hook, pinned under Name in the instance's directory.
type Link struct {
	Name    string
	Hook    Hook
	Program *ebpf.Program
}

// Spec is what Apply attaches, pins and records.
type Spec struct {
	Links []Link
	// Maps are pinned under their names. A map already pinned there (the load reused it, see
	// Reuse) stays as it is, so its counters go on counting across a replacement.
	Maps map[string]*ebpf.Map
	// Setup makes what is not a BPF object, after the pins and before the record; replacing
	// says the instance was attached before (change it in place). Optional.
	Setup func(replacing bool) error
	// Undo takes back what Setup changed in a replacement, when writing the record fails
	// after it. Optional.
	Undo func()
	// Record is saved as the instance's runstate record.
	Record any
	// Objects (the loaded collection) are closed when Apply returns: the pins and links keep
	// what stays. Optional.
	Objects io.Closer
}

// Result says what Apply or Remove found.
type Result struct {
	Replaced bool     // Apply replaced the programs of an attached instance in place
	Cleaned  *Problem // what a crash had left, cleaned first; nil if nothing
}

// Problem is an instance found in a state no finished command leaves.
type Problem struct {
	What string   `json:"what"`
	Why  string   `json:"why"`
	Pin  []string `json:"pin"` // the instance's Instance.Pin
}

func (p *Problem) String() string { return p.What + ": " + p.Why }

// recordName is the instance's runstate subsystem and record name.
func (in Instance) recordName() (string, string) {
	return in.Pin[0], strings.Join(in.Pin[1:], "-")
}

// Dir is the instance's pin directory (not created).
func (in Instance) Dir() string { return pin.Path(in.Pin...) }

// HasRecord says whether the instance's record exists.
func (in Instance) HasRecord() bool {
	sub, name := in.recordName()
	_, err := os.Stat(runstate.Path(sub, name))
	return err == nil
}

// state is what exists of an instance.
type state struct {
	record bool
	pins   bool
	links  map[string]pinned // pinned links by file name
	ids    []link.ID         // a foreground record's links
	dead   []string          // links that hold no hook any more
}

type pinned struct {
	target uint64
	prog   ebpf.ProgramID
}

// foregroundRecord is the part of a foreground instance's record Apply adds.
type foregroundRecord struct {
	Links []link.ID `json:"attach_links"`
}

func (in Instance) inspect() (*state, error) {
	st := &state{links: map[string]pinned{}}
	sub, name := in.recordName()
	if data, err := os.ReadFile(runstate.Path(sub, name)); err == nil {
		st.record = true
		if in.Foreground {
			var fr foregroundRecord
			_ = json.Unmarshal(data, &fr)
			st.ids = fr.Links
			for _, id := range fr.Links {
				l, err := link.NewFromID(id)
				if err != nil {
					st.dead = append(st.dead, fmt.Sprintf("link %d", id))
					continue
				}
				if info, err := l.Info(); err != nil {
					st.dead = append(st.dead, fmt.Sprintf("link %d", id))
				} else if _, ok := linkTarget(info); !ok {
					st.dead = append(st.dead, fmt.Sprintf("link %d", id))
				}
				l.Close()
			}
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	if in.Foreground {
		return st, nil
	}
	entries, err := os.ReadDir(in.Dir())
	if errors.Is(err, os.ErrNotExist) {
		return st, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", pin.Shown(in.Pin...), err)
	}
	st.pins = len(entries) > 0
	for _, e := range entries {
		if e.IsDir() || strings.HasSuffix(e.Name(), newSuffix) {
			continue
		}
		l, err := link.LoadPinnedLink(filepath.Join(in.Dir(), e.Name()), nil)
		if err != nil {
			continue // a map
		}
		info, err := l.Info()
		l.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: link info: %w", e.Name(), err)
		}
		t, ok := linkTarget(info)
		if !ok {
			st.dead = append(st.dead, e.Name())
		}
		st.links[e.Name()] = pinned{target: t, prog: info.Program}
	}
	return st, nil
}

// problem is what is wrong with st, or nil when it is whole or absent.
func (in Instance) problem(st *state) *Problem {
	switch {
	case in.Foreground && st.record && len(st.dead) > 0:
		return &Problem{What: in.What, Pin: in.Pin, Why: "its record outlived the process that attached it (killed?); its links are gone"}
	case in.Foreground:
		return nil
	case st.record && !st.pins:
		return &Problem{What: in.What, Pin: in.Pin, Why: "its record is there but its pins are gone"}
	case st.record && len(st.links) == 0:
		return &Problem{What: in.What, Pin: in.Pin, Why: "its record is there but no link is pinned"}
	case st.record && len(st.dead) > 0:
		hold := fmt.Sprintf("the pinned link %q holds", st.dead[0])
		if len(st.dead) > 1 {
			hold = fmt.Sprintf("the pinned links %q hold", st.dead)
		}
		return &Problem{What: in.What, Pin: in.Pin, Why: "its record is there but " + hold + " no hook any more (device or cgroup gone)"}
	case !st.record && st.pins:
		return &Problem{What: in.What, Pin: in.Pin, Why: "pinned without a record (a command killed between attach and record, or during remove)"}
	}
	return nil
}

// locked takes the subsystem's lock (unix.LOCK_SH or LOCK_EX) and reads the instance's state;
// call unlock when done.
func (in Instance) locked(how int) (st *state, unlock func(), err error) {
	if unlock, err = lock(in.Pin[0], how); err != nil {
		return nil, nil, err
	}
	if st, err = in.inspect(); err != nil {
		unlock()
		return nil, nil, err
	}
	return st, unlock, nil
}

// Leftover is what a crash or an outside change left of the instance, nil if nothing.
func (in Instance) Leftover() (*Problem, error) {
	st, unlock, err := in.locked(unix.LOCK_SH)
	if err != nil {
		return nil, err
	}
	defer unlock()
	return in.problem(st), nil
}

// Running says whether the instance's record exists and nothing of it is a leftover: for a
// foreground instance, whether its process still holds it. Start checks again under its lock;
// this lets a caller refuse before it changes anything (shared maps included).
func (in Instance) Running() (bool, error) {
	st, unlock, err := in.locked(unix.LOCK_SH)
	if err != nil {
		return false, err
	}
	defer unlock()
	return st.record && in.problem(st) == nil, nil
}

// Apply attaches the instance from what load returns, or replaces the programs of the attached
// instance in place (load is told which). What a crash left is cleaned first (Result.Cleaned).
func (in Instance) Apply(load func(replacing bool) (*Spec, error)) (res Result, err error) {
	if in.Foreground {
		return res, errors.New("attach: Apply on a foreground instance; use Start")
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return res, fmt.Errorf("remove memlock limit: %w", err)
	}
	st, unlock, err := in.locked(unix.LOCK_EX)
	if err != nil {
		return res, err
	}
	defer unlock()
	if p := in.problem(st); p != nil {
		if err := in.remove(st); err != nil {
			return res, fmt.Errorf("clean what was left of %s (%s): %w", in.What, p.Why, err)
		}
		res.Cleaned = p
		st = &state{links: map[string]pinned{}}
	}
	replacing := st.record
	spec, err := load(replacing)
	if spec != nil && spec.Objects != nil {
		defer spec.Objects.Close()
	}
	if err != nil {
		if replacing {
			return res, fmt.Errorf("%w; the attached %s stays as it was", err, in.What)
		}
		return res, err
	}
	if replacing {
		err = in.replace(st, spec)
		res.Replaced = err == nil
		return res, err
	}
	_, err = in.attachNew(spec)
	return res, err
}

// attachNew attaches, pins, sets up and records, in that order; a failure undoes what came
// before it. A foreground instance's links are returned, unpinned: its process holds them.
func (in Instance) attachNew(spec *Spec) (held []link.Link, err error) {
	var links []link.Link
	defer func() {
		if err == nil && in.Foreground {
			return
		}
		// On failure the pins are gone by now (pin.Remove below runs first): closing detaches.
		for _, l := range links {
			l.Close()
		}
	}()
	for _, s := range spec.Links {
		l, err := Attach(s.Hook, s.Program)
		if err != nil {
			return nil, err
		}
		links = append(links, l)
	}
	if !in.Foreground {
		dir, err := pin.Dir(in.Pin...)
		if err != nil {
			return nil, err
		}
		defer func() {
			if err != nil {
				_ = pin.Remove(in.Pin...)
			}
		}()
		for _, n := range sortedKeys(spec.Maps) {
			if err := pinMap(spec.Maps[n], filepath.Join(dir, n)); err != nil {
				return nil, err
			}
		}
		for i, l := range links {
			if err := l.Pin(filepath.Join(dir, spec.Links[i].Name)); err != nil {
				return nil, fmt.Errorf("pin link %s: %w", spec.Links[i].Name, err)
			}
		}
	}
	if spec.Setup != nil {
		if err := spec.Setup(false); err != nil {
			return nil, err
		}
	}
	rec := spec.Record
	if in.Foreground {
		if rec, err = withLinks(rec, links); err != nil {
			return nil, err
		}
	}
	sub, name := in.recordName()
	stopAt("record")
	if err := runstate.Save(sub, name, rec); err != nil {
		if in.Teardown != nil {
			_ = in.Teardown()
		}
		return nil, err
	}
	if in.Foreground {
		return links, nil
	}
	return nil, nil
}

// ErrRunning says a foreground instance is attached by a process that still runs.
var ErrRunning = errors.New("already attached by a running process")

// Running is a foreground instance while its process runs: it holds the links.
type Running struct {
	in    Instance
	links []link.Link
}

// Links are the attached links, in the Spec's order.
func (r *Running) Links() []link.Link { return r.links }

// Start attaches a foreground instance: the links stay with this process (nothing is pinned by
// Start; Spec.Maps are ignored) and the record lists their IDs. A record left by a process that
// was killed is cleaned first (Result.Cleaned); one whose process still runs is ErrRunning.
func (in Instance) Start(spec *Spec) (*Running, Result, error) {
	var res Result
	in.Foreground = true
	st, unlock, err := in.locked(unix.LOCK_EX)
	if err != nil {
		return nil, res, err
	}
	defer unlock()
	if p := in.problem(st); p != nil {
		if err := in.remove(st); err != nil {
			return nil, res, fmt.Errorf("clean what was left of %s (%s): %w", in.What, p.Why, err)
		}
		res.Cleaned = p
	} else if st.record {
		return nil, res, fmt.Errorf("%s: %w", in.What, ErrRunning)
	}
	links, err := in.attachNew(spec)
	if err != nil {
		return nil, res, err
	}
	return &Running{in: in, links: links}, res, nil
}

// Stop removes the record, then detaches the links and calls Teardown: Remove's order.
func (r *Running) Stop() error {
	unlock, err := lock(r.in.Pin[0], unix.LOCK_EX)
	if err != nil {
		return err
	}
	defer unlock()
	sub, name := r.in.recordName()
	errs := []error{runstate.Remove(sub, name)}
	for _, l := range r.links {
		errs = append(errs, l.Close())
	}
	r.links = nil
	if r.in.Teardown != nil {
		errs = append(errs, r.in.Teardown())
	}
	return errors.Join(errs...)
}

// pinMap pins m at path unless it is pinned there already (a map the load reused).
func pinMap(m *ebpf.Map, path string) error {
	if same(m, path) {
		return nil
	}
	_ = os.Remove(path)
	if err := m.Pin(path); err != nil {
		return fmt.Errorf("pin map %s: %w", filepath.Base(path), err)
	}
	return nil
}

// same says whether the map pinned at path is m.
func same(m *ebpf.Map, path string) bool {
	old, err := ebpf.LoadPinnedMap(path, nil)
	if err != nil {
		return false
	}
	defer old.Close()
	a, err1 := m.Info()
	b, err2 := old.Info()
	if err1 != nil || err2 != nil {
		return false
	}
	ida, ok1 := a.ID()
	idb, ok2 := b.ID()
	return ok1 && ok2 && ida == idb
}

// newSuffix marks a pin made beside the one it will replace (bpffs takes no dot in a name).
const newSuffix = "@new"

// replace swaps the attached programs for spec's: each pinned link takes its new program with
// link.Update (the hook never empties); a link whose hook moved (another cgroup or device) is
// attached anew first and the old one detached after. New maps are pinned beside the old ones
// and renamed over them once every link has its new program. Any failure before that puts the
// old programs back.
func (in Instance) replace(st *state, spec *Spec) (err error) {
	dir := in.Dir()
	type swap struct {
		name     string
		old      link.Link     // the pinned link
		oldProg  *ebpf.Program // its program before the update
		updated  bool
		moved    link.Link // a new link where the hook moved
		oldMoved bool
	}
	var swaps []*swap
	var newPins []string
	undo := func() {
		for _, s := range swaps {
			if s.updated {
				_ = s.old.Update(s.oldProg)
			}
			if s.moved != nil {
				s.moved.Close() // not pinned: detached
			}
		}
		for _, p := range newPins {
			_ = os.Remove(p)
		}
	}
	defer func() {
		if err != nil {
			undo()
			err = fmt.Errorf("%w; the attached %s stays as it was", err, in.What)
		}
		for _, s := range swaps {
			if s.old != nil {
				s.old.Close()
			}
			if s.oldProg != nil {
				s.oldProg.Close()
			}
			if s.moved != nil {
				s.moved.Close()
			}
		}
	}()
	for _, n := range sortedKeys(spec.Maps) {
		p := filepath.Join(dir, n)
		if same(spec.Maps[n], p) {
			continue
		}
		_ = os.Remove(p + newSuffix)
		if err := spec.Maps[n].Pin(p + newSuffix); err != nil {
			return fmt.Errorf("pin map %s: %w", n, err)
		}
		newPins = append(newPins, p+newSuffix)
	}
	for _, l := range spec.Links {
		s := &swap{name: l.Name}
		swaps = append(swaps, s)
		old, ok := st.links[l.Name]
		if !ok {
			return fmt.Errorf("replace: no pinned link %s in %s", l.Name, dir)
		}
		if s.old, err = link.LoadPinnedLink(filepath.Join(dir, l.Name), nil); err != nil {
			return fmt.Errorf("open pinned link %s: %w", l.Name, err)
		}
		want, err := l.Hook.target()
		if err != nil {
			return err
		}
		if want != old.target {
			// Another device or cgroup: make before break.
			if s.moved, err = Attach(l.Hook, l.Program); err != nil {
				return err
			}
			p := filepath.Join(dir, l.Name) + newSuffix
			_ = os.Remove(p)
			if err := s.moved.Pin(p); err != nil {
				return fmt.Errorf("pin link %s: %w", l.Name, err)
			}
			newPins = append(newPins, p)
			s.oldMoved = true
			continue
		}
		if s.oldProg, err = ebpf.NewProgramFromID(old.prog); err != nil {
			return fmt.Errorf("hold the attached program of %s: %w", l.Name, err)
		}
		if err := s.old.Update(l.Program); err != nil {
			return fmt.Errorf("replace the program at the %s (link.Update): %w", l.Hook, err)
		}
		s.updated = true
	}
	if spec.Setup != nil {
		if err := spec.Setup(true); err != nil {
			return err
		}
	}
	sub, name := in.recordName()
	if err := runstate.Save(sub, name, spec.Record); err != nil {
		if spec.Undo != nil {
			spec.Undo()
		}
		return err
	}
	// Committed: nothing below puts the old programs back.
	for _, p := range newPins {
		if err := os.Rename(p, strings.TrimSuffix(p, newSuffix)); err != nil {
			return fmt.Errorf("replace pin %s: %w", filepath.Base(p), err)
		}
	}
	newPins = nil
	for _, s := range swaps {
		s.updated = false
		if s.oldMoved {
			if err := s.old.Detach(); err != nil {
				return fmt.Errorf("detach the old link %s: %w", s.name, err)
			}
			s.moved.Close() // pinned now
			s.moved = nil
		}
	}
	return nil
}

// withLinks adds the links' IDs to a foreground record.
func withLinks(rec any, links []link.Link) (any, error) {
	data, err := json.Marshal(rec)
	if err != nil {
		return nil, err
	}
	m := map[string]any{}
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("a foreground record must be a JSON object: %w", err)
	}
	var ids []link.ID
	for _, l := range links {
		info, err := l.Info()
		if err != nil {
			return nil, fmt.Errorf("link info: %w", err)
		}
		ids = append(ids, info.ID)
	}
	m["attach_links"] = ids
	return m, nil
}

// Remove takes the instance away: record, links, Teardown, pins, in that order. Nothing there
// is an error matching ErrAbsent, naming the instance. Result.Cleaned says the instance was a
// leftover (see Leftover) rather than whole.
func (in Instance) Remove() (res Result, err error) {
	st, unlock, err := in.locked(unix.LOCK_EX)
	if err != nil {
		return res, err
	}
	defer unlock()
	if !st.record && !st.pins {
		return res, &absentError{in.What}
	}
	res.Cleaned = in.problem(st)
	return res, in.remove(st)
}

// remove is Remove under the lock.
func (in Instance) remove(st *state) error {
	sub, name := in.recordName()
	var errs []error
	if err := runstate.Remove(sub, name); err != nil {
		return fmt.Errorf("remove the record of %s: %w", in.What, err)
	}
	stopAt("detach")
	for _, n := range sortedKeys(st.links) {
		l, err := link.LoadPinnedLink(filepath.Join(in.Dir(), n), nil)
		if err != nil {
			continue
		}
		if err := l.Detach(); err != nil && !errors.Is(err, unix.ENOLINK) {
			errs = append(errs, fmt.Errorf("detach link %s: %w", n, err))
		}
		l.Close()
	}
	if in.Teardown != nil {
		if err := in.Teardown(); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		// The pins stay, so that the next remove finds what is left.
		return errors.Join(errs...)
	}
	if in.Foreground {
		return nil
	}
	return pin.Remove(in.Pin...)
}

// Leftovers lists the instances of subsystem that a crash or an outside change left: every
// record (instance maps a record name to its Instance; false skips it, e.g. another network
// namespace's) and every pin directory without a record. Status commands show them.
func Leftovers(subsystem string, instance func(record string) (Instance, bool)) ([]Problem, error) {
	unlock, err := lock(subsystem, unix.LOCK_SH)
	if err != nil {
		return nil, err
	}
	defer unlock()
	out := []Problem{}
	seen := map[string]bool{}
	names, err := runstate.Names(subsystem)
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	check := func(in Instance) error {
		st, err := in.inspect()
		if err != nil {
			return err
		}
		if p := in.problem(st); p != nil {
			out = append(out, *p)
		}
		return nil
	}
	for _, n := range names {
		in, ok := instance(n)
		if !ok {
			continue
		}
		seen[in.Dir()] = true
		if err := check(in); err != nil {
			return nil, err
		}
	}
	// Pins without a record: the directories under the subsystem's that hold files.
	root := pin.Path(subsystem)
	err = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil
			}
			return err
		}
		if d.IsDir() || seen[filepath.Dir(path)] {
			return nil
		}
		dir := filepath.Dir(path)
		seen[dir] = true
		rel, err := filepath.Rel(root, dir)
		if err != nil || rel == "." {
			return nil
		}
		parts := append([]string{subsystem}, strings.Split(rel, string(filepath.Separator))...)
		in, ok := instance(strings.Join(parts[1:], "-"))
		if !ok || !slices.Equal(in.Pin, parts) {
			return nil
		}
		return check(in)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// lock takes the subsystem's lock (shared or exclusive); a process that dies drops it.
func lock(subsystem string, how int) (func(), error) {
	dir := filepath.Join(runstate.Root, subsystem)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create %s: %w", dir, err)
	}
	f, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open the %s lock: %w", subsystem, err)
	}
	for {
		err = unix.Flock(int(f.Fd()), how)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", subsystem, err)
	}
	return func() { f.Close() }, nil
}

// StopEnv names the crash point a command stops itself at (SIGSTOP), for a test to kill -9 it
// there as a crash would: "record" (Apply, with everything attached and pinned but the record
// not written) or "detach" (Remove, with the record gone and the links not yet detached).
const StopEnv = "FLOWPLANE_ATTACH_STOP"

func stopAt(point string) {
	if os.Getenv(StopEnv) == point {
		// To this thread, which then stops before it runs on: a signal to the process may be
		// taken by another thread while this one goes on a few steps.
		runtime.LockOSThread()
		_ = unix.Tgkill(os.Getpid(), unix.Gettid(), unix.SIGSTOP)
		runtime.UnlockOSThread()
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// Reuse opens the maps pinned in dir under the names given (pin file → the spec's map name)
// for ebpf.CollectionOptions.MapReplacements, so a new load keeps their contents: counters go
// on counting across a replacement, tables survive a restart. A map not pinned is left out; one
// that no longer fits the spec is left out too, or with strict an error wrapping
// ebpf.ErrMapIncompatible. dir "" reuses nothing. Call done once the collection is loaded.
func Reuse(dir string, spec *ebpf.CollectionSpec, names map[string]string, strict bool) (maps map[string]*ebpf.Map, done func(), err error) {
	maps = map[string]*ebpf.Map{}
	if dir == "" {
		return maps, func() {}, nil
	}
	done = func() {
		for _, m := range maps {
			m.Close()
		}
	}
	for _, file := range sortedKeys(names) {
		name := names[file]
		m, err := ebpf.LoadPinnedMap(filepath.Join(dir, file), nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			done()
			return nil, nil, fmt.Errorf("open pinned %s: %w", file, err)
		}
		ms, ok := spec.Maps[name]
		if !ok {
			m.Close()
			continue
		}
		if err := ms.Compatible(m); err != nil {
			m.Close()
			if strict {
				done()
				return nil, nil, fmt.Errorf("%s: %w", file, err)
			}
			continue
		}
		maps[name] = m
	}
	return maps, done, nil
}

// Load is spec.LoadAndAssign(objs) on the maps pinned in dir under the names of reuse (pin
// file → the spec's map name) that still fit: Reuse, not strict. dir "" loads afresh.
func Load(spec *ebpf.CollectionSpec, objs any, dir string, reuse map[string]string) error {
	maps, done, err := Reuse(dir, spec, reuse, false)
	if err != nil {
		return err
	}
	defer done()
	return spec.LoadAndAssign(objs, &ebpf.CollectionOptions{MapReplacements: maps})
}
