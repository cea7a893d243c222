package tune

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/flowplane/flowplane/internal/config"
	"github.com/flowplane/flowplane/internal/match"
	"github.com/flowplane/flowplane/internal/units"
)

// Kernel is what validation checks a policy against: the running kernel's tick rate and
// congestion controls, and the buffer caps that bound SO_SNDBUF / SO_RCVBUF.
type Kernel struct {
	HZ         int      // CONFIG_HZ
	Congestion []string // tcp_available_congestion_control
	WmemMax    int      // net.core.wmem_max (0: unknown)
	RmemMax    int      // net.core.rmem_max (0: unknown)
}

// Jiffy is one tick of the kernel's clock.
func (k Kernel) Jiffy() time.Duration { return time.Second / time.Duration(k.HZ) }

// Jiffies rounds d up to whole ticks, as the program does for syn_rto and the kernel's
// usecs_to_jiffies for rto_min and delack_max.
func (k Kernel) Jiffies(d time.Duration) int {
	return int((d.Microseconds()*int64(k.HZ) + 999999) / 1000000)
}

// The decoder walks yaml.v3's node tree so every message carries a line number and unknown
// keys list the known ones (the pattern of internal/topo).

// Parse reads and validates a policy against kernel k. The error is Errors when the file has
// problems; nothing is half-accepted.
func Parse(file string, data []byte, k Kernel) (*Policy, error) {
	el := &config.Collector{File: file}
	p := decode(el, data, k)
	if len(el.Errs) > 0 {
		return nil, el.Errs
	}
	p.File = file
	p.Warnings = el.Warnings
	return p, nil
}

// The keys of a policy, per level (a profile's: profileKeys). The decoder refuses any other key,
// and docs_test.go checks that docs/tune.md documents each.
var (
	policyKeys    = []string{"profiles", "rules"}
	ruleKeys      = []string{"name", "match", "profile"}
	matchKeys     = append(slices.Clone(match.Keys), "sample")
	keepaliveKeys = []string{"idle", "interval", "count"}
	reactKeys     = []string{"retransmissions_above", "timeouts_above", "congestion", "cwnd_clamp"}
)

func decode(el *config.Collector, data []byte, k Kernel) *Policy {
	root := el.Root(data, "a policy needs profiles and rules (see docs/tune.md)")
	if root == nil {
		return nil
	}
	p := &Policy{}
	var rulesNode *yaml.Node
	el.EachKey(root, "", policyKeys, func(key string, v *yaml.Node) {
		switch key {
		case "profiles":
			p.Profiles = decodeProfiles(el, v, k)
		case "rules":
			rulesNode = v
		}
	})
	if root.Kind != yaml.MappingNode {
		return nil
	}
	if !config.HasKey(root, "profiles") {
		el.Add(root.Line, "profiles", "missing; name the settings, e.g. profiles: {dc: {cwnd_clamp: 100}}")
	}
	if rulesNode == nil {
		el.Add(root.Line, "rules", "missing; list matches in order, e.g. rules: [{match: {remote: 10.0.0.0/8}, profile: dc}]")
		return p
	}
	p.Rules = decodeRules(el, rulesNode, p)
	return p
}

// --- profiles ---

var profileKeys = []string{"syn_rto", "init_rwnd", "ecn", "snd_buf", "rcv_buf", "init_cwnd", "cwnd_clamp",
	"congestion", "rto_min", "delack_max", "rto_max", "max_pacing_rate", "mark", "priority", "tos", "tclass",
	"notsent_lowat", "nodelay", "window_clamp", "mss", "keepalive", "user_timeout", "react"}

