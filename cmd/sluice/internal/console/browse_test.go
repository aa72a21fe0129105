package console_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/cmd/sluice/internal/console"
	"github.com/sluice-go/sluice/internal/testkit/dlqfill"
	"github.com/sluice-go/sluice/internal/topology"
)

// listing is the messages API's answer.
type listing struct {
	Source   string `json:"source"`
	Total    int    `json:"total"`
	Matched  int    `json:"matched"`
	Page     int    `json:"page"`
	Pages    int    `json:"pages"`
	First    int    `json:"first"`
	Last     int    `json:"last"`
	Messages []struct {
		ID        string `json:"id"`
		Position  int    `json:"position"`
		ErrorType string `json:"error_type"`
	} `json:"messages"`
}

func listAPI(t *testing.T, fx *fixture, query string) listing {
	t.Helper()
	code, body := fx.get(t, "/api/v1/queues/"+fx.queue+"/messages?"+query)
	require.Equal(t, http.StatusOK, code, body)
	var l listing
	require.NoError(t, json.Unmarshal([]byte(body), &l))
	return l
}

func (l listing) ids() []string {
	var ids []string
	for _, m := range l.Messages {
		ids = append(ids, m.ID)
	}
	return ids
}

// TestPaging dead-letters 450 messages and pages through them, 200 at a time, on the
// queue page and in the API, whole and as one group: page 3 holds messages 401–450, no id
// shows on two pages, and the pages link to each other.
func TestPaging(t *testing.T) {
	fx := newFixture(t, nil)
	const n = 450
	dlqfill.Fill(t, fx.rabbit.Conn, fx.queue, n, func(i int) dlqfill.Failure {
		return dlqfill.Failure{ID: fmt.Sprintf("p-%03d", i), Handler: "payments", Err: gatewayDown()}
	})
	require.Equal(t, n, fx.rabbit.Count(topology.DLQ(fx.queue)))
	group := groupOf(t, fx, "gateway_down")

	for _, scope := range []struct{ name, query string }{{"whole DLQ", ""}, {"one group", "group=" + group + "&"}} {
		t.Run(scope.name, func(t *testing.T) {
			seen := map[string]int{}
			for page, want := range []struct{ first, last, size int }{{1, 200, 200}, {201, 400, 200}, {401, 450, 50}} {
				l := listAPI(t, fx, fmt.Sprintf("%spage=%d", scope.query, page+1))
				assert.Equal(t, n, l.Total)
				assert.Equal(t, n, l.Matched)
				assert.Equal(t, 3, l.Pages)
				assert.Equal(t, want.first, l.First)
				assert.Equal(t, want.last, l.Last)
				require.Len(t, l.Messages, want.size)
				assert.Equal(t, fmt.Sprintf("p-%03d", want.first-1), l.Messages[0].ID, "head first")
				for _, id := range l.ids() {
					seen[id]++
				}
			}
			assert.Len(t, seen, n, "every message on one page")
			for id, k := range seen {
				assert.Equal(t, 1, k, "id %s on %d pages", id, k)
			}
		})
	}

	code, page := fx.get(t, "/queues/"+fx.queue+"?page=3")
	require.Equal(t, http.StatusOK, code, page)
	assert.Contains(t, page, "Messages 401–450 of 450")
	assert.Contains(t, page, `href="/queues/`+fx.queue+`?page=2" id="prev"`)
	assert.NotContains(t, page, `id="next"`)
	assert.Contains(t, page, `/messages/p-449"`)
	assert.Contains(t, page, `/messages/p-400"`)
	assert.NotContains(t, page, `/messages/p-399"`)
	code, page = fx.get(t, "/queues/"+fx.queue+"?group="+group)
	require.Equal(t, http.StatusOK, code, page)
	assert.Contains(t, page, "Messages 1–200 of 450")
	assert.Contains(t, page, `href="/queues/`+fx.queue+`?group=`+group+`&amp;page=2" id="next"`)
	code, page = fx.get(t, "/queues/"+fx.queue+"?page=4")
	assert.Equal(t, http.StatusOK, code)
	assert.Contains(t, page, "No message on page 4")
	code, _ = fx.get(t, "/queues/"+fx.queue+"?page=0")
	assert.Equal(t, http.StatusBadRequest, code)
	assert.Equal(t, n, fx.rabbit.Count(topology.DLQ(fx.queue)), "reads consume nothing")
}

