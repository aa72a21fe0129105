package router

import (
	"net/http"

	"github.com/sluice-go/sluice/internal/describe"
	"github.com/sluice-go/sluice/router/internal/partition"
	"github.com/sluice-go/sluice/router/internal/rebalance"
)

// AssignPartitions exposes the rendezvous assignment of partitions to members.
var AssignPartitions = rebalance.Assign

// PartitionHandlerName exposes the name of partition k's handler.
var PartitionHandlerName = partition.HandlerName

// PolicyHandler exposes the stack's policy endpoint (otelsetup serves it on
// /debug/sluice/policy).
func (s *Stack) PolicyHandler() http.Handler { return describe.PolicyHandler(s.Describe) }

// RetriesHandler exposes the stack's retry statistics endpoint, nil without statistics.
func (s *Stack) RetriesHandler() http.Handler { return describe.RetriesHandler(s.retry) }

// HasRetryReport reports whether the stack keeps retry statistics.
func (s *Stack) HasRetryReport() bool { _, ok := describe.RetryReport(s.retry); return ok }
