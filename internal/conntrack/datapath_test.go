package conntrack

import (
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/gopacket/gopacket/layers"

	"github.com/flowplane/flowplane/internal/packet"
)

// XDP verdicts.
const (
	xdpDrop     = 1
	xdpPass     = 2
	xdpRedirect = 4
)

// step is one packet of a scripted exchange and what must follow from it.
type step struct {
	name  string
	frame []byte
	out   bool   // arrives on the outside interface (else inside)
	ret   uint32 // XDP verdict
	state string // state of the connection afterwards ("" = don't check, "-" = no entry)
	count string // a counter that this packet must increment
	key   *Entry // which connection "state" refers to (default: the only one)
}

func (f *fixture) script(t *testing.T, steps []step) {
	t.Helper()
	for i, s := range steps {
		ok := t.Run(fmt.Sprintf("%02d_%s", i, s.name), func(t *testing.T) {
			before := f.counters()
			ifindex := f.in.Index
			if s.out {
				ifindex = f.out.Index
			}
			ret, _ := f.run(s.frame, ifindex)
			if ret != s.ret {
				t.Errorf("verdict %d, want %d (counters %v)", ret, s.ret, diff(before, f.counters()))
			}
			if s.count != "" {
				if after := f.counters(); after[s.count] != before[s.count]+1 {
					t.Errorf("counter %s: %d → %d, want +1 (changes %v)", s.count, before[s.count], after[s.count], diff(before, after))
				}
			}
			if s.state != "" {
				got := "-"
				es := f.entries()
				if len(es) > 1 && s.key == nil {
					t.Fatalf("%d entries, want one: %+v", len(es), es)
				}
				for _, e := range es {
					if s.key == nil || (e.Proto == s.key.Proto && e.Orig == s.key.Orig) {
						got = e.State
					}
				}
				if got != s.state {
					t.Errorf("state %s, want %s", got, s.state)
				}
			}
		})
		if !ok {
			t.FailNow() // later steps build on this one's state
		}
	}
}

func diff(a, b Counters) map[string]int64 {
	d := map[string]int64{}
	for k, v := range b {
		if v != a[k] {
			d[k] = int64(v) - int64(a[k])
		}
	}
	return d
}

// tcp builds a TCP segment; c2s is client (inside) to server (outside).
func tcp(c2s bool, flags string, seq, ack uint32, payload int) []byte {
	b := packet.IP(outHost, inHost).TCP(80, 40000, flags)
	if c2s {
		b = packet.IP(inHost, outHost).TCP(40000, 80, flags)
	}
	b = b.Seq(seq).Ack(ack)
	if payload > 0 {
		b = b.Payload(make([]byte, payload))
	}
	return b.Bytes()
}

func tcpOpen(c2s bool, flags string, seq, ack uint32) []byte {
	b := packet.IP(outHost, inHost).TCP(80, 40000, flags)
	if c2s {
		b = packet.IP(inHost, outHost).TCP(40000, 80, flags)
	}
	return b.Seq(seq).Ack(ack).MSS(1460).WScale(7).Bytes()
}

// handshake opens client 40000 → server 80 with the given ISNs.
func handshake(ci, si uint32) []step {
	return []step{
		{name: "syn", frame: tcpOpen(true, "S", ci, 0), ret: xdpRedirect, state: "SYN_SENT", count: "new"},
		{name: "synack", frame: tcpOpen(false, "SA", si, ci+1), out: true, ret: xdpRedirect, state: "SYN_RECV", count: "established"},
		{name: "ack", frame: tcp(true, "A", ci+1, si+1, 0), ret: xdpRedirect, state: "ESTABLISHED"},
	}
}

func TestTCPLifecycle(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	ci, si := uint32(1000), uint32(5000)
	steps := handshake(ci, si)
	steps = append(steps,
		step{name: "data c2s", frame: tcp(true, "PA", ci+1, si+1, 100), ret: xdpRedirect, state: "ESTABLISHED"},
		step{name: "data s2c", frame: tcp(false, "PA", si+1, ci+101, 50), out: true, ret: xdpRedirect, state: "ESTABLISHED"},
		step{name: "retransmission", frame: tcp(true, "PA", ci+1, si+1, 100), ret: xdpRedirect, state: "ESTABLISHED"},
		step{name: "reordered old ack", frame: tcp(false, "A", si+51, ci+1, 0), out: true, ret: xdpRedirect, state: "ESTABLISHED"},
		step{name: "fin c2s", frame: tcp(true, "FA", ci+101, si+51, 0), ret: xdpRedirect, state: "FIN_WAIT"},
		step{name: "ack of fin", frame: tcp(false, "A", si+51, ci+102, 0), out: true, ret: xdpRedirect, state: "CLOSE_WAIT"},
		step{name: "fin s2c", frame: tcp(false, "FA", si+51, ci+102, 0), out: true, ret: xdpRedirect, state: "LAST_ACK"},
		step{name: "last ack", frame: tcp(true, "A", ci+102, si+52, 0), ret: xdpRedirect, state: "TIME_WAIT"},
		step{name: "data after close", frame: tcp(true, "PA", ci+102, si+52, 10), ret: xdpRedirect, state: "TIME_WAIT"},
		step{name: "new syn reopens TIME_WAIT", frame: tcpOpen(true, "S", 900000, 0), ret: xdpRedirect, state: "SYN_SENT", count: "new"},
		step{name: "synack of reopened", frame: tcpOpen(false, "SA", 7000, 900001), out: true, ret: xdpRedirect, state: "SYN_RECV"},
	)
	f.script(t, steps)
	es := f.entries()
	if len(es) != 1 || es[0].Packets != [2]uint64{1, 1} || !es[0].Confirmed {
		t.Errorf("after reopen: %+v", es)
	}
}

