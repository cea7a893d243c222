package report

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// Bench is one section of docs/benchmarks.md: a program under bench/<Name>/.
type Bench struct {
	Name     string
	Title    string // the section's heading after the name
	About    string // what it measures, one sentence
	Doc      string // the subsystem's doc under docs/, with an anchor if any
	Duration string // how long `BENCH=<name> make bench` takes with the defaults, roughly
}

// Benches are the page's sections, in its order.
var Benches = []Bench{
	{"lab", "the loss program and HTB shaping",
		"TCP throughput over a veth link with the loss program at 0 % against a plain one, alternated, and TCP goodput over an HTB-shaped link against its rate.",
		"lab.md#tests-and-benchmark", "about 1 min"},
	{"lab-relay", "impaired links through the user-space relay",
		"One TCP flow through a relay with no delay against a plain veth link (with and without offloads), and through 10 ms and 50 ms links against the window-limited ideal, with the relay's CPU seconds per Gbit and the ping RTT of each link; the RTTs over a link with normal jitter against the configured distribution.",
		"lab.md#impaired-links-the-relay", "about 3 min"},
	{"conntrack", "XDP connection tracking against kernel forwarding and nftables",
		"TCP (1 and 8 flows) and 64-byte UDP forwarding in five configurations of one router, interleaved; the XDP cost of an established segment against a floor program; an established flow under a SYN flood.",
		"conntrack.md#benchmark", "about 9 min"},
	{"tune", "Brakmo's TCP-BPF experiment and connection setup",
		"Three senders through one HTB bottleneck with and without the tune policy, alternating per load; connection setup with 1,000 rules loaded against no program and a `return 1` program.",
		"tune.md", "about 2–3 min"},
	{"prio", "fairness, flow completion times and cost",
		"Schemes taking turns on one dumbbell lab: long-lived flows' fairness, web-search and data-mining flow completion times against fifo, and what the host writer and the classifier cost one flow.",
		"prio.md#experiments", "about 2 h 30 min"},
	{"prio-wan", "flow completion times at a data center's RTT",
		"prio's flow-completion-time experiment again with the links to the receivers delayed each way through the lab's relay (250 µs by default: a round trip of half a millisecond or more, against the lab's microseconds), web-search and data-mining workloads at 50 % and 80 % load, against fifo of the same run.",
		"prio.md#experiments", "about 40 min"},
	{"altmark", "the probe's cost, throughput and timestamps",
		"The probe's ns/packet against an empty tcx program (BPF_PROG_TEST_RUN), TCP and 64-byte forwarding through a router probed on both interfaces against the same router without, and timestamp agreement across one veth.",
		"altmark.md#benchmark", "about 2 min"},
	{"altmark-mark", "the marker's cost per packet",
		"Each marker configuration's ns/packet through BPF_PROG_TEST_RUN against an empty tcx program in the same run.",
		"altmark.md#cost-per-packet-benchmark", "a few seconds"},
	{"analytics", "DuckDB and Spark at scale",
		"Loss and delay over synthetic records of 102 measurement points × 1,000 periods at 10⁶ and 10⁷ samples (10⁸ with `BENCH_PACKETS=23,230,2300`), on DuckDB, on Spark local mode and on a 2-worker Spark standalone cluster, after compaction.",
		"altmark-analytics.md#benchmark", "about 3 min at the default sizes, 10 min with 10⁸, once the datasets exist; generating and compacting a dataset takes a few minutes"},
	{"collect", "collecting from many probes",
		"`flowplane-analytics collect` against 100 real probe processes, into a directory and into an S3-compatible server: records and rows per second and the collector's peak memory, then a second run that fetches nothing.",
		"altmark-analytics.md#collect", "about 5 min"},
	{"vnet", "the user-space network",
		"TCP goodput over one loopback UDP link and through a router, loss recovery against Linux TCP with the same loss, a 5 GB byte-exact transfer, 1,000 concurrent connections and RIP reconvergence.",
		"vnet.md", "about 1–2 min"},
	{"reliability", "hostile packets, faults and soak",
		"conntrack against nf_conntrack on random conversations, coverage-guided fuzzing of every BPF program through BPF_PROG_TEST_RUN, and the fault and soak runs: what each covered and what it found.",
		"conntrack.md", "about 1 h 30 min (DIFFTIME, FUZZTIME per target, API_LOAD_TIME, SOAK_TIME)"},
}

