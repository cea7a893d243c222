// Package hostcheck is `flowplane check`: it probes what this host's kernel and privileges
// allow, as `bpftool feature probe` does for BPF, then says per subsystem whether it works here.
// Every probe does the thing it reports on (loads a program, attaches a link, creates a qdisc)
// in a scratch network namespace of its own, never on the host's interfaces, so the answer is
// what the kernel does rather than what its version suggests.
package hostcheck

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/flowplane/flowplane/internal/cgroup"
	"github.com/flowplane/flowplane/internal/netdev"
	"github.com/flowplane/flowplane/internal/pin"
)

// Feature is one probed ability of the host.
type Feature struct {
	Name   string `json:"name"`
	Have   bool   `json:"have"`
	Detail string `json:"detail,omitempty"`
}

// found is what the probes found, in order and by name.
type found struct {
	list []Feature
	by   map[string]Feature
}

func (f *found) add(name string, have bool, detail string, args ...any) {
	ft := Feature{Name: name, Have: have, Detail: fmt.Sprintf(detail, args...)}
	f.list = append(f.list, ft)
	f.by[name] = ft
}

// have reports whether the named feature was found (false when it was not probed).
func (f *found) have(name string) bool { return f.by[name].Have }

// The qdiscs flowplane uses or a user may look for; each is created in the scratch namespace.
var qdiscs = []string{"htb", "tbf", "pfifo", "bfifo", "pfifo_fast", "clsact", "sfq", "fq", "fq_codel", "prio", "drr", "netem", "cake"}

// Capability bits of /proc/self/status CapEff (linux/capability.h).
const (
	capNetAdmin = 12
	capSysAdmin = 21
	capPerfmon  = 38
	capBPF      = 39
)

// probe runs every probe.
func probe() *found {
	f := &found{by: map[string]Feature{}}
	var uts unix.Utsname
	_ = unix.Uname(&uts)
	release := unix.ByteSliceToString(uts.Release[:])
	major, minor := kernelVersion(release)
	f.add("kernel", major > 6 || major == 6 && minor >= 1, "%s (flowplane needs 6.1 or newer)", release)
	f.add("kernel>=6.9", major > 6 || major == 6 && minor >= 9, "%s: may_goto loops (tune's rule scan) need 6.9", release)

	caps := effectiveCaps()
	f.add("root", os.Geteuid() == 0, "effective uid %d", os.Geteuid())
	for _, c := range []struct {
		name string
		bit  uint
	}{{"cap_bpf", capBPF}, {"cap_net_admin", capNetAdmin}, {"cap_sys_admin", capSysAdmin}, {"cap_perfmon", capPerfmon}} {
		f.add(c.name, caps&(1<<c.bit) != 0, "effective capability")
	}

	_, err := os.Stat("/sys/kernel/btf/vmlinux")
	f.add("btf", err == nil, "/sys/kernel/btf/vmlinux%s", errText(err))
	// Where pins go, as internal/pin decides: under `ip netns exec` the shared bpffs is an
	// ancestor's, not this process's /sys/fs/bpf.
	var sf unix.Statfs_t
	where, shared := pin.Shared()
	why, fix := pin.Private()
	switch {
	case shared && where == "/sys/fs/bpf":
		f.add("bpffs", true, "mounted on /sys/fs/bpf, where pins go")
	case shared:
		f.add("bpffs", true, "/sys/fs/bpf here is not the shared bpffs (ip netns exec remounts /sys): pins go to %s", where)
	case unix.Statfs("/sys/fs/bpf", &sf) == nil && sf.Type == unix.BPF_FS_MAGIC:
		f.add("bpffs", true, "mounted on /sys/fs/bpf")
	case !f.have("cap_sys_admin"):
		f.add("bpffs", false, "not mounted, and mounting it needs CAP_SYS_ADMIN")
	case why != "":
		f.add("bpffs", true, "none within reach, so a command run like this one mounts its own, whose pins "+
			"commands started elsewhere may not see: %s; %s", why, fix)
	default:
		f.add("bpffs", true, "not mounted; flowplane mounts it on /sys/fs/bpf when it first pins")
	}
	mp, err := cgroup.Mount()
	f.add("cgroup2", err == nil, "%s%s", mp, errText(err))

	for _, p := range []struct {
		name string
		typ  ebpf.ProgramType
	}{{"prog:xdp", ebpf.XDP}, {"prog:sched_cls", ebpf.SchedCLS}, {"prog:sock_ops", ebpf.SockOps}} {
		err := features.HaveProgramType(p.typ)
		f.add(p.name, err == nil, "BPF program type %s%s", p.typ, bpfErr(err))
	}
	for _, h := range []struct {
		name string
		typ  ebpf.ProgramType
		fn   asm.BuiltinFunc
	}{
		{"helper:ktime_get_tai_ns", ebpf.SchedCLS, asm.FnKtimeGetTaiNs},
		{"helper:fib_lookup", ebpf.XDP, asm.FnFibLookup},
		{"helper:redirect_map", ebpf.XDP, asm.FnRedirectMap},
		{"helper:setsockopt", ebpf.SockOps, asm.FnSetsockopt},
		{"helper:store_hdr_opt", ebpf.SockOps, asm.FnStoreHdrOpt},
	} {
		err := features.HaveProgramHelper(h.typ, h.fn)
		f.add(h.name, err == nil, "bpf_%s in %s programs%s", strings.TrimPrefix(h.name, "helper:"), h.typ, bpfErr(err))
	}
	for _, m := range []struct {
		name string
		typ  ebpf.MapType
	}{{"map:lru_hash", ebpf.LRUHash}, {"map:devmap_hash", ebpf.DevMapHash}, {"map:percpu_array", ebpf.PerCPUArray}} {
		err := features.HaveMapType(m.typ)
		f.add(m.name, err == nil, "BPF map type %s%s", m.typ, bpfErr(err))
	}

	tun, err := os.OpenFile("/dev/net/tun", os.O_RDWR, 0)
	if err == nil {
		tun.Close()
	}
	f.add("tun", err == nil, "/dev/net/tun%s", errText(err))

	xdpOnKinds(f)
	scratch(f)
	return f
}

