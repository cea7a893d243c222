// Package lab runs topologies (internal/topo) as network namespaces joined by veth pairs: routed
// hosts and routers, HTB rate limits and BPF-injected loss on links, and it tears them down
// leaving nothing behind.
package lab

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/flowplane/flowplane/internal/attach"
	"github.com/flowplane/flowplane/internal/nsrun"
	"github.com/flowplane/flowplane/internal/pin"
	"github.com/flowplane/flowplane/internal/runstate"
	"github.com/flowplane/flowplane/internal/topo"
	"golang.org/x/sys/unix"
)

// Lab is a running topology.
type Lab struct {
	Topology *topo.Topology
	Created  time.Time
}

// Name is the lab's name, the prefix of all its kernel objects.
func (l *Lab) Name() string { return l.Topology.Name }

// Netns is the namespace of a node.
func (l *Lab) Netns(node string) string { return Netns(l.Name(), node) }

// IfName is the kernel name of an interface.
func (l *Lab) IfName(ifc *topo.Iface) string { return IfName(l.Name(), ifc.Name) }

// ErrExists is returned by Up when the name is taken.
var ErrExists = errors.New("a lab of that name is running")

// Parse reads a topology and checks it can run in the kernel lab. name, if set, overrides the
// file's. Errors are topo.Errors: every problem, with its line.
func Parse(file string, data []byte, name string) (*topo.Topology, error) {
	t, err := topo.ParseNamed(file, data, name)
	if err != nil {
		return nil, err
	}
	if errs := check(t); len(errs) > 0 {
		return nil, errs
	}
	return t, nil
}

// check rejects what the kernel dataplane cannot do here, saying what can.
func check(t *topo.Topology) topo.Errors {
	var errs topo.Errors
	for _, l := range t.Links {
		if l.A.Node.XDP && l.B.Node.XDP && (l.A.Rate > 0 || l.B.Rate > 0 || l.A.HasLoss || l.B.HasLoss) {
			errs = append(errs, topo.Error{File: t.File, Line: l.Line, Field: fmt.Sprintf("links[%d]", l.Index),
				Msg: fmt.Sprintf("a link between two xdp nodes (%s, %s) cannot have a rate or loss: XDP redirects skip the "+
					"sender's qdisc and the receiver's XDP runs before its ingress, so nothing could impair it; "+
					"put a plain router between them or drop xdp: true on one", l.A.Node.Name, l.B.Node.Name)})
		}
		if l.Impaired() && (l.A.Node.XDP || l.B.Node.XDP) {
			errs = append(errs, topo.Error{File: t.File, Line: l.Line, Field: fmt.Sprintf("links[%d]", l.Index),
				Msg: "a link of an xdp node cannot have delay, jitter, reorder, duplicate, corrupt or gemodel loss: its relay " +
					"receives with a packet socket, which frames redirected by XDP into a veth skip; put a plain router " +
					"between the xdp node and the impaired link"})
		}
	}
	return errs
}

// Up creates the lab. On any failure it removes what it made and returns the error.
func Up(file string, data []byte, t *topo.Topology) (*Lab, error) {
	if names, err := Names(); err != nil {
		return nil, err
	} else if slices.Contains(names, t.Name) {
		return nil, fmt.Errorf("lab %q: %w; `flowplane lab down %s` removes it", t.Name, ErrExists, t.Name)
	}
	// The record goes first: if we die half-way, `lab down` still knows what to remove.
	if abs, err := filepath.Abs(file); err == nil {
		file = abs // status and list name the file wherever they run
	}
	rec := record{Name: t.Name, File: file, YAML: string(data), Created: time.Now().UTC().Truncate(time.Second)}
	if err := runstate.Save(subsystem, rec.Name, rec); err != nil {
		return nil, err
	}
	l := &Lab{Topology: t, Created: rec.Created}
	if err := l.create(); err != nil {
		if derr := Down(t.Name); derr != nil {
			err = errors.Join(err, fmt.Errorf("roll back: %w", derr))
		}
		return nil, fmt.Errorf("lab %s: %w (rolled back)", t.Name, err)
	}
	return l, nil
}

