package cli

import (
	"errors"
	"os/exec"
	"syscall"
)

// ChildExit is a command flowplane ran (lab exec, tune exec, altmark analyze) that exited
// non-zero. flowplane exits with its code, 128+N when signal N killed it (as a shell reports
// it), and adds no message when it exited, as env and ip netns exec do: the command said what
// went wrong. A signal it did not see coming is said (Signal).
type ChildExit struct {
	Code   int
	Signal syscall.Signal // 0 when it exited
}

func (e *ChildExit) Error() string {
	if e.Signal != 0 {
		return "the command was killed by signal " + e.Signal.String()
	}
	return "the command exited with a non-zero code"
}
func (e *ChildExit) ExitCode() int { return e.Code }

// CannotStart is a command that could not be started: exit 127 when it is not found, 126 when
// it is not executable, as a shell's.
type CannotStart struct{ Err error }

func (e *CannotStart) Error() string { return e.Err.Error() }
func (e *CannotStart) Unwrap() error { return e.Err }
func (e *CannotStart) ExitCode() int {
	if errors.Is(e.Err, exec.ErrNotFound) || errors.Is(e.Err, syscall.ENOENT) {
		return 127
	}
	return 126
}

// Run starts c and waits for it: nil when it exits 0, else a ChildExit, a CannotStart when
// the command is not there or not executable, or Start's error (a cgroup that refuses it).
func Run(c *exec.Cmd) error {
	if err := c.Start(); err != nil {
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.EACCES) ||
			errors.Is(err, syscall.ENOEXEC) || errors.Is(err, syscall.EISDIR) {
			return &CannotStart{Err: err}
		}
		return err
	}
	err := c.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return err
	}
	ce := &ChildExit{Code: ee.ExitCode()}
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		ce.Code, ce.Signal = 128+int(ws.Signal()), ws.Signal()
	}
	return ce
}

// Quiet reports whether err needs no message: a command's own exit passed on. A command
// killed by a signal other than the SIGINT or SIGTERM flowplane passed on is said.
func Quiet(err error) bool {
	var ce *ChildExit
	return errors.As(err, &ce) && (ce.Signal == 0 || ce.Signal == syscall.SIGINT || ce.Signal == syscall.SIGTERM)
}
