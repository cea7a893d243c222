package vnet

import (
	"bytes"
	"context"
	"crypto/sha256"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/flowplane/flowplane/internal/nsrun"
	"github.com/flowplane/flowplane/internal/testenv"
	"github.com/flowplane/flowplane/internal/topo"
)

// tapNode puts a TAP device in a fresh namespace (Linux side 198.19.77.1/24) and runs a vnet
// node on it (198.19.77.2/24).
func tapNode(t *testing.T) (string, *Node) {
	testenv.Privileged(t)
	testenv.Need(t, "ping")
	ns := testenv.Netns(t)
	vaddr := netip.MustParsePrefix("198.19.77.2/24")
	tap, err := openTAPIn(ns, vaddr, netip.MustParsePrefix("198.19.77.1/24"))
	if err != nil {
		t.Fatalf("tap in %s: %v", ns, err)
	}
	n := NewNode(NodeConfig{Name: "v", Router: true}, []IfaceConfig{{Name: "tap0", Addr: vaddr, Peer: netip.MustParseAddr("198.19.77.1"), Link: tap}})
	n.StartLinks()
	n.Start()
	t.Cleanup(n.Close)
	return ns, n
}

func randomBytes(n int) []byte {
	r := rand.New(rand.NewPCG(9, 9))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func TestTAPLinuxPingsVnet(t *testing.T) {
	t.Parallel()
	ns, _ := tapNode(t)
	out, err := nsrun.Output(ns, exec.Command("ping", "-c", "3", "-i", "0.2", "-W", "2", "198.19.77.2"))
	if err != nil || !strings.Contains(string(out), "3 received") {
		t.Fatalf("linux ping of vnet: %v\n%s", err, out)
	}
}

func TestTAPLinuxToVnetTCP(t *testing.T) {
	t.Parallel()
	ns, n := tapNode(t)
	l, err := n.Listen(":9000")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	sum := acceptSum(l)
	var c net.Conn
	if err := nsrun.Do(ns, func() error {
		var err error
		c, err = net.DialTimeout("tcp", "198.19.77.2:9000", 10*time.Second)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	data := randomBytes(8 << 20)
	if _, err := io.Copy(c, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	_ = c.(*net.TCPConn).CloseWrite()
	select {
	case s := <-sum:
		if s != sha256.Sum256(data) {
			t.Fatal("sha256 differs")
		}
	case <-time.After(time.Minute):
		t.Fatal("transfer did not finish")
	}
	c.Close()
}

func TestTAPVnetToLinuxTCP(t *testing.T) {
	t.Parallel()
	ns, n := tapNode(t)
	var l net.Listener
	if err := nsrun.Do(ns, func() error {
		var err error
		l, err = net.Listen("tcp", "198.19.77.1:9001")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	sum := acceptSum(l)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := n.Dial(ctx, "198.19.77.1:9001")
	if err != nil {
		t.Fatal(err)
	}
	data := randomBytes(8 << 20)
	if _, err := io.Copy(c, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	_ = c.CloseWrite()
	select {
	case s := <-sum:
		if s != sha256.Sum256(data) {
			t.Fatal("sha256 differs")
		}
	case <-time.After(time.Minute):
		t.Fatal("transfer did not finish")
	}
	c.Close()
}

// A whole network with a TAP interface on r1: Linux in the namespace reaches h2, two hops away.
func TestTAPAttachedToNetwork(t *testing.T) {
	t.Parallel()
	testenv.Privileged(t)
	testenv.Need(t, "ping")
	ns := testenv.Netns(t)
	tp, err := topo.Load("testdata/line.yaml")
	if err != nil {
		t.Fatal(err)
	}
	nw, err := Start(tp, Options{BasePort: -1, TAPs: []TAPSpec{{Node: "r1", Netns: ns}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nw.Close)
	if err := nw.WaitConverged(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	h2 := nw.Node("h2")
	tapAddr := nw.Node("r1").Iface("tap0").Peer // the Linux side
	deadline := time.Now().Add(20 * time.Second)
	for h2.MTU(tapAddr) == 0 { // RIP carries the TAP subnet to h2
		if time.Now().After(deadline) {
			t.Fatal("h2 never learned the TAP subnet")
		}
		time.Sleep(10 * time.Millisecond)
	}
	out, err := nsrun.Output(ns, exec.Command("ping", "-c", "3", "-i", "0.2", "-W", "3", "198.18.2.2"))
	if err != nil || !strings.Contains(string(out), "ttl=62") { // any reply, two routers on the way
		t.Fatalf("linux ping of h2 through r1: %v\n%s", err, out)
	}
	l, err := h2.Listen(":9100")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err == nil {
			_, _ = io.Copy(c, c)
			c.Close()
		}
	}()
	var c net.Conn
	if err := nsrun.Do(ns, func() error {
		var err error
		c, err = net.DialTimeout("tcp", "198.18.2.2:9100", 10*time.Second)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	msg := randomBytes(1 << 20)
	go func() { _, _ = c.Write(msg); _ = c.(*net.TCPConn).CloseWrite() }()
	_ = c.SetDeadline(time.Now().Add(time.Minute))
	got, err := io.ReadAll(c)
	if err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("echo through vnet from Linux: %d bytes, %v", len(got), err)
	}
	c.Close()
}
