package dlq

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Selector chooses the messages an operation works on. Either All, or any of the filters,
// which must all match. Reads (Inspector.Messages) take the zero Selector as "every
// message"; the operations that change a queue (Operator) refuse it (ErrNoSelector).
type Selector struct {
	// IDs selects messages by id (see Record.ID); every copy of an id is selected.
	IDs []string
	// Group selects the messages of one failure group (see Group.ID).
	Group string
	// ErrorType selects messages whose Record.ErrorType is exactly this.
	ErrorType string
	// Reason selects messages whose Record.Reason is exactly this: "retry_unlikely"
	// selects what the learned retry policy stopped, to replay once the dependency heals.
	Reason string
	// OlderThan selects messages that failed at least this long ago; a message whose age
	// is unknown is not selected.
	OlderThan time.Duration
	// All selects every message.
	All bool
}

// validate reports a Selector that selects nothing explicitly (ErrNoSelector), combines
// All with a filter, or has a negative age.
func (s Selector) validate() error {
	switch {
	case s.OlderThan < 0:
		return fmt.Errorf("dlq: negative age %s", s.OlderThan)
	case s.All && s.filtered():
		return errors.New("dlq: All cannot be combined with ids, a group, an error type, a reason or an age")
	case !s.All && !s.filtered():
		return ErrNoSelector
	}
	return nil
}

func (s Selector) filtered() bool {
	return len(s.IDs) > 0 || s.Group != "" || s.ErrorType != "" || s.Reason != "" || s.OlderThan != 0
}

// match reports whether r is selected.
func (s Selector) match(r Record) bool {
	if s.All {
		return true
	}
	if len(s.IDs) > 0 && !slices.Contains(s.IDs, r.ID) {
		return false
	}
	if s.Group != "" && r.GroupID != s.Group {
		return false
	}
	if s.ErrorType != "" && r.ErrorType != s.ErrorType {
		return false
	}
	if s.Reason != "" && r.Reason != s.Reason {
		return false
	}
	if s.OlderThan > 0 && (!r.HasAge || r.Age < s.OlderThan) {
		return false
	}
	return true
}

// String describes the selector the way the CLI's flags spell it, for messages.
func (s Selector) String() string {
	if s.All {
		return "--all"
	}
	var parts []string
	for _, id := range s.IDs {
		parts = append(parts, "--id "+id)
	}
	if s.Group != "" {
		parts = append(parts, "--group "+s.Group)
	}
	if s.ErrorType != "" {
		parts = append(parts, "--error-type "+s.ErrorType)
	}
	if s.Reason != "" {
		parts = append(parts, "--reason "+s.Reason)
	}
	if s.OlderThan != 0 {
		parts = append(parts, "--older-than "+s.OlderThan.String())
	}
	return strings.Join(parts, " ")
}
