package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/internal/dlqview"
)

// pageSize is how many messages one page of a list shows (and the API returns).
const pageSize = 200

// filter is what a list of messages shows: the DLQ or the archive, the filters the CLI's
// selectors have (a group, an error type, an age), a text searched in the error, and a
// page.
type filter struct {
	Source dlq.Source
	// Group, ErrorType and OlderThan select as dlq.Selector does.
	Group     string
	ErrorType string
	OlderThan time.Duration
	// Text is searched, case-insensitively, in the error message and the error type.
	Text string
	// Page counts from 1.
	Page int
}

// parseFilter reads ?source=, ?group=, ?error_type=, ?older_than= (a Go duration, or
// days as "2d"), ?q= and ?page=.
func parseFilter(r *http.Request) (filter, error) {
	q := r.URL.Query()
	f := filter{Group: q.Get("group"), ErrorType: q.Get("error_type"), Text: strings.TrimSpace(q.Get("q")), Page: 1}
	var err error
	if f.Source, err = parseSource(q.Get("source")); err != nil {
		return f, err
	}
	if v := strings.TrimSpace(q.Get("older_than")); v != "" {
		if f.OlderThan, err = parseAge(v); err != nil || f.OlderThan < 0 {
			return f, fmt.Errorf("older_than=%q is not an age such as 30m, 1h or 2d: %w", v, ErrBadRequest)
		}
	}
	if v := q.Get("page"); v != "" {
		if f.Page, err = strconv.Atoi(v); err != nil || f.Page < 1 {
			return f, fmt.Errorf("page=%q is not a page number (1 is the first): %w", v, ErrBadRequest)
		}
	}
	return f, nil
}

// parseAge reads a Go duration, or a whole number of days ("2d").
func parseAge(v string) (time.Duration, error) {
	if days, ok := strings.CutSuffix(v, "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil {
			return 0, err
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	return time.ParseDuration(v)
}

// selector is the part of f dlq.Selector matches.
func (f filter) selector() dlq.Selector {
	return dlq.Selector{Group: f.Group, ErrorType: f.ErrorType, OlderThan: f.OlderThan}
}

// match reports whether rec's error holds f's text.
func (f filter) match(rec dlq.Record) bool {
	if f.Text == "" {
		return true
	}
	t := strings.ToLower(f.Text)
	return strings.Contains(strings.ToLower(rec.ErrorMessage), t) || strings.Contains(strings.ToLower(rec.ErrorType), t)
}

// Filtered reports whether any filter is set.
func (f filter) Filtered() bool {
	return f.Group != "" || f.ErrorType != "" || f.OlderThan != 0 || f.Text != ""
}

// Archive reports whether f reads the archive.
func (f filter) Archive() bool { return f.Source == dlq.FromArchive }

// SourceParam is the source as a query parameter: "archive", or "" for the DLQ.
func (f filter) SourceParam() string {
	if f.Source == dlq.FromArchive {
		return sourceArchive
	}
	return ""
}

// Age is OlderThan as the filter form shows it.
func (f filter) Age() string {
	if f.OlderThan == 0 {
		return ""
	}
	if f.OlderThan%(24*time.Hour) == 0 {
		return strconv.Itoa(int(f.OlderThan/(24*time.Hour))) + "d"
	}
	return f.OlderThan.String()
}

// values are f's query parameters, for links that keep it, on page.
func (f filter) values(page int) url.Values {
	v := url.Values{}
	set := func(k, val string) {
		if val != "" {
			v.Set(k, val)
		}
	}
	set("source", f.SourceParam())
	set("group", f.Group)
	set("error_type", f.ErrorType)
	set("older_than", f.Age())
	set("q", f.Text)
	if page > 1 {
		v.Set("page", strconv.Itoa(page))
	}
	return v
}

// Listing is one page of a DLQ's (or archive's) messages.
type Listing struct {
	// Messages are the page's messages, head first: summaries only, so 200 dead letters of
	// 20 MB each cost no more memory than one.
	Messages []dlqview.Summary `json:"messages"`
	// Total is how many messages the queue held when the read started; Matched how many of
	// them the filters match.
	Total   int `json:"total"`
	Matched int `json:"matched"`
	// Page (from 1) and Pages; First and Last number the page's messages among the
	// matched ones (1-based; 0 when the page is empty).
	Page     int `json:"page"`
	Pages    int `json:"pages"`
	PageSize int `json:"page_size"`
	First    int `json:"first"`
	Last     int `json:"last"`
	// PrevURL and NextURL are the queue page's links to the pages around, when there are.
	PrevURL string `json:"-"`
	NextURL string `json:"-"`
}

// listMessages reads one page of the messages of queue's source that f matches. The whole
// source is read (a read gives every message back, in order), and the matches are
// counted; only the page's summaries are kept.
func (s *Server) listMessages(ctx context.Context, queue string, f filter) (Listing, error) {
	l := Listing{Messages: []dlqview.Summary{}, Page: f.Page, PageSize: pageSize}
	skip := (f.Page - 1) * pageSize
	total, err := s.inspector(f.Source).Messages(ctx, queue, f.selector(), func(rec dlq.Record) bool {
		if !f.match(rec) {
			return true
		}
		l.Matched++
		if l.Matched > skip && l.Matched <= skip+pageSize {
			l.Messages = append(l.Messages, dlqview.SummaryOf(dlqview.Record(rec)))
		}
		return true
	})
	l.Total = total
	if err != nil {
		return l, err
	}
	if f.Group != "" && l.Matched == 0 && !f.narrowed() {
		return l, errors.Join(dlq.ErrNothingSelected, errors.New("no message of group "+f.Group+" in "+sourceQueue(f.Source, queue)))
	}
	l.Pages = max(1, (l.Matched+pageSize-1)/pageSize)
	if len(l.Messages) > 0 {
		l.First, l.Last = skip+1, skip+len(l.Messages)
	}
	base := "/queues/" + url.PathEscape(queue) + "?"
	if f.Page > 1 {
		l.PrevURL = base + f.values(min(f.Page-1, l.Pages)).Encode()
	}
	if l.Last > 0 && l.Last < l.Matched {
		l.NextURL = base + f.values(f.Page+1).Encode()
	}
	return l, nil
}

// narrowed reports whether a filter other than the group is set: a group link with no
// message left is stale (404), a search within a group that finds nothing is not.
func (f filter) narrowed() bool { return f.ErrorType != "" || f.OlderThan != 0 || f.Text != "" }