func TestTCPInvalid(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	ci, si := uint32(1000), uint32(5000)
	f.script(t, []step{
		{name: "unsolicited outside syn", frame: tcpOpen(false, "S", si, 0), out: true, ret: xdpDrop, state: "-", count: "policy_drop"},
		{name: "fin without connection", frame: tcp(true, "FA", ci, si, 0), ret: xdpDrop, state: "-", count: "invalid_no_conn"},
		{name: "outside ack without connection", frame: tcp(false, "A", si, ci, 0), out: true, ret: xdpDrop, state: "-", count: "policy_drop"},
		{name: "syn", frame: tcpOpen(true, "S", ci, 0), ret: xdpRedirect, state: "SYN_SENT"},
		{name: "synack acking wrong seq", frame: tcpOpen(false, "SA", si, ci+2), out: true, ret: xdpDrop, state: "SYN_SENT", count: "invalid_synack"},
		{name: "synack acking old seq", frame: tcpOpen(false, "SA", si, ci), out: true, ret: xdpDrop, state: "SYN_SENT", count: "invalid_synack"},
		{name: "ack in SYN_SENT from client", frame: tcp(true, "A", ci+1, si+1, 0), ret: xdpDrop, state: "SYN_SENT", count: "invalid_tcp_state"},
		{name: "synack", frame: tcpOpen(false, "SA", si, ci+1), out: true, ret: xdpRedirect, state: "SYN_RECV"},
		{name: "ack", frame: tcp(true, "A", ci+1, si+1, 0), ret: xdpRedirect, state: "ESTABLISHED"},
		{name: "synack from client", frame: tcpOpen(true, "SA", ci, si+1), ret: xdpDrop, state: "ESTABLISHED", count: "invalid_tcp_state"},
		{name: "no flags", frame: tcp(true, "", ci+1, si+1, 0), ret: xdpDrop, state: "ESTABLISHED", count: "invalid_malformed"},
		{name: "syn+fin", frame: tcp(true, "SF", ci+1, si+1, 0), ret: xdpDrop, state: "ESTABLISHED", count: "invalid_malformed"},
		{name: "fin without ack", frame: tcp(true, "F", ci+1, si+1, 0), ret: xdpDrop, state: "ESTABLISHED", count: "invalid_malformed"},
		{name: "data far beyond window", frame: tcp(true, "PA", ci+1+10_000_000, si+1, 100), ret: xdpDrop, state: "ESTABLISHED", count: "invalid_window"},
		{name: "ack of unsent data", frame: tcp(false, "A", si+1, ci+1+500_000, 0), out: true, ret: xdpDrop, state: "ESTABLISHED", count: "invalid_window"},
		// nf (since Linux 6.1) ignores what fails only the lower bounds: passes it, changes nothing.
		{name: "ack far in the past is ignored", frame: tcp(false, "A", si+1, ci+1-1_000_000, 0), out: true, ret: xdpRedirect, state: "ESTABLISHED", count: "window_ignored"},
		{name: "data in window", frame: tcp(true, "PA", ci+1, si+1, 1000), ret: xdpRedirect, state: "ESTABLISHED"},
		{name: "server acks", frame: tcp(false, "A", si+1, ci+1001, 0), out: true, ret: xdpRedirect, state: "ESTABLISHED"},
		{name: "rst with stale seq", frame: tcp(true, "R", ci+1, 0, 0), ret: xdpDrop, state: "ESTABLISHED", count: "invalid_rst"},
		{name: "rst out of window", frame: tcp(true, "R", ci+1+100_000_000, 0, 0), ret: xdpDrop, state: "ESTABLISHED", count: "invalid_rst"},
		{name: "rst in window, inexact", frame: tcp(true, "R", ci+1001+100, 0, 0), ret: xdpRedirect, state: "ESTABLISHED"},
		{name: "rst exact", frame: tcp(true, "R", ci+1001, 0, 0), ret: xdpRedirect, state: "CLOSE"},
		{name: "ack after rst", frame: tcp(false, "A", si+1, ci+1001, 0), out: true, ret: xdpRedirect, state: "CLOSE"},
		// nf reopens CLOSE only after a FIN (CLOSE_INIT) or a RST from the SYN's own side as
		// the last packet: after the server's ACK the SYN passes ignored.
		{name: "syn after the server's ack is ignored", frame: tcpOpen(true, "S", 77, 0), ret: xdpRedirect, state: "CLOSE", count: "tcp_ignored"},
		{name: "client rst while closed", frame: tcp(true, "R", ci+1001, 0, 0), ret: xdpRedirect, state: "CLOSE"},
		{name: "syn reopens CLOSE", frame: tcpOpen(true, "S", 77, 0), ret: xdpRedirect, state: "SYN_SENT", count: "new"},
		// The only reply is a RST: nf deletes the connection at once.
		{name: "rst answering syn ends it", frame: tcp(false, "RA", 0, 78, 0), out: true, ret: xdpRedirect, state: "-"},
	})
}

func TestTCPWindowEdges(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	// Client window 65535 unscaled: the SYN carries no window scale here, so neither side scales.
	ci, si := uint32(0xFFFFFF00), uint32(0x7FFFFFF0) // client sequence numbers wrap past 2^32
	f.script(t, []step{
		{name: "syn", frame: packet.IP(inHost, outHost).TCP(40000, 80, "S").Seq(ci).Window(1000).Bytes(), ret: xdpRedirect, state: "SYN_SENT"},
		{name: "synack win 1000", frame: packet.IP(outHost, inHost).TCP(80, 40000, "SA").Seq(si).Ack(ci + 1).Window(1000).Bytes(), out: true, ret: xdpRedirect, state: "SYN_RECV"},
		{name: "ack", frame: packet.IP(inHost, outHost).TCP(40000, 80, "A").Seq(ci + 1).Ack(si + 1).Window(1000).Bytes(), ret: xdpRedirect, state: "ESTABLISHED"},
		// The server advertised 1000 bytes: the client may send up to ci+1+1000 (td_maxend).
		{name: "data across 2^32 filling the window", frame: packet.IP(inHost, outHost).TCP(40000, 80, "PA").Seq(ci + 1).Ack(si + 1).Window(1000).Payload(make([]byte, 1000)).Bytes(), ret: xdpRedirect, state: "ESTABLISHED"},
		{name: "segment starting at the window's end", frame: packet.IP(inHost, outHost).TCP(40000, 80, "PA").Seq(ci + 1 + 1000).Ack(si + 1).Window(1000).Payload(make([]byte, 10)).Bytes(), ret: xdpRedirect},
		// Past td_maxend by more than the receiver's largest window: invalid.
		{name: "segment overshooting the window", frame: packet.IP(inHost, outHost).TCP(40000, 80, "PA").Seq(ci + 1 + 1001 + 1000).Ack(si + 1).Window(1000).Payload(make([]byte, 10)).Bytes(), ret: xdpDrop, count: "invalid_window"},
		// Past it by less: nf's workaround for senders overshooting the window accepts it.
		{name: "segment starting one past it", frame: packet.IP(inHost, outHost).TCP(40000, 80, "PA").Seq(ci + 1 + 1001).Ack(si + 1).Window(1000).Payload(make([]byte, 10)).Bytes(), ret: xdpRedirect},
		{name: "ack beyond what the client sent", frame: packet.IP(outHost, inHost).TCP(80, 40000, "A").Seq(si + 1).Ack(ci + 1 + 1011 + 1).Window(1000).Bytes(), out: true, ret: xdpDrop, count: "invalid_window"},
		{name: "server acks across 2^32", frame: packet.IP(outHost, inHost).TCP(80, 40000, "A").Seq(si + 1).Ack(ci + 1 + 1011).Window(1000).Bytes(), out: true, ret: xdpRedirect},
		{name: "old segment before the window is ignored", frame: packet.IP(inHost, outHost).TCP(40000, 80, "PA").Seq(ci + 1 - 5000).Ack(si + 1).Window(1000).Payload(make([]byte, 10)).Bytes(), ret: xdpRedirect, count: "window_ignored"},
	})
	e := f.entries()[0]
	if got := e.raw.Tcp[0].TdEnd; got != ci+1+1011 {
		t.Errorf("client td_end %#x, want %#x", got, ci+1+1011)
	}
}

