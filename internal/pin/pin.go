// Package pin owns flowplane's directory on the BPF filesystem, /sys/fs/bpf/flowplane, mounting
// bpffs first where it is missing (minimal hosts).
//
// One bpffs for every launcher: `ip netns exec` and container-like launchers give a command a
// mount namespace of its own with a fresh /sys, whose /sys/fs/bpf is an empty sysfs directory
// (or a bpffs nobody else sees). Pins made there would be private to the command and die with
// it. So the bpffs used is the one of the outermost mount namespace this process can reach:
// /proc/PID/root/sys/fs/bpf of the first process, walking from PID 1 down the chain of this
// process's ancestors, whose root can be opened and holds a bpffs (PID 1's on a normal host;
// where PID 1 is out of reach, as in some sandboxes, the outermost reachable ancestor's). When
// that is the bpffs on this process's own /sys/fs/bpf, paths read /sys/fs/bpf/flowplane/…;
// otherwise the directory is opened once and reached through /proc/self/fd/N. Only when no
// such bpffs exists is one mounted on this process's /sys/fs/bpf; when that mount is not known
// to be shared (this process's mount namespace is not the outermost reachable one's, or no
// other is within reach: a command detached from its shell where PID 1 is out of reach), a
// warning says so and how to start the command instead.
package pin

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/flowplane/flowplane/internal/ancestry"
)

// Root holds every object flowplane pins, one subdirectory per subsystem (as seen from the
// mount namespace that owns the bpffs; see the package comment).
const Root = "/sys/fs/bpf/flowplane"

const bpffs = "/sys/fs/bpf"

// outer is the outermost reachable bpffs: found once per process, held open.
var outer struct {
	once sync.Once
	path string // /proc/self/fd/N, "" when there is none
	dev  uint64
	pid  int // whose root it was reached through
}

// findOuter walks from PID 1 down this process's ancestors for the first root whose
// /sys/fs/bpf is a bpffs, and opens that directory.
func findOuter() {
	for _, pid := range ancestry.Chain() {
		dir := fmt.Sprintf("/proc/%d/root%s", pid, bpffs)
		fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		var sf unix.Statfs_t
		var st unix.Stat_t
		if unix.Fstatfs(fd, &sf) != nil || sf.Type != unix.BPF_FS_MAGIC || unix.Fstat(fd, &st) != nil {
			unix.Close(fd)
			continue
		}
		outer.path, outer.dev, outer.pid = "/proc/self/fd/"+strconv.Itoa(fd), st.Dev, pid
		return
	}
}

// base is the bpffs directory flowplane's pins live under: /sys/fs/bpf when that is the
// outermost reachable bpffs (or there is none), the outer one's /proc/self/fd path otherwise.
func base() string {
	outer.once.Do(findOuter)
	if outer.path == "" {
		return bpffs
	}
	var sf unix.Statfs_t
	var st unix.Stat_t
	if unix.Statfs(bpffs, &sf) == nil && sf.Type == unix.BPF_FS_MAGIC && unix.Stat(bpffs, &st) == nil && st.Dev == outer.dev {
		return bpffs
	}
	return outer.path
}

// Shared reports whether pins go to the bpffs that other launchers see (the outermost
// reachable one), and where that is: /sys/fs/bpf, or /proc/PID/root/sys/fs/bpf when this
// process's own /sys hides it.
func Shared() (where string, ok bool) {
	outer.once.Do(findOuter)
	if base() == bpffs {
		return bpffs, outer.path != ""
	}
	return fmt.Sprintf("/proc/%d/root%s", outer.pid, bpffs), true
}

// Dir returns Root/parts…, creating it (and mounting bpffs if needed).
func Dir(parts ...string) (string, error) {
	if base() == bpffs {
		if err := ensureBPFFS(); err != nil {
			return "", err
		}
	}
	dir := Path(parts...)
	var err error
	// Remove drops empty parents, so another process's Remove can take a parent away half-way
	// through MkdirAll: try again.
	for range 3 {
		if err = os.MkdirAll(dir, 0o700); !errors.Is(err, os.ErrNotExist) {
			break
		}
	}
	if err != nil {
		return "", fmt.Errorf("create pin directory: %w", err)
	}
	return dir, nil
}

