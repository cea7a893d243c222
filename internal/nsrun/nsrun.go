// Package nsrun runs code and commands inside named network namespaces (the ones `ip netns`
// lists under /run/netns).
//
// Only the network namespace changes: the mount namespace stays, so /sys/fs/bpf pins and cgroup
// mounts are the host's. (`ip netns exec` remounts /sys, which hides bpffs; flowplane needs its
// pins to be one set, whichever namespace a command runs in.)
package nsrun

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

const runDir = "/run/netns"

// Path is where a named namespace is bound.
func Path(name string) string { return runDir + "/" + name }

// Do runs fn on an OS thread inside namespace ns, on a goroutine of its own. Afterwards the
// thread returns to its namespace; if it cannot, it stays locked and the runtime ends it with
// the goroutine, so nothing else ever runs in ns by mistake. Sockets and links fn creates stay
// in ns; goroutines fn starts do not.
func Do(ns string, fn func() error) error { return DoPath(Path(ns), fn) }

// DoPath is Do for the namespace named by any file: /run/netns/NAME, /proc/PID/ns/net.
func DoPath(path string, fn func() error) error {
	h, err := netns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("open network namespace %s: %w", path, err)
	}
	defer h.Close()
	return onThread(func() error {
		if err := netns.Set(h); err != nil {
			return fmt.Errorf("enter network namespace %s: %w", path, err)
		}
		return fn()
	})
}

// onThread runs fn on a locked OS thread and puts the thread back in its original network
// namespace afterwards.
func onThread(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- fmt.Errorf("open current network namespace: %w", err)
			return // still locked: the thread is discarded
		}
		defer orig.Close()
		errc <- fn()
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
	}()
	return <-errc
}

// Start starts cmd inside namespace ns.
func Start(ns string, cmd *exec.Cmd) error {
	return Do(ns, cmd.Start)
}

// Run runs cmd inside namespace ns and waits for it.
func Run(ns string, cmd *exec.Cmd) error {
	if err := Start(ns, cmd); err != nil {
		return err
	}
	return cmd.Wait()
}

// Output runs cmd inside namespace ns and returns its standard output.
func Output(ns string, cmd *exec.Cmd) ([]byte, error) {
	var out []byte
	err := Do(ns, func() error {
		var err error
		out, err = cmd.Output()
		return err
	})
	return out, err
}

// Create makes a named network namespace, as `ip netns add` does.
func Create(name string) error {
	if err := sharedRunDir(); err != nil {
		return err
	}
	return onThread(func() error {
		h, err := netns.NewNamed(name) // unshares the calling thread into it
		if err != nil {
			return fmt.Errorf("create network namespace %s: %w", name, err)
		}
		return h.Close()
	})
}

// sharedRunDir makes /run/netns a mount point with shared propagation, as iproute2 does before
// its first `ip netns add`. Without it, a later `ip netns add` turns /run/netns into a mount point
// itself and hides the namespaces bound before, which can then no longer be deleted.
func sharedRunDir() error {
	if err := os.MkdirAll(runDir, 0o755); err != nil {
		return err
	}
	for bound := false; ; bound = true {
		err := unix.Mount("", runDir, "none", unix.MS_SHARED|unix.MS_REC, "")
		if err == nil {
			return nil
		}
		if err != unix.EINVAL || bound {
			return fmt.Errorf("make %s shared: %w", runDir, err)
		}
		// EINVAL: not a mount point yet. Bind it onto itself, then make that shared.
		if err := unix.Mount(runDir, runDir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind %s: %w", runDir, err)
		}
	}
}

// Delete removes a named network namespace. The kernel frees it, and the veths in it, once no
// process or open file keeps it alive.
func Delete(name string) error {
	if err := netns.DeleteNamed(name); err != nil {
		return fmt.Errorf("delete network namespace %s: %w", name, err)
	}
	return nil
}

// Kill ends every process inside namespace ns: SIGTERM, and SIGKILL for those still there after
// two seconds. A namespace with processes in it outlives its name, and its interfaces with it.
func Kill(ns string) error {
	var target unix.Stat_t
	if err := unix.Stat(Path(ns), &target); err != nil {
		return fmt.Errorf("stat network namespace %s: %w", ns, err)
	}
	pids := func() []int {
		var pids []int
		dirs, _ := os.ReadDir("/proc")
		for _, d := range dirs {
			pid, err := strconv.Atoi(d.Name())
			if err != nil || pid == os.Getpid() {
				continue
			}
			var st unix.Stat_t
			if unix.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &st) == nil && st.Ino == target.Ino && st.Dev == target.Dev {
				pids = append(pids, pid)
			}
		}
		return pids
	}
	for _, sig := range []unix.Signal{unix.SIGTERM, unix.SIGKILL} {
		left := pids()
		for _, pid := range left {
			_ = unix.Kill(pid, sig)
		}
		for deadline := time.Now().Add(2 * time.Second); len(left) > 0 && time.Now().Before(deadline); left = pids() {
			time.Sleep(20 * time.Millisecond)
		}
		if len(left) == 0 {
			return nil
		}
	}
	return fmt.Errorf("processes %v in network namespace %s survive SIGKILL", pids(), ns)
}
