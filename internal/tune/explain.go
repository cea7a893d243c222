package tune

import (
	"fmt"
	"io"
	"net/netip"
	"strings"
	"time"
)

// Value is one setting of a profile as the kernel will see it.
type Value struct {
	Setting string `json:"setting"`
	Value   string `json:"value"`  // as written, in real units
	Kernel  string `json:"kernel"` // what the program hands the kernel, and how
}

// Values lists the profile's settings with the exact values the kernel gets.
func (p *Profile) Values(k Kernel) []Value {
	var out []Value
	add := func(s Setting, v, kern string, args ...any) {
		if p.Set[s] {
			out = append(out, Value{Setting: s.String(), Value: v, Kernel: fmt.Sprintf(kern, args...)})
		}
	}
	j := k.Jiffies(p.SynRTO)
	add(SetSynRTO, p.SynRTO.String(), "TIMEOUT_INIT reply %d jiffies = %v (CONFIG_HZ=%d); SYN and SYN-ACK retransmit after it", j, time.Duration(j)*k.Jiffy(), k.HZ)
	add(SetInitRwnd, fmt.Sprintf("%d segments", p.InitRwnd), "RWND_INIT reply %d (the kernel takes at most the receive space)", p.InitRwnd)
	add(SetECN, "true", "NEEDS_ECN reply 1 (ECN negotiated in the handshake)")
	add(SetSndBuf, fmt.Sprintf("%d bytes", p.SndBuf), "SO_SNDBUF %d: sk_sndbuf = %d, autotuning off", p.SndBuf, 2*capTo(p.SndBuf, k.WmemMax))
	add(SetRcvBuf, fmt.Sprintf("%d bytes", p.RcvBuf), "SO_RCVBUF %d: sk_rcvbuf = %d, autotuning off", p.RcvBuf, 2*capTo(p.RcvBuf, k.RmemMax))
	add(SetInitCwnd, fmt.Sprintf("%d segments", p.InitCwnd), "TCP_BPF_IW %d when established", p.InitCwnd)
	add(SetCwndClamp, fmt.Sprintf("%d segments", p.CwndClamp), "TCP_BPF_SNDCWND_CLAMP %d when established (ssthresh too)", p.CwndClamp)
	add(SetCongestion, p.Congestion, "TCP_CONGESTION %q", p.Congestion)
	add(SetRTOMin, p.RTOMin.String(), "TCP_BPF_RTO_MIN %d µs = %d jiffies", p.RTOMin.Microseconds(), k.Jiffies(p.RTOMin))
	add(SetDelackMax, p.DelackMax.String(), "TCP_BPF_DELACK_MAX %d µs = %d jiffies", p.DelackMax.Microseconds(), k.Jiffies(p.DelackMax))
	add(SetRTOMax, p.RTOMax.String(), "TCP_RTO_MAX_MS %d", p.RTOMax.Milliseconds())
	add(SetPacing, fmt.Sprintf("%d bytes/s", p.MaxPacingRate), "SO_MAX_PACING_RATE %d", p.MaxPacingRate)
	add(SetMark, fmt.Sprint(p.Mark), "SO_MARK %#x", p.Mark)
	add(SetPriority, fmt.Sprint(p.Priority), "SO_PRIORITY %d", p.Priority)
	add(SetTOS, fmt.Sprintf("%#02x", p.TOS), "IP_TOS (IPv4) / IPV6_TCLASS (IPv6) %#02x", p.TOS)
	add(SetNotsentLowat, fmt.Sprintf("%d bytes", p.NotsentLowat), "TCP_NOTSENT_LOWAT %d", p.NotsentLowat)
	add(SetNodelay, fmt.Sprint(p.Nodelay), "TCP_NODELAY %d", b2i(p.Nodelay))
	add(SetWindowClamp, fmt.Sprintf("%d bytes", p.WindowClamp), "TCP_WINDOW_CLAMP %d", p.WindowClamp)
	add(SetMSS, fmt.Sprintf("%d bytes", p.MSS), "TCP_MAXSEG %d (before the SYN on active opens)", p.MSS)
	add(SetKeepalive, "on", "SO_KEEPALIVE 1")
	add(SetKeepIdle, p.KeepIdle.String(), "TCP_KEEPIDLE %d s", int(p.KeepIdle.Seconds()))
	add(SetKeepIntvl, p.KeepIntvl.String(), "TCP_KEEPINTVL %d s", int(p.KeepIntvl.Seconds()))
	add(SetKeepCnt, fmt.Sprint(p.KeepCnt), "TCP_KEEPCNT %d", p.KeepCnt)
	add(SetUserTimeout, p.UserTimeout.String(), "TCP_USER_TIMEOUT %d ms", p.UserTimeout.Milliseconds())
	when := p.reactWhen()
	add(SetReactCongestion, p.ReactCC, "TCP_CONGESTION %q %s", p.ReactCC, when)
	add(SetReactCwndClamp, fmt.Sprintf("%d segments", p.ReactCwndClamp), "TCP_BPF_SNDCWND_CLAMP %d %s", p.ReactCwndClamp, when)
	add(SetReactCallbacks, "on", "sock_ops callbacks enabled per connection for the reaction: %s", when)
	return out
}

