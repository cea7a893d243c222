package tune

import (
	"encoding/binary"
	"math"
	"math/bits"
	"net/netip"
	"time"
)

// Sizes of the program's tables (TUNE_MAX_RULES, TUNE_MAX_PROFILES, TUNE_CC_LEN in tune.h);
// a test checks them against the map specs.
const (
	maxRules    = 1024
	words       = maxRules / 64
	maxProfiles = 256
	ccLen       = 16
)

// crule is one rule as the program holds it: a logical rule with one remote and one local
// prefix (invalid = any address of either family).
type crule struct {
	logical       int
	remote, local netip.Prefix
	rule          *Rule
}

// expand turns each rule's prefix lists into remote × local pairs, in rule order, dropping
// pairs of different families (they cannot match).
func expand(rules []*Rule) []crule {
	var out []crule
	for i, r := range rules {
		rs, ls := r.Remote, r.Local
		if len(rs) == 0 {
			rs = []netip.Prefix{{}}
		}
		if len(ls) == 0 {
			ls = []netip.Prefix{{}}
		}
		for _, a := range rs {
			for _, b := range ls {
				if a.IsValid() && b.IsValid() && a.Addr().Is4() != b.Addr().Is4() {
					continue
				}
				out = append(out, crule{logical: i, remote: a, local: b, rule: r})
			}
		}
	}
	return out
}

func expandedRules(rules []*Rule) int { return len(expand(rules)) }

type ruleset [words]uint64

func (s *ruleset) add(i int) { s[i/64] |= 1 << (i % 64) }

// nz is the ruleset's summary word (tune_ruleset.nz): bit i set when word i is not zero.
func (s *ruleset) nz() uint64 {
	var m uint64
	for i, w := range s {
		if w != 0 {
			m |= 1 << i
		}
	}
	return m
}

// first is the lowest rule of the set (tune_ruleset.first), -1 when it is empty.
func (s *ruleset) first() int32 {
	for i, w := range s {
		if w != 0 {
			return int32(i*64 + bits.TrailingZeros64(w))
		}
	}
	return -1
}

// value is the set as the program reads it (struct tune_ruleset).
func (s *ruleset) value() tuneTuneRuleset {
	return tuneTuneRuleset{First: s.first(), Nz: s.nz(), W: *s}
}

// trieEntry is one LPM entry: family (4/6), prefix, and the rules whose prefix contains it.
type trieEntry struct {
	prefix netip.Prefix
	rules  ruleset
}

func family(p netip.Prefix) uint8 {
	if p.Addr().Is4() {
		return 4
	}
	return 6
}

// buildTrie computes one side's LPM entries. The longest entry containing an address is
// nested in every rule prefix containing the address, so giving each entry the rules whose
// prefix contains the entry (plus the rules matching any address) makes one lookup answer
// "which rules contain this address". An address no entry contains gets anySet instead: the
// trie holds only the rules' own prefixes, so a lookup walks no nodes for catch-all entries.
func buildTrie(rules []crule, side func(crule) netip.Prefix) []trieEntry {
	seen := map[netip.Prefix]bool{}
	var entries []netip.Prefix
	for _, r := range rules {
		if p := side(r); p.IsValid() && !seen[p] {
			seen[p] = true
			entries = append(entries, p)
		}
	}
	out := make([]trieEntry, len(entries))
	for i, e := range entries {
		out[i].prefix = e
		for j, r := range rules {
			p := side(r)
			if !p.IsValid() || (family(p) == family(e) && p.Bits() <= e.Bits() && p.Contains(e.Addr())) {
				out[i].rules.add(j)
			}
		}
	}
	return out
}

// anySet is the rules without a prefix on a side (tune_side.any): those of an address that no
// entry of the side's trie contains.
func anySet(rules []crule, side func(crule) netip.Prefix) ruleset {
	var s ruleset
	for j, r := range rules {
		if !side(r).IsValid() {
			s.add(j)
		}
	}
	return s
}

