package altmark

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/flowplane/flowplane/internal/lab"
	"github.com/flowplane/flowplane/internal/lab/labtest"
	"github.com/flowplane/flowplane/internal/nsrun"
	"github.com/flowplane/flowplane/internal/testenv"
)

// crashConfigEnv makes the test binary run `altmark probe run --config $crashConfigEnv`.
const crashConfigEnv = "FP_ALTMARK_CRASH_CONFIG"

// TestLabKilledProbeRestarts: `altmark probe run` on r1, counting h1's colored pings, is killed
// with SIGKILL at different moments of a period, four times, and started again each time. After
// every kill no program stays attached and every file under a final name is whole; every restart
// removes what the kill left half written, says in its log which periods have no record (from the
// one after its last record to the partial one it started in), and counts again. A last run
// stopped by SIGTERM leaves no temporary file and no file of an incomplete period.
func TestLabKilledProbeRestarts(t *testing.T) {
	if cfg := os.Getenv(crashConfigEnv); cfg != "" {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
		defer stop()
		c := Command()
		c.SetArgs([]string{"probe", "run", "--config", cfg})
		if err := c.ExecuteContext(ctx); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	testenv.Privileged(t)
	testenv.Need(t, "ping")
	l := labtest.Up(t, labtest.HostRouterHost)
	dev := crashDevice(t, l)
	dir := t.TempDir()
	const period = 200 * time.Millisecond
	cfgFile := filepath.Join(t.TempDir(), "probe.yaml")
	if err := os.WriteFile(cfgFile, []byte(fmt.Sprintf("probe_id: r1\ninterfaces: [{name: %s, direction: in}]\nperiod: %v\ncarrier: dscp\nprotocols: [icmp]\nhash_bits: 2\ndata_dir: %s\n",
		dev, period, dir)), 0o644); err != nil {
		t.Fatal(err)
	}
	// Color 1 (DSCP bit 0) on every ping: the odd periods count them.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ping, err := l.Command(ctx, "h1", "ping", "-q", "-Q", "4", "-i", "0.005", labtest.Addr(t, l, "h2", "4"))
	if err != nil {
		t.Fatal(err)
	}
	if err := ping.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); _ = ping.Wait() })

	s := Store{Dir: dir, Probe: "r1"}
	var lastBefore int64 = -1 // the last record before the current run
	for i := range 5 {
		logFile := filepath.Join(t.TempDir(), "probe.log")
		stderr, err := os.Create(logFile)
		if err != nil {
			t.Fatal(err)
		}
		log := func() string { b, _ := os.ReadFile(logFile); return string(b) }
		probe, err := l.Command(context.Background(), "r1", os.Args[0], "-test.run=^TestLabKilledProbeRestarts$")
		if err != nil {
			t.Fatal(err)
		}
		probe.Env = append(probe.Env, crashConfigEnv+"="+cfgFile)
		probe.Stderr = stderr
		err = probe.Start()
		stderr.Close()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = probe.Process.Kill() })
		// Three records of this run (one of them an odd period, with pings), then a kill. (A
		// minute for them: a loaded machine can take long to start a process and load its
		// programs.)
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
			if ps, _ := s.Periods(); len(ps) > 0 && ps[max(len(ps)-3, 0)] > lastBefore {
				break
			}
			if probeExited(probe) {
				t.Fatalf("run %d: the probe exited: %s", i, log())
			}
			if time.Now().After(deadline) {
				t.Fatalf("run %d: not 3 records in a minute: %s", i, log())
			}
		}
		ps, _ := s.Periods()
		if i > 0 {
			// The run's log says which periods have no record: from the one after the last
			// record to the partial one it started in.
			want := fmt.Sprintf("periods %d to ", lastBefore+1)
			if !strings.Contains(log(), want) || !strings.Contains(log(), fmt.Sprintf("after period %d, its last record", lastBefore)) {
				t.Errorf("run %d: the log does not report the gap after period %d:\n%s", i, lastBefore, log())
			}
			counted := false
			for _, n := range ps {
				if n > lastBefore {
					p, err := s.Read(n)
					if err != nil {
						t.Fatal(err)
					}
					counted = counted || p.Counters[0].Packets > 0
				}
			}
			if !counted {
				t.Errorf("run %d: no packet counted in periods after %d", i, lastBefore)
			}
		}
		if i == 4 {
			// The last run ends by SIGTERM: the ended period is written, the probe exits 0.
			probe.Process.Signal(syscall.SIGTERM)
			if err := probe.Wait(); err != nil {
				t.Errorf("run %d, stopped by SIGTERM: %v\n%s", i, err, log())
			}
			break
		}
		// Into a period: at its start, in the middle of nothing, and about when the record of
		// the period before is read and written (L/2).
		into := []time.Duration{0, 47 * time.Millisecond, period / 2, period/2 + 2*time.Millisecond}[i]
		now := tai()
		time.Sleep(time.Duration((now/int64(period)+1)*int64(period)-now) + into)
		probe.Process.Kill()
		probe.Wait()
		lastBefore, _, _ = s.Last()
		t.Logf("run %d: killed %v into a period, after period %d; %d temporary files", i, into, lastBefore, len(tempFiles(t, dir)))
		if n := attachedPrograms(t, l, dev); n != 0 {
			t.Errorf("run %d: %d programs attached to %s after SIGKILL", i, n, dev)
		}
		checkWholeFiles(t, s)
	}
	if tmp := tempFiles(t, dir); len(tmp) != 0 {
		t.Errorf("temporary files after the last run: %v", tmp)
	}
	checkWholeFiles(t, s)
	// Every file belongs to a complete period: the restarts removed what the kills left.
	filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if n, ok := s.periodOf(path); err == nil && !d.IsDir() && ok {
			if _, err := os.Stat(s.countersPath(n)); err != nil {
				t.Errorf("%s: its period has no counters file", path)
			}
		}
		return nil
	})
}

