package attach_test

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flowplane/flowplane/internal/attach"
	"github.com/flowplane/flowplane/internal/nsrun"
	"github.com/flowplane/flowplane/internal/pin"
	"github.com/flowplane/flowplane/internal/runstate"
	"github.com/flowplane/flowplane/internal/testenv"
)

// TestForgetsADeletedNamespace: what a deleted network namespace left (pins and a record, as
// `ip netns del` under an applied marker leaves them) is removed when a new namespace with the
// same inode first asks for its id, and a namespace's own instances are kept. The kernel reuses
// inodes, never cookies: the reuse is played by giving the tag another cookie.
func TestForgetsADeletedNamespace(t *testing.T) {
	testenv.Privileged(t)
	ns := testenv.Netns(t)
	sub := testenv.Name("fpns")
	var id string
	t.Cleanup(func() {
		_ = pin.Remove(sub)
		_ = os.RemoveAll(filepath.Join(runstate.Root, sub))
		_ = runstate.Remove("netns", id)
	})
	// The tag of a namespace that holds nothing (no inode is 1), older than a minute, goes when
	// another is tagged.
	idle := pin.Netns(1)
	if err := runstate.Save("netns", idle, map[string]uint64{"cookie": 7}); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-2 * time.Minute)
	if err := os.Chtimes(runstate.Path("netns", idle), old, old); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = runstate.Remove("netns", idle) })
	err := nsrun.Do(ns, func() error {
		var err error
		if id, err = attach.ThisNetns(); err != nil {
			return err
		}
		if _, err := os.Stat(runstate.Path("netns", idle)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the tag of a namespace holding nothing is still there: %v", err)
		}
		dir, err := pin.Dir(sub, id, "eth0")
		if err != nil {
			return err
		}
		if err := counterMap(t).Pin(filepath.Join(dir, "stats")); err != nil {
			return err
		}
		if err := runstate.Save(sub, id+"-eth0", map[string]int{"n": 1}); err != nil {
			return err
		}
		if again, err := attach.ThisNetns(); err != nil || again != id {
			t.Errorf("the id asked again: %q, %v; want %q", again, err, id)
		}
		if _, err := os.Stat(dir); err != nil {
			t.Errorf("the namespace's own instance is gone: %v", err)
		}
		var tag struct {
			Cookie uint64 `json:"cookie"`
		}
		if err := runstate.Load("netns", id, &tag); err != nil {
			return err
		}
		real := tag.Cookie
		tag.Cookie++
		if err := runstate.Save("netns", id, &tag); err != nil {
			return err
		}
		var log bytes.Buffer
		defer slog.SetDefault(slog.Default())
		slog.SetDefault(slog.New(slog.NewTextHandler(&log, nil)))
		if again, err := attach.ThisNetns(); err != nil || again != id {
			t.Errorf("the id after the inode's reuse: %q, %v; want %q", again, err, id)
		}
		if !strings.Contains(log.String(), "removed what flowplane had in a deleted network namespace") {
			t.Errorf("no warning on removing a deleted namespace's instances: %q", log.String())
		}
		// Reused again, the deleted namespace holding nothing (a status asked there): silent.
		log.Reset()
		tag.Cookie = real + 1
		if err := runstate.Save("netns", id, &tag); err != nil {
			return err
		}
		if _, err := attach.ThisNetns(); err != nil || log.Len() != 0 {
			t.Errorf("a namespace that held nothing: %v, log %q", err, log.String())
		}
		if _, err := os.Stat(pin.Path(sub, id)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the deleted namespace's pins are still there: %v", err)
		}
		if _, err := os.Stat(runstate.Path(sub, id+"-eth0")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the deleted namespace's record is still there: %v", err)
		}
		if err := runstate.Load("netns", id, &tag); err != nil || tag.Cookie != real {
			t.Errorf("tag after the reuse: %d, %v; want this namespace's cookie %d", tag.Cookie, err, real)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