// firstBytes returns tune_side.octets for a side's trie entries: bit n of [0] (IPv4) or [1]
// (IPv6) set when an entry covers addresses whose first byte is n.
func firstBytes(es []trieEntry) (o [2][4]uint64) {
	for _, e := range es {
		fam := 0
		if family(e.prefix) == 6 {
			fam = 1
		}
		free := 0xff >> min(e.prefix.Bits(), 8) // first-byte bits the prefix leaves open
		lo := int(e.prefix.Masked().Addr().AsSlice()[0])
		for b := lo; b <= lo|free; b++ {
			o[fam][b/64] |= 1 << (b % 64)
		}
	}
	return o
}

func lpmKey(gen uint8, p netip.Prefix) tuneTuneLpmKey {
	k := tuneTuneLpmKey{Prefixlen: uint32(16 + p.Bits()), Gen: gen, Family: family(p)}
	b := p.Addr().AsSlice()
	copy(k.Addr[:], b)
	return k
}

// compiled is a policy as map contents for one generation.
type compiled struct {
	rules    []crule
	bpfRules []tuneTuneRule
	profiles []tuneTuneProfile
	remote   []trieEntry
	local    []trieEntry
	any      [2]ruleset      // anySet per side (sideRemote, sideLocal)
	octets   [2][2][4]uint64 // firstBytes per side
	needs    uint32          // tune_gen without the generation: callbacks and flags
}

// tune_gen's value (tune.h): bit 1 << op for each callback (BPF_SOCK_OPS_*) the live policy
// needs (the program returns first thing from the others), the generation in the top bit, and
// flags.
const (
	needSynRTO = 1 << 1 // TIMEOUT_INIT
	needRwnd   = 1 << 2 // RWND_INIT
	needSocket = 1 << 3 // TCP_CONNECT_CB: socket options, set before an active open's SYN
	needECN    = 1 << 6 // NEEDS_ECN
	// Every policy needs the established callbacks (they count each connection) and RTO and
	// RETRANS, which run only on connections whose reactive settings enabled them: those keep
	// their reactions whatever policy is applied later.
	needAlways = 1<<4 | 1<<5 | 1<<8 | 1<<9

	genShift  = 31
	remoteAny = 1 << 30 // no rule has a remote prefix: the program skips that trie
	localAny  = 1 << 29 // same for local prefixes

	sideRemote = 0 // TUNE_SIDE_*: tune_sides' key is gen*2 + side
	sideLocal  = 1
)

// established reports whether s is made once the connection is established
// (TUNE_ESTABLISHED_SETTINGS in tune.h).
func established(s Setting) bool {
	return tuneTuneSettingTUNE_ESTABLISHED_SETTINGS&(1<<s) != 0
}

// socketOption reports whether s is a socket option apply_socket makes (TUNE_SOCKET_SETTINGS).
func socketOption(s Setting) bool {
	return tuneTuneSettingTUNE_SOCKET_SETTINGS&(1<<s) != 0
}

// settingNeed returns the tune_gen need bit of the pre-connection callback a setting is made
// at, or 0 for the established settings (the established callbacks always match: they count
// the connection) and the reactions (made from socket storage).
func settingNeed(s Setting) uint32 {
	switch {
	case s == SetSynRTO:
		return needSynRTO
	case s == SetInitRwnd:
		return needRwnd
	case s == SetECN:
		return needECN
	case socketOption(s):
		return needSocket
	}
	return 0
}

