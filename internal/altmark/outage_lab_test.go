package altmark

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/flowplane/flowplane/internal/nsrun"
	"github.com/flowplane/flowplane/internal/testenv"
)

// TestLabOutageIsLossNotAMissingPoint: r1–r2 drops every packet for several periods (a tc drop
// filter on r1's egress, after the probe). With ipv6-altmark r2's point counts nothing then,
// and still writes its rows, so the analytics read the outage as loss: every packet r1 sent
// out, loss rate 1, the outage alarm, no missing point. A probe that is gone (r2 stops first)
// is a missing point instead: the two cases are told apart.
func TestLabOutageIsLossNotAMissingPoint(t *testing.T) {
	// Not parallel: its sender and TestLabLossPerPeriod's would compete for the CPU.
	testenv.Privileged(t)
	script := analyticsScriptPath(t)
	pl := upPathLab(t)
	extra := "hash_bits: 3\ncarrier: ipv6-altmark\n"
	r1 := startRunner(t, pl, "r1", pl.a, "out", extra)
	r2 := startRunner(t, pl, "r2", pl.b, "in", extra+"periods: 10\n")
	if r1 == nil || r2 == nil {
		t.FailNow()
	}
	fl := receive(t, pl, "altmark6")
	stop := make(chan struct{})
	wg := sendColored(t, pl, "altmark6", 40*time.Millisecond, stop, fl)
	defer func() { close(stop); wg.Wait(); fl.close() }()

	waitFor(t, func() bool { return r2.Status().PeriodsWritten >= 3 })
	dev := pl.IfName(pl.a)
	dropAll(t, pl, dev)
	down := tai() / int64(labPeriod) // periods after this one are dark from start to end
	r2.Wait()
	// r1 goes on a few periods after r2 is gone, then stops.
	p2, _ := r2.Store().Periods()
	waitFor(t, func() bool { s := r1.Status(); return s.LastPeriod != nil && *s.LastPeriod >= p2[len(p2)-1]+4 })
	if err := r1.Stop(); err != nil {
		t.Fatal(err)
	}

	// One dataset, as collect would gather it: both probes' records under one directory.
	data := r1.Store().Dir
	if out, err := exec.Command("cp", "-a", r2.Store().Dir+"/.", data).CombinedOutput(); err != nil {
		t.Fatalf("merge the records: %v: %s", err, out)
	}
	graph := filepath.Join(t.TempDir(), "wire.yaml")
	link := "links:\n  - [r1:" + dev + ":out, r2:" + pl.IfName(pl.b) + ":in]\n"
	if err := os.WriteFile(graph, []byte(link), 0o644); err != nil {
		t.Fatal(err)
	}
	var rows []struct {
		Period   int64
		Cluster  string
		In       jsonInt `json:"in_packets"`
		Out      jsonInt `json:"out_packets"`
		Loss     jsonInt
		LossRate jsonFloat `json:"loss_rate"`
		Missing  int64
		Alarm    string
	}
	runAnalyticsJSON(t, script, &rows, "loss", "--data", data, "--topology", graph, "--format", "json")

	p1, _ := r1.Store().Periods()
	dark, gone := 0, 0
	for _, r := range rows {
		recorded := slices.Contains(p1, r.Period) && slices.Contains(p2, r.Period)
		switch {
		case r.Period > down && recorded:
			dark++
			sent, _, ambiguous := fl.period(r.Period)
			if r.Alarm != "outage" || r.Missing != 0 || r.In.v == 0 || r.Out.v != 0 || r.Loss.v != r.In.v || r.LossRate.v != 1 {
				t.Errorf("period %d (dark): %+v, want all of in lost, rate 1, alarm outage", r.Period, r)
			}
			if !ambiguous && r.Loss.v != sent {
				t.Errorf("period %d (dark): loss %d, the sender sent %d", r.Period, r.Loss.v, sent)
			}
		case slices.Contains(p1, r.Period) && r.Period > p2[len(p2)-1]:
			gone++
			if r.Alarm != "missing_points" || r.Missing != 1 || !r.Loss.null || !r.LossRate.null {
				t.Errorf("period %d (r2 gone): %+v, want a missing point and no loss", r.Period, r)
			}
		case r.Period < down && recorded:
			if r.Alarm != "" || r.Loss.null || r.Out.v == 0 {
				t.Errorf("period %d (before): %+v", r.Period, r)
			}
		}
	}
	t.Logf("%d loss rows: %d periods dark with r2 counting, %d with r2 gone", len(rows), dark, gone)
	table, err := exec.Command(script, "loss", "--data", data, "--topology", graph).CombinedOutput()
	t.Logf("flowplane-analytics loss (table): %v\n%s", err, table)
	if dark < 3 || gone < 3 {
		t.Errorf("%d dark and %d gone periods, want 3 of each (outage from period %d, r2's periods %v)", dark, gone, down+1, p2)
	}
}

// dropAll adds a filter dropping every packet to r1's egress on dev, after the lab's loss
// program and the probe (tcx runs before clsact filters). This kernel has no gact action, so
// the filter is a two-instruction BPF program; deleting the namespace removes it.
func dropAll(t *testing.T, pl *pathLab, dev string) {
	t.Helper()
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2 /* TC_ACT_SHOT */), asm.Return()}})
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	if err := nsrun.Do(pl.Netns("r1"), func() error {
		link, err := netlink.LinkByName(dev)
		if err != nil {
			return err
		}
		return netlink.FilterAdd(&netlink.BpfFilter{
			FilterAttrs: netlink.FilterAttrs{LinkIndex: link.Attrs().Index, Parent: netlink.HANDLE_MIN_EGRESS,
				Handle: 9, Priority: 9, Protocol: unix.ETH_P_ALL},
			Fd: prog.FD(), Name: "fp-outage", DirectAction: true})
	}); err != nil {
		t.Fatalf("drop everything on %s: %v", dev, err)
	}
}
