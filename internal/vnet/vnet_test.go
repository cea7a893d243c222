package vnet

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/flowplane/flowplane/internal/cli"
	"github.com/flowplane/flowplane/internal/topo"
)

func startNet(t *testing.T, file string) *Network {
	t.Helper()
	tp, err := topo.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	nw, err := Start(tp, Options{BasePort: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nw.Close)
	if err := nw.WaitConverged(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	return nw
}

func addrOf(t *testing.T, nw *Network, node string) netip.Addr {
	return nw.Node(node).Ifaces()[0].Addr.Addr()
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestPingAndTracerouteAcrossRouters(t *testing.T) {
	t.Parallel()
	nw := startNet(t, "testdata/diamond.yaml")
	h1, h2 := nw.Node("h1"), addrOf(t, nw, "h2")
	r, err := h1.Ping(ctxT(t), h2, 1, 56, 64)
	if err != nil || !r.Reply || r.From != h2 || r.TTL != 62 {
		t.Fatalf("ping: %+v %v", r, err)
	}
	hops, err := h1.Traceroute(ctxT(t), h2, 10, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(hops) != 3 || hops[2].From != h2 {
		t.Fatalf("traceroute: %+v", hops)
	}
	if hops[0].From != nw.Node("r1").Ifaces()[0].Addr.Addr() {
		t.Fatalf("first hop %v is not r1", hops[0].From)
	}
	// A TTL of 1 expires at r1: time exceeded from r1.
	r, err = h1.Ping(ctxT(t), h2, 2, 0, 1)
	if err != nil || r.Reply || r.Describe != "time exceeded" {
		t.Fatalf("ttl 1: %+v %v", r, err)
	}
	// An address nobody owns inside a known subnet of r2's: unreachable from the last router.
	_, err = h1.Ping(ctxT(t), netip.MustParseAddr("203.0.113.1"), 3, 0, 64)
	if !errors.Is(err, ErrNoRoute) {
		t.Fatalf("ping outside the network: %v", err)
	}
}

func TestFragmentedPingOverSmallMTU(t *testing.T) {
	t.Parallel()
	nw := startNet(t, "testdata/diamond.yaml")
	h1, h2 := nw.Node("h1"), addrOf(t, nw, "h2")
	r, err := h1.Ping(ctxT(t), h2, 1, 4000, 64) // 1500 then 1280 MTU: fragmented twice over
	if err != nil || !r.Reply {
		t.Fatalf("big ping: %+v %v", r, err)
	}
	if nw.Node("h2").Stats.Reassembled.Load() == 0 || nw.Node("r2").Stats.Fragmented.Load() == 0 {
		t.Fatal("no fragmentation happened")
	}
}

func TestTCPTransferThroughRouters(t *testing.T) {
	t.Parallel()
	nw := startNet(t, "testdata/diamond.yaml")
	h1, h2 := nw.Node("h1"), nw.Node("h2")
	l, err := h2.Listen(":80")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	data := make([]byte, 20<<20)
	rng := rand.New(rand.NewPCG(1, 1))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	got := acceptSum(l)
	c, err := h1.Dial(ctxT(t), netip.AddrPortFrom(addrOf(t, nw, "h2"), 80).String())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(c, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	select {
	case s := <-got:
		if s != sha256.Sum256(data) {
			t.Fatal("sha256 mismatch")
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("transfer did not finish")
	}
	if mss := c.TCP().Info().MSS; mss > 1280-40 {
		t.Fatalf("mss %d does not respect the 1280 MTU on the path's last link", mss)
	}
	c.Close()
}

func TestHTTPOverVnet(t *testing.T) {
	t.Parallel()
	nw := startNet(t, "testdata/diamond.yaml")
	l, err := nw.Node("h2").Listen(":8080")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "hello from "+r.Host)
	})}
	go srv.Serve(l)
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{DialContext: nw.Node("h1").DialContext}, Timeout: time.Minute}
	resp, err := client.Get("http://" + netip.AddrPortFrom(addrOf(t, nw, "h2"), 8080).String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !bytes.HasPrefix(body, []byte("hello from 198.18.")) {
		t.Fatalf("body %q", body)
	}
}

func TestSocketErrors(t *testing.T) {
	t.Parallel()
	nw := startNet(t, "testdata/diamond.yaml")
	h1, h2 := nw.Node("h1"), nw.Node("h2")
	_, err := h1.Dial(ctxT(t), netip.AddrPortFrom(addrOf(t, nw, "h2"), 9).String())
	if !errors.Is(err, ErrRefused) {
		t.Fatalf("dial closed port: %v", err)
	}
	l, err := h2.Listen(":80")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h2.Listen(":80"); !errors.Is(err, ErrPortInUse) {
		t.Fatalf("listen twice: %v", err)
	}
	timedOut := make(chan struct{})
	go func() {
		c, err := l.Accept()
		if err == nil {
			<-timedOut // the peer closes only after the read deadline has fired
			c.Close()
		}
	}()
	c, err := h1.Dial(ctxT(t), netip.AddrPortFrom(addrOf(t, nw, "h2"), 80).String())
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
	var ne net.Error
	if _, err := c.Read(make([]byte, 1)); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read past deadline: %v", err)
	}
	close(timedOut)
	_ = c.SetReadDeadline(time.Time{})
	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("read after peer close: %v", err)
	}
	c.Close()
	if _, err := c.Write([]byte("x")); !errors.Is(err, ErrClosed) {
		t.Fatalf("write after close: %v", err)
	}
	l.Close()
	if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("accept after close: %v", err)
	}
	var ue *cli.UsageError
	if _, err := h1.Dial(ctxT(t), "nonsense"); !errors.As(err, &ue) {
		t.Fatalf("bad address: %v", err)
	}
}