func benchByName(name string) (Bench, bool) {
	i := slices.IndexFunc(Benches, func(b Bench) bool { return b.Name == name })
	if i < 0 {
		return Bench{}, false
	}
	return Benches[i], true
}

// The page's parts: a generated preamble (header and setup), then one section per bench, each
// between a start marker, which carries the section's setup as JSON, and an end marker.
var (
	startMarker = regexp.MustCompile(`^<!-- bench:([a-z0-9-]+)(?: (\{.*\}))? -->$`)
	endMarker   = regexp.MustCompile(`^<!-- /bench:([a-z0-9-]+) -->$`)
)

// section is one bench's part of the page, from its start marker to its end marker.
type section struct {
	name  string
	setup *Setup // nil: not measured
	text  string // exactly as on the page, markers included, without a final newline
}

// parsePage splits a page into its sections (the preamble is dropped: it is regenerated).
func parsePage(page []byte) ([]section, error) {
	var secs []section
	var cur *section
	var buf []string
	for n, line := range strings.Split(string(page), "\n") {
		if cur == nil {
			m := startMarker.FindStringSubmatch(line)
			if m == nil {
				if endMarker.MatchString(line) {
					return nil, fmt.Errorf("line %d: %s without its start", n+1, line)
				}
				continue
			}
			cur = &section{name: m[1]}
			if m[2] != "" {
				cur.setup = &Setup{}
				if err := json.Unmarshal([]byte(m[2]), cur.setup); err != nil {
					return nil, fmt.Errorf("line %d: the setup of %s: %w", n+1, m[1], err)
				}
			}
			buf = []string{line}
			continue
		}
		buf = append(buf, line)
		if m := endMarker.FindStringSubmatch(line); m != nil {
			if m[1] != cur.name {
				return nil, fmt.Errorf("line %d: %s inside section %s", n+1, line, cur.name)
			}
			cur.text = strings.Join(buf, "\n")
			secs = append(secs, *cur)
			cur = nil
		} else if startMarker.MatchString(line) {
			return nil, fmt.Errorf("line %d: a section starts inside section %s", n+1, cur.name)
		}
	}
	if cur != nil {
		return nil, fmt.Errorf("section %s has no end marker", cur.name)
	}
	return secs, nil
}

// RenderPage returns the page: old (nil: none) with the sections of fresh rewritten, every
// other section kept byte for byte, sections no run has made saying how to make them, and the
// preamble regenerated over the setups of all measured sections.
func RenderPage(old []byte, fresh map[string]*Result) ([]byte, error) {
	oldSecs, err := parsePage(old)
	if err != nil {
		return nil, fmt.Errorf("the current page: %w", err)
	}
	have := map[string]section{}
	var unknown []section // sections of benches no longer in Benches: kept, at the end
	for _, s := range oldSecs {
		if _, dup := have[s.name]; dup {
			return nil, fmt.Errorf("the current page: section %s appears twice", s.name)
		}
		have[s.name] = s
		if _, ok := benchByName(s.name); !ok {
			unknown = append(unknown, s)
		}
	}
	for name, r := range fresh {
		b, ok := benchByName(name)
		if !ok {
			return nil, fmt.Errorf("%s: no such bench (known: %s)", name, benchNames())
		}
		have[name] = renderSection(b, r)
	}
	var secs []section
	for _, b := range Benches {
		s, ok := have[b.Name]
		if !ok {
			s = placeholder(b)
		}
		secs = append(secs, s)
	}
	secs = append(secs, unknown...)
	var w bytes.Buffer
	preamble(&w, secs)
	for i, s := range secs {
		if i > 0 {
			w.WriteString("\n")
		}
		w.WriteString(s.text + "\n")
	}
	return w.Bytes(), nil
}

