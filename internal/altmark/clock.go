package altmark

import (
	"time"

	"golang.org/x/sys/unix"
)

// Clock is the TAI clock the period loop runs on: the kernel's CLOCK_TAI, the clock the BPF
// programs read with bpf_ktime_get_tai_ns, so loop and datapath agree on period boundaries.
type Clock interface {
	// Now is the TAI time in nanoseconds.
	Now() int64
	// Until waits until TAI time t, or until cancel is closed (nil never is), and reports
	// whether t was reached.
	Until(t int64, cancel <-chan struct{}) bool
	// TAIMinusUTC is the kernel's TAI offset (37 s since 2017 where NTP sets it, 0 where nothing
	// does): IPFIX times are UTC.
	TAIMinusUTC() int64
}

// taiClock is the kernel's CLOCK_TAI.
type taiClock struct{}

func (taiClock) Now() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_TAI, &ts); err != nil {
		panic("clock_gettime(CLOCK_TAI): " + err.Error()) // Linux has had it since 3.10
	}
	return ts.Nano()
}

func (c taiClock) Until(t int64, cancel <-chan struct{}) bool {
	for {
		d := t - c.Now()
		if d <= 0 {
			return true
		}
		// Timers run on the monotonic clock; CLOCK_TAI can be stepped, so check again on waking.
		timer := time.NewTimer(time.Duration(d))
		select {
		case <-timer.C:
		case <-cancel:
			timer.Stop()
			return false
		}
	}
}

func (c taiClock) TAIMinusUTC() int64 {
	var rt unix.Timespec
	tai := c.Now()
	if err := unix.ClockGettime(unix.CLOCK_REALTIME, &rt); err != nil {
		return 0
	}
	// Whole seconds: the two readings are a few hundred nanoseconds apart.
	return (tai - rt.Nano() + int64(time.Second)/2) / int64(time.Second) * int64(time.Second)
}

// taiMinusMono is CLOCK_TAI - CLOCK_MONOTONIC in nanoseconds: constant while nobody steps the
// clock (both advance at the rate NTP/PTP sets). Of five readings, the one whose two
// CLOCK_MONOTONIC reads around the CLOCK_TAI read are closest.
func taiMinusMono() int64 {
	var off int64
	best := int64(-1)
	for range 5 {
		var a, t, b unix.Timespec
		if unix.ClockGettime(unix.CLOCK_MONOTONIC, &a) != nil || unix.ClockGettime(unix.CLOCK_TAI, &t) != nil ||
			unix.ClockGettime(unix.CLOCK_MONOTONIC, &b) != nil {
			panic("clock_gettime failed") // Linux has had both since 3.10
		}
		if d := b.Nano() - a.Nano(); best < 0 || d < best {
			best, off = d, t.Nano()-(a.Nano()+b.Nano())/2
		}
	}
	return off
}
