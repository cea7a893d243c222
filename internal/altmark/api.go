package altmark

import (
	"crypto/subtle"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/flowplane/flowplane/internal/config"
)

// The REST API of `altmark probe run --listen` (docs/altmark.md "REST API", openapi.json).

//go:embed openapi.json
var openAPI []byte

// TokenEnv is the environment variable that may hold the API's bearer token.
const TokenEnv = "FLOWPLANE_ALTMARK_TOKEN"

// minTokenLen keeps guessable tokens out.
const minTokenLen = 16

// API serves the REST API over a runner.
type API struct {
	R     *Runner
	Token string // bearer token; empty: none required (loopback only, see CheckListen)
}

// apiError is the body of every error answer: the message and, for bad input, the field.
type apiError struct {
	Error  string       `json:"error"`
	Field  string       `json:"field,omitempty"`
	Errors []fieldError `json:"errors,omitempty"`
}

type fieldError struct {
	Field   string `json:"field"`
	Line    int    `json:"line,omitempty"`
	Message string `json:"message"`
}

// maxBody bounds a request body: a configuration is a few hundred bytes.
const maxBody = 1 << 20

// Handler is the API's routes behind the bearer-token check.
func (a *API) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /config", a.getConfig)
	mux.HandleFunc("PUT /config", a.putConfig)
	mux.HandleFunc("POST /start", a.start)
	mux.HandleFunc("POST /stop", a.stop)
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, http.StatusOK, a.R.Status()) })
	mux.HandleFunc("GET /periods", a.periods)
	mux.HandleFunc("GET /periods/{n}", a.period)
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.R.Metrics.Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /openapi.json", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write(openAPI)
	})
	routes := jsonMisses(mux)
	if a.Token == "" {
		return routes
	}
	want := []byte("Bearer " + a.Token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="flowplane altmark"`)
			writeJSON(w, http.StatusUnauthorized, apiError{Error: "missing or wrong bearer token (Authorization: Bearer TOKEN)"})
			return
		}
		routes.ServeHTTP(w, r)
	})
}

// jsonMisses answers what mux has no route for (404, or 405 with Allow) with the API's JSON
// error object, as every other error, where the mux writes plain text.
func jsonMisses(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h, pattern := mux.Handler(r)
		if pattern != "" {
			mux.ServeHTTP(w, r) // which sets the path's values
			return
		}
		miss := &statusOnly{header: http.Header{}}
		h.ServeHTTP(miss, r)
		msg := fmt.Sprintf("no %s in this API (GET /openapi.json lists it)", r.URL.Path)
		if allow := miss.header.Get("Allow"); miss.code == http.StatusMethodNotAllowed {
			w.Header().Set("Allow", allow)
			msg = fmt.Sprintf("%s %s: not allowed; allowed: %s", r.Method, r.URL.Path, allow)
		}
		writeJSON(w, miss.code, apiError{Error: msg})
	})
}

// statusOnly keeps what a handler answers but its body.
type statusOnly struct {
	header http.Header
	code   int
}

func (s *statusOnly) Header() http.Header         { return s.header }
func (s *statusOnly) Write(b []byte) (int, error) { return len(b), nil }
func (s *statusOnly) WriteHeader(code int)        { s.code = code }

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

// badInput answers 400 naming the field(s) of err (config.Errors) or the message alone.
func badInput(w http.ResponseWriter, err error) {
	body := apiError{Error: err.Error()}
	var es config.Errors
	if errors.As(err, &es) {
		for _, e := range es {
			body.Errors = append(body.Errors, fieldError{Field: e.Field, Line: e.Line, Message: e.Msg})
		}
		if len(es) > 0 {
			body.Field = es[0].Field
		}
	}
	writeJSON(w, http.StatusBadRequest, body)
}

func (a *API) getConfig(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, a.R.Config())
}

func (a *API) putConfig(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		badInput(w, fmt.Errorf("read the body: %w", err))
		return
	}
	if !json.Valid(body) {
		var v any
		err := json.Unmarshal(body, &v)
		badInput(w, fmt.Errorf("the body is not valid JSON: %v", err))
		return
	}
	// JSON is YAML: one decoder checks the file and the request alike.
	cfg, err := ParseConfig("request body", body)
	if err != nil {
		badInput(w, err)
		return
	}
	if err := a.R.SetConfig(cfg); err != nil {
		writeJSON(w, http.StatusConflict, apiError{Error: err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, cfg)
}

func (a *API) start(w http.ResponseWriter, _ *http.Request) {
	err := a.R.Start()
	var es config.Errors
	switch {
	case err == nil:
		writeJSON(w, http.StatusOK, a.R.Status())
	case errors.Is(err, ErrRunning):
		writeJSON(w, http.StatusConflict, apiError{Error: err.Error()})
	case errors.As(err, &es):
		badInput(w, err)
	default:
		writeJSON(w, http.StatusInternalServerError, apiError{Error: err.Error()})
	}
}

func (a *API) stop(w http.ResponseWriter, _ *http.Request) {
	if err := a.R.Stop(); err != nil {
		writeJSON(w, http.StatusConflict, apiError{Error: err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, a.R.Status())
}

func (a *API) periods(w http.ResponseWriter, _ *http.Request) {
	s := a.R.Store()
	ps, err := s.Periods()
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, apiError{Error: err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, struct {
		Probe   string  `json:"probe"`
		Periods []int64 `json:"periods"`
	}{s.Probe, ps})
}

func (a *API) period(w http.ResponseWriter, r *http.Request) {
	n, err := strconv.ParseInt(r.PathValue("n"), 10, 64)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, apiError{Error: fmt.Sprintf("%q is not a period number (floor(TAI / L))", r.PathValue("n")), Field: "n"})
		return
	}
	p, err := a.R.Store().Read(n)
	switch {
	case errors.Is(err, ErrNoPeriod):
		writeJSON(w, http.StatusNotFound, apiError{Error: err.Error()})
	case err != nil:
		writeJSON(w, http.StatusInternalServerError, apiError{Error: err.Error()})
	default:
		writeJSON(w, http.StatusOK, p)
	}
}

// CheckListen refuses a listen address that is not loopback when there is no token, and a
// token too short to resist guessing.
func CheckListen(addr, token string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--listen %q: want host:port, e.g. 127.0.0.1:9464", addr)
	}
	if _, err := net.LookupPort("tcp", port); err != nil {
		return fmt.Errorf("--listen %q: %q is not a port; give 1 to 65535 (0: any free one)", addr, port)
	}
	if token != "" && len(token) < minTokenLen {
		return fmt.Errorf("the bearer token has %d characters; use at least %d (e.g. openssl rand -hex 16)", len(token), minTokenLen)
	}
	if token == "" && !isLoopback(host) {
		return fmt.Errorf("--listen %s is not a loopback address: the API needs a bearer token, from --token-file FILE or $%s", addr, TokenEnv)
	}
	return nil
}

func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// ReadToken returns the token from file (if given) or the environment; surrounding white
// space is dropped.
func ReadToken(file string, getenv func(string) string) (string, error) {
	if file != "" {
		data, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("--token-file: %w", err)
		}
		t := strings.TrimSpace(string(data))
		if t == "" {
			return "", fmt.Errorf("--token-file %s is empty", file)
		}
		return t, nil
	}
	return strings.TrimSpace(getenv(TokenEnv)), nil
}