func capTo(v uint32, lim int) uint32 {
	if lim > 0 && int(v) > lim {
		return uint32(lim)
	}
	return v
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Explanation is what `tune explain` prints.
type Explanation struct {
	Flow    Flow
	Rule    *Rule
	Index   int
	Treated bool
	Hash    uint32
	Profile *Profile
	Values  []Value
}

// Explain finds the rule for f and the exact values its profile gives.
func Explain(p *Policy, f Flow, k Kernel) Explanation {
	m := p.Match(f)
	e := Explanation{Flow: f, Index: m.Rule, Treated: m.Treated, Hash: flowHash(f)}
	if m.Rule < 0 {
		return e
	}
	e.Rule = p.Rules[m.Rule]
	e.Profile = p.Profiles[e.Rule.profile]
	e.Values = e.Profile.Values(k)
	return e
}

// Print writes the explanation for people.
func (e Explanation) Print(w io.Writer, localPortKnown bool) {
	f := e.Flow
	fmt.Fprintf(w, "connection: %s %s → %s\n", f.Dir, endpoint(f.Local, f.LocalPort), endpoint(f.Remote, f.RemotePort))
	if e.Rule == nil {
		fmt.Fprintln(w, "no rule matches: the connection is left untouched")
		return
	}
	fmt.Fprintf(w, "rule %d (%s, line %d): %s → profile %s\n", e.Index, e.Rule.Name, e.Rule.Line, e.Rule.Describe(), e.Rule.Profile)
	if !localPortKnown && !f.Local.IsValid() {
		fmt.Fprintln(w, "(no --local given: rules with a local prefix or port were taken as not matching)")
	}
	if e.Rule.Sample < 1 {
		switch {
		case !localPortKnown:
			fmt.Fprintf(w, "sampled: %g%% of flows, by hash of the 4-tuple; give --local ADDR:PORT to know this flow's arm\n", e.Rule.Sample*100)
		case e.Treated:
			fmt.Fprintf(w, "sampled: this flow (hash %#08x) is in the treated arm\n", e.Hash)
		default:
			fmt.Fprintf(w, "sampled: this flow (hash %#08x) is in the control arm: left untouched, counted as sampled_out\n", e.Hash)
			return
		}
	}
	width := 0
	for _, v := range e.Values {
		width = max(width, len(v.Setting))
	}
	for _, v := range e.Values {
		fmt.Fprintf(w, "  %-*s  %-14s  %s\n", width, v.Setting, v.Value, v.Kernel)
	}
	if len(e.Values) == 0 {
		fmt.Fprintln(w, "  (the profile sets nothing)")
	}
}

// endpoint is addr:port as ss writes it: [fd00::2]:8080, * for an address not given.
func endpoint(addr netip.Addr, port uint16) string {
	if !addr.IsValid() {
		return fmt.Sprintf("*:%d", port)
	}
	return netip.AddrPortFrom(addr, port).String()
}

func (p *Profile) reactWhen() string {
	var w []string
	if p.ReactOn&reactRetrans != 0 {
		w = append(w, fmt.Sprintf("after more than %d retransmitted segments (RETRANS callback)", p.ReactRetrans))
	}
	if p.ReactOn&reactRTO != 0 {
		w = append(w, fmt.Sprintf("after more than %d consecutive timeouts (RTO callback)", p.ReactRTOs))
	}
	return strings.Join(w, " or ")
}
