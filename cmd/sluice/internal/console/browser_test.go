package console_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/cmd/sluice/internal/console"
	"github.com/sluice-go/sluice/internal/topology"
)

// chromium returns the browser's path; it skips on a dev box without one and fails in CI
// (CI set), where .ci/run installs Debian's chromium.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("chromium is not installed: .ci/run installs Debian's chromium package")
	}
	t.Skip("chromium is not installed (apt-get install chromium); the browser test runs in CI")
	return ""
}

// browser starts a headless Chromium with its own profile, closed when t ends.
func browser(t *testing.T) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium(t)),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.NoFirstRun,
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1200, 720),
	)
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(alloc)
	ctx, cancelTimeout := context.WithTimeout(ctx, 2*time.Minute)
	t.Cleanup(func() {
		cancelTimeout()
		cancelCtx()
		cancelAlloc()
	})
	return ctx
}

// screenshot saves the viewport as docs/name, the picture the docs show.
func screenshot(t *testing.T, name string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		png, err := chromedp.CaptureScreenshot()(ctx, tg)
		if err != nil {
			return err
		}
		// Into the test's own folder: make test leaves the tree as it found it. The
		// The docs' pictures are refreshed on purpose with `make screenshots`, which sets
		// SLUICE_SCREENSHOTS to docs/.
		dir := os.Getenv("SLUICE_SCREENSHOTS")
		if dir == "" {
			dir = t.TempDir()
		}
		path := filepath.Join(dir, name)
		t.Logf("screenshot %s", path)
		return os.WriteFile(path, png, 0o644)
	})
}

// into runs a and keeps its value in p, so it can be one of a chromedp.Do's steps.
func into[T any](p *T, a chromedp.Action[T]) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		v, err := a(ctx, tg)
		*p = v
		return err
	})
}

