package stats_test

import (
	"slices"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/flowplane/flowplane/internal/stats"
	"github.com/flowplane/flowplane/internal/testenv"
)

func TestTotal(t *testing.T) {
	t.Parallel()
	if n := stats.Total([]uint64{1, 2, 3}); n != 6 {
		t.Errorf("Total = %d, want 6", n)
	}
	if n := stats.Total(nil); n != 0 {
		t.Errorf("Total(nil) = %d", n)
	}
}

// TestSumAndAll read a per-CPU array as stats.h declares one, filled from user space.
func TestSumAndAll(t *testing.T) {
	t.Parallel()
	testenv.Privileged(t)
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: 8, MaxEntries: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		t.Fatal(err)
	}
	perCPU := make([]uint64, cpus)
	for i := range perCPU {
		perCPU[i] = uint64(i + 1) // 1 + 2 + … + cpus
	}
	if err := m.Put(uint32(1), perCPU); err != nil {
		t.Fatal(err)
	}
	want := uint64(cpus * (cpus + 1) / 2)
	if n, err := stats.Sum(m, 1); err != nil || n != want {
		t.Errorf("Sum = %d, %v; want %d", n, err, want)
	}
	if all, err := stats.All(m); err != nil || !slices.Equal(all, []uint64{0, want, 0}) {
		t.Errorf("All = %v, %v; want [0 %d 0]", all, err, want)
	}
	if _, err := stats.Sum(m, 3); err == nil {
		t.Error("Sum past max_entries succeeded")
	}
}
