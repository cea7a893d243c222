package altmark

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/parquet-go/parquet-go"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/flowplane/flowplane/internal/testenv"
)

func testPeriod(n int64, samples int) *Period {
	dp := &memDatapath{spec: ProbeSpec{Points: []Point{{"eth0", "in"}, {"eth0", "out"}}, PeriodNs: sec, HashBits: 8}, nSamples: samples}
	cs, ss, _ := dp.Read(n)
	cfg := &Config{ProbeID: "r1", Period: Duration(time.Second), Carrier: "dscp", HashRef: 0x55}
	return (&Runner{}).record(cfg, n, cs, ss, nil)
}

func TestRecordFilesFollowTheContract(t *testing.T) {
	s := Store{Dir: t.TempDir(), Probe: "r1"}
	p := testPeriod(42, 3)
	if err := s.Write(p); err != nil {
		t.Fatal(err)
	}
	// The layout of docs/altmark-records.md.
	for _, f := range []string{"counters/probe=r1/period=42/part-0.parquet", "samples/probe=r1/period=42/part-0.parquet", "jsonl/r1/42.jsonl"} {
		if _, err := os.Stat(filepath.Join(s.Dir, f)); err != nil {
			t.Error(err)
		}
	}
	counters := readParquet[Counter](t, filepath.Join(s.Dir, "counters/probe=r1/period=42/part-0.parquet"))
	if !slices.Equal(counters, p.Counters) {
		t.Errorf("counters read back %+v\nwant %+v", counters, p.Counters)
	}
	samples := readParquet[Sample](t, filepath.Join(s.Dir, "samples/probe=r1/period=42/part-0.parquet"))
	if !slices.Equal(samples, p.Samples) {
		t.Errorf("samples read back differ")
	}
	// Column names and types are the contract's: the JSON names, int32/int64/string.
	checkColumns(t, filepath.Join(s.Dir, "counters/probe=r1/period=42/part-0.parquet"), Counter{})
	checkColumns(t, filepath.Join(s.Dir, "samples/probe=r1/period=42/part-0.parquet"), Sample{})
	// One JSON object on one line, equal to the period; the REST API returns the same.
	data, _ := os.ReadFile(filepath.Join(s.Dir, "jsonl/r1/42.jsonl"))
	if bytes.Count(data, []byte("\n")) != 1 || !bytes.HasSuffix(data, []byte("\n")) {
		t.Errorf("jsonl is not one line: %q", data)
	}
	got, err := s.Read(42)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := json.Marshal(got)
	b, _ := json.Marshal(p)
	if !bytes.Equal(a, b) {
		t.Errorf("read back %s\nwant %s", a, b)
	}
	// An empty period still has both tables (with zero rows) and "counters": [].
	if err := s.Write(&Period{Period: 43, Probe: "r1"}); err != nil {
		t.Fatal(err)
	}
	if rows := readParquet[Sample](t, filepath.Join(s.Dir, "samples/probe=r1/period=43/part-0.parquet")); len(rows) != 0 {
		t.Errorf("%d rows", len(rows))
	}
	line, _ := os.ReadFile(filepath.Join(s.Dir, "jsonl/r1/43.jsonl"))
	if !bytes.Contains(line, []byte(`"counters":[]`)) || !bytes.Contains(line, []byte(`"samples":[]`)) {
		t.Errorf("empty period: %s", line)
	}
	if ps, _ := s.Periods(); !slices.Equal(ps, []int64{42, 43}) {
		t.Errorf("periods %v", ps)
	}
}

func readParquet[T any](t *testing.T, path string) []T {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	rows, err := parquet.Read[T](f, st.Size())
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return rows
}

func checkColumns(t *testing.T, path string, row any) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	pf, err := parquet.OpenFile(f, st.Size())
	if err != nil {
		t.Fatal(err)
	}
	jsonNames := mustJSONKeys(row)
	var cols []string
	for _, fld := range pf.Schema().Fields() {
		cols = append(cols, fld.Name())
		kind := fld.Type().Kind().String()
		if kind != "INT32" && kind != "INT64" && kind != "BYTE_ARRAY" {
			t.Errorf("%s: column %s is %s", path, fld.Name(), kind)
		}
		if lt := fld.Type().LogicalType(); kind == "BYTE_ARRAY" && (lt == nil || !strings.Contains(strings.ToUpper(lt.String()), "STRING")) {
			t.Errorf("%s: column %s is not a string", path, fld.Name())
		}
	}
	if !slices.Equal(cols, jsonNames) {
		t.Errorf("%s: columns %v, want %v", path, cols, jsonNames)
	}
}

