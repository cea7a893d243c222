package cgroup

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/flowplane/flowplane/internal/testenv"
)

const resolveEnv = "FP_CGROUP_RESOLVE"

// TestResolveUnderIPNetnsExec: `ip netns exec` mounts a fresh /sys, which hides cgroup v2;
// Resolve still finds the cgroup a user names by its host path (or relative to the mount), as
// the same directory the host sees, and HostPath gives it back by the host's name (Reach, from
// a record). The test binary runs itself under `ip netns exec` (TestMain).
func TestResolveUnderIPNetnsExec(t *testing.T) {
	testenv.Privileged(t)
	testenv.Need(t, "ip")
	root, err := Mount()
	if err != nil {
		t.Fatal(err)
	}
	cg := filepath.Join(root, testenv.Name("cg"))
	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Remove(cg) })
	var want unix.Stat_t
	if err := unix.Stat(cg, &want); err != nil {
		t.Fatal(err)
	}
	ns := testenv.Netns(t)
	for _, arg := range []string{cg, filepath.Base(cg)} {
		cmd := exec.Command("ip", "netns", "exec", ns, os.Args[0])
		cmd.Env = append(os.Environ(), resolveEnv+"="+arg)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("--cgroup %s under ip netns exec: %v\n%s", arg, err, out)
		}
		got := string(out)
		var st unix.Stat_t
		if err := unix.Stat(got, &st); err != nil || st.Dev != want.Dev || st.Ino != want.Ino {
			t.Errorf("--cgroup %s under ip netns exec resolved to %q, not %s (%v)", arg, got, cg, err)
		}
		if h := HostPath(got); h != cg {
			t.Errorf("HostPath(%q) = %q, want the host's name for it, %s", got, h, cg)
		}
	}
	// A path recorded under `ip netns exec` through a process that has exited since.
	if r := Reach("/proc/999999999/root" + cg); r != cg {
		t.Errorf("Reach of %s through an exited process = %q, want %s", cg, r, cg)
	}
}

// TestMain runs as TestResolveUnderIPNetnsExec's child when $FP_CGROUP_RESOLVE is set: it
// prints what Resolve makes of it, after checking that cgroup v2 is hidden there.
func TestMain(m *testing.M) {
	arg := os.Getenv(resolveEnv)
	if arg == "" {
		os.Exit(m.Run())
	}
	// Another mount of the hierarchy (a chroot's, a container's) may be visible; the usual
	// places must not be.
	for _, mp := range cgroup2In("/proc/self/mounts") {
		if strings.HasPrefix(mp, "/sys/") {
			fmt.Printf("cgroup v2 is still mounted at %s here: nothing to test\n", mp)
			os.Exit(1)
		}
	}
	p, err := Resolve(arg)
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	fmt.Print(p)
	os.Exit(0)
}
