package runstate_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/flowplane/flowplane/internal/runstate"
	"github.com/flowplane/flowplane/internal/testenv"
)

type record struct {
	Name  string
	Count int
}

// subsystem is a subsystem directory of the test's own under /run/flowplane, removed at cleanup.
func subsystem(t *testing.T) string {
	t.Helper()
	testenv.Privileged(t) // /run is root's
	sub := testenv.Name("rs")
	t.Cleanup(func() { _ = os.RemoveAll(filepath.Join(runstate.Root, sub)) })
	return sub
}

func TestSaveLoadNamesRemove(t *testing.T) {
	t.Parallel()
	sub := subsystem(t)
	if names, err := runstate.Names(sub); err != nil || len(names) != 0 {
		t.Fatalf("names of a subsystem with no records: %v, %v", names, err)
	}
	var got record
	if err := runstate.Load(sub, "a", &got); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("load of a missing record: %v, want os.ErrNotExist", err)
	}
	for i, name := range []string{"a", "b"} {
		if err := runstate.Save(sub, name, record{name, i}); err != nil {
			t.Fatal(err)
		}
	}
	if err := runstate.Save(sub, "a", record{"a", 7}); err != nil { // overwrite
		t.Fatal(err)
	}
	if err := runstate.Load(sub, "a", &got); err != nil || got != (record{"a", 7}) {
		t.Fatalf("load a: %+v, %v", got, err)
	}
	names, err := runstate.Names(sub)
	slices.Sort(names)
	if err != nil || !slices.Equal(names, []string{"a", "b"}) {
		t.Fatalf("names %v, %v; want [a b] (no temporary files)", names, err)
	}
	if err := runstate.Remove(sub, "a"); err != nil {
		t.Fatal(err)
	}
	if err := runstate.Remove(sub, "a"); err != nil {
		t.Fatalf("removing a missing record: %v", err)
	}
	if names, _ := runstate.Names(sub); !slices.Equal(names, []string{"b"}) {
		t.Errorf("names after remove: %v", names)
	}
}

func TestCorruptRecordSaysWhich(t *testing.T) {
	t.Parallel()
	sub := subsystem(t)
	if err := runstate.Save(sub, "c", record{"c", 1}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(runstate.Path(sub, "c"), []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	var got record
	err := runstate.Load(sub, "c", &got)
	if err == nil || !strings.Contains(err.Error(), runstate.Path(sub, "c")) || !strings.Contains(err.Error(), "corrupt") {
		t.Errorf("corrupt record: %v; want an error naming the file", err)
	}
}

// TestEachSkipsRecordsRemovedWhileRead: a status that reads records while another command removes
// one (the record first, then its kernel objects) lists the others and fails on none; an error
// for a record that still exists is returned.
func TestEachSkipsRecordsRemovedWhileRead(t *testing.T) {
	t.Parallel()
	sub := subsystem(t)
	for _, name := range []string{"a", "b", "c"} {
		if err := runstate.Save(sub, name, record{Name: name}); err != nil {
			t.Fatal(err)
		}
	}
	objectsGone := errors.New("open counters: no such file")
	var read []string
	err := runstate.Each(sub, func(name string) error {
		if name == "b" { // removed concurrently, between the listing and this read
			if err := runstate.Remove(sub, "b"); err != nil {
				t.Fatal(err)
			}
			return objectsGone
		}
		read = append(read, name)
		return nil
	})
	if err != nil || !slices.Equal(read, []string{"a", "c"}) {
		t.Errorf("each: read %v, %v; want [a c] and no error", read, err)
	}
	err = runstate.Each(sub, func(name string) error { return objectsGone })
	if !errors.Is(err, objectsGone) {
		t.Errorf("each with a failing read of a record that exists: %v, want %v", err, objectsGone)
	}
}