// mustJSONKeys lists the JSON keys of a struct in field order.
func mustJSONKeys(v any) []string {
	data, _ := json.Marshal(v)
	dec := json.NewDecoder(bytes.NewReader(data))
	var keys []string
	dec.Token()
	for dec.More() {
		k, _ := dec.Token()
		keys = append(keys, k.(string))
		var skip json.RawMessage
		dec.Decode(&skip)
	}
	return keys
}

func TestACrashBeforeARenameLeavesNoPeriod(t *testing.T) {
	s := Store{Dir: t.TempDir(), Probe: "r1"}
	for _, crashAt := range []string{"samples", "jsonl", "counters"} {
		n := int64(len(crashAt)) // a distinct period per case
		beforeRename = func(path string) error {
			if strings.Contains(path, crashAt) {
				return errors.New("crash")
			}
			return nil
		}
		err := s.Write(testPeriod(n, 2))
		beforeRename = func(string) error { return nil }
		if err == nil {
			t.Fatalf("%s: write did not fail", crashAt)
		}
		if _, err := os.Stat(s.countersPath(n)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("crash before renaming %s: counters file exists", crashAt)
		}
		if _, err := s.Read(n); !errors.Is(err, ErrNoPeriod) {
			t.Errorf("crash before renaming %s: read gives %v", crashAt, err)
		}
	}
	if ps, _ := s.Periods(); len(ps) != 0 {
		t.Errorf("periods %v after crashes", ps)
	}
	if tmp := tempFiles(t, s.Dir); len(tmp) != 3 {
		t.Errorf("temporary files %v, want the 3 the crashes left", tmp)
	}
	// A complete period beside them stays whole.
	if err := s.Write(testPeriod(1, 2)); err != nil {
		t.Fatal(err)
	}
	if err := s.RemoveIncomplete(); err != nil {
		t.Fatal(err)
	}
	if tmp := tempFiles(t, s.Dir); len(tmp) != 0 {
		t.Errorf("temporary files %v after RemoveIncomplete", tmp)
	}
	// The crash before the counters' rename had renamed the samples and JSON Lines files of
	// its period: they go too, with the period's directory.
	var files []string
	filepath.WalkDir(s.Dir, func(path string, d os.DirEntry, err error) error {
		if err == nil && (!d.IsDir() || strings.Contains(d.Name(), "period=")) {
			files = append(files, strings.TrimPrefix(path, s.Dir+"/"))
		}
		return nil
	})
	want := []string{"counters/probe=r1/period=1", "counters/probe=r1/period=1/part-0.parquet", "jsonl/r1/1.jsonl",
		"samples/probe=r1/period=1", "samples/probe=r1/period=1/part-0.parquet"}
	if !slices.Equal(files, want) {
		t.Errorf("after RemoveIncomplete: %v, want period 1's files only: %v", files, want)
	}
}

func tempFiles(t *testing.T, dir string) []string {
	var out []string
	filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(path, tmpSuffix) {
			out = append(out, path)
		}
		return nil
	})
	return out
}

