package dlq

import (
	"context"
	"encoding/json"
	"sort"
	"time"

	"github.com/sluice-go/sluice/internal/dlqview"
	"github.com/sluice-go/sluice/internal/mask"
)

// Group is a failure group: the dead letters of one handler that failed with the same
// error type at the same place (see fingerprint.go).
type Group struct {
	// ID identifies the group on every read (see groupID); Selector.Group takes it.
	ID        string `json:"id"`
	Handler   string `json:"handler"`
	ErrorType string `json:"error_type"`
	// Fingerprint is where the messages failed: a panic's top frames, else the normalized
	// error message.
	Fingerprint string `json:"fingerprint"`
	// Sample is the error message of the group's first message, SampleID its id.
	Sample   string `json:"sample"`
	SampleID string `json:"sample_id"`
	// Count is the number of messages in the group.
	Count int `json:"count"`
	// FirstFailedAt and LastFailedAt are the earliest and latest failure time (x-failed-at)
	// among them; zero when none is known.
	FirstFailedAt time.Time `json:"-"`
	LastFailedAt  time.Time `json:"-"`
}

// MarshalJSON writes the failure times as RFC 3339, null when unknown.
func (g Group) MarshalJSON() ([]byte, error) {
	type plain Group
	out := struct {
		plain
		FirstFailedAt *time.Time `json:"first_failed_at"`
		LastFailedAt  *time.Time `json:"last_failed_at"`
	}{plain: plain(g)}
	if !g.FirstFailedAt.IsZero() {
		out.FirstFailedAt = &g.FirstFailedAt
	}
	if !g.LastFailedAt.IsZero() {
		out.LastFailedAt = &g.LastFailedAt
	}
	return json.Marshal(out)
}

// sampleBytes bounds Group.Sample.
const sampleBytes = 300

// Groups reads every message of queue's DLQ (or archive) and returns its failure groups,
// largest first (ties by error type, then id). Only the groups are kept in memory.
func (i Inspector) Groups(ctx context.Context, queue string) ([]Group, error) {
	byID := map[string]*Group{}
	_, err := i.scanWith(ctx, queue, selectionRecord, func(r Record) bool {
		g := byID[r.GroupID]
		if g == nil {
			g = &Group{
				ID: r.GroupID, Handler: dlqview.Bounded(r.Handler, dlqview.HeaderValueBytes),
				ErrorType:   dlqview.Bounded(r.ErrorType, dlqview.HeaderValueBytes),
				Fingerprint: dlqview.Bounded(r.Fingerprint, dlqview.HeaderValueBytes),
				Sample:      dlqview.ShortError(mask.Credentials(r.ErrorMessage), sampleBytes), SampleID: r.ID,
			}
			byID[r.GroupID] = g
		}
		g.Count++
		if !r.FailedAt.IsZero() {
			if g.FirstFailedAt.IsZero() || r.FailedAt.Before(g.FirstFailedAt) {
				g.FirstFailedAt = r.FailedAt
			}
			if r.FailedAt.After(g.LastFailedAt) {
				g.LastFailedAt = r.FailedAt
			}
		}
		return true
	})
	if err != nil {
		return nil, err
	}
	groups := make([]Group, 0, len(byID))
	for _, g := range byID {
		groups = append(groups, *g)
	}
	sort.Slice(groups, func(a, b int) bool {
		x, y := groups[a], groups[b]
		if x.Count != y.Count {
			return x.Count > y.Count
		}
		if x.ErrorType != y.ErrorType {
			return x.ErrorType < y.ErrorType
		}
		return x.ID < y.ID
	})
	return groups, nil
}
