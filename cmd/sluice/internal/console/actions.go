package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/internal/topology"
)

// Ops are the actions the console offers on a message, a selection or a group of a DLQ.
var Ops = []string{"replay", "archive", "purge"}

// ArchiveOps are the actions it offers on archived messages: restore (a replay from
// Q.dlq.archive to the message's original queue) and purge.
var ArchiveOps = []string{"restore", "purge"}

// knownOp reports whether op is an action the console runs.
func knownOp(op string) bool { return slices.Contains(Ops, op) || slices.Contains(ArchiveOps, op) }

// opsFor returns the actions offered on the messages of src.
func opsFor(src dlq.Source) []string {
	if src == dlq.FromArchive {
		return ArchiveOps
	}
	return Ops
}

// ErrBadRequest means an action named no op the console knows, or not exactly one of a
// message id and a group.
var ErrBadRequest = errors.New("bad request")

// Sources a request names: "dlq" (or empty) and "archive".
const (
	sourceDLQ     = "dlq"
	sourceArchive = "archive"
)

// parseSource reads a request's source ("", "dlq" or "archive").
func parseSource(v string) (dlq.Source, error) {
	switch v {
	case "", sourceDLQ:
		return dlq.FromDLQ, nil
	case sourceArchive:
		return dlq.FromArchive, nil
	}
	return dlq.FromDLQ, fmt.Errorf("source %q is not dlq or archive: %w", v, ErrBadRequest)
}

// ActionRequest is the body of POST /api/v1/queues/{queue}/{op}: one or more message ids,
// or one group, of the DLQ or (Source "archive") of the archive.
type ActionRequest struct {
	IDs   []string `json:"ids,omitempty"`
	Group string   `json:"group,omitempty"`
	// Source is "dlq" (or empty) or "archive". A restore always reads the archive.
	Source string `json:"source,omitempty"`
	// Compensated confirms a replay or restore of dead letters whose compensation event
	// was published (dlq.Options.Compensated); without it they are refused (409).
	Compensated bool `json:"compensated,omitempty"`
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

// operator returns an Operator acting as the identity in ctx, recording on the
// configured audit exchange.
func (s *Server) operator(ctx context.Context) *dlq.Operator {
	return &dlq.Operator{Conn: s.cfg.Conn, Actor: identityOf(ctx).Actor(), AuditExchange: s.cfg.AuditExchange}
}

// sourceQueue is the queue src names for queue: Q.dlq or Q.dlq.archive.
func sourceQueue(src dlq.Source, queue string) string {
	if src == dlq.FromArchive {
		return topology.Archive(queue)
	}
	return topology.DLQ(queue)
}

// inspector returns an Inspector reading src.
func (s *Server) inspector(src dlq.Source) *dlq.Inspector {
	return &dlq.Inspector{Conn: s.cfg.Conn, From: src}
}

// act runs op on the messages req selects in queue's DLQ (or archive), as the identity in
// ctx.
func (s *Server) act(ctx context.Context, queue, op string, req ActionRequest) (dlq.Result, error) {
	sel, err := req.selector()
	if err != nil {
		return dlq.Result{}, err
	}
	src, err := parseSource(req.Source)
	if err != nil {
		return dlq.Result{}, err
	}
	o := s.operator(ctx)
	switch op {
	case "replay":
		return o.Replay(ctx, queue, sel, dlq.Options{From: src, Compensated: req.Compensated})
	case "restore":
		return o.Replay(ctx, queue, sel, dlq.Options{From: dlq.FromArchive, Compensated: req.Compensated})
	case "archive":
		if src == dlq.FromArchive {
			return dlq.Result{}, fmt.Errorf("archived messages are archived already (restore or purge them): %w", ErrBadRequest)
		}
		return o.Archive(ctx, queue, sel, dlq.Options{})
	case "purge":
		return o.Purge(ctx, queue, sel, dlq.Options{From: src})
	}
	return dlq.Result{}, fmt.Errorf("unknown action %q (want replay, archive, purge or restore): %w", op, ErrBadRequest)
}

// status maps an error of a read or an action to its HTTP status.
func status(err error) int {
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		return http.StatusRequestEntityTooLarge
	case errors.Is(err, ErrBadRequest), errors.Is(err, dlq.ErrNoSelector), errors.Is(err, dlq.ErrEditRefused):
		return http.StatusBadRequest
	case errors.Is(err, sluice.ErrQueueNotFound), errors.Is(err, dlq.ErrMessageNotFound),
		errors.Is(err, dlq.ErrNothingSelected), errors.Is(err, errNotSluice):
		return http.StatusNotFound
	case errors.Is(err, dlq.ErrCompensated):
		// The operator's confirmation is missing: the request conflicts with what the
		// message's record says happened.
		return http.StatusConflict
	case errors.Is(err, dlq.ErrAuditUnavailable):
		return http.StatusServiceUnavailable
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
	case "restore":
		return "Restored"
	case "archive":
		return "Archived"
	case "purge":
		return "Purged"
	}
	return op
}