func benchNames() string {
	var n []string
	for _, b := range Benches {
		n = append(n, b.Name)
	}
	return strings.Join(n, ", ")
}

func preamble(w *bytes.Buffer, secs []section) {
	w.WriteString("# Benchmarks\n\n")
	w.WriteString("<!-- Generated by `make bench` (bench/report/cmd/benchpage) from bench/results/*.json: do not edit this file. -->\n\n")
	w.WriteString("Generated by `make bench` from the results the benchmarks write: do not edit this page, run the benchmarks " +
		"(`make bench` for all of them, `BENCH=name make bench` for one section; the others are kept as they are). " +
		"Every section says which commit and date it was measured at and how to measure it again. " +
		"The benchmarks compare against baselines measured in the same run (ratios) on a machine that may be shared with " +
		"other work: compare ratios, not absolute figures across sections or runs. " +
		"Each goal comes from the subsystem's documentation; met or not met is computed by the benchmark from its measured value.\n\n")
	w.WriteString("## Setup\n\n")
	var measured []section
	for _, s := range secs {
		if s.setup != nil {
			measured = append(measured, s)
		}
	}
	if len(measured) == 0 {
		w.WriteString("No section has been measured yet.\n\n")
		return
	}
	// Each field once; where sections differ, every value with the sections it holds for.
	field := func(label string, get func(Setup) string) {
		var vals []string
		by := map[string][]string{}
		for _, s := range measured {
			v := get(*s.setup)
			if _, ok := by[v]; !ok {
				vals = append(vals, v)
			}
			by[v] = append(by[v], s.name)
		}
		if len(vals) == 1 {
			fmt.Fprintf(w, "- **%s**: %s\n", label, vals[0])
			return
		}
		var parts []string
		for _, v := range vals {
			parts = append(parts, fmt.Sprintf("%s (%s)", v, strings.Join(by[v], ", ")))
		}
		fmt.Fprintf(w, "- **%s**: %s\n", label, strings.Join(parts, "; "))
	}
	field("Kernel", func(s Setup) string { return s.Kernel })
	field("CPU", func(s Setup) string { return s.CPU })
	field("Cores", func(s Setup) string { return fmt.Sprint(s.Cores) })
	field("Memory", func(s Setup) string { return s.Memory })
	field("Go", func(s Setup) string { return s.Go })
	field("Commit", func(s Setup) string { return s.Commit })
	field("Date (UTC)", func(s Setup) string { return s.Date })
	w.WriteString("\n")
}

func howTo(b Bench) string {
	return fmt.Sprintf("`BENCH=%s make bench` (%s)", b.Name, b.Duration)
}

// heading is a section's title: the bench's name alone, so that other pages link to
// benchmarks.md#NAME, then what it measures.
func heading(b Bench) string {
	return fmt.Sprintf("## %s\n\n**%s.**\n\n", b.Name, upperFirst(b.Title))
}

func upperFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

func about(b Bench) string {
	return fmt.Sprintf("%s Source: `bench/%s/`; details: [docs/%s](%s).", b.About, b.Name, strings.SplitN(b.Doc, "#", 2)[0], b.Doc)
}

func placeholder(b Bench) section {
	var w strings.Builder
	fmt.Fprintf(&w, "<!-- bench:%s -->\n", b.Name)
	fmt.Fprint(&w, heading(b))
	fmt.Fprintf(&w, "%s\n\n", about(b))
	fmt.Fprintf(&w, "Not measured yet: %s makes this section.\n", howTo(b))
	fmt.Fprintf(&w, "<!-- /bench:%s -->", b.Name)
	return section{name: b.Name, text: w.String()}
}

// plotFile is where the page keeps a bench's plot, relative to docs/.
func plotFile(name, file string) string {
	return path.Join("img", "bench", name, path.Base(file))
}

