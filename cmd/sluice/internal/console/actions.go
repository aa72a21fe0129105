package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/dlq"
)

// Ops are the actions the console offers on a message or a group.
var Ops = []string{"replay", "archive", "purge"}

// ErrBadRequest means an action named no op the console knows, or not exactly one of a
// message id and a group.
var ErrBadRequest = errors.New("bad request")

// ActionRequest is the body of POST /api/v1/queues/{queue}/{op}: one or more message ids,
// or one group.
type ActionRequest struct {
	IDs   []string `json:"ids,omitempty"`
	Group string   `json:"group,omitempty"`
}

// selector returns the dlq.Selector of req, refusing anything but ids or one group: the
// console never offers "everything" (the CLI's --all does).
func (req ActionRequest) selector() (dlq.Selector, error) {
	for _, id := range req.IDs {
		if id == "" {
			return dlq.Selector{}, fmt.Errorf("an empty message id: %w", ErrBadRequest)
		}
	}
	switch {
	case len(req.IDs) > 0 && req.Group != "":
		return dlq.Selector{}, fmt.Errorf("give message ids or a group, not both: %w", ErrBadRequest)
	case len(req.IDs) == 0 && req.Group == "":
		return dlq.Selector{}, fmt.Errorf("give message ids or a group: %w", ErrBadRequest)
	}
	return dlq.Selector{IDs: req.IDs, Group: req.Group}, nil
}

// ActionResult is the body of a successful POST /api/v1/queues/{queue}/{op}: the
// operation's result and who did it, as the audit trail names them.
type ActionResult struct {
	dlq.Result
	// Actor is "console:<token name>" ("console:loopback" without access control).
	Actor string `json:"actor"`
}

// act runs op on the messages req selects in queue's DLQ, as the identity in ctx.
func (s *Server) act(ctx context.Context, queue, op string, req ActionRequest) (dlq.Result, error) {
	sel, err := req.selector()
	if err != nil {
		return dlq.Result{}, err
	}
	o := dlq.NewOperator(s.cfg.Conn)
	o.Actor = identityOf(ctx).Actor()
	switch op {
	case "replay":
		return o.Replay(ctx, queue, sel, dlq.Options{})
	case "archive":
		return o.Archive(ctx, queue, sel, dlq.Options{})
	case "purge":
		return o.Purge(ctx, queue, sel, dlq.Options{})
	}
	return dlq.Result{}, fmt.Errorf("unknown action %q (want replay, archive or purge): %w", op, ErrBadRequest)
}

// status maps an error of a read or an action to its HTTP status.
func status(err error) int {
	switch {
	case errors.Is(err, ErrBadRequest), errors.Is(err, dlq.ErrNoSelector):
		return http.StatusBadRequest
	case errors.Is(err, sluice.ErrQueueNotFound), errors.Is(err, dlq.ErrMessageNotFound),
		errors.Is(err, dlq.ErrNothingSelected), errors.Is(err, errNotSluice):
		return http.StatusNotFound
	case errors.Is(err, context.DeadlineExceeded):
		return http.StatusGatewayTimeout
	}
	return http.StatusInternalServerError
}

// verb is how a result page names op done.
func verb(op string) string {
	switch op {
	case "replay":
		return "Replayed"
	case "archive":
		return "Archived"
	case "purge":
		return "Purged"
	}
	return op
}
