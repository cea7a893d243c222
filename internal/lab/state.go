package lab

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/flowplane/flowplane/internal/topo"
)

// stateDir keeps one record per running lab: the topology it was started from, so status, exec
// and down work from any shell without the file.
const stateDir = "/run/flowplane/lab"

type record struct {
	Name    string    `json:"name"`
	File    string    `json:"file"`
	YAML    string    `json:"yaml"`
	Created time.Time `json:"created"`
}

func recordPath(name string) string { return filepath.Join(stateDir, name+".json") }

func saveRecord(r record) error {
	if err := os.MkdirAll(stateDir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", stateDir, err)
	}
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	tmp := recordPath(r.Name) + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return fmt.Errorf("write lab record: %w", err)
	}
	return os.Rename(tmp, recordPath(r.Name))
}

// ErrNotFound is returned for a lab that is not running.
var ErrNotFound = errors.New("no such lab")

// Open returns the running lab called name.
func Open(name string) (*Lab, error) {
	data, err := os.ReadFile(recordPath(name))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("lab %q: %w (flowplane lab ls lists the running ones)", name, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("read lab record: %w", err)
	}
	var r record
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("lab record %s is corrupt: %w", recordPath(name), err)
	}
	t, err := topo.Parse(r.File, []byte(r.YAML))
	if err != nil {
		return nil, fmt.Errorf("lab record %s: %w", recordPath(name), err)
	}
	t.Name = r.Name
	return &Lab{Topology: t, Created: r.Created}, nil
}

// Names lists running labs: those with a record and those that only left namespaces behind.
func Names() ([]string, error) {
	seen := map[string]bool{}
	entries, err := os.ReadDir(stateDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	for _, e := range entries {
		if name, ok := strings.CutSuffix(e.Name(), ".json"); ok {
			seen[name] = true
		}
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
