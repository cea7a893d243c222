package conntrack

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/flowplane/flowplane/internal/cli"
	"github.com/flowplane/flowplane/internal/netdev"
	"github.com/flowplane/flowplane/internal/nsrun"
)

// HookAuto chooses per interface: XDP where the interface can take part in XDP forwarding at
// full speed, tc elsewhere (docs/conntrack.md, "Choosing the hook").
const HookAuto = "auto"

// ifaceCheck is what run finds out about an interface before choosing its hook.
type ifaceCheck struct {
	Name  string
	Index int
	Kind  string // link type: veth, device, …

	FeaturesKnown bool // the kernel reported the device's XDP features
	NativeXDP     bool // the driver runs XDP itself (no generic fallback)
	Receive       bool // ndo_xdp_xmit: frames XDP redirects into it are sent, not dropped

	// veth only: the peer, and whether it leaves checksums to an offload (CHECKSUM_PARTIAL),
	// which XDP loses. PeerCsumKnown is false when the peer's namespace could not be found.
	Peer          string
	PeerCsumKnown bool
	PeerTxCsum    bool
}

// xdpProblem says why XDP cannot forward through c at full speed and what would change that;
// "" when it can.
func (c ifaceCheck) xdpProblem() string {
	switch {
	case !c.FeaturesKnown:
		return "the kernel does not report its XDP features (Linux ≥ 6.3 does)"
	case c.Kind == "veth" && !c.Receive:
		return fmt.Sprintf("frames XDP redirects into it would be dropped: its veth peer %s has neither GRO nor an XDP program "+
			"(`ethtool -K %s gro on` in the peer's namespace)", c.Peer, peerName(c.Peer))
	case !c.Receive:
		return "its driver cannot transmit XDP redirects (no ndo_xdp_xmit)"
	case c.Kind == "veth" && !c.PeerCsumKnown:
		return fmt.Sprintf("the offloads of its veth peer %s cannot be read (its network namespace is not in /run/netns "+
			"nor held by a process), so whether it sends complete checksums is unknown", c.Peer)
	case c.Kind == "veth" && c.PeerTxCsum:
		return fmt.Sprintf("its veth peer %s leaves TCP/UDP checksums to an offload, which a redirected frame loses "+
			"(`ethtool -K %s tx off` in the peer's namespace)", c.Peer, peerName(c.Peer))
	case !c.NativeXDP:
		return "its driver has no native XDP (generic XDP is slower than tc)"
	}
	return ""
}

// blocksXDP is true when c's problem makes an explicit --hook xdp lose traffic (so run refuses);
// the others (unknown features or peer offloads, generic XDP) only cost speed or are unknown.
func (c ifaceCheck) blocksXDP() bool {
	return c.FeaturesKnown && (!c.Receive || (c.Kind == "veth" && c.PeerCsumKnown && c.PeerTxCsum))
}

func peerName(p string) string { name, _, _ := strings.Cut(p, " "); return name }

// checkInterface reads ifc's XDP features and, for a veth, its peer's offloads. It runs in
// the namespace of ifc (the calling thread's).
func checkInterface(ifc *net.Interface) (ifaceCheck, error) {
	c := ifaceCheck{Name: ifc.Name, Index: ifc.Index}
	l, err := netlink.LinkByIndex(ifc.Index)
	if err != nil {
		return c, fmt.Errorf("interface %q: %w", ifc.Name, err)
	}
	c.Kind = l.Type()
	feat, err := netdev.ReadXDPFeatures(ifc.Index)
	switch {
	case err == nil:
		c.FeaturesKnown = true
		c.NativeXDP = feat.Native()
		c.Receive = feat.Redirect()
	case errors.Is(err, netdev.ErrNoFamily):
	default:
		return c, fmt.Errorf("interface %q: %w", ifc.Name, err)
	}
	if c.Kind != "veth" {
		return c, nil
	}
	peerIdx := l.Attrs().ParentIndex // IFLA_LINK: the peer's ifindex in its namespace
	nsid := l.Attrs().NetNsID        // IFLA_LINK_NETNSID: -1 when the peer is here
	c.Peer = fmt.Sprintf("ifindex %d", peerIdx)
	read := func() error {
		pl, err := netlink.LinkByIndex(peerIdx)
		if err != nil {
			return err
		}
		c.Peer = pl.Attrs().Name
		on, err := txCsum(pl.Attrs().Name)
		if err != nil {
			return err
		}
		c.PeerTxCsum, c.PeerCsumKnown = on, true
		return nil
	}
	if nsid < 0 {
		return c, read()
	}
	path, where := findNetns(nsid)
	if path == "" {
		return c, nil // unknown: decided safely by the caller
	}
	if err := nsrun.DoPath(path, read); err != nil {
		return c, fmt.Errorf("interface %q: read its veth peer in %s: %w", ifc.Name, path, err)
	}
	c.Peer += " (" + where + ")"
	return c, nil
}

