package ipnet

import "testing"

func TestProtoName(t *testing.T) {
	t.Parallel()
	for p, want := range map[uint8]string{6: "tcp", 17: "udp", 1: "icmp", 58: "icmpv6", 132: "sctp", 253: "253"} {
		if got := ProtoName(p); got != want {
			t.Errorf("ProtoName(%d) = %q, want %q", p, got, want)
		}
	}
}
