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
	"github.com/spf13/pflag"

	"github.com/flowplane/flowplane/internal/cli"
	"github.com/flowplane/flowplane/internal/config"
)

// probeCommand is `flowplane altmark probe`: run.
func probeCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "probe",
		Short: "Count marked packets per period and color, sample them by hash, write period records",
	}
	// The old bare form `probe --config FILE [--listen ADDR] …`.
	var p probeRun
	p.flags(cmd)
	cmd.Flags().VisitAll(func(f *pflag.Flag) { f.Hidden = true })
	cli.Deprecates(cmd, probeLegacy, probeReplacement)
	cli.Object(cmd, func(cmd *cobra.Command, _ []string) error {
		cli.Notice(cmd, probeLegacy, probeReplacement)
		return p.run(cmd)
	})
	cmd.AddCommand(probeRunCommand())
	return cmd
}

const (
	probeLegacy      = "altmark probe --config FILE"
	probeReplacement = "altmark probe run --config FILE"
)

// probeRun is `probe run`'s flags and action.
type probeRun struct {
	cfgFile, listen, tokenFile string
	idle, exitWhenDone         bool
}

func (p *probeRun) flags(cmd *cobra.Command) {
	cli.ConfigFlag(cmd, &p.cfgFile, "probe configuration file (YAML; docs/altmark.md)", "", "")
	cmd.Flags().StringVar(&p.listen, "listen", "", "serve the REST API on this address, e.g. 127.0.0.1:9464")
	cmd.Flags().StringVar(&p.tokenFile, "token-file", "", "file holding the API's bearer token (else $"+TokenEnv+")")
	cmd.Flags().BoolVar(&p.idle, "idle", false, "with --listen: do not start measuring until POST /start")
	cmd.Flags().BoolVar(&p.exitWhenDone, "exit-when-done", false, "with --listen: exit once the configured periods are recorded")
}

func (p *probeRun) run(cmd *cobra.Command) error {
	if p.cfgFile == "" {
		return cli.Usagef("%s needs --config; usage: altmark probe run --config FILE [--listen ADDR] [--token-file F] [--idle] [--exit-when-done]", cmd.CommandPath())
	}
	cfg, err := LoadConfig(p.cfgFile)
	if err != nil {
		return cli.Usage(err)
	}
	cli.Warn(cmd, cfg.Warnings...)
	if p.idle && p.listen == "" {
		return cli.Usagef("--idle waits for POST /start, so it needs --listen")
	}
	if p.exitWhenDone && (p.listen == "" || cfg.Periods == 0) {
		return cli.Usagef("--exit-when-done is for --listen with periods: N in the configuration (without --listen the probe exits when its periods are recorded)")
	}
	token, err := ReadToken(p.tokenFile, os.Getenv)
	if err != nil {
		return cli.Usage(err)
	}
	if p.listen != "" {
		if err := CheckListen(p.listen, token); err != nil {
			return cli.Usage(err)
		}
	}
	// main cancels the context on SIGINT or SIGTERM; a second one ends the process.
	return runProbe(cmd.Context(), cfg, probeOptions{listen: p.listen, token: token, idle: p.idle, exitWhenDone: p.exitWhenDone, file: p.cfgFile}, OpenProbe, nil)
}

func probeRunCommand() *cobra.Command {
	var p probeRun
	cmd := &cobra.Command{
		Use:   "run --config FILE [--listen ADDR] [--token-file F] [--idle] [--exit-when-done]",
		Short: "Run the probe until its periods are recorded or it is interrupted",
		Long: `Attach the probe to the configured interfaces (tcx ingress/egress), read every
period's counters L/2 after it ends, and write them as Parquet and JSON Lines under data_dir
(docs/altmark-records.md), exporting them by IPFIX when configured. With --listen, serve the
REST API (docs/altmark.md); a non-loopback address needs a bearer token, read from
--token-file or $` + TokenEnv + `. Without --listen the probe exits when the configured
number of periods is recorded or it is interrupted; with --listen it keeps serving the
records (GET /status says "finished") until interrupted, or exits with --exit-when-done.
Nothing stays attached after it exits.`,
		Args: cli.ExactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error { return p.run(cmd) },
	}
	p.flags(cmd)
	return cmd
}

// probeOptions are the command's flags besides the configuration.
type probeOptions struct {
	listen, token      string
	file               string // the configuration's, named in the errors of the checks at start
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
		srv = apiServer(&API{R: r, Token: o.token})
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
				for i := range es {
					if es[i].File == startCheck {
						es[i].File = o.file
					}
				}
				return cli.Usage(es)
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

// apiServer serves the API. Connections idle for a minute are closed, so clients that went away
// without closing theirs do not hold file descriptors for long.
func apiServer(a *API) *http.Server {
	return &http.Server{Handler: a.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute}
}
