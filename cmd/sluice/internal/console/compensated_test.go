package console_test

import (
	"html"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/cmd/sluice/internal/console"
	"github.com/sluice-go/sluice/internal/carry"
	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/topology"
)

// compensatedRecord puts a dead letter with id into fx's DLQ whose record says the
// handler's compensation event ev went to queue orders.cancel (ev empty: not published,
// for why).
func (fx *fixture) compensatedRecord(t *testing.T, id, ev, why string) {
	t.Helper()
	msg := message.NewMessage(id, []byte(`{"id":"`+id+`"}`))
	rec := carry.New(carry.Carrier{Host: "worker-1"}).Record(msg, fx.queue, 0, sluice.Permanent(typedError{"card_declined", "card declined"}))
	if ev != "" {
		rec.Metadata.Set(headers.CompensationID, ev)
		rec.Metadata.Set(headers.CompensationTo, "queue orders.cancel")
	}
	if why != "" {
		rec.Metadata.Set(headers.CompensationError, why)
	}
	fx.publishRecord(t, rec)
}

const confirmBox = `<input type="checkbox" name="compensated" value="yes" id="confirm-compensated" required>`

// TestCompensatedConfirmation: the message page says a dead letter's compensation was
// published (its event and where) or why not; replaying (confirm page, form, API) or
// edit-and-retrying a compensated one asks for an explicit confirmation, is refused with
// 409 and moves nothing without it, and succeeds with it; the audit trail records the
// confirmation.
func TestCompensatedConfirmation(t *testing.T) {
	fx := newFixture(t, nil)
	q, dlqName, archive := fx.queue, topology.DLQ(fx.queue), topology.Archive(fx.queue)
	fx.rabbit.DeleteQueues(archive)
	t.Cleanup(func() { fx.rabbit.DeleteQueues(archive) })
	fx.compensatedRecord(t, "c-1", "ev-1", "")
	fx.compensatedRecord(t, "c-2", "ev-2", "")
	fx.compensatedRecord(t, "n-1", "", "no order id")
	csrf := fx.console.CSRFToken()
	form := func(v url.Values) (int, string) {
		return fx.do(t, http.MethodPost, "/queues/"+q+"/actions", v.Encode(), http.Header{"Content-Type": {"application/x-www-form-urlencoded"}})
	}

	t.Run("message page", func(t *testing.T) {
		tests := []struct {
			id, want string
		}{
			{"c-1", `<td id="compensation" class="warn">event ev-1 published to queue orders.cancel: the work this message was part of was undone`},
			{"n-1", `<td id="compensation">not published: no order id</td>`},
		}
		for _, tt := range tests {
			code, page := fx.get(t, "/queues/"+q+"/messages/"+tt.id)
			require.Equal(t, http.StatusOK, code, page)
			assert.Contains(t, page, tt.want)
		}
	})

	t.Run("confirm page", func(t *testing.T) {
		tests := []struct {
			name, query string
			asks        bool
		}{
			{"replay of a compensated message", "op=replay&id=c-1", true},
			{"replay of one not compensated", "op=replay&id=n-1", false},
			{"archive of a compensated message", "op=archive&id=c-1", false},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				code, page := fx.get(t, "/queues/"+q+"/confirm?"+tt.query)
				require.Equal(t, http.StatusOK, code, page)
				if !tt.asks {
					assert.NotContains(t, page, "compensated-warning")
					assert.NotContains(t, page, confirmBox)
					return
				}
				assert.Contains(t, page, "1 of these message(s) were compensated")
				assert.Contains(t, page, "<li><code>c-1</code>: event ev-1 published to queue orders.cancel</li>")
				form := page[strings.Index(page, `action="/queues/`+q+`/actions"`):]
				assert.Contains(t, form[:strings.Index(form, "</form>")], confirmBox, "the form cannot be sent without it")
			})
		}
	})

	t.Run("refused without the confirmation", func(t *testing.T) {
		tests := []struct {
			name string
			run  func() (int, string)
		}{
			{"form replay", func() (int, string) {
				return form(url.Values{"op": {"replay"}, "id": {"c-1"}, "csrf": {csrf}})
			}},
			{"form replay, box not ticked", func() (int, string) {
				return form(url.Values{"op": {"replay"}, "id": {"c-1"}, "csrf": {csrf}, "compensated": {""}})
			}},
			{"API replay", func() (int, string) {
				return fx.do(t, http.MethodPost, "/api/v1/queues/"+q+"/replay", `{"ids":["c-1"]}`,
					http.Header{"Content-Type": {"application/json"}, console.CSRFHeader: {csrf}})
			}},
			{"API edit", func() (int, string) {
				return fx.do(t, http.MethodPost, "/api/v1/queues/"+q+"/messages/c-2/edit", `{"set_headers":{"x-ticket":"OPS-1"}}`,
					http.Header{"Content-Type": {"application/json"}, console.CSRFHeader: {csrf}})
			}},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				code, body := tt.run()
				assert.Equal(t, http.StatusConflict, code, body)
				assert.Contains(t, html.UnescapeString(body), "compensation was published")
				assert.Equal(t, 3, fx.rabbit.Count(dlqName), "nothing moved")
				assert.Zero(t, fx.rabbit.Count(q))
			})
		}
	})

	t.Run("form replay, confirmed", func(t *testing.T) {
		code, page := form(url.Values{"op": {"replay"}, "id": {"c-1"}, "csrf": {csrf}, "compensated": {"yes"}})
		require.Equal(t, http.StatusOK, code, page)
		assert.Contains(t, page, "Replayed 1 of 1 selected message(s)")
		assert.Contains(t, page, `id="result-compensated"`)
		assert.Equal(t, 1, fx.rabbit.Count(q))
		assert.Equal(t, 2, fx.rabbit.Count(dlqName))
	})

	t.Run("edit and retry, confirmed", func(t *testing.T) {
		body, h := multipartBody(t, [][2]string{{"csrf", csrf}, {"set_headers", "x-ticket=OPS-1"}})
		code, page := fx.do(t, http.MethodPost, "/queues/"+q+"/messages/c-2/edit/preview", body, h)
		require.Equal(t, http.StatusOK, code, page)
		assert.Contains(t, page, `id="compensated-warning"`)
		assert.Contains(t, page, "event ev-2 published to queue orders.cancel")
		confirm := page[strings.Index(page, `id="edit-confirm-form"`):]
		confirm = confirm[:strings.Index(confirm, "</form>")]
		assert.Contains(t, confirm, confirmBox)
		var fields [][2]string
		for _, m := range hiddenRE.FindAllStringSubmatch(confirm, -1) {
			fields = append(fields, [2]string{m[1], html.UnescapeString(m[2])})
		}

		body, h = multipartBody(t, fields)
		code, page = fx.do(t, http.MethodPost, "/queues/"+q+"/messages/c-2/edit", body, h)
		assert.Equal(t, http.StatusConflict, code, "the box not ticked: %s", page)
		assert.Equal(t, 2, fx.rabbit.Count(dlqName))

		body, h = multipartBody(t, append(fields, [2]string{"compensated", "yes"}))
		code, page = fx.do(t, http.MethodPost, "/queues/"+q+"/messages/c-2/edit", body, h)
		require.Equal(t, http.StatusOK, code, page)
		assert.Equal(t, 2, fx.rabbit.Count(q))
		assert.Equal(t, 1, fx.rabbit.Count(dlqName))
	})

	t.Run("the audit trail records the confirmation", func(t *testing.T) {
		type row struct {
			Action, Result string
			Confirmed      bool
			Compensated    int
		}
		var got []row
		for _, ev := range auditEvents(t, fx) {
			got = append(got, row{ev.Action, ev.Result, ev.ConfirmedCompensated, ev.Compensated})
			assert.Equal(t, "console:loopback", ev.Actor)
		}
		assert.Equal(t, []row{
			{"replay", "failed", false, 0},
			{"replay", "failed", false, 0},
			{"replay", "failed", false, 0},
			{"edit", "failed", false, 0},
			{"replay", "ok", true, 1},
			{"edit", "failed", false, 0},
			{"edit", "ok", true, 1},
		}, got)
		code, page := fx.get(t, "/audit?queue="+q)
		require.Equal(t, http.StatusOK, code, page)
		assert.Contains(t, page, `<span class="warn confirmed-compensated">compensation confirmed: 1 compensated</span>`)
	})
}
