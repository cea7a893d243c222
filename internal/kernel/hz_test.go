package kernel_test

import (
	"testing"

	"github.com/flowplane/flowplane/internal/kernel"
	"github.com/flowplane/flowplane/internal/testenv"
)

// TestCalibrateHZ: the calibrated jiffy rate is the kernel config's CONFIG_HZ.
func TestCalibrateHZ(t *testing.T) {
	testenv.Privileged(t)
	got, measured, err := kernel.CalibrateHZ()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("jiffies advance at %.2f/s: HZ=%d", measured, got)
	want, err := kernel.ConfigHZ()
	if err != nil {
		testenv.Unavailable(t, "no kernel config to compare with (/boot/config-$(uname -r) or /proc/config.gz; CONFIG_IKCONFIG_PROC): %v", err)
	}
	if got != want {
		t.Errorf("calibrated HZ=%d (%.2f/s), kernel config says CONFIG_HZ=%d", got, measured, want)
	}
	if hz, err := kernel.HZ(); err != nil || hz != want {
		t.Errorf("HZ() = %d, %v; want %d", hz, err, want)
	}
}

func TestJiffiesAdvance(t *testing.T) {
	testenv.Privileged(t)
	a, err := kernel.Jiffies()
	if err != nil {
		t.Fatal(err)
	}
	b, err := kernel.Jiffies()
	if err != nil || b < a {
		t.Fatalf("jiffies %d then %d (%v)", a, b, err)
	}
}