// TestTCPSACK: SACK blocks count as acknowledgements in check (III), as nf's tcp_sack, but only
// towards a receiver that permitted SACK in its SYN.
func TestTCPSACK(t *testing.T) {
	t.Parallel()
	ci, si := uint32(1000), uint32(5000)
	for _, permitted := range []bool{true, false} {
		t.Run(fmt.Sprintf("permitted=%v", permitted), func(t *testing.T) {
			f := newFixture(t, nil)
			syn := packet.IP(inHost, outHost).TCP(40000, 80, "S").Seq(ci)
			synack := packet.IP(outHost, inHost).TCP(80, 40000, "SA").Seq(si).Ack(ci + 1)
			if permitted {
				syn, synack = syn.SACKPermitted(), synack.SACKPermitted()
			}
			sack := func(left, right uint32) []byte {
				return packet.IP(outHost, inHost).TCP(80, 40000, "A").Seq(si+1).Ack(ci+1).SACK(left, right).Bytes()
			}
			beyond := step{name: "sack block beyond the data sent", frame: sack(ci+1+500, ci+1+5000), out: true, ret: xdpDrop, state: "ESTABLISHED", count: "invalid_window"}
			if !permitted {
				beyond.name, beyond.ret, beyond.count = "sack block ignored without permission", xdpRedirect, ""
			}
			f.script(t, []step{
				{name: "syn", frame: syn.Bytes(), ret: xdpRedirect, state: "SYN_SENT"},
				{name: "synack", frame: synack.Bytes(), out: true, ret: xdpRedirect, state: "SYN_RECV"},
				{name: "ack", frame: tcp(true, "A", ci+1, si+1, 0), ret: xdpRedirect, state: "ESTABLISHED"},
				{name: "data", frame: tcp(true, "PA", ci+1, si+1, 1000), ret: xdpRedirect, state: "ESTABLISHED"},
				{name: "sack block within the data sent", frame: sack(ci+1+500, ci+1+1000), out: true, ret: xdpRedirect, state: "ESTABLISHED"},
				beyond,
			})
		})
	}
}

// TestTCPResync: a client reopening a tuple the table still holds as ESTABLISHED gets back in
// sync as in nf: its SYN passes as IGNORE and is remembered, and the server's SYN-ACK for it
// restarts the connection at SYN_RECV — unless another packet passed in between.
func TestTCPResync(t *testing.T) {
	t.Parallel()
	ci, si := uint32(1000), uint32(5000)
	ci2, si2 := uint32(3_000_000_000), uint32(7_000_000)
	t.Run("resync", func(t *testing.T) {
		f := newFixture(t, nil)
		f.script(t, append(handshake(ci, si),
			step{name: "data", frame: tcp(true, "PA", ci+1, si+1, 100), ret: xdpRedirect, state: "ESTABLISHED"},
			step{name: "new syn is ignored", frame: tcpOpen(true, "S", ci2, 0), ret: xdpRedirect, state: "ESTABLISHED"},
			step{name: "synack for it re-syncs", frame: tcpOpen(false, "SA", si2, ci2+1), out: true, ret: xdpRedirect, state: "SYN_RECV"},
			step{name: "ack", frame: tcp(true, "A", ci2+1, si2+1, 0), ret: xdpRedirect, state: "ESTABLISHED"},
			step{name: "data of the new connection", frame: tcp(true, "PA", ci2+1, si2+1, 1000), ret: xdpRedirect, state: "ESTABLISHED"},
			step{name: "server acks it", frame: tcp(false, "A", si2+1, ci2+1001, 0), out: true, ret: xdpRedirect, state: "ESTABLISHED"},
		))
	})
	t.Run("no resync after another packet", func(t *testing.T) {
		f := newFixture(t, nil)
		f.script(t, append(handshake(ci, si),
			step{name: "new syn is ignored", frame: tcpOpen(true, "S", ci2, 0), ret: xdpRedirect, state: "ESTABLISHED"},
			step{name: "old connection's ack passes", frame: tcp(false, "A", si+1, ci+1, 0), out: true, ret: xdpRedirect, state: "ESTABLISHED"},
			step{name: "synack is ignored", frame: tcpOpen(false, "SA", si2, ci2+1), out: true, ret: xdpRedirect, state: "ESTABLISHED"},
			step{name: "new connection's data is out of window", frame: tcp(true, "PA", ci2+1, si2+1, 1000), ret: xdpDrop, state: "ESTABLISHED", count: "invalid_window"},
		))
	})
}

