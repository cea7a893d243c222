package altmark

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/flowplane/flowplane/internal/cli"
	"github.com/flowplane/flowplane/internal/config"
)

// probeCommand is `flowplane altmark probe`.
func probeCommand() *cobra.Command {
	var cfgFile, listen, tokenFile string
	var idle bool
	cmd := &cobra.Command{
		Use:   "probe --config FILE [--listen ADDR]",
		Short: "Count marked packets per period and color, sample them by hash, write period records",
		Long: `Attach the probe to the configured interfaces (tcx ingress/egress), read every
period's counters L/2 after it ends, and write them as Parquet and JSON Lines under data_dir
(docs/altmark-records.md), exporting them by IPFIX when configured. With --listen, serve the
REST API (docs/altmark.md); a non-loopback address needs a bearer token, read from
--token-file or $` + TokenEnv + `. Without --listen the probe runs until the configured
number of periods is recorded or it is interrupted.`,
		Args: cli.ExactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfgFile == "" {
				return cli.Usagef("altmark probe: --config FILE is required")
			}
			cfg, err := LoadConfig(cfgFile)
			if err != nil {
				return cli.Usage(err)
			}
			if idle && listen == "" {
				return cli.Usagef("--idle waits for POST /start, so it needs --listen")
			}
			token, err := ReadToken(tokenFile, os.Getenv)
			if err != nil {
				return cli.Usage(err)
			}
			if listen != "" {
				if err := CheckListen(listen, token); err != nil {
					return cli.Usage(err)
				}
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			// Once interrupted, a second interrupt ends the process at once (default handling)
			// instead of waiting for the period being finished.
			context.AfterFunc(ctx, stop)
			return runProbe(ctx, cfg, listen, token, idle, OpenProbe, nil)
		},
	}
	cmd.Flags().StringVar(&cfgFile, "config", "", "probe configuration file (YAML; docs/altmark.md)")
	cmd.Flags().StringVar(&listen, "listen", "", "serve the REST API on this address, e.g. 127.0.0.1:9464")
	cmd.Flags().StringVar(&tokenFile, "token-file", "", "file holding the API's bearer token (else $"+TokenEnv+")")
	cmd.Flags().BoolVar(&idle, "idle", false, "with --listen: do not start measuring until POST /start")
	return cmd
}

// runProbe runs the probe until ctx ends (or, without an API, until its periods are recorded).
// listening, if not nil, is told the API's address.
func runProbe(ctx context.Context, cfg *Config, listen, token string, idle bool, open func(ProbeSpec) (Datapath, error), listening func(string)) error {
	r := NewRunner(cfg, open)
	r.Check = (*Config).CheckInterfaces
	var srv *http.Server
	srvErr := make(chan error, 1)
	if listen != "" {
		ln, err := net.Listen("tcp", listen)
		if err != nil {
			return fmt.Errorf("--listen: %w", err)
		}
		srv = &http.Server{Handler: (&API{R: r, Token: token}).Handler(), ReadHeaderTimeout: 10 * time.Second}
		go func() { srvErr <- srv.Serve(ln) }()
		slog.Info("altmark probe API", "listen", ln.Addr().String(), "token", token != "")
		if listening != nil {
			listening(ln.Addr().String())
		}
	}
	if !idle {
		if err := r.Start(); err != nil {
			var es config.Errors
			if errors.As(err, &es) {
				return cli.Usage(err)
			}
			return err
		}
	}
	done := r.Done()
	if srv == nil {
		select {
		case <-ctx.Done():
		case <-done:
		}
	} else {
		select {
		case <-ctx.Done():
		case err := <-srvErr:
			r.Stop()
			return fmt.Errorf("API server: %w", err)
		}
	}
	if ctx.Err() != nil {
		slog.Info("altmark probe stopping: the period that has ended is still read (at most L/2); interrupt again to quit at once")
	}
	if err := r.Stop(); err != nil && !errors.Is(err, ErrNotRunning) {
		return err
	}
	if srv != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}
	if s := r.Status(); s.LastError != "" {
		return fmt.Errorf("altmark probe: %d periods written, %d skipped; last error: %s", s.PeriodsWritten, s.PeriodsSkipped, s.LastError)
	}
	return nil
}