// TestFilters selects messages by error type and age, as the CLI's selectors do, and
// searches the error text, on the queue page and in the API.
func TestFilters(t *testing.T) {
	fx := newFixture(t, nil)
	old := time.Now().Add(-3 * time.Hour)
	failures := []dlqfill.Failure{
		{ID: "t-1", Err: typedError{"timeout", "Deadline exceeded calling ledger"}},
		{ID: "t-2", Err: typedError{"timeout", "deadline exceeded calling ledger"}, At: old},
		{ID: "g-1", Err: gatewayDown(), At: old},
		{ID: "g-2", Err: gatewayDown()},
		{ID: "v-1", Err: typedError{"invalid_amount", "amount must be positive"}},
	}
	dlqfill.Fill(t, fx.rabbit.Conn, fx.queue, len(failures), func(i int) dlqfill.Failure {
		f := failures[i]
		f.Handler = "payments"
		return f
	})
	cases := []struct {
		name  string
		query string
		want  []string
	}{
		{"everything", "", []string{"t-1", "t-2", "g-1", "g-2", "v-1"}},
		{"error type", "error_type=timeout", []string{"t-1", "t-2"}},
		{"older than", "older_than=1h", []string{"t-2", "g-1"}},
		{"older than, in days", "older_than=1d", nil},
		{"error type and age", "error_type=gateway_down&older_than=2h", []string{"g-1"}},
		{"text in the error, any case", "q=DEADLINE", []string{"t-1", "t-2"}},
		{"text in the error type", "q=invalid_am", []string{"v-1"}},
		{"text and error type", "q=503&error_type=gateway_down", []string{"g-1", "g-2"}},
		{"nothing matches", "q=no+such+text", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := listAPI(t, fx, tc.query)
			assert.Equal(t, tc.want, l.ids())
			assert.Equal(t, len(tc.want), l.Matched)
			assert.Equal(t, 5, l.Total)
			code, page := fx.get(t, "/queues/"+fx.queue+"?"+tc.query)
			require.Equal(t, http.StatusOK, code, page)
			for _, id := range []string{"t-1", "t-2", "g-1", "g-2", "v-1"} {
				if contains(tc.want, id) {
					assert.Contains(t, page, `/messages/`+id+`"`)
				} else {
					assert.NotContains(t, page, `/messages/`+id+`"`)
				}
			}
		})
	}
	_, page := fx.get(t, "/queues/"+fx.queue+"?error_type=timeout&q=ledger")
	assert.Contains(t, page, "Messages 1–2 of 2 matching (5 in <code>"+topology.DLQ(fx.queue)+"</code>)")
	assert.Contains(t, page, `<option value="timeout" selected>timeout</option>`)
	assert.Contains(t, page, `value="ledger"`)
	code, _ := fx.get(t, "/queues/"+fx.queue+"?older_than=soon")
	assert.Equal(t, http.StatusBadRequest, code)
	code, _ = fx.get(t, "/api/v1/queues/"+fx.queue+"/messages?older_than=-1h")
	assert.Equal(t, http.StatusBadRequest, code)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestArchiveAndSelection: several messages selected with the list's checkboxes are
