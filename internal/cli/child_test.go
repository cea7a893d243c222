package cli

import (
	"os/exec"
	"testing"
)

// TestRun: a command's exit code becomes flowplane's, silently; a signal's as a shell gives it;
// one that cannot start exits 127 (not found) or 126 (not executable) with its reason.
func TestRun(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		argv  []string
		code  int
		quiet bool
	}{
		{[]string{"true"}, 0, true},
		{[]string{"sh", "-c", "exit 3"}, 3, true},
		{[]string{"sh", "-c", "kill -TERM $$"}, 143, true},
		{[]string{"sh", "-c", "kill -KILL $$"}, 137, false}, // "killed by signal killed"
		{[]string{"/nonexistent/fp"}, 127, false},
		{[]string{"/"}, 126, false},
		{[]string{"/etc/hostname"}, 126, false},
	} {
		err := Run(exec.Command(c.argv[0], c.argv[1:]...))
		code := 0
		if err != nil {
			code = ExitCode(err)
		}
		if code != c.code || (err != nil && Quiet(err) != c.quiet) {
			t.Errorf("%q: %v, exit %d (quiet %v); want exit %d, quiet %v", c.argv, err, code, Quiet(err), c.code, c.quiet)
		}
	}
}
