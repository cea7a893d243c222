package testenv_test

import (
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/flowplane/flowplane/internal/nsrun"
	"github.com/flowplane/flowplane/internal/testenv"
)

func TestVethPairBetweenNamespaces(t *testing.T) {
	t.Parallel()
	testenv.Privileged(t)
	testenv.Need(t, "ping")
	a, b := testenv.Netns(t), testenv.Netns(t)
	ea, eb := testenv.VethPair(t, a, b, netip.MustParsePrefix("198.18.250.1/24"), netip.MustParsePrefix("198.18.250.2/24"))
	if ea.Index == 0 || eb.Index == 0 || len(ea.MAC) != 6 {
		t.Fatalf("ends not filled in: %+v %+v", ea, eb)
	}
	out, err := nsrun.Output(a, exec.Command("ping", "-c1", "-W2", "198.18.250.2"))
	if err != nil {
		t.Fatalf("ping across the pair: %v\n%s", err, out)
	}
	v6a, v6b := testenv.VethPair(t, a, b, netip.MustParsePrefix("fd00:250::1/64"), netip.MustParsePrefix("fd00:250::2/64"))
	if out, err := nsrun.Output(b, exec.Command("ping", "-6", "-c1", "-W2", "fd00:250::1")); err != nil {
		t.Fatalf("ping -6 across %s/%s: %v\n%s", v6a.Name, v6b.Name, err, out)
	}
}

// TestUnavailableSkipsOrFails runs TestUnavailableHelper in a child test binary: outside CI
// the guard skips it, with CI=true it fails it, naming what is missing.
func TestUnavailableSkipsOrFails(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		ci       string
		wantFail bool
		want     string
	}{
		{"", false, "--- SKIP: TestUnavailableHelper"},
		{"true", true, "cannot run in CI (CI=true): fpnosuchtool is not installed; `make setup` installs it"},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestUnavailableHelper$", "-test.v")
		cmd.Env = append(slices.DeleteFunc(os.Environ(), func(e string) bool { return strings.HasPrefix(e, "CI=") }),
			"FPTESTENV_HELPER=1", "CI="+c.ci)
		out, err := cmd.CombinedOutput()
		if (err != nil) != c.wantFail || !strings.Contains(string(out), c.want) {
			t.Errorf("CI=%q: %v, want failure %v and %q in:\n%s", c.ci, err, c.wantFail, c.want, out)
		}
	}
}

func TestUnavailableHelper(t *testing.T) {
	if os.Getenv("FPTESTENV_HELPER") != "1" {
		return // only TestUnavailableSkipsOrFails's child runs it
	}
	testenv.Need(t, "fpnosuchtool")
	t.Error("Need let the test go on without the tool")
}
