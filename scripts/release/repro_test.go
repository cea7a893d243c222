package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/flowplane/flowplane/internal/testenv"
)

// TestReproducible builds the release and compares it byte for byte with another build of the
// same commit: the dist/ that `make test` built just before ($FLOWPLANE_DIST), else a first
// build of its own. Each build runs in its own temporary directories, so a path, a time or an
// owner that leaked into a file would show.
func TestReproducible(t *testing.T) {
	root := checkout(t)
	if _, err := os.Stat(filepath.Join(root, "analytics/.venv/bin/python")); err != nil {
		testenv.Unavailable(t, "no analytics/.venv (%v): run make setup", err)
	}
	ctx := context.Background()
	start := time.Now()
	first, how := os.Getenv("FLOWPLANE_DIST"), "make release ($FLOWPLANE_DIST)"
	if first == "" {
		r, err := Run(ctx, Options{Out: filepath.Join(t.TempDir(), "a"), Root: root, Log: t.Logf})
		if err != nil {
			t.Fatal(err)
		}
		first, how = r.Dir, "a first build"
	}
	r, err := Run(ctx, Options{Out: filepath.Join(t.TempDir(), "b"), Root: root, Log: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	a, err := listFiles(first)
	if err != nil {
		t.Fatal(err)
	}
	b, err := listFiles(r.Dir)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(a, b) {
		t.Fatalf("%s holds %q, the new build %q (is %s this commit's release? make release)", first, a, b, first)
	}
	var report strings.Builder
	fmt.Fprintf(&report, "reproducible release (%s): %s and a second build in %.1fs:\n", r.Info.Version, how, time.Since(start).Seconds())
	for _, name := range a {
		x, err := os.ReadFile(filepath.Join(first, name))
		if err != nil {
			t.Fatal(err)
		}
		y, err := os.ReadFile(filepath.Join(r.Dir, name))
		if err != nil {
			t.Fatal(err)
		}
		same := "identical"
		if !bytes.Equal(x, y) {
			same = "DIFFERENT"
			t.Errorf("%s differs between the two builds (%d and %d bytes)", name, len(x), len(y))
		}
		sum := sha256.Sum256(x)
		fmt.Fprintf(&report, "  %-9s %10d  %x…  %s\n", same, len(x), sum[:8], name)
	}
	t.Log(report.String())
	appendLog(t, report.String())
}

func TestPyVersion(t *testing.T) {
	t.Parallel()
	for describe, want := range map[string]string{
		"v0.1.0":                         "0.1.0",
		"v0.1.0-dirty":                   "0.1.0+dirty",
		"v0.1.0-3-gabc1234":              "0.1.0.post3+gabc1234",
		"v0.1.0-3-gabc1234-dirty":        "0.1.0.post3+gabc1234.dirty",
		"v1.12.0-120-g0123456789ab":      "1.12.0.post120+g0123456789ab",
		"a358e00":                        "0.0.0+ga358e00",
		"a358e00-dirty":                  "0.0.0+ga358e00.dirty",
		"v0.2.0-rc.1":                    "0.2.0rc1",
		"v0.2.0-beta.2-4-gabc1234-dirty": "0.2.0b2.post4+gabc1234.dirty",
		"v0.2.0-alpha1":                  "0.2.0a1",
	} {
		if got, err := PyVersion(describe); err != nil || got != want {
			t.Errorf("PyVersion(%q) = %q, %v; want %q", describe, got, err, want)
		}
	}
	for _, bad := range []string{"devel", "0.1.0", "v0.1", "release-1", "v0.1.0-3-gabc1234-x", ""} {
		if got, err := PyVersion(bad); err == nil {
			t.Errorf("PyVersion(%q) = %q, want an error", bad, got)
		}
	}
}

func TestWriteTarGzIsAFunctionOfItsInput(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	files := []entry{{name: "b/c.1", mode: 0o644, data: []byte("c")}, {name: "a", mode: 0o755, data: []byte("a")}}
	mtime := time.Unix(1700000000, 0)
	for _, name := range []string{"x.tar.gz", "y.tar.gz"} {
		if err := writeTarGz(filepath.Join(dir, name), "top", files, mtime); err != nil {
			t.Fatal(err)
		}
		slices.Reverse(files)
	}
	x, _ := os.ReadFile(filepath.Join(dir, "x.tar.gz"))
	y, _ := os.ReadFile(filepath.Join(dir, "y.tar.gz"))
	if !bytes.Equal(x, y) {
		t.Fatal("the order of the files changed the archive")
	}
	// The sdist rewrite: the same archive again.
	if err := rewriteTarGz(filepath.Join(dir, "x.tar.gz"), filepath.Join(dir, "z.tar.gz"), mtime); err != nil {
		t.Fatal(err)
	}
	z, _ := os.ReadFile(filepath.Join(dir, "z.tar.gz"))
	if !bytes.Equal(x, z) {
		t.Fatal("rewriteTarGz changed a reproducible archive")
	}
	// gzip header: no name (FLG 0), mtime 0.
	if x[3] != 0 || !bytes.Equal(x[4:8], []byte{0, 0, 0, 0}) {
		t.Fatalf("gzip header % x: want no name and mtime 0", x[:10])
	}
}

func checkout(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Fatalf("not in a checkout: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// appendLog adds a test's report to $FLOWPLANE_RELEASE_LOG, if set: `make test` prints it (go
// test shows a passing package's logs only with -v).
func appendLog(t *testing.T, text string) {
	name := os.Getenv("FLOWPLANE_RELEASE_LOG")
	if name == "" {
		return
	}
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err == nil {
		_, err = f.WriteString(text)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		t.Error(err)
	}
}

// The man page and completion generators are linked into this program, never into the binary.
func TestBinaryLinksNoDocGenerators(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "github.com/flowplane/flowplane/cmd/flowplane").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, dep := range strings.Fields(string(out)) {
		if strings.HasPrefix(dep, "github.com/spf13/cobra/doc") || strings.Contains(dep, "go-md2man") || strings.Contains(dep, "blackfriday") {
			t.Errorf("cmd/flowplane links %s", dep)
		}
	}
}
