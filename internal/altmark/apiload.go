package altmark

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"
)

// The API's load test (the CI test and bench/reliability's altmark-api part): clients, each
// with a connection of its own, ask for every read-only resource in turn.

// LoadResult is what a load run saw.
type LoadResult struct {
	Clients    int
	Requests   int64
	Errors     int64  // transport errors and answers other than 200
	FirstError string `json:",omitempty"`
	P50, P99   time.Duration
	Max        time.Duration
}

// loadPaths are the resources asked for in turn; "" stands for the latest period's record.
var loadPaths = []string{"/status", "/periods", "", "/metrics", "/config"}

// maxLatencies bounds the latencies kept for the percentiles (a uniform sample of them all).
const maxLatencies = 100_000

// Load is a load run against the API.
type Load struct {
	Base     string        // http://host:port
	Token    string        // sent as the bearer token when set
	Clients  int           // each with a connection of its own
	Interval time.Duration // between one client's requests
	// Dial, when set, opens the clients' connections (another network namespace).
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// Run sends the requests until ctx ends, and closes the clients' connections before it returns.
func (ld Load) Run(ctx context.Context) LoadResult {
	var (
		mu   sync.Mutex
		res  = LoadResult{Clients: ld.Clients}
		lats []time.Duration
		seen int64
	)
	note := func(d time.Duration, err error) {
		mu.Lock()
		defer mu.Unlock()
		res.Requests++
		if err != nil {
			res.Errors++
			if res.FirstError == "" {
				res.FirstError = err.Error()
			}
			return
		}
		res.Max = max(res.Max, d)
		seen++
		if len(lats) < maxLatencies {
			lats = append(lats, d)
		} else if i := rand.Int64N(seen); i < maxLatencies {
			lats[i] = d
		}
	}
	var wg sync.WaitGroup
	for c := range ld.Clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tr := &http.Transport{MaxIdleConnsPerHost: 1, DialContext: ld.Dial}
			defer tr.CloseIdleConnections()
			cl := &http.Client{Transport: tr, Timeout: 30 * time.Second}
			tick := time.NewTicker(ld.Interval)
			defer tick.Stop()
			latest := ""
			for i := c; ; i++ {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				path := loadPaths[i%len(loadPaths)]
				if path == "" {
					if latest == "" {
						continue
					}
					path = "/periods/" + latest
				}
				start := time.Now()
				body, err := APIGet(ctx, cl, ld.Base+path, ld.Token)
				if ctx.Err() != nil {
					return
				}
				note(time.Since(start), err)
				if err == nil && path == "/periods" {
					var ps struct{ Periods []int64 }
					if err := json.Unmarshal(body, &ps); err == nil && len(ps.Periods) > 0 {
						latest = fmt.Sprint(ps.Periods[len(ps.Periods)-1])
					}
				}
			}
		}()
	}
	wg.Wait()
	slices.Sort(lats)
	if n := len(lats); n > 0 {
		res.P50, res.P99 = lats[(n-1)/2], lats[(n-1)*99/100]
	}
	return res
}

// APIGet is GET url with the bearer token (if any): the body of a 200 answer, else an error
// naming the status.
func APIGet(ctx context.Context, cl *http.Client, url, token string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := cl.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s: %.200s", url, resp.Status, body)
	}
	return body, nil
}
