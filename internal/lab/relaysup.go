package lab

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"syscall"
	"time"
)

// Relay supervision. The lab has no daemon: `lab up` starts, per impaired link, a small
// supervisor process in the relay namespace (its own executable with relayEnv set, as the relay
// was before), which runs the relay as its child (the same executable with relayWorkerEnv set
// too) and starts it again when it dies: a crash or a kill -9 costs the link the packets in
// flight and a restart's backoff, not the link. The counters go on from where the dead relay
// left them. A relay that keeps dying soon after each start is given up: the supervisor records
// the link's relay as failed and exits, and `lab status` says so; `lab up` again (Repair) starts
// a new supervisor for it, or for one that was killed. `lab down` kills the namespace's
// processes: the supervisor stops its relay on SIGTERM, and a relay whose supervisor is killed
// outright is killed with it (PR_SET_PDEATHSIG).
const (
	relayWorkerEnv = "FLOWPLANE_LAB_RELAY_WORKER"
	// A relay that ran at least relayStable had settled: its death starts a new streak.
	relayStable = 10 * time.Second
	// relayMaxStreak deaths in a row, each within relayStable of its start: failed.
	relayMaxStreak = 5
	// The wait before restart n of a streak: relayBackoff << (n-1), at most relayMaxBackoff.
	relayBackoff    = 100 * time.Millisecond
	relayMaxBackoff = 5 * time.Second
	// How long a relay may take to open its sockets and write its counters file's header.
	relayStartTimeout = 10 * time.Second
)

// The supervisor's states, as its file and `lab status` show them.
const (
	relayStarting   = "starting"   // the first relay is opening its sockets
	relayRunning    = "running"    // a relay is receiving
	relayRestarting = "restarting" // the relay died; the next one starts after a backoff
	relayFailed     = "failed"     // the relay kept dying: given up, the link carries nothing
	relayDead       = "dead"       // (status only) the supervisor itself is gone, killed
)

// relaySupervisor is the supervisor's file, rewritten (atomically) at every change.
type relaySupervisor struct {
	PID      int       `json:"pid"`
	State    string    `json:"state"`
	Restarts int       `json:"restarts"`
	LastExit string    `json:"last_exit,omitempty"` // how the last relay that died ended
	Since    time.Time `json:"since"`               // when State began
}

func (s *relaySupervisor) save(path string) error {
	s.Since = time.Now().UTC()
	data, err := json.Marshal(s)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func readSupervisor(path string) (*relaySupervisor, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	s := &relaySupervisor{}
	if err := json.Unmarshal(data, s); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// superviseRelay is the supervisor process: it returns when told to stop (nil), when the first
// relay cannot start, or when the relay is given up.
func superviseRelay(cfgJSON string) error {
	// PR_SET_PDEATHSIG fires when the thread that forked the child ends: fork from one that never
	// does (init runs on the main thread, locked to it).
	runtime.LockOSThread()
	var cfg relayConfig
	if err := json.Unmarshal([]byte(cfgJSON), &cfg); err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	// The counters file, fresh after lab up: the relays carry its counters from one to the next,
	// and a supervisor started again (Repair) carries on from its predecessor's, as it does with
	// the count of restarts (the new supervisor's first relay is one more).
	f, err := os.OpenFile(cfg.Stats, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	f.Close()
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	self, err := os.Executable()
	if err != nil {
		return err
	}
	sup := &relaySupervisor{PID: os.Getpid(), State: relayStarting}
	if prev, err := readSupervisor(cfg.Supervisor); err == nil {
		sup.Restarts, sup.LastExit = prev.Restarts+1, prev.LastExit
	}
	if err := sup.save(cfg.Supervisor); err != nil {
		return err
	}
	streak := 0
	for {
		cmd := exec.Command(self)
		cmd.Args = []string{"flowplane-lab-relay"}
		cmd.Env = append(os.Environ(), relayWorkerEnv+"=1")
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("start relay: %w", err)
		}
		started := time.Now()
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		ready, exit, stopped := waitRelayReady(cfg.Stats, cmd.Process.Pid, exited, stop)
		switch {
		case stopped:
			return stopRelay(cmd, exited)
		case ready:
			sup.State = relayRunning
			if err := sup.save(cfg.Supervisor); err != nil {
				slog.Error("lab relay supervisor: write state", "err", err)
			}
			select {
			case <-stop:
				return stopRelay(cmd, exited)
			case err := <-exited:
				exit = exitError(err)
			}
		case exit == nil: // not ready in time
			_ = cmd.Process.Kill()
			<-exited
			exit = fmt.Errorf("did not start within %v", relayStartTimeout)
		}
		if sup.State == relayStarting {
			return fmt.Errorf("relay did not start: %v", exit)
		}
		if time.Since(started) >= relayStable {
			streak = 0
		}
		streak++
		sup.LastExit = exit.Error()
		if streak >= relayMaxStreak {
			sup.State = relayFailed
			return errors.Join(sup.save(cfg.Supervisor), fmt.Errorf("the relay died %d times in a row (last: %s): given up, "+
				"the link carries nothing until lab up again", streak, sup.LastExit))
		}
		sup.Restarts++
		backoff := min(relayBackoff<<(streak-1), relayMaxBackoff)
		slog.Warn("lab relay supervisor: the relay died; restarting", "exit", sup.LastExit, "after", backoff, "restart", sup.Restarts)
		sup.State = relayRestarting
		if err := sup.save(cfg.Supervisor); err != nil {
			slog.Error("lab relay supervisor: write state", "err", err)
		}
		select {
		case <-stop:
			return nil
		case <-time.After(backoff):
		}
	}
}

// waitRelayReady waits until the relay pid has written its counters file's header (ready), has
// exited (exit), or the supervisor is told to stop; none of them: it did not start in time.
func waitRelayReady(stats string, pid int, exited <-chan error, stop <-chan os.Signal) (ready bool, exit error, stopped bool) {
	deadline := time.After(relayStartTimeout)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		if st, err := readRelay(stats); err == nil && st.PID == pid {
			return true, nil, false
		}
		select {
		case <-stop:
			return false, nil, true
		case err := <-exited:
			return false, exitError(err), false
		case <-deadline:
			return false, nil, false
		case <-tick.C:
		}
	}
}

func exitError(err error) error {
	if err == nil {
		return errors.New("exited with status 0")
	}
	return err
}

// stopRelay ends the relay on the supervisor's own stop.
func stopRelay(cmd *exec.Cmd, exited <-chan error) error {
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(time.Second):
		_ = cmd.Process.Kill()
		<-exited
	}
	return nil
}
