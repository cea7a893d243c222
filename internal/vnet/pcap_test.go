package vnet

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/flowplane/flowplane/internal/testenv"
)

// checkPcap has tshark read the capture and verify every checksum.
func checkPcap(t *testing.T, path string) {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil || st.Size() < 100 {
		t.Fatalf("capture %s missing or empty: %v", path, err)
	}
	testenv.Need(t, "tshark")
	out, err := exec.Command("tshark", "-r", path, "-o", "ip.check_checksum:TRUE", "-o", "tcp.check_checksum:TRUE",
		"-T", "fields", "-e", "ip.checksum.status", "-e", "tcp.checksum.status", "-e", "icmp.checksum_bad").Output()
	if err != nil {
		t.Fatalf("tshark cannot read the capture: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	tcp := 0
	for _, l := range lines {
		f := strings.Split(l, "\t")
		// Status 1 is "good"; ICMP errors quote a second IP header, hence lists.
		if len(f) > 0 && strings.Trim(f[0], "1,") != "" {
			t.Fatalf("IP checksum not verified good: %q", l)
		}
		if len(f) > 1 && f[1] != "" {
			tcp++
			if strings.Trim(f[1], "1,") != "" {
				t.Fatalf("TCP checksum not verified good: %q", l)
			}
		}
	}
	if tcp == 0 {
		t.Fatalf("no TCP packets in capture (%d packets)", len(lines))
	}
}