// Path returns Root/parts… without creating anything.
func Path(parts ...string) string {
	return filepath.Join(append([]string{base(), "flowplane"}, parts...)...)
}

// Shown returns Root/parts… as a user can reach it from this process's shell: a path under
// /proc/PID/root when this process reaches the pins through a descriptor (for messages).
func Shown(parts ...string) string {
	where, _ := Shared()
	return filepath.Join(append([]string{where, "flowplane"}, parts...)...)
}

// Remove unpins everything under Root/parts…. Unpinning drops the pin's reference only; objects
// still attached or open elsewhere live on until those references go.
func Remove(parts ...string) error {
	if len(parts) == 0 {
		return errors.New("refusing to remove the whole flowplane pin root")
	}
	err := os.RemoveAll(Path(parts...))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("unpin %s: %w", Shown(parts...), err)
	}
	// Leave no empty parent directories behind.
	for i := len(parts) - 1; i > 0; i-- {
		if os.Remove(Path(parts[:i]...)) != nil {
			break
		}
	}
	_ = os.Remove(Path())
	return nil
}

func ensureBPFFS() error {
	var st unix.Statfs_t
	if err := unix.Statfs(bpffs, &st); err == nil && st.Type == unix.BPF_FS_MAGIC {
		return nil
	}
	if err := os.MkdirAll(bpffs, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", bpffs, err)
	}
	if err := unix.Mount("bpf", bpffs, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("mount bpffs on %s: %w (run as root)", bpffs, err)
	}
	if why, fix := Private(); why != "" {
		slog.Warn("pins may be private to this process's mount namespace: flowplane commands started elsewhere would not find them",
			"bpffs", bpffs, "why", why, "fix", fix)
	}
	return nil
}

// Private says why a bpffs this process mounts on its own /sys/fs/bpf may be seen by no process
// outside its mount namespace, and what to do instead ("" when its mount namespace is the
// outermost reachable process's).
func Private() (why, fix string) {
	const nsenter = "or start it with nsenter --net=/run/netns/NS, which keeps the host's /sys/fs/bpf"
	self, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return "its mount namespace cannot be read", "run it as root; " + nsenter
	}
	for _, pid := range ancestry.Chain() {
		ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid))
		if err != nil {
			continue
		}
		if ns == self {
			return "", ""
		}
		return "a launcher (ip netns exec, unshare -m) gave it a /sys of its own, and no bpffs is mounted outside it",
			"mount one on the host first (mount -t bpf bpf /sys/fs/bpf), " + nsenter
	}
	why = "no other process's mount namespace is within reach"
	if os.Getppid() == 1 {
		why = "it runs detached (its parent is PID 1), and PID 1's mount namespace is out of reach"
	}
	return why, "start it as a child of the shell that runs the other commands (ip netns exec NS flowplane … &), " + nsenter
}

// Netns names the pin directory of a per-network-namespace instance, ns<inode>: a subsystem
// that runs once per namespace pins under Root/<subsystem>/Netns(ino) (attach.ThisNetns), and
// whoever deletes the namespace (lab down) removes them with RemoveNetns without knowing the
// subsystems.
func Netns(ino uint64) string { return fmt.Sprintf("ns%d", ino) }

// RemoveNetns unpins every subsystem's instance of the network namespace with inode ino.
func RemoveNetns(ino uint64) error {
	subs, err := os.ReadDir(Path())
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list %s: %w", Path(), err)
	}
	var errs []error
	for _, s := range subs {
		if _, err := os.Stat(Path(s.Name(), Netns(ino))); err == nil {
			errs = append(errs, Remove(s.Name(), Netns(ino)))
		}
	}
	return errors.Join(errs...)
}
