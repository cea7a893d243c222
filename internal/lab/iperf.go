package lab

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"time"
)

// IperfResult is what iperf3 -J reports at the end of a run.
type IperfResult struct {
	SentBPS     float64 `json:"sent_bps"`     // sender's bits per second
	ReceivedBPS float64 `json:"received_bps"` // receiver's bits per second (goodput)
	Retransmits int     `json:"retransmits"`
	LostPercent float64 `json:"lost_percent"` // UDP only
	Packets     int     `json:"packets"`      // UDP only: datagrams sent
}

var iperfPort atomic.Int32

// Iperf runs an iperf3 server on node server (for one test) and the client on node client
// towards addr, with extra client arguments (e.g. "-t", "3", "-u").
func (l *Lab) Iperf(ctx context.Context, client, server, addr string, args ...string) (IperfResult, error) {
	port := fmt.Sprint(25201 + iperfPort.Add(1)%1000)
	srv, err := l.Command(ctx, server, "iperf3", "-s", "-1", "-p", port)
	if err != nil {
		return IperfResult{}, err
	}
	if err := srv.Start(); err != nil {
		return IperfResult{}, fmt.Errorf("start iperf3 server on %s: %w", server, err)
	}
	defer func() { _ = srv.Process.Kill(); _ = srv.Wait() }()
	if err := l.waitListening(ctx, server, port); err != nil {
		return IperfResult{}, err
	}
	cargs := append([]string{"-c", addr, "-p", port, "-J"}, args...)
	cmd, err := l.Command(ctx, client, "iperf3", cargs...)
	if err != nil {
		return IperfResult{}, err
	}
	out, err := cmd.Output()
	res, perr := parseIperf(out)
	if perr != nil {
		return res, fmt.Errorf("iperf3 %s on %s: %w", strings.Join(cargs, " "), client, perr)
	}
	if err != nil {
		return res, fmt.Errorf("iperf3 %s on %s: %w", strings.Join(cargs, " "), client, err)
	}
	return res, nil
}

// waitListening polls until a TCP socket listens on port on node. (A probe connect would not
// do: iperf3 counts it as a failed test.)
func (l *Lab) waitListening(ctx context.Context, node, port string) error {
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		cmd, err := l.Command(ctx, node, "ss", "-Hltn", "sport = :"+port)
		if err != nil {
			return err
		}
		if out, _ := cmd.Output(); strings.Contains(string(out), "LISTEN") {
			return nil
		}
	}
	return fmt.Errorf("iperf3 server on %s does not listen on port %s after 10s", node, port)
}

func parseIperf(out []byte) (IperfResult, error) {
	var r struct {
		End struct {
			SumSent struct {
				BPS         float64 `json:"bits_per_second"`
				Retransmits int     `json:"retransmits"`
			} `json:"sum_sent"`
			SumReceived struct {
				BPS float64 `json:"bits_per_second"`
			} `json:"sum_received"`
			Sum struct { // UDP
				BPS         float64 `json:"bits_per_second"`
				LostPercent float64 `json:"lost_percent"`
				Packets     int     `json:"packets"`
			} `json:"sum"`
		} `json:"end"`
		Error string `json:"error"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		return IperfResult{}, fmt.Errorf("output is not JSON: %w: %.200s", err, out)
	}
	if r.Error != "" {
		return IperfResult{}, fmt.Errorf("%s", r.Error)
	}
	res := IperfResult{SentBPS: r.End.SumSent.BPS, ReceivedBPS: r.End.SumReceived.BPS, Retransmits: r.End.SumSent.Retransmits,
		LostPercent: r.End.Sum.LostPercent, Packets: r.End.Sum.Packets}
	if res.ReceivedBPS == 0 {
		res.ReceivedBPS = r.End.Sum.BPS
	}
	return res, nil
}
