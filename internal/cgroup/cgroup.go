// Package cgroup finds cgroup v2, checks the cgroups users name, and removes the ones flowplane
// made: what every sock_ops subsystem (tune, prio) needs.
package cgroup

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/flowplane/flowplane/internal/ancestry"
)

// Mount finds where cgroup v2 is mounted, from /proc/mounts (on hybrid hosts it is not
// /sys/fs/cgroup). Under `ip netns exec`, whose fresh /sys hides it, it is the host's mount
// reached through an ancestor's root: /proc/PID/root/sys/fs/cgroup/…. The usual places
// (/sys/fs/cgroup, /sys/fs/cgroup/unified) come first, an ancestor's included: another mount
// of the hierarchy (a container's or a chroot's bind mount) is taken only when there is none.
func Mount() (string, error) {
	type found struct{ root, mp string }
	var other []found
	for _, pid := range append([]int{0}, ancestry.Chain()...) {
		mounts, root := "/proc/self/mounts", ""
		if pid != 0 {
			mounts, root = fmt.Sprintf("/proc/%d/mounts", pid), fmt.Sprintf("/proc/%d/root", pid)
		}
		for _, mp := range cgroup2In(mounts) {
			if pid != 0 && !isCgroup2(root+mp) {
				continue
			}
			if mp == "/sys/fs/cgroup" || mp == "/sys/fs/cgroup/unified" {
				return root + mp, nil
			}
			other = append(other, found{root, mp})
		}
	}
	if len(other) > 0 {
		return other[0].root + other[0].mp, nil
	}
	return "", errors.New("no cgroup2 file system in /proc/mounts; mount one (mount -t cgroup2 none /sys/fs/cgroup/unified)")
}

// cgroup2In lists the cgroup2 mount points of a mounts file, in its order.
func cgroup2In(mounts string) []string {
	f, err := os.Open(mounts)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 3 && fields[2] == "cgroup2" {
			out = append(out, fields[1])
		}
	}
	return out
}

func isCgroup2(path string) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC
}

// Resolve turns a --cgroup argument (absolute, or relative to the cgroup2 mount) into
// an absolute path, checking it is a cgroup v2 directory and not the root. An absolute path
// the host sees but this mount namespace does not (`ip netns exec`) is taken through the
// host's root, as Mount finds it.
func Resolve(arg string) (string, error) {
	root, err := Mount()
	if err != nil {
		return "", err
	}
	p := arg
	if !filepath.IsAbs(p) {
		p = filepath.Join(root, p)
	} else if host, ok := hostRoot(root); ok && !strings.HasPrefix(p, root+"/") {
		p = host + p
	}
	p = filepath.Clean(p)
	if fi, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("--cgroup %s: %w (create it with mkdir under %s)", arg, err, root)
	} else if !fi.IsDir() {
		return "", fmt.Errorf("--cgroup %s is a file, not a cgroup directory", arg)
	}
	if !isCgroup2(p) {
		return "", fmt.Errorf("--cgroup %s is not on a cgroup v2 file system (cgroup v2 is mounted at %s)", arg, root)
	}
	if p == root {
		return "", fmt.Errorf("--cgroup %s is the root cgroup; flowplane does not act on every socket on the host, give a child cgroup", arg)
	}
	return p, nil
}

// HostPath is path as the host names it, without the /proc/PID/root that Resolve puts before
// it under `ip netns exec`: what flowplane shows and records for people to read.
func HostPath(path string) string {
	if host, ok := hostRoot(path); ok {
		return strings.TrimPrefix(path, host)
	}
	return path
}

// Reach turns a cgroup path flowplane recorded earlier into one that works from here: taken
// under `ip netns exec` it goes through an ancestor's root, which is gone once that process
// exits, and the host's path is hidden under `ip netns exec`. path itself if neither helps.
func Reach(path string) string {
	p := HostPath(path)
	if isCgroup2(p) {
		return p
	}
	if r, err := Resolve(p); err == nil {
		return r
	}
	return path
}

// hostRoot is /proc/PID/root when Mount found cgroup v2 through an ancestor's root.
func hostRoot(mount string) (string, bool) {
	rest, ok := strings.CutPrefix(mount, "/proc/")
	if !ok {
		return "", false
	}
	pid, _, ok := strings.Cut(rest, "/root/")
	return "/proc/" + pid + "/root", ok
}

// Remove removes a cgroup flowplane created. Processes still in it (a `tune exec` that
// outlived its policy) are moved to the parent first, since rmdir refuses a populated cgroup
// and nothing tunes them once the policy is gone; exiting processes keep a cgroup populated
// for a moment, so EBUSY is retried for a few seconds.
func Remove(path string) error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := unix.Rmdir(path)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			return fmt.Errorf("remove cgroup %s: %w (still populated: see %s/cgroup.procs and its child cgroups)", path, err, path)
		}
		if err := moveProcs(path, filepath.Dir(path)); err != nil {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// moveProcs moves every process of cgroup from to cgroup to; ones that exit meanwhile are
// skipped.
func moveProcs(from, to string) error {
	data, err := os.ReadFile(filepath.Join(from, "cgroup.procs"))
	if err != nil {
		return fmt.Errorf("list processes of cgroup %s: %w", from, err)
	}
	for _, pid := range strings.Fields(string(data)) {
		err := os.WriteFile(filepath.Join(to, "cgroup.procs"), []byte(pid), 0)
		if err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("move process %s from cgroup %s to %s: %w", pid, from, to, err)
		}
	}
	return nil
}

// Into makes cmd start inside cgroup; close the returned file once cmd has started.
func Into(cmd *exec.Cmd, cgroup string) (io.Closer, error) {
	fd, err := os.Open(cgroup)
	if err != nil {
		return nil, fmt.Errorf("open cgroup: %w", err)
	}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.UseCgroupFD = true
	cmd.SysProcAttr.CgroupFD = int(fd.Fd())
	return fd, nil
}
