package vnet

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// Capture writes packets seen on an interface (both directions) as pcapng with link type
// LINKTYPE_IPV4, which tshark and Wireshark read directly.
type Capture struct {
	mu    sync.Mutex
	w     *bufio.Writer
	c     io.Closer
	count uint64
	err   error
}

const linkTypeIPv4 = 228

// NewCapture starts a pcapng stream on w (closed by Close if it is an io.Closer).
func NewCapture(w io.Writer, ifname string) (*Capture, error) {
	c := &Capture{w: bufio.NewWriterSize(w, 256<<10)}
	if cl, ok := w.(io.Closer); ok {
		c.c = cl
	}
	// Section header block.
	shb := make([]byte, 28)
	le := binary.LittleEndian
	le.PutUint32(shb[0:], 0x0A0D0D0A)
	le.PutUint32(shb[4:], 28)
	le.PutUint32(shb[8:], 0x1A2B3C4D)
	le.PutUint16(shb[12:], 1)
	le.PutUint16(shb[14:], 0)
	le.PutUint64(shb[16:], ^uint64(0)) // section length unknown
	le.PutUint32(shb[24:], 28)
	// Interface description block with an if_name option.
	name := []byte(ifname)
	optLen := 4 + pad4(len(name)) + 4 // if_name + opt_endofopt
	idbLen := 20 + optLen
	idb := make([]byte, idbLen)
	le.PutUint32(idb[0:], 1)
	le.PutUint32(idb[4:], uint32(idbLen))
	le.PutUint16(idb[8:], linkTypeIPv4)
	le.PutUint32(idb[12:], 0) // no snap length limit
	le.PutUint16(idb[16:], 2) // if_name
	le.PutUint16(idb[18:], uint16(len(name)))
	copy(idb[20:], name)
	le.PutUint32(idb[idbLen-4:], uint32(idbLen))
	if _, err := c.w.Write(shb); err != nil {
		return nil, fmt.Errorf("capture: %w", err)
	}
	if _, err := c.w.Write(idb); err != nil {
		return nil, fmt.Errorf("capture: %w", err)
	}
	return c, nil
}

func pad4(n int) int { return (n + 3) &^ 3 }

// Packet records one packet with the current time.
func (c *Capture) Packet(pkt []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return
	}
	ts := uint64(time.Now().UnixMicro())
	n := len(pkt)
	total := 32 + pad4(n)
	var hdr [28]byte
	le := binary.LittleEndian
	le.PutUint32(hdr[0:], 6) // enhanced packet block
	le.PutUint32(hdr[4:], uint32(total))
	le.PutUint32(hdr[8:], 0)
	le.PutUint32(hdr[12:], uint32(ts>>32))
	le.PutUint32(hdr[16:], uint32(ts))
	le.PutUint32(hdr[20:], uint32(n))
	le.PutUint32(hdr[24:], uint32(n))
	var tail [8]byte
	le.PutUint32(tail[pad4(n)-n:], uint32(total))
	_, c.err = c.w.Write(hdr[:])
	if c.err == nil {
		_, c.err = c.w.Write(pkt)
	}
	if c.err == nil {
		_, c.err = c.w.Write(tail[:pad4(n)-n+4])
	}
	c.count++
}

// Count is the number of packets recorded.
func (c *Capture) Count() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.count
}

// Close flushes and closes the output.
func (c *Capture) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	err := c.w.Flush()
	if c.c != nil {
		if cerr := c.c.Close(); err == nil {
			err = cerr
		}
	}
	if err == nil {
		err = c.err
	}
	return err
}

// StartCapture records ifc's packets into a pcapng file at path; stop with StopCapture.
func (n *Node) StartCapture(ifc *Iface, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("capture on %s: %w", ifc.Name, err)
	}
	c, err := NewCapture(f, n.Name+":"+ifc.Name)
	if err != nil {
		f.Close()
		return err
	}
	if old := ifc.capture.Swap(c); old != nil {
		_ = old.Close()
	}
	return nil
}

// StopCapture ends a capture and reports how many packets it holds.
func (n *Node) StopCapture(ifc *Iface) (uint64, error) {
	c := ifc.capture.Swap(nil)
	if c == nil {
		return 0, fmt.Errorf("no capture running on %s", ifc.Name)
	}
	return c.Count(), c.Close()
}
