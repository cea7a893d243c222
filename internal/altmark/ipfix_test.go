package altmark

import (
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/flowplane/flowplane/internal/testenv"
)

// TestIPFIXDecodedByTshark exports a period to a UDP socket and decodes what arrived with
// Wireshark's IPFIX dissector: templates, counters and PSAMP packet reports, field by field.
func TestIPFIXDecodedByTshark(t *testing.T) {
	testenv.Need(t, "tshark")
	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	port := conn.LocalAddr().(*net.UDPAddr).Port
	x, err := newExporter(&IPFIX{Collector: conn.LocalAddr().String(), Transport: "udp", ObservationDomain: 7, Enterprise: documentationPEN},
		"r1", 37*sec)
	if err != nil {
		t.Fatal(err)
	}
	const n = 1763856000
	p := testPeriod(n, 2) // 2 points × 2 IPv4 samples + 1 IPv6 sample
	// A TAI time with a known UTC: 2025-11-23 00:00:00.25 UTC + 37 s.
	utc := time.Date(2025, 11, 23, 0, 0, 0, 250_000_000, time.UTC)
	p.Samples[0].TAINs = utc.UnixNano() + 37*sec
	nc, ns, err := x.Export(p)
	x.Close()
	if err != nil || nc != 2 || ns != 5 {
		t.Fatalf("export: %d counters, %d samples, %v", nc, ns, err)
	}

	// The datagrams, as a capture tshark reads.
	pcap := filepath.Join(t.TempDir(), "ipfix.pcap")
	f, _ := os.Create(pcap)
	w := pcapgo.NewWriter(f)
	w.WriteFileHeader(65536, layers.LinkTypeRaw)
	conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	msgs := 0
	for {
		buf := make([]byte, 65536)
		k, _, err := conn.ReadFromUDP(buf)
		if err != nil {
			break
		}
		msgs++
		ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: net.IPv4(127, 0, 0, 1), DstIP: net.IPv4(127, 0, 0, 1)}
		udp := &layers.UDP{SrcPort: 40000, DstPort: layers.UDPPort(port)}
		udp.SetNetworkLayerForChecksum(ip)
		sb := gopacket.NewSerializeBuffer()
		gopacket.SerializeLayers(sb, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ip, udp, gopacket.Payload(buf[:k]))
		w.WritePacket(gopacket.CaptureInfo{Timestamp: time.Now(), CaptureLength: len(sb.Bytes()), Length: len(sb.Bytes())}, sb.Bytes())
		if msgs == 6 { // 3 templates, counters, IPv4 samples, IPv6 samples
			break
		}
	}
	f.Close()
	if msgs != 6 {
		t.Fatalf("%d IPFIX messages arrived, want 6", msgs)
	}
	out, err := exec.Command("tshark", "-r", pcap, "-d", "udp.port=="+strconv.Itoa(port)+",cflow", "-T", "json").Output()
	if err != nil {
		t.Fatalf("tshark: %v", err)
	}
	var packets []struct {
		Source struct {
			Layers map[string]json.RawMessage `json:"layers"`
		} `json:"_source"`
	}
	if err := json.Unmarshal(out, &packets); err != nil {
		t.Fatal(err)
	}
	// Flatten each message's cflow tree into "field=value" lines.
	var all []string
	for _, pk := range packets {
		cf, ok := pk.Source.Layers["cflow"]
		if !ok {
			t.Fatalf("a message was not decoded as IPFIX: %v", pk.Source.Layers)
		}
		var tree any
		json.Unmarshal(cf, &tree)
		flatten(tree, &all)
	}
	text := strings.Join(all, "\n")
	if strings.Contains(text, "_ws.expert") || strings.Contains(text, "malformed") {
		t.Errorf("tshark reports problems:\n%s", text)
	}
	for _, want := range []string{
		"cflow.version=10",
		"cflow.od_id=7",
		"cflow.template_id=256", "cflow.template_id=257", "cflow.template_id=258",
		"cflow.packets=" + strconv.FormatInt(p.Counters[0].Packets, 10),
		"cflow.octets=" + strconv.FormatInt(p.Counters[1].Bytes, 10),
		"cflow.if_name=eth0",
		"cflow.direction=1",
		"cflow.srcaddr=198.18.0.1",
		"cflow.dstaddr=198.18.1.2",
		"cflow.srcaddrv6=fd00::1",
		"cflow.dstport=6001",
		"cflow.protocol=17",
		"cflow.selector_id=1",
		"cflow.digest_hash_value=" + strconv.Itoa(0xabcd0000),
		"cflow.observation_domain_name=r1",
		"cflow.observation_time_nanoseconds=Nov 23, 2025 00:00:00.250000000",
		"cflow.enterprise_private_entry=00:00:00:4d",         // flowMonId 77
		"cflow.enterprise_private_entry=ff:ff:ff:ff",         // no FlowMonID
		"cflow.abstimestart=Nov 22, 2025 23:59:23.000000000", // TAI 1763856000 s − 37 s
		"cflow.template_ipfix_field_pen=32473",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("tshark's decode lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("tshark decoded:\n%s", text)
	}
}

func flatten(v any, out *[]string) {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			if s, ok := e.(string); ok {
				*out = append(*out, k+"="+s)
			} else if arr, ok := e.([]any); ok {
				for _, a := range arr {
					if s, ok := a.(string); ok {
						*out = append(*out, k+"="+s)
					} else {
						flatten(a, out)
					}
				}
			} else {
				flatten(e, out)
			}
		}
	case []any:
		for _, e := range v {
			flatten(e, out)
		}
	}
}

// TestRunnerExportsEveryRecordedPeriod runs the loop with an IPFIX collector: every recorded
// period's counters and samples go out; an unreachable TCP collector fails Start.
func TestRunnerExportsEveryRecordedPeriod(t *testing.T) {
	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cfg := testConfig(t, "periods: 2\nipfix: {collector: '"+conn.LocalAddr().String()+"'}\n")
	r, _ := testRunner(t, cfg, newFakeClock(8_000_000*sec, 1<<62))
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	r.Wait()
	m := r.Metrics.ExportedRecs
	if c, s := testutil.ToFloat64(m.WithLabelValues("counters")), testutil.ToFloat64(m.WithLabelValues("samples")); c != 6 || s != 14 {
		t.Errorf("exported %v counter records, %v samples; want 6, 14", c, s)
	}
	conn.SetReadDeadline(time.Now().Add(time.Second))
	msgs := 0
	for buf := make([]byte, 65536); ; msgs++ {
		if _, _, err := conn.ReadFromUDP(buf); err != nil {
			break
		}
	}
	if msgs != 3+2*3 {
		t.Errorf("%d messages, want 3 templates + 2 periods × (counters, IPv4 and IPv6 samples)", msgs)
	}
	if st := r.Status(); st.ExportErrors != 0 || st.LastError != "" {
		t.Errorf("status %+v", st)
	}

	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	cfg.IPFIX = &IPFIX{Collector: addr, Transport: "tcp", ObservationDomain: 1, Enterprise: documentationPEN}
	if err := r.Start(); err == nil || !strings.Contains(err.Error(), "ipfix.collector") {
		t.Errorf("start with an unreachable collector: %v", err)
	}
}
