package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"

	"github.com/flowplane/flowplane/internal/commands"
)

// Options say what to build and where.
type Options struct {
	Out      string   // the release directory, replaced
	Root     string   // the checkout; default: the one the working directory is in
	Version  string   // default: git describe --tags --always --dirty
	Commit   string   // default: git rev-parse HEAD
	Date     string   // the commit's date, RFC 3339 UTC; default: from git
	Arches   []string // GOARCH of the binaries; default amd64 and arm64
	Python   string   // interpreter with build and setuptools; default: <Root>/analytics/.venv/bin/python
	NoPython bool     // leave out the wheel and sdist
	Log      func(format string, args ...any)
}

// Info is the release's identity, all of it from git.
type Info struct {
	Version   string    // git describe: v0.1.0, v0.1.0-3-gabc1234, abc1234, …[-dirty]
	Commit    string    // full hash
	Date      string    // the commit's date, RFC 3339 UTC: `flowplane version` prints it
	Time      time.Time // the same: every timestamp in the release (SOURCE_DATE_EPOCH)
	PyVersion string    // Version in PEP 440 form (PyVersion)
}

// FileVersion is the version in file names: Version without the leading v.
func (i Info) FileVersion() string { return strings.TrimPrefix(i.Version, "v") }

// Result is what Run wrote.
type Result struct {
	Dir   string
	Info  Info
	Files []string // every file in Dir, sorted
	Steps []Step
}

// Step is one timed part of the run.
type Step struct {
	Name    string
	Seconds float64
}

// Run writes the release into o.Out: it is built in a directory beside it and renamed into
// place when complete, replacing a previous release there.
func Run(ctx context.Context, o Options) (*Result, error) {
	logf := o.Log
	if logf == nil {
		logf = func(string, ...any) {}
	}
	if o.Out == "" {
		return nil, errors.New("no output directory")
	}
	// Files this program and its children create get the usual modes whatever the caller's
	// umask: the Python archives record them.
	syscall.Umask(0o022)
	root := o.Root
	if root == "" {
		top, err := output(ctx, "", "git", "rev-parse", "--show-toplevel")
		if err != nil {
			return nil, err
		}
		root = top
	}
	info, err := gitInfo(ctx, root, o)
	if err != nil {
		return nil, err
	}
	out, err := filepath.Abs(o.Out)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return nil, err
	}
	stage, err := os.MkdirTemp(filepath.Dir(out), "."+filepath.Base(out)+"-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(stage) // gone once renamed to out
	if err := os.Chmod(stage, 0o755); err != nil {
		return nil, err
	}
	work, err := os.MkdirTemp("", "fprelease-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)

	if len(o.Arches) == 0 {
		o.Arches = []string{"amd64", "arm64"}
	}
	res := &Result{Dir: out, Info: info}
	step := func(name string, f func() error) error {
		t := time.Now()
		if err := f(); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		s := Step{name, time.Since(t).Seconds()}
		res.Steps = append(res.Steps, s)
		logf("%-28s %5.1fs", name, s.Seconds)
		return nil
	}
	logf("%s (commit %.12s, %s; python %s)", info.Version, info.Commit, info.Date, info.PyVersion)

	var docs []entry
	if err := step("man pages and completions", func() (err error) { docs, err = Docs(info); return err }); err != nil {
		return nil, err
	}
	var extra []entry // README.md, LICENSE
	for _, name := range []string{"README.md", "LICENSE"} {
		data, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			return nil, err
		}
		extra = append(extra, entry{name: name, mode: 0o644, data: data})
	}
	for _, arch := range o.Arches {
		name := fmt.Sprintf("flowplane_%s_linux_%s", info.FileVersion(), arch)
		bin := filepath.Join(work, name, "flowplane")
		if err := step("go build linux/"+arch, func() error { return buildBinary(ctx, root, arch, info, bin) }); err != nil {
			return nil, err
		}
		err := step("tar "+name, func() error {
			data, err := os.ReadFile(bin)
			if err != nil {
				return err
			}
			files := append([]entry{{name: "flowplane", mode: 0o755, data: data}}, extra...)
			files = append(files, docs...)
			return writeTarGz(filepath.Join(stage, name+".tar.gz"), name, files, info.Time)
		})
		if err != nil {
			return nil, err
		}
	}
	if !o.NoPython {
		py := o.Python
		if py == "" {
			py = filepath.Join(root, "analytics/.venv/bin/python")
		}
		if err := step("python wheel and sdist", func() error { return buildPython(ctx, root, py, info, work, stage) }); err != nil {
			return nil, err
		}
	}
	if err := step("SHA256SUMS", func() error { return writeSums(stage) }); err != nil {
		return nil, err
	}
	if err := replaceDir(stage, out); err != nil {
		return nil, err
	}
	names, err := listFiles(out)
	if err != nil {
		return nil, err
	}
	for _, n := range names {
		res.Files = append(res.Files, filepath.Join(out, n))
	}
	return res, nil
}

