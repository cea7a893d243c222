package attach

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/flowplane/flowplane/internal/pin"
	"github.com/flowplane/flowplane/internal/runstate"
)

// Per-network-namespace instances (conntrack's tables, altmark's markers, prio's routers) are
// named by the namespace's inode (pin.Netns), which the kernel gives to a new namespace once the
// old one is deleted. So that a namespace never takes over what was left in a deleted one (`ip
// netns del` with a marker still applied: its pins and records stay), the first instance id
// asked for in a namespace tags the inode with the namespace's cookie, which is never reused, in
// the record netns/ns<inode>. A tag with another cookie means that namespace was deleted: its
// instances are removed before this one uses the id.
const netnsTags = "netns"

// Warn says what attach did that nobody asked for; the command line prints it as its other
// warnings ("warning: …"), a library's default is its log.
var Warn = func(msg string) { slog.Warn(msg) }

// ThisNetns is the instance id of the calling thread's network namespace (pin.Netns of its
// inode), after removing the instances of a deleted namespace that had the same inode.
func ThisNetns() (string, error) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &st); err != nil {
		return "", fmt.Errorf("identify network namespace: %w", err)
	}
	id := pin.Netns(st.Ino)
	cookie, ok := netnsCookie()
	if !ok { // before Linux 5.14: ids as they are
		return id, nil
	}
	// One command at a time reads, forgets and writes tags: a second one in a reused namespace
	// then finds the tag the first wrote, and removes nothing the first made since.
	unlock, err := lock(netnsTags, unix.LOCK_EX)
	if err != nil {
		slog.Debug("cannot lock the network namespace tags", "err", err)
		return id, nil
	}
	defer unlock()
	var tag struct {
		Cookie uint64 `json:"cookie"`
	}
	err = runstate.Load(netnsTags, id, &tag)
	switch {
	case err == nil && tag.Cookie == cookie:
		now := time.Now() // in use: dropIdleTags leaves it alone a while longer
		_ = os.Chtimes(runstate.Path(netnsTags, id), now, now)
		return id, nil
	case err == nil:
		if held(id) {
			Warn("removed what flowplane had in a deleted network namespace with this one's inode (" + id + ")")
		}
		if err := ForgetNetns(st.Ino); err != nil {
			return "", err
		}
	case !errors.Is(err, os.ErrNotExist):
		return "", fmt.Errorf("read the tag of network namespace %s: %w", id, err)
	}
	// Untagged: a new namespace, or one whose instances an older flowplane made (kept). A tag
	// that cannot be written (a read-only /run) costs only the telling apart.
	tag.Cookie = cookie
	if err := runstate.Save(netnsTags, id, &tag); err != nil {
		slog.Debug("cannot tag the network namespace", "netns", id, "err", err)
		return id, nil
	}
	dropIdleTags(id)
	return id, nil
}

// dropIdleTags removes the tags of other namespaces that hold no instance (a status asked
// there, or everything removed since): a tag matters only while there is something to tell
// apart. A tag younger than a minute stays: its command may be making its instance.
func dropIdleTags(keep string) {
	tags, _ := runstate.Names(netnsTags)
	for _, id := range tags {
		st, err := os.Stat(runstate.Path(netnsTags, id))
		if id == keep || err != nil || time.Since(st.ModTime()) < time.Minute || held(id) {
			continue
		}
		_ = runstate.Remove(netnsTags, id)
	}
}

// held says whether any subsystem has records or pins of namespace id.
func held(id string) bool {
	if len(netnsRecords(id)) > 0 {
		return true
	}
	pins, _ := os.ReadDir(pin.Path())
	for _, s := range pins {
		if _, err := os.Stat(pin.Path(s.Name(), id)); err == nil {
			return true
		}
	}
	return false
}

// netnsCookie is the calling thread's network namespace cookie (SO_NETNS_COOKIE).
func netnsCookie() (uint64, bool) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, false
	}
	defer unix.Close(fd)
	c, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
	return c, err == nil
}

// ForgetNetns removes every subsystem's instances of the network namespace with inode ino, its
// records and pins, and its tag: the namespace is deleted or being deleted (lab down). Links
// there hold no hook any more (their devices went with the namespace), or are detached as
// their pins go.
func ForgetNetns(ino uint64) error {
	id := pin.Netns(ino)
	var errs []error
	for _, r := range netnsRecords(id) {
		errs = append(errs, runstate.Remove(r[0], r[1]))
	}
	errs = append(errs, pin.RemoveNetns(ino), runstate.Remove(netnsTags, id))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("remove what was left of network namespace %s: %w", id, err)
	}
	return nil
}

// namedByUsers are the subsystems whose records are named by users (a lab, a tune policy),
// never by a namespace: a lab may be called ns4026532177.
var namedByUsers = []string{netnsTags, "lab", "tune"}

// netnsRecords lists the records (subsystem, name) of namespace id's instances: named id, or
// id-… (runstate names of attach.Instance pins).
func netnsRecords(id string) [][2]string {
	subs, _ := os.ReadDir(runstate.Root)
	var out [][2]string
	for _, s := range subs {
		if !s.IsDir() || slices.Contains(namedByUsers, s.Name()) {
			continue
		}
		names, _ := runstate.Names(s.Name())
		for _, n := range names {
			if n == id || strings.HasPrefix(n, id+"-") {
				out = append(out, [2]string{s.Name(), n})
			}
		}
	}
	return out
}
