package hostcheck

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/flowplane/flowplane/internal/cli"
)

// Verdict is what the probes mean for one subsystem.
type Verdict struct {
	Subsystem string   `json:"subsystem"`
	State     string   `json:"state"` // works, limited, cannot
	Limits    []string `json:"limits,omitempty"`
	Missing   []string `json:"missing,omitempty"` // what it cannot do without, and what to change
}

// Report is what `flowplane check` prints.
type Report struct {
	Features   []Feature `json:"features"`
	Subsystems []Verdict `json:"subsystems"`
}

// need is one requirement of a subsystem: the features it needs (all of them) and what to do
// when one is missing.
type need struct {
	features []string
	fix      string
}

// rule is a subsystem's requirements: what it cannot work without (needs) and what only limits
// it (limits: the message says what a user loses). With someOf, the subsystem cannot work when
// every one of its limits applies (prio: a host part and a router part, either is useful).
type rule struct {
	subsystem string
	needs     []need
	limits    []need
	someOf    bool
}

var (
	privileges = need{[]string{"root"}, "run as root (sudo)"}
	bpf        = need{[]string{"btf", "bpffs"}, "a kernel with BTF (CONFIG_DEBUG_INFO_BTF) and the BPF file system"}
	tcx        = need{[]string{"prog:sched_cls", "tcx"}, "Linux 6.6 or newer (tcx)"}
)

var rules = []rule{
	{subsystem: "lab", needs: []need{privileges, {[]string{"cap_sys_admin", "veth"}, "network namespaces and veth pairs (root with CAP_SYS_ADMIN)"}},
		limits: []need{
			{[]string{"qdisc:htb"}, "no `rate` on links (no htb qdisc)"},
			{[]string{"prog:sched_cls", "bpffs"}, "no `loss` on links (no tc BPF programs)"},
		}},
	{subsystem: "conntrack", needs: []need{privileges, bpf, tcx, {[]string{"map:lru_hash", "map:percpu_array"}, "Linux 6.1 or newer"}},
		limits: []need{
			{[]string{"prog:xdp", "helper:fib_lookup", "helper:redirect_map", "map:devmap_hash"}, "no XDP forwarding: --hook tc only"},
		}},
	{subsystem: "tune", needs: []need{privileges, bpf, {[]string{"cgroup2"}, "mount cgroup v2 (mount -t cgroup2 none /sys/fs/cgroup/unified)"},
		{[]string{"prog:sock_ops", "helper:setsockopt"}, "BPF sock_ops programs"},
		{[]string{"kernel>=6.9"}, "Linux 6.9 or newer (may_goto loops)"}}},
	{subsystem: "prio", needs: []need{privileges, bpf}, someOf: true,
		limits: []need{
			{[]string{"cgroup2", "prog:sock_ops", "helper:store_hdr_opt"}, "no `prio host`: hosts cannot advertise (needs cgroup v2 and sock_ops TCP header options)"},
			{[]string{"qdisc:htb", "prog:sched_cls", "tcx"}, "no `prio router` (needs the htb qdisc and tcx)"},
		}},
	{subsystem: "altmark", needs: []need{privileges, bpf, tcx, {[]string{"helper:ktime_get_tai_ns"}, "Linux 6.1 or newer (bpf_ktime_get_tai_ns)"}},
		limits: []need{{[]string{"analytics"}, "no `altmark analyze`: install the analytics (pip install flowplane-analytics)"}}},
	{subsystem: "vnet", limits: []need{{[]string{"tun", "cap_net_admin"}, "no --tap (needs /dev/net/tun and CAP_NET_ADMIN)"}}},
}