// gitInfo fills Info from the options, and what they leave out from git.
func gitInfo(ctx context.Context, root string, o Options) (Info, error) {
	i := Info{Version: o.Version, Commit: o.Commit, Date: o.Date}
	var err error
	if i.Version == "" {
		if i.Version, err = output(ctx, root, "git", "describe", "--tags", "--always", "--dirty"); err != nil {
			return i, err
		}
	}
	if i.Commit == "" {
		if i.Commit, err = output(ctx, root, "git", "rev-parse", "HEAD"); err != nil {
			return i, err
		}
	}
	if i.Date == "" {
		ct, err := output(ctx, root, "git", "log", "-1", "--format=%ct")
		if err != nil {
			return i, err
		}
		sec, err := strconv.ParseInt(ct, 10, 64)
		if err != nil {
			return i, fmt.Errorf("commit time %q: %w", ct, err)
		}
		i.Date = time.Unix(sec, 0).UTC().Format(time.RFC3339)
	}
	if i.Time, err = time.Parse(time.RFC3339, i.Date); err != nil {
		return i, fmt.Errorf("-date: %w", err)
	}
	i.Time = i.Time.UTC()
	i.PyVersion, err = PyVersion(i.Version)
	return i, err
}

var (
	describeTag  = regexp.MustCompile(`^v(\d+\.\d+\.\d+)(?:-(alpha|beta|rc)\.?(\d+))?(?:-(\d+)-g([0-9a-f]+))?(-dirty)?$`)
	describeHash = regexp.MustCompile(`^([0-9a-f]{4,64})(-dirty)?$`)
	preRelease   = map[string]string{"alpha": "a", "beta": "b", "rc": "rc"}
)

// PyVersion maps a `git describe --tags --always --dirty` version to PEP 440 (docs/release.md):
// v0.1.0 → 0.1.0; v0.1.0-3-gabc1234 (3 commits past the tag) → 0.1.0.post3+gabc1234; no tag,
// abc1234 → 0.0.0+gabc1234; -dirty → a local segment .dirty (+dirty on a tag); a pre-release
// tag v0.2.0-rc.1 → 0.2.0rc1.
func PyVersion(describe string) (string, error) {
	if m := describeTag.FindStringSubmatch(describe); m != nil {
		v := m[1]
		if m[2] != "" {
			v += preRelease[m[2]] + m[3]
		}
		var local []string
		if m[4] != "" {
			v += ".post" + m[4]
			local = append(local, "g"+m[5])
		}
		if m[6] != "" {
			local = append(local, "dirty")
		}
		if len(local) > 0 {
			v += "+" + strings.Join(local, ".")
		}
		return v, nil
	}
	if m := describeHash.FindStringSubmatch(describe); m != nil {
		v := "0.0.0+g" + m[1]
		if m[2] != "" {
			v += ".dirty"
		}
		return v, nil
	}
	return "", fmt.Errorf("version %q is neither vX.Y.Z[-rc.N][-N-gHASH][-dirty] nor a commit hash: tag releases vX.Y.Z (docs/release.md)", describe)
}

