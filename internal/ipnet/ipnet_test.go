package ipnet

import "testing"

func TestProtoName(t *testing.T) {
	t.Parallel()
	for p, want := range map[uint8]string{6: "tcp", 17: "udp", 1: "icmp", 58: "icmpv6", 132: "sctp", 253: "253"} {
		if got := ProtoName(p); got != want {
			t.Errorf("ProtoName(%d) = %q, want %q", p, got, want)
		}
		if n, ok := ProtoNumber(want); want != "253" && (!ok || n != p) {
			t.Errorf("ProtoNumber(%q) = %d, %v; want %d", want, n, ok, p)
		}
	}
	if n, ok := ProtoNumber("ipv6-icmp"); !ok || n != 58 {
		t.Errorf("ProtoNumber(ipv6-icmp) = %d, %v", n, ok)
	}
	if _, ok := ProtoNumber("nosuch"); ok {
		t.Error("ProtoNumber(nosuch) found")
	}
}
