package attach

import (
	"fmt"
	"log/slog"
	"net"
	"os"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

type hookKind int

const (
	tcxIngress hookKind = iota + 1
	tcxEgress
	sockOps
	xdp
)

// A Hook is where a program attaches: a device's tcx ingress or egress, a cgroup v2's sock_ops,
// or a device's XDP.
type Hook struct {
	kind    hookKind
	ifindex int
	cgroup  string
	head    bool
}

// TCXIngress is ifindex's tcx ingress, after the programs already there.
func TCXIngress(ifindex int) Hook { return Hook{kind: tcxIngress, ifindex: ifindex} }

// TCXEgress is ifindex's tcx egress, after the programs already there.
func TCXEgress(ifindex int) Hook { return Hook{kind: tcxEgress, ifindex: ifindex} }

// SockOps is the sock_ops hook of the cgroup v2 at path (beside other programs: multi-attach).
func SockOps(path string) Hook { return Hook{kind: sockOps, cgroup: path} }

// XDP is ifindex's XDP hook: driver mode, generic mode where the driver has none.
func XDP(ifindex int) Hook { return Hook{kind: xdp, ifindex: ifindex} }

// AtHead puts a tcx hook before the programs already attached there.
func (h Hook) AtHead() Hook { h.head = true; return h }

func (h Hook) String() string {
	switch h.kind {
	case tcxIngress:
		return fmt.Sprintf("tcx ingress of %s", ifname(h.ifindex))
	case tcxEgress:
		return fmt.Sprintf("tcx egress of %s", ifname(h.ifindex))
	case sockOps:
		return "sock_ops of " + h.cgroup
	case xdp:
		return "XDP of " + ifname(h.ifindex)
	}
	return "no hook"
}

func ifname(ifindex int) string {
	if ifc, err := net.InterfaceByIndex(ifindex); err == nil {
		return ifc.Name
	}
	return fmt.Sprintf("ifindex %d", ifindex)
}

// Attach attaches prog at h and returns its link, not pinned: closing it detaches.
func Attach(h Hook, prog *ebpf.Program) (link.Link, error) {
	var l link.Link
	var err error
	switch h.kind {
	case tcxIngress, tcxEgress:
		at := ebpf.AttachTCXIngress
		if h.kind == tcxEgress {
			at = ebpf.AttachTCXEgress
		}
		opts := link.TCXOptions{Interface: h.ifindex, Program: prog, Attach: at}
		if h.head {
			opts.Anchor = link.Head()
		}
		l, err = link.AttachTCX(opts)
	case sockOps:
		l, err = link.AttachCgroup(link.CgroupOptions{Path: h.cgroup, Attach: ebpf.AttachCGroupSockOps, Program: prog})
	case xdp:
		l, err = link.AttachXDP(link.XDPOptions{Program: prog, Interface: h.ifindex, Flags: link.XDPDriverMode})
		if err != nil {
			slog.Warn("native XDP failed; using generic mode", "interface", ifname(h.ifindex), "err", err)
			l, err = link.AttachXDP(link.XDPOptions{Program: prog, Interface: h.ifindex, Flags: link.XDPGenericMode})
		}
	default:
		return nil, fmt.Errorf("attach: no hook given")
	}
	if err != nil {
		return nil, fmt.Errorf("attach to the %s: %w", h, err)
	}
	return l, nil
}

// target identifies what h attaches to as link info reports it: the ifindex, or the cgroup's id
// (its inode on cgroup2).
func (h Hook) target() (uint64, error) {
	if h.kind != sockOps {
		return uint64(h.ifindex), nil
	}
	var st unix.Stat_t
	if err := unix.Stat(h.cgroup, &st); err != nil {
		return 0, fmt.Errorf("cgroup %s: %w", h.cgroup, os.ErrNotExist)
	}
	return st.Ino, nil
}

// linkTarget is what an attached link holds on to, and whether it holds on to anything: a link
// whose device went away or whose cgroup was removed is defunct (target 0).
func linkTarget(info *link.Info) (uint64, bool) {
	var t uint64
	switch {
	case info.TCX() != nil:
		t = uint64(info.TCX().Ifindex)
	case info.XDP() != nil:
		t = uint64(info.XDP().Ifindex)
	case info.Cgroup() != nil:
		t = info.Cgroup().CgroupId
	default:
		return 0, false
	}
	return t, t != 0
}