// Docs returns the man pages (man/man1/flowplane[-…].1, every available command: hidden and
// deprecated ones left out) and the shell completions (completions/), dated by the commit.
func Docs(info Info) ([]entry, error) {
	root := commands.Root() // completion included (internal/cli.Root)
	date := info.Time
	header := doc.GenManHeader{Section: "1", Date: &date, Source: "flowplane " + info.Version, Manual: "flowplane manual"}
	var out []entry
	var walk func(c *cobra.Command) error
	walk = func(c *cobra.Command) error {
		c.DisableAutoGenTag = true // its HISTORY section would only repeat the date
		var buf bytes.Buffer
		h := header
		if err := doc.GenMan(c, &h, &buf); err != nil {
			return err
		}
		out = append(out, entry{name: "man/man1/" + strings.ReplaceAll(c.CommandPath(), " ", "-") + ".1", mode: 0o644, data: buf.Bytes()})
		for _, s := range c.Commands() {
			if s.IsAvailableCommand() && !s.IsAdditionalHelpTopicCommand() {
				if err := walk(s); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(root); err != nil {
		return nil, err
	}
	var bash, zsh, fish bytes.Buffer
	if err := root.GenBashCompletionV2(&bash, true); err != nil {
		return nil, err
	}
	if err := root.GenZshCompletion(&zsh); err != nil {
		return nil, err
	}
	if err := root.GenFishCompletion(&fish, true); err != nil {
		return nil, err
	}
	out = append(out,
		entry{name: "completions/flowplane.bash", mode: 0o644, data: bash.Bytes()},
		entry{name: "completions/_flowplane", mode: 0o644, data: zsh.Bytes()},
		entry{name: "completions/flowplane.fish", mode: 0o644, data: fish.Bytes()})
	return out, nil
}

// buildBinary builds the static binary for linux/arch: no cgo, no paths or VCS stamps of this
// machine, symbols stripped, the version stamped.
func buildBinary(ctx context.Context, root, arch string, info Info, bin string) error {
	const pkg = "github.com/flowplane/flowplane/internal/version."
	ldflags := fmt.Sprintf("-s -w -X %sVersion=%s -X %sCommit=%s -X %sDate=%s", pkg, info.Version, pkg, info.Commit, pkg, info.Date)
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildvcs=false", "-ldflags="+ldflags, "-o", bin, "./cmd/flowplane")
	cmd.Dir = root
	// The defaults, whatever the caller's environment says: the same binary on every machine.
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch, "GOAMD64=v1", "GOARM64=v8.0", "GOFLAGS=-mod=readonly", "GOEXPERIMENT=")
	return run(cmd)
}

// entry is a file of an archive, its name relative to the archive's top directory.
type entry struct {
	name string
	mode int64
	data []byte
}

// writeTarGz writes files under the directory top/ into a gzipped tar that depends on nothing
// but its contents: entries sorted, directories listed, one mtime, owner root (0), fixed modes,
// no name or time in the gzip header.
func writeTarGz(file, top string, files []entry, mtime time.Time) error {
	all := map[string]entry{top + "/": {name: top + "/", mode: 0o755}}
	for _, f := range files {
		name := top + "/" + f.name
		if _, dup := all[name]; dup {
			return fmt.Errorf("%s twice", name)
		}
		all[name] = entry{name: name, mode: f.mode, data: f.data}
		for d := path.Dir(name); d != top && d != "."; d = path.Dir(d) {
			all[d+"/"] = entry{name: d + "/", mode: 0o755}
		}
	}
	names := make([]string, 0, len(all))
	for n := range all {
		names = append(names, n)
	}
	slices.Sort(names)
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.DefaultCompression)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(zw)
	for _, n := range names {
		e := all[n]
		h := &tar.Header{Name: n, Mode: e.mode, ModTime: mtime, Uname: "root", Gname: "root", Format: tar.FormatPAX}
		if strings.HasSuffix(n, "/") {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if _, err := tw.Write(e.data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	return os.WriteFile(file, buf.Bytes(), 0o644)
}

// buildPython builds the analytics' sdist and wheel with version info.PyVersion from a copy of
// analytics/ (its tracked files, LICENSE and a generated _version.py): the checkout is not
// touched. The wheel is dated by SOURCE_DATE_EPOCH; the sdist, which setuptools dates by the
// clock and the files, is rewritten like the tarballs.
func buildPython(ctx context.Context, root, python string, info Info, work, stage string) error {
	if _, err := os.Stat(python); err != nil {
		return fmt.Errorf("%w (`make setup` creates analytics/.venv with the build package)", err)
	}
	src := filepath.Join(work, "analytics")
	tracked, err := output(ctx, root, "git", "ls-files", "-z", "--", "analytics")
	if err != nil {
		return err
	}
	for _, rel := range strings.Split(strings.TrimRight(tracked, "\x00"), "\x00") {
		st, err := os.Stat(filepath.Join(root, rel))
		if errors.Is(err, os.ErrNotExist) {
			continue // deleted in the work tree
		} else if err != nil {
			return err
		}
		mode := os.FileMode(0o644)
		if st.Mode()&0o111 != 0 {
			mode = 0o755
		}
		if err := copyFile(filepath.Join(root, rel), filepath.Join(src, strings.TrimPrefix(rel, "analytics/")), mode); err != nil {
			return err
		}
	}
	// setuptools puts LICENSE* into the sdist and the wheel's .dist-info/licenses.
	if err := copyFile(filepath.Join(root, "LICENSE"), filepath.Join(src, "LICENSE"), 0o644); err != nil {
		return err
	}
	version := fmt.Sprintf("# Written by the release build (scripts/release): the version of %s, commit %s.\n__version__ = %q\n", info.Version, info.Commit, info.PyVersion)
	if err := os.WriteFile(filepath.Join(src, "src/flowplane_analytics/_version.py"), []byte(version), 0o644); err != nil {
		return err
	}
	pyout := filepath.Join(work, "pydist")
	// Without flags, build makes the sdist and then the wheel from the sdist: the sdist is
	// known to be complete. --no-isolation: the pinned setuptools of the venv (constraints.txt),
	// not whatever the index serves today.
	cmd := exec.CommandContext(ctx, python, "-m", "build", "--no-isolation", "--outdir", pyout, src)
	cmd.Env = append(os.Environ(), "SOURCE_DATE_EPOCH="+strconv.FormatInt(info.Time.Unix(), 10), "PYTHONHASHSEED=0", "TZ=UTC")
	if err := run(cmd); err != nil {
		return err
	}
	wheel := fmt.Sprintf("flowplane_analytics-%s-py3-none-any.whl", info.PyVersion)
	sdist := fmt.Sprintf("flowplane_analytics-%s.tar.gz", info.PyVersion)
	got, err := listFiles(pyout)
	if err != nil {
		return err
	}
	want := []string{sdist, wheel}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		return fmt.Errorf("python -m build wrote %q, want %q", got, want)
	}
	if err := copyFile(filepath.Join(pyout, wheel), filepath.Join(stage, wheel), 0o644); err != nil {
		return err
	}
	return rewriteTarGz(filepath.Join(pyout, sdist), filepath.Join(stage, sdist), info.Time)
}

// rewriteTarGz copies a gzipped tar as writeTarGz would have written it: entries sorted, one
// mtime, owner root, modes 0644 or 0755, no name or time in the gzip header.
func rewriteTarGz(from, to string, mtime time.Time) error {
	f, err := os.Open(from)
	if err != nil {
		return err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return err
	}
	tr := tar.NewReader(zr)
	all := map[string]entry{}
	var top string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		} else if err != nil {
			return fmt.Errorf("%s: %w", from, err)
		}
		name := strings.TrimSuffix(h.Name, "/")
		first, _, _ := strings.Cut(name, "/")
		if top == "" {
			top = first
		}
		if first != top || path.Clean(name) != name {
			return fmt.Errorf("%s: unexpected entry %q", from, h.Name)
		}
		mode := int64(0o644)
		if h.Mode&0o111 != 0 {
			mode = 0o755
		}
		switch h.Typeflag {
		case tar.TypeDir: // writeTarGz lists every directory
		case tar.TypeReg:
			data, err := io.ReadAll(tr)
			if err != nil {
				return err
			}
			if name == top {
				return fmt.Errorf("%s: a file at the top", from)
			}
			all[name] = entry{name: strings.TrimPrefix(name, top+"/"), mode: mode, data: data}
		default:
			return fmt.Errorf("%s: %q is of tar type %q, not a file or directory", from, h.Name, h.Typeflag)
		}
	}
	files := make([]entry, 0, len(all))
	for _, e := range all {
		files = append(files, e)
	}
	return writeTarGz(to, top, files, mtime)
}

// writeSums writes SHA256SUMS over every file in dir, as sha256sum does.
func writeSums(dir string) error {
	names, err := listFiles(dir)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	for _, n := range names {
		data, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			return err
		}
		fmt.Fprintf(&buf, "%x  %s\n", sha256.Sum256(data), n)
	}
	return os.WriteFile(filepath.Join(dir, "SHA256SUMS"), buf.Bytes(), 0o644)
}