// TestKilledWriterLeavesNoHalfFile kills a process writing records with SIGKILL at random
// moments: every file under a final name must be whole, and every listed period readable.
func TestKilledWriterLeavesNoHalfFile(t *testing.T) {
	if dir := os.Getenv("FP_ALTMARK_WRITER_DIR"); dir != "" {
		s := Store{Dir: dir, Probe: "r1"}
		for n := int64(0); ; n++ {
			if err := s.Write(testPeriod(n, 500)); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
		}
	}
	dir := t.TempDir()
	for i := range 5 {
		cmd := exec.Command(os.Args[0], "-test.run=^TestKilledWriterLeavesNoHalfFile$")
		cmd.Env = append(os.Environ(), "FP_ALTMARK_WRITER_DIR="+dir)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(50+37*i) * time.Millisecond)
		cmd.Process.Kill()
		cmd.Wait()
	}
	s := Store{Dir: dir, Probe: "r1"}
	ps, err := s.Periods()
	if err != nil || len(ps) == 0 {
		t.Fatalf("periods %v, %v: the writer wrote nothing", ps, err)
	}
	filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		switch {
		case err != nil || d.IsDir() || strings.HasSuffix(path, tmpSuffix):
		case strings.HasSuffix(path, ".parquet"):
			if strings.Contains(path, "/counters/") {
				readParquet[Counter](t, path)
			} else {
				readParquet[Sample](t, path)
			}
		case strings.HasSuffix(path, ".jsonl"):
			data, _ := os.ReadFile(path)
			var p Period
			if err := json.Unmarshal(data, &p); err != nil {
				t.Errorf("%s: %v", path, err)
			}
		default:
			t.Errorf("unexpected file %s", path)
		}
		return nil
	})
	for _, n := range ps {
		if p, err := s.Read(n); err != nil || len(p.Samples) != 2*500+1 {
			t.Errorf("period %d: %v", n, err)
		}
	}
	t.Logf("%d complete periods, %d temporary files left by kills", len(ps), len(tempFiles(t, dir)))
}

// TestFullDiskIsReportedAndRetried fills a small tmpfs: the failing writes are reported
// (status, metric, log), the periods are still read, no half file appears, and once there is
// room again the kept records are written, so the records have no gap.
func TestFullDiskIsReportedAndRetried(t *testing.T) {
	testenv.Privileged(t)
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=256k", "fpaltmarkfull", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", dir).Run() })
	const c = 5_000_000
	cfg := testConfig(t, "")
	cfg.DataDir = dir
	clock := newFakeClock(c*sec, (c+9)*sec)
	r, dps := testRunner(t, cfg, clock)
	r.Open = func(s ProbeSpec) (Datapath, error) {
		dp := &memDatapath{spec: s, nSamples: 300} // ~200 KB of JSON per period
		*dps = append(*dps, dp)
		return dp, nil
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { s := r.Status(); return s.WriteErrors >= 2 && s.PendingWrites >= 2 })
	// Counting goes on: every period up to the clock's limit is read (c+7 at (c+8.5)L), and
	// what is on disk meanwhile is whole periods only.
	waitFor(t, func() bool { return slices.Contains((*dps)[0].readList(), c+7) })
	checkWholeFiles(t, r.Store())
	st := r.Status()
	if !strings.Contains(st.LastError, "no space left on device") {
		t.Errorf("last error %q", st.LastError)
	}
	if v := testutil.ToFloat64(r.Metrics.WriteErrors); v < 2 {
		t.Errorf("write errors metric %v", v)
	}
	if v := testutil.ToFloat64(r.Metrics.PendingWrites); v < 1 {
		t.Errorf("pending metric %v", v)
	}
	written := st.PeriodsWritten
	// Room again: the kept records go out with the next period.
	if out, err := exec.Command("mount", "-o", "remount,size=64m", dir).CombinedOutput(); err != nil {
		t.Fatalf("remount: %v: %s", err, out)
	}
	clock.setLimit((c + 12) * sec)
	waitFor(t, func() bool {
		s := r.Status()
		return s.PendingWrites == 0 && s.LastPeriod != nil && *s.LastPeriod == c+10
	})
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	ps, _ := r.Store().Periods()
	var want []int64
	for n := int64(c + 1); n <= c+11; n++ {
		want = append(want, n)
	}
	if !slices.Equal(ps, want) {
		t.Errorf("periods %v, want %v (no gap)", ps, want)
	}
	if written >= int64(len(want)) {
		t.Errorf("the disk never filled (%d written before remount)", written)
	}
	for _, n := range ps {
		if _, err := r.Store().Read(n); err != nil {
			t.Error(err)
		}
		readParquet[Sample](t, r.Store().samplesPath(n))
		readParquet[Counter](t, r.Store().countersPath(n))
	}
	if s := r.Status(); s.PeriodsSkipped != 0 {
		t.Errorf("skipped %d", s.PeriodsSkipped)
	}
}