// TestTCPRSTAfterIgnored: nf's RST rules that read its memory of the last packet passed
// (last_index, last_dir, last_end).
func TestTCPRSTAfterIgnored(t *testing.T) {
	t.Parallel()
	ci, si := uint32(1000), uint32(5000)
	ci2 := uint32(3_000_000_000)
	t.Run("rst answering an ignored syn closes", func(t *testing.T) {
		f := newFixture(t, nil)
		f.script(t, append(handshake(ci, si),
			step{name: "data", frame: tcp(true, "PA", ci+1, si+1, 100), ret: xdpRedirect, state: "ESTABLISHED"},
			step{name: "server acks", frame: tcp(false, "A", si+1, ci+101, 0), out: true, ret: xdpRedirect, state: "ESTABLISHED"},
			step{name: "new syn is ignored", frame: tcpOpen(true, "S", ci2, 0), ret: xdpRedirect, state: "ESTABLISHED"},
			// seq 0 is before the client's highest ACK: without the rule, an invalid RST.
			step{name: "rst acking something else is invalid", frame: tcp(false, "RA", 0, ci+5101, 0), out: true, ret: xdpDrop, state: "ESTABLISHED", count: "invalid_rst"},
			step{name: "new syn again", frame: tcpOpen(true, "S", ci2, 0), ret: xdpRedirect, state: "ESTABLISHED"},
			step{name: "rst acking it closes", frame: tcp(false, "RA", 0, ci2+1, 0), out: true, ret: xdpRedirect, state: "CLOSE"},
			// Closed by the server's RST: nf ignores the client's SYN (no CLOSE_INIT, the last RST
			// not the SYN's side's).
			step{name: "syn after the server's rst is ignored", frame: tcpOpen(true, "S", ci2, 0), ret: xdpRedirect, state: "CLOSE", count: "tcp_ignored"},
		))
	})
	t.Run("rst answering an ignored ack closes", func(t *testing.T) {
		f := newFixture(t, nil)
		f.script(t, []step{
			{name: "syn", frame: tcpOpen(true, "S", ci, 0), ret: xdpRedirect, state: "SYN_SENT"},
			{name: "bare ack in SYN_SENT is ignored", frame: tcp(false, "A", si, 123456, 0), out: true, ret: xdpRedirect, state: "SYN_SENT"},
			// Not at the ignored ACK's ack either (that would be the challenge-ACK rule, below).
			{name: "rst acking something else is out of window", frame: tcp(true, "RA", 123457, si+1, 0), ret: xdpDrop, state: "SYN_SENT", count: "invalid_rst"},
			{name: "bare ack again", frame: tcp(false, "A", si, 123456, 0), out: true, ret: xdpRedirect, state: "SYN_SENT"},
			{name: "rst acking it closes", frame: tcp(true, "RA", 123457, si, 0), ret: xdpRedirect, state: "CLOSE"},
		})
	})
	t.Run("rst at a challenge ack's ack closes", func(t *testing.T) {
		// nf (RFC 5961): the ACK ignored in SYN_SENT may be the challenge ACK of a peer still
		// holding an older connection; a RST at exactly what it acknowledges passes and closes,
		// though out of the window.
		f := newFixture(t, nil)
		f.script(t, []step{
			{name: "syn", frame: tcpOpen(true, "S", ci, 0), ret: xdpRedirect, state: "SYN_SENT"},
			{name: "challenge ack is ignored", frame: tcp(false, "A", si, 123456, 0), out: true, ret: xdpRedirect, state: "SYN_SENT", count: "tcp_ignored"},
			{name: "rst at a different seq is out of window", frame: tcp(true, "R", 123455, 0, 0), ret: xdpDrop, state: "SYN_SENT", count: "invalid_rst"},
			{name: "rst at its ack closes", frame: tcp(true, "R", 123456, 0, 0), ret: xdpRedirect, state: "CLOSE"},
		})
	})
	t.Run("rst ending a train of segments closes", func(t *testing.T) {
		f := newFixture(t, nil)
		f.script(t, append(handshake(ci, si),
			step{name: "data", frame: tcp(true, "PA", ci+1, si+1, 100), ret: xdpRedirect, state: "ESTABLISHED"},
			step{name: "rst at the data's end", frame: tcp(true, "R", ci+101, 0, 0), ret: xdpRedirect, state: "CLOSE"},
		))
	})
	t.Run("rst while closing is not window-checked", func(t *testing.T) {
		f := newFixture(t, nil)
		f.script(t, append(handshake(ci, si),
			step{name: "fin", frame: tcp(true, "FA", ci+1, si+1, 0), ret: xdpRedirect, state: "FIN_WAIT"},
			step{name: "rst far out of window", frame: tcp(false, "R", si+100_000_000, 0, 0), out: true, ret: xdpRedirect, state: "CLOSE"},
		))
	})
}

// TCP direction flags (enum ct_tcp_flag of conntrack.h).
const (
	ctTcpFWScale    = uint8(ctCtTcpFlagCT_TCP_F_WSCALE)
	ctTcpFSACKPerm  = uint8(ctCtTcpFlagCT_TCP_F_SACK_PERM)
	ctTcpFBeLiberal = uint8(ctCtTcpFlagCT_TCP_F_BE_LIBERAL)
)

// TestTCPReinitFlags: a SYN or SYN-ACK that (re)initialises a direction treats its flags as
// nf's tcp_options does: options replace them but BE_LIBERAL; no options leave them.
func TestTCPReinitFlags(t *testing.T) {
	t.Parallel()
	ci, si := uint32(1000), uint32(5000)
	t.Run("syn without options keeps the first syn's", func(t *testing.T) {
		f := newFixture(t, nil)
		f.script(t, []step{
			{name: "syn with wscale", frame: tcpOpen(true, "S", ci, 0), ret: xdpRedirect, state: "SYN_SENT"},
			{name: "syn with a new isn, no options", frame: tcp(true, "S", ci+100_000, 0, 0), ret: xdpRedirect, state: "SYN_SENT"},
		})
		d := f.entries()[0].raw.Tcp[0]
		if d.TdEnd != ci+100_001 || d.Flags&ctTcpFWScale == 0 || d.TdScale != 7 {
			t.Errorf("client after the re-init: td_end %d flags %#x scale %d, want %d, WSCALE, 7", d.TdEnd, d.Flags, d.TdScale, ci+100_001)
		}
	})
	// A picked-up connection reopened by its client: the SYN's side takes the remembered SYN's
	// flags, the SYN-ACK's side starts afresh but stays liberal.
	t.Run("a re-synced server stays liberal", func(t *testing.T) {
		f := newFixture(t, nil)
		ci2, si2 := uint32(3_000_000_000), uint32(7_000_000)
		f.script(t, []step{
			{name: "pickup", frame: tcp(true, "PA", ci, si, 100), ret: xdpRedirect, state: "ESTABLISHED", count: "new"},
			{name: "reply", frame: tcp(false, "A", si, ci+100, 0), out: true, ret: xdpRedirect, state: "ESTABLISHED"},
			{name: "new syn is ignored", frame: tcpOpen(true, "S", ci2, 0), ret: xdpRedirect, state: "ESTABLISHED"},
			{name: "synack re-syncs", frame: tcpOpen(false, "SA", si2, ci2+1), out: true, ret: xdpRedirect, state: "SYN_RECV"},
			{name: "ack", frame: tcp(true, "A", ci2+1, si2+1, 0), ret: xdpRedirect, state: "ESTABLISHED"},
			{name: "server data far beyond the window passes", frame: tcp(false, "PA", si2+1+50_000_000, ci2+1, 100), out: true, ret: xdpRedirect, state: "ESTABLISHED"},
			{name: "client data far beyond the window does not", frame: tcp(true, "PA", ci2+1+50_000_000, si2+1, 100), ret: xdpDrop, state: "ESTABLISHED", count: "invalid_window"},
		})
		e := f.entries()[0].raw
		if e.Tcp[1].Flags&ctTcpFBeLiberal == 0 || e.Tcp[0].Flags&ctTcpFBeLiberal != 0 {
			t.Errorf("flags client %#x server %#x: want only the server liberal", e.Tcp[0].Flags, e.Tcp[1].Flags)
		}
	})
}

