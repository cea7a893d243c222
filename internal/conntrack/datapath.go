package conntrack

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"

	"github.com/flowplane/flowplane/internal/attach"
	"github.com/flowplane/flowplane/internal/pin"
)

// persistent maps keep their pins across restarts: the table survives `run` being restarted.
var persistent = []string{"ct_main", "ct_emb", "ct_stats", "ct_settings", "ct_events"}

// Instance names the conntrack instance of the calling thread's network namespace: one pin
// directory per namespace, so two routers of one lab never share a table.
func Instance() (string, error) { return attach.ThisNetns() }

// PinDir is the pin directory of the calling thread's namespace's instance.
func PinDir() (string, error) {
	inst, err := Instance()
	if err != nil {
		return "", err
	}
	return pin.Path("conntrack", inst), nil
}

// Hooks a Datapath can attach to.
const (
	HookXDP = "xdp" // XDP: before the skb exists (driver mode, generic as a fallback)
	HookTC  = "tc"  // tcx ingress: on the skb, after GRO
)

// Datapath is the loaded program (one build, or both on the same maps) and its maps.
type Datapath struct {
	objs  ctObjects // maps and ct_sweep; ConntrackXdp only with the XDP build
	prog  *ebpf.Program
	hook  string        // the build of prog
	track bool          // mode track (observe only), not firewall
	other *ebpf.Program // the TC build when both are loaded (prog is then the XDP one)
	dir   string
	links []link.Link
	hooks *ebpf.Map // ct_hooks: which hook each attached interface got (pinned, for stats)
}

// Load loads the program with cfg's settings, reusing the pinned tables of this namespace's
// instance if there are any, and pins its maps. Nothing is attached yet. With the auto hook
// both builds are loaded, sharing every table.
func Load(cfg *resolved) (*Datapath, error) {
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("remove memlock limit: %w", err)
	}
	inst, err := Instance()
	if err != nil {
		return nil, err
	}
	dir, err := pin.Dir("conntrack", inst)
	if err != nil {
		return nil, err
	}
	d, err := load(cfg, dir, true)
	if err != nil && errors.Is(err, ebpf.ErrMapIncompatible) {
		slog.Warn("pinned conntrack table does not fit this configuration; starting a new one", "dir", dir, "err", err)
		for _, n := range persistent {
			_ = os.Remove(filepath.Join(dir, n))
		}
		d, err = load(cfg, dir, true)
	}
	return d, err
}

// LoadUnpinned loads the program without touching bpffs (tests and benchmarks).
func LoadUnpinned(c *Config) (*Datapath, error) {
	cfg, err := c.resolve()
	if err != nil {
		return nil, err
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("remove memlock limit: %w", err)
	}
	return load(cfg, "", false)
}

// programSpec is the spec of the tc build (tc) or the XDP one, its constants set: the mode and
// the clock. Both builds of bpf/conntrack/conntrack.bpf.c have the same maps and variables.
func programSpec(tc, trackOnly bool) (*ebpf.CollectionSpec, error) {
	load := loadCt
	if tc {
		load = loadCtTc
	}
	spec, err := load()
	if err != nil {
		return nil, fmt.Errorf("load conntrack spec: %w", err)
	}
	if err := spec.Variables["track_only"].Set(boolU32(trackOnly)); err != nil {
		return nil, fmt.Errorf("set mode: %w", err)
	}
	if err := setClock(spec); err != nil {
		return nil, err
	}
	return spec, nil
}

func load(cfg *resolved, dir string, pinned bool) (*Datapath, error) {
	spec, err := programSpec(cfg.hook == HookTC, cfg.trackOnly)
	if err != nil {
		return nil, err
	}
	spec.Maps["ct_main"].MaxEntries = cfg.confirmed
	spec.Maps["ct_emb"].MaxEntries = cfg.embryonic
	opts := &ebpf.CollectionOptions{}
	if pinned {
		names := map[string]string{}
		for _, n := range persistent {
			names[n] = n
		}
		reuse, done, err := attach.Reuse(dir, spec, names, true)
		if err != nil {
			return nil, err
		}
		defer done()
		opts.MapReplacements = reuse
	}
	d := &Datapath{dir: dir, hook: cfg.hook, track: cfg.trackOnly}
	if cfg.hook == HookAuto {
		d.hook = HookXDP
	}
	if cfg.hook == HookTC {
		var tc ctTcObjects
		err = spec.LoadAndAssign(&tc, opts)
		if err == nil {
			// The same fields, so the same code reads the tables whatever the hook.
			d.objs.ctMaps = ctMaps(tc.ctTcMaps)
			d.objs.ctVariables = ctVariables(tc.ctTcVariables)
			d.objs.CtSweep = tc.CtSweep
			d.prog = tc.ConntrackTc
		}
	} else {
		err = spec.LoadAndAssign(&d.objs, opts)
		d.prog = d.objs.ConntrackXdp
	}
	if err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("load conntrack program: %+v", ve)
		}
		return nil, fmt.Errorf("load conntrack program: %w", err)
	}
	if cfg.hook == HookAuto {
		if err := d.loadOther(cfg); err != nil {
			d.Close()
			return nil, err
		}
	}
	if err := d.SetSettings(cfg.timeouts, cfg.liberal, cfg.loose); err != nil {
		d.Close()
		return nil, err
	}
	if err := d.setPolicy(cfg); err != nil {
		d.Close()
		return nil, err
	}
	if pinned {
		if err := d.pin(); err != nil {
			d.Close()
			return nil, err
		}
	}
	return d, nil
}

