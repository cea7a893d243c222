package conntrack

import (
	"fmt"
	"time"

	"github.com/cilium/ebpf"

	"github.com/flowplane/flowplane/internal/kernel"
)

// The entries' clock is nf_conntrack's: jiffies since boot, scaled to nanoseconds
// ((jiffies − INITIAL_JIFFIES) × jiffyNs), close to CLOCK_MONOTONIC. bpf_jiffies64 is an
// inlined load, where bpf_ktime_get_coarse_ns costs more than the rest of the timeout
// bookkeeping together; it has no user-space counterpart, so user space reads it through a
// four-instruction program (kernel.Jiffies).

// jiffyClock is the program's jiffy_ns and jiffies_base: the length of a jiffy in ns and the
// kernel's INITIAL_JIFFIES, (u64)(u32)(-300 × HZ), so that boot is 0.
func jiffyClock() (jiffyNs, base uint64, err error) {
	hz, err := kernel.HZ()
	if err != nil {
		return 0, 0, err
	}
	return uint64(time.Second) / uint64(hz), uint64(uint32(-300 * int32(hz))), nil
}

// setClock gives a conntrack program spec the clock's constants.
func setClock(spec *ebpf.CollectionSpec) error {
	jns, base, err := jiffyClock()
	if err != nil {
		return err
	}
	if err := spec.Variables["jiffy_ns"].Set(jns); err != nil {
		return fmt.Errorf("set jiffy length: %w", err)
	}
	if err := spec.Variables["jiffies_base"].Set(base); err != nil {
		return fmt.Errorf("set jiffies at boot: %w", err)
	}
	return nil
}

// clockNow is the entries' clock now: what the program's ct_now returns.
func clockNow() (uint64, error) {
	scale, base, err := jiffyClock()
	if err != nil {
		return 0, err
	}
	j, err := kernel.Jiffies()
	if err != nil {
		return 0, err
	}
	return (j - base) * scale, nil
}