func TestLinkDownReroutes(t *testing.T) {
	t.Parallel()
	nw := startNet(t, "testdata/diamond.yaml")
	h1, h2 := nw.Node("h1"), addrOf(t, nw, "h2")
	direct := nw.Topo.Links[1] // r1-r2
	nw.SetLinkUp(direct, false)
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second) // a probe may be lost mid-change
		r, err := h1.Ping(ctx, h2, 1, 0, 64)
		cancel()
		if err == nil && r.Reply && r.TTL == 61 { // one more router on the way round through r3
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no detour after link down: %+v %v", r, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := nw.WaitConverged(10 * time.Second); err != nil { // with the link down
		t.Fatal(err)
	}
	nw.SetLinkUp(direct, true)
	if err := nw.WaitConverged(10 * time.Second); err != nil {
		t.Fatal(err)
	}
}

func TestMalformedPacketsCountedAndDropped(t *testing.T) {
	t.Parallel()
	nw := startNet(t, "testdata/diamond.yaml")
	r1 := nw.Node("r1")
	ifc := r1.Ifaces()[0]
	r1.Input(ifc, []byte{0x45, 0, 0})
	good := r1.build(addrOf(t, nw, "h1"), ifc.Addr.Addr(), 1, 64, []byte{8, 0, 0, 0, 0, 0, 0, 0})
	good[10] ^= 0xff
	r1.Input(ifc, good)
	r1.Input(ifc, append([]byte{0x65}, make([]byte, 30)...))
	st := &r1.Stats
	if st.BadHeader.Load() != 1 || st.BadChecksum.Load() != 1 || st.BadVersion.Load() != 1 {
		t.Fatalf("counters: header %d checksum %d version %d", st.BadHeader.Load(), st.BadChecksum.Load(), st.BadVersion.Load())
	}
}

func TestBadTopologyIsAUsageError(t *testing.T) {
	t.Parallel()
	tp, err := topo.Parse("t.yaml", []byte("name: t\nnodes: {a: {}, b: {}}\nlinks: [{endpoints: [a, b]}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = StartNode(tp, "zz", Options{})
	var ue *cli.UsageError
	if !errors.As(err, &ue) {
		t.Fatalf("unknown node: %v", err)
	}
}

func FuzzNodeInput(f *testing.F) {
	f.Add([]byte{0x45, 0, 0, 20, 0, 0, 0x20, 0, 64, 1, 0, 0, 198, 18, 0, 1, 198, 18, 0, 2})
	f.Add([]byte{0x45, 0, 0, 28, 0, 1, 0, 0, 64, 6, 0, 0, 198, 18, 0, 1, 198, 18, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0})
	tp, err := topo.Load("testdata/diamond.yaml")
	if err != nil {
		f.Fatal(err)
	}
	nw, err := Start(tp, Options{BasePort: -1})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(nw.Close)
	f.Fuzz(func(t *testing.T, pkt []byte) {
		n := nw.Node("r1")
		if len(pkt) >= 20 {
			// Fix the checksum half the time so the fuzzer gets past the IP header.
			if pkt[0]&1 == 0 {
				pkt[10], pkt[11] = 0, 0
				ihl := int(pkt[0]&0xf) * 4
				if ihl >= 20 && ihl <= len(pkt) {
					c := checksum(pkt[:ihl])
					pkt[10], pkt[11] = byte(c>>8), byte(c)
				}
			}
		}
		n.Input(n.Ifaces()[0], pkt)
	})
}

func TestNodeTalksToItself(t *testing.T) {
	t.Parallel()
	nw := startNet(t, "testdata/diamond.yaml")
	h1 := nw.Node("h1")
	self := addrOf(t, nw, "h1")
	if r, err := h1.Ping(ctxT(t), self, 1, 100, 64); err != nil || !r.Reply {
		t.Fatalf("ping self: %+v %v", r, err)
	}
	l, err := h1.Listen(":7")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err == nil {
			_, _ = io.Copy(c, c) // echo
			c.Close()
		}
	}()
	c, err := h1.Dial(ctxT(t), netip.AddrPortFrom(self, 7).String())
	if err != nil {
		t.Fatal(err)
	}
	msg := bytes.Repeat([]byte("loop"), 100000)
	go func() { _, _ = c.Write(msg); _ = c.CloseWrite() }()
	got, err := io.ReadAll(c)
	if err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("echo over loopback: %d bytes, %v", len(got), err)
	}
}

// acceptSum accepts one connection on l and sends the sha256 of everything it reads (zero if
// Accept fails).
func acceptSum(l net.Listener) <-chan [32]byte {
	sum := make(chan [32]byte, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			sum <- [32]byte{}
			return
		}
		h := sha256.New()
		_, _ = io.Copy(h, c)
		c.Close()
		sum <- [32]byte(h.Sum(nil))
	}()
	return sum
}
