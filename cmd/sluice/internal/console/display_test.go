package console_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/cmd/sluice/internal/console"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/internal/dlqview"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
)

// secrets a producer put in a payload and in headers; none may reach a page or an API
// response, all must reach the download.
var secrets = []string{"payload-pw", "header-pw", "auth-pw", "key-pw"}

// bigPayload is a JSON payload of n bytes that quotes a broker URL with its password.
func bigPayload(n int) []byte {
	head := []byte(`{"broker":"amqp://admin:payload-pw@rabbit:5672/","blob":"`)
	tail := []byte(`"}`)
	return append(append(head, bytes.Repeat([]byte("z"), n-len(head)-len(tail))...), tail...)
}

const mib = 1 << 20

// large is the huge payload's size (testenv.LargeMessageBytes: 20 MiB, 15 MiB on RabbitMQ 4.3).
var large = testenv.LargeMessageBytes()

// TestDisplayBoundsAndMasks dead-letters 5 MB and 20 MB (15 MB on RabbitMQ 4.3) messages with credentials in the
// payload and headers, and 200 more messages of 100 KB, and reads them through every
// display of the console: every page and response stays under 1 MiB and shows no
// credential, while the download gives the exact bytes.
func TestDisplayBoundsAndMasks(t *testing.T) {
	fx := newFixture(t, nil)
	q := url.PathEscape(fx.queue)
	hdr := map[string]string{"x-db": "postgres://app:header-pw@db/app", "Authorization": "Bearer auth-pw", "x-api-key": "key-pw"}
	sizes := map[string]int{"big-5mb": 5 * mib, "big-large": large}
	for _, id := range []string{"big-5mb", "big-large"} {
		fx.deadLetter(t, id, string(bigPayload(sizes[id])), gatewayDown(), hdr)
	}
	for i := range 200 {
		fx.deadLetter(t, fmt.Sprintf("bulk-%03d", i), string(bigPayload(100<<10)), gatewayDown(), hdr)
	}
	noSecret := func(t *testing.T, body string) {
		t.Helper()
		for _, s := range secrets {
			assert.NotContains(t, body, s)
		}
	}
	for _, id := range []string{"big-5mb", "big-large"} {
		t.Run(id, func(t *testing.T) {
			code, page := fx.get(t, "/queues/"+q+"/messages/"+id)
			require.Equal(t, http.StatusOK, code, page)
			t.Logf("%s: message page %d bytes", id, len(page))
			assert.Less(t, len(page), mib)
			noSecret(t, page)
			assert.Contains(t, page, `amqp://admin:xxxxx@rabbit:5672/`)
			assert.Contains(t, page, `id="payload-truncated"`)
			assert.Contains(t, page, "Masking is display only")
			assert.Contains(t, page, `<span id="payload-bytes">`+strconv.Itoa(sizes[id])+`</span>`)

			code, body := fx.get(t, "/api/v1/queues/"+q+"/messages/"+id)
			require.Equal(t, http.StatusOK, code, body)
			t.Logf("%s: message API %d bytes", id, len(body))
			assert.Less(t, len(body), mib)
			noSecret(t, body)
			var got struct {
				Headers          map[string]string `json:"headers"`
				Payload          string            `json:"payload"`
				PayloadBytes     int               `json:"payload_bytes"`
				PayloadTruncated bool              `json:"payload_truncated"`
				Download         string            `json:"payload_download"`
			}
			require.NoError(t, json.Unmarshal([]byte(body), &got))
			assert.Equal(t, sizes[id], got.PayloadBytes)
			assert.True(t, got.PayloadTruncated)
			assert.LessOrEqual(t, len(got.Payload), dlqview.PreviewBytes)
			assert.Equal(t, "xxxxx", got.Headers["Authorization"])
			assert.Equal(t, "postgres://app:xxxxx@db/app", got.Headers["x-db"])

			resp, err := http.Get(fx.srv.URL + got.Download)
			require.NoError(t, err)
			defer resp.Body.Close()
			raw, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			assert.Equal(t, http.StatusOK, resp.StatusCode)
			assert.Equal(t, "application/octet-stream", resp.Header.Get("Content-Type"))
			assert.True(t, strings.HasPrefix(resp.Header.Get("Content-Disposition"), "attachment"), resp.Header.Get("Content-Disposition"))
			assert.True(t, bytes.Equal(bigPayload(sizes[id]), raw), "the download is the exact payload, unmasked")
		})
	}
	t.Run("list API", func(t *testing.T) {
		code, body := fx.get(t, "/api/v1/queues/"+q+"/messages")
		require.Equal(t, http.StatusOK, code, body)
		t.Logf("list API, 200 messages: %d bytes", len(body))
		assert.Less(t, len(body), mib)
		noSecret(t, body)
		var got struct {
			Total    int `json:"total"`
			Messages []struct {
				ID           string `json:"id"`
				PayloadBytes int    `json:"payload_bytes"`
			} `json:"messages"`
		}
		require.NoError(t, json.Unmarshal([]byte(body), &got))
		assert.Equal(t, 202, got.Total)
		require.Len(t, got.Messages, 200)
		assert.Equal(t, "big-5mb", got.Messages[0].ID)
		assert.Equal(t, 5*mib, got.Messages[0].PayloadBytes)
		assert.Equal(t, large, got.Messages[1].PayloadBytes)
		assert.NotContains(t, body, `"payload"`, "a list carries no payload")
	})
	t.Run("group page", func(t *testing.T) {
		group := groupOf(t, fx, "gateway_down")
		code, page := fx.get(t, "/queues/"+q+"?group="+group)
		require.Equal(t, http.StatusOK, code, page)
		t.Logf("group page, 200 messages: %d bytes", len(page))
		assert.Less(t, len(page), mib)
		noSecret(t, page)
		assert.Contains(t, page, strconv.Itoa(large)+" bytes")
	})
}

