package lab

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/flowplane/flowplane/internal/nsrun"
	"github.com/flowplane/flowplane/internal/runstate"
	"github.com/flowplane/flowplane/internal/topo"
)

// An impaired link (topo.Link.Impaired: delay, jitter, reorder, duplicate, corrupt or gemodel
// loss) is built as A — veth — [relay namespace] — veth — B. The relay namespace
// "fp-<lab>-_link<N>" holds the two inner ends, fpa (A's side) and fpb, and a relay process
// (relayrun.go) that moves frames between them through the impairment engine, per direction,
// under a supervisor that starts it again if it dies (relaysup.go). `lab down` finds the
// namespace as the lab's, kills the supervisor and the relay with the nodes' processes and
// deletes it, and removes the relay directory (counters, supervisor states and logs).

const relayIfA, relayIfB = "fpa", "fpb"

// relayNetns is the namespace of an impaired link's relay; "_" cannot start a node name.
func (l *Lab) relayNetns(link *topo.Link) string { return l.Netns("_link" + strconv.Itoa(link.Index)) }

// relayRunDir holds the relays' counters files and logs.
func relayRunDir(lab string) string { return filepath.Join(runstate.Root, subsystem, lab+".relay") }

func (l *Lab) relayFile(link *topo.Link, ext string) string {
	return filepath.Join(relayRunDir(l.Name()), fmt.Sprintf("link%d.%s", link.Index, ext))
}

// addRelayedLink makes the relay namespace and the two veth pairs of an impaired link.
func (l *Lab) addRelayedLink(link *topo.Link) error {
	rns := l.relayNetns(link)
	if err := nsrun.Create(rns); err != nil {
		return err
	}
	// The relay namespace sends nothing of its own (no IPv6 router or listener reports).
	if err := nsrun.Do(rns, func() error {
		for _, k := range []string{"all", "default"} {
			if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+k+"/disable_ipv6", []byte("1"), 0o644); err != nil {
				return fmt.Errorf("sysctl disable_ipv6: %w", err)
			}
		}
		return nil
	}); err != nil {
		return err
	}
	hR, err := netns.GetFromPath(nsrun.Path(rns))
	if err != nil {
		return err
	}
	defer hR.Close()
	for _, e := range []struct {
		end   *topo.Iface
		inner string
	}{{link.A, relayIfA}, {link.B, relayIfB}} {
		h, err := netns.GetFromPath(nsrun.Path(l.Netns(e.end.Node.Name)))
		if err != nil {
			return err
		}
		veth := &netlink.Veth{
			LinkAttrs: netlink.LinkAttrs{Name: l.IfName(e.end), MTU: link.MTU, Namespace: netlink.NsFd(h)},
			PeerName:  e.inner, PeerMTU: uint32(link.MTU), PeerNamespace: netlink.NsFd(hR),
		}
		err = netlink.LinkAdd(veth)
		h.Close()
		if err != nil {
			return fmt.Errorf("add veth %s/%s: %w", veth.Name, veth.PeerName, err)
		}
	}
	return nsrun.Do(rns, func() error {
		for _, name := range []string{relayIfA, relayIfB} {
			dev, err := netlink.LinkByName(name)
			if err != nil {
				return err
			}
			// The relay writes whole frames: nothing is left for an offload to finish.
			if err := ethtoolSet(name, ethtoolValue{ethtoolSetTxCsum, 0}); err != nil {
				return err
			}
			if err := netlink.LinkSetUp(dev); err != nil {
				return fmt.Errorf("bring up %s: %w", name, err)
			}
		}
		return nil
	})
}

