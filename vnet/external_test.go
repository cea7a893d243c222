package vnet_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// program is a Go program of another module: what a user writes against docs/vnet.md's Go API.
const program = `package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/flowplane/flowplane/vnet"
)

func main() {
	t, err := vnet.LoadTopology(os.Args[1])
	if err != nil {
		panic(err)
	}
	nw, err := vnet.Start(t, vnet.Options{BasePort: -1})
	if err != nil {
		panic(err)
	}
	defer nw.Close()
	if err := nw.WaitConverged(30 * time.Second); err != nil {
		panic(err)
	}
	l, err := nw.Node("h2").Listen(":80")
	if err != nil {
		panic(err)
	}
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		io.Copy(c, c)
		c.Close()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := nw.Node("h1").Dial(ctx, "198.18.2.2:80")
	if err != nil {
		panic(err)
	}
	c.Write([]byte("hello over vnet"))
	c.CloseWrite()
	b, err := io.ReadAll(c)
	if err != nil {
		panic(err)
	}
	_, err = nw.Node("h1").Dial(ctx, "198.18.2.2:81")
	fmt.Printf("%s; refused: %v\n", b, errors.Is(err, vnet.ErrRefused))

	// Bad input is a *vnet.UsageError: a topology, a TCP configuration not whole, an unknown
	// congestion control.
	var ue *vnet.UsageError
	_, err = vnet.ParseTopology("bad.yaml", []byte("nodes: {h1: {}}\nlinks: [{endpoints: [h1, h9]}]\n"))
	fmt.Println("topology:", errors.As(err, &ue), err)
	_, err = vnet.Start(t, vnet.Options{BasePort: -1, TCP: vnet.TCPConfig{CC: "reno"}})
	fmt.Println("partial TCP:", errors.As(err, &ue), err)
	tcp := vnet.DefaultTCPConfig()
	tcp.CC = "bbr"
	_, err = vnet.Start(t, vnet.Options{BasePort: -1, TCP: tcp})
	fmt.Println("cc:", errors.As(err, &ue), err)
}
`

// TestImportableFromAnotherModule builds and runs program in a module of its own that requires
// this one (replaced by the checkout), offline, from the module cache: the package is not
// internal, and its names suffice for the documented use.
func TestImportableFromAnotherModule(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	gomod := "module example.com/user\n\ngo 1.26\n\nrequire github.com/flowplane/flowplane v0.0.0\n\nreplace github.com/flowplane/flowplane => " + root + "\n"
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"go.mod": []byte(gomod), "go.sum": sum, "main.go": []byte(program)} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("go", "run", ".", filepath.Join(root, "examples", "vnet-line.yaml"))
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOPROXY=off", "GOWORK=off")
	out, err := cmd.CombinedOutput()
	want := []string{
		"hello over vnet; refused: true",
		`topology: true bad.yaml:2: links[0].endpoints[1]: unknown node "h9"; nodes are: h1`,
		"partial TCP: true Options.TCP: SendBuf, RecvBuf, MinRTO, InitialRTO, MSL, SynRetries, MaxRetries, Backlog not set",
		`cc: true Options.TCP: unknown congestion control "bbr"; use reno or cubic`,
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if err != nil || len(lines) != len(want) {
		t.Fatalf("go run in another module: %v\n%s", err, out)
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w) {
			t.Errorf("line %d: %q, want %q…", i+1, lines[i], w)
		}
	}
}
