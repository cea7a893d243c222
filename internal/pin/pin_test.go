package pin_test

import (
	"encoding/json"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

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
			// Messages name the path a user's shell can open, not this process's descriptor.
			if got := pin.Shown(sub, "x"); !strings.HasPrefix(got, "/proc/") || strings.HasPrefix(got, "/proc/self/") || !strings.HasSuffix(got, "/root/sys/fs/bpf/flowplane/"+sub+"/x") {
				t.Errorf("Shown = %s, want /proc/PID/root/sys/fs/bpf/flowplane/%s/x", got, sub)
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

// The helper process of TestDetachedInOwnMountNamespace, when its environment names an output.
func TestMain(m *testing.M) {
	if out := os.Getenv("FP_PIN_HELPER_OUT"); out != "" {
		detachedHelper(out, os.Getenv("FP_PIN_HELPER_SUB"))
		return
	}
	os.Exit(m.Run())
}

// detachedHelper waits to be reparented to PID 1, calls Dir, and writes Dir's log lines and a
// last line with its answer (JSON) to out.
func detachedHelper(out, sub string) {
	f, err := os.Create(out + ".tmp")
	if err != nil {
		os.Exit(1)
	}
	for deadline := time.Now().Add(10 * time.Second); os.Getppid() != 1 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	slog.SetDefault(slog.New(slog.NewJSONHandler(f, nil)))
	_, shared := pin.Shared()
	dir, err := pin.Dir(sub, "x")
	res := map[string]any{"ppid": os.Getppid(), "dir": dir, "bpffs": fsType(dir) == unix.BPF_FS_MAGIC, "shared": shared}
	if err != nil {
		res["error"] = err.Error()
	}
	_ = json.NewEncoder(f).Encode(res)
	_ = f.Close()
	_ = os.Rename(out+".tmp", out)
}

// TestDetachedInOwnMountNamespace: Dir in a process started detached (its parent PID 1, as after
// setsid -f, a daemon's double fork or a subshell that has exited) in a mount namespace of its
// own with a fresh /sys, as ip netns exec gives. Where PID 1 is within reach (a normal
// host) the pins go to the shared bpffs; where it is not (some sandboxes), no process outside
// is within reach: Dir mounts a bpffs of its own and warns that the pins are private.
func TestDetachedInOwnMountNamespace(t *testing.T) {
	t.Parallel()
	testenv.Privileged(t)
	testenv.Need(t, "setsid", "unshare")
	sub := testenv.Name("pin")
	t.Cleanup(func() { _ = pin.Remove(sub) })
	// The shared bpffs exists (Dir mounts it on a host that has none) before the helper looks.
	if _, err := pin.Dir(sub); err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	out := filepath.Join(tmp, "out")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(tmp, "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	script := `umount -l /sys && mount -t sysfs sysfs /sys && exec "$0"`
	cmd := exec.Command("setsid", "-f", "unshare", "--mount", "--propagation", "slave", "sh", "-c", script, self)
	cmd.Env = append(os.Environ(), "FP_PIN_HELPER_OUT="+out, "FP_PIN_HELPER_SUB="+sub)
	cmd.Stdout, cmd.Stderr = logf, logf // a file: the detached helper outlives setsid
	if err := cmd.Run(); err != nil {
		t.Fatalf("%v: %v", cmd, err)
	}
	var b []byte
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if b, err = os.ReadFile(out); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		l, _ := os.ReadFile(logf.Name())
		t.Fatalf("the helper wrote nothing: %v; its output: %s", err, l)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	var res struct {
		PPID   int    `json:"ppid"`
		Dir    string `json:"dir"`
		BPFFS  bool   `json:"bpffs"`
		Shared bool   `json:"shared"`
		Error  string `json:"error"`
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil {
		t.Fatalf("helper's answer %q: %v", lines[len(lines)-1], err)
	}
	if res.PPID != 1 {
		testenv.Unavailable(t, "the detached helper's parent is PID %d, not 1 (a subreaper)", res.PPID)
	}
	if res.Error != "" || !res.BPFFS {
		t.Fatalf("helper: %+v; want Dir on a bpffs", res)
	}
	warned := strings.Contains(string(b), "pins may be private") && strings.Contains(string(b), "detached")
	_, err = os.Readlink("/proc/1/ns/mnt")
	reachable := err == nil
	if res.Shared != reachable {
		t.Errorf("Shared() = %v in the detached process, with PID 1's mount namespace reachable: %v", res.Shared, reachable)
	}
	if reachable {
		if warned {
			t.Errorf("warned with PID 1's mount namespace within reach:\n%s", b)
		}
		if _, err := os.Stat(pin.Path(sub, "x")); err != nil {
			t.Errorf("the detached process's pins are not on the shared bpffs: %v", err)
		}
	} else if !warned {
		t.Errorf("PID 1 out of reach, pins private, and no warning:\n%s", b)
	}
}
