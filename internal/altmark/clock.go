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
