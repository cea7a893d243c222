package main

// What the fault and soak parts (api.go, soak.go) share: a lab of their own, the running
// flowplane's processes, and what they hold (memory, files) and the maps hold (entries).

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf"

	"github.com/flowplane/flowplane/bench/report"
	"github.com/flowplane/flowplane/internal/altmark"
	"github.com/flowplane/flowplane/internal/attach"
	"github.com/flowplane/flowplane/internal/lab"
	"github.com/flowplane/flowplane/internal/nsrun"
	"github.com/flowplane/flowplane/internal/pin"
	"github.com/flowplane/flowplane/internal/topo"
)

// flowplaneBin is the binary `make bench` built: the parts run it as a user would.
func flowplaneBin() (string, error) {
	bin, err := filepath.Abs("bin/flowplane")
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(bin); err != nil {
		return "", fmt.Errorf("%s: %w (make build)", bin, err)
	}
	return bin, nil
}

// faultLab brings up topology yaml under a unique name prefix+6 hex digits; down removes it.
func faultLab(prefix, file string, yaml []byte) (l *lab.Lab, down func(), err error) {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	name := prefix + hex.EncodeToString(b)
	top, err := lab.Parse(file, yaml, name)
	if err != nil {
		return nil, nil, err
	}
	l, err = lab.Up(file, yaml, top)
	if err != nil {
		return nil, nil, fmt.Errorf("lab up: %w", err)
	}
	return l, func() {
		if err := lab.Down(name); err != nil {
			slog.Error("lab down", "lab", name, "err", err)
		}
	}, nil
}

// labIface is node's interface towards peer.
func labIface(l *lab.Lab, node, peer string) (*topo.Iface, error) {
	n, err := l.Node(node)
	if err != nil {
		return nil, err
	}
	for _, i := range n.Ifaces {
		if i.Peer().Node.Name == peer {
			return i, nil
		}
	}
	return nil, fmt.Errorf("%s has no link to %s", node, peer)
}

// labDevice is the lab's device name of node's interface towards peer.
func labDevice(l *lab.Lab, node, peer string) (string, error) {
	i, err := labIface(l, node, peer)
	if err != nil {
		return "", err
	}
	return l.IfName(i), nil
}

// procFigures is what a process holds.
type procFigures struct {
	RSSKiB  int64 `json:"rss_kib"`
	FDs     int   `json:"fds"`
	Threads int   `json:"threads"`
	// FDKinds counts the open files by what they are: socket, pipe, file (a path), or the
	// anonymous inode's name ([eventpoll], bpf-map…).
	FDKinds map[string]int `json:"fd_kinds,omitempty"`
}

// procStat reads pid's resident memory, open file descriptors and threads from /proc.
func procStat(pid int) (procFigures, error) {
	var f procFigures
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return f, err
	}
	for line := range strings.Lines(string(status)) {
		k, v, _ := strings.Cut(line, ":")
		fields := strings.Fields(v)
		if len(fields) == 0 {
			continue
		}
		switch k {
		case "VmRSS":
			f.RSSKiB, _ = strconv.ParseInt(fields[0], 10, 64)
		case "Threads":
			f.Threads, _ = strconv.Atoi(fields[0])
		}
	}
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	fds, err := os.ReadDir(dir)
	if err != nil {
		return f, err
	}
	f.FDs = len(fds)
	f.FDKinds = map[string]int{}
	for _, fd := range fds {
		target, err := os.Readlink(filepath.Join(dir, fd.Name()))
		if err != nil {
			continue // closed since
		}
		kind, _, _ := strings.Cut(target, ":")
		switch {
		case strings.HasPrefix(target, "/"):
			kind = "file"
		case kind == "anon_inode":
			kind = strings.TrimPrefix(target, "anon_inode:")
		}
		f.FDKinds[kind]++
	}
	return f, nil
}

// series is a process's figures sampled over a run, first to last.
type series []procFigures

// halves are the medians of a figure over the first and the second half of the samples: the
// end of a run against its start, without one garbage collection's swing deciding.
func (s series) halves(f func(procFigures) int64) (first, second int64) {
	median := func(xs []procFigures) int64 {
		v := make([]int64, len(xs))
		for i, x := range xs {
			v[i] = f(x)
		}
		slices.Sort(v)
		if len(v) == 0 {
			return 0
		}
		return v[len(v)/2]
	}
	h := len(s) / 2
	if h == 0 {
		return median(s), median(s)
	}
	return median(s[:h]), median(s[len(s)-h:])
}

