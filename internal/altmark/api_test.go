package altmark

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"
)

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

type apiClient struct {
	t     *testing.T
	url   string
	token string
}

func (c apiClient) do(method, path string, body []byte) (int, map[string]any) {
	c.t.Helper()
	req, _ := http.NewRequest(method, c.url+path, bytes.NewReader(body))
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var m map[string]any
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		if err := json.Unmarshal(data, &m); err != nil {
			c.t.Fatalf("%s %s: %v: %s", method, path, err, data)
		}
	} else {
		m = map[string]any{"text": string(data)}
	}
	return resp.StatusCode, m
}

func TestListenNeedsATokenOffLoopback(t *testing.T) {
	for _, tc := range []struct {
		addr, token string
		ok          bool
	}{
		{"127.0.0.1:9464", "", true},
		{"[::1]:9464", "", true},
		{"localhost:9464", "", true},
		{"0.0.0.0:9464", "", false},
		{":9464", "", false},
		{"198.18.0.1:9464", "", false},
		{"[fd00::1]:9464", "", false},
		{"198.18.0.1:9464", "0123456789abcdef", true},
		{"198.18.0.1:9464", "short", false},
		{"9464", "", false},
		{"127.0.0.1:99999", "", false},
		{"127.0.0.1:-1", "", false},
		{"127.0.0.1:0", "", true},
	} {
		if err := CheckListen(tc.addr, tc.token); (err == nil) != tc.ok {
			t.Errorf("CheckListen(%q, %q) = %v, want ok=%v", tc.addr, tc.token, err, tc.ok)
		}
	}
	// The token comes from a file or the environment, never the command line.
	f := filepath.Join(t.TempDir(), "token")
	os.WriteFile(f, []byte("  0123456789abcdef0123\n"), 0o600)
	if tok, err := ReadToken(f, func(string) string { return "env" }); err != nil || tok != "0123456789abcdef0123" {
		t.Errorf("token file: %q, %v", tok, err)
	}
	if tok, _ := ReadToken("", func(k string) string { return map[string]string{TokenEnv: "from-env"}[k] }); tok != "from-env" {
		t.Errorf("token env: %q", tok)
	}
}