// startRelay runs the link's relay supervisor in its namespace, detached (it outlives lab up),
// and waits until its relay is receiving. Started again (Repair), it goes on with the files the
// last one left: counters, restarts, log.
func (l *Lab) startRelay(link *topo.Link) error {
	if err := os.MkdirAll(relayRunDir(l.Name()), 0o755); err != nil {
		return err
	}
	cfg := relayConfig{Stats: l.relayFile(link, "stats"), Supervisor: l.relayFile(link, "supervisor"), MTU: link.MTU, Dirs: [2]relayDirConfig{
		{In: relayIfA, Out: relayIfB, Params: link.A.Params(0)},
		{In: relayIfB, Out: relayIfA, Params: link.B.Params(0)},
	}}
	for i := range cfg.Dirs {
		cfg.Dirs[i].Params.Rate = 0 // the sender's HTB shapes the rate
	}
	data, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own executable for the relay: %w", err)
	}
	logf, err := os.OpenFile(l.relayFile(link, "log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(self)
	cmd.Args = []string{"flowplane-lab-relay-supervisor"}
	cmd.Env = append(os.Environ(), relayEnv+"="+string(data))
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := nsrun.Start(l.relayNetns(link), cmd); err != nil {
		return fmt.Errorf("start relay: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }() // reaps it if it dies while this process lives
	for deadline := time.Now().Add(relayStartTimeout + time.Second); ; time.Sleep(10 * time.Millisecond) {
		if sup, err := readSupervisor(cfg.Supervisor); err == nil && sup.PID == cmd.Process.Pid && sup.State == relayRunning {
			return nil
		}
		select {
		case err := <-exited:
			msg, _ := os.ReadFile(l.relayFile(link, "log"))
			return fmt.Errorf("relay exited (%v): %s", err, msg)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("relay did not start within %v", relayStartTimeout+time.Second)
		}
	}
}

// RelayStatus is an impaired link's relay: its process, its supervisor's state and its counters
// per direction (counted since lab up, across restarts).
type RelayStatus struct {
	Netns         string        `json:"netns"`
	PID           int           `json:"pid"`
	Alive         bool          `json:"alive"`
	SupervisorPID int           `json:"supervisor_pid"`
	State         string        `json:"state"` // starting, running, restarting, failed, or dead: the supervisor is gone
	Restarts      int           `json:"restarts"`
	LastExit      string        `json:"last_exit,omitempty"` // how the last relay that died ended
	Log           string        `json:"log"`
	AToB          RelayCounters `json:"a_to_b"`
	BToA          RelayCounters `json:"b_to_a"`
}

// readRelay reads a relay's counters file.
func readRelay(path string) (*RelayStatus, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if len(data) < relayHeader || binary.LittleEndian.Uint64(data) != relayMagic {
		return nil, fmt.Errorf("%s: relay not ready", path)
	}
	st := &RelayStatus{PID: int(binary.LittleEndian.Uint64(data[8:]))}
	for i, dst := range []*RelayCounters{&st.AToB, &st.BToA} {
		off := relayHeader + i*relayCountersSize
		if len(data) >= off+relayCountersSize {
			if _, err := binary.Decode(data[off:], binary.LittleEndian, dst); err != nil {
				return nil, err
			}
		}
	}
	st.Alive = alive(st.PID)
	return st, nil
}

// Relay returns the status of an impaired link's relay.
func (l *Lab) Relay(link *topo.Link) (*RelayStatus, error) {
	sup, err := readSupervisor(l.relayFile(link, "supervisor"))
	if err != nil {
		return nil, fmt.Errorf("relay of link %d: %w", link.Index, err)
	}
	st, err := readRelay(l.relayFile(link, "stats"))
	if err != nil {
		st = &RelayStatus{} // its first relay has not written its counters yet
	}
	st.Netns, st.Log = l.relayNetns(link), l.relayFile(link, "log")
	st.SupervisorPID, st.State, st.Restarts, st.LastExit = sup.PID, sup.State, sup.Restarts, sup.LastExit
	if sup.State != relayFailed && !alive(sup.PID) {
		st.State = relayDead
	}
	return st, nil
}

// alive says whether process pid runs: exists and has not exited (a zombie waits for its parent
// to reap it, which for a process whose parent died may be a while).
func alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(data, ')')
	return i >= 0 && i+2 < len(data) && data[i+2] != 'Z' && data[i+2] != 'X'
}
