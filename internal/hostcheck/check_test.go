package hostcheck

import (
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/flowplane/flowplane/internal/testenv"
)

// Every feature a rule names is one the probes report: a typo would make a subsystem "cannot"
// for a feature nobody probes.
func TestRulesNameProbedFeatures(t *testing.T) {
	testenv.Privileged(t)
	r := Run(func() (string, error) { return "/x", nil })
	probed := map[string]bool{}
	for _, f := range r.Features {
		probed[f.Name] = true
	}
	for _, ru := range rules {
		for _, n := range append(ru.needs, ru.limits...) {
			for _, name := range n.features {
				if !probed[name] {
					t.Errorf("%s: rule names %q, which no probe reports", ru.subsystem, name)
				}
			}
		}
	}
	if len(r.Subsystems) != 6 {
		t.Errorf("%d subsystems judged, want 6", len(r.Subsystems))
	}
}

// As root with every capability, the features flowplane's own tests rely on are there, and
// the qdiscs this kernel lacks are reported missing, not guessed.
func TestPrivilegedHost(t *testing.T) {
	testenv.Privileged(t)
	r := Run(nil)
	have := map[string]Feature{}
	for _, f := range r.Features {
		have[f.Name] = f
	}
	for _, name := range []string{"btf", "bpffs", "cgroup2", "prog:sched_cls", "prog:xdp", "prog:sock_ops", "tcx", "veth", "xdp:veth", "qdisc:htb", "qdisc:clsact", "helper:ktime_get_tai_ns"} {
		if !have[name].Have {
			t.Errorf("%s: %+v, want it found on a host that runs flowplane's tests", name, have[name])
		}
	}
	for _, v := range r.Subsystems {
		if v.State == "cannot" {
			t.Errorf("%s: cannot (%v) on a host that runs its tests", v.Subsystem, v.Missing)
		}
	}
}

// Without CAP_BPF and CAP_SYS_ADMIN (setpriv drops them for a child process), check tells the
// truth: the BPF subsystems cannot, for want of privileges, and vnet still works.
func TestWithoutCapabilities(t *testing.T) {
	if os.Getenv("FP_CHECK_CHILD") == "1" {
		json.NewEncoder(os.Stdout).Encode(Run(nil))
		return
	}
	testenv.Privileged(t)
	testenv.Need(t, "setpriv")
	drop := "-bpf,-sys_admin,-perfmon"
	cmd := exec.Command("setpriv", "--inh-caps="+drop, "--bounding-set="+drop, os.Args[0], "-test.run=^TestWithoutCapabilities$")
	cmd.Env = append(os.Environ(), "FP_CHECK_CHILD=1")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("setpriv: %v\n%s", err, out)
	}
	var r Report
	if err := json.NewDecoder(strings.NewReader(string(out))).Decode(&r); err != nil {
		t.Fatalf("decode %q: %v", out, err)
	}
	for _, v := range r.Subsystems {
		want := "cannot"
		if v.Subsystem == "vnet" {
			want = "works"
		}
		if v.State != want {
			t.Errorf("%s: %s (%v %v), want %s", v.Subsystem, v.State, v.Missing, v.Limits, want)
		}
		if v.Subsystem == "tune" && !strings.Contains(strings.Join(v.Missing, ";"), "not permitted") {
			t.Errorf("tune: %v, want the missing privilege named", v.Missing)
		}
	}
}
