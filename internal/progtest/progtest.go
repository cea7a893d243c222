// Package progtest runs BPF programs on crafted packets with BPF_PROG_TEST_RUN and checks what
// they return and what they leave in the packet, katran-style: a table of cases, each a packet
// in and the verdict (and optionally the bytes) expected out.
package progtest

import (
	"bytes"
	"encoding/hex"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/gopacket/gopacket"

	"github.com/flowplane/flowplane/internal/packet"
	"github.com/flowplane/flowplane/internal/progrun"
)

// Result is what one run gave back.
type Result = progrun.Result

// Run runs prog once on in (Exec with no interface) and fails t on error. For XDP programs the
// kernel needs at least an Ethernet header.
func Run(t testing.TB, prog *ebpf.Program, in []byte) Result {
	t.Helper()
	r, err := progrun.Exec(prog, in, 0)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// Case is one row of a table test.
type Case struct {
	Name string
	In   []byte
	Ret  uint32
	Out  []byte // nil: don't compare the output packet
	// Ifindex is the interface the packet arrives on (0: none).
	Ifindex int
	// Check, if set, inspects the output packet decoded by gopacket.
	Check func(t testing.TB, out gopacket.Packet)
}

// RunTable runs each case as a subtest, in order (cases may build on state the earlier ones left
// in maps).
func RunTable(t *testing.T, prog *ebpf.Program, cases []Case) {
	t.Helper()
	for _, c := range cases {
		ok := t.Run(c.Name, func(t *testing.T) {
			r, err := progrun.Exec(prog, c.In, c.Ifindex)
			if err != nil {
				t.Fatal(err)
			}
			if r.Ret != c.Ret {
				t.Errorf("verdict %d, want %d", r.Ret, c.Ret)
			}
			if c.Out != nil && !bytes.Equal(r.Out, c.Out) {
				t.Errorf("output packet differs\ngot:\n%s\nwant:\n%s", hex.Dump(r.Out), hex.Dump(c.Out))
			}
			if c.Check != nil {
				c.Check(t, packet.Decode(r.Out))
			}
		})
		if !ok {
			return // later cases depend on this one's state
		}
	}
}
