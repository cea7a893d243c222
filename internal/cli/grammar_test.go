package cli

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// grammarRoot is "fp" with "thing": apply --config FILE (deprecated: apply FILE, --policy),
// status, a hidden alias "stats" of status, and an object "obj" whose bare form --x V is
// deprecated for "obj apply --x V".
func grammarRoot(out, errb *bytes.Buffer) *cobra.Command {
	var file string
	apply := &cobra.Command{
		Use: "apply --config FILE",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := Require(cmd, "config"); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "applied %s\n", file)
			return nil
		},
	}
	ConfigFlag(apply, &file, "the file", "thing apply FILE", "thing apply --config FILE")
	AliasFlag(apply, "policy", "config", "thing apply --policy FILE", "thing apply --config FILE")
	status := func() *cobra.Command {
		return &cobra.Command{Use: "status", Args: ExactArgs(0), RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintln(cmd.OutOrStdout(), "status")
			return nil
		}}
	}
	var x string
	obj := &cobra.Command{Use: "obj"}
	obj.Flags().StringVar(&x, "x", "", "")
	Deprecates(obj, "thing obj --x V", "thing obj apply --x V")
	Object(obj, func(cmd *cobra.Command, _ []string) error {
		Notice(cmd, "thing obj --x V", "thing obj apply --x V")
		fmt.Fprintf(cmd.OutOrStdout(), "obj %s\n", x)
		return nil
	})
	obj.AddCommand(&cobra.Command{Use: "apply", RunE: func(*cobra.Command, []string) error { return nil }})
	thing := &cobra.Command{Use: "thing"}
	thing.AddCommand(apply, status(), Alias(status(), "stats", "thing stats", "thing status"), obj)
	root := Root("fp", "test root", thing)
	root.SetOut(out)
	root.SetErr(errb)
	return root
}

func TestDeprecatedSpellings(t *testing.T) {
	defer slog.SetDefault(slog.Default())
	for _, c := range []struct {
		args         []string
		code         int
		out, notice  string // notice: the deprecated spelling named, "" for none
		errSubstring string
	}{
		{[]string{"thing", "apply", "--config", "a.yaml"}, 0, "applied a.yaml\n", "", ""},
		{[]string{"thing", "apply", "a.yaml"}, 0, "applied a.yaml\n", "thing apply FILE", ""},
		{[]string{"thing", "apply", "--policy", "a.yaml"}, 0, "applied a.yaml\n", "thing apply --policy FILE", ""},
		{[]string{"thing", "apply", "--config", "a.yaml", "b.yaml"}, 2, "", "thing apply FILE", "give the file once"},
		{[]string{"thing", "apply", "--config", "a", "--policy", "b"}, 2, "", "thing apply --policy FILE", "same flag"},
		{[]string{"thing", "apply", "a", "b"}, 2, "", "", "takes 0 argument(s), got 2"},
		{[]string{"thing", "apply"}, 2, "", "", "fp thing apply needs --config; usage: fp thing apply --config FILE"},
		{[]string{"thing", "stats"}, 0, "status\n", "thing stats", ""},
		{[]string{"thing", "stats", "x"}, 2, "", "thing stats", "takes 0 argument(s)"},
		{[]string{"thing", "obj", "--x", "v"}, 0, "obj v\n", "thing obj --x V", ""},
		{[]string{"thing", "obj"}, 0, "Available Commands", "", ""},
		{[]string{"thing", "obj", "aply"}, 2, "", "", `unknown command "aply" for "fp thing obj"; did you mean apply?`},
	} {
		var out, errb bytes.Buffer
		root := grammarRoot(&out, &errb)
		root.SetArgs(c.args)
		err := root.ExecuteContext(context.Background())
		if code := exitCode(err); code != c.code || err != nil && !strings.Contains(err.Error(), c.errSubstring) {
			t.Errorf("%v: error %v (exit %d), want exit %d and %q", c.args, err, code, c.code, c.errSubstring)
		}
		if !strings.Contains(out.String(), c.out) {
			t.Errorf("%v: stdout %q, want %q", c.args, out.String(), c.out)
		}
		notice := ""
		if c.notice != "" {
			notice = `fp: "` + c.notice + `" is deprecated; use "`
		}
		if notice == "" && errb.Len() > 0 || !strings.HasPrefix(errb.String(), notice) || strings.Count(errb.String(), "\n") > 1 {
			t.Errorf("%v: stderr %q, want one line %q…", c.args, errb.String(), notice)
		}
	}
}

func TestDeprecatedAreHiddenAndRecorded(t *testing.T) {
	var out, errb bytes.Buffer
	root := grammarRoot(&out, &errb)
	thing, _, _ := root.Find([]string{"thing"})
	apply, _, _ := root.Find([]string{"thing", "apply"})
	stats, _, _ := root.Find([]string{"thing", "stats"})
	obj, _, _ := root.Find([]string{"thing", "obj"})
	if !stats.Hidden || apply.Hidden || !apply.Flags().Lookup("policy").Hidden {
		t.Errorf("hidden: stats %v (want true), apply %v (want false), --policy %v (want true)", stats.Hidden, apply.Hidden, apply.Flags().Lookup("policy").Hidden)
	}
	if _, ok := apply.Flags().Lookup("policy").Annotations[DeprecatedKey]; !ok {
		t.Error("--policy carries no deprecation annotation")
	}
	want := map[*cobra.Command]map[string]string{
		apply: {"thing apply FILE": "thing apply --config FILE", "thing apply --policy FILE": "thing apply --config FILE"},
		stats: {"thing stats": "thing status"},
		obj:   {"thing obj --x V": "thing obj apply --x V"},
		thing: {},
	}
	for c, w := range want {
		got := DeprecatedForms(c)
		if fmt.Sprint(got) != fmt.Sprint(w) {
			t.Errorf("%s: DeprecatedForms %v, want %v", c.Name(), got, w)
		}
	}
	if strings.Contains(apply.UseLine(), "[flags]") {
		t.Errorf("use line %q: the synopsis shows the flags itself", apply.UseLine())
	}
}

func TestRequire(t *testing.T) {
	t.Parallel()
	cmd := &cobra.Command{Use: "router apply --dev IF --rate R"}
	cmd.Flags().String("dev", "", "")
	cmd.Flags().String("rate", "", "")
	cmd.Flags().String("config", "", "")
	_ = cmd.Flags().Set("dev", "x")
	err := Require(cmd, "dev", "rate", "config")
	if ExitCode(err) != 2 || !strings.Contains(err.Error(), "needs --dev, --rate and --config") {
		t.Errorf("Require: %v", err)
	}
	if err := Require(cmd, "dev"); err != nil {
		t.Errorf("Require(dev) with --dev given: %v", err)
	}
}
