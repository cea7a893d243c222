package lab

import (
	"context"
	"fmt"
	"os/exec"
	"syscall"

	"github.com/flowplane/flowplane/internal/nsrun"
)

// Command prepares a command to run on node: its namespace is entered when the command starts
// through Start, Run or Output, with the node's environment (Env).
func (l *Lab) Command(ctx context.Context, node string, name string, args ...string) (*NodeCmd, error) {
	n, err := l.Node(node)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = l.Env(n)
	return &NodeCmd{Cmd: cmd, netns: l.Netns(node)}, nil
}

// NodeCmd is an exec.Cmd bound to a node's namespace.
type NodeCmd struct {
	*exec.Cmd
	netns string
}

// Start starts the command in the node's namespace.
func (c *NodeCmd) Start() error { return nsrun.Start(c.netns, c.Cmd) }

// Run runs the command in the node's namespace and waits for it.
func (c *NodeCmd) Run() error { return nsrun.Run(c.netns, c.Cmd) }

// Output runs the command in the node's namespace and returns its standard output.
func (c *NodeCmd) Output() ([]byte, error) { return nsrun.Output(c.netns, c.Cmd) }

// CombinedOutput runs the command and returns standard output and error together.
func (c *NodeCmd) CombinedOutput() ([]byte, error) {
	var out []byte
	err := nsrun.Do(c.netns, func() error {
		var err error
		out, err = c.Cmd.CombinedOutput()
		return err
	})
	return out, err
}

// Exec replaces the current process with the command, in the node's namespace: its exit code
// and signals are the command's own. It returns only on failure.
func (l *Lab) Exec(node string, argv []string) error {
	n, err := l.Node(node)
	if err != nil {
		return err
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return fmt.Errorf("%s: %w", argv[0], err)
	}
	return nsrun.Do(l.Netns(node), func() error {
		return syscall.Exec(path, argv, l.Env(n))
	})
}
