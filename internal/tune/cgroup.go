package tune

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Cgroup2Mount finds where cgroup v2 is mounted, from /proc/mounts (on hybrid hosts it is not
// /sys/fs/cgroup).
func Cgroup2Mount() (string, error) {
	f, err := os.Open("/proc/mounts")
	if err != nil {
		return "", fmt.Errorf("read /proc/mounts: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 3 && fields[2] == "cgroup2" {
			return fields[1], nil
		}
	}
	return "", errors.New("no cgroup2 file system in /proc/mounts; mount one (mount -t cgroup2 none /sys/fs/cgroup/unified)")
}

// resolveCgroup turns a --cgroup argument (absolute, or relative to the cgroup2 mount) into
// an absolute path, checking it is a cgroup v2 directory and not the root.
func resolveCgroup(arg string) (string, error) {
	root, err := Cgroup2Mount()
	if err != nil {
		return "", err
	}
	p := arg
	if !filepath.IsAbs(p) {
		p = filepath.Join(root, p)
	}
	p = filepath.Clean(p)
	var st unix.Statfs_t
	if err := unix.Statfs(p, &st); err != nil {
		return "", fmt.Errorf("--cgroup %s: %w", arg, err)
	}
	if st.Type != unix.CGROUP2_SUPER_MAGIC {
		return "", fmt.Errorf("--cgroup %s is not on a cgroup v2 file system (cgroup v2 is mounted at %s)", arg, root)
	}
	if p == root {
		return "", fmt.Errorf("--cgroup %s is the root cgroup; flowplane does not tune every socket on the host, give a child cgroup", arg)
	}
	return p, nil
}

// removeCgroup removes a cgroup flowplane created; it fails while processes remain in it.
func removeCgroup(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove cgroup %s (processes still in it? see %s/cgroup.procs): %w", path, path, err)
	}
	return nil
}