func TestTCPLiberal(t *testing.T) {
	t.Parallel()
	f := newFixture(t, &Config{Liberal: true})
	ci, si := uint32(1000), uint32(5000)
	steps := append(handshake(ci, si),
		step{name: "out of window passes when liberal", frame: tcp(true, "PA", ci+1+10_000_000, si+1, 100), ret: xdpRedirect, state: "ESTABLISHED"})
	f.script(t, steps)
}

// TestTCPHandshakeCorners shares one fixture (a fresh table each) between handshakes that
// leave the usual order.
func TestTCPHandshakeCorners(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	ci, si := uint32(1000), uint32(5000)
	t.Run("simultaneous open", func(t *testing.T) {
		f.script(t, []step{
			{name: "syn c2s", frame: tcpOpen(true, "S", ci, 0), ret: xdpRedirect, state: "SYN_SENT"},
			{name: "syn s2c crosses it", frame: tcpOpen(false, "S", si, 0), out: true, ret: xdpRedirect, state: "SYN_SENT2"},
			{name: "synack s2c", frame: tcpOpen(false, "SA", si, ci+1), out: true, ret: xdpRedirect, state: "SYN_RECV"},
			{name: "ack c2s", frame: tcp(true, "A", ci+1, si+1, 0), ret: xdpRedirect, state: "ESTABLISHED"},
		})
	})
	if _, err := f.tables.Flush(); err != nil {
		t.Fatal(err)
	}
	// A server that sends before the client's ACK reaches the router (SYN_RECV, reply
	// direction) keeps the window scale of its SYN-ACK: only a SYN may reinitialise a direction
	// (nf).
	t.Run("server sends in SYN_RECV", func(t *testing.T) {
		c2s := func(flags string, seq, ack uint32, n int) []byte {
			return packet.IP(inHost, outHost).TCP(40000, 80, flags).Seq(seq).Ack(ack).Window(500).Payload(make([]byte, n)).Bytes()
		}
		f.script(t, []step{
			{name: "syn", frame: packet.IP(inHost, outHost).TCP(40000, 80, "S").Seq(ci).Window(500).WScale(7).Bytes(), ret: xdpRedirect, state: "SYN_SENT"},
			{name: "synack", frame: packet.IP(outHost, inHost).TCP(80, 40000, "SA").Seq(si).Ack(ci + 1).Window(500).WScale(7).Bytes(), out: true, ret: xdpRedirect, state: "SYN_RECV"},
			{name: "server data before the ack", frame: packet.IP(outHost, inHost).TCP(80, 40000, "PA").Seq(si + 1).Ack(ci + 1).Window(500).Payload(make([]byte, 100)).Bytes(), out: true, ret: xdpRedirect, state: "SYN_RECV"},
			{name: "ack", frame: c2s("A", ci+1, si+101, 0), ret: xdpRedirect, state: "ESTABLISHED"},
			{name: "data", frame: c2s("PA", ci+1, si+101, 1400), ret: xdpRedirect},
			// Beyond 500 bytes, within 500<<7: needs the server's scale.
			{name: "data beyond the unscaled window", frame: c2s("PA", ci+1401, si+101, 1400), ret: xdpRedirect},
		})
		if got := f.entries()[0].raw.Tcp[1].TdScale; got != 7 {
			t.Errorf("server td_scale %d, want 7", got)
		}
	})
}

func TestTCPTimeWaitReplySyn(t *testing.T) {
	t.Parallel()
	f := newFixture(t, &Config{})
	ci, si := uint32(1000), uint32(5000)
	steps := append(handshake(ci, si),
		step{name: "fin c2s", frame: tcp(true, "FA", ci+1, si+1, 0), ret: xdpRedirect, state: "FIN_WAIT"},
		step{name: "fin s2c", frame: tcp(false, "FA", si+1, ci+2, 0), out: true, ret: xdpRedirect, state: "LAST_ACK"},
		step{name: "ack", frame: tcp(true, "A", ci+2, si+2, 0), ret: xdpRedirect, state: "TIME_WAIT"},
		// A SYN from the outside reuses the tuple: the old entry goes, and the new connection
		// is judged by the policy (outside may not open connections).
		step{name: "outside syn in TIME_WAIT", frame: tcpOpen(false, "S", 1, 0), out: true, ret: xdpDrop, state: "-", count: "policy_drop"},
	)
	f.script(t, steps)
}

func udp(c2s bool, sport, dport uint16) []byte {
	if c2s {
		return packet.IP(inHost, outHost).UDP(sport, dport).Payload([]byte("hello")).Bytes()
	}
	return packet.IP(outHost, inHost).UDP(dport, sport).Payload([]byte("world")).Bytes()
}

func TestUDP(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	k := &Entry{Proto: "udp", Orig: Tuple{Src: netip.MustParseAddr(inHost), Dst: netip.MustParseAddr(outHost), Sport: 5000, Dport: 53}}
	f.script(t, []step{
		{name: "unsolicited outside", frame: udp(false, 5000, 53), out: true, ret: xdpDrop, state: "-", count: "policy_drop"},
		{name: "query", frame: udp(true, 5000, 53), ret: xdpRedirect, state: "NEW", count: "new"},
		{name: "second query", frame: udp(true, 5000, 53), ret: xdpRedirect, state: "NEW"},
		{name: "reply promotes", frame: udp(false, 5000, 53), out: true, ret: xdpRedirect, state: "ESTABLISHED", count: "established"},
		{name: "more replies", frame: udp(false, 5000, 53), out: true, ret: xdpRedirect, state: "ESTABLISHED", key: k},
		{name: "outside to another port", frame: udp(false, 5001, 53), out: true, ret: xdpDrop, count: "policy_drop", state: "ESTABLISHED", key: k},
	})
	es := f.entries()
	if len(es) != 1 || es[0].Packets != [2]uint64{2, 2} || es[0].Bytes[0] != 2*33 || !es[0].Confirmed {
		t.Errorf("entries %+v", es)
	}
	// nf's stream_ts: replied, but within 2 s of the first packet: udp_unreplied, not assured.
	if es[0].Timeout < 29 || es[0].Timeout > 30 || es[0].Assured {
		t.Errorf("timeout %.1fs, assured %v within 2 s of the first packet, want 30s, false", es[0].Timeout, es[0].Assured)
	}
	time.Sleep(2100 * time.Millisecond)
	f.script(t, []step{{name: "a reply after 2 s: a stream", frame: udp(false, 5000, 53), out: true, ret: xdpRedirect, state: "ESTABLISHED", key: k}})
	if es = f.entries(); len(es) != 1 || es[0].Timeout < 119 || es[0].Timeout > 120 || !es[0].Assured {
		t.Errorf("after 2 s: entries %+v, want a 120 s timeout, assured", es)
	}
}

