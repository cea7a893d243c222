package altmark

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"

	"github.com/flowplane/flowplane/internal/packet"
)

// The Wireshark dissector examples/wireshark/altmark.lua against the marker: packets the marker
// colored through BPF_PROG_TEST_RUN are written to a pcap and decoded by tshark with the
// script; what tshark reads must be what the marker was configured to write. tshark is a
// dependency (scripts/setup.sh installs it): without it the test fails, it does not skip.

const dissectorScript = "../../examples/wireshark/altmark.lua"

// tsharkFields are the fields the tests read, in this order, one line per frame.
var tsharkFields = []string{"frame.number", "altmark.header", "altmark.nh", "altmark.type", "altmark.len",
	"altmark.flowmon_id", "altmark.l", "altmark.d", "altmark.reserved"}

// dissected is one frame as tshark printed tsharkFields: field name → value ("" when absent;
// several occurrences joined by commas).
type dissected map[string]string

// tsharkBin is tshark's path; the test fails (never skips) without it.
func tsharkBin(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("tshark")
	if err != nil {
		t.Fatalf("tshark is not installed (%v); `make setup` (scripts/setup.sh) installs it: this test needs it and does not skip", err)
	}
	return bin
}

// tshark runs tshark with the dissector on file; extra are more arguments (-Y, -V, -T …).
// stderr must hold nothing but tshark's note on running as root: a Lua error while loading the
// script is printed there and tshark would go on without it.
func tshark(t *testing.T, file string, extra ...string) string {
	t.Helper()
	bin := tsharkBin(t)
	script, err := filepath.Abs(dissectorScript)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(script); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, append([]string{"-r", file, "-X", "lua_script:" + script}, extra...)...)
	// A home of its own: no personal preferences or plugins (a copy of altmark.lua in the
	// personal plugins directory would register the protocol twice).
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HOME="+home, "XDG_CONFIG_HOME="+filepath.Join(home, ".config"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("tshark %v: %v\nstderr:\n%s", cmd.Args[1:], err, stderr.String())
	}
	for _, line := range strings.Split(strings.TrimSpace(stderr.String()), "\n") {
		if line != "" && !strings.HasPrefix(line, "Running as user") {
			t.Fatalf("tshark %v wrote to stderr:\n%s", cmd.Args[1:], stderr.String())
		}
	}
	return stdout.String()
}

// tsharkDissect decodes every frame of file into tsharkFields (plus more).
func tsharkDissect(t *testing.T, file string, more ...string) []dissected {
	t.Helper()
	fields := append(append([]string{}, tsharkFields...), more...)
	args := []string{"-T", "fields", "-E", "separator=|", "-E", "occurrence=a", "-E", "aggregator=,"}
	for _, f := range fields {
		args = append(args, "-e", f)
	}
	var out []dissected
	for _, line := range strings.Split(strings.TrimRight(tshark(t, file, args...), "\n"), "\n") {
		vals := strings.Split(line, "|")
		if len(vals) != len(fields) {
			t.Fatalf("tshark line %q: %d fields, want %d", line, len(vals), len(fields))
		}
		d := dissected{}
		for i, f := range fields {
			d[f] = vals[i]
		}
		out = append(out, d)
	}
	return out
}

