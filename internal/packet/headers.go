package packet

import "encoding/binary"

// Headers is a reference reading of a frame's headers as flowplane's BPF parsers document
// them (bpf/include/parse.h), written from the RFCs' layouts, for fuzz targets to compare the
// programs with: Ethernet with up to two VLAN tags, IPv4 with its IHL, IPv6 with up to five
// extension headers (hop-by-hop, routing, destination options, AH, fragment) before the
// upper layer.
type Headers struct {
	EtherType uint16
	VLANs     int   // tags skipped
	L3        int   // offset of the IP header
	Family    int   // 4 or 6; 0: not IP
	L4        int   // offset of the transport header
	Proto     uint8 // upper-layer protocol
	End       int   // where the IP packet ends by its length field (IPv6: payload length)
	Fragment  bool  // an IPv4 fragment or an IPv6 fragment header
	// Malformed names the header that does not parse, "" if all up to L4 do: "ethernet"
	// (truncated, VLAN tags included), "ipv4" or "ipv6" (truncated, a bad version or IHL),
	// "ext" (an extension header truncated, or more than parse.h walks). The fields after the
	// failure are zero.
	Malformed string
}

// ReadHeaders reads frame's headers up to the transport header.
func ReadHeaders(frame []byte) Headers {
	h := Headers{Malformed: "ethernet"}
	if len(frame) < 14 {
		return h
	}
	off, et := 14, binary.BigEndian.Uint16(frame[12:])
	for h.VLANs < 2 && (et == 0x8100 || et == 0x88a8) {
		if off+4 > len(frame) {
			return h
		}
		et = binary.BigEndian.Uint16(frame[off+2:])
		off += 4
		h.VLANs++
	}
	h.EtherType, h.L3 = et, off
	ip := frame[off:]
	switch et {
	case 0x0800:
		h.Malformed = "ipv4"
		if len(ip) < 20 || ip[0]>>4 != 4 || ip[0]&0xf < 5 || int(ip[0]&0xf)*4 > len(ip) {
			return h
		}
		h.Family, h.Proto = 4, ip[9]
		h.L4 = off + int(ip[0]&0xf)*4
		h.End = off + int(binary.BigEndian.Uint16(ip[2:]))
		h.Fragment = binary.BigEndian.Uint16(ip[6:])&0x3fff != 0
	case 0x86dd:
		h.Malformed = "ipv6"
		if len(ip) < 40 || ip[0]>>4 != 6 {
			return h
		}
		h.Family, h.Malformed = 6, "ext"
		h.End = off + 40 + int(binary.BigEndian.Uint16(ip[4:]))
		next, at := ip[6], off+40
		for i := 0; ; i++ {
			if i == 6 {
				return h // parse.h gives up after six headers
			}
			n := 0
			switch next {
			case 0, 43, 60: // hop-by-hop, routing, destination options: 8-byte units less 1
				if at+2 > len(frame) {
					return h
				}
				n = (int(frame[at+1]) + 1) * 8
			case 51: // AH: 4-byte units less 2
				if at+2 > len(frame) {
					return h
				}
				n = (int(frame[at+1]) + 2) * 4
			case 44:
				if at+8 > len(frame) {
					return h
				}
				n, h.Fragment = 8, true
			default:
				h.Proto, h.L4 = next, at
			}
			if n == 0 {
				break
			}
			next = frame[at]
			at += n
			if at > len(frame) {
				return h
			}
		}
	}
	h.Malformed = "" // parsed, or not IP: nothing to parse
	return h
}
