package kernel

import (
	"encoding/binary"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"
)

// Jiffies has no user-space counterpart (times(2) counts USER_HZ clock ticks, not jiffies), so
// it is read through a four-instruction syscall program calling bpf_jiffies64.
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
		Name:    "fp_jiffies",
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

// Jiffies is the kernel's jiffies counter now (bpf_jiffies64: it starts at INITIAL_JIFFIES, not
// 0). It needs CAP_BPF.
func Jiffies() (uint64, error) {
	p, err := loadJiffiesProg()
	if err != nil {
		return 0, err
	}
	buf := make([]byte, 8)
	if _, err := p.Run(&ebpf.RunOptions{Context: buf, ContextOut: buf}); err != nil {
		return 0, fmt.Errorf("read jiffies: %w", err)
	}
	return binary.NativeEndian.Uint64(buf), nil
}

// hzChoices are the CONFIG_HZ values Linux's Kconfig offers (kernel/Kconfig.hz).
var hzChoices = []int{100, 250, 300, 1000}

// calibrationSpan is how long CalibrateHZ counts jiffies: 25 of them at HZ=250, and within a
// few microseconds, where 250 and 300 are 20% apart.
const calibrationSpan = 100 * time.Millisecond

// CalibrateHZ measures the jiffy rate against CLOCK_MONOTONIC over about 100 ms, from one
// jiffy's tick to another's, and returns the nearest value CONFIG_HZ can have (100, 250, 300
// or 1000), with the rate measured. For kernels whose config is nowhere to read (containers).
func CalibrateHZ() (hz int, measured float64, err error) {
	edge := func() (uint64, time.Time, error) {
		j0, err := Jiffies()
		if err != nil {
			return 0, time.Time{}, err
		}
		for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); {
			j, err := Jiffies()
			if err != nil {
				return 0, time.Time{}, err
			}
			if j != j0 {
				return j, time.Now(), nil // time.Now reads CLOCK_MONOTONIC
			}
		}
		return 0, time.Time{}, fmt.Errorf("jiffies did not move in a second")
	}
	j0, t0, err := edge()
	if err != nil {
		return 0, 0, err
	}
	time.Sleep(calibrationSpan)
	j1, t1, err := edge()
	if err != nil {
		return 0, 0, err
	}
	measured = float64(j1-j0) / t1.Sub(t0).Seconds()
	best := 0
	for _, c := range hzChoices {
		if best == 0 || math.Abs(math.Log(measured/float64(c))) < math.Abs(math.Log(measured/float64(best))) {
			best = c
		}
	}
	// Further than halfway (in ratio) to a neighbour: not one of Kconfig's values.
	if r := measured / float64(best); r < 0.9 || r > 1.1 {
		return 0, measured, fmt.Errorf("jiffies advance at %.1f/s, not a CONFIG_HZ Linux offers", measured)
	}
	return best, measured, nil
}