// judge turns the features into a verdict per subsystem. A feature that could not be probed,
// or that the kernel refused for lack of privileges, is reported with its own reason rather
// than the requirement's (a kernel version would be the wrong advice).
func judge(f *found) []Verdict {
	var out []Verdict
	for _, r := range rules {
		v := Verdict{Subsystem: r.subsystem, State: "works"}
		for _, n := range r.needs {
			v.Missing = append(v.Missing, explain(f, n)...)
		}
		limited := 0
		for _, n := range r.limits {
			if why := explain(f, n); len(why) > 0 {
				limited++
				v.Limits = append(v.Limits, why...)
			}
		}
		switch {
		case len(v.Missing) > 0 || r.someOf && limited == len(r.limits):
			v.State = "cannot"
		case limited > 0:
			v.State = "limited"
		}
		out = append(out, v)
	}
	return out
}

// explain says why n is not met, one line per reason: nothing when it is.
func explain(f *found, n need) []string {
	var reasons []string
	names := map[string][]string{}
	for _, name := range n.features {
		ft, probed := f.by[name]
		why := n.fix
		switch {
		case ft.Have:
			continue
		case probed && strings.Contains(ft.Detail, "not permitted"):
			why = "not permitted: needs CAP_BPF and CAP_NET_ADMIN (or root)"
		case probed && strings.HasPrefix(ft.Detail, "not probed"):
			why = ft.Detail
		}
		if names[why] == nil {
			reasons = append(reasons, why)
		}
		names[why] = append(names[why], name)
	}
	out := make([]string, len(reasons))
	for i, why := range reasons {
		out[i] = strings.Join(names[why], ", ") + ": " + why
	}
	return out
}

// Run probes the host and judges every subsystem; analytics, if not nil, reports where the
// analytics package is (altmark analyze).
func Run(analytics func() (string, error)) Report {
	f := probe()
	if analytics != nil {
		if p, err := analytics(); err != nil {
			f.add("analytics", false, "%v", err)
		} else {
			f.add("analytics", true, "%s", p)
		}
	}
	return Report{Features: f.list, Subsystems: judge(f)}
}

// ExitCannot is the exit code when a subsystem cannot work on this host.
const ExitCannot = 1

// Command is `flowplane check`.
func Command(analytics func() (string, error)) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "check [--json]",
		Short: "Probe this host's kernel and privileges and say what works here",
		Long: `Probe what this host allows (kernel, BTF, bpffs, cgroup v2, BPF program and map types and
helpers, tcx, XDP, qdiscs, privileges), each by doing it in a scratch network namespace, then
say per subsystem whether it works, works with limits, or cannot, and what to change.
Exit code 0: every subsystem works (some perhaps with limits); 1: at least one cannot;
2: bad usage.`,
		Args: cli.ExactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			r := Run(analytics)
			if asJSON {
				if err := cli.WriteJSON(cmd.OutOrStdout(), r); err != nil {
					return err
				}
			} else {
				r.print(cmd.OutOrStdout())
			}
			for _, v := range r.Subsystems {
				if v.State == "cannot" {
					return &cannotError{}
				}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// cannotError makes the process exit with ExitCannot; the report has said why.
type cannotError struct{}

func (*cannotError) Error() string {
	return "check: some subsystems cannot work on this host (see above)"
}
func (*cannotError) ExitCode() int { return ExitCannot }

func (r Report) print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "FEATURE\tHAVE\tDETAIL")
	for _, f := range r.Features {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", f.Name, yesNo(f.Have), f.Detail)
	}
	tw.Flush()
	fmt.Fprintln(w)
	for _, v := range r.Subsystems {
		switch v.State {
		case "works":
			fmt.Fprintf(w, "%-10s works\n", v.Subsystem)
		case "limited":
			fmt.Fprintf(w, "%-10s works with limits: %s\n", v.Subsystem, strings.Join(v.Limits, "; "))
		default:
			// Needs first, then the limits that apply too (all of them, for a someOf rule).
			fmt.Fprintf(w, "%-10s cannot:\n", v.Subsystem)
			for _, m := range append(v.Missing, v.Limits...) {
				fmt.Fprintf(w, "%-10s   %s\n", "", m)
			}
		}
	}
}
