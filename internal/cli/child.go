package cli

import (
	"errors"
	"os/exec"
	"syscall"
)

// ChildExit is a command flowplane ran (lab exec, tune exec, altmark analyze) that exited
// non-zero. flowplane exits with its code, 128+N when signal N killed it (as a shell reports
// it), and adds no message, as env and ip netns exec do: the command said what went wrong.
type ChildExit struct{ Code int }

func (e *ChildExit) Error() string { return "the command exited with a non-zero code" }
func (e *ChildExit) ExitCode() int { return e.Code }

// CannotStart is a command that could not be started (not found, not executable): exit 127,
// as a shell's for a command it cannot run.
type CannotStart struct{ Err error }

func (e *CannotStart) Error() string { return e.Err.Error() }
func (e *CannotStart) Unwrap() error { return e.Err }
func (e *CannotStart) ExitCode() int { return 127 }

// Run starts c and waits for it: nil when it exits 0, else a ChildExit or a CannotStart.
func Run(c *exec.Cmd) error {
	if err := c.Start(); err != nil {
		return &CannotStart{Err: err}
	}
	err := c.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return err
	}
	code := ee.ExitCode()
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		code = 128 + int(ws.Signal())
	}
	return &ChildExit{Code: code}
}

// Quiet reports whether err needs no message: a command's own exit code passed on.
func Quiet(err error) bool {
	var ce *ChildExit
	return errors.As(err, &ce)
}
