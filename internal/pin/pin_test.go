package pin_test

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/flowplane/flowplane/internal/pin"
	"github.com/flowplane/flowplane/internal/testenv"
)

func TestDirAndRemove(t *testing.T) {
	t.Parallel()
	testenv.Privileged(t)
	sub := testenv.Name("pin")
	t.Cleanup(func() { _ = pin.Remove(sub) })
	dir, err := pin.Dir(sub, "a", "b")
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(pin.Root, sub, "a", "b"); dir != want || pin.Path(sub, "a", "b") != want {
		t.Fatalf("Dir = %s, Path = %s; want %s", dir, pin.Path(sub, "a", "b"), want)
	}
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		t.Fatalf("pin directory: %v", err)
	}
	if _, err := pin.Dir(sub, "a", "c"); err != nil {
		t.Fatal(err)
	}
	// Removing a leaves sub (it still holds c) and drops b.
	if err := pin.Remove(sub, "a", "b"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("%s still there: %v", dir, err)
	}
	if _, err := os.Stat(pin.Path(sub, "a", "c")); err != nil {
		t.Errorf("sibling removed too: %v", err)
	}
	// Removing the last leaf drops its empty parents.
	if err := pin.Remove(sub, "a", "c"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(pin.Path(sub)); !os.IsNotExist(err) {
		t.Errorf("empty parent %s left behind: %v", pin.Path(sub), err)
	}
	if err := pin.Remove(sub, "gone"); err != nil {
		t.Errorf("removing what is not there: %v", err)
	}
	if err := pin.Remove(); err == nil {
		t.Error("Remove() with no parts must refuse to remove the whole root")
	}
}

// TestDirReachesSharedBPFFS: in a mount namespace of its own whose /sys/fs/bpf is not the
// shared bpffs — `ip netns exec` mounts a fresh sysfs there, container runtimes likewise — Dir
// still creates its directory on the bpffs every other process sees (the outermost reachable
// one), not on a private mount. Run on a thread of the test's own with a tmpfs over
// /sys/fs/bpf, so the host's mounts are untouched.
func TestDirReachesSharedBPFFS(t *testing.T) {
	t.Parallel()
	testenv.Privileged(t)
	sub := testenv.Name("pin")
	t.Cleanup(func() { _ = pin.Remove(sub) })
	errc := make(chan error, 1)
	var dir string
	go func() {
		// The thread stays locked and so dies with the goroutine, mount namespace and all.
		runtime.LockOSThread()
		errc <- func() error {
			if err := unix.Unshare(unix.CLONE_NEWNS | unix.CLONE_FS); err != nil {
				return err
			}
			if err := unix.Mount("", "/", "", unix.MS_SLAVE|unix.MS_REC, ""); err != nil {
				return err
			}
			if err := unix.Mount("tmpfs", "/sys/fs/bpf", "tmpfs", 0, ""); err != nil {
				return err
			}
			if fsType("/sys/fs/bpf") == unix.BPF_FS_MAGIC {
				t.Error("the tmpfs did not hide bpffs")
			}
			var err error
			dir, err = pin.Dir(sub, "x")
			if err != nil {
				return err
			}
			if got := fsType(dir); got != unix.BPF_FS_MAGIC {
				t.Errorf("%s is on filesystem %#x, want bpffs", dir, got)
			}
			if _, err := os.Stat("/sys/fs/bpf/flowplane"); err == nil {
				t.Error("Dir wrote to the private /sys/fs/bpf")
			}
			return nil
		}()
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	// From the test's own mount namespace, the directory is where every process looks.
	if st, err := os.Stat(filepath.Join(pin.Root, sub, "x")); err != nil || !st.IsDir() {
		t.Errorf("%s (made as %s in the private namespace) not visible under %s: %v", filepath.Join(sub, "x"), dir, pin.Root, err)
	}
	if p, shared := pin.Shared(); !shared || p != "/sys/fs/bpf" {
		t.Errorf("Shared() = %s, %v from the host's mount namespace", p, shared)
	}
}

func fsType(path string) int64 {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return -1
	}
	return int64(st.Type)
}
