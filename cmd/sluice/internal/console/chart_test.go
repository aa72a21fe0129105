package console_test

import (
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/cmd/sluice/internal/console"
)

// chartPage dead-letters the message whose trace fj serves and returns its queue, its page
// and the page's chart.
func chartPage(t *testing.T, fj *fakeJaeger) (queue, page, svg string) {
	t.Helper()
	fx := newFixture(t, func(c *console.Config) { fj.configure(c) })
	fj.setQueue(fx.queue)
	fx.deadLetter(t, fj.id, `{"id":"`+fj.id+`"}`, gatewayDown(), fj.tracedMetadata(nil))

	code, page := fx.get(t, "/queues/"+fx.queue+"/messages/"+fj.id)
	require.Equal(t, http.StatusOK, code, page)
	svg = page[strings.Index(page, `<svg class="waterfall-chart"`):]
	return fx.queue, page, svg[:strings.Index(svg, "</svg>")]
}

// TestWaterfallChart draws a message's trace (three attempts, two delays, the dead
// letter; served by a fake Jaeger) as SVG bars: one bar per attempt, numbered, the failed
// ones marked; each delay's wait with the delay asked behind it; and the text form kept.
func TestWaterfallChart(t *testing.T) {
	fj := newFakeJaeger(t, "w-1")
	_, page, svg := chartPage(t, fj)
	assert.Contains(t, svg, `aria-label="Retry timeline of trace `+fj.traceID+`: 3 attempts; the text form follows"`)
	bars := regexp.MustCompile(`<rect class="bar attempt( failed)?" data-attempt="(\d)"`).FindAllStringSubmatch(svg, -1)
	require.Len(t, bars, 3, "one bar per attempt")
	for i, b := range bars {
		assert.Equal(t, string(rune('1'+i)), b[2])
		assert.Equal(t, " failed", b[1], "every attempt failed")
	}
	assert.Equal(t, 3, strings.Count(svg, `<rect class="bar wait"`), "one wait in the queue, one per delay")
	assert.Equal(t, 2, strings.Count(svg, `<rect class="asked"`), "each delay asked is drawn")
	assert.Contains(t, svg, "asked 100.0ms, waited 102.0ms")
	assert.Contains(t, svg, "asked 200.0ms, waited 205.0ms")
	assert.Contains(t, svg, `<rect class="bar deadletter"`)
	assert.Contains(t, svg, ">retry in 100.0ms</text>")
	assert.Contains(t, svg, ">dead letter (gateway_down)</text>")
	assert.Contains(t, svg, `<text class="tick-label"`)
	assert.Contains(t, page, `<pre class="waterfall">`, "the text form stays")
	assert.Contains(t, page, "asked 100ms")

	t.Run("a hostile operation name stays text", func(t *testing.T) {
		assert.NotContains(t, svg, "<script")
	})
}

// A native delayed retry (RabbitMQ 4.3) is a rejection the queue holds back: its wait is
// drawn as the queue's hold, with the delay asked behind it, as a delay's is.
func TestWaterfallChart_NativeRetry(t *testing.T) {
	fj := newFakeJaeger(t, "w-2")
	fj.native = true
	queue, page, svg := chartPage(t, fj)
	assert.Len(t, regexp.MustCompile(`<rect class="bar attempt failed" data-attempt="\d"`).FindAllString(svg, -1), 3, "one bar per attempt")
	assert.Equal(t, 2, strings.Count(svg, `<rect class="asked"`), "the delay's and the queue's hold are both drawn with what was asked")
	assert.Contains(t, svg, ">held back by "+queue+"</text>")
	assert.Contains(t, svg, "asked 200.0ms, waited 205.0ms")
	assert.Contains(t, svg, ">native retry · delay 200.0ms</text>")
	assert.Contains(t, page, "held back by "+queue, "and in the text form")
}
