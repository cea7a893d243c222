package altmark

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Metrics is every Prometheus metric of the probe, defined here and nowhere else.
type Metrics struct {
	Registry *prometheus.Registry

	Running        prometheus.Gauge
	LastPeriod     prometheus.Gauge
	PeriodsWritten prometheus.Counter
	PeriodsSkipped *prometheus.CounterVec // reason: read_error, late, write_backlog, write_failed
	WriteErrors    prometheus.Counter
	PendingWrites  prometheus.Gauge
	GapPeriods     prometheus.Gauge
	ExportErrors   prometheus.Counter
	ExportedRecs   *prometheus.CounterVec // template: counters, samples
	ReadLag        prometheus.Histogram
	Packets        *prometheus.CounterVec // ifname, direction
	Bytes          *prometheus.CounterVec
	Samples        *prometheus.CounterVec
	Malformed      *prometheus.CounterVec
	Datapath       *prometheus.GaugeVec // event: the kernel side's statistics since it attached
}

// NewMetrics creates the metrics in a registry of their own (with Go and process metrics).
func NewMetrics() *Metrics {
	reg := prometheus.NewRegistry()
	point := []string{"ifname", "direction"}
	m := &Metrics{
		Registry: reg,
		Running: prometheus.NewGauge(prometheus.GaugeOpts{Name: "flowplane_altmark_running",
			Help: "1 while the probe is attached and its period loop runs."}),
		LastPeriod: prometheus.NewGauge(prometheus.GaugeOpts{Name: "flowplane_altmark_last_period",
			Help: "The latest period written (n = floor(TAI / L))."}),
		PeriodsWritten: prometheus.NewCounter(prometheus.CounterOpts{Name: "flowplane_altmark_periods_written_total",
			Help: "Period records written completely (Parquet and JSON Lines)."}),
		PeriodsSkipped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "flowplane_altmark_periods_skipped_total",
			Help: "Whole periods without a record, by reason: read_error (the maps could not be read), late (read after its color had started counting the next period of that color), write_backlog (the writer was 64 records behind: a slow or hung disk), write_failed (dropped after repeated write errors)."}, []string{"reason"}),
		WriteErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "flowplane_altmark_write_errors_total",
			Help: "Failed attempts to write a period record (full disk, permissions); the record is kept and retried."}),
		PendingWrites: prometheus.NewGauge(prometheus.GaugeOpts{Name: "flowplane_altmark_pending_writes",
			Help: "Period records read but not yet written (queued for the writer, or kept after a failed write)."}),
		GapPeriods: prometheus.NewGauge(prometheus.GaugeOpts{Name: "flowplane_altmark_gap_periods",
			Help: "Whole periods without a record between the last record on disk at start and the first period of this run: the probe was not running (stopped, crashed)."}),
		ExportErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "flowplane_altmark_ipfix_errors_total",
			Help: "Periods whose IPFIX export failed."}),
		ExportedRecs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "flowplane_altmark_ipfix_records_total",
			Help: "IPFIX data records sent, by template (counters, samples)."}, []string{"template"}),
		ReadLag: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "flowplane_altmark_read_lag_seconds",
			Help:    "How long after its read time (L/2 after the period's end) a period was read.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10)}),
		Packets: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "flowplane_altmark_packets_total",
			Help: "Marked packets counted in recorded periods, per measurement point."}, point),
		Bytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "flowplane_altmark_bytes_total",
			Help: "L3 bytes of the marked packets counted in recorded periods, per measurement point."}, point),
		Samples: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "flowplane_altmark_samples_total",
			Help: "Hash-selected samples kept in recorded periods, per measurement point."}, point),
		Malformed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "flowplane_altmark_malformed_total",
			Help: "Packets the probe could not parse (counted and passed) in recorded periods, per measurement point."}, point),
		Datapath: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "flowplane_altmark_datapath_events",
			Help: "The kernel probe's statistics since it attached, by event (seen, counted, not_ip, unmarked, filtered, backbone, mal_*, table_full, sampled, sample_lost, hash_grown, gso): updated at every read."}, []string{"event"}),
	}
	reg.MustRegister(m.Running, m.LastPeriod, m.PeriodsWritten, m.PeriodsSkipped, m.WriteErrors, m.PendingWrites, m.GapPeriods,
		m.ExportErrors, m.ExportedRecs, m.ReadLag, m.Packets, m.Bytes, m.Samples, m.Malformed, m.Datapath,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// observe adds a written period's counters to the per-point totals.
func (m *Metrics) observe(p *Period) {
	for _, c := range p.Counters {
		m.Packets.WithLabelValues(c.Ifname, c.Direction).Add(float64(c.Packets))
		m.Bytes.WithLabelValues(c.Ifname, c.Direction).Add(float64(c.Bytes))
		m.Samples.WithLabelValues(c.Ifname, c.Direction).Add(float64(c.Samples))
		m.Malformed.WithLabelValues(c.Ifname, c.Direction).Add(float64(c.Malformed))
	}
	m.LastPeriod.Set(float64(p.Period))
	m.PeriodsWritten.Inc()
}

// statser is a datapath that keeps statistics of its own (the kernel probe).
type statser interface {
	Stats() (map[string]uint64, error)
}

// observeDatapath copies the datapath's statistics, if it has any, into Datapath.
func (m *Metrics) observeDatapath(dp Datapath) {
	s, ok := dp.(statser)
	if !ok {
		return
	}
	st, err := s.Stats()
	if err != nil {
		return
	}
	for k, v := range st {
		m.Datapath.WithLabelValues(k).Set(float64(v))
	}
}