// floors is the smallest value of a figure in the first half of the series and in the second
// (as halves): the level under what a sample catches held for a moment.
func (s series) floors(f func(procFigures) int64) (first, second int64) {
	h := max(len(s)/2, 1)
	lo, _ := s[:h].span(f)
	hi, _ := s[len(s)-h:].span(f)
	return lo, hi
}

// span is the smallest and largest value of a figure.
func (s series) span(f func(procFigures) int64) (lo, hi int64) {
	for i, x := range s {
		if v := f(x); i == 0 || v < lo {
			lo = v
		}
		if v := f(x); i == 0 || v > hi {
			hi = v
		}
	}
	return lo, hi
}

func rssOf(f procFigures) int64     { return f.RSSKiB }
func fdsOf(f procFigures) int64     { return int64(f.FDs) }
func socketsOf(f procFigures) int64 { return int64(f.FDKinds["socket"]) }

// flatGoals judge a series flat: the second half's median RSS at most 10 % above the first
// half's, and its median open files at most one above.
func flatGoals(s series) []report.Goal {
	r1, r2 := s.halves(rssOf)
	f1, f2 := s.halves(fdsOf)
	return []report.Goal{
		report.AtMost("RSS, 2nd half / 1st half (medians)", float64(r2)/float64(max(r1, 1)), 1.1),
		report.AtMost("open files, 2nd half − 1st half (medians)", float64(f2-f1), 1),
	}
}

// sampleEvery is how often a run of d samples its processes: every 30 s, at least 10 times.
func sampleEvery(d time.Duration) time.Duration { return max(min(30*time.Second, d/10), time.Second) }

// lastLine is the last non-empty line of a log, for a table cell or note.
func lastLine(log []byte) string {
	lines := strings.Split(strings.TrimSpace(string(log)), "\n")
	return lines[len(lines)-1]
}

func mib(kib int64) string { return fmt.Sprintf("%.1f MiB", float64(kib)/1024) }

// mapEntries counts the entries of every map pinned under flowplane's bpffs directory whose
// path holds one of the tokens (a lab's name, a namespace's pin name, an instance name), with
// its size: entries, max entries by path. Arrays are left out: every index is an entry.
func mapEntries(tokens []string) (map[string][2]int, error) {
	out := map[string][2]int{}
	root := pin.Path()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() || !containsAny(rel, tokens) {
			return nil
		}
		m, err := ebpf.LoadPinnedMap(path, &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			return nil // a link or a program
		}
		defer m.Close()
		switch m.Type() {
		case ebpf.Hash, ebpf.LRUHash, ebpf.PerCPUHash, ebpf.LRUCPUHash, ebpf.LPMTrie:
		default:
			return nil
		}
		n, err := countKeys(m)
		if err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		out[rel] = [2]int{n, int(m.MaxEntries())}
		return nil
	})
	return out, err
}

func containsAny(s string, tokens []string) bool {
	for _, t := range tokens {
		if t != "" && strings.Contains(s, t) {
			return true
		}
	}
	return false
}

// countKeys walks m's keys (at most twice its size: a hash walk restarts when its key goes).
func countKeys(m *ebpf.Map) (int, error) {
	var prev any
	next := make([]byte, m.KeySize())
	n := 0
	for n < 2*int(m.MaxEntries()) {
		if err := m.NextKey(prev, next); err != nil {
			if errors.Is(err, ebpf.ErrKeyNotExist) {
				break
			}
			return n, err
		}
		n++
		prev = append([]byte(nil), next...)
	}
	return n, nil
}

// netnsPin is the pin-path name (ns<inode>) of the lab node's network namespace.
func netnsPin(l *lab.Lab, node string) (string, error) {
	var name string
	err := nsrun.Do(l.Netns(node), func() error {
		var err error
		name, err = attach.ThisNetns()
		return err
	})
	return name, err
}

// dialIn dials from inside network namespace ns.
func dialIn(ns string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := nsrun.Do(ns, func() error {
			var err error
			c, err = (&net.Dialer{Timeout: 10 * time.Second}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
}

// probeStatus is GET /status of the altmark probe listening on addr in r1's namespace, with
// the bearer token if one is given.
func probeStatus(l *lab.Lab, addr, token string) (map[string]any, error) {
	cl := &http.Client{Transport: &http.Transport{DialContext: dialIn(l.Netns("r1"))}, Timeout: 10 * time.Second}
	defer cl.CloseIdleConnections()
	body, err := altmark.APIGet(context.Background(), cl, "http://"+addr+"/status", token)
	if err != nil {
		return nil, err
	}
	var st map[string]any
	if err := json.Unmarshal(body, &st); err != nil {
		return nil, fmt.Errorf("GET /status: %w", err)
	}
	return st, nil
}
