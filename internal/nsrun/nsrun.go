// Package nsrun runs code and commands inside named network namespaces (the ones `ip netns`
// lists under /run/netns).
//
// Only the network namespace changes: the mount namespace stays, so /sys/fs/bpf pins and cgroup
// mounts are the host's. (`ip netns exec` remounts /sys, which hides bpffs; flowplane needs its
// pins to be one set, whichever namespace a command runs in.)
package nsrun

import (
	"fmt"
	"os/exec"
	"runtime"

	"github.com/vishvananda/netns"
)

// Path is where a named namespace is bound.
func Path(name string) string { return "/run/netns/" + name }

// Do runs fn on an OS thread inside namespace ns. The thread is thrown away when fn returns
// (the goroutine exits still locked), so nothing else ever runs in the namespace by mistake.
// Sockets and links fn creates stay in ns; goroutines fn starts do not.
func Do(ns string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the runtime ends the thread with the goroutine
		h, err := netns.GetFromPath(Path(ns))
		if err != nil {
			errc <- fmt.Errorf("open network namespace %s: %w", ns, err)
			return
		}
		defer h.Close()
		if err := netns.Set(h); err != nil {
			errc <- fmt.Errorf("enter network namespace %s: %w", ns, err)
			return
		}
		errc <- fn()
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

// Create makes a named network namespace (as `ip netns add` does) without moving any thread
// that keeps running: the unshare happens on a thread that is thrown away afterwards.
func Create(name string) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: this thread ends up inside the new namespace
		h, err := netns.NewNamed(name)
		if err != nil {
			errc <- fmt.Errorf("create network namespace %s: %w", name, err)
			return
		}
		h.Close()
		errc <- nil
	}()
	return <-errc
}

// Delete removes a named network namespace. The kernel frees it, and the veths in it, once no
// process or open file keeps it alive.
func Delete(name string) error {
	if err := netns.DeleteNamed(name); err != nil {
		return fmt.Errorf("delete network namespace %s: %w", name, err)
	}
	return nil
}
