package altmark

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/vmware/go-ipfix/pkg/entities"
	"github.com/vmware/go-ipfix/pkg/exporter"
	"k8s.io/klog/v2"
)

// IPFIX export (RFC 7011) of every recorded period: one data record per measurement point and
// FlowMonID with the aggregates, and one PSAMP Packet Report (RFC 5476) per sample. Elements
// IANA has a number for are IANA's; the alternate-marking ones that
// draft-ietf-opsawg-ipfix-alt-mark defines have no IANA number yet, so they and the probe's own
// go out as enterprise-specific elements under the configured enterprise number (documented in
// docs/altmark.md "IPFIX export").

const (
	tmplCounters uint16 = 256 + iota
	tmplSamples4
	tmplSamples6
	templateRefresh = 60 // seconds between template resends over UDP (RFC 7011 §8.4)
	selectorID      = 1  // the probe's one selector: hash-based selection
	noFlowMonID     = 0xFFFFFFFF
)

// Elements. Time stamps are dateTimeNanoseconds on the wire (RFC 7011 §6.1.10: NTP format);
// go-ipfix cannot encode that type, so they are declared unsigned64 and given NTP values, which
// is the same eight octets.
func ianaIE(name string, id uint16, t entities.IEDataType) *entities.InfoElement {
	return entities.NewInfoElement(name, id, t, 0, entities.InfoElementLength[t])
}

var (
	ieOctetDelta  = ianaIE("octetDeltaCount", 1, entities.Unsigned64)
	iePacketDelta = ianaIE("packetDeltaCount", 2, entities.Unsigned64)
	ieProtocol    = ianaIE("protocolIdentifier", 4, entities.Unsigned8)
	ieSrcPort     = ianaIE("sourceTransportPort", 7, entities.Unsigned16)
	ieSrc4        = ianaIE("sourceIPv4Address", 8, entities.Ipv4Address)
	ieDstPort     = ianaIE("destinationTransportPort", 11, entities.Unsigned16)
	ieDst4        = ianaIE("destinationIPv4Address", 12, entities.Ipv4Address)
	ieSrc6        = ianaIE("sourceIPv6Address", 27, entities.Ipv6Address)
	ieDst6        = ianaIE("destinationIPv6Address", 28, entities.Ipv6Address)
	ieDirection   = ianaIE("flowDirection", 61, entities.Unsigned8) // 0 ingress, 1 egress
	ieIfname      = entities.NewInfoElement("interfaceName", 82, entities.String, 0, entities.VariableLength)
	ieFlowStart   = ianaIE("flowStartNanoseconds", 156, entities.Unsigned64) // first counted packet
	ieFlowEnd     = ianaIE("flowEndNanoseconds", 157, entities.Unsigned64)   // last counted packet
	ieIPTotalLen  = ianaIE("ipTotalLength", 224, entities.Unsigned64)
	ieObsDomName  = entities.NewInfoElement("observationDomainName", 300, entities.String, 0, entities.VariableLength)
	ieSelectorID  = ianaIE("selectorId", 302, entities.Unsigned64)
	ieObsTimeNs   = ianaIE("observationTimeNanoseconds", 325, entities.Unsigned64)
	ieDigestHash  = ianaIE("digestHashValue", 326, entities.Unsigned64)
	enterpriseIEs = []struct {
		name string
		id   uint16
		t    entities.IEDataType
	}{
		{"flowMonId", 1, entities.Unsigned32},           // the draft's FlowMonID (RFC 9343); all ones: none
		{"altMarkPeriod", 2, entities.Unsigned64},       // n = floor(TAI / L)
		{"altMarkPeriodLength", 3, entities.Unsigned64}, // L in nanoseconds
		{"altMarkColor", 4, entities.Unsigned8},         // the period's color: the draft's L flag value
		{"altMarkSampleCount", 5, entities.Unsigned64},  // samples kept in the period
		{"altMarkHashBits", 6, entities.Unsigned8},      // final hash length
		{"altMarkHashRef", 7, entities.Unsigned32},      // reference value of the hash selection
		{"altMarkMalformedCount", 8, entities.Unsigned64},
		{"altMarkMeanTimeNanoseconds", 9, entities.Unsigned64}, // mean time of counted packets (NTP format)
	}
)

