// Package tune tunes TCP per connection from a declarative policy: a sock_ops BPF program on a
// cgroup v2 picks the first rule matching a connection's addresses, ports and direction and
// applies its profile (SYN RTO, buffers, initial and clamped cwnd, congestion control, …),
// counting every value the kernel refuses. See docs/tune.md.
package tune

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/flowplane/flowplane/internal/config"
	"github.com/flowplane/flowplane/internal/match"
)

// Setting names one tunable; its value is the bit in a compiled profile and the key of the
// per-setting counters (enum tune_setting in bpf/tune/tune.h).
type Setting int

// The settings: enum tune_setting as bpf2go generates it from tune.h.
const (
	SetSynRTO          = Setting(tuneTuneSettingTUNE_SET_SYN_RTO)
	SetInitRwnd        = Setting(tuneTuneSettingTUNE_SET_INIT_RWND)
	SetECN             = Setting(tuneTuneSettingTUNE_SET_ECN)
	SetSndBuf          = Setting(tuneTuneSettingTUNE_SET_SNDBUF)
	SetRcvBuf          = Setting(tuneTuneSettingTUNE_SET_RCVBUF)
	SetInitCwnd        = Setting(tuneTuneSettingTUNE_SET_INIT_CWND)
	SetCwndClamp       = Setting(tuneTuneSettingTUNE_SET_CWND_CLAMP)
	SetCongestion      = Setting(tuneTuneSettingTUNE_SET_CONGESTION)
	SetRTOMin          = Setting(tuneTuneSettingTUNE_SET_RTO_MIN)
	SetDelackMax       = Setting(tuneTuneSettingTUNE_SET_DELACK_MAX)
	SetRTOMax          = Setting(tuneTuneSettingTUNE_SET_RTO_MAX)
	SetPacing          = Setting(tuneTuneSettingTUNE_SET_PACING)
	SetMark            = Setting(tuneTuneSettingTUNE_SET_MARK)
	SetPriority        = Setting(tuneTuneSettingTUNE_SET_PRIORITY)
	SetTOS             = Setting(tuneTuneSettingTUNE_SET_TOS)
	SetNotsentLowat    = Setting(tuneTuneSettingTUNE_SET_NOTSENT_LOWAT)
	SetNodelay         = Setting(tuneTuneSettingTUNE_SET_NODELAY)
	SetWindowClamp     = Setting(tuneTuneSettingTUNE_SET_WINDOW_CLAMP)
	SetMSS             = Setting(tuneTuneSettingTUNE_SET_MSS)
	SetKeepalive       = Setting(tuneTuneSettingTUNE_SET_KEEPALIVE)
	SetKeepIdle        = Setting(tuneTuneSettingTUNE_SET_KEEPIDLE)
	SetKeepIntvl       = Setting(tuneTuneSettingTUNE_SET_KEEPINTVL)
	SetKeepCnt         = Setting(tuneTuneSettingTUNE_SET_KEEPCNT)
	SetUserTimeout     = Setting(tuneTuneSettingTUNE_SET_USER_TIMEOUT)
	SetReactCongestion = Setting(tuneTuneSettingTUNE_SET_REACT_CONGESTION)
	SetReactCwndClamp  = Setting(tuneTuneSettingTUNE_SET_REACT_CWND_CLAMP)
	SetReactCallbacks  = Setting(tuneTuneSettingTUNE_SET_REACT_CALLBACKS)
	setMax             = Setting(tuneTuneSettingTUNE_SET_MAX)
)

var settingNames = [setMax]string{
	"syn_rto", "init_rwnd", "ecn", "snd_buf", "rcv_buf", "init_cwnd", "cwnd_clamp", "congestion",
	"rto_min", "delack_max", "rto_max", "max_pacing_rate", "mark", "priority", "tos",
	"notsent_lowat", "nodelay", "window_clamp", "mss", "keepalive", "keepalive.idle",
	"keepalive.interval", "keepalive.count", "user_timeout", "react.congestion", "react.cwnd_clamp", "react.callbacks",
}

func (s Setting) String() string {
	if s >= 0 && s < setMax {
		return settingNames[s]
	}
	return fmt.Sprintf("setting(%d)", int(s))
}

// Direction, PortRange and their values are internal/match's, which prio shares.
type (
	Direction = match.Direction
	PortRange = match.PortRange
)

// Directions, as bits (TUNE_DIR_* in tune.h).
const (
	Active  = match.Active
	Passive = match.Passive
	AnyDir  = match.AnyDir
)

// Profile is a named set of settings. Only settings in Set are applied.
type Profile struct {
	Name string
	Line int
	Set  map[Setting]bool

	SynRTO        time.Duration
	InitRwnd      uint32 // segments
	ECN           bool
	SndBuf        uint32 // bytes
	RcvBuf        uint32 // bytes
	InitCwnd      uint32 // segments
	CwndClamp     uint32 // segments
	Congestion    string
	RTOMin        time.Duration
	DelackMax     time.Duration
	RTOMax        time.Duration
	MaxPacingRate uint64 // bytes per second
	Mark          uint32
	Priority      uint32
	TOS           uint8
	NotsentLowat  uint32 // bytes
	Nodelay       bool
	WindowClamp   uint32 // bytes
	MSS           uint32 // bytes
	KeepIdle      time.Duration
	KeepIntvl     time.Duration
	KeepCnt       uint32
	UserTimeout   time.Duration

	// Reactive: once a connection has retransmitted more than ReactRetrans segments, or had
	// more than ReactRTOs consecutive retransmission timeouts, switch congestion control and/or
	// clamp cwnd. The RETRANS / RTO callbacks are enabled only for connections that need them.
	ReactOn        uint8 // reactRetrans | reactRTO
	ReactRetrans   uint32
	ReactRTOs      uint32
	ReactCC        string
	ReactCwndClamp uint32
}

// Reactive triggers (TUNE_REACT_* in tune.h).
const (
	reactRetrans = 1
	reactRTO     = 2
)

// Reactive reports whether the profile needs retransmission callbacks.
func (p *Profile) Reactive() bool { return p.Set[SetReactCongestion] || p.Set[SetReactCwndClamp] }

// Rule selects connections for a profile. Empty prefix lists match any address of either
// family; Sample (0, 1] treats that share of the selected flows, by flow hash.
type Rule struct {
	Name       string
	Line       int
	Remote     []netip.Prefix
	Local      []netip.Prefix
	RemotePort PortRange
	LocalPort  PortRange
	Dir        Direction
	Sample     float64 // 1 = every flow
	Profile    string
	profile    int
}

// Policy is a parsed, validated policy file.
type Policy struct {
	File     string
	Profiles []*Profile
	Rules    []*Rule
	Warnings []string
}

// ProfileIndex returns the index of the named profile, or -1.
func (p *Policy) ProfileIndex(name string) int {
	for i, pr := range p.Profiles {
		if pr.Name == name {
			return i
		}
	}
	return -1
}

// Error and Errors are the problems Parse reports, each with its line.
type (
	Error  = config.Error
	Errors = config.Errors
)
