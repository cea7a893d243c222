package xdpgen

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// headMax is XDPGEN_HEAD_MAX of xdpgen.bpf.c: the longest template prefix restored per frame.
const headMax = 128

const (
	ethPIPv4   = 0x0800
	ethPIPv6   = 0x86dd
	ethP8021Q  = 0x8100
	ethP8021AD = 0x88a8
	protoTCP   = 6
	protoUDP   = 17
)

// layout is where the program finds the fields it rewrites in the template: offsets from the
// start of the frame, 0 where a field does not exist.
type layout struct {
	proto   uint8  // TCP, UDP, or 0 for anything else
	ipCsum  uint32 // IPv4 header checksum
	saddr   uint32 // last 32 bits of the source address
	l4      uint32 // TCP/UDP header (source port first)
	l4Csum  uint32 // TCP/UDP checksum
	seq     uint32 // TCP sequence number
	headLen uint32 // template bytes written back into every frame
}

// parseFrame finds the fields of an Ethernet (+ up to two VLAN tags) / IPv4 or IPv6 (no
// extension headers) / TCP or UDP frame. Other frames can be sent unchanged, not varied.
func parseFrame(f []byte) (layout, error) {
	var l layout
	if len(f) < 14 {
		return l, fmt.Errorf("frame of %d bytes is shorter than an Ethernet header", len(f))
	}
	l.headLen = uint32(min(len(f), headMax))
	off := 12
	typ := binary.BigEndian.Uint16(f[off:])
	for i := 0; i < 2 && (typ == ethP8021Q || typ == ethP8021AD) && len(f) >= off+6; i++ {
		off += 4
		typ = binary.BigEndian.Uint16(f[off:])
	}
	off += 2
	var proto uint8
	switch typ {
	case ethPIPv4:
		if len(f) < off+20 || f[off]>>4 != 4 || f[off]&0xf < 5 {
			return l, nil
		}
		ihl := int(f[off]&0xf) * 4
		if frag := binary.BigEndian.Uint16(f[off+6:]); frag&0x3fff != 0 {
			return l, nil // a fragment: no transport header to vary
		}
		proto = f[off+9]
		l.ipCsum, l.saddr = uint32(off+10), uint32(off+12)
		off += ihl
	case ethPIPv6:
		if len(f) < off+40 || f[off]>>4 != 6 {
			return l, nil
		}
		proto = f[off+6]
		l.saddr = uint32(off + 8 + 12) // last word of the 16-byte source address
		off += 40
	default:
		return l, nil
	}
	switch proto {
	case protoTCP:
		if len(f) < off+20 {
			return l, nil
		}
		l.l4Csum, l.seq = uint32(off+16), uint32(off+4)
	case protoUDP:
		if len(f) < off+8 {
			return l, nil
		}
		l.l4Csum = uint32(off + 6)
	default:
		return l, nil
	}
	l.proto, l.l4 = proto, uint32(off)
	return l, nil
}

// check reports whether the fields the config varies exist and lie within the restored head.
func (l layout) check(c *Config) error {
	within := func(name string, off, size uint32) error {
		if off == 0 {
			return fmt.Errorf("%s: the template is not an IPv4/IPv6 TCP/UDP frame", name)
		}
		if off+size > l.headLen {
			return fmt.Errorf("%s: field at byte %d is beyond the first %d bytes the generator rewrites", name, off, l.headLen)
		}
		return nil
	}
	if c.SrcPorts > 1 {
		if err := within("source ports", l.l4, 2); err != nil {
			return err
		}
	}
	if c.SrcAddrs > 1 {
		if err := within("source addresses", l.saddr, 4); err != nil {
			return err
		}
	}
	if c.Seq {
		if l.proto != protoTCP {
			return errors.New("sequence numbers: the template is not a TCP frame")
		}
		if err := within("sequence numbers", l.seq, 4); err != nil {
			return err
		}
	}
	if (c.SrcPorts > 1 || c.SrcAddrs > 1 || c.Seq) && l.l4Csum+2 > l.headLen {
		return fmt.Errorf("the transport checksum at byte %d is beyond the first %d bytes the generator rewrites", l.l4Csum, l.headLen)
	}
	return nil
}