func boolU32(b bool) uint32 {
	if b {
		return 1
	}
	return 0
}

// Program is the forwarding program, XDP or TC (tests run it with BPF_PROG_TEST_RUN).
func (d *Datapath) Program() *ebpf.Program { return d.prog }

// Hook is HookXDP or HookTC: the build of Program.
func (d *Datapath) Hook() string { return d.hook }

// loadOther loads the TC build next to the XDP one, on the same maps (per-CPU scratch
// space apart), with the same settings.
func (d *Datapath) loadOther(cfg *resolved) error {
	spec, err := programSpec(true, cfg.trackOnly)
	if err != nil {
		return err
	}
	m := d.objs.ctMaps
	opts := &ebpf.CollectionOptions{MapReplacements: map[string]*ebpf.Map{
		"ct_main": m.CtMain, "ct_emb": m.CtEmb, "ct_settings": m.CtSettings, "ct_ifaces": m.CtIfaces,
		"tx_ports": m.TxPorts, "ct_allow_port": m.CtAllowPort, "ct_allow_net": m.CtAllowNet,
		"ct_events": m.CtEvents, "ct_stats": m.CtStats, "ct_ifmac": m.CtIfmac,
	}}
	for n, mp := range opts.MapReplacements {
		info, err := mp.Info()
		if err != nil {
			return fmt.Errorf("%s: %w", n, err)
		}
		spec.Maps[n].MaxEntries = info.MaxEntries
	}
	var objs struct {
		Prog *ebpf.Program `ebpf:"conntrack_tc"`
	}
	if err := spec.LoadAndAssign(&objs, opts); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return fmt.Errorf("load conntrack tc program: %+v", ve)
		}
		return fmt.Errorf("load conntrack tc program: %w", err)
	}
	d.other = objs.Prog
	return nil
}

// Tables returns the program's maps, with the sweep program.
func (d *Datapath) Tables() *Tables {
	return &Tables{Main: d.objs.CtMain, Emb: d.objs.CtEmb, Stats: d.objs.CtStats, Settings: d.objs.CtSettings, Events: d.objs.CtEvents,
		sweep: d.objs.CtSweep}
}

// SetSettings writes timeouts (seconds per slot) and the TCP options.
func (d *Datapath) SetSettings(timeouts [len(ctCtConfig{}.Timeout)]uint32, liberal, loose bool) error {
	c := ctCtConfig{Timeout: timeouts, Liberal: boolU32(liberal), Loose: boolU32(loose)}
	if err := d.objs.CtSettings.Put(uint32(0), &c); err != nil {
		return fmt.Errorf("write settings: %w", err)
	}
	return nil
}

func (d *Datapath) setPolicy(cfg *resolved) error {
	for _, r := range cfg.ports {
		k := ctCtPortKey{Port: htons(r.Port), Proto: r.Proto}
		if err := d.objs.CtAllowPort.Put(&k, uint8(1)); err != nil {
			return fmt.Errorf("allow port: %w", err)
		}
	}
	for _, p := range cfg.prefixes {
		k := ctCtLpmKey{Prefixlen: uint32(p.Bits()), Addr: p.Addr().As16()}
		if p.Addr().Is4() {
			k.Prefixlen += 96
		}
		if err := d.objs.CtAllowNet.Put(&k, uint8(1)); err != nil {
			return fmt.Errorf("allow prefix %s: %w", p, err)
		}
	}
	return nil
}

// AddInterface gives ifindex a role and lets the program redirect to it (without attaching;
// tests use this to run the program on crafted packets).
func (d *Datapath) AddInterface(ifindex int, inside bool) error {
	return d.addInterface(ifindex, inside, d.hook)
}

// SetMAC tells the XDP program ifindex's MAC address: frames arriving there addressed to
// another are left to the kernel (which drops them), as the kernel's pkt_type check does.
// Without it (or for an ifindex ≥ CT_IFMAC_MAX) the XDP program forwards whatever arrives.
func (d *Datapath) SetMAC(ifindex int, mac net.HardwareAddr) error {
	if ifindex >= ctIfmacMax || len(mac) != 6 {
		return nil
	}
	v := ctCtIfmac{Set: 1}
	copy(v.Mac[:], mac)
	if err := d.objs.CtIfmac.Put(uint32(ifindex), &v); err != nil {
		return fmt.Errorf("set MAC of interface %d: %w", ifindex, err)
	}
	return nil
}