// isReleaseFile tells whether a name is one a release directory holds.
func isReleaseFile(name string) bool {
	return name == "SHA256SUMS" || strings.HasPrefix(name, "flowplane_")
}

// replaceDir renames stage to out, removing a previous release at out first; a directory that
// holds anything else is left alone.
func replaceDir(stage, out string) error {
	ents, err := os.ReadDir(out)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return err
	default:
		for _, e := range ents {
			if !e.Type().IsRegular() || !isReleaseFile(e.Name()) {
				return fmt.Errorf("%s holds %s, which is not a release's file: not replacing it", out, e.Name())
			}
		}
		if err := os.RemoveAll(out); err != nil {
			return err
		}
	}
	return os.Rename(stage, out)
}

// listFiles returns the names of the files in dir, sorted.
func listFiles(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range ents {
		if e.Type().IsRegular() {
			names = append(names, e.Name())
		}
	}
	slices.Sort(names)
	return names, nil
}

func copyFile(from, to string, mode os.FileMode) error {
	data, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(to, data, mode); err != nil {
		return err
	}
	return os.Chmod(to, mode)
}

// output runs a command in dir and returns its stdout, trimmed.
func output(ctx context.Context, dir, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(string(out)), nil
}

// run runs a command, its output kept for the error.
func run(cmd *exec.Cmd) error {
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w\n%s", strings.Join(cmd.Args, " "), err, out)
	}
	return nil
}
