package vnet

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flowplane/flowplane/internal/cli"
)

func runCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	return runCLIIn(t, "", args...)
}

func TestExecScript(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	src := filepath.Join(dir, "in.bin")
	dst := filepath.Join(dir, "out.bin")
	data := bytes.Repeat([]byte("vnet file transfer\n"), 100000)
	if err := os.WriteFile(src, data, 0o644); err != nil {
		t.Fatal(err)
	}
	pcap := filepath.Join(dir, "h1.pcapng")
	out, err := runCLI(t, "exec", "--config", "testdata/line.yaml",
		"-c", "h1 capture eth0 "+pcap,
		"-c", "h1 ping 198.18.2.2 2",
		"-c", "h1 traceroute 198.18.2.2",
		"-c", "h2 listen 7000",
		"-c", "h1 connect 198.18.2.2 7000",
		"-c", "h1 write 1 hello over tcp",
		"-c", "sleep 300ms",
		"-c", "h2 read 2 100",
		"-c", "h1 info 1",
		"-c", "h2 recvfile "+dst+" 7001",
		"-c", "h1 sendfile "+src+" 198.18.2.2 7001",
		"-c", "sleep 200ms",
		"-c", "h1 send 198.18.2.2 hi there",
		"-c", "sleep 100ms",
		"-c", "h2 texts",
		"-c", "h1 capture stop eth0",
		"-c", "r1 routes",
		"-c", "r1 stats",
		"-c", "h1 sockets")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"bytes from 198.18.2.2", " 3  198.18.2.2", "read 14 bytes: hello over tcp", "cwnd=",
		"from 198.18.0.1: hi there", "198.18.2.0/24", "capture on eth0 stopped"} {
		if !strings.Contains(out, want) {
			t.Fatalf("output lacks %q:\n%s", want, out)
		}
	}
	got, err := os.ReadFile(dst)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("recvfile: %d bytes, err %v", len(got), err)
	}
	checkPcap(t, pcap)
	if os.Getenv("VNET_KEEP_PCAP") != "" {
		data, _ := os.ReadFile(pcap)
		_ = os.WriteFile(os.Getenv("VNET_KEEP_PCAP"), data, 0o644)
	}
}

func TestCLIUsageErrors(t *testing.T) {
	t.Parallel()
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	_ = os.WriteFile(bad, []byte("name: bad\nnodes: {a: {}}\nlinks: [{endpoints: [a, zz]}]\n"), 0o644)
	for _, args := range [][]string{
		{"exec", "--config", bad, "-c", "help"},
		{"exec", "--config", "testdata/nonexistent.yaml"},
		{"exec", "--config", "testdata/line.yaml", "-c", "frobnicate"},
		{"exec", "--config", "testdata/line.yaml", "-c", "h1 ping not-an-address"},
		{"exec", "--config", "testdata/line.yaml", "--cc", "vegas", "-c", "help"},
		{"node", "--config", "testdata/line.yaml", "--name", "nosuch"},
		{"node", "--config", "testdata/line.yaml"},
		{"up"},
		{"exec", "--config", "testdata/line.yaml", "--no-such-flag"},
		{"exec", "--config", "testdata/line.yaml", "--tap", "nonsense", "-c", "help"},
		{"exec", "--config", "testdata/line.yaml", "--tap", "r1=fpnosuchns0", "-c", "help"},
		{"exec", "--config", "testdata/line.yaml", "--tap", "zz=fpnosuchns0", "-c", "help"},
	} {
		out, err := runCLI(t, args...)
		var ue *cli.UsageError
		if !errors.As(err, &ue) {
			t.Fatalf("%v: want a UsageError, got %v\n%s", args, err, out)
		}
	}
	_, err := runCLI(t, "exec", "--config", bad, "-c", "help")
	if !strings.Contains(err.Error(), "bad.yaml:3") || !strings.Contains(err.Error(), "unknown node") {
		t.Fatalf("topology error lacks file, line and reason: %v", err)
	}
}

// runCLIIn runs `flowplane vnet args...` under the binary's root (its flags and usage errors)
// with stdin.
func runCLIIn(t *testing.T, stdin string, args ...string) (string, error) {
	t.Helper()
	cmd := cli.Root("flowplane", "", Command())
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetIn(strings.NewReader(stdin))
	cmd.SetArgs(append([]string{"vnet"}, args...))
	err := cmd.Execute()
	return out.String(), err
}

func TestUpAndNodeShells(t *testing.T) {
	t.Parallel()
	out, err := runCLIIn(t, "converge\nh1 ping 198.18.2.2 1\nnode r1\nroutes\nbogus\nh9 ping 198.18.2.2\nquit\n", "up", "--config", "testdata/line.yaml", "--base-port", "-1")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"converged in", "bytes from 198.18.2.2", "198.18.2.0/24", `error: unknown command "bogus"`, `error: no node "h9"; nodes: `} {
		if !strings.Contains(out, want) {
			t.Fatalf("up output lacks %q:\n%s", want, out)
		}
	}
	out, err = runCLIIn(t, "interfaces\nstats\nquit\n", "node", "--config", "testdata/line.yaml", "--name", "r1", "--base-port", fmt.Sprint(40000+rand.IntN(5000)*4))
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !strings.Contains(out, "198.18.1.1/24") || !strings.Contains(out, "rip: requests=") {
		t.Fatalf("node output:\n%s", out)
	}
}
