package conntrack

import (
	"testing"

	"github.com/gopacket/gopacket/layers"

	"github.com/flowplane/flowplane/internal/packet"
)

// TestTCHook runs the scripted data-path tests on the TC build of the program: the same
// source, so the same verdicts (mapped from TC_ACT_*) and the same table states.
func TestTCHook(t *testing.T) {
	fixtureHook = HookTC
	t.Cleanup(func() { fixtureHook = HookXDP })
	for _, c := range []struct {
		name string
		fn   func(*testing.T)
	}{
		{"TCPLifecycle", TestTCPLifecycle},
		{"TCPInvalid", TestTCPInvalid},
		{"TCPWindowEdges", TestTCPWindowEdges},
		{"TCPSACK", TestTCPSACK},
		{"TCPResync", TestTCPResync},
		{"TCPRSTAfterIgnored", TestTCPRSTAfterIgnored},
		{"TCPHandshakeCorners", TestTCPHandshakeCorners},
		{"UDP", TestUDP},
		{"ICMP", TestICMP},
		{"IPv6", TestIPv6},
		{"ForwardRewrites", TestForwardRewrites},
		{"TrackMode", TestTrackMode},
		{"AllowPolicy", TestAllowPolicy},
		{"TCPPickup", TestTCPPickup},
	} {
		t.Run(c.name, c.fn)
	}
}

// TestTCVerdicts checks the TC program's own verdicts and output bytes: a handshake redirected
// (TC_ACT_REDIRECT) with the MACs rewritten and the TTL decremented, an out-of-window segment
// and an unsolicited outside SYN dropped (TC_ACT_SHOT), and the route cache keeping the
// egress MTU (the TC lookup checks the skb against it, GSO-aware).
func TestTCVerdicts(t *testing.T) {
	f := newFixture(t, &Config{Hook: HookTC})
	if f.d.Program().Type().String() != "SchedCLS" {
		t.Fatalf("program type %s, want SchedCLS", f.d.Program().Type())
	}
	ci, si := uint32(1000), uint32(5000)
	for _, s := range []struct {
		name  string
		frame []byte
		out   bool
		ret   uint32
		state string
	}{
		{"unsolicited outside syn", tcpOpen(false, "S", si, 0), true, tcShot, "-"},
		{"syn", tcpOpen(true, "S", ci, 0), false, tcRedirect, "SYN_SENT"},
		{"synack", tcpOpen(false, "SA", si, ci+1), true, tcRedirect, "SYN_RECV"},
		{"ack", tcp(true, "A", ci+1, si+1, 0), false, tcRedirect, "ESTABLISHED"},
		{"data", tcp(true, "PA", ci+1, si+1, 1000), false, tcRedirect, "ESTABLISHED"},
		{"data far beyond the window", tcp(true, "PA", ci+1+10_000_000, si+1, 100), false, tcShot, "ESTABLISHED"},
		{"reply", tcp(false, "A", si+1, ci+1001, 0), true, tcRedirect, "ESTABLISHED"},
		{"reply from the route cache", tcp(false, "A", si+1, ci+1001, 0), true, tcRedirect, "ESTABLISHED"},
	} {
		in, egress, dmac := f.in.Index, f.out, outMAC
		if s.out {
			in, egress, dmac = f.out.Index, f.in, inMAC
		}
		ret, out := f.runRaw(s.frame, in)
		if ret != s.ret {
			t.Fatalf("%s: verdict %d, want %d (counters %v)", s.name, ret, s.ret, f.counters())
		}
		got := "-"
		if es := f.entries(); len(es) == 1 {
			got = es[0].State
		}
		if got != s.state {
			t.Fatalf("%s: state %s, want %s", s.name, got, s.state)
		}
		if ret != tcRedirect {
			continue
		}
		p := packet.Decode(out)
		eth := p.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
		ip := p.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
		if eth.DstMAC.String() != dmac.String() || eth.SrcMAC.String() != netHW(egress.MAC) {
			t.Errorf("%s: MACs %s → %s, want %s → %s", s.name, eth.SrcMAC, eth.DstMAC, netHW(egress.MAC), dmac)
		}
		if ip.TTL != 63 {
			t.Errorf("%s: TTL %d, want 63", s.name, ip.TTL)
		}
		// The decremented TTL's checksum must verify: the header sums to 0xffff.
		var sum uint32
		hdr := out[14 : 14+20]
		for i := 0; i < len(hdr); i += 2 {
			sum += uint32(hdr[i])<<8 | uint32(hdr[i+1])
		}
		for sum > 0xffff {
			sum = sum&0xffff + sum>>16
		}
		if sum != 0xffff {
			t.Errorf("%s: IP header checksum does not verify (sum %#x)", s.name, sum)
		}
	}
	if c := f.counters(); c["forwarded"] != 6 || c["policy_drop"] != 1 || c["invalid_window"] != 1 {
		t.Errorf("counters %v", c)
	}
	r := f.entries()[0].raw.Route[1]
	if r.Checked == 0 || int(r.Ifindex) != f.in.Index || r.LenOk != 1500 {
		t.Errorf("reply route cache %+v, want egress %d with the MTU (1500) as len_ok", r, f.in.Index)
	}
	// Longer than the MTU and not GSO: the lookup refuses it (FRAG_NEEDED) and the kernel
	// answers; the cached route must not let it through.
	big := packet.IP(outHost, inHost).TCP(80, 40000, "A").Seq(si + 1).Ack(ci + 1001).Payload(make([]byte, 1600)).Bytes()
	if ret, _ := f.runRaw(big, f.out.Index); ret != tcOK {
		t.Errorf("packet over the MTU: verdict %d, want %d (to the kernel)", ret, tcOK)
	}
}