// txCsum reports whether ifname computes any TCP/UDP checksum by offload (ETHTOOL_GTXCSUM,
// what `ethtool -k` shows as tx-checksumming).
func txCsum(ifname string) (bool, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return false, fmt.Errorf("ethtool socket: %w", err)
	}
	defer unix.Close(fd)
	v := struct{ cmd, data uint32 }{cmd: 0x16} // ETHTOOL_GTXCSUM
	var ifr struct {
		name [unix.IFNAMSIZ]byte
		data unsafe.Pointer
		_    [16]byte
	}
	copy(ifr.name[:unix.IFNAMSIZ-1], ifname)
	ifr.data = unsafe.Pointer(&v)
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr))); errno != 0 {
		return false, fmt.Errorf("read tx checksum offload of %s: %w", ifname, errno)
	}
	return v.data != 0, nil
}

// findNetns finds a file naming the network namespace whose id, as seen from here, is nsid:
// the named namespaces (/run/netns, as `ip netns` makes them), then those of running
// processes. "" when none is found (a namespace held only by an open file or a bind mount
// elsewhere).
func findNetns(nsid int) (path, where string) {
	seen := map[uint64]bool{}
	try := func(p string) bool {
		var st unix.Stat_t
		if unix.Stat(p, &st) != nil || seen[st.Ino] {
			return false
		}
		seen[st.Ino] = true
		fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return false
		}
		defer unix.Close(fd)
		id, err := netlink.GetNetNsIdByFd(fd)
		return err == nil && id == nsid
	}
	named, _ := filepath.Glob("/run/netns/*")
	for _, p := range named {
		if try(p) {
			return p, "netns " + filepath.Base(p)
		}
	}
	procs, _ := os.ReadDir("/proc")
	for _, d := range procs {
		if d.Name()[0] < '0' || d.Name()[0] > '9' {
			continue
		}
		p := "/proc/" + d.Name() + "/ns/net"
		if try(p) {
			return p, "network namespace of pid " + d.Name()
		}
	}
	return "", ""
}

// ct_hooks values: the hook in the low byte, the role (1 inside, 2 outside) in the next, the
// mode (1 firewall, 2 track; 0 from a version that did not record it) in the third.
const (
	hookCodeXDP = 1
	hookCodeTC  = 2
)

// recordHook notes in ct_hooks (a map of user space's own, pinned next to the tables while run
// attaches, removed when it detaches) which hook ifindex got, for `status`.
func (d *Datapath) recordHook(ifindex int, hook string, inside bool) error {
	if d.hooks == nil {
		m, err := ebpf.NewMap(&ebpf.MapSpec{Name: "ct_hooks", Type: ebpf.Hash, KeySize: 4, ValueSize: 4, MaxEntries: 64})
		if err != nil {
			return fmt.Errorf("create ct_hooks: %w", err)
		}
		d.hooks = m
		if d.dir != "" {
			p := filepath.Join(d.dir, "ct_hooks")
			_ = os.Remove(p)
			if err := m.Pin(p); err != nil {
				return fmt.Errorf("pin ct_hooks: %w", err)
			}
		}
	}
	v := uint32(hookCodeXDP)
	if hook == HookTC {
		v = hookCodeTC
	}
	if inside {
		v |= 1 << 8
	} else {
		v |= 2 << 8
	}
	if d.track {
		v |= 2 << 16
	} else {
		v |= 1 << 16
	}
	if err := d.hooks.Put(uint32(ifindex), v); err != nil {
		return fmt.Errorf("record hook of interface %d: %w", ifindex, err)
	}
	return nil
}

// IfaceHook is an attached interface as `status` shows it.
type IfaceHook struct {
	Interface string `json:"interface"`
	Index     int    `json:"ifindex"`
	Role      string `json:"role"`
	Hook      string `json:"hook"`
}

