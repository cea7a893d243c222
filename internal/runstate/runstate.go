// Package runstate keeps the small JSON records flowplane leaves under /run/flowplane/<subsystem>/
// so that later commands, from any shell, know what an earlier one set up. Records are written
// atomically (temporary file, then rename): a reader sees the old record or the new one.
package runstate

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Root is where the records live; /run is cleared at boot, as are the kernel objects they
// describe.
const Root = "/run/flowplane"

// Path is the file of a subsystem's record called name.
func Path(subsystem, name string) string {
	return filepath.Join(Root, subsystem, name+".json")
}

// Save writes v as the record.
func Save(subsystem, name string, v any) error {
	dir := filepath.Join(Root, subsystem)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	tmp := Path(subsystem, name) + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return fmt.Errorf("write %s record: %w", subsystem, err)
	}
	return os.Rename(tmp, Path(subsystem, name))
}

// Load reads the record into v; the error wraps os.ErrNotExist when there is none.
func Load(subsystem, name string, v any) error {
	data, err := os.ReadFile(Path(subsystem, name))
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("record %s is corrupt: %w", Path(subsystem, name), err)
	}
	return nil
}

// Remove deletes the record; a missing one is not an error.
func Remove(subsystem, name string) error {
	if err := os.Remove(Path(subsystem, name)); err != nil && !os.IsNotExist(err) {
		return err
	}
	return nil
}

// Names lists a subsystem's records.
func Names(subsystem string) ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(Root, subsystem))
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		if name, ok := strings.CutSuffix(e.Name(), ".json"); ok {
			names = append(names, name)
		}
	}
	return names, nil
}

// Each calls fn with the name of every record of a subsystem, in name order. A record removed
// while fn reads it (a concurrent remove, which deletes the record before the kernel objects it
// describes) is skipped: fn's error counts only while the record still exists.
func Each(subsystem string, fn func(name string) error) error {
	names, err := Names(subsystem)
	if err != nil {
		return err
	}
	slices.Sort(names)
	for _, n := range names {
		if err := fn(n); err != nil {
			if _, serr := os.Stat(Path(subsystem, n)); errors.Is(serr, os.ErrNotExist) {
				continue
			}
			return err
		}
	}
	return nil
}