// writePcap writes frames to a new pcap (Ethernet); caplen[i], when set, cuts frame i's
// captured bytes as a snap length would (its original length stays the frame's).
func writePcap(t *testing.T, frames [][]byte, caplen map[int]int) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "altmark.pcap")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w := pcapgo.NewWriter(f)
	if err := w.WriteFileHeader(65535, layers.LinkTypeEthernet); err != nil {
		t.Fatal(err)
	}
	ts := time.Unix(1700000000, 0)
	for i, fr := range frames {
		data := fr
		if n, ok := caplen[i]; ok {
			data = fr[:n]
		}
		ci := gopacket.CaptureInfo{Timestamp: ts.Add(time.Duration(i) * time.Millisecond), CaptureLength: len(data), Length: len(fr)}
		if err := w.WritePacket(ci, data); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// runInWindow runs the marker on in until one run lies wholly within [lo, hi) ns of a period
// of the given color (the marker sets D only in a period's central half).
func runInWindow(t *testing.T, prog *ebpf.Program, in []byte, c *MarkConfig, color int, lo, hi int64) markRun {
	t.Helper()
	l := int64(c.Period)
	for range 1000 {
		now := tai()
		if p := now % l; p < lo || p >= hi || int((now/l+int64(c.StartColor))%2) != color {
			time.Sleep(time.Duration(l / 100))
			continue
		}
		r := runKnown(t, prog, in, c)
		end := tai()
		if r.color == color && r.pos >= lo && end/l == r.period && end%l < hi {
			return r
		}
	}
	t.Fatalf("no run of color %d within [%d, %d) ns of a period", color, lo, hi)
	return markRun{}
}

// wantMark is what the marker was configured to write into one frame.
type wantMark struct {
	name   string
	header int // 0 Hop-by-Hop, 60 Destination Options
	nh     int // the options header's next header
	id     uint32
	l, d   bool
}

func boolField(t *testing.T, field, v string) bool {
	t.Helper()
	switch v {
	case "1", "True", "true":
		return true
	case "0", "False", "false":
		return false
	}
	t.Fatalf("%s = %q: not a boolean", field, v)
	return false
}

func TestDissectorAltMark(t *testing.T) {
	t.Parallel()
	tsharkBin(t)
	const period = 100 * time.Millisecond
	l := int64(period)
	// D is set in [L/4, 3L/4) only (double marking), so runs in the middle of that window
	// are delay-marked and runs in the first quarter are not; a margin of L/20 either side.
	windows := map[bool][2]int64{true: {l/4 + l/20, 3*l/4 - l/20}, false: {l / 20, l/4 - l/20}}
	payload := []byte("altmark dissector test")
	exp := []byte{0x1e, 2, 0xaa, 0xbb} // RFC 4727 experimental option
	udp := func() *packet.Builder { return packet.IP(src6, dst6).UDP(40000, 5201) }
	tcp := func() *packet.Builder { return packet.IP(src6, dst6).TCP(40000, 80, "PA").Seq(1000).Ack(7) }
	inputs := []struct {
		name     string
		in       []byte
		inserted bool // the marker inserts the header (else it updates an option in place)
		nh       int  // the next header of the options header holding the option
		header   int  // -1: the configured one (inserted)
	}{
		{"udp", udp().Payload(payload).Bytes(), true, 17, -1},
		{"tcp", tcp().Payload(payload).Bytes(), true, 6, -1},
		{"in place, destination options after hop-by-hop", packet.IP(src6, dst6).
			IPv6Ext(layers.IPProtocolIPv6HopByHop, []byte{1, 4, 0, 0, 0, 0}).
			IPv6Ext(layers.IPProtocolIPv6Destination, append(altmarkOpt(0xfffff, false, true), exp...)).
			UDP(40000, 5201).Payload(payload).Bytes(), false, 17, 60},
		{"in place, after other options and padding", packet.IP(src6, dst6).
			IPv6Ext(layers.IPProtocolIPv6Destination, bytes.Join([][]byte{exp, {1, 0}, altmarkOpt(1, true, true)}, nil)).
			TCP(40000, 80, "A").Payload(payload).Bytes(), false, 6, 60},
	}
	configs := []struct {
		name, cfg string
		id        uint32 // the FlowMonID every packet gets; 0: per flow (below)
		header    int
	}{
		{"destination options", "flowmon_id: 0xabcde\n", 0xabcde, 60},
		{"hop-by-hop", "header: hop-by-hop\nflowmon_id: 0xfffff\n", 0xfffff, 0},
		// Per flow: a fresh marker gives its flows the range's IDs in the order they start:
		// the udp input (run first) 4096, the tcp one 4097.
		{"per-flow destination options", "flowmon_id: per-flow\nflowmon_range: 4096-4099\n", 0, 60},
	}

	var frames [][]byte
	var wants []wantMark
	for _, cf := range configs {
		objs, c := loadMark(t, "carrier: ipv6-altmark\nperiod: 100ms\ndouble: {packets: 65536}\n"+cf.cfg)
		flowIDs := map[string]uint32{}
		for _, in := range inputs {
			if cf.id == 0 && !in.inserted {
				continue // per-flow IDs: the inserted cases suffice
			}
			for _, color := range []int{0, 1} {
				for _, delay := range []bool{false, true} {
					w := windows[delay]
					r := runInWindow(t, objs.AltmarkMark, in.in, c, color, w[0], w[1])
					want := wantMark{name: fmt.Sprintf("%s, %s, color %d, delay %v", cf.name, in.name, color, delay),
						header: in.header, nh: in.nh, id: cf.id, l: color == 1, d: delay}
					if want.header < 0 {
						want.header = cf.header
					}
					if cf.id == 0 {
						proto := "udp"
						if in.nh == 6 {
							proto = "tcp"
						}
						if _, ok := flowIDs[proto]; !ok {
							flowIDs[proto] = 4096 + uint32(len(flowIDs))
						}
						want.id = flowIDs[proto]
					}
					if in.inserted { // the marker's bytes, read without tshark
						id, gl, gd := flowmonOf(t, r.out)
						if id != want.id || gl != want.l || gd != want.d || int(r.out[eth+6]) != want.header || int(r.out[eth+40]) != want.nh {
							t.Fatalf("%s: the marker wrote header %d next %d FlowMonID %#x L %v D %v", want.name,
								r.out[eth+6], r.out[eth+40], id, gl, gd)
						}
					}
					frames = append(frames, r.out)
					wants = append(wants, want)
				}
			}
		}
	}
	// Frames without the option: nothing may be decoded in them.
	plain := [][]byte{
		udp().Payload(payload).Bytes(),
		packet.IP(src6, dst6).IPv6Ext(layers.IPProtocolIPv6Destination, exp).UDP(1, 2).Bytes(),
		packet.IP(src4, dst4).UDP(40000, 5201).Payload(payload).Bytes(),
	}
	frames = append(frames, plain...)

	ours := []string{"altmark.malformed", "altmark.truncated", "altmark.reserved_set"} // expert info
	got := tsharkDissect(t, writePcap(t, frames, nil), ours...)
	if len(got) != len(frames) {
		t.Fatalf("tshark printed %d frames, want %d", len(got), len(frames))
	}
	for i, w := range wants {
		g := got[i]
		num := func(f string) uint64 {
			n, err := strconv.ParseUint(g[f], 0, 32)
			if err != nil {
				t.Fatalf("%s: %s = %q (%v); frame %v", w.name, f, g[f], err, g)
			}
			return n
		}
		if num("altmark.flowmon_id") != uint64(w.id) || boolField(t, "altmark.l", g["altmark.l"]) != w.l ||
			boolField(t, "altmark.d", g["altmark.d"]) != w.d || num("altmark.header") != uint64(w.header) ||
			num("altmark.nh") != uint64(w.nh) || num("altmark.type") != 0x12 || num("altmark.len") != 4 ||
			num("altmark.reserved") != 0 {
			t.Errorf("%s: tshark read %v, want header %d next %d FlowMonID %d L %v D %v", w.name, g, w.header, w.nh, w.id, w.l, w.d)
		}
		for _, e := range ours {
			if g[e] != "" {
				t.Errorf("%s: expert info %s on a well-formed packet", w.name, e)
			}
		}
	}
	for _, g := range got[len(wants):] {
		for _, f := range tsharkFields[1:] {
			if g[f] != "" {
				t.Errorf("frame %s has no AltMark option, tshark read %s = %q", g["frame.number"], f, g[f])
			}
		}
	}
	// The display filter the documentation gives selects the marked frames only.
	if n := len(strings.Fields(tshark(t, writePcap(t, frames, nil), "-Y", "altmark", "-T", "fields", "-e", "frame.number"))); n != len(wants) {
		t.Errorf("-Y altmark: %d frames, want %d", n, len(wants))
	}
	t.Logf("%d marked frames decoded (%d configurations × inputs × colors × delay flag)", len(wants), len(configs))
}

// TestDissectorMalformed: truncated and malformed AltMark options (made from a frame the
// marker wrote) and option headers decode without a Lua error, with expert info, and the
// well-formed frame after them still decodes.
func TestDissectorMalformed(t *testing.T) {
	t.Parallel()
	tsharkBin(t)
	objs, c := loadMark(t, "carrier: ipv6-altmark\nperiod: 100ms\nflowmon_id: 0x12345\n")
	good := runKnown(t, objs.AltmarkMark, packet.IP(src6, dst6).UDP(40000, 5201).Payload([]byte("payload")).Bytes(), c)
	if id, _, _ := flowmonOf(t, good.out); id != 0x12345 {
		t.Fatalf("the marker wrote FlowMonID %#x", id)
	}
	opt := eth + 40 + 2 // the option's type byte in the inserted header
	patch := func(off int, b ...byte) []byte {
		f := bytes.Clone(good.out)
		copy(f[off:], b)
		return f
	}
	// cut is the frame ending n bytes into the option, its IPv6 payload length kept: a packet
	// that was cut short (not a short capture).
	cut := func(n int) []byte { return bytes.Clone(good.out[:opt+n]) }
	cases := []struct {
		name   string
		frame  []byte
		caplen int    // > 0: captured bytes (snap length)
		expert string // in the expert messages
		id     bool   // the FlowMonID is still decoded
	}{
		{"capture ends 3 bytes into the option data", good.out, opt + 5, "capture ends 3 bytes into the option's 4 data bytes", false},
		{"capture ends after the option type", good.out, opt + 1, "capture ends after the option type", false},
		{"packet cut inside the option", cut(4), 0, "capture ends 2 bytes into the option's 4 data bytes", false},
		{"opt data len 2", patch(opt+1, 2), 0, "Opt Data Len 2; RFC 9343 defines 4", false},
		{"opt data len 6", patch(opt+1, 6), 0, "Opt Data Len 6; RFC 9343 defines 4", false},
		// PadN of 0 bytes, then the option: its 6 bytes start 4 bytes before the header's end.
		{"option overruns its header", patch(opt, 1, 0, 0x12, 4), 0, "option overruns its Destination Options header (4 bytes from the option to the header's end, need 6)", false},
		// PadN of 3 bytes, then the option type as the header's last byte.
		{"option type at the header's end", patch(opt, 1, 3, 0, 0, 0, 0x12), 0, "option type at the last byte of its Destination Options header", false},
		{"header longer than the packet", patch(eth+41, 5), 0, "overruns the IPv6 payload", true},
		{"another option overruns the header", patch(opt, 0x1e, 9), 0, "option 0x1e (length 9) at Destination Options header byte 2 overruns the header (8 bytes)", false},
		{"reserved bits set", patch(opt+5, 0x01), 0, "Reserved bits are not zero", true},
	}
	var frames [][]byte
	caplen := map[int]int{}
	for i, tc := range cases {
		frames = append(frames, tc.frame)
		if tc.caplen > 0 {
			caplen[i] = tc.caplen
		}
	}
	frames = append(frames, good.out)
	file := writePcap(t, frames, caplen)
	got := tsharkDissect(t, file, "_ws.expert.message", "_ws.lua.error", "altmark.malformed", "altmark.truncated")
	if len(got) != len(frames) {
		t.Fatalf("tshark printed %d frames, want %d", len(got), len(frames))
	}
	for i, tc := range cases {
		g := got[i]
		if g["_ws.lua.error"] != "" {
			t.Errorf("%s: Lua error %q", tc.name, g["_ws.lua.error"])
		}
		if !strings.Contains(g["_ws.expert.message"], tc.expert) {
			t.Errorf("%s: expert messages %q, want one with %q", tc.name, g["_ws.expert.message"], tc.expert)
		}
		if hasID := g["altmark.flowmon_id"] != ""; hasID != tc.id {
			t.Errorf("%s: FlowMonID %q decoded: %v, want %v", tc.name, g["altmark.flowmon_id"], hasID, tc.id)
		} else if hasID && g["altmark.flowmon_id"] != strconv.Itoa(0x12345) {
			t.Errorf("%s: FlowMonID %s, want %d", tc.name, g["altmark.flowmon_id"], 0x12345)
		}
	}
	last := got[len(got)-1]
	if last["altmark.flowmon_id"] != strconv.Itoa(0x12345) || last["altmark.malformed"] != "" || last["altmark.truncated"] != "" {
		t.Errorf("the well-formed frame after the malformed ones: %v", last)
	}
	// The full tree (-V) of every frame: no Lua error anywhere in it.
	if v := tshark(t, file, "-V"); strings.Contains(v, "Lua Error") {
		t.Errorf("tshark -V shows a Lua error:\n%s", v)
	}
}