// ipfixExporter sends periods to one collector.
type ipfixExporter struct {
	ep    *exporter.ExportingProcess
	probe string
	tai   int64 // TAI − UTC in ns
	ent   map[string]*entities.InfoElement
}

// quietKlog sends go-ipfix's klog lines to slog, warnings and errors only.
var quietKlog = sync.OnceFunc(func() {
	klog.SetSlogLogger(slog.New(warnHandler{slog.Default().Handler()}))
})

type warnHandler struct{ slog.Handler }

func (h warnHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn && h.Handler.Enabled(ctx, l)
}

func newExporter(cfg *IPFIX, probe string, taiMinusUTC int64) (*ipfixExporter, error) {
	quietKlog()
	ep, err := exporter.InitExportingProcess(exporter.ExporterInput{
		CollectorAddress:    cfg.Collector,
		CollectorProtocol:   cfg.Transport,
		ObservationDomainID: cfg.ObservationDomain,
		TempRefTimeout:      templateRefresh,
		PathMTU:             1500,
	})
	if err != nil {
		return nil, err
	}
	x := &ipfixExporter{ep: ep, probe: probe, tai: taiMinusUTC, ent: map[string]*entities.InfoElement{}}
	for _, e := range enterpriseIEs {
		x.ent[e.name] = entities.NewInfoElement(e.name, e.id, e.t, cfg.Enterprise, entities.InfoElementLength[e.t])
	}
	for id, ies := range map[uint16][]*entities.InfoElement{
		tmplCounters: x.countersTemplate(), tmplSamples4: x.samplesTemplate(false), tmplSamples6: x.samplesTemplate(true),
	} {
		set, err := entities.MakeTemplateSet(id, ies)
		if err == nil {
			_, err = ep.SendSet(set)
		}
		if err != nil {
			ep.CloseConnToCollector()
			return nil, fmt.Errorf("send template %d: %w", id, err)
		}
	}
	return x, nil
}

func (x *ipfixExporter) countersTemplate() []*entities.InfoElement {
	return []*entities.InfoElement{ieObsDomName, x.ent["altMarkPeriod"], x.ent["altMarkPeriodLength"], x.ent["altMarkColor"],
		ieIfname, ieDirection, x.ent["flowMonId"], iePacketDelta, ieOctetDelta, x.ent["altMarkSampleCount"],
		x.ent["altMarkHashBits"], x.ent["altMarkHashRef"], ieFlowStart, ieFlowEnd, x.ent["altMarkMeanTimeNanoseconds"],
		x.ent["altMarkMalformedCount"]}
}

// samplesTemplate is a PSAMP Packet Report (RFC 5476 §6.4): the selector, the observation time,
// the hash, and the packet's fields the hash covers.
func (x *ipfixExporter) samplesTemplate(v6 bool) []*entities.InfoElement {
	src, dst := ieSrc4, ieDst4
	if v6 {
		src, dst = ieSrc6, ieDst6
	}
	return []*entities.InfoElement{ieSelectorID, ieObsTimeNs, ieDigestHash, x.ent["altMarkPeriod"], x.ent["altMarkColor"],
		ieIfname, ieDirection, x.ent["flowMonId"], src, dst, ieProtocol, ieSrcPort, ieDstPort, ieIPTotalLen}
}

// ntp turns a TAI time in ns into RFC 7011's dateTimeNanoseconds (NTP: seconds since 1900 UTC
// and a binary fraction); 0 (no packet) stays 0.
func (x *ipfixExporter) ntp(tai int64) uint64 {
	if tai == 0 {
		return 0
	}
	const ntpEpoch = 2208988800 // seconds from 1900 to 1970
	utc := tai - x.tai
	sec := uint64(utc/int64(time.Second)) + ntpEpoch
	frac := (uint64(utc%int64(time.Second)) << 32) / uint64(time.Second)
	return sec<<32 | frac
}

func direction(d string) uint8 {
	if d == "out" {
		return 1
	}
	return 0
}

func flowMonID(id int64) uint32 {
	if id < 0 {
		return noFlowMonID
	}
	return uint32(id)
}

