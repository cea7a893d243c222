package tcp

import (
	"math"
	"time"
)

// Cubic is RFC 9438 CUBIC with fast convergence and the Reno-friendly region.
type Cubic struct {
	wMax       float64 // segments
	k          float64 // seconds
	epochStart time.Duration
	inEpoch    bool
	wEst       float64 // Reno-friendly estimate, segments
	cwndAcc    float64 // fractional segments for congestion avoidance
}

const (
	cubicC    = 0.4
	cubicBeta = 0.7
)

func (c *Cubic) Name() string { return "cubic" }

func (c *Cubic) Init(s *CCState) {
	s.Cwnd = min(10*s.MSS, max(2*s.MSS, 14600))
	s.Ssthresh = 1 << 30
}

func (c *Cubic) OnAck(s *CCState, acked int, _ time.Duration) {
	if s.Cwnd < s.Ssthresh {
		s.Cwnd += min(acked, 2*s.MSS)
		return
	}
	mss := float64(s.MSS)
	cwnd := float64(s.Cwnd) / mss
	if !c.inEpoch {
		c.inEpoch = true
		c.epochStart = s.Now
		if c.wMax < cwnd {
			c.k = 0
			c.wMax = cwnd
		} else {
			c.k = math.Cbrt((c.wMax - cwnd) / cubicC)
		}
		c.wEst = cwnd
	}
	rtt := s.SRTT
	if rtt <= 0 {
		rtt = time.Millisecond
	}
	t := (s.Now - c.epochStart + rtt).Seconds()
	target := c.wMax + cubicC*math.Pow(t-c.k, 3)
	// Reno-friendly estimate (RFC 9438 4.3), alpha = 3(1-beta)/(1+beta).
	alpha := 3 * (1 - cubicBeta) / (1 + cubicBeta)
	c.wEst += alpha * float64(acked) / mss / cwnd
	if c.wEst > target {
		target = c.wEst
	}
	if target > cwnd {
		target = min(target, 1.5*cwnd)
		c.cwndAcc += (target - cwnd) / cwnd * float64(acked) / mss
	} else {
		c.cwndAcc += 0.01 * float64(acked) / mss / cwnd // probe slowly near the plateau
	}
	if c.cwndAcc >= 1 {
		whole := math.Floor(c.cwndAcc)
		s.Cwnd += int(whole) * s.MSS
		c.cwndAcc -= whole
	}
}

func (c *Cubic) OnCongestion(s *CCState) {
	cwnd := float64(s.Cwnd) / float64(s.MSS)
	if cwnd < c.wMax { // fast convergence
		c.wMax = cwnd * (1 + cubicBeta) / 2
	} else {
		c.wMax = cwnd
	}
	s.Ssthresh = max(int(float64(s.Cwnd)*cubicBeta), 2*s.MSS)
	s.Cwnd = s.Ssthresh
	c.inEpoch = false
	c.cwndAcc = 0
}

func (c *Cubic) OnTimeout(s *CCState) {
	c.OnCongestion(s)
	s.Cwnd = s.MSS
	c.inEpoch = false
}

func (c *Cubic) OnRecoveryEnd(s *CCState) { s.Cwnd = s.Ssthresh }
