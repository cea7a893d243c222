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

// The entries' clock is nf_conntrack's: jiffies since boot, scaled to nanoseconds
// ((jiffies − INITIAL_JIFFIES) × jiffyNs), close to CLOCK_MONOTONIC. bpf_jiffies64 is an
// inlined load, where bpf_ktime_get_coarse_ns costs more than the rest of the timeout
// bookkeeping together; it has no user-space counterpart, so user space reads it through a
// four-instruction program.

// jiffyClock is the program's jiffy_ns and jiffies_base: the length of a jiffy in ns and the
// kernel's INITIAL_JIFFIES, (u64)(u32)(-300 × HZ), so that boot is 0.
func jiffyClock() (jiffyNs, base uint64, err error) {
	hz, err := kernel.HZ()
	if err != nil {
		return 0, 0, err
	}
	return uint64(time.Second) / uint64(hz), uint64(uint32(-300 * int32(hz))), nil
}

var (
	jiffiesMu   sync.Mutex
	jiffiesProg *ebpf.Program // loaded once; a failed load is retried on the next call
)

func loadJiffiesProg() (*ebpf.Program, error) {
	jiffiesMu.Lock()
	defer jiffiesMu.Unlock()
	if jiffiesProg != nil {
		return jiffiesProg, nil
	}
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
	jiffiesProg = p
	return p, nil
}

// clockNow is the entries' clock now: what the program's ct_now returns.
func clockNow() (uint64, error) {
	scale, base, err := jiffyClock()
	if err != nil {
		return 0, err
	}
	p, err := loadJiffiesProg()
	if err != nil {
		return 0, err
	}
	buf := make([]byte, 8)
	if _, err := p.Run(&ebpf.RunOptions{Context: buf, ContextOut: buf}); err != nil {
		return 0, fmt.Errorf("read jiffies: %w", err)
	}
	return (binary.NativeEndian.Uint64(buf) - base) * scale, nil
}