// archived through the confirmation; the archive is browsed like the DLQ (groups,
// messages, a message) and a selection restored from it to the queue, by the form and by
// the API; a selection is purged.
func TestArchiveAndSelection(t *testing.T) {
	fx := newFixture(t, nil)
	q, dlqName, archive := fx.queue, topology.DLQ(fx.queue), topology.Archive(fx.queue)
	fx.rabbit.DeleteQueues(archive)
	for _, id := range []string{"s-1", "s-2", "s-3", "s-4", "s-5"} {
		fx.deadLetter(t, id, `{"id":"`+id+`"}`, gatewayDown(), nil)
	}
	csrf := fx.console.CSRFToken()
	form := func(v url.Values) (int, string) {
		return fx.do(t, http.MethodPost, "/queues/"+q+"/actions", v.Encode(), http.Header{"Content-Type": {"application/x-www-form-urlencoded"}})
	}

	_, page := fx.get(t, "/queues/"+q)
	assert.Contains(t, page, `<form method="get" action="/queues/`+q+`/confirm" id="selection">`)
	assert.Contains(t, page, `<input type="checkbox" name="id" value="s-3" class="select">`)
	assert.Contains(t, page, `<button type="submit" name="op" value="archive" class="op op-archive" id="selected-archive">archive</button>`)
	assert.Contains(t, page, `href="/queues/`+q+`?source=archive" id="to-archive"`)

	// The selection's form is a GET of the confirmation with the ids checked.
	code, page := fx.get(t, "/queues/"+q+"/confirm?op=archive&id=s-1&id=s-2&id=s-3")
	require.Equal(t, http.StatusOK, code, page)
	assert.Contains(t, page, "Move 3 message(s) from <code>"+dlqName+"</code> to <code>"+archive+"</code>?")
	for _, id := range []string{"s-1", "s-2", "s-3"} {
		assert.Contains(t, page, `<input type="hidden" name="id" value="`+id+`">`)
	}
	code, page = form(url.Values{"op": {"archive"}, "id": {"s-1", "s-2", "s-3"}, "csrf": {csrf}})
	require.Equal(t, http.StatusOK, code, page)
	assert.Contains(t, page, "Archived 3 of 3 selected message(s)")
	assert.Equal(t, 2, fx.rabbit.Count(dlqName))
	assert.Equal(t, 3, fx.rabbit.Count(archive))

	t.Run("the archive is browsed like the DLQ", func(t *testing.T) {
		code, page := fx.get(t, "/queues/"+q+"?source=archive")
		require.Equal(t, http.StatusOK, code, page)
		assert.Contains(t, page, "Archive of <code>"+q+"</code>")
		assert.Contains(t, page, "Messages 1–3 of 3")
		assert.Contains(t, page, `href="/queues/`+q+`/messages/s-2?source=archive"`)
		assert.NotContains(t, page, `/messages/s-4`)
		assert.Contains(t, page, `<input type="hidden" name="source" value="archive">`)
		assert.Contains(t, page, `value="restore" class="op op-restore"`)
		assert.NotContains(t, page, `value="archive" class="op op-archive"`, "archived messages are not archived again")
		assert.Contains(t, page, `&amp;source=archive">restore</a>`, "each group can be restored")
		l := listAPI(t, fx, "source=archive")
		assert.Equal(t, []string{"s-1", "s-2", "s-3"}, l.ids())
		assert.Equal(t, archive, l.Source)
		code, page = fx.get(t, "/queues/"+q+"/messages/s-2?source=archive")
		require.Equal(t, http.StatusOK, code, page)
		assert.Contains(t, page, `id="archived"`)
		assert.Contains(t, page, `confirm?op=restore&amp;id=s-2&amp;source=archive`)
		assert.NotContains(t, page, `id="edit-form"`, "an archived message is restored, not edited")
		code, _ = fx.get(t, "/queues/"+q+"/messages/s-4?source=archive")
		assert.Equal(t, http.StatusNotFound, code)
		code, body := fx.get(t, "/api/v1/queues/"+q+"/groups?source=archive")
		require.Equal(t, http.StatusOK, code, body)
		assert.Contains(t, body, `"total": 3`)
	})
	t.Run("restore a selection from the archive", func(t *testing.T) {
		code, page := fx.get(t, "/queues/"+q+"/confirm?op=restore&source=archive&id=s-1&id=s-2")
		require.Equal(t, http.StatusOK, code, page)
		assert.Contains(t, page, "Restore 2 message(s) from <code>"+archive+"</code>")
		code, page = form(url.Values{"op": {"restore"}, "source": {"archive"}, "id": {"s-1", "s-2"}, "csrf": {csrf}})
		require.Equal(t, http.StatusOK, code, page)
		assert.Contains(t, page, "Restored 2 of 2 selected message(s) of <code>"+archive+"</code>")
		assert.Equal(t, 2, fx.rabbit.Count(q))
		assert.Equal(t, 1, fx.rabbit.Count(archive))
		code, body := fx.do(t, http.MethodPost, "/api/v1/queues/"+q+"/restore", `{"ids":["s-3"]}`, http.Header{console.CSRFHeader: {csrf}})
		require.Equal(t, http.StatusOK, code, body)
		assert.Contains(t, body, `"moved": 1`)
		assert.Contains(t, body, `"source": "`+archive+`"`)
		assert.Equal(t, 3, fx.rabbit.Count(q))
		assert.Equal(t, 0, fx.rabbit.Count(archive))
		code, body = fx.do(t, http.MethodPost, "/api/v1/queues/"+q+"/archive", `{"ids":["s-4"],"source":"archive"}`, http.Header{console.CSRFHeader: {csrf}})
		assert.Equal(t, http.StatusBadRequest, code, body)
	})
	t.Run("purge a selection", func(t *testing.T) {
		code, page := form(url.Values{"op": {"purge"}, "id": {"s-4", "s-5"}, "csrf": {csrf}})
		require.Equal(t, http.StatusOK, code, page)
		assert.Contains(t, page, "Purged 2 of 2")
		assert.Equal(t, 0, fx.rabbit.Count(dlqName))
	})
	actions := map[string]int{}
	for _, ev := range auditEvents(t, fx) {
		actions[ev.Action+" "+ev.Source+" "+ev.Result]++
		assert.Equal(t, "console:loopback", ev.Actor)
	}
	assert.Equal(t, 1, actions["archive "+dlqName+" ok"])
	assert.Equal(t, 2, actions["replay "+archive+" ok"], "a restore is a replay from the archive")
	assert.Equal(t, 1, actions["purge "+dlqName+" ok"])
}