// TestBrowser clicks through the console in a real Chromium: the overview (whose script
// refreshes it), a queue's groups (refreshed by the script too) and their messages (selected
// with the script's checkboxes), one message with its timeline drawn as SVG bars (from a
// fake Jaeger, so the picture is the same wherever it runs; TestTimelineFromJaeger reads
// the real one), a hostile message whose markup must stay text, the edit-and-retry of a
// message through its diff preview, the audit trail, the replay of a group through its
// confirmation, and a payment service's retry statistics and retry policy (from a fake
// service, for the same reason as Jaeger).
func TestBrowser(t *testing.T) {
	fj := newFakeJaeger(t, "order-1001")
	service := newFakeService(t)
	fx := newFixture(t, func(c *console.Config) {
		fj.configure(c)
		c.JaegerUIURL = "http://jaeger.example:16686/"
		c.ServiceURL = service
	})
	fj.setQueue(fx.queue)
	ctx := browser(t)
	fx.deadLetter(t, "order-1001", `{"order":"order-1001","amount":42}`, gatewayDown(), fj.tracedMetadata(nil))
	for _, id := range []string{"order-1002", "order-1003"} {
		fx.deadLetter(t, id, `{"order":"`+id+`","amount":42}`, gatewayDown(), map[string]string{"tenant": "acme"})
	}
	fx.deadLetter(t, "order-666", hostile, typedError{"invalid_amount", "amount " + hostile + " is not a number"}, map[string]string{"x-note": hostile})
	fx.deadLetter(t, "order-3001", `{"order":"order-3001","amount":-42,"currency":"EUR"}`, typedError{"invalid_amount", "amount must be positive"},
		jsonMD(map[string]string{"tenant": "acme"}))
	gateway := groupOf(t, fx, "gateway_down")
	dlqName := topology.DLQ(fx.queue)

	var refreshed, groupsRefreshed, selected, title, payload, result, actor, audit string
	var attempts int
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(fx.srv.URL+"/"),
		chromedp.WaitVisible(chromedp.CSS(`#queues`)),
		// The overview's script fetches the JSON API: its stamp shows it ran under the CSP.
		chromedp.Poll[chromedp.Void](`document.getElementById("refreshed").textContent.startsWith("Last refresh")`, chromedp.WithPollingTimeout(15*time.Second)),
		into(&refreshed, chromedp.Text(chromedp.CSS(`#refreshed`))),
		// A new failure shows up on the open page: the script, not a reload, updates it.
		chromedp.Func(func(context.Context, *chromedp.Target) error {
			fx.deadLetter(t, "order-2001", `{}`, typedError{"timeout", "deadline exceeded"}, nil)
			return nil
		}),
		chromedp.Poll[chromedp.Void](`document.querySelector('tr[data-queue="`+fx.queue+`"] [data-field="dlq"]').textContent === "6"`, chromedp.WithPollingTimeout(15*time.Second)),
		chromedp.Click(chromedp.CSS(`tr[data-queue="`+fx.queue+`"] a`)),
		chromedp.WaitVisible(chromedp.CSS(`#groups`)),
		chromedp.Click(chromedp.CSS(`tr[data-group="`+gateway+`"] a.group`)),
		chromedp.WaitVisible(chromedp.CSS(`#messages`)),
		// The groups' counts follow the DLQ without a reload.
		chromedp.Func(func(context.Context, *chromedp.Target) error {
			fx.deadLetter(t, "order-1004", `{"order":"order-1004","amount":42}`, gatewayDown(), nil)
			return nil
		}),
		chromedp.Poll[chromedp.Void](`document.querySelector('tr[data-group="`+gateway+`"] [data-field="count"]').textContent === "4"`, chromedp.WithPollingTimeout(15*time.Second)),
		into(&groupsRefreshed, chromedp.Text(chromedp.CSS(`#groups-refreshed`))),
		chromedp.Click(chromedp.CSS(`#select-all`)),
		into(&selected, chromedp.Text(chromedp.CSS(`#selected-count`))),
		chromedp.Click(chromedp.CSS(`#select-all`)),
		chromedp.Evaluate[chromedp.Void](`window.scrollTo(0, 0)`),
		screenshot(t, "console-groups.png"),
		chromedp.Click(chromedp.CSS(`#messages a.message`)),
		chromedp.WaitVisible(chromedp.CSS(`#payload`)),
		into(&payload, chromedp.Text(chromedp.CSS(`#payload`))),
		chromedp.WaitVisible(chromedp.CSS(`svg.waterfall-chart`)),
		into(&attempts, chromedp.Evaluate[int](`document.querySelectorAll("svg.waterfall-chart rect.bar[data-attempt]").length`)),
		chromedp.ScrollIntoView(chromedp.CSS(`#timeline`)),
		screenshot(t, "console-message.png"),
	))
	assert.Contains(t, refreshed, "Last refresh")
	assert.Contains(t, groupsRefreshed, "Last refresh")
	assert.Equal(t, "3 selected", selected, "the list as loaded: a reload shows the new one")
	assert.Contains(t, payload, `"order": "order-1001"`, "a JSON payload is shown indented")
	assert.Equal(t, 3, attempts, "one bar per attempt")

	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(fx.srv.URL+"/queues/"+fx.queue+"/messages/order-666"),
		chromedp.WaitVisible(chromedp.CSS(`#payload`)),
		into(&payload, chromedp.Text(chromedp.CSS(`#payload`))),
		into(&title, chromedp.Title()),
	))
	assert.Equal(t, hostile, payload, "a hostile payload is shown as its text")
	assert.NotContains(t, title, "pwned", "a hostile payload never runs")

	// Edit and retry: change the payload, see the diff, confirm; the audit trail has it.
	var diff string
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(fx.srv.URL+"/queues/"+fx.queue+"/messages/order-3001"),
		chromedp.Click(chromedp.CSS(`#edit-link`)),
		chromedp.WaitVisible(chromedp.CSS(`#edit-payload`)),
		chromedp.SetValue(chromedp.CSS(`#edit-payload`), "{\n  \"order\": \"order-3001\",\n  \"amount\": 42,\n  \"currency\": \"EUR\"\n}"),
		chromedp.SetValue(chromedp.CSS(`#edit-set`), "x-fixed-by=ops-ticket-812"),
		chromedp.Click(chromedp.CSS(`#edit-preview`)),
		chromedp.WaitVisible(chromedp.CSS(`#diff`)),
		into(&diff, chromedp.Text(chromedp.CSS(`#diff`))),
		chromedp.Evaluate[chromedp.Void](`window.scrollTo(0, 0)`),
		screenshot(t, "console-edit.png"),
		chromedp.Click(chromedp.CSS(`#edit-confirm`)),
		chromedp.WaitVisible(chromedp.CSS(`#edit-result`)),
		into(&actor, chromedp.Text(chromedp.CSS(`#actor`))),
		chromedp.Click(chromedp.CSS(`#nav-audit`)),
		chromedp.WaitVisible(chromedp.CSS(`#audit`)),
		into(&audit, chromedp.Text(chromedp.CSS(`#audit tbody`))),
		screenshot(t, "console-audit.png"),
	))
	assert.Contains(t, diff, `"amount": -42,`)
	assert.Contains(t, diff, `"amount": 42,`)
	assert.Equal(t, "console:loopback", actor)
	assert.Contains(t, audit, "edit")
	assert.Contains(t, audit, "console:loopback")
	require.Eventually(t, func() bool { return fx.rabbit.Count(fx.queue) == 1 }, 10*time.Second, 50*time.Millisecond)
	edited, ok := fx.rabbit.Get(fx.queue)
	require.True(t, ok)
	assert.Equal(t, `{"order":"order-3001","amount":42,"currency":"EUR"}`, string(edited.Body))
	assert.Equal(t, "ops-ticket-812", edited.Headers["x-fixed-by"])

	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(fx.srv.URL+"/queues/"+fx.queue),
		chromedp.WaitVisible(chromedp.CSS(`#groups`)),
		chromedp.Click(chromedp.CSS(`tr[data-group="`+gateway+`"] a.op-replay`)),
		chromedp.WaitVisible(chromedp.CSS(`#confirm`)),
		chromedp.Click(chromedp.CSS(`#confirm`)),
		chromedp.WaitVisible(chromedp.CSS(`#result`)),
		into(&result, chromedp.Text(chromedp.CSS(`#result`))),
	))
	assert.True(t, strings.HasPrefix(result, "Replayed 4 of 4"), result)
	require.Eventually(t, func() bool { return fx.rabbit.Count(fx.queue) == 4 }, 10*time.Second, 50*time.Millisecond)
	assert.Equal(t, 2, fx.rabbit.Count(dlqName), "the other groups stay")

	// The retry pages, reached through the navigation.
	var source, recovered, learned, policySource, schedule string
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(fx.srv.URL+"/"),
		chromedp.Click(chromedp.CSS(`#nav-retries`)),
		chromedp.WaitVisible(chromedp.CSS(`#retries-source`)),
		into(&source, chromedp.Text(chromedp.CSS(`#retries-source`))),
		into(&recovered, chromedp.Text(chromedp.CSS(`#handler-payments tr[data-error-type="gateway_timeout"] [data-field="recovered-pct"]`))),
		into(&learned, chromedp.Text(chromedp.CSS(`#handler-payments tr[data-error-type="ledger_unavailable"] [data-field="learned"]`))),
		screenshot(t, "console-retries.png"),
		chromedp.Click(chromedp.CSS(`#nav-policy`)),
		chromedp.WaitVisible(chromedp.CSS(`#policy-source`)),
		chromedp.Click(chromedp.CSS(`#policy-payments h2 a`)),
		chromedp.WaitVisible(chromedp.CSS(`#policy-payments table.schedule`)),
		into(&policySource, chromedp.Text(chromedp.CSS(`#policy-source`))),
		into(&schedule, chromedp.Text(chromedp.CSS(`#policy-payments table.schedule tbody`))),
		screenshot(t, "console-policy.png"),
	))
	assert.Contains(t, source, "Read from the service at "+service+"/debug/sluice/retries")
	assert.Equal(t, "71.4%", recovered)
	assert.Contains(t, learned, "0 of 40 recovered in the last hour")
	assert.Contains(t, policySource, "Read from the service at "+service+"/debug/sluice/policy")
	assert.Contains(t, schedule, "+15.5s")
}
