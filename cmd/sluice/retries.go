package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sluice-go/sluice/cmd/sluice/internal/retryview"
	"github.com/sluice-go/sluice/policy"
)

// Names the tests and the help texts share with package retryview.
const (
	defaultServiceURL = retryview.DefaultServiceURL
	retriesPath       = retryview.RetriesPath
	policyPath        = retryview.PolicyPath
	promOutcomes      = retryview.PromOutcomes
	promRecovery      = retryview.PromRecovery
	sourceService     = retryview.SourceService
	sourcePrometheus  = retryview.SourcePrometheus
)

// serviceTimeout bounds a request to the service or to Prometheus.
const serviceTimeout = retryview.Timeout

const retriesAbout = `Prints, per handler and error type, how the messages that failed ended over
the statistics' window: messages failed, retries spent, recovered (count, share of
those that ended, median recovery attempt), exhausted, permanent, retry_unlikely,
and what the learned retry policy makes of the type now, when the service has one.

Source: Prometheus when PROMETHEUS_URL is set (` + promOutcomes + ` and
sluice_retry_recovery_attempt over --window), else the running service's endpoint
SLUICE_SERVICE_URL` + retriesPath + ` (SLUICE_SERVICE_URL defaults to ` + defaultServiceURL + `:
the service's METRICS_ADDR). The output says which it read.`

// retriesReport is what sluice retries prints with --json.
type retriesReport = retryview.Retries

func runRetries(ctx context.Context, e *env, args []string) error {
	fs := flag.NewFlagSet("sluice retries", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	handler := fs.String("handler", "", "show handler `H` only")
	asJSON := fs.Bool("json", false, "print JSON")
	window := fs.Duration("window", time.Hour, "with PROMETHEUS_URL: count over the last `D`")
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintf(w, "Usage: sluice retries [--handler H] [--json] [--window D]\n\n%s\n\nFlags:\n", retriesAbout)
		printFlags(w, fs, nil)
		fmt.Fprintln(w, "\nExit codes: 0 ok, 1 service or Prometheus unreachable or failing, 2 usage error.")
	}
	pos, err := parseInterleaved(e, fs, args)
	if err != nil {
		return err
	}
	switch {
	case len(pos) > 0:
		return usageErrorf("sluice retries: unexpected arguments %q (see 'sluice retries -h')", pos)
	case *window < time.Second:
		return usageErrorf("sluice retries: --window must be at least 1s, got %s", *window)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*serviceTimeout)
	defer cancel()
	client := newHTTPClient()
	defer client.CloseIdleConnections()

	out, err := retrySource(e, client).Retries(ctx, *handler, *window)
	if err != nil {
		return cliErr(err, e.getenv("PROMETHEUS_URL"), serviceURL(e))
	}
	if *asJSON {
		return writeJSON(e, out)
	}
	return printRetries(e.stdout, out, *handler)
}

// printRetries writes r as a table.
func printRetries(w io.Writer, r retriesReport, handler string) error {
	fmt.Fprintf(w, "Retry statistics from %s, over the last %s.\n", r.Describe(), policy.Duration(r.WindowDuration()))
	if l := r.Learned; l != nil {
		fmt.Fprintf(w, "Learned retry policy: stops an error type below %g%% recovered, after %d ended messages; explores %g%%.\n",
			l.UnlikelyBelow*100, l.MinEvidence, l.Explore*100)
	}
	fmt.Fprintln(w)
	if len(r.Types) == 0 {
		if handler != "" {
			fmt.Fprintf(w, "No failures of handler %q in the window.\n", handler)
		} else {
			fmt.Fprintln(w, "No failures in the window.")
		}
		return nil
	}
	learned := r.Learned != nil
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	head := "HANDLER\tERROR TYPE\tFAILED\tRETRIES\tRECOVERED\tRECOVERED %\tMEDIAN ATTEMPT\tEXHAUSTED\tPERMANENT\tRETRY_UNLIKELY\tOTHER ENDS"
	if learned {
		head += "\tLEARNED POLICY"
	}
	fmt.Fprintln(tw, head)
	for _, t := range r.Types {
		pct, median := "-", "-"
		if t.RecoveredPct != nil {
			pct = strconv.FormatFloat(*t.RecoveredPct, 'f', 1, 64) + "%"
		}
		if t.MedianRecoveryAttempt > 0 {
			median = strconv.Itoa(t.MedianRecoveryAttempt)
		}
		line := fmt.Sprintf("%s\t%s\t%d\t%d\t%d\t%s\t%s\t%d\t%d\t%d\t%d", t.Handler, t.ErrorType, t.Failed, t.Retries, t.Recovered, pct, median,
			t.Exhausted, t.Permanent, t.RetryUnlikely, t.Discarded+t.DeadLettered)
		if learned {
			policy := "-"
			if t.Learned != nil {
				policy = (*t.Learned).Text()
				if t.Learned.Evidence != "" {
					policy += ": " + t.Learned.Evidence
				}
			}
			line += "\t" + policy
		}
		fmt.Fprintln(tw, line)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nRECOVERED % is of the messages that ended; OTHER ENDS are discarded or dead-lettered by other steps.")
	return nil
}

// retrySource is where sluice retries and sluice policy read: PROMETHEUS_URL and
// SLUICE_SERVICE_URL, read here rather than in package retryview, as the console's are.
func retrySource(e *env, client *http.Client) retryview.Source {
	return retryview.Source{ServiceURL: e.getenv("SLUICE_SERVICE_URL"), PrometheusURL: strings.TrimSpace(e.getenv("PROMETHEUS_URL")), Client: client}
}

// cliErr is a retryview error as the CLI reports it: a URL that is not http(s) is a usage
// error; every configured URL's password is masked.
func cliErr(err error, urls ...string) error {
	usage := errors.Is(err, retryview.ErrNotHTTP) // before redactErr flattens the chain
	for _, u := range urls {
		if u != "" {
			err = redactErr(err, u)
		}
	}
	if usage {
		return usageErrorf("sluice: %v", err)
	}
	return err
}

// serviceURL is SLUICE_SERVICE_URL, else defaultServiceURL.
func serviceURL(e *env) string {
	return retrySource(e, nil).Service()
}

func newHTTPClient() *http.Client {
	return &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone(), Timeout: serviceTimeout}
}