// TestBrowserLargeMessage opens the page of a 20 MB (15 MB on RabbitMQ 4.3) dead letter in a real Chromium: the
// page shows the bounded, masked preview, says the payload's size and links the download.
func TestBrowserLargeMessage(t *testing.T) {
	ctx := browser(t)
	fx := newFixture(t, nil)
	fx.deadLetter(t, "big-large", string(bigPayload(large)), gatewayDown(), map[string]string{"Authorization": "Bearer auth-pw"})
	var payload, size, truncated string
	var attrs map[string]string
	start := time.Now()
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(fx.srv.URL+"/queues/"+url.PathEscape(fx.queue)+"/messages/big-large"),
		chromedp.WaitVisible(chromedp.CSS(`#payload`)),
		into(&payload, chromedp.Text(chromedp.CSS(`#payload`))),
		into(&size, chromedp.Text(chromedp.CSS(`#payload-bytes`))),
		into(&truncated, chromedp.Text(chromedp.CSS(`#payload-truncated`))),
		into(&attrs, chromedp.Attributes(chromedp.CSS(`#download`))),
	))
	t.Logf("%d MB message page opened and shown in %s (the read of the DLQ included)", large>>20, time.Since(start).Round(time.Millisecond))
	assert.LessOrEqual(t, len(payload), dlqview.PreviewBytes)
	assert.Contains(t, payload, "amqp://admin:xxxxx@rabbit:5672/")
	assert.NotContains(t, payload, "payload-pw")
	assert.Equal(t, strconv.Itoa(large), size)
	assert.Contains(t, truncated, "Only the first")
	assert.Contains(t, attrs["href"], "/messages/big-large/payload")
}

// TestConsoleDuplicateIDs dead-letters two messages with one id: the message page names
// both positions and opens either, and a replay by id says it moved both.
func TestConsoleDuplicateIDs(t *testing.T) {
	fx := newFixture(t, nil)
	q := url.PathEscape(fx.queue)
	fx.deadLetter(t, "dup", `{"n":1}`, gatewayDown(), nil)
	fx.deadLetter(t, "other", `{}`, gatewayDown(), nil)
	fx.deadLetter(t, "dup", `{"n":2}`, typedError{"invalid_amount", "amount must be positive"}, nil)

	code, page := fx.get(t, "/queues/"+q+"/messages/dup")
	require.Equal(t, http.StatusOK, code, page)
	assert.Contains(t, page, `id="duplicates">2 messages of this queue hold this id, at positions`)
	assert.Contains(t, page, `/messages/dup?position=3">3</a>`)
	assert.Contains(t, page, "<pre id=\"payload\" class=\"pretty\">{\n  &#34;n&#34;: 1\n}</pre>", "a JSON payload is shown indented")

	code, page = fx.get(t, "/queues/"+q+"/messages/dup?position=3")
	require.Equal(t, http.StatusOK, code, page)
	assert.Contains(t, page, "<pre id=\"payload\" class=\"pretty\">{\n  &#34;n&#34;: 2\n}</pre>")
	assert.Contains(t, page, "the edit changes the first, at position 1", "an edit takes the first message with the id")
	code, body := fx.get(t, "/api/v1/queues/"+q+"/messages/dup?position=3")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `"same_id_positions": [`)
	assert.Contains(t, body, `"error_type": "invalid_amount"`)
	code, _ = fx.get(t, "/queues/"+q+"/messages/dup?position=2")
	assert.Equal(t, http.StatusNotFound, code)
	code, _ = fx.get(t, "/api/v1/queues/"+q+"/messages/dup?position=x")
	assert.Equal(t, http.StatusBadRequest, code)

	code, body = fx.do(t, http.MethodPost, "/api/v1/queues/"+q+"/replay", `{"ids":["dup"]}`, http.Header{console.CSRFHeader: {fx.console.CSRFToken()}})
	require.Equal(t, http.StatusOK, code, body)
	var res dlq.Result
	require.NoError(t, json.Unmarshal([]byte(body), &res))
	assert.Equal(t, 2, res.Moved)
	assert.Equal(t, map[string]int{"dup": 2}, res.MovedByID)
	require.Eventually(t, func() bool { return fx.rabbit.Count(fx.queue) == 2 }, 10*time.Second, 20*time.Millisecond)
}
