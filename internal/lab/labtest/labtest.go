// Package labtest brings labs up for tests: a unique name per test, teardown in t.Cleanup, and
// helpers to run commands and iperf3 on nodes and to capture packets.
package labtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/pcapgo"

	"github.com/flowplane/flowplane/internal/lab"
	"github.com/flowplane/flowplane/internal/testenv"
)

// The topologies most tests need (see lab's definitions).
const (
	HostRouterHost = lab.HostRouterHost
	XDPRouter      = lab.XDPRouter
)

// Up starts the topology in yaml (its name: key, if any, is replaced by a unique one) and
// removes the lab when the test ends, unless the test took it down itself. It fails t (in CI)
// or skips it when not privileged.
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
		if err := lab.Down(name); err != nil && !errors.Is(err, lab.ErrNotFound) {
			t.Errorf("lab down: %v", err)
		}
	})
	return l
}

// Run runs a command on node and returns its combined output, failing t if it fails. A
// command that is not installed stops t through testenv.Need.
func Run(t testing.TB, l *lab.Lab, node string, args ...string) string {
	t.Helper()
	testenv.Need(t, args[0])
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

// IperfResult is lab.IperfResult.
type IperfResult = lab.IperfResult

// Iperf runs iperf3 from client to server's addr (see lab.Iperf), failing t on error.
func Iperf(t testing.TB, l *lab.Lab, client, server, addr string, args ...string) IperfResult {
	t.Helper()
	testenv.Need(t, "iperf3")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	r, err := l.Iperf(ctx, client, server, addr, args...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// Capture runs tcpdump on node with args (interface, options, filter: `-i eth0 -c 300 tcp`)
// while fn runs, and returns the packets it saw. It waits until tcpdump writes its file header
// (it is capturing) before calling fn, and stops it 200 ms after fn returns.
func Capture(t testing.TB, l *lab.Lab, node string, args []string, fn func()) []gopacket.Packet {
	t.Helper()
	testenv.Need(t, "tcpdump")
	file := filepath.Join(t.TempDir(), node+".pcap")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dump, err := l.Command(ctx, node, "tcpdump", append([]string{"--immediate-mode", "-U", "-s", "200", "-w", file}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	if err := dump.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if st, err := os.Stat(file); err == nil && st.Size() >= 24 { // the pcap header: capturing
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("tcpdump did not start")
		}
	}
	fn()
	time.Sleep(200 * time.Millisecond)
	_ = dump.Process.Signal(syscall.SIGINT) // it may have stopped itself (-c)
	_ = dump.Wait()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, err := pcapgo.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	var ps []gopacket.Packet
	for p := range gopacket.NewPacketSource(r, r.LinkType()).Packets() {
		ps = append(ps, p)
	}
	return ps
}