func renderSection(b Bench, r *Result) section {
	setup := r.Setup
	js, _ := json.Marshal(setup) // escapes < and >: never ends the comment
	var w bytes.Buffer
	fmt.Fprintf(&w, "<!-- bench:%s %s -->\n", b.Name, js)
	fmt.Fprint(&w, heading(b))
	fmt.Fprintf(&w, "%s\n\n", about(b))
	if setup.Args == "" {
		fmt.Fprintf(&w, "Measured %s at commit %s; %s measures it again.", setup.Date, setup.Commit, howTo(b))
	} else {
		fmt.Fprintf(&w, "Measured %s at commit %s with `%s` (the defaults otherwise); "+
			"`BENCH=%s BENCH_ARGS='%s' make bench` measures it again, %s with every default.",
			setup.Date, setup.Commit, setup.Args, b.Name, setup.Args, howTo(b))
	}
	var met, judged, total int
	var missed []string
	for _, t := range r.Tables {
		for i := range t.Rows {
			for _, g := range t.RowGoals(i) {
				total++
				if g.Met == nil {
					continue
				}
				judged++
				if *g.Met {
					met++
				} else {
					label := ""
					if len(t.Rows[i]) > 0 {
						label = t.Rows[i][0] + ": "
					}
					missed = append(missed, fmt.Sprintf("%s%s %s (%s)", label, g.Metric, g.Target, g.Value))
				}
			}
		}
	}
	switch {
	case total == 0:
		w.WriteString(" No goal is stated for these figures.\n")
	default:
		fmt.Fprintf(&w, " **Goals met: %d of %d**", met, total)
		if judged < total {
			fmt.Fprintf(&w, " (%d not judged)", total-judged)
		}
		w.WriteString(".")
		if len(missed) > 0 {
			w.WriteString(" Not met: " + strings.Join(missed, "; ") + ".")
		}
		w.WriteString("\n")
	}
	for _, t := range r.Tables {
		t.markdown(&w, func(file string) string { return plotFile(b.Name, file) })
	}
	fmt.Fprintf(&w, "<!-- /bench:%s -->", b.Name)
	return section{name: b.Name, setup: &setup, text: w.String()}
}

// Generate rewrites <root>/docs/benchmarks.md with the sections of names from
// <root>/bench/results/<name>.json (names empty: every bench with a results file), copying
// their plots to docs/img/bench/<name>/ (replacing what was there) and keeping every other
// section as it is.
func Generate(root string, names []string) error {
	results := filepath.Join(root, "bench", "results")
	if len(names) == 0 {
		for _, b := range Benches {
			if _, err := os.Stat(filepath.Join(results, b.Name+".json")); err == nil {
				names = append(names, b.Name)
			}
		}
	}
	fresh := map[string]*Result{}
	for _, name := range names {
		if _, ok := benchByName(name); !ok {
			return fmt.Errorf("%s: no such bench (known: %s)", name, benchNames())
		}
		data, err := os.ReadFile(filepath.Join(results, name+".json"))
		if err != nil {
			return err
		}
		r := &Result{}
		if err := json.Unmarshal(data, r); err != nil {
			return fmt.Errorf("%s.json: %w", name, err)
		}
		fresh[name] = r
	}
	pagePath := filepath.Join(root, "docs", "benchmarks.md")
	old, err := os.ReadFile(pagePath)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	page, err := RenderPage(old, fresh)
	if err != nil {
		return err
	}
	for name, r := range fresh {
		dir := filepath.Join(root, "docs", "img", "bench", name)
		if err := os.RemoveAll(dir); err != nil {
			return err
		}
		for _, t := range r.Tables {
			for _, p := range t.Plots {
				img, err := os.ReadFile(filepath.Join(results, filepath.FromSlash(p.File)))
				if err != nil {
					return fmt.Errorf("%s: plot: %w", name, err)
				}
				if err := os.MkdirAll(dir, 0o755); err != nil {
					return err
				}
				if err := os.WriteFile(filepath.Join(root, "docs", filepath.FromSlash(plotFile(name, p.File))), img, 0o644); err != nil {
					return err
				}
			}
		}
	}
	return os.WriteFile(pagePath, page, 0o644)
}