// Export sends p's counters and samples; it returns how many of each went out.
func (x *ipfixExporter) Export(p *Period) (int, int, error) {
	u8 := entities.NewUnsigned8InfoElement
	u32 := entities.NewUnsigned32InfoElement
	u64 := entities.NewUnsigned64InfoElement
	str := entities.NewStringInfoElement
	var recs []entities.Record
	for _, c := range p.Counters {
		recs = append(recs, entities.NewDataRecordFromElements(tmplCounters, []entities.InfoElementWithValue{
			str(ieObsDomName, x.probe), u64(x.ent["altMarkPeriod"], uint64(p.Period)), u64(x.ent["altMarkPeriodLength"], uint64(p.PeriodNs)),
			u8(x.ent["altMarkColor"], uint8(p.Color)), str(ieIfname, c.Ifname), u8(ieDirection, direction(c.Direction)),
			u32(x.ent["flowMonId"], flowMonID(c.FlowMonID)), u64(iePacketDelta, uint64(c.Packets)), u64(ieOctetDelta, uint64(c.Bytes)),
			u64(x.ent["altMarkSampleCount"], uint64(c.Samples)), u8(x.ent["altMarkHashBits"], uint8(c.HashBits)),
			u32(x.ent["altMarkHashRef"], uint32(c.HashRef)), u64(ieFlowStart, x.ntp(c.FirstTAINs)), u64(ieFlowEnd, x.ntp(c.LastTAINs)),
			u64(x.ent["altMarkMeanTimeNanoseconds"], x.ntp(c.MeanTAINs)), u64(x.ent["altMarkMalformedCount"], uint64(c.Malformed)),
		}))
	}
	nc := 0
	if len(recs) > 0 {
		n, _, err := x.ep.SendDataRecords(tmplCounters, recs, nil)
		nc = n
		if err != nil {
			return nc, 0, fmt.Errorf("counters: %w", err)
		}
	}
	var v4, v6 []entities.Record
	for _, s := range p.Samples {
		src, dst := net.ParseIP(s.SrcAddr), net.ParseIP(s.DstAddr)
		if src == nil || dst == nil {
			continue // the datapath gives parsed addresses; nothing to report otherwise
		}
		tmpl, srcIE, dstIE := tmplSamples6, ieSrc6, ieDst6
		is4 := src.To4() != nil && dst.To4() != nil
		if is4 {
			tmpl, srcIE, dstIE, src, dst = tmplSamples4, ieSrc4, ieDst4, src.To4(), dst.To4()
		}
		rec := entities.NewDataRecordFromElements(tmpl, []entities.InfoElementWithValue{
			u64(ieSelectorID, selectorID), u64(ieObsTimeNs, x.ntp(s.TAINs)), u64(ieDigestHash, uint64(uint32(s.Hash))),
			u64(x.ent["altMarkPeriod"], uint64(p.Period)), u8(x.ent["altMarkColor"], uint8(s.Color)),
			str(ieIfname, s.Ifname), u8(ieDirection, direction(s.Direction)), u32(x.ent["flowMonId"], flowMonID(s.FlowMonID)),
			entities.NewIPAddressInfoElement(srcIE, src), entities.NewIPAddressInfoElement(dstIE, dst),
			u8(ieProtocol, uint8(s.Proto)), entities.NewUnsigned16InfoElement(ieSrcPort, uint16(s.SrcPort)),
			entities.NewUnsigned16InfoElement(ieDstPort, uint16(s.DstPort)), u64(ieIPTotalLen, uint64(s.Length)),
		})
		if is4 {
			v4 = append(v4, rec)
		} else {
			v6 = append(v6, rec)
		}
	}
	ns := 0
	for _, b := range []struct {
		id   uint16
		recs []entities.Record
	}{{tmplSamples4, v4}, {tmplSamples6, v6}} {
		if len(b.recs) == 0 {
			continue
		}
		n, _, err := x.ep.SendDataRecords(b.id, b.recs, nil)
		ns += n
		if err != nil {
			return nc, ns, fmt.Errorf("samples: %w", err)
		}
	}
	return nc, ns, nil
}

// Close closes the connection to the collector.
func (x *ipfixExporter) Close() { x.ep.CloseConnToCollector() }
