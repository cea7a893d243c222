package conntrack

import (
	"fmt"
	"sync"
	"testing"

	"github.com/flowplane/flowplane/internal/nsrun"
	"github.com/flowplane/flowplane/internal/progrun"
)

// TestConcurrentUpdates hammers one TCP connection from both directions and opens and confirms
// many UDP flows, from several threads at once (the kernel spreads them over the CPUs). The
// lock-free updates must lose nothing: per-direction packet counts are exact, the window never
// moves backwards, no valid packet is refused and every flow ends up confirmed exactly once.
func TestConcurrentUpdates(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	ci, si := uint32(1000), uint32(5000)
	f.script(t, handshake(ci, si))

	const workers, rounds, flows = 4, 3000, 50
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- nsrun.Do(f.ns, func() error {
				prog := f.d.Program()
				send := func(frame []byte, ifindex int) (uint32, error) {
					r, err := progrun.Exec(prog, f.addressed(frame, ifindex), ifindex)
					return r.Ret, err
				}
				for i := 0; i < rounds; i++ {
					// Client data inside the first 1000 bytes; server ACKs of the start.
					if ret, err := send(tcp(true, "PA", ci+1+uint32(i%100)*10, si+1, 10), f.in.Index); err != nil || ret != xdpRedirect {
						return fmt.Errorf("client segment %d: verdict %d, %v", i, ret, err)
					}
					if ret, err := send(tcp(false, "A", si+1, ci+1, 0), f.out.Index); err != nil || ret != xdpRedirect {
						return fmt.Errorf("server ack %d: verdict %d, %v", i, ret, err)
					}
					if i < flows {
						sport := uint16(10000 + w*flows + i)
						if ret, err := send(udp(true, sport, 53), f.in.Index); err != nil || ret != xdpRedirect {
							return fmt.Errorf("udp query %d: verdict %d, %v", i, ret, err)
						}
						if ret, err := send(udp(false, sport, 53), f.out.Index); err != nil || ret != xdpRedirect {
							return fmt.Errorf("udp reply %d: verdict %d, %v", i, ret, err)
						}
					}
				}
				return nil
			})
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	var tcpEntry *Entry
	udpConfirmed := 0
	for _, e := range f.entries() {
		switch {
		case e.Proto == "tcp":
			tcpEntry = &e
		case e.Proto == "udp" && e.Confirmed && e.Packets == [2]uint64{1, 1}:
			udpConfirmed++
		default:
			t.Errorf("unexpected entry %+v", e)
		}
	}
	if tcpEntry == nil || tcpEntry.State != "ESTABLISHED" {
		t.Fatalf("tcp entry %+v", tcpEntry)
	}
	// The handshake sent 2 client and 1 server packet.
	if want := [2]uint64{2 + workers*rounds, 1 + workers*rounds}; tcpEntry.Packets != want {
		t.Errorf("tcp packets %v, want %v", tcpEntry.Packets, want)
	}
	if got := tcpEntry.raw.Tcp[0].TdEnd; got != ci+1+1000 {
		t.Errorf("client td_end %d, want %d", got, ci+1+1000)
	}
	if udpConfirmed != workers*flows {
		t.Errorf("%d udp flows confirmed, want %d", udpConfirmed, workers*flows)
	}
	c := f.counters()
	if c["new"] != 1+workers*flows || c["established"] != 1+workers*flows {
		t.Errorf("counters new %d established %d, want %d", c["new"], c["established"], 1+workers*flows)
	}
	for _, n := range StatNames {
		if len(n) > 8 && n[:8] == "invalid_" && c[n] != 0 {
			t.Errorf("%s = %d", n, c[n])
		}
	}
}
