package prio

import (
	"testing"

	"github.com/flowplane/flowplane/internal/match"
	"github.com/flowplane/flowplane/internal/testenv"
)

// TestStatusWhileHostsComeAndGo: `prio status` run while another shell adds and removes host
// attachments lists what exists and never fails on what is being removed.
func TestStatusWhileHostsComeAndGo(t *testing.T) {
	t.Parallel()
	testenv.Privileged(t)
	cg := testCgroup(t)
	done := make(chan error, 1)
	go func() {
		defer close(done)
		for range 30 {
			name := testenv.Name("h")
			if err := Host(name, cg, &HostPolicy{File: "test", Advertise: []match.Match{match.Any()}}); err != nil {
				done <- err
				return
			}
			if err := RemoveHost(name); err != nil {
				done <- err
				return
			}
		}
	}()
	reads := 0
	for {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			if reads == 0 {
				t.Fatal("status was never read while hosts came and went")
			}
			return
		default:
		}
		if _, err := ReadStatus(); err != nil {
			for range done { // the hosts it made are removed before the cgroup is
			}
			t.Fatalf("status while hosts come and go (after %d good reads): %v", reads, err)
		}
		reads++
	}
}
