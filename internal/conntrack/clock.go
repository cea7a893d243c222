package conntrack

import (
	"encoding/binary"
	"fmt"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"

	"github.com/flowplane/flowplane/internal/kernel"
)

// The entries' clock is nf_conntrack's: jiffies, scaled to nanoseconds (jiffies × jiffyNs).
// bpf_jiffies64 is a plain read, where bpf_ktime_get_coarse_ns costs more than the rest of the
// timeout bookkeeping together; it has no user-space counterpart, so user space reads it
// through a four-instruction program.

// jiffyNs is the length of a jiffy in ns, the program's jiffy_ns.
func jiffyNs() (uint64, error) {
	hz, err := kernel.HZ()
	if err != nil {
		return 0, err
	}
	return uint64(time.Second) / uint64(hz), nil
}

var jiffiesProg = sync.OnceValues(func() (*ebpf.Program, error) {
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:    "fp_ct_jiffies",
		Type:    ebpf.Syscall,
		Flags:   unix.BPF_F_SLEEPABLE,
		License: "GPL",
		Instructions: asm.Instructions{
			asm.Mov.Reg(asm.R6, asm.R1), // ctx: 8 bytes of user memory
			asm.FnJiffies64.Call(),
			asm.StoreMem(asm.R6, 0, asm.R0, asm.DWord),
			asm.Mov.Imm(asm.R0, 0),
			asm.Return(),
		},
	})
	if err != nil {
		return nil, fmt.Errorf("load jiffies reader: %w", err)
	}
	return p, nil
})

// clockNow is the entries' clock now: what the program's ct_now returns.
func clockNow() (uint64, error) {
	scale, err := jiffyNs()
	if err != nil {
		return 0, err
	}
	p, err := jiffiesProg()
	if err != nil {
		return 0, err
	}
	buf := make([]byte, 8)
	if _, err := p.Run(&ebpf.RunOptions{Context: buf, ContextOut: buf}); err != nil {
		return 0, fmt.Errorf("read jiffies: %w", err)
	}
	return binary.NativeEndian.Uint64(buf) * scale, nil
}
