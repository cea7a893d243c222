package lab_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/flowplane/flowplane/internal/cli"
	"github.com/flowplane/flowplane/internal/lab"
	"github.com/flowplane/flowplane/internal/lab/labtest"
)

const supervisedLink = "nodes: {h1: {}, h2: {}}\nlinks:\n  - endpoints: [h1, h2]\n    delay: 1ms\n"

// upSupervised brings up two hosts over a relayed link under a unique name.
func upSupervised(t *testing.T) *lab.Lab {
	t.Helper()
	return labtest.Up(t, supervisedLink)
}

// relayWhen polls the link's relay status until ok says so.
func relayWhen(t *testing.T, l *lab.Lab, what string, ok func(*lab.RelayStatus) bool) *lab.RelayStatus {
	t.Helper()
	var r *lab.RelayStatus
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if r, err = l.Relay(l.Topology.Links[0]); err == nil && ok(r) {
			return r
		}
	}
	t.Fatalf("relay never %s: %+v (%v)", what, r, err)
	return nil
}

// gone waits until pid has exited (a zombie counts: its parent may be this test).
func gone(t *testing.T, pid int, what string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil || strings.Contains(string(data), ") Z ") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s %d is still running: %s", what, pid, data)
		}
	}
}

// statusExit runs `lab status NAME` (--json too) as flowplane does and checks its exit code:
// 1 (ErrDegraded) with a warning on stderr when degraded, else 0 with none.
func statusExit(t *testing.T, l *lab.Lab, degraded bool) {
	t.Helper()
	want := 0
	if degraded {
		want = 1
	}
	for _, args := range [][]string{{"status", l.Name()}, {"status", l.Name(), "--json"}} {
		cmd := lab.Command()
		cmd.SilenceErrors, cmd.SilenceUsage = true, true
		var out, stderr bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&stderr)
		cmd.SetArgs(args)
		err := cmd.Execute()
		warned := strings.Contains(stderr.String(), "warning: the relay of link h1")
		code := 0
		if err != nil {
			code = cli.ExitCode(err)
		}
		if out.Len() == 0 || warned != degraded || errors.Is(err, lab.ErrDegraded) != degraded || code != want {
			t.Errorf("lab %s: exit %d (%v), want %d; stderr:\n%s", strings.Join(args, " "), code, err, want, &stderr)
		}
	}
}

// upAgain runs `lab up --config FILE --name NAME` as flowplane does, for the running lab l
// (given topology, the same as l's or not), and returns its stdout and error.
func upAgain(t *testing.T, l *lab.Lab, topology string) (string, error) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "sup.yaml")
	if err := os.WriteFile(file, []byte(topology), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := lab.Command()
	cmd.SilenceErrors, cmd.SilenceUsage = true, true
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"up", "--config", file, "--name", l.Name()})
	err := cmd.Execute()
	return out.String(), err
}

// repaired brings the lab's relay back with `lab up` again (after refusing another topology)
// and checks it relays, with the restarts and counters carried on and a status that exits 0;
// a second `lab up` has nothing to restart. It returns the new relay's status.
func repaired(t *testing.T, l *lab.Lab, before *lab.RelayStatus) *lab.RelayStatus {
	t.Helper()
	if _, err := upAgain(t, l, supervisedLink+"    loss: 1\n"); !errors.Is(err, lab.ErrExists) || cli.ExitCode(err) != 2 {
		t.Errorf("lab up of another topology under a running lab's name: %v (exit %d), want ErrExists (2)", err, cli.ExitCode(err))
	}
	out, err := upAgain(t, l, supervisedLink)
	if want := "lab " + l.Name() + ": already up, restarted the relay of 1 link: h1 — h2\n"; err != nil || out != want {
		t.Fatalf("lab up again: %q, %v; want %q", out, err, want)
	}
	r := relayWhen(t, l, "ran again", func(r *lab.RelayStatus) bool { return r.Alive && r.State == "running" })
	if r.SupervisorPID == before.SupervisorPID || r.Restarts != before.Restarts+1 || r.AToB.RxPackets < before.AToB.RxPackets {
		t.Errorf("relay after lab up again: %+v; before: %+v", r, before)
	}
	statusExit(t, l, false)
	labtest.Run(t, l, "h1", "ping", "-c", "1", "-W", "2", labtest.Addr(t, l, "h2", "4"))
	if out, err := upAgain(t, l, supervisedLink); err != nil || out != "lab "+l.Name()+": already up, nothing to restart\n" {
		t.Errorf("lab up of a lab that is up: %q, %v", out, err)
	}
	return r
}

// downLeavesNothing downs the lab and checks that its supervisors, relays, namespaces,
// interfaces, pins and files are gone.
func downLeavesNothing(t *testing.T, l *lab.Lab, pids ...int) {
	t.Helper()
	if err := lab.Down(l.Name()); err != nil {
		t.Fatal(err)
	}
	for _, pid := range pids {
		gone(t, pid, "process")
	}
	assertGone(t, l.Name())
	if _, err := os.Stat("/run/flowplane/lab/" + l.Name() + ".relay"); err == nil {
		t.Errorf("the relay directory of %s is left", l.Name())
	}
}