func TestICMP(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	udpKey := &Entry{Proto: "udp", Orig: Tuple{Src: netip.MustParseAddr(inHost), Dst: netip.MustParseAddr(outHost), Sport: 5000, Dport: 53}}
	echoKey := &Entry{Proto: "icmp", Orig: Tuple{Src: netip.MustParseAddr(inHost), Dst: netip.MustParseAddr(outHost), ID: 77}}
	quoted := packet.IP(inHost, outHost).UDP(5000, 53).Payload([]byte("hello")).IPBytes()
	other := packet.IP(inHost, outHost).UDP(5999, 53).Payload([]byte("hello")).IPBytes()
	f.script(t, []step{
		{name: "echo request from outside", frame: packet.IP(outHost, inHost).Echo(5, 1, false).Bytes(), out: true, ret: xdpDrop, state: "-", count: "policy_drop"},
		{name: "echo reply unsolicited", frame: packet.IP(outHost, inHost).Echo(5, 1, true).Bytes(), out: true, ret: xdpDrop, state: "-", count: "invalid_no_conn"},
		{name: "echo request", frame: packet.IP(inHost, outHost).Echo(77, 1, false).Bytes(), ret: xdpRedirect, state: "NEW", count: "new"},
		{name: "echo reply", frame: packet.IP(outHost, inHost).Echo(77, 1, true).Bytes(), out: true, ret: xdpRedirect, state: "ESTABLISHED", count: "established"},
		{name: "reply with another id", frame: packet.IP(outHost, inHost).Echo(78, 1, true).Bytes(), out: true, ret: xdpDrop, count: "invalid_no_conn"},
		{name: "timestamp request", frame: packet.IP(outHost, inHost).ICMPError(13, 0, nil).Bytes(), out: true, ret: xdpDrop, count: "invalid_icmp"},
		{name: "udp flow", frame: udp(true, 5000, 53), ret: xdpRedirect, state: "NEW", key: udpKey},
		{name: "port unreachable for it is related", frame: packet.IP(outHost, inHost).ICMPError(3, 3, quoted).Bytes(), out: true, ret: xdpRedirect, count: "related"},
		{name: "unreachable for an unknown flow", frame: packet.IP(outHost, inHost).ICMPError(3, 3, other).Bytes(), out: true, ret: xdpDrop, count: "invalid_icmp"},
		{name: "truncated quote", frame: packet.IP(outHost, inHost).ICMPError(3, 3, quoted[:24]).Bytes(), out: true, ret: xdpDrop, count: "invalid_icmp"},
		{name: "time exceeded for the echo", frame: packet.IP(outHost, inHost).ICMPError(11, 0, packet.IP(inHost, outHost).Echo(77, 2, false).IPBytes()).Bytes(), out: true, ret: xdpRedirect, count: "related", state: "ESTABLISHED", key: echoKey},
	})
}

func TestIPv6(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	ci, si := uint32(1000), uint32(5000)
	c2s := func(flags string, seq, ack uint32) *packet.Builder {
		return packet.IP(inHost6, outHost6).TCP(40000, 443, flags).Seq(seq).Ack(ack)
	}
	s2c := func(flags string, seq, ack uint32) *packet.Builder {
		return packet.IP(outHost6, inHost6).TCP(443, 40000, flags).Seq(seq).Ack(ack)
	}
	quoted := packet.IP(inHost6, outHost6).UDP(5000, 53).IPBytes()
	quotedExt := packet.IP(inHost6, outHost6).IPv6Ext(layers.IPProtocolIPv6HopByHop, []byte{1, 4, 0, 0, 0, 0}).IPv6Ext(layers.IPProtocolIPv6Routing, nil).UDP(5000, 53).IPBytes()
	quotedFrag := packet.IP(inHost6, outHost6).IPv6Ext(layers.IPProtocolIPv6Fragment, []byte{0, 1, 0, 0, 0, 1}).UDP(5000, 53).IPBytes()     // offset 0, more fragments
	quotedLater := packet.IP(inHost6, outHost6).IPv6Ext(layers.IPProtocolIPv6Fragment, []byte{0, 0x10, 0, 0, 0, 1}).UDP(5000, 53).IPBytes() // offset 16
	otherExt := packet.IP(inHost6, outHost6).IPv6Ext(layers.IPProtocolIPv6Destination, nil).UDP(5001, 53).IPBytes()
	f.script(t, []step{
		{name: "unsolicited outside", frame: s2c("S", si, 0).Bytes(), out: true, ret: xdpDrop, state: "-", count: "policy_drop"},
		{name: "syn with hop-by-hop and dest options", frame: packet.IP(inHost6, outHost6).IPv6Ext(layers.IPProtocolIPv6HopByHop, []byte{1, 4, 0, 0, 0, 0}).IPv6Ext(layers.IPProtocolIPv6Destination, nil).TCP(40000, 443, "S").Seq(ci).WScale(7).Bytes(), ret: xdpRedirect, state: "SYN_SENT"},
		{name: "synack", frame: s2c("SA", si, ci+1).WScale(7).Bytes(), out: true, ret: xdpRedirect, state: "SYN_RECV"},
		{name: "ack", frame: c2s("A", ci+1, si+1).Bytes(), ret: xdpRedirect, state: "ESTABLISHED"},
		{name: "data", frame: c2s("PA", ci+1, si+1).Payload(make([]byte, 500)).Bytes(), ret: xdpRedirect, state: "ESTABLISHED"},
		{name: "fragment is passed", frame: packet.IP(inHost6, outHost6).IPv6Ext(layers.IPProtocolIPv6Fragment, []byte{0, 0, 0, 0, 0, 1}).UDP(1, 2).Bytes(), ret: xdpPass, count: "passed"},
		{name: "echo request", frame: packet.IP(inHost6, outHost6).Echo(9, 1, false).Bytes(), ret: xdpRedirect, count: "new"},
		{name: "echo reply", frame: packet.IP(outHost6, inHost6).Echo(9, 1, true).Bytes(), out: true, ret: xdpRedirect, count: "established"},
		{name: "udp", frame: packet.IP(inHost6, outHost6).UDP(5000, 53).Bytes(), ret: xdpRedirect, count: "new"},
		{name: "icmpv6 unreachable related", frame: packet.IP(outHost6, inHost6).ICMPError(1, 4, quoted).Bytes(), out: true, ret: xdpRedirect, count: "related"},
		{name: "quoting a packet with extension headers", frame: packet.IP(outHost6, inHost6).ICMPError(1, 4, quotedExt).Bytes(), out: true, ret: xdpRedirect, count: "related"},
		{name: "quoting a first fragment", frame: packet.IP(outHost6, inHost6).ICMPError(1, 4, quotedFrag).Bytes(), out: true, ret: xdpRedirect, count: "related"},
		{name: "quoting a later fragment", frame: packet.IP(outHost6, inHost6).ICMPError(1, 4, quotedLater).Bytes(), out: true, ret: xdpDrop, count: "invalid_icmp"},
		{name: "quoting an unknown flow behind extension headers", frame: packet.IP(outHost6, inHost6).ICMPError(1, 4, otherExt).Bytes(), out: true, ret: xdpDrop, count: "invalid_icmp"},
	})
	es := f.entries()
	if len(es) != 3 {
		t.Errorf("want tcp, icmpv6 and udp entries: %+v", es)
	}
}