// routeMetrics answers for every TCP-related metric `ip route` accepts: what the policy calls
// it, or why it cannot be set per connection and what comes closest.
var routeMetrics = map[string]string{
	"initcwnd":           "is ip route's name; write init_cwnd (segments, set with TCP_BPF_IW)",
	"initrwnd":           "is ip route's name; write init_rwnd (segments, the initial receive window)",
	"congctl":            "is ip route's name; write congestion: <name>",
	"features":           "ip route's only feature is ecn; write ecn: true",
	"advmss":             "is ip route's name; write mss (bytes, TCP_MAXSEG): it caps the MSS advertised on active opens and the segments sent",
	"window":             "is ip route's name; write window_clamp (bytes, TCP_WINDOW_CLAMP), which bounds the advertised window the same way",
	"cwnd":               "ip route applies cwnd only with lock, as a clamp; write cwnd_clamp (segments, TCP_BPF_SNDCWND_CLAMP)",
	"quickack":           "cannot be set from BPF (bpf_setsockopt refuses TCP_QUICKACK); closest: delack_max at its minimum of 2 jiffies",
	"ssthresh":           "has no BPF setter for the initial value; closest: cwnd_clamp, which also sets ssthresh to the clamp",
	"rtt":                "the initial RTT estimate has no BPF setter; closest: syn_rto (the RTO used before the first RTT sample)",
	"rttvar":             "the initial RTT variance has no BPF setter; closest: syn_rto (the RTO used before the first RTT sample)",
	"mtu":                "the path MTU belongs to the route, not the socket; closest: mss",
	"reordering":         "has no per-socket setter (net.ipv4.tcp_reordering is per namespace); nothing closer per connection",
	"hoplimit":           "is not a TCP setting and bpf_setsockopt refuses IP_TTL; keep it on the route",
	"fastopen_no_cookie": "bpf_setsockopt refuses TCP_FASTOPEN_NO_COOKIE; keep it on the route",
	"lock":               "locks route metrics against updates; a policy value always applies, so there is nothing to lock",
}

func decodeProfiles(el *config.Collector, v *yaml.Node, k Kernel) []*Profile {
	if v.Kind != yaml.MappingNode {
		el.Add(v.Line, "profiles", "must be a mapping of profile name to settings, e.g. {dc: {cwnd_clamp: 100}}")
		return nil
	}
	var out []*Profile
	for i := 0; i+1 < len(v.Content); i += 2 {
		kn, val := v.Content[i], v.Content[i+1]
		field := "profiles." + kn.Value
		if !nameRE.MatchString(kn.Value) {
			el.Add(kn.Line, field, "profile name %q must be letters, digits, '-' or '_', starting with a letter", kn.Value)
		}
		for _, o := range out {
			if o.Name == kn.Value {
				el.Add(kn.Line, field, "profile %q defined twice (first on line %d)", kn.Value, o.Line)
			}
		}
		p := &Profile{Name: kn.Value, Line: kn.Line, Set: map[Setting]bool{}}
		decodeProfile(el, val, field, p, k)
		out = append(out, p)
	}
	if len(out) > maxProfiles {
		el.Add(v.Line, "profiles", "%d profiles; the program holds at most %d", len(out), maxProfiles)
	}
	return out
}

var nameRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_-]*$`)

func decodeProfile(el *config.Collector, v *yaml.Node, field string, p *Profile, k Kernel) {
	if v.Kind == yaml.MappingNode {
		// ip route's metric names get their own answer instead of "unknown key".
		kept := *v
		kept.Content = nil
		for i := 0; i+1 < len(v.Content); i += 2 {
			key := v.Content[i]
			if msg, ok := routeMetrics[key.Value]; ok {
				el.Add(key.Line, field+"."+key.Value, "%s", msg)
				continue
			}
			kept.Content = append(kept.Content, v.Content[i], v.Content[i+1])
		}
		v = &kept
	}
	d := &dec{el: el, k: k}
	el.EachKey(v, field, profileKeys, func(key string, kv *yaml.Node) {
		f := field + "." + key
		set := func(s Setting) { p.Set[s] = true }
		switch key {
		case "syn_rto":
			if dur, ok := d.duration(kv, f, time.Millisecond, 120*time.Second); ok {
				p.SynRTO = dur
				set(SetSynRTO)
				d.warnJiffies(kv, f, dur)
			}
		case "init_rwnd":
			if n, ok := d.count(kv, f, 1, 65535, "segments"); ok {
				p.InitRwnd = n
				set(SetInitRwnd)
			}
		case "ecn":
			if b, ok := d.el.Bool(kv, f); ok {
				p.ECN = b
				if b {
					set(SetECN)
				}
			}
		case "snd_buf", "rcv_buf":
			if n, ok := d.bytes(kv, f, 2304, math.MaxInt32/2); ok {
				lim, sysctl := k.WmemMax, "net.core.wmem_max"
				if key == "snd_buf" {
					p.SndBuf = n
					set(SetSndBuf)
				} else {
					p.RcvBuf = n
					set(SetRcvBuf)
					lim, sysctl = k.RmemMax, "net.core.rmem_max"
				}
				el.Warn(kv.Line, f, "a fixed buffer switches off the kernel's autotuning for these connections; the kernel allocates twice the value (%d bytes) for overhead", 2*n)
				if lim > 0 && int(n) > lim {
					el.Warn(kv.Line, f, "%d bytes is above %s=%d: the kernel caps it there", n, sysctl, lim)
				}
			}
		case "init_cwnd":
			if n, ok := d.count(kv, f, 1, 65535, "segments"); ok {
				p.InitCwnd = n
				set(SetInitCwnd)
			}
		case "cwnd_clamp":
			if n, ok := d.count(kv, f, 1, 1<<30, "segments"); ok {
				p.CwndClamp = n
				set(SetCwndClamp)
			}
		case "congestion":
			if s, ok := d.congestion(kv, f); ok {
				p.Congestion = s
				set(SetCongestion)
			}
		case "rto_min", "delack_max":
			lo := 2 * k.Jiffy() // TCP_TIMEOUT_MIN
			if dur, ok := d.duration(kv, f, lo, 200*time.Millisecond); ok {
				d.warnJiffies(kv, f, dur) // the kernel rounds up with usecs_to_jiffies
				if key == "rto_min" {
					p.RTOMin = dur
					set(SetRTOMin)
				} else {
					p.DelackMax = dur
					set(SetDelackMax)
				}
			}
		case "rto_max":
			if dur, ok := d.duration(kv, f, time.Second, 120*time.Second); ok {
				p.RTOMax = dur
				set(SetRTOMax)
			}
		case "max_pacing_rate":
			if s, ok := el.Scalar(kv, f); ok {
				bps, err := units.ParseRate(s)
				switch {
				case err != nil:
					el.Add(kv.Line, f, "%v", err)
				case bps/8 == 0 || bps/8 >= math.MaxUint32:
					el.Add(kv.Line, f, "%s is outside what SO_MAX_PACING_RATE takes: 8bit to %s", s, units.FormatRate((math.MaxUint32-1)*8))
				default:
					p.MaxPacingRate = bps / 8
					set(SetPacing)
				}
			}
		case "mark":
			if n, ok := d.count(kv, f, 0, math.MaxUint32, ""); ok {
				p.Mark = n
				set(SetMark)
			}
		case "priority":
			if n, ok := d.count(kv, f, 0, math.MaxUint32, ""); ok {
				p.Priority = n
				set(SetPriority)
			}
		case "tos", "tclass":
			if p.Set[SetTOS] {
				el.Add(kv.Line, f, "tos and tclass are one setting (IP_TOS on IPv4, IPV6_TCLASS on IPv6); give one")
			}
			if n, ok := d.count(kv, f, 0, 255, ""); ok {
				p.TOS = uint8(n)
				set(SetTOS)
			}
		case "notsent_lowat":
			if n, ok := d.bytes(kv, f, 1, math.MaxInt32); ok {
				p.NotsentLowat = n
				set(SetNotsentLowat)
			}
		case "nodelay":
			if b, ok := d.el.Bool(kv, f); ok {
				p.Nodelay = b
				set(SetNodelay)
			}
		case "window_clamp":
			if n, ok := d.bytes(kv, f, 2304, math.MaxInt32); ok {
				p.WindowClamp = n
				set(SetWindowClamp)
			}
		case "mss":
			if n, ok := d.bytes(kv, f, 88, 32767); ok { // TCP_MIN_MSS .. MAX_TCP_WINDOW
				p.MSS = n
				set(SetMSS)
			}
		case "keepalive":
			decodeKeepalive(d, kv, f, p)
		case "user_timeout":
			if dur, ok := d.duration(kv, f, 0, math.MaxInt32*time.Millisecond); ok {
				p.UserTimeout = dur
				set(SetUserTimeout)
			}
		case "react":
			decodeReact(d, kv, f, p)
		}
	})
}

func decodeKeepalive(d *dec, v *yaml.Node, field string, p *Profile) {
	p.Set[SetKeepalive] = true
	d.el.EachKey(v, field, keepaliveKeys, func(key string, kv *yaml.Node) {
		f := field + "." + key
		switch key {
		case "idle", "interval":
			dur, ok := d.duration(kv, f, time.Second, 32767*time.Second) // MAX_TCP_KEEPIDLE/KEEPINTVL
			if !ok {
				return
			}
			if dur%time.Second != 0 {
				d.el.Add(kv.Line, f, "%v: the kernel takes whole seconds", dur)
				return
			}
			if key == "idle" {
				p.KeepIdle = dur
				p.Set[SetKeepIdle] = true
			} else {
				p.KeepIntvl = dur
				p.Set[SetKeepIntvl] = true
			}
		case "count":
			if n, ok := d.count(kv, f, 1, 127, "probes"); ok { // MAX_TCP_KEEPCNT
				p.KeepCnt = n
				p.Set[SetKeepCnt] = true
			}
		}
	})
}

func decodeReact(d *dec, v *yaml.Node, field string, p *Profile) {
	d.el.EachKey(v, field, reactKeys, func(key string, kv *yaml.Node) {
		f := field + "." + key
		switch key {
		case "retransmissions_above":
			if n, ok := d.count(kv, f, 0, math.MaxInt32, "segments"); ok {
				p.ReactRetrans = n
				p.ReactOn |= reactRetrans
			}
		case "timeouts_above":
			if n, ok := d.count(kv, f, 0, 255, "consecutive RTOs"); ok {
				p.ReactRTOs = n
				p.ReactOn |= reactRTO
			}
		case "congestion":
			if s, ok := d.congestion(kv, f); ok {
				p.ReactCC = s
				p.Set[SetReactCongestion] = true
			}
		case "cwnd_clamp":
			if n, ok := d.count(kv, f, 1, 1<<30, "segments"); ok {
				p.ReactCwndClamp = n
				p.Set[SetReactCwndClamp] = true
			}
		}
	})
	if p.ReactOn == 0 {
		d.el.Add(v.Line, field, "says what but not when; give retransmissions_above: N and/or timeouts_above: N")
	}
	if !p.Reactive() {
		d.el.Add(v.Line, field, "says when but not what; give congestion and/or cwnd_clamp")
	}
	if p.ReactOn != 0 {
		p.Set[SetReactCallbacks] = true
	}
}

// dec parses scalar values with their units and kernel ranges.
type dec struct {
	el *config.Collector
	k  Kernel
}

func (d *dec) count(v *yaml.Node, f string, lo, hi uint64, unit string) (uint32, bool) {
	s, ok := d.el.Scalar(v, f)
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseUint(s, 0, 64)
	if err != nil || n < lo || n > hi {
		d.el.Add(v.Line, f, "%q is not a whole number from %d to %d %s", s, lo, hi, unit)
		return 0, false
	}
	return uint32(n), true
}

var byteRE = regexp.MustCompile(`^([0-9]+)\s*([a-z]*)$`)

var byteUnits = map[string]uint64{"": 1, "b": 1, "kb": 1000, "mb": 1000 * 1000, "kib": 1024, "mib": 1024 * 1024, "k": 1024, "m": 1024 * 1024}

func (d *dec) bytes(v *yaml.Node, f string, lo, hi uint64) (uint32, bool) {
	s, ok := d.el.Scalar(v, f)
	if !ok {
		return 0, false
	}
	m := byteRE.FindStringSubmatch(strings.ToLower(strings.TrimSpace(s)))
	mult, known := uint64(0), false
	if m != nil {
		mult, known = byteUnits[m[2]]
	}
	if !known {
		d.el.Add(v.Line, f, "%q is not a size in bytes; write e.g. 1460, 150KB, 256KiB or 4MiB", s)
		return 0, false
	}
	n, _ := strconv.ParseUint(m[1], 10, 64)
	n *= mult
	if n < lo || n > hi {
		d.el.Add(v.Line, f, "%s (%d bytes) is outside the kernel's range %d to %d bytes", s, n, lo, hi)
		return 0, false
	}
	return uint32(n), true
}

// duration reads "10ms", "1s", "1.5s" or a bare number of milliseconds.
// warnJiffies warns when the kernel will round dur up to whole jiffies.
func (d *dec) warnJiffies(v *yaml.Node, f string, dur time.Duration) {
	if int64(d.k.Jiffies(dur))*int64(time.Second) != int64(dur)*int64(d.k.HZ) {
		d.el.Warn(v.Line, f, "%v is not a whole number of jiffies (CONFIG_HZ=%d, 1 jiffy = %v); the kernel uses %v",
			dur, d.k.HZ, d.k.Jiffy(), time.Duration(d.k.Jiffies(dur))*d.k.Jiffy())
	}
}

func (d *dec) duration(v *yaml.Node, f string, lo, hi time.Duration) (time.Duration, bool) {
	s, ok := d.el.Scalar(v, f)
	if !ok {
		return 0, false
	}
	dur, err := units.ParseDuration(s)
	if err != nil && !errors.Is(err, units.ErrDurationRange) {
		var ms uint64
		ms, err = strconv.ParseUint(s, 10, 32) // a bare number is milliseconds
		dur = time.Duration(ms) * time.Millisecond
	}
	switch {
	case errors.Is(err, units.ErrDurationRange) || errors.Is(err, strconv.ErrRange):
		d.el.Add(v.Line, f, "%q is outside the kernel's range %v to %v (CONFIG_HZ=%d)", s, lo, hi, d.k.HZ)
		return 0, false
	case err != nil:
		d.el.Add(v.Line, f, "%q is not a duration; write e.g. 10ms or 1s (a bare number is milliseconds)", s)
		return 0, false
	}
	if dur < lo || dur > hi {
		d.el.Add(v.Line, f, "%v is outside the kernel's range %v to %v (CONFIG_HZ=%d)", dur, lo, hi, d.k.HZ)
		return 0, false
	}
	if dur%time.Millisecond != 0 && lo >= time.Millisecond {
		d.el.Add(v.Line, f, "%v: give whole milliseconds", dur)
		return 0, false
	}
	return dur, true
}

func (d *dec) congestion(v *yaml.Node, f string) (string, bool) {
	s, ok := d.el.Scalar(v, f)
	if !ok {
		return "", false
	}
	if len(s) >= ccLen {
		d.el.Add(v.Line, f, "%q is longer than a congestion control name can be (%d bytes)", s, ccLen-1)
		return "", false
	}
	if !slices.Contains(d.k.Congestion, s) {
		d.el.Add(v.Line, f, "%q is not in tcp_available_congestion_control (%s); the program cannot load modules",
			s, strings.Join(d.k.Congestion, " "))
		return "", false
	}
	return s, true
}

// --- rules ---

func decodeRules(el *config.Collector, v *yaml.Node, p *Policy) []*Rule {
	if v.Kind != yaml.SequenceNode {
		el.Add(v.Line, "rules", "must be a list, first match wins, e.g. [{match: {remote: 10.0.0.0/8}, profile: dc}]")
		return nil
	}
	if len(v.Content) == 0 {
		el.Warn(v.Line, "rules", "empty: the policy tunes no connection (flowplane tune remove takes a policy away)")
	}
	var rules []*Rule
	for i, rv := range v.Content {
		field := fmt.Sprintf("rules[%d]", i)
		r := &Rule{Line: rv.Line, RemotePort: match.AnyPort, LocalPort: match.AnyPort, Dir: AnyDir, Sample: 1, profile: -1}
		el.EachKey(rv, field, ruleKeys, func(key string, kv *yaml.Node) {
			f := field + "." + key
			switch key {
			case "name":
				if s, ok := el.Scalar(kv, f); ok {
					r.Name = s
				}
			case "profile":
				if s, ok := el.Scalar(kv, f); ok {
					r.Profile = s
					if r.profile = p.ProfileIndex(s); r.profile < 0 {
						names := make([]string, len(p.Profiles))
						for j, pr := range p.Profiles {
							names[j] = pr.Name
						}
						el.Add(kv.Line, f, "no profile named %q; profiles: %s", s, strings.Join(names, ", "))
					}
				}
			case "match":
				decodeMatch(el, kv, f, r)
			}
		})
		if rv.Kind == yaml.MappingNode && !config.HasKey(rv, "profile") {
			el.Add(rv.Line, field+".profile", "missing; name the profile this rule applies")
		}
		if r.Name == "" {
			r.Name = fmt.Sprintf("rule%d", i)
		}
		rules = append(rules, r)
	}
	if n := expandedRules(rules); n > maxRules {
		el.Add(v.Line, "rules", "%d rules after expanding prefix lists (remote × local); the program holds at most %d", n, maxRules)
	}
	return rules
}

func decodeMatch(el *config.Collector, v *yaml.Node, field string, r *Rule) {
	m := match.Match{RemotePort: r.RemotePort, LocalPort: r.LocalPort, Dir: r.Dir}
	el.EachKey(v, field, matchKeys, func(key string, kv *yaml.Node) {
		f := field + "." + key
		if m.DecodeKey(el, key, kv, f) {
			return
		}
		// sample
		if s, ok := el.Scalar(kv, f); ok {
			pct, err := units.ParsePercent(s)
			if err != nil || pct <= 0 {
				el.Add(kv.Line, f, "%q is not a share of flows above 0%%, e.g. 10%%", s)
				return
			}
			r.Sample = pct / 100
		}
	})
	m.CheckFamilies(el, v.Line, field)
	r.Remote, r.Local, r.RemotePort, r.LocalPort, r.Dir = m.Remote, m.Local, m.RemotePort, m.LocalPort, m.Dir
}
