package tcp

import (
	"fmt"
	"time"
)

// CCState is what a congestion controller reads and writes. Windows are in bytes.
type CCState struct {
	Cwnd     int
	Ssthresh int
	MSS      int
	InFlight int           // bytes sent and not yet acknowledged, at the time of the event
	SRTT     time.Duration // zero until the first sample
	MinRTT   time.Duration
	Now      time.Duration
}

// CongestionControl decides the congestion window. The connection handles loss detection and
// recovery mechanics (RFC 6675 / RFC 6582); the controller only sizes the window. Methods are
// called with the connection locked, so implementations need no locking of their own.
type CongestionControl interface {
	Name() string
	// Init sets the initial window (RFC 5681 / RFC 6928).
	Init(s *CCState)
	// OnAck is called for each ACK that acknowledges new data outside loss recovery.
	OnAck(s *CCState, acked int, rtt time.Duration)
	// OnCongestion is called once when loss recovery starts: set Ssthresh and Cwnd.
	OnCongestion(s *CCState)
	// OnTimeout is called on a retransmission timeout.
	OnTimeout(s *CCState)
	// OnRecoveryEnd is called when the recovery point is acknowledged.
	OnRecoveryEnd(s *CCState)
}

// NewCC returns a controller by name: reno or cubic.
func NewCC(name string) (CongestionControl, error) {
	switch name {
	case "", "cubic":
		return &Cubic{}, nil
	case "reno":
		return &Reno{}, nil
	}
	return nil, fmt.Errorf("unknown congestion control %q; use reno or cubic", name)
}

// Reno is RFC 5681 with appropriate byte counting (RFC 3465, L=2).
type Reno struct {
	acc int // bytes acknowledged towards the next congestion-avoidance increase
}

func (r *Reno) Name() string { return "reno" }

func (r *Reno) Init(s *CCState) {
	s.Cwnd = min(10*s.MSS, max(2*s.MSS, 14600)) // RFC 6928 initial window
	s.Ssthresh = 1 << 30
}

func (r *Reno) OnAck(s *CCState, acked int, _ time.Duration) {
	if s.Cwnd < s.Ssthresh {
		s.Cwnd += min(acked, 2*s.MSS)
		return
	}
	r.acc += acked
	if r.acc >= s.Cwnd {
		r.acc -= s.Cwnd
		s.Cwnd += s.MSS
	}
}

func (r *Reno) OnCongestion(s *CCState) {
	s.Ssthresh = max(s.InFlight/2, 2*s.MSS)
	s.Cwnd = s.Ssthresh
	r.acc = 0
}

func (r *Reno) OnTimeout(s *CCState) {
	s.Ssthresh = max(s.InFlight/2, 2*s.MSS)
	s.Cwnd = s.MSS
	r.acc = 0
}

func (r *Reno) OnRecoveryEnd(s *CCState) { s.Cwnd = s.Ssthresh }