// scratch probes what needs a network device: veth, tcx, XDP on veth, the qdiscs; in a new
// network namespace that goes away with this function (nothing of the host's is touched).
func scratch(f *found) {
	names := append([]string{"veth", "tcx", "xdp:veth"}, qdiscNames()...)
	fail := func(why string) {
		for _, n := range names {
			f.add(n, false, "not probed: %s", why)
		}
	}
	if !f.have("cap_sys_admin") {
		fail("a scratch network namespace needs CAP_SYS_ADMIN")
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		// The thread enters the new namespace and is never returned to the Go scheduler: it
		// exits with the goroutine, and the namespace with it.
		runtime.LockOSThread()
		ns, err := netns.New()
		if err != nil {
			fail("create a scratch network namespace: " + err.Error())
			return
		}
		defer ns.Close()
		scratchIn(f)
	}()
	<-done
}

func qdiscNames() []string {
	out := make([]string, len(qdiscs))
	for i, q := range qdiscs {
		out[i] = "qdisc:" + q
	}
	return out
}

// scratchIn runs in the scratch namespace.
func scratchIn(f *found) {
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "fpcheck0"}, PeerName: "fpcheck1"}
	err := netlink.LinkAdd(veth)
	f.add("veth", err == nil, "veth pairs%s", errText(err))
	if err != nil {
		for _, n := range append([]string{"tcx", "xdp:veth"}, qdiscNames()...) {
			f.add(n, false, "not probed: no veth pair")
		}
		return
	}
	dev, err := netlink.LinkByName("fpcheck0")
	if err == nil {
		err = netlink.LinkSetUp(dev)
	}
	if peer, perr := netlink.LinkByName("fpcheck1"); perr == nil {
		_ = netlink.LinkSetUp(peer)
	}
	if err != nil {
		f.add("tcx", false, "not probed: %v", err)
		f.add("xdp:veth", false, "not probed: %v", err)
		return
	}
	idx := dev.Attrs().Index

	prog := func(typ ebpf.ProgramType, ret int32) (*ebpf.Program, error) {
		return ebpf.NewProgram(&ebpf.ProgramSpec{Type: typ, License: "GPL",
			Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, ret), asm.Return()}})
	}
	if p, err := prog(ebpf.SchedCLS, -1 /* TCX_NEXT */); err != nil {
		f.add("tcx", false, "not probed: load a tc program%s", bpfErr(err))
	} else {
		l, err := link.AttachTCX(link.TCXOptions{Interface: idx, Program: p, Attach: ebpf.AttachTCXIngress})
		f.add("tcx", err == nil, "tc BPF links (tcx)%s", bpfErr(err))
		if err == nil {
			l.Close()
		}
		p.Close()
	}
	if p, err := prog(ebpf.XDP, 2 /* XDP_PASS */); err != nil {
		f.add("xdp:veth", false, "not probed: load an XDP program%s", bpfErr(err))
	} else {
		l, err := link.AttachXDP(link.XDPOptions{Interface: idx, Program: p, Flags: link.XDPDriverMode})
		f.add("xdp:veth", err == nil, "native (driver) XDP on veth%s", bpfErr(err))
		if err == nil {
			l.Close()
		}
		p.Close()
	}

	for _, kind := range qdiscs {
		attrs := netlink.QdiscAttrs{LinkIndex: idx, Handle: netlink.MakeHandle(1, 0), Parent: netlink.HANDLE_ROOT}
		if kind == "clsact" {
			attrs = netlink.QdiscAttrs{LinkIndex: idx, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}
		}
		var q netlink.Qdisc = &netlink.GenericQdisc{QdiscAttrs: attrs, QdiscType: kind}
		switch kind { // the two that need options to be created
		case "htb":
			q = netlink.NewHtb(attrs)
		case "tbf":
			q = &netlink.Tbf{QdiscAttrs: attrs, Rate: 1 << 20, Limit: 1 << 16, Buffer: 1 << 16}
		}
		err := netlink.QdiscReplace(q)
		switch {
		case err == nil:
			f.add("qdisc:"+kind, true, "created")
			_ = netlink.QdiscDel(q)
		case errors.Is(err, unix.ENOENT):
			f.add("qdisc:"+kind, false, "the kernel has no %s qdisc (not built, and no module to load)", kind)
		default:
			// Known to the kernel (it looked at the request) but refused without options.
			f.add("qdisc:"+kind, true, "known to the kernel (refused without options: %v)", err)
		}
	}
}

