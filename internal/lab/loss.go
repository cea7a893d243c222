package lab

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/flowplane/flowplane/internal/pin"
	"github.com/flowplane/flowplane/internal/stats"
	"github.com/flowplane/flowplane/internal/topo"
)

// lossPinDir holds the counters of one interface's loss program.
func (l *Lab) lossPinDir(ifc *topo.Iface) string {
	return pin.Path("lab", l.Name(), ifc.Node.Name, ifc.Name)
}

// lossThreshold turns a percentage into the program's threshold on a 32-bit random number.
func lossThreshold(percent float64) uint64 {
	return uint64(math.Round(percent / 100 * (1 << 32)))
}

// attachLoss loads one loss program for the interface (its probability is a load-time
// constant), attaches it as a direct-action cls_bpf filter on clsact egress (see loss.bpf.c for
// why not tcx) and pins its counters. Runs in the node's namespace. The filter holds the
// program; deleting the namespace removes both.
func (l *Lab) attachLoss(ifc *topo.Iface, dev netlink.Link) error {
	return l.loadLoss(ifc, func(objs *lossObjects) error {
		if err := ensureClsact(dev); err != nil {
			return err
		}
		filter := &netlink.BpfFilter{
			FilterAttrs: netlink.FilterAttrs{LinkIndex: dev.Attrs().Index, Parent: netlink.HANDLE_MIN_EGRESS,
				Handle: 1, Priority: 1, Protocol: unix.ETH_P_ALL},
			Fd: objs.LabLoss.FD(), Name: "flowplane-lab-loss", DirectAction: true,
		}
		if err := netlink.FilterAdd(filter); err != nil {
			return fmt.Errorf("attach loss program to egress of %s: %w", l.IfName(ifc), err)
		}
		return nil
	})
}

// attachLossXDP applies the loss of the link's other end (a node that forwards with XDP
// redirects, which skip that end's clsact) where its frames arrive: an XDP program on dev,
// ifc's device, attached through netlink so that it stays with the device after lab up exits.
// Its counters are pinned as the other end's: they count what that end sent.
func (l *Lab) attachLossXDP(ifc *topo.Iface, dev netlink.Link) error {
	return l.loadLoss(ifc.Peer(), func(objs *lossObjects) error {
		if err := netlink.LinkSetXdpFdWithFlags(dev, objs.LabLossXdp.FD(), xdpFlagsDrvMode); err != nil {
			return fmt.Errorf("attach XDP loss program to %s: %w", l.IfName(ifc), err)
		}
		return nil
	})
}

const xdpFlagsDrvMode = 1 << 2 // XDP_FLAGS_DRV_MODE

// ensureClsact adds a clsact qdisc to dev unless it has one.
func ensureClsact(dev netlink.Link) error {
	clsact := &netlink.GenericQdisc{QdiscType: "clsact",
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: dev.Attrs().Index, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}}
	if err := netlink.QdiscAdd(clsact); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("add clsact qdisc: %w", err)
	}
	return nil
}

// loadLoss loads the loss programs with the loss of what ifc sends, lets attach attach one,
// and pins the counters as ifc's (the sending end's).
func (l *Lab) loadLoss(ifc *topo.Iface, attach func(*lossObjects) error) error {
	spec, err := loadLoss()
	if err != nil {
		return fmt.Errorf("load loss program spec: %w", err)
	}
	if err := spec.Variables["loss_threshold"].Set(lossThreshold(ifc.Loss)); err != nil {
		return fmt.Errorf("set loss threshold: %w", err)
	}
	var objs lossObjects
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		return fmt.Errorf("load loss program: %w", err)
	}
	defer objs.Close()
	if err := attach(&objs); err != nil {
		return err
	}
	dir, err := pin.Dir("lab", l.Name(), ifc.Node.Name, ifc.Name)
	if err != nil {
		return err
	}
	if err := objs.LossStats.Pin(filepath.Join(dir, "stats")); err != nil {
		return fmt.Errorf("pin loss counters: %w", err)
	}
	return nil
}

// LossCounters are what a link end's loss program has seen.
type LossCounters struct {
	Passed  uint64 `json:"passed"`
	Dropped uint64 `json:"dropped"`
}

// ReadLoss sums the per-CPU counters of an interface's loss program. ok is false when the
// interface has none.
func (l *Lab) ReadLoss(ifc *topo.Iface) (c LossCounters, ok bool, err error) {
	m, err := ebpf.LoadPinnedMap(filepath.Join(l.lossPinDir(ifc), "stats"), &ebpf.LoadPinOptions{ReadOnly: true})
	if errors.Is(err, os.ErrNotExist) {
		return c, false, nil
	}
	if err != nil {
		return c, false, fmt.Errorf("open loss counters: %w", err)
	}
	defer m.Close()
	for key, dst := range map[lossLossStat]*uint64{lossLossStatLOSS_STAT_PASSED: &c.Passed, lossLossStatLOSS_STAT_DROPPED: &c.Dropped} {
		n, err := stats.Sum(m, uint32(key))
		if err != nil {
			return c, false, fmt.Errorf("read loss counters: %w", err)
		}
		*dst = n
	}
	return c, true, nil
}