func TestForwardRewrites(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	ret, out := f.run(packet.IP(inHost, outHost).TTL(9).UDP(1, 2).Payload([]byte("x")).Bytes(), f.in.Index)
	if ret != xdpRedirect {
		t.Fatalf("verdict %d", ret)
	}
	p := packet.Decode(out)
	eth := p.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
	ip := p.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
	if eth.DstMAC.String() != outMAC.String() || eth.SrcMAC.String() != netHW(f.out.MAC) {
		t.Errorf("MACs %s → %s, want %s → %s", eth.SrcMAC, eth.DstMAC, netHW(f.out.MAC), outMAC)
	}
	if ip.TTL != 8 {
		t.Errorf("TTL %d, want 8", ip.TTL)
	}
	// The checksum must still be right: recompute it with gopacket.
	want := packet.IP(inHost, outHost).TTL(8).UDP(1, 2).Payload([]byte("x")).Bytes()
	if wantIP := packet.Decode(want).Layer(layers.LayerTypeIPv4).(*layers.IPv4); wantIP.Checksum != ip.Checksum {
		t.Errorf("IP checksum %#x, want %#x", ip.Checksum, wantIP.Checksum)
	}
	ret, out = f.run(packet.IP(inHost6, outHost6).TTL(9).UDP(1, 2).Bytes(), f.in.Index)
	if ret != xdpRedirect || packet.Decode(out).Layer(layers.LayerTypeIPv6).(*layers.IPv6).HopLimit != 8 {
		t.Errorf("IPv6: verdict %d, hop limit not decremented", ret)
	}
	f.script(t, []step{
		{name: "ttl 1 goes to the kernel", frame: packet.IP(inHost, outHost).TTL(1).UDP(1, 3).Bytes(), ret: xdpPass, count: "passed"},
		{name: "ipv4 fragment goes to the kernel", frame: packet.IP(inHost, outHost).Fragment(10, false).UDP(1, 3).Bytes(), ret: xdpPass, count: "passed"},
		{name: "to the router itself", frame: packet.IP(inHost, "198.18.1.1").UDP(1, 3).Bytes(), ret: xdpPass, count: "passed"},
		{name: "no route", frame: packet.IP(inHost, "198.19.200.1").UDP(1, 3).Bytes(), ret: xdpPass, count: "passed"},
		{name: "other protocol", frame: packet.IP(inHost, outHost).Bytes(), ret: xdpPass, count: "passed"},
		{name: "not IP", frame: append(append([]byte(nil), want[:12]...), 0x08, 0x06, 0, 1, 8, 0, 6, 4, 0, 1), ret: xdpPass, count: "passed"},
		{name: "frame shorter than its IP length", frame: packet.IP(inHost, outHost).TCP(1, 2, "S").Bytes()[:14+20+10], ret: xdpPass, count: "passed"},
		{name: "tcp header beyond the packet", frame: badDoff(), ret: xdpDrop, count: "invalid_malformed"},
		{name: "udp length beyond the packet", frame: badUDPLen(), ret: xdpDrop, count: "invalid_malformed"},
	})
}

func netHW(b []byte) string {
	return fmt.Sprintf("%02x:%02x:%02x:%02x:%02x:%02x", b[0], b[1], b[2], b[3], b[4], b[5])
}

func TestTrackMode(t *testing.T) {
	t.Parallel()
	f := newFixture(t, &Config{Mode: "track"})
	f.script(t, []step{
		{name: "unsolicited outside still forwarded", frame: tcpOpen(false, "S", 1, 0), out: true, ret: xdpRedirect, state: "-", count: "policy_drop"},
		{name: "invalid still forwarded", frame: tcp(true, "FA", 1, 1, 0), ret: xdpRedirect, count: "invalid_no_conn"},
	})
}

func TestAllowPolicy(t *testing.T) {
	t.Parallel()
	cfg := &Config{}
	cfg.Allow.Ports = []string{"tcp/22", "icmp"}
	cfg.Allow.Prefixes = []string{"198.18.1.128/25"}
	f := newFixture(t, cfg)
	f.script(t, []step{
		{name: "outside to an allowed port", frame: packet.IP(outHost, inHost).TCP(50000, 22, "S").Seq(1).Bytes(), out: true, ret: xdpRedirect, state: "SYN_SENT", count: "new"},
		{name: "outside to another port", frame: packet.IP(outHost, inHost).TCP(50000, 23, "S").Seq(1).Bytes(), out: true, ret: xdpDrop, count: "policy_drop"},
		{name: "outside ping allowed", frame: packet.IP(outHost, inHost).Echo(1, 1, false).Bytes(), out: true, ret: xdpRedirect, count: "new"},
		// No neighbour entry for .200: tracked and allowed, then handed to the kernel to resolve it.
		{name: "outside to an allowed prefix", frame: packet.IP(outHost, "198.18.1.200").UDP(1, 9).Bytes(), out: true, ret: xdpPass, count: "new"},
		{name: "outside to the rest", frame: packet.IP(outHost, "198.18.1.20").UDP(1, 9).Bytes(), out: true, ret: xdpDrop, count: "policy_drop"},
	})
}

