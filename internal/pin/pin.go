// Package pin owns flowplane's directory on the BPF filesystem, /sys/fs/bpf/flowplane, mounting
// bpffs first where it is missing (fresh namespaces, minimal hosts).
package pin

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Root holds every object flowplane pins, one subdirectory per subsystem.
const Root = "/sys/fs/bpf/flowplane"

const bpffs = "/sys/fs/bpf"

// Dir returns Root/parts…, creating it (and mounting bpffs if needed).
func Dir(parts ...string) (string, error) {
	if err := ensureBPFFS(); err != nil {
		return "", err
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
	return filepath.Join(append([]string{Root}, parts...)...)
}

// Remove unpins everything under Root/parts…. Unpinning drops the pin's reference only; objects
// still attached or open elsewhere live on until those references go.
func Remove(parts ...string) error {
	if len(parts) == 0 {
		return errors.New("refusing to remove the whole flowplane pin root")
	}
	err := os.RemoveAll(Path(parts...))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("unpin %s: %w", Path(parts...), err)
	}
	// Leave no empty parent directories behind.
	for i := len(parts) - 1; i > 0; i-- {
		if os.Remove(Path(parts[:i]...)) != nil {
			break
		}
	}
	_ = os.Remove(Root)
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
	return nil
}

// Netns names the pin directory of a per-network-namespace instance, ns<inode>: a subsystem
// that runs once per namespace pins under Root/<subsystem>/Netns(ino), and whoever deletes the
// namespace (lab down) removes them with RemoveNetns without knowing the subsystems.
func Netns(ino uint64) string { return fmt.Sprintf("ns%d", ino) }

// RemoveNetns unpins every subsystem's instance of the network namespace with inode ino.
func RemoveNetns(ino uint64) error {
	subs, err := os.ReadDir(Root)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list %s: %w", Root, err)
	}
	var errs []error
	for _, s := range subs {
		if _, err := os.Stat(Path(s.Name(), Netns(ino))); err == nil {
			errs = append(errs, Remove(s.Name(), Netns(ino)))
		}
	}
	return errors.Join(errs...)
}
