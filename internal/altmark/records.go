package altmark

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/parquet-go/parquet-go"
)

// Store is one probe's period records under a data directory, laid out as
// docs/altmark-records.md says. Every file is written to a temporary name in its final
// directory, synced and renamed, the counters file last: a period is complete when its
// counters file exists, and a crash leaves at most a temporary file, never a half record.
type Store struct {
	Dir   string
	Probe string
}

const (
	partFile  = "part-0.parquet"
	tmpSuffix = ".tmp"
)

func (s Store) countersPath(n int64) string {
	return filepath.Join(s.Dir, "counters", "probe="+s.Probe, "period="+strconv.FormatInt(n, 10), partFile)
}

func (s Store) samplesPath(n int64) string {
	return filepath.Join(s.Dir, "samples", "probe="+s.Probe, "period="+strconv.FormatInt(n, 10), partFile)
}

func (s Store) jsonlPath(n int64) string {
	return filepath.Join(s.Dir, "jsonl", s.Probe, strconv.FormatInt(n, 10)+".jsonl")
}

// beforeRename is called with each final path just before its temporary file is renamed to
// it; tests make it fail to stand for a crash between the two.
var beforeRename = func(string) error { return nil }

// Write stores period p: samples, then JSON Lines, then counters.
func (s Store) Write(p *Period) error {
	if p.Counters == nil {
		p.Counters = []Counter{}
	}
	if p.Samples == nil {
		p.Samples = []Sample{}
	}
	var samples, counters bytes.Buffer
	if err := writeParquet(&samples, p.Samples); err != nil {
		return fmt.Errorf("period %d: encode samples: %w", p.Period, err)
	}
	if err := writeParquet(&counters, p.Counters); err != nil {
		return fmt.Errorf("period %d: encode counters: %w", p.Period, err)
	}
	line, err := json.Marshal(p)
	if err != nil {
		return fmt.Errorf("period %d: encode JSON: %w", p.Period, err)
	}
	for _, f := range []struct {
		path string
		data []byte
	}{
		{s.samplesPath(p.Period), samples.Bytes()},
		{s.jsonlPath(p.Period), append(line, '\n')},
		{s.countersPath(p.Period), counters.Bytes()}, // last: it makes the period complete
	} {
		if err := writeAtomic(f.path, f.data); err != nil {
			return fmt.Errorf("period %d: %w", p.Period, err)
		}
	}
	return nil
}

func writeParquet[T any](w *bytes.Buffer, rows []T) error {
	pw := parquet.NewGenericWriter[T](w, parquet.Compression(&parquet.Snappy))
	if _, err := pw.Write(rows); err != nil {
		return err
	}
	return pw.Close()
}

// writeAtomic writes data to a temporary file beside path, syncs it, renames it to path and
// syncs the directory, so path holds either nothing or all of data.
func writeAtomic(path string, data []byte) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	// The leading dot and trailing suffix keep readers' *.parquet globs off the temporary file.
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*"+tmpSuffix)
	if err != nil {
		return fmt.Errorf("create temporary file in %s: %w", dir, err)
	}
	tmp := f.Name()
	fail := func(err error) error {
		f.Close()
		os.Remove(tmp)
		return err
	}
	if _, err := f.Write(data); err != nil {
		return fail(fmt.Errorf("write %s: %w", tmp, err))
	}
	if err := f.Sync(); err != nil {
		return fail(fmt.Errorf("sync %s: %w", tmp, err))
	}
	if err := f.Close(); err != nil {
		return fail(fmt.Errorf("close %s: %w", tmp, err))
	}
	if err := beforeRename(path); err != nil {
		return err // a crash: the temporary file stays, as it would
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("rename %s: %w", tmp, err)
	}
	if d, err := os.Open(dir); err == nil {
		err = d.Sync()
		d.Close()
		if err != nil {
			return fmt.Errorf("sync %s: %w", dir, err)
		}
	}
	return nil
}

// Periods lists the complete periods of the probe, in order.
func (s Store) Periods() ([]int64, error) {
	base := filepath.Join(s.Dir, "counters", "probe="+s.Probe)
	entries, err := os.ReadDir(base)
	if errors.Is(err, fs.ErrNotExist) {
		return []int64{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list periods: %w", err)
	}
	out := []int64{}
	for _, e := range entries {
		v, ok := strings.CutPrefix(e.Name(), "period=")
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			continue
		}
		if _, err := os.Stat(s.countersPath(n)); err == nil {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out, nil
}

// Last is the latest complete period, if any.
func (s Store) Last() (int64, bool, error) {
	ps, err := s.Periods()
	if err != nil || len(ps) == 0 {
		return 0, false, err
	}
	return ps[len(ps)-1], true, nil
}

// ErrNoPeriod is Read's error for a period the store does not hold complete.
var ErrNoPeriod = errors.New("no such period")

// Read returns complete period n as written.
func (s Store) Read(n int64) (*Period, error) {
	if _, err := os.Stat(s.countersPath(n)); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("period %d: %w", n, ErrNoPeriod)
		}
		return nil, err
	}
	data, err := os.ReadFile(s.jsonlPath(n))
	if err != nil {
		return nil, fmt.Errorf("period %d: %w", n, err)
	}
	var p Period
	if err := json.Unmarshal(data, &p); err != nil {
		return nil, fmt.Errorf("period %d: %s: %w", n, s.jsonlPath(n), err)
	}
	return &p, nil
}

// PeriodNs is the period length complete period n was recorded with, from its counters file
// (a few rows; the JSON Lines file holds the samples too).
func (s Store) PeriodNs(n int64) (int64, error) {
	rows, err := parquet.ReadFile[Counter](s.countersPath(n))
	if err != nil {
		return 0, fmt.Errorf("period %d: %w", n, err)
	}
	if len(rows) == 0 {
		return 0, fmt.Errorf("period %d: %s has no row", n, s.countersPath(n))
	}
	return rows[0].PeriodNs, nil
}

// RemoveIncomplete deletes what an interrupted write left in the probe's directories: temporary
// files, and the samples and JSON Lines files of periods without a counters file (written
// first, their period was never completed), so no reader finds part of a period.
func (s Store) RemoveIncomplete() error {
	var errs []error
	for _, root := range []string{
		filepath.Join(s.Dir, "counters", "probe="+s.Probe),
		filepath.Join(s.Dir, "samples", "probe="+s.Probe),
		filepath.Join(s.Dir, "jsonl", s.Probe),
	} {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil
				}
				return err
			}
			if d.IsDir() {
				return nil
			}
			n, ok := s.periodOf(path)
			tmp := strings.HasPrefix(d.Name(), ".") && strings.HasSuffix(d.Name(), tmpSuffix)
			if !tmp && !ok {
				return nil
			}
			if !tmp {
				if _, err := os.Stat(s.countersPath(n)); !errors.Is(err, fs.ErrNotExist) {
					return err // complete, or unknown
				}
			}
			if err := os.Remove(path); err != nil {
				return err
			}
			if dir := filepath.Dir(path); strings.HasPrefix(filepath.Base(dir), "period=") {
				_ = os.Remove(dir) // the period's directory, if that emptied it
			}
			return nil
		})
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// periodOf is the period of a samples or JSON Lines file of the store, by its path.
func (s Store) periodOf(path string) (int64, bool) {
	var v string
	switch filepath.Base(path) {
	case partFile:
		v, _ = strings.CutPrefix(filepath.Base(filepath.Dir(path)), "period=")
	default:
		v, _ = strings.CutSuffix(filepath.Base(path), ".jsonl")
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, false
	}
	return n, path == s.samplesPath(n) || path == s.jsonlPath(n)
}
