package altmark

// The period record: docs/altmark-records.md is its definition. Go field order follows the
// tables there; the JSON and Parquet names are the column names.

// SchemaVersion is written in every record; bump it when a column changes meaning or goes away.
const SchemaVersion = 1

// Counter is one row of the counters table: one measurement point (and FlowMonID) in one period.
type Counter struct {
	PeriodNs      int64  `json:"period_ns" parquet:"period_ns"`
	Color         int32  `json:"color" parquet:"color"`
	StartTAINs    int64  `json:"start_tai_ns" parquet:"start_tai_ns"`
	Ifname        string `json:"ifname" parquet:"ifname"`
	Ifindex       int32  `json:"ifindex" parquet:"ifindex"`
	Direction     string `json:"direction" parquet:"direction"` // "in" or "out"
	Carrier       string `json:"carrier" parquet:"carrier"`
	FlowMonID     int64  `json:"flowmon_id" parquet:"flowmon_id"` // -1 when the carrier has none
	Packets       int64  `json:"packets" parquet:"packets"`
	Bytes         int64  `json:"bytes" parquet:"bytes"`
	Samples       int64  `json:"samples" parquet:"samples"`
	HashBits      int32  `json:"hash_bits" parquet:"hash_bits"`
	HashRef       int64  `json:"hash_ref" parquet:"hash_ref"`
	FirstTAINs    int64  `json:"first_tai_ns" parquet:"first_tai_ns"`
	LastTAINs     int64  `json:"last_tai_ns" parquet:"last_tai_ns"`
	MeanTAINs     int64  `json:"mean_tai_ns" parquet:"mean_tai_ns"`
	Malformed     int64  `json:"malformed" parquet:"malformed"`
	SchemaVersion int32  `json:"schema_version" parquet:"schema_version"`
}

// Sample is one row of the samples table: a hash-selected packet seen at one point.
type Sample struct {
	Ifname    string `json:"ifname" parquet:"ifname"`
	Direction string `json:"direction" parquet:"direction"`
	FlowMonID int64  `json:"flowmon_id" parquet:"flowmon_id"`
	Color     int32  `json:"color" parquet:"color"`
	Hash      int64  `json:"hash" parquet:"hash"`
	TAINs     int64  `json:"tai_ns" parquet:"tai_ns"`
	SrcAddr   string `json:"src_addr" parquet:"src_addr"`
	DstAddr   string `json:"dst_addr" parquet:"dst_addr"`
	Proto     int32  `json:"proto" parquet:"proto"`
	SrcPort   int32  `json:"src_port" parquet:"src_port"`
	DstPort   int32  `json:"dst_port" parquet:"dst_port"`
	Length    int32  `json:"length" parquet:"length"`
}

// Period is one probe's record of one period, as the REST API and the JSON Lines file give it.
type Period struct {
	SchemaVersion int       `json:"schema_version"`
	Probe         string    `json:"probe"`
	Period        int64     `json:"period"`
	PeriodNs      int64     `json:"period_ns"`
	Color         int32     `json:"color"`
	StartTAINs    int64     `json:"start_tai_ns"`
	Counters      []Counter `json:"counters"`
	Samples       []Sample  `json:"samples"`
}
