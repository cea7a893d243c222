package nsrun_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/flowplane/flowplane/internal/nsrun"
	"github.com/flowplane/flowplane/internal/testenv"
)

// TestCreateEnterDelete: a created namespace is bound under /run/netns, Do runs code inside it
// (a link made there stays there) and leaves the caller where it was, Output runs a command
// there, and Delete unbinds it.
func TestCreateEnterDelete(t *testing.T) {
	t.Parallel()
	testenv.Privileged(t)
	name := testenv.Name("ns")
	if err := nsrun.Create(name); err != nil {
		t.Fatal(err)
	}
	deleted := false
	t.Cleanup(func() {
		if !deleted {
			_ = nsrun.Delete(name)
		}
	})
	if err := nsrun.Create(name); err == nil {
		t.Error("creating a namespace twice succeeded")
	}
	host, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	link := testenv.Name("d")
	err = nsrun.Do(name, func() error {
		here, err := netns.Get()
		if err != nil {
			return err
		}
		defer here.Close()
		if here.Equal(host) {
			t.Error("Do ran in the caller's namespace")
		}
		return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: link}, PeerName: testenv.Name("p")})
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := netlink.LinkByName(link); err == nil {
		t.Errorf("link %s made inside the namespace shows up in the caller's", link)
	}
	out, err := nsrun.Output(name, exec.Command("cat", "/proc/net/dev"))
	if err != nil || !strings.Contains(string(out), link) || !strings.Contains(string(out), "lo:") {
		t.Errorf("Output in the namespace: %v\n%s", err, out)
	}
	if err := nsrun.Delete(name); err != nil {
		t.Fatal(err)
	}
	deleted = true
	if _, err := os.Stat(nsrun.Path(name)); !os.IsNotExist(err) {
		t.Errorf("%s still bound after Delete: %v", nsrun.Path(name), err)
	}
	if err := nsrun.Do(name, func() error { return nil }); err == nil || !strings.Contains(err.Error(), name) {
		t.Errorf("Do in a deleted namespace: %v; want an error naming it", err)
	}
	if err := nsrun.Delete(name); err == nil {
		t.Error("deleting a namespace twice succeeded")
	}
}

// TestKill: Kill ends the processes in a namespace (a namespace with processes outlives its name).
func TestKill(t *testing.T) {
	t.Parallel()
	testenv.Privileged(t)
	ns := testenv.Netns(t)
	cmd := exec.Command("sleep", "60")
	if err := nsrun.Start(ns, cmd); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	if err := nsrun.Kill(ns); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("the process in the namespace survived Kill")
	}
	if err := nsrun.Run(ns, exec.Command("true")); err != nil {
		t.Errorf("Run in the namespace: %v", err)
	}
}
