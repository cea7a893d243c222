// Package labtest brings labs up for tests: a unique name per test, teardown in t.Cleanup, and
// helpers to run commands and iperf3 on nodes.
package labtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/flowplane/flowplane/internal/lab"
	"github.com/flowplane/flowplane/internal/testenv"
)

// Up starts the topology in yaml (its name: key, if any, is replaced by a unique one) and
// removes the lab when the test ends. It fails t (in CI) or skips it when not privileged.
func Up(t testing.TB, yaml string) *lab.Lab {
	t.Helper()
	testenv.Privileged(t)
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	name := "t" + hex.EncodeToString(b)
	top, err := lab.Parse(t.Name()+".yaml", []byte(yaml), name)
	if err != nil {
		t.Fatalf("topology: %v", err)
	}
	l, err := lab.Up(t.Name()+".yaml", []byte(yaml), top)
	if err != nil {
		t.Fatalf("lab up: %v", err)
	}
	t.Cleanup(func() {
		if err := lab.Down(name); err != nil {
			t.Errorf("lab down: %v", err)
		}
	})
	return l
}

// Run runs a command on node and returns its combined output, failing t if it fails.
func Run(t testing.TB, l *lab.Lab, node string, args ...string) string {
	t.Helper()
	out, err := Try(l, node, args...)
	if err != nil {
		t.Fatalf("%s on %s: %v\n%s", strings.Join(args, " "), node, err, out)
	}
	return out
}

// Try runs a command on node and returns its combined output and error.
func Try(l *lab.Lab, node string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd, err := l.Command(ctx, node, args[0], args[1:]...)
	if err != nil {
		return "", err
	}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// Addr returns a node's address on its first interface: "4" for IPv4, "6" for IPv6.
func Addr(t testing.TB, l *lab.Lab, node, family string) string {
	t.Helper()
	n, err := l.Node(node)
	if err != nil {
		t.Fatal(err)
	}
	if family == "6" {
		return n.Ifaces[0].IPv6.Addr().String()
	}
	return n.Ifaces[0].IPv4.Addr().String()
}

// IperfResult is what iperf3 -J reports at the end of a test.
type IperfResult struct {
	SentBPS     float64 // sender's bits per second
	ReceivedBPS float64 // receiver's bits per second (goodput)
	Retransmits int
	LostPercent float64 // UDP only
	Packets     int     // UDP only: datagrams sent
}

// Iperf runs an iperf3 server on server (one test, then it exits) and the client on client
// towards addr with extra client args (e.g. "-t", "3", "-u"), and returns the client's summary.
func Iperf(t testing.TB, l *lab.Lab, client, server, addr string, args ...string) IperfResult {
	t.Helper()
	testenv.Need(t, "iperf3")
	port := fmt.Sprint(20000 + int(time.Now().UnixNano()%10000))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	srv, err := l.Command(ctx, server, "iperf3", "-s", "-1", "-p", port)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatalf("start iperf3 server on %s: %v", server, err)
	}
	defer func() { _ = srv.Wait() }()
	waitListening(t, l, server, port)
	cargs := append([]string{"-c", addr, "-p", port, "-J"}, args...)
	out, err := Try(l, client, append([]string{"iperf3"}, cargs...)...)
	if err != nil {
		t.Fatalf("iperf3 %s: %v\n%s", strings.Join(cargs, " "), err, out)
	}
	return parseIperf(t, out)
}

// waitListening polls until a TCP socket listens on port on node. (A probe connect would not
// do: iperf3 counts it as a failed test.)
func waitListening(t testing.TB, l *lab.Lab, node, port string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if out, _ := Try(l, node, "ss", "-Hltn", "sport = :"+port); strings.Contains(out, "LISTEN") {
			return
		}
	}
	t.Fatalf("nothing listens on port %s of %s after 10s", port, node)
}

func parseIperf(t testing.TB, out string) IperfResult {
	t.Helper()
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
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("iperf3 output is not JSON: %v\n%s", err, out)
	}
	if r.Error != "" {
		t.Fatalf("iperf3: %s", r.Error)
	}
	res := IperfResult{SentBPS: r.End.SumSent.BPS, ReceivedBPS: r.End.SumReceived.BPS, Retransmits: r.End.SumSent.Retransmits,
		LostPercent: r.End.Sum.LostPercent, Packets: r.End.Sum.Packets}
	if res.ReceivedBPS == 0 {
		res.ReceivedBPS = r.End.Sum.BPS
	}
	return res
}