// ctIfmacMax is CT_IFMAC_MAX of conntrack.h.
const ctIfmacMax = 4096

// addInterface gives ifindex a role; XDP redirects only into interfaces of the XDP hook (the
// devmap): what XDP forwards towards a tc interface goes to the kernel (XDP_PASS), tracked.
func (d *Datapath) addInterface(ifindex int, inside bool, hook string) error {
	role := uint32(ctCtRoleCT_ROLE_OUTSIDE)
	if inside {
		role = uint32(ctCtRoleCT_ROLE_INSIDE)
	}
	if err := d.objs.CtIfaces.Put(uint32(ifindex), role); err != nil {
		return fmt.Errorf("set role of interface %d: %w", ifindex, err)
	}
	if hook == HookTC {
		return nil // bpf_redirect checks ct_ifaces; the devmap is XDP's
	}
	if err := d.objs.TxPorts.Put(uint32(ifindex), uint32(ifindex)); err != nil {
		return fmt.Errorf("add interface %d to the devmap: %w", ifindex, err)
	}
	return nil
}

// Attach gives ifc its role and attaches the program to it with the hook of the loaded build.
func (d *Datapath) Attach(ifc *net.Interface, inside bool) error {
	return d.AttachHook(ifc, inside, d.hook)
}

// AttachHook gives ifc its role and attaches the program to it (see link): the link is the
// Datapath's, closed by Close.
func (d *Datapath) AttachHook(ifc *net.Interface, inside bool, hook string) error {
	l, err := d.link(ifc, inside, hook)
	if err != nil {
		return err
	}
	lk, err := attach.Attach(l.Hook, l.Program)
	if err != nil {
		return fmt.Errorf("attach %s: %w", ifc.Name, err)
	}
	d.links = append(d.links, lk)
	return nil
}

// link gives ifc its role and says what to attach to it: XDP in native (driver) mode, falling
// back to generic mode, or TC at tcx ingress.
func (d *Datapath) link(ifc *net.Interface, inside bool, hook string) (attach.Link, error) {
	prog := d.prog
	switch {
	case hook == d.hook:
	case hook == HookTC && d.other != nil:
		prog = d.other
	default:
		return attach.Link{}, fmt.Errorf("attach %s: the %s build is not loaded", ifc.Name, hook)
	}
	if err := d.addInterface(ifc.Index, inside, hook); err != nil {
		return attach.Link{}, err
	}
	if err := d.recordHook(ifc.Index, hook, inside); err != nil {
		return attach.Link{}, err
	}
	if err := d.SetMAC(ifc.Index, ifc.HardwareAddr); err != nil {
		return attach.Link{}, err
	}
	h := attach.XDP(ifc.Index)
	if hook == HookTC {
		h = attach.TCXIngress(ifc.Index)
	}
	return attach.Link{Name: ifc.Name, Hook: h, Program: prog}, nil
}

func (d *Datapath) pin() error {
	maps := map[string]*ebpf.Map{
		"ct_main": d.objs.CtMain, "ct_emb": d.objs.CtEmb, "ct_stats": d.objs.CtStats, "ct_settings": d.objs.CtSettings,
		"ct_events": d.objs.CtEvents, "ct_ifaces": d.objs.CtIfaces,
	}
	for n, m := range maps {
		p := filepath.Join(d.dir, n)
		if m.IsPinned() {
			continue
		}
		_ = os.Remove(p)
		if err := m.Pin(p); err != nil {
			return fmt.Errorf("pin %s: %w", n, err)
		}
	}
	return nil
}

// Close detaches the program (the pinned tables stay).
func (d *Datapath) Close() error {
	var errs []error
	for _, l := range d.links {
		errs = append(errs, l.Close())
	}
	d.links = nil
	if d.hook == HookTC && d.prog != nil {
		errs = append(errs, d.prog.Close()) // not in d.objs
	}
	if d.other != nil {
		errs = append(errs, d.other.Close())
	}
	if d.hooks != nil {
		if d.hooks.IsPinned() {
			errs = append(errs, d.hooks.Unpin()) // nothing is attached any more
		}
		errs = append(errs, d.hooks.Close())
		d.hooks = nil
	}
	errs = append(errs, d.objs.Close())
	return errors.Join(errs...)
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// addrOf turns a key address (network-order words) into a netip.Addr.
func addrOf(words [4]uint32, family uint8) netip.Addr {
	var b [16]byte
	for i, w := range words {
		// The words hold network-order bytes in host (little-endian) memory.
		b[4*i], b[4*i+1], b[4*i+2], b[4*i+3] = byte(w), byte(w>>8), byte(w>>16), byte(w>>24)
	}
	if family == 4 {
		return netip.AddrFrom4([4]byte(b[:4]))
	}
	return netip.AddrFrom16(b)
}

func unpinInstance(inst string) error { return pin.Remove("conntrack", inst) }