// xdpOnKinds reports, for one interface of each kind in the calling thread's namespace, what
// its driver supports; read from the kernel, nothing attached.
func xdpOnKinds(f *found) {
	links, err := netlink.LinkList()
	if err != nil {
		return
	}
	seen := map[string]bool{}
	for _, l := range links {
		kind := l.Type()
		if l.Attrs().Name == "lo" || seen[kind] {
			continue
		}
		seen[kind] = true
		feat, err := netdev.ReadXDPFeatures(l.Attrs().Index)
		switch {
		case errors.Is(err, netdev.ErrNoFamily):
			f.add("xdp-here:"+kind, false, "%s (%s): the kernel does not report XDP features (Linux ≥ 6.3 does)", l.Attrs().Name, kind)
		case err != nil:
			f.add("xdp-here:"+kind, false, "%s (%s): %v", l.Attrs().Name, kind, err)
		default:
			f.add("xdp-here:"+kind, feat.Native(), "%s (%s): native XDP %s, XDP redirect target %s", l.Attrs().Name, kind, yesNo(feat.Native()), yesNo(feat.Redirect()))
		}
	}
}

func kernelVersion(release string) (int, int) {
	parts := strings.SplitN(release, ".", 3)
	if len(parts) < 2 {
		return 0, 0
	}
	major, _ := strconv.Atoi(parts[0])
	minor, _ := strconv.Atoi(strings.TrimRightFunc(parts[1], func(r rune) bool { return r < '0' || r > '9' }))
	return major, minor
}

// effectiveCaps is CapEff of this process.
func effectiveCaps() uint64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			n, _ := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return n
		}
	}
	return 0
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return ": " + err.Error()
}

// bpfErr says why a BPF probe failed: not supported, or not permitted.
func bpfErr(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ebpf.ErrNotSupported):
		return ": not supported by this kernel"
	case errors.Is(err, unix.EPERM), errors.Is(err, os.ErrPermission):
		return ": not permitted (needs CAP_BPF and CAP_NET_ADMIN, or root)"
	}
	return ": " + err.Error()
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
