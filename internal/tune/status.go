package tune

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/flowplane/flowplane/internal/cgroup"
	"github.com/flowplane/flowplane/internal/match"
	"github.com/flowplane/flowplane/internal/pin"
	"github.com/flowplane/flowplane/internal/stats"
)

// Status is what `tune status` reports about one applied policy.
type Status struct {
	Name        string            `json:"name"`
	File        string            `json:"file"`
	Cgroup      string            `json:"cgroup"`
	Generation  uint32            `json:"generation"`
	Applied     time.Time         `json:"applied,omitzero"` // not with a leftover
	ProgramID   uint32            `json:"program_id"`
	LinkID      uint32            `json:"link_id"`
	OtherSockOp []OtherProgram    `json:"other_sock_ops"`
	Counters    map[string]uint64 `json:"counters"`
	Rules       []RuleStatus      `json:"rules"`
	Settings    []SettingStatus   `json:"settings"`
	Warnings    []string          `json:"warnings,omitempty"`
	// Leftover says what a crash left of the instance instead of a whole policy (the next
	// apply or remove cleans it; internal/attach); nothing else is set then but Name.
	Leftover string `json:"leftover,omitempty"`
}

// OtherProgram is another sock_ops program that runs for this cgroup's sockets (attached here
// or on an ancestor, multi-attach): it runs after ours and may override replies.
type OtherProgram struct {
	ID   uint32 `json:"id"`
	Name string `json:"name"`
}

// RuleStatus counts the connections a rule selected, per sampling arm.
type RuleStatus struct {
	Index      int    `json:"index"`
	Name       string `json:"name"`
	Profile    string `json:"profile"`
	Match      string `json:"match"`
	Treated    uint64 `json:"treated"`
	SampledOut uint64 `json:"sampled_out"`
}

// SettingStatus counts what the kernel accepted and refused for one setting.
type SettingStatus struct {
	Setting string        `json:"setting"`
	Applied uint64        `json:"applied"`
	Errors  []ErrnoStatus `json:"errors,omitempty"`
}

// ErrnoStatus is one kind of refusal.
type ErrnoStatus struct {
	Errno int    `json:"errno"`
	Name  string `json:"name"`
	Count uint64 `json:"count"`
}

// Describe renders a rule's match for people.
func (r *Rule) Describe() string {
	var parts []string
	if len(r.Remote) > 0 {
		parts = append(parts, "remote "+joinPrefixes(r.Remote))
	}
	if len(r.Local) > 0 {
		parts = append(parts, "local "+joinPrefixes(r.Local))
	}
	if r.RemotePort != match.AnyPort {
		parts = append(parts, "remote port "+r.RemotePort.String())
	}
	if r.LocalPort != match.AnyPort {
		parts = append(parts, "local port "+r.LocalPort.String())
	}
	if r.Dir != AnyDir {
		parts = append(parts, r.Dir.String())
	}
	if r.Sample < 1 {
		parts = append(parts, fmt.Sprintf("sample %g%%", r.Sample*100))
	}
	if len(parts) == 0 {
		return "every connection"
	}
	return strings.Join(parts, ", ")
}

