package console

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/sluice-go/sluice/internal/mask"
	"github.com/sluice-go/sluice/internal/topology"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Which queues use sluice's topology: RabbitMQ's management API lists queues, but it is a
// plugin a broker may not run, and AMQP itself cannot list them. The console therefore
// shows the queues it was given (sluice console --queue Q), and counts a queue as sluice's
// when its dead-letter queue Q.dlq exists (a passive declare). With Config.ManagementURL it
// adds every queue of the vhost that has a Q.dlq, and their unacknowledged counts. Any
// other queue with a Q.dlq can still be opened at /queues/{queue}. AMQP reports a queue's
// ready messages and consumers but not unacknowledged ones, so without the management API
// Unacked stays unknown (null).

// QueueStats are one queue's counts on the overview.
type QueueStats struct {
	// Queue is the queue's name.
	Queue string `json:"queue"`
	// Exists is false when the queue itself is missing (its DLQ may remain).
	Exists bool `json:"exists"`
	// Ready and Consumers are RabbitMQ's counts for the queue.
	Ready     int `json:"ready"`
	Consumers int `json:"consumers"`
	// Unacked comes from the management API; nil (null) without it.
	Unacked *int `json:"unacked"`
	// DLQ and Archive are the depths of Q.dlq and Q.dlq.archive (0 when it does not exist).
	DLQ     int `json:"dlq"`
	Archive int `json:"archive"`
	// Error says why the counts are missing, if they are.
	Error string `json:"error,omitempty"`
}

// Overview is what the overview page and GET /api/v1/queues show.
type Overview struct {
	Queues []QueueStats `json:"queues"`
	// Unrouted is the depth of sluice.unrouted, nil when it does not exist.
	Unrouted *int `json:"unrouted"`
	// ManagementError says why the management API could not be read, when it is set.
	ManagementError string `json:"management_error,omitempty"`
	// DiscoveredAt is the management API (password masked) the queues were discovered
	// through, when the console was given neither queues nor a management URL and the
	// API at the AMQP host answered.
	DiscoveredAt string `json:"discovered_at,omitempty"`
	// DiscoveryURL is where the management API was looked for (password masked), when
	// it was: both when the discovery worked (then DiscoveredAt is the same) and when it
	// failed.
	DiscoveryURL string `json:"discovery_url,omitempty"`
	// DiscoveryError says why that discovery failed (masked); the overview then names the
	// remedies.
	DiscoveryError string `json:"discovery_error,omitempty"`
	// Skipped are the configured queues without a Q.dlq: not sluice's topology.
	Skipped []string `json:"skipped,omitempty"`
}

// errNotSluice means a queue has no Q.dlq.
var errNotSluice = errors.New("no dead-letter queue: not a queue with sluice's topology")

// depth returns the ready messages and consumers of name, ok false when it does not exist.
// A failed passive declare closes its channel, so each check gets its own.
func depth(conn *amqp.Connection, name string) (ready, consumers int, ok bool, err error) {
	ch, err := conn.Channel()
	if err != nil {
		return 0, 0, false, fmt.Errorf("open channel: %w", err)
	}
	q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
	if err != nil {
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.NotFound {
			return 0, 0, false, nil
		}
		return 0, 0, false, fmt.Errorf("check queue %q: %w", name, err)
	}
	_ = ch.Close()
	return q.Messages, q.Consumers, true, nil
}

// stats returns queue's counts, or errNotSluice.
func (s *Server) stats(queue string) (QueueStats, error) {
	st := QueueStats{Queue: queue}
	n, _, ok, err := depth(s.cfg.Conn, topology.DLQ(queue))
	if err != nil {
		return st, err
	}
	if !ok {
		return st, fmt.Errorf("queue %q: %w", queue, errNotSluice)
	}
	st.DLQ = n
	if st.Ready, st.Consumers, st.Exists, err = depth(s.cfg.Conn, queue); err != nil {
		return st, err
	}
	if st.Archive, _, _, err = depth(s.cfg.Conn, topology.Archive(queue)); err != nil {
		return st, err
	}
	return st, nil
}

// overview counts every configured queue (and, with the management API, every queue
// with a Q.dlq) and sluice.unrouted.
func (s *Server) overview(ctx context.Context) (Overview, error) {
	ov := Overview{Queues: []QueueStats{}}
	queues := slices.Clone(s.cfg.Queues)
	var mgmt map[string]mgmtQueue
	switch {
	case s.cfg.ManagementURL != "":
		var err error
		if mgmt, err = s.managementQueues(ctx, s.cfg.ManagementURL, managementTimeout); err != nil {
			// The AMQP counts still work: say why unacked is missing and go on.
			ov.ManagementError = s.mask(err.Error())
		}
		queues = append(queues, sluiceQueues(mgmt, topology.DLQ)...)
	case s.cfg.DiscoveryURL != "":
		var err error
		ov.DiscoveryURL = mask.URL(s.cfg.DiscoveryURL)
		if mgmt, err = s.discover(ctx); err != nil {
			ov.DiscoveryError = s.mask(err.Error())
		} else {
			ov.DiscoveredAt = ov.DiscoveryURL
		}
		queues = append(queues, sluiceQueues(mgmt, topology.DLQ)...)
	}
	slices.Sort(queues)
	for _, q := range slices.Compact(queues) {
		st, err := s.stats(q)
		if m, ok := mgmt[q]; ok && err == nil {
			st.Unacked = &m.Unacked
		}
		switch {
		case errors.Is(err, errNotSluice):
			ov.Skipped = append(ov.Skipped, q)
			continue
		case err != nil:
			st.Error = s.mask(err.Error())
		}
		ov.Queues = append(ov.Queues, st)
	}
	n, _, ok, err := depth(s.cfg.Conn, topology.UnroutedQueue)
	if err != nil {
		return ov, err
	}
	if ok {
		ov.Unrouted = &n
	}
	return ov, nil
}
