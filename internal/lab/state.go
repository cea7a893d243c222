package lab

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"time"

	"github.com/flowplane/flowplane/internal/runstate"
	"github.com/flowplane/flowplane/internal/topo"
)

// A record per running lab (internal/runstate) keeps the topology it was started from, so
// status, exec and down work from any shell without the file.
const subsystem = "lab"

type record struct {
	Name    string    `json:"name"`
	File    string    `json:"file"`
	YAML    string    `json:"yaml"`
	Created time.Time `json:"created"`
}

// ErrNotFound is returned for a lab that is not running.
var ErrNotFound = errors.New("no such lab")

// Open returns the running lab called name.
func Open(name string) (*Lab, error) {
	l, _, err := open(name)
	return l, err
}

// open returns the running lab called name and its record.
func open(name string) (*Lab, *record, error) {
	var r record
	err := runstate.Load(subsystem, name, &r)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, fmt.Errorf("lab %q: %w (flowplane lab list lists the running ones)", name, ErrNotFound)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("read lab record: %w", err)
	}
	t, err := topo.ParseNamed(r.File, []byte(r.YAML), r.Name) // the name up was given, whatever the file says
	if err != nil {
		return nil, nil, fmt.Errorf("lab record %s: %w", runstate.Path(subsystem, name), err)
	}
	t.Name = r.Name
	return &Lab{Topology: t, Created: r.Created}, &r, nil
}

// Names lists running labs: those with a record and those that only left namespaces behind.
func Names() ([]string, error) {
	seen := map[string]bool{}
	recorded, err := runstate.Names(subsystem)
	if err != nil {
		return nil, err
	}
	for _, name := range recorded {
		seen[name] = true
	}
	nss, err := netnsNames()
	if err != nil {
		return nil, err
	}
	for _, ns := range nss {
		if lab := labOfNetns(ns); lab != "" {
			seen[lab] = true
		}
	}
	names := make([]string, 0, len(seen))
	for n := range seen {
		names = append(names, n)
	}
	sort.Strings(names)
	return names, nil
}

// netnsNames lists the named network namespaces (/run/netns, as `ip netns list`).
func netnsNames() ([]string, error) {
	entries, err := os.ReadDir("/run/netns")
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names, nil
}