func TestAPI(t *testing.T) {
	const c = 7_000_000
	cfg := testConfig(t, "")
	clock := newFakeClock(c*sec, (c+4)*sec+sec/4)
	r, _ := testRunner(t, cfg, clock)
	const token = "0123456789abcdef-token"
	srv := httptest.NewServer((&API{R: r, Token: token}).Handler())
	defer srv.Close()
	api := apiClient{t: t, url: srv.URL, token: token}

	// Without the token (or with another) nothing is answered.
	for _, tok := range []string{"", "wrong-token-wrong-token"} {
		if code, _ := (apiClient{t: t, url: srv.URL, token: tok}).do("GET", "/status", nil); code != http.StatusUnauthorized {
			t.Errorf("token %q: %d, want 401", tok, code)
		}
	}
	if code, body := api.do("GET", "/status", nil); code != 200 || body["state"] != "stopped" {
		t.Errorf("status %d %v", code, body)
	}

	// Bad input: 400 naming the field, the configuration unchanged.
	good := mustJSON(t, cfg)
	for _, tc := range []struct {
		body, field string
	}{
		{`{"interfaces": [`, ""},
		{`not json`, ""},
		{strings.Replace(string(good), `"direction":"both"`, `"direction":"up"`, 1), "interfaces[0].direction"},
		{strings.Replace(string(good), `"period":"1s"`, `"period":"1ns"`, 1), "period"},
		{strings.Replace(string(good), `"carrier":"dscp"`, `"carrier":7`, 1), "carrier"},
		{strings.Replace(string(good), `"nmax":1000`, `"nmax":1000,"nmx":3`, 1), "nmx"},
		{`[1, 2]`, ""},
	} {
		code, body := api.do("PUT", "/config", []byte(tc.body))
		if code != 400 {
			t.Errorf("PUT %s: %d, want 400", tc.body, code)
			continue
		}
		if tc.field != "" && body["field"] != tc.field {
			t.Errorf("PUT %s: field %v, want %s (%v)", tc.body, body["field"], tc.field, body["error"])
		}
		if tc.field == "" && body["error"] == "" {
			t.Errorf("PUT %s: no message", tc.body)
		}
	}
	if r.Config() != cfg {
		t.Error("a rejected PUT changed the configuration")
	}
	// A good PUT replaces it; GET gives it back.
	changed := strings.Replace(string(good), `"hash_bits":8`, `"hash_bits":4`, 1)
	if code, body := api.do("PUT", "/config", []byte(changed)); code != 200 || body["hash_bits"] != 4.0 {
		t.Fatalf("PUT: %d %v", code, body)
	}
	if code, body := api.do("GET", "/config", nil); code != 200 || body["hash_bits"] != 4.0 || body["period"] != "1s" {
		t.Errorf("GET /config: %d %v", code, body)
	}

	// Start, periods, stop.
	if code, body := api.do("POST", "/start", nil); code != 200 || body["state"] != "running" {
		t.Fatalf("start: %d %v", code, body)
	}
	if code, _ := api.do("POST", "/start", nil); code != http.StatusConflict {
		t.Errorf("second start: %d, want 409", code)
	}
	if code, _ := api.do("PUT", "/config", good); code != http.StatusConflict {
		t.Errorf("PUT while running: %d, want 409", code)
	}
	waitFor(t, func() bool { s := r.Status(); return s.LastPeriod != nil && *s.LastPeriod == c+2 })
	if code, body := api.do("POST", "/stop", nil); code != 200 || body["state"] != "stopped" || body["last_period"] != float64(c+3) {
		t.Errorf("stop: %d %v", code, body)
	}
	if code, _ := api.do("POST", "/stop", nil); code != http.StatusConflict {
		t.Errorf("second stop: %d, want 409", code)
	}
	code, body := api.do("GET", "/periods", nil)
	if got, _ := json.Marshal(body); code != 200 || string(got) != `{"periods":[7000001,7000002,7000003],"probe":"r1"}` {
		t.Errorf("periods: %d %s", code, got)
	}
	code, body = api.do("GET", "/periods/7000002", nil)
	if code != 200 || body["period"] != 7000002.0 || len(body["counters"].([]any)) != 3 || len(body["samples"].([]any)) != 7 {
		t.Errorf("period: %d %v", code, body)
	}
	if c0 := body["counters"].([]any)[0].(map[string]any); c0["hash_bits"] != 4.0 || c0["packets"] != float64(wantPackets(c+2, Point{"eth0", "in"})) {
		t.Errorf("counter %v", c0)
	}
	if code, body := api.do("GET", "/periods/soon", nil); code != 400 || body["field"] != "n" {
		t.Errorf("bad n: %d %v", code, body)
	}
	if code, _ := api.do("GET", "/periods/7000009", nil); code != 404 {
		t.Errorf("missing period: %d", code)
	}
	// No such route, or not this method: the JSON error object, as for every error.
	if code, body := api.do("GET", "/nosuch", nil); code != 404 || !strings.Contains(fmt.Sprint(body["error"]), "no /nosuch in this API") {
		t.Errorf("unknown path: %d %v", code, body)
	}
	if code, body := api.do("DELETE", "/config", nil); code != 405 || !strings.Contains(fmt.Sprint(body["error"]), "DELETE /config: not allowed; allowed: GET") {
		t.Errorf("unknown method: %d %v", code, body)
	}

	// Metrics and the OpenAPI document.
	_, body = api.do("GET", "/metrics", nil)
	for _, want := range []string{"flowplane_altmark_periods_written_total 3", `flowplane_altmark_packets_total{direction="in",ifname="eth0"}`, "flowplane_altmark_running 0"} {
		if !strings.Contains(body["text"].(string), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	code, body = api.do("GET", "/openapi.json", nil)
	if code != 200 || !strings.HasPrefix(body["openapi"].(string), "3.") {
		t.Errorf("openapi: %d %v", code, body["openapi"])
	}
	// Every route the mux serves is in the document.
	paths := body["paths"].(map[string]any)
	for _, p := range []string{"/config", "/start", "/stop", "/status", "/periods", "/periods/{n}", "/metrics", "/openapi.json"} {
		if paths[p] == nil {
			t.Errorf("openapi.json lacks %s", p)
		}
	}
}

// docs/altmark.md carries the same OpenAPI document the API serves.
func TestOpenAPIInDocs(t *testing.T) {
	doc, err := os.ReadFile("../../docs/altmark.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)<!-- openapi.json -->\n```json\n(.*?)```").FindSubmatch(doc)
	if m == nil {
		t.Fatal("docs/altmark.md has no ```json block after <!-- openapi.json -->")
	}
	var a, b any
	if err := json.Unmarshal(m[1], &a); err != nil {
		t.Fatal(err)
	}
	json.Unmarshal(openAPI, &b)
	if !bytes.Equal(mustJSON(t, a), mustJSON(t, b)) {
		t.Error("docs/altmark.md's OpenAPI document differs from internal/altmark/openapi.json; copy it over")
	}
}

// An interface the namespace lacks fails POST /start with 400 naming the field; nothing attaches.
func TestStartNamesAMissingInterface(t *testing.T) {
	cfg := testConfig(t, "")
	r, dps := testRunner(t, cfg, newFakeClock(sec, 1<<62))
	r.Check = (*Config).CheckInterfaces
	cfg.Interfaces = []Interface{{Name: "lo", Direction: "in"}, {Name: "fpnosuch0", Direction: "both"}}
	srv := httptest.NewServer((&API{R: r}).Handler())
	defer srv.Close()
	code, body := apiClient{t: t, url: srv.URL}.do("POST", "/start", nil)
	if code != 400 || body["field"] != "interfaces[1].name" || !strings.Contains(body["error"].(string), `no interface "fpnosuch0"`) {
		t.Errorf("start: %d %v", code, body)
	}
	if len(*dps) != 0 || r.Status().State != "stopped" {
		t.Error("the datapath was opened")
	}
}

// TestAPIUnderLoad: 50 clients, each on a connection of its own, ask for every read-only
// resource 10 times a second for 15 s while the probe records 100-ms periods: no error, and
// once the clients are gone the process holds no more file descriptors or goroutines than before.
// (bench/reliability's altmark-api part runs the same for 10 minutes against the command and
// reports its RSS and open files.)
func TestAPIUnderLoad(t *testing.T) {
	cfg := testConfig(t, "")
	cfg.Period = Duration(100 * time.Millisecond)
	r, _ := testRunner(t, cfg, nil)
	r.Clock = taiClock{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := apiServer(&API{R: r, Token: strings.Repeat("t", minTokenLen)})
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	fds, goroutines := openFDs(t), runtime.NumGoroutine()
	d := 15 * time.Second
	if testing.Short() {
		d = 2 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	res := Load{Base: "http://" + ln.Addr().String(), Token: strings.Repeat("t", minTokenLen), Clients: 50, Interval: 100 * time.Millisecond}.Run(ctx)
	st := r.Status()
	t.Logf("%d requests by %d clients in %v: %d errors, p50 %v, p99 %v, max %v; %d periods written, %d skipped",
		res.Requests, res.Clients, d, res.Errors, res.P50, res.P99, res.Max, st.PeriodsWritten, st.PeriodsSkipped)
	if res.Errors != 0 || res.Requests < 50 {
		t.Errorf("%d requests, %d errors; the first: %s", res.Requests, res.Errors, res.FirstError)
	}
	// The clients closed their connections: the server's ends close as they read EOF.
	deadline := time.Now().Add(10 * time.Second)
	for openFDs(t) > fds || runtime.NumGoroutine() > goroutines+2 {
		if time.Now().After(deadline) {
			t.Errorf("after the load: %d open files (%d before), %d goroutines (%d before)", openFDs(t), fds, runtime.NumGoroutine(), goroutines)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// openFDs counts the process's open file descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}
