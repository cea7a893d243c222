package conntrack

import (
	"log/slog"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// Every Prometheus metric of conntrack is defined here. The collector reads the per-CPU
// counters and the tables at scrape time, so nothing is kept in user space.
var (
	connectionsDesc = prometheus.NewDesc("flowplane_conntrack_connections_total",
		"Connection events: new, established (confirmed by a reply), related (ICMP errors), expired (found dead on lookup), swept (removed by the sweep), unconfirmed_removed (deleted from the unconfirmed table), unconfirmed_evicted (evicted by its LRU: new - removed - present).",
		[]string{"event"}, nil)
	packetsDesc = prometheus.NewDesc("flowplane_conntrack_packets_total",
		"Packets forwarded by XDP, passed to the kernel, or passed as nf's ignored TCP segments (window_ignored).", []string{"verdict"}, nil)
	dropsDesc = prometheus.NewDesc("flowplane_conntrack_drops_total",
		"Packets refused, by reason (policy, table_full, invalid_*).", []string{"reason"}, nil)
	entriesDesc = prometheus.NewDesc("flowplane_conntrack_entries",
		"Entries in the connection tables (confirmed: reply seen; unconfirmed: LRU of new connections).", []string{"table"}, nil)
)

// Collector exports a conntrack instance's counters and table sizes.
type Collector struct{ t *Tables }

// NewCollector returns a collector over t.
func NewCollector(t *Tables) *Collector { return &Collector{t: t} }

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{connectionsDesc, packetsDesc, dropsDesc, entriesDesc} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	counters, err := c.t.ReadCounters()
	if err != nil {
		slog.Warn("metrics: read counters", "err", err)
		return
	}
	for name, v := range counters {
		switch {
		case name == "forwarded" || name == "passed" || name == "window_ignored" || name == "tcp_ignored":
			ch <- prometheus.MustNewConstMetric(packetsDesc, prometheus.CounterValue, float64(v), name)
		case name == "policy_drop":
			ch <- prometheus.MustNewConstMetric(dropsDesc, prometheus.CounterValue, float64(v), "policy")
		case name == "table_full" || strings.HasPrefix(name, "invalid_"):
			ch <- prometheus.MustNewConstMetric(dropsDesc, prometheus.CounterValue, float64(v), name)
		default:
			ch <- prometheus.MustNewConstMetric(connectionsDesc, prometheus.CounterValue, float64(v), name)
		}
	}
	conf, unconf, err := c.t.Count()
	if err != nil {
		slog.Warn("metrics: count entries", "err", err)
		return
	}
	ch <- prometheus.MustNewConstMetric(entriesDesc, prometheus.GaugeValue, float64(conf), "confirmed")
	ch <- prometheus.MustNewConstMetric(entriesDesc, prometheus.GaugeValue, float64(unconf), "unconfirmed")
	ch <- prometheus.MustNewConstMetric(connectionsDesc, prometheus.CounterValue, float64(Evicted(counters, unconf)), "unconfirmed_evicted")
}