func compile(p *Policy) *compiled {
	c := &compiled{rules: expand(p.Rules), needs: needAlways}
	for _, r := range c.rules {
		c.bpfRules = append(c.bpfRules, tuneTuneRule{
			Sample:  sampleThreshold(r.rule.Sample),
			Profile: uint32(r.rule.profile),
			RportLo: r.rule.RemotePort.Lo, RportHi: r.rule.RemotePort.Hi,
			LportLo: r.rule.LocalPort.Lo, LportHi: r.rule.LocalPort.Hi,
			Dir: uint8(r.rule.Dir),
		})
	}
	for _, pr := range p.Profiles {
		c.profiles = append(c.profiles, bpfProfile(pr))
		for s, on := range pr.Set {
			if on {
				c.needs |= settingNeed(s)
			}
		}
	}
	remoteOf, localOf := func(r crule) netip.Prefix { return r.remote }, func(r crule) netip.Prefix { return r.local }
	c.remote, c.local = buildTrie(c.rules, remoteOf), buildTrie(c.rules, localOf)
	c.any = [2]ruleset{anySet(c.rules, remoteOf), anySet(c.rules, localOf)}
	c.octets = [2][2][4]uint64{firstBytes(c.remote), firstBytes(c.local)}
	c.needs |= anySide(c.rules, remoteOf, remoteAny)
	c.needs |= anySide(c.rules, localOf, localAny)
	return c
}

// anySide returns bit when no rule has a prefix on that side: the side's trie is then empty,
// every address has every rule, and the program skips looking it up.
func anySide(rules []crule, side func(crule) netip.Prefix, bit uint32) uint32 {
	for _, r := range rules {
		if side(r).IsValid() {
			return 0
		}
	}
	return bit
}

func sampleThreshold(share float64) uint64 {
	if share >= 1 {
		return 1 << 32
	}
	return uint64(math.Round(share * (1 << 32)))
}

func cstr(s string) (out [ccLen]int8) {
	for i := 0; i < len(s) && i < ccLen-1; i++ {
		out[i] = int8(s[i])
	}
	return out
}

func bpfProfile(p *Profile) tuneTuneProfile {
	var set uint32
	for s, on := range p.Set {
		if on {
			set |= 1 << uint(s)
		}
	}
	b := tuneTuneProfile{
		Congestion: cstr(p.Congestion), ReactCongestion: cstr(p.ReactCC), Set: set,
		SynRtoMs: uint32(p.SynRTO / time.Millisecond), InitRwnd: p.InitRwnd, InitCwnd: p.InitCwnd,
		CwndClamp: p.CwndClamp, SndBuf: p.SndBuf, RcvBuf: p.RcvBuf,
		RtoMinUs: uint32(p.RTOMin / time.Microsecond), DelackMaxUs: uint32(p.DelackMax / time.Microsecond),
		RtoMaxMs: uint32(p.RTOMax / time.Millisecond), MaxPacingRate: uint32(p.MaxPacingRate),
		Mark: p.Mark, Priority: p.Priority, NotsentLowat: p.NotsentLowat, WindowClamp: p.WindowClamp,
		Mss: p.MSS, KeepIdle: uint32(p.KeepIdle / time.Second), KeepIntvl: uint32(p.KeepIntvl / time.Second),
		KeepCnt: p.KeepCnt, UserTimeoutMs: uint32(p.UserTimeout / time.Millisecond),
		ReactRetrans: p.ReactRetrans, ReactRtos: p.ReactRTOs, ReactCwndClamp: p.ReactCwndClamp, Tos: p.TOS,
		ReactOn: p.ReactOn,
	}
	if p.Nodelay {
		b.Nodelay = 1
	}
	return b
}

// Flow is a connection as rules see it.
type Flow struct {
	Remote, Local         netip.Addr
	RemotePort, LocalPort uint16
	Dir                   Direction
}

// normalize turns IPv4-mapped addresses into IPv4, as the program does.
func (f Flow) normalize() Flow {
	f.Remote, f.Local = f.Remote.Unmap(), f.Local.Unmap()
	if !f.Local.IsValid() {
		if f.Remote.Is4() {
			f.Local = netip.IPv4Unspecified()
		} else {
			f.Local = netip.IPv6Unspecified()
		}
	}
	return f
}

func words4(a netip.Addr) [4]uint32 {
	var w [4]uint32
	b := a.AsSlice()
	for i := 0; i*4 < len(b); i++ {
		w[i] = binary.LittleEndian.Uint32(b[i*4:]) // the program reads network-order bytes on a little-endian CPU
	}
	return w
}