// Repair brings a running lab back up where it is down: it starts a new supervisor, and so a
// relay, for each impaired link whose relay was given up (failed) or whose supervisor is gone
// (dead), and returns those links. data must be the topology the lab was started from, byte
// for byte: another (or a lab with no record) is ErrExists, the lab left as it is.
func Repair(name string, data []byte) ([]*topo.Link, error) {
	l, rec, err := open(name)
	switch {
	case errors.Is(err, ErrNotFound): // namespaces left without a record
		return nil, fmt.Errorf("lab %q: %w, or what is left of it; `flowplane lab down %s` removes it", name, ErrExists, name)
	case err != nil:
		return nil, err
	case rec.YAML != string(data):
		return nil, fmt.Errorf("lab %q: %w from another topology (`lab up` again needs the file it was started from, as it was; "+
			"`flowplane lab status %s` names it); `flowplane lab down %s` removes it", name, ErrExists, name, name)
	}
	var restarted []*topo.Link
	for _, link := range l.Topology.Links {
		if !link.Impaired() {
			continue
		}
		if r, err := l.Relay(link); err == nil && r.State != relayFailed && r.State != relayDead {
			continue
		}
		// Whatever is left in the relay's namespace (a relay dying with its supervisor) goes first.
		if err := nsrun.Kill(l.relayNetns(link)); err != nil {
			return restarted, fmt.Errorf("link %s-%s: %w", link.A.Node.Name, link.B.Node.Name, err)
		}
		if err := l.startRelay(link); err != nil {
			return restarted, fmt.Errorf("link %s-%s: %w", link.A.Node.Name, link.B.Node.Name, err)
		}
		restarted = append(restarted, link)
	}
	return restarted, nil
}

func (l *Lab) create() error {
	for _, n := range l.Topology.Nodes {
		if err := nsrun.Create(l.Netns(n.Name)); err != nil {
			return err
		}
		if err := nsrun.Do(l.Netns(n.Name), func() error { return setupNode(n) }); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	for _, link := range l.Topology.Links {
		if err := l.addLink(link); err != nil {
			return fmt.Errorf("link %s-%s: %w", link.A.Node.Name, link.B.Node.Name, err)
		}
	}
	for _, n := range l.Topology.Nodes {
		if err := nsrun.Do(l.Netns(n.Name), func() error { return l.addRoutes(n) }); err != nil {
			return fmt.Errorf("routes of %s: %w", n.Name, err)
		}
	}
	for _, link := range l.Topology.Links {
		if link.Impaired() {
			if err := l.startRelay(link); err != nil {
				return fmt.Errorf("link %s-%s: %w", link.A.Node.Name, link.B.Node.Name, err)
			}
		}
	}
	return nil
}

// Down removes every kernel object of the lab: the processes running on its nodes and its
// links' relays, its namespaces (and with them veths, qdiscs and BPF attachments), its pins, the
// relays' files and its record. It also cleans up after a lab that died half-way.
func Down(name string) error {
	if err := topo.ValidName(name); err != nil {
		return err
	}
	nss, err := netnsNames()
	if err != nil {
		return err
	}
	var errs []error
	found := false
	for _, ns := range nss {
		if labOfNetns(ns) == name {
			found = true
			if err := nsrun.Kill(ns); err != nil {
				errs = append(errs, err)
			}
			// Per-namespace instances (conntrack's table) die with their namespace.
			var st unix.Stat_t
			if err := unix.Stat(nsrun.Path(ns), &st); err == nil {
				errs = append(errs, attach.ForgetNetns(st.Ino))
			}
			if err := nsrun.Delete(ns); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := os.RemoveAll(relayRunDir(name)); err != nil {
		errs = append(errs, err)
	}
	if _, err := os.Stat(pin.Path("lab", name)); err == nil {
		found = true
	}
	if err := pin.Remove("lab", name); err != nil {
		errs = append(errs, err)
	}
	if _, err := os.Stat(runstate.Path(subsystem, name)); err == nil {
		found = true
	}
	if err := runstate.Remove(subsystem, name); err != nil {
		errs = append(errs, err)
	}
	if !found {
		return fmt.Errorf("lab %q: %w", name, ErrNotFound)
	}
	return errors.Join(errs...)
}

// Env is the environment of commands run on a node: the caller's, the node's own variables,
// and FP_LAB/FP_NODE/FP_NETNS so scripts know where they are.
func (l *Lab) Env(node *topo.Node) []string {
	env := append(os.Environ(), "FP_LAB="+l.Name(), "FP_NODE="+node.Name, "FP_NETNS="+l.Netns(node.Name))
	for k, v := range node.Env {
		env = append(env, k+"="+v)
	}
	return env
}

// Node returns a node by name, with an error that lists the nodes.
func (l *Lab) Node(name string) (*topo.Node, error) {
	if n := l.Topology.Node(name); n != nil {
		return n, nil
	}
	names := make([]string, len(l.Topology.Nodes))
	for i, n := range l.Topology.Nodes {
		names[i] = n.Name
	}
	return nil, fmt.Errorf("lab %s has no node %q; nodes: %s", l.Name(), name, strings.Join(names, ", "))
}