func probeExited(c *lab.NodeCmd) bool {
	var ws syscall.WaitStatus
	pid, _ := syscall.Wait4(c.Process.Pid, &ws, syscall.WNOHANG, nil)
	return pid == c.Process.Pid
}

// checkWholeFiles reads every file under a final name, and every listed period.
func checkWholeFiles(t *testing.T, s Store) {
	t.Helper()
	filepath.WalkDir(s.Dir, func(path string, d os.DirEntry, err error) error {
		switch {
		case err != nil || d.IsDir() || strings.HasSuffix(path, tmpSuffix):
		case strings.Contains(path, "/counters/"):
			readParquet[Counter](t, path)
		case strings.Contains(path, "/samples/"):
			readParquet[Sample](t, path)
		default:
			data, _ := os.ReadFile(path)
			var p Period
			if err := json.Unmarshal(data, &p); err != nil {
				t.Errorf("%s: %v", path, err)
			}
		}
		return nil
	})
	ps, err := s.Periods()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range ps {
		if _, err := s.Read(n); err != nil {
			t.Errorf("period %d: %v", n, err)
		}
	}
}

// crashDevice is r1's interface towards h1.
func crashDevice(t *testing.T, l *lab.Lab) string {
	t.Helper()
	r1, err := l.Node("r1")
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range r1.Ifaces {
		if i.Peer().Node.Name == "h1" {
			return l.IfName(i)
		}
	}
	t.Fatal("r1 has no link to h1")
	return ""
}

// attachedPrograms counts the tcx programs on r1's dev, both directions.
func attachedPrograms(t *testing.T, l *lab.Lab, dev string) int {
	t.Helper()
	n := 0
	if err := nsrun.Do(l.Netns("r1"), func() error {
		d, err := netlink.LinkByName(dev)
		if err != nil {
			return err
		}
		for _, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
			r, err := link.QueryPrograms(link.QueryOptions{Target: d.Attrs().Index, Attach: at})
			if err != nil {
				return err
			}
			n += len(r.Programs)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return n
}
