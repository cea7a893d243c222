package tune

import (
	"bufio"
	"context"
	"math"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flowplane/flowplane/internal/cgroup"
	"github.com/flowplane/flowplane/internal/lab"
	"github.com/flowplane/flowplane/internal/lab/labtest"
	"github.com/flowplane/flowplane/internal/testenv"
)

// The SYN RTO tests drop handshake packets with nftables at the receiving lab node and time
// the retransmissions from tcpdump's packet timestamps on the sending node's egress (`-Q out`):
// the first retransmission must follow the original within one jiffy of the configured RTO
// (rounded up to jiffies, CONFIG_HZ from the kernel config). This is a measurement against the
// configured value, not a timing assumption about the machine. Egress timestamps are taken as
// the sender transmits, so the receiving path's delays do not enter the gap; the timer wheel
// fires a timer of N jiffies between N and N+1 ticks after it is armed (next to the first
// transmission), and everything else on the path (softirq latency, scheduling on a busy host)
// only lengthens a gap. So a gap is never shorter than the RTO, and the shortest gap is the
// measurement compared: at least five handshakes, more (up to maxHandshakes) while load has
// lengthened every gap so far; every gap is logged.

const synRTOPolicy = `
profiles:
  fast-syn: {syn_rto: 100ms}
  fast-synack: {syn_rto: 60ms}
rules:
  - {match: {remote_port: 5601, direction: active}, profile: fast-syn}
  - {match: {local_port: 5602, direction: passive}, profile: fast-synack}
`

const (
	minHandshakes = 5
	maxHandshakes = 20
)

// captureGaps runs tcpdump on node's egress for filter and returns, for handshakes started by
// start, the gap between the first two matching packets of one source port: at least
// minHandshakes, and more until done(gaps) or maxHandshakes.
func captureGaps(t *testing.T, l *lab.Lab, node, filter string, start func(i int), done func([]time.Duration) bool) []time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd, err := l.Command(ctx, node, "tcpdump", "-i", lab.IfName(l.Name(), "eth0"), "-Q", "out", "-n", "-l", "-tt", "--immediate-mode", "-s", "96", filter)
	if err != nil {
		t.Fatal(err)
	}
	out, _ := cmd.StdoutPipe()
	errp, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatalf("tcpdump: %v", err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	// tcpdump says "listening on" once the capture runs.
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(errp)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "listening on") {
				close(ready)
				break
			}
		}
		for sc.Scan() {
		}
	}()
	select {
	case <-ready:
	case <-time.After(10 * time.Second):
		t.Fatal("tcpdump did not start")
	}
	seen := map[string][]float64{}
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var gaps []time.Duration
	for i := 0; i < maxHandshakes && (i < minHandshakes || !done(gaps)); i++ {
		start(i)
		deadline := time.After(5 * time.Second)
	wait:
		for {
			select {
			case line, ok := <-lines:
				if !ok {
					t.Fatal("tcpdump ended")
				}
				// 1763800000.123456 IP 198.18.0.1.40000 > 198.18.1.2.5601: Flags [S], ...
				f := strings.Fields(line)
				if len(f) < 5 {
					continue
				}
				ts, err := strconv.ParseFloat(f[0], 64)
				if err != nil {
					continue
				}
				key := f[2] + ">" + f[4]
				seen[key] = append(seen[key], ts)
				if len(seen[key]) == 2 {
					g := time.Duration((seen[key][1] - seen[key][0]) * 1e9)
					gaps = append(gaps, g)
					t.Logf("handshake %d %s: retransmission after %v", i, key, g.Round(10*time.Microsecond))
					break wait
				}
			case <-deadline:
				t.Fatalf("handshake %d: no retransmission captured within 5s", i)
			}
		}
	}
	return gaps
}

func shortest(ds []time.Duration) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[0]
}

func nft(t *testing.T, l *lab.Lab, node, rule string) {
	t.Helper()
	labtest.Run(t, l, node, "nft", "add table inet fptune")
	labtest.Run(t, l, node, "nft", "add chain inet fptune in { type filter hook input priority 0 ; }")
	labtest.Run(t, l, node, "nft", "add rule inet fptune in "+rule)
}

func runConnect(t *testing.T, l *lab.Lab, node, cg, addr string) {
	t.Helper()
	cmd, err := l.Command(context.Background(), node, os.Args[0], addr)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Env = append(cmd.Env, helperEnv+"=connect")
	fd, err := cgroup.Into(cmd.Cmd, cg)
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	fd.Close()
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
}

// withinJiffy reports whether the shortest gap is within one jiffy of want rounded up to jiffies.
func withinJiffy(gaps []time.Duration, want time.Duration, k Kernel) bool {
	exact := time.Duration(k.Jiffies(want)) * k.Jiffy()
	return len(gaps) > 0 && math.Abs(float64(shortest(gaps)-exact)) <= float64(k.Jiffy())
}

func checkRTO(t *testing.T, what string, gaps []time.Duration, want time.Duration, k Kernel) {
	t.Helper()
	j := k.Jiffies(want)
	exact := time.Duration(j) * k.Jiffy()
	m := shortest(gaps)
	if !withinJiffy(gaps, want, k) {
		t.Errorf("%s: shortest retransmission gap %v (gaps %v), want %v = %d jiffies ± 1 jiffy (%v)", what, m, gaps, exact, j, k.Jiffy())
	}
}

// synRTOLab brings up the lab and applies synRTOPolicy; it returns the lab, the tuned cgroup,
// the kernel and h2's address.
func synRTOLab(t *testing.T) (*lab.Lab, string, Kernel, string) {
	t.Helper()
	l := labtest.Up(t, labtest.HostRouterHost)
	testenv.Need(t, "tcpdump", "nft")
	cg := testCgroup(t)
	applyTest(t, synRTOPolicy, cg)
	k, err := HostKernel()
	if err != nil {
		t.Fatal(err)
	}
	return l, cg, k, labtest.Addr(t, l, "h2", "4")
}

func TestLabSynRTO(t *testing.T) {
	l, cg, k, h2 := synRTOLab(t)
	// Active: h2 drops SYNs to 5601; h1 sends and retransmits them.
	nft(t, l, "h2", "tcp dport 5601 tcp flags syn drop")
	gaps := captureGaps(t, l, "h1", "tcp dst port 5601 and tcp[tcpflags] & tcp-syn != 0", func(int) {
		runConnect(t, l, "h1", cg, net.JoinHostPort(h2, "5601"))
	}, func(g []time.Duration) bool { return withinJiffy(g, 100*time.Millisecond, k) })
	checkRTO(t, "SYN (active, syn_rto 100ms)", gaps, 100*time.Millisecond, k)
}

func TestLabSynAckRTO(t *testing.T) {
	l, cg, k, h2 := synRTOLab(t)
	startHelper(t, l, "h2", cg, "hold-server", ":5602")
	// Passive: h1 drops the SYN-ACKs from 5602 (its own SYN retransmits only after 1s); h2
	// sends and retransmits them.
	nft(t, l, "h1", "tcp sport 5602 tcp flags syn drop")
	gaps := captureGaps(t, l, "h2", "tcp src port 5602 and tcp[tcpflags] & tcp-syn != 0", func(int) {
		runConnect(t, l, "h1", cg, net.JoinHostPort(h2, "5602"))
	}, func(g []time.Duration) bool { return withinJiffy(g, 60*time.Millisecond, k) })
	checkRTO(t, "SYN-ACK (passive, syn_rto 60ms)", gaps, 60*time.Millisecond, k)
}
