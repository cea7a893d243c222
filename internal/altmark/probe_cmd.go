package altmark

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/flowplane/flowplane/internal/cli"
	"github.com/flowplane/flowplane/internal/config"
)

// probeCommand is `flowplane altmark probe`.
func probeCommand() *cobra.Command {
	var cfgFile, listen, tokenFile string
	var idle, exitWhenDone bool
	cmd := &cobra.Command{
		Use:   "probe --config FILE [--listen ADDR]",
		Short: "Count marked packets per period and color, sample them by hash, write period records",
		Long: `Attach the probe to the configured interfaces (tcx ingress/egress), read every
period's counters L/2 after it ends, and write them as Parquet and JSON Lines under data_dir
(docs/altmark-records.md), exporting them by IPFIX when configured. With --listen, serve the
REST API (docs/altmark.md); a non-loopback address needs a bearer token, read from
--token-file or $` + TokenEnv + `. Without --listen the probe exits when the configured
number of periods is recorded or it is interrupted; with --listen it keeps serving the
records (GET /status says "finished") until interrupted, or exits with --exit-when-done.`,
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
			if exitWhenDone && (listen == "" || cfg.Periods == 0) {
				return cli.Usagef("--exit-when-done is for --listen with periods: N in the configuration (without --listen the probe exits when its periods are recorded)")
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
			// main cancels the context on SIGINT or SIGTERM; a second one ends the process.
			return runProbe(cmd.Context(), cfg, probeOptions{listen: listen, token: token, idle: idle, exitWhenDone: exitWhenDone}, OpenProbe, nil)
		},
	}
	cmd.Flags().StringVar(&cfgFile, "config", "", "probe configuration file (YAML; docs/altmark.md)")
	cmd.Flags().StringVar(&listen, "listen", "", "serve the REST API on this address, e.g. 127.0.0.1:9464")
	cmd.Flags().StringVar(&tokenFile, "token-file", "", "file holding the API's bearer token (else $"+TokenEnv+")")
	cmd.Flags().BoolVar(&idle, "idle", false, "with --listen: do not start measuring until POST /start")
	cmd.Flags().BoolVar(&exitWhenDone, "exit-when-done", false, "with --listen: exit once the configured periods are recorded")
	return cmd
}

// probeOptions are the command's flags besides the configuration.
type probeOptions struct {
	listen, token      string
	idle, exitWhenDone bool
}

// runProbe runs the probe until ctx ends; without an API (or with exitWhenDone) also until its
// periods are recorded. listening, if not nil, is told the API's address.
func runProbe(ctx context.Context, cfg *Config, o probeOptions, open func(ProbeSpec) (Datapath, error), listening func(string)) error {
	r := NewRunner(cfg, open)
	r.Check = (*Config).CheckInterfaces
	finished := make(chan struct{}, 1)
	r.OnEnd = func(state string) {
		if state == "finished" {
			select {
			case finished <- struct{}{}:
			default:
			}
		}
	}
	var srv *http.Server
	srvErr := make(chan error, 1)
	if o.listen != "" {
		ln, err := net.Listen("tcp", o.listen)
		if err != nil {
			return fmt.Errorf("--listen: %w", err)
		}
		srv = &http.Server{Handler: (&API{R: r, Token: o.token}).Handler(), ReadHeaderTimeout: 10 * time.Second}
		go func() { srvErr <- srv.Serve(ln) }()
		slog.Info("altmark probe API", "listen", ln.Addr().String(), "token", o.token != "")
		if listening != nil {
			listening(ln.Addr().String())
		}
	}
	if !o.idle {
		if err := r.Start(); err != nil {
			var es config.Errors
			if errors.As(err, &es) {
				return cli.Usage(err)
			}
			return err
		}
	}
	var untilDone <-chan struct{}
	if srv == nil || o.exitWhenDone {
		untilDone = finished
	} else if cfg.Periods > 0 {
		go func() {
			<-finished
			slog.Info("altmark probe finished its periods; the API still serves the records (interrupt to exit, or --exit-when-done)")
		}()
	}
	select {
	case <-ctx.Done():
		if r.Status().State == "running" {
			slog.Info("altmark probe stopping: the period that has ended is still read (at most L/2); interrupt again to quit at once")
		}
	case <-untilDone:
	case err := <-srvErr:
		r.Stop()
		return fmt.Errorf("API server: %w", err)
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