// AttachedHooks reads which hook each interface of the running instance got, and its mode
// (firewall or track; "" when not recorded); nil when no `run` is attached.
func AttachedHooks() (hooks []IfaceHook, mode string, err error) {
	dir, err := PinDir()
	if err != nil {
		return nil, "", err
	}
	m, err := ebpf.LoadPinnedMap(filepath.Join(dir, "ct_hooks"), &ebpf.LoadPinOptions{ReadOnly: true})
	if errors.Is(err, os.ErrNotExist) {
		return nil, "", nil
	}
	if err != nil {
		return nil, "", fmt.Errorf("open ct_hooks: %w", err)
	}
	defer m.Close()
	var out []IfaceHook
	var k, v uint32
	it := m.Iterate()
	for it.Next(&k, &v) {
		h := IfaceHook{Index: int(k), Hook: HookXDP, Role: "inside", Interface: fmt.Sprintf("ifindex %d", k)}
		if v&0xff == hookCodeTC {
			h.Hook = HookTC
		}
		if v>>8&0xff == 2 {
			h.Role = "outside"
		}
		switch v >> 16 & 0xff {
		case 1:
			mode = "firewall"
		case 2:
			mode = "track"
		}
		if ifc, err := net.InterfaceByIndex(int(k)); err == nil {
			h.Interface = ifc.Name
		}
		out = append(out, h)
	}
	if err := it.Err(); err != nil {
		return nil, "", fmt.Errorf("read ct_hooks: %w", err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Index < out[j].Index })
	return out, mode, nil
}

// ifacePlan is the hook chosen for one interface, and why when it is not the one asked for.
type ifacePlan struct {
	ifc    *net.Interface
	inside bool
	hook   string
	why    string
}

type hookPlan []ifacePlan

// build is the hook Load needs: one build, or auto for both.
func (p hookPlan) build() string {
	var x, t bool
	for _, i := range p {
		x = x || i.hook == HookXDP
		t = t || i.hook == HookTC
	}
	switch {
	case x && t:
		return HookAuto
	case t:
		return HookTC
	}
	return HookXDP
}

func (p hookPlan) String() string {
	var b strings.Builder
	for i, x := range p {
		if i > 0 {
			b.WriteString(" ")
		}
		b.WriteString(x.ifc.Name + "=" + x.hook)
	}
	return b.String()
}

// planHooks chooses each interface's hook before anything is loaded. tc: every interface.
// auto: XDP where XDP can forward at full speed through the interface (it can receive
// redirects, its driver runs XDP natively and, on veth, the peer writes complete checksums),
// tc elsewhere. xdp: XDP everywhere, refused (usage error, nothing attached) where XDP would
// lose what it forwards — the message says what to change.
func planHooks(hook string, inside, outside []*net.Interface) (hookPlan, error) {
	var plan hookPlan
	var refused []string
	for _, x := range []struct {
		ifs    []*net.Interface
		inside bool
	}{{inside, true}, {outside, false}} {
		for _, ifc := range x.ifs {
			p := ifacePlan{ifc: ifc, inside: x.inside, hook: hook}
			if hook == HookTC {
				plan = append(plan, p)
				continue
			}
			c, err := checkInterface(ifc)
			if err != nil {
				if hook == HookXDP {
					return nil, err
				}
				slog.Warn("cannot tell whether XDP can forward through this interface; using tc", "interface", ifc.Name, "err", err)
				p.hook, p.why = HookTC, err.Error()
				plan = append(plan, p)
				continue
			}
			problem := c.xdpProblem()
			switch {
			case hook == HookAuto && problem == "":
				p.hook = HookXDP
			case hook == HookAuto:
				p.hook, p.why = HookTC, "XDP would not forward through it at full speed: "+problem
			case c.blocksXDP():
				refused = append(refused, fmt.Sprintf("interface %q: %s", ifc.Name, problem))
			case problem != "":
				slog.Warn("--hook xdp on an interface XDP may not suit", "interface", ifc.Name, "problem", problem)
			}
			plan = append(plan, p)
		}
	}
	if len(refused) > 0 {
		return nil, cli.Usagef("--hook xdp would lose traffic: %s; change that, or use --hook auto (the default: tc where XDP cannot forward) or --hook tc",
			strings.Join(refused, "; "))
	}
	return plan, nil
}