func badDoff() []byte {
	b := packet.IP(inHost, outHost).TCP(1, 2, "S").Bytes()
	b[14+20+12] = 0xf0 // data offset 15 words: options that are not there
	return b
}

func badUDPLen() []byte {
	b := packet.IP(inHost, outHost).UDP(1, 2).Payload([]byte("abc")).Bytes()
	b[14+20+4], b[14+20+5] = 0, 200
	return b
}

func TestTCPPickup(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	ci, si := uint32(1000), uint32(5000)
	f.script(t, []step{
		{name: "outside mid-stream ack is not picked up", frame: tcp(false, "A", si, ci, 0), out: true, ret: xdpDrop, state: "-", count: "policy_drop"},
		{name: "inside mid-stream ack is", frame: tcp(true, "PA", ci, si, 100), ret: xdpRedirect, state: "ESTABLISHED", count: "new"},
		{name: "reply confirms it", frame: tcp(false, "A", si, ci+100, 0), out: true, ret: xdpRedirect, state: "ESTABLISHED", count: "established"},
		{name: "window is not checked (scale unknown)", frame: tcp(true, "PA", ci+50_000_000, si, 100), ret: xdpRedirect, state: "ESTABLISHED"},
		{name: "fin", frame: tcp(true, "FA", ci+100, si, 0), ret: xdpRedirect, state: "FIN_WAIT"},
	})
	// nf assumes SACK on both sides of a picked-up connection, and the first reply's SACK
	// edge (not its ACK) meets the keepalive rule.
	if _, err := f.tables.Flush(); err != nil {
		t.Fatal(err)
	}
	sackReply := packet.IP(outHost, inHost).TCP(80, 40000, "A").Seq(si).Ack(ci).SACK(ci, ci+1).Bytes()
	f.script(t, []step{
		{name: "keepalive-like ack picks up", frame: tcp(true, "A", ci, si, 0), ret: xdpRedirect, state: "ESTABLISHED", count: "new"},
		{name: "reply sacks one byte more", frame: sackReply, out: true, ret: xdpRedirect, state: "ESTABLISHED"},
	})
	e := f.entries()[0].raw
	for i, d := range e.Tcp {
		if want := uint8(ctTcpFSACKPerm | ctTcpFBeLiberal); d.Flags&want != want {
			t.Errorf("direction %d flags %#x, want SACK_PERM|BE_LIBERAL", i, d.Flags)
		}
	}
	if e.Tcp[0].TdEnd != ci+1 {
		t.Errorf("client td_end %d, want %d (raised by the reply's SACK edge)", e.Tcp[0].TdEnd, ci+1)
	}
	strict := false
	g := newFixture(t, &Config{TCPLoose: &strict})
	g.script(t, []step{
		{name: "no pickup when tcp_loose is off", frame: tcp(true, "A", ci, si, 0), ret: xdpDrop, state: "-", count: "invalid_no_conn"},
	})
}

// TestRouteCache checks that a confirmed connection remembers its FIB result per direction and
// that packets forwarded from the cache are rewritten exactly as looked-up ones.
func TestRouteCache(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.run(udp(true, 5000, 53), f.in.Index)
	f.run(udp(false, 5000, 53), f.out.Index) // confirms
	var outs [][]byte
	for i := 0; i < 3; i++ {
		ret, out := f.run(udp(false, 5000, 53), f.out.Index)
		if ret != xdpRedirect {
			t.Fatalf("reply %d: verdict %d", i, ret)
		}
		outs = append(outs, out)
	}
	for i := 1; i < len(outs); i++ {
		if string(outs[i]) != string(outs[0]) {
			t.Errorf("cached forwarding rewrote reply %d differently:\n%x\n%x", i, outs[i], outs[0])
		}
	}
	eth := packet.Decode(outs[0]).Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
	if eth.DstMAC.String() != inMAC.String() || eth.SrcMAC.String() != netHW(f.in.MAC) {
		t.Errorf("MACs %s → %s", eth.SrcMAC, eth.DstMAC)
	}
	e := f.entries()[0]
	r := e.raw.Route[1] // reply direction
	if r.Checked == 0 || int(r.Ifindex) != f.in.Index || int(r.Ingress) != f.out.Index || r.LenOk != 33 {
		t.Errorf("reply route cache %+v", r)
	}
	// A longer packet was not MTU-checked by the cached lookup: it takes a fresh one.
	big := packet.IP(outHost, inHost).UDP(53, 5000).Payload(make([]byte, 1000)).Bytes()
	if ret, _ := f.run(big, f.out.Index); ret != xdpRedirect {
		t.Fatalf("long reply: verdict %d", ret)
	}
	if r := f.entries()[0].raw.Route[1]; r.LenOk != 1028 {
		t.Errorf("after a longer packet the cache covers %d bytes, want 1028", r.LenOk)
	}
}

// TestNotForUs: frames not addressed to the interface they arrive on (another host's MAC on a
// promiscuous port, broadcast, multicast) are left to the kernel, which drops them before
// forwarding (PACKET_OTHERHOST and friends): nothing is tracked or forwarded. The same SYN
// addressed to the router is.
func TestNotForUs(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	syn := func(dst net.HardwareAddr) []byte {
		return packet.IP(inHost, outHost).TCP(40000, 80, "S").Seq(1000).MAC(packet.SrcMAC, dst).Bytes()
	}
	f.script(t, []step{
		{name: "syn to another host's mac", frame: syn(net.HardwareAddr{0x02, 0, 0, 0, 0x77, 0x77}), ret: xdpPass, state: "-", count: "passed"},
		{name: "syn to broadcast", frame: syn(net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}), ret: xdpPass, state: "-", count: "passed"},
		{name: "syn to a multicast mac", frame: syn(net.HardwareAddr{0x01, 0, 0x5e, 0, 0, 1}), ret: xdpPass, state: "-", count: "passed"},
		{name: "syn to the router", frame: syn(f.in.MAC), ret: xdpRedirect, state: "SYN_SENT", count: "new"},
	})
}