// ReadStatus collects an applied instance's counters.
func ReadStatus(name string, k Kernel) (*Status, error) {
	if name == "" {
		name = DefaultName
	}
	if p, err := instance(name).Leftover(); err != nil {
		return nil, err
	} else if p != nil {
		return &Status{Name: name, Leftover: p.Why}, nil
	}
	rec, err := LoadRecord(name)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("policy %q: %w", name, ErrNotApplied)
	}
	if err != nil {
		return nil, err
	}
	st := &Status{Name: rec.Name, File: rec.File, Cgroup: cgroup.HostPath(rec.Cgroup), Applied: rec.Applied, OtherSockOp: []OtherProgram{},
		Counters: map[string]uint64{}, Settings: []SettingStatus{}}
	pol, err := Parse(rec.File, []byte(rec.YAML), k)
	if err != nil {
		return nil, fmt.Errorf("the applied policy no longer validates on this kernel: %w", err)
	}
	st.Warnings = pol.Warnings
	m, err := openPinned(name)
	if err != nil {
		return nil, err
	}
	defer m.Close()
	// The map, not the record, says which half of the tables is live.
	var gen uint32
	if err := m.TuneGen.Lookup(uint32(0), &gen); err != nil {
		return nil, fmt.Errorf("read the live generation: %w", err)
	}
	st.Generation = gen >> genShift
	if err := st.readLink(name, cgroup.Reach(rec.Cgroup)); err != nil {
		return nil, err
	}
	counts, err := stats.All(m.TuneStats)
	if err != nil {
		return nil, err
	}
	for i, n := range counts {
		st.Counters[statName(tuneTuneStat(i))] = n
	}
	rules := expand(pol.Rules)
	for i, r := range pol.Rules {
		st.Rules = append(st.Rules, RuleStatus{Index: i, Name: r.Name, Profile: r.Profile, Match: r.Describe()})
	}
	for j, cr := range rules {
		for arm := uint32(0); arm < 2; arm++ {
			n, err := stats.Sum(m.TuneHits, (st.Generation*maxRules+uint32(j))*2+arm)
			if err != nil {
				return nil, err
			}
			if arm == 0 {
				st.Rules[cr.logical].Treated += n
			} else {
				st.Rules[cr.logical].SampledOut += n
			}
		}
	}
	errs := map[Setting][]ErrnoStatus{}
	var ek tuneTuneErrKey
	var ev []uint64
	it := m.TuneErrors.Iterate()
	for it.Next(&ek, &ev) {
		n := stats.Total(ev)
		e := int(-ek.Err)
		errs[Setting(ek.Setting)] = append(errs[Setting(ek.Setting)], ErrnoStatus{Errno: e, Name: unix.ErrnoName(unix.Errno(e)), Count: n})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read refusals: %w", err)
	}
	for s := Setting(0); s < setMax; s++ {
		n, err := stats.Sum(m.TuneApplied, uint32(s))
		if err != nil {
			return nil, err
		}
		if n == 0 && len(errs[s]) == 0 {
			continue
		}
		e := errs[s]
		sort.Slice(e, func(i, j int) bool { return e[i].Errno < e[j].Errno })
		st.Settings = append(st.Settings, SettingStatus{Setting: s.String(), Applied: n, Errors: e})
	}
	return st, nil
}

func (st *Status) readLink(name, cgroup string) error {
	lnk, err := link.LoadPinnedLink(filepath.Join(pin.Path(pinParts(name)...), "link"), nil)
	if err != nil {
		return fmt.Errorf("open pinned link (is the policy attached?): %w", err)
	}
	defer lnk.Close()
	info, err := lnk.Info()
	if err != nil {
		return fmt.Errorf("link info: %w", err)
	}
	st.ProgramID, st.LinkID = uint32(info.Program), uint32(info.ID)
	f, err := os.Open(cgroup)
	if errors.Is(err, os.ErrNotExist) {
		// rmdir'd: the program stays attached while sockets made in the cgroup live on.
		st.Warnings = append(st.Warnings, fmt.Sprintf("cgroup %s is gone: the connections made in it keep the policy until they close; `flowplane tune remove --name %s` takes the policy away", cgroup, name))
		return nil
	}
	if err != nil {
		return fmt.Errorf("open cgroup: %w", err)
	}
	defer f.Close()
	q, err := link.QueryPrograms(link.QueryOptions{Target: int(f.Fd()), Attach: ebpf.AttachCGroupSockOps, QueryFlags: unix.BPF_F_QUERY_EFFECTIVE})
	if err != nil {
		return fmt.Errorf("query sock_ops programs of %s: %w", cgroup, err)
	}
	for _, p := range q.Programs {
		if uint32(p.ID) == st.ProgramID {
			continue
		}
		o := OtherProgram{ID: uint32(p.ID)}
		if prog, err := ebpf.NewProgramFromID(p.ID); err == nil {
			if pi, err := prog.Info(); err == nil {
				o.Name = pi.Name
			}
			prog.Close()
		}
		st.OtherSockOp = append(st.OtherSockOp, o)
	}
	return nil
}

func joinPrefixes(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, " ")
}

// statNames are the JSON names of enum tune_stat's counters.
var statNames = map[tuneTuneStat]string{
	tuneTuneStatTUNE_STAT_ACTIVE:      "active",
	tuneTuneStatTUNE_STAT_PASSIVE:     "passive",
	tuneTuneStatTUNE_STAT_MATCHED:     "matched",
	tuneTuneStatTUNE_STAT_SAMPLED_OUT: "sampled_out",
	tuneTuneStatTUNE_STAT_UNMATCHED:   "unmatched",
	tuneTuneStatTUNE_STAT_REACTED:     "reacted",
	tuneTuneStatTUNE_STAT_NO_STORAGE:  "no_storage",
	tuneTuneStatTUNE_STAT_RETRANS_CB:  "retrans_callbacks",
	tuneTuneStatTUNE_STAT_RTO_CB:      "rto_callbacks",
}

func statName(s tuneTuneStat) string {
	if n, ok := statNames[s]; ok {
		return n
	}
	return fmt.Sprintf("stat%d", s)
}