// A relay killed with SIGKILL under a ping is started again by its supervisor: the status counts
// one restart and says how the relay ended, the counters go on from the dead relay's, the ping
// gets replies again, and lab down leaves nothing.
func TestRelayRestartedAfterKill(t *testing.T) {
	t.Parallel()
	l := upSupervised(t)
	dst := labtest.Addr(t, l, "h2", "4")
	labtest.Run(t, l, "h1", "ping", "-c", "1", "-W", "2", dst) // ARP
	before := relayWhen(t, l, "ran", func(r *lab.RelayStatus) bool { return r.Alive && r.State == "running" })
	if before.Restarts != 0 || before.SupervisorPID == 0 || before.SupervisorPID == before.PID {
		t.Fatalf("relay status after lab up: %+v", before)
	}
	// 300 pings 10 ms apart; the relay is killed after the first 50.
	ping := make(chan string, 1)
	go func() {
		out, _ := labtest.Try(l, "h1", "ping", "-c", "300", "-i", "0.01", "-W", "1", dst)
		ping <- out
	}()
	time.Sleep(500 * time.Millisecond)
	if err := syscall.Kill(before.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	after := relayWhen(t, l, "came back", func(r *lab.RelayStatus) bool {
		return r.Alive && r.State == "running" && r.PID != before.PID
	})
	statusExit(t, l, false)
	out := <-ping
	if after.Restarts != 1 || after.SupervisorPID != before.SupervisorPID || !strings.Contains(after.LastExit, "killed") {
		t.Errorf("relay status after one kill: %+v", after)
	}
	// Replies before the kill and after the restart, and the last pings' among them.
	var seqs []int
	for _, f := range strings.Fields(out) {
		if v, ok := strings.CutPrefix(f, "icmp_seq="); ok {
			if n, err := strconv.Atoi(v); err == nil {
				seqs = append(seqs, n)
			}
		}
	}
	late := 0
	for _, s := range seqs {
		if s > 250 {
			late++
		}
	}
	t.Logf("%d of 300 replies, %d of the last 50", len(seqs), late)
	if len(seqs) < 100 || late < 45 {
		t.Errorf("%d of 300 replies, %d of the last 50: traffic did not resume\n%s", len(seqs), late, out)
	}
	time.Sleep(300 * time.Millisecond) // the relay writes its counters every 0.1 s
	now, err := l.Relay(l.Topology.Links[0])
	if err != nil {
		t.Fatal(err)
	}
	// Every ping answered crossed the relay, before or after the kill; the dead relay's last 0.1 s
	// (10 pings) went uncounted. Without the carried counters, the first 50 would be missing.
	if got := now.AToB.RxPackets; got+20 < uint64(len(seqs)) || now.AToB.Delayed+20 < uint64(len(seqs)) {
		t.Errorf("counters did not go on from the dead relay's: %d replies, now %+v", len(seqs), now.AToB)
	}
	downLeavesNothing(t, l, after.SupervisorPID, after.PID)
}

// A relay that keeps dying soon after each start is given up: the status says failed (and
// `lab status` exits 1), with no relay or supervisor left running; `lab up` again starts it
// anew, and lab down still removes everything.
func TestRelayKeepsDyingFails(t *testing.T) {
	t.Parallel()
	l := upSupervised(t)
	r := relayWhen(t, l, "ran", func(r *lab.RelayStatus) bool { return r.Alive && r.State == "running" })
	sup := r.SupervisorPID
	for i := 1; ; i++ {
		if err := syscall.Kill(r.PID, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		pid := r.PID
		r = relayWhen(t, l, "restarted or failed", func(r *lab.RelayStatus) bool {
			return r.State == "failed" || (r.Alive && r.State == "running" && r.PID != pid)
		})
		if r.State == "failed" {
			if i != 5 || r.Restarts != 4 || r.Alive || !strings.Contains(r.LastExit, "killed") {
				t.Errorf("failed after %d kills: %+v", i, r)
			}
			break
		}
		if i >= 5 {
			t.Fatalf("still restarting after %d kills: %+v", i, r)
		}
	}
	gone(t, sup, "the supervisor of a failed relay")
	statusExit(t, l, true)
	again := repaired(t, l, r)
	downLeavesNothing(t, l, r.PID, again.SupervisorPID, again.PID)
}

// A supervisor killed with SIGKILL takes its relay with it (nothing relays unsupervised), and
// the status says the relay is dead, not running (and `lab status` exits 1), until `lab up`
// again starts a new supervisor.
func TestRelaySupervisorKilled(t *testing.T) {
	t.Parallel()
	l := upSupervised(t)
	r := relayWhen(t, l, "ran", func(r *lab.RelayStatus) bool { return r.Alive && r.State == "running" })
	if err := syscall.Kill(r.SupervisorPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	gone(t, r.PID, "the relay of a killed supervisor")
	dead := relayWhen(t, l, "reported dead", func(r *lab.RelayStatus) bool { return r.State == "dead" && !r.Alive })
	statusExit(t, l, true)
	again := repaired(t, l, dead)
	downLeavesNothing(t, l, again.SupervisorPID, again.PID)
}
