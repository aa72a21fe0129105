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

// screenshot saves the viewport as docs/name, the picture the README shows.
func screenshot(t *testing.T, name string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		png, err := chromedp.CaptureScreenshot()(ctx, tg)
		if err != nil {
			return err
		}
		// Into the test's own folder: make test leaves the tree as it found it. The
		// README's pictures are refreshed on purpose with `make screenshots`, which sets
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
// refreshes it), a queue's groups, a group's messages, one message, a hostile message
// whose markup must stay text, and the replay of a group through its confirmation.
func TestBrowser(t *testing.T) {
	tr := newTracing(t)
	fx := newFixture(t, tr.configure)
	ctx := browser(t)
	tr.deadLetter(t, fx, "order-1001", `{"order":"order-1001","amount":42}`, gatewayDown())
	for _, id := range []string{"order-1002", "order-1003"} {
		fx.deadLetter(t, id, `{"order":"`+id+`","amount":42}`, gatewayDown(), map[string]string{"tenant": "acme"})
	}
	fx.deadLetter(t, "order-666", hostile, typedError{"invalid_amount", "amount " + hostile + " is not a number"}, map[string]string{"x-note": hostile})
	gateway := groupOf(t, fx, "gateway_down")
	// Spans reach Jaeger a moment after they are flushed: wait until the first message's
	// page has its timeline, so its screenshot shows one.
	require.Eventually(t, func() bool {
		_, body := fx.get(t, "/queues/"+fx.queue+"/messages/order-1001")
		return strings.Contains(body, `class="waterfall"`)
	}, 20*time.Second, 250*time.Millisecond)
	dlqName := topology.DLQ(fx.queue)

	var refreshed, title, payload, result string
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
		chromedp.Poll[chromedp.Void](`document.querySelector('tr[data-queue="`+fx.queue+`"] [data-field="dlq"]').textContent === "5"`, chromedp.WithPollingTimeout(15*time.Second)),
		chromedp.Click(chromedp.CSS(`tr[data-queue="`+fx.queue+`"] a`)),
		chromedp.WaitVisible(chromedp.CSS(`#groups`)),
		chromedp.Click(chromedp.CSS(`tr[data-group="`+gateway+`"] a.group`)),
		chromedp.WaitVisible(chromedp.CSS(`#messages`)),
		screenshot(t, "console-groups.png"),
		chromedp.Click(chromedp.CSS(`#messages a.message`)),
		chromedp.WaitVisible(chromedp.CSS(`#payload`)),
		into(&payload, chromedp.Text(chromedp.CSS(`#payload`))),
		chromedp.WaitVisible(chromedp.CSS(`pre.waterfall`)),
		chromedp.ScrollIntoView(chromedp.CSS(`#timeline`)),
		screenshot(t, "console-message.png"),
	))
	assert.Contains(t, refreshed, "Last refresh")
	assert.Contains(t, payload, `"order":"order-1001"`)

	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(fx.srv.URL+"/queues/"+fx.queue+"/messages/order-666"),
		chromedp.WaitVisible(chromedp.CSS(`#payload`)),
		into(&payload, chromedp.Text(chromedp.CSS(`#payload`))),
		into(&title, chromedp.Title()),
	))
	assert.Equal(t, hostile, payload, "a hostile payload is shown as its text")
	assert.NotContains(t, title, "pwned", "a hostile payload never runs")

	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(fx.srv.URL+"/queues/"+fx.queue),
		chromedp.WaitVisible(chromedp.CSS(`#groups`)),
		chromedp.Click(chromedp.CSS(`tr[data-group="`+gateway+`"] a.op-replay`)),
		chromedp.WaitVisible(chromedp.CSS(`#confirm`)),
		chromedp.Click(chromedp.CSS(`#confirm`)),
		chromedp.WaitVisible(chromedp.CSS(`#result`)),
		into(&result, chromedp.Text(chromedp.CSS(`#result`))),
	))
	assert.True(t, strings.HasPrefix(result, "Replayed 3 of 3"), result)
	require.Eventually(t, func() bool { return fx.rabbit.Count(fx.queue) == 3 }, 10*time.Second, 50*time.Millisecond)
	assert.Equal(t, 2, fx.rabbit.Count(dlqName), "the other groups stay")
}