func mix(h, w uint32) uint32 {
	w *= 0xcc9e2d51
	w = bits.RotateLeft32(w, 15)
	w *= 0x1b873593
	h ^= w
	h = bits.RotateLeft32(h, 13)
	return h*5 + 0xe6546b64
}

// flowHash is the program's flow_hash: sampling is decided by it, so explain can tell the arm.
func flowHash(f Flow) uint32 {
	f = f.normalize()
	h := uint32(0x666c6f77)
	for _, w := range words4(f.Remote) {
		h = mix(h, w)
	}
	for _, w := range words4(f.Local) {
		h = mix(h, w)
	}
	h = mix(h, uint32(f.RemotePort)<<16|uint32(f.LocalPort))
	h ^= h >> 16
	h *= 0x85ebca6b
	h ^= h >> 13
	h *= 0xc2b2ae35
	h ^= h >> 16
	return h
}

// Match is the rule a flow selects: Rule is -1 when none does; Treated is false when the rule
// samples and this flow fell in the control arm.
type Match struct {
	Rule    int
	Treated bool
}

// Match finds the first rule selecting f, as the program does.
func (p *Policy) Match(f Flow) Match {
	f = f.normalize()
	for i, r := range p.Rules {
		if r.Dir&f.Dir == 0 || !r.RemotePort.Contains(f.RemotePort) || !r.LocalPort.Contains(f.LocalPort) {
			continue
		}
		if !anyContains(r.Remote, f.Remote) || !anyContains(r.Local, f.Local) {
			continue
		}
		return Match{Rule: i, Treated: uint64(flowHash(f)) < sampleThreshold(r.Sample)}
	}
	return Match{Rule: -1}
}

func anyContains(ps []netip.Prefix, a netip.Addr) bool {
	if len(ps) == 0 {
		return true
	}
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// lookup simulates the program on the compiled tables (tests hold it against Policy.Match).
func (c *compiled) lookup(f Flow) int {
	f = f.normalize()
	find := func(es []trieEntry, octets [2][4]uint64, a netip.Addr, none *ruleset) *ruleset {
		fam, b := 0, a.AsSlice()[0]
		if a.Is6() {
			fam = 1
		}
		if octets[fam][b/64]&(1<<(b%64)) == 0 {
			return none
		}
		var best *trieEntry
		for i := range es {
			e := &es[i]
			if family(e.prefix) == family(netip.PrefixFrom(a, 0)) && e.prefix.Contains(a) && (best == nil || e.prefix.Bits() > best.prefix.Bits()) {
				best = e
			}
		}
		if best == nil {
			return none
		}
		return &best.rules
	}
	// as the program: a side no rule constrains is not looked up
	var rs, ls *ruleset
	if c.needs&remoteAny == 0 {
		rs = find(c.remote, c.octets[sideRemote], f.Remote, &c.any[sideRemote])
	}
	if c.needs&localAny == 0 {
		ls = find(c.local, c.octets[sideLocal], f.Local, &c.any[sideLocal])
	}
	if rs == nil && ls == nil {
		rs = &c.any[sideRemote]
	}
	if rs == nil {
		rs = ls
	}
	if ls == nil {
		ls = rs
	}
	selects := func(i int) bool {
		r := c.bpfRules[i]
		return uint8(f.Dir)&r.Dir != 0 && f.RemotePort >= r.RportLo && f.RemotePort <= r.RportHi &&
			f.LocalPort >= r.LportLo && f.LocalPort <= r.LportHi
	}
	// as the program: both sets starting with the same rule that selects the flow answer
	// without a scan
	if i := rs.first(); i >= 0 && i == ls.first() && selects(int(i)) {
		return c.rules[i].logical
	}
	for nz := rs.nz() & ls.nz(); nz != 0; nz &= nz - 1 {
		w := bits.TrailingZeros64(nz)
		b := rs[w] & ls[w]
		for b != 0 {
			i := w*64 + bits.TrailingZeros64(b)
			if selects(i) {
				return c.rules[i].logical
			}
			b &= b - 1
		}
	}
	return -1
}
