package telemetry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/mask"
)

// errManagementURL is returned by NewManagementSource for a URL it cannot use.
var errManagementURL = errors.New("telemetry: invalid RabbitMQ management URL")

// managementSource reads queue depths from RabbitMQ's management HTTP API; see
// NewManagementSource.
type managementSource struct {
	base   *url.URL // scheme, host and path prefix, without credentials
	user   string
	pass   string
	vhost  string
	client *http.Client
}

// NewManagementSource returns a source that reads queue depths from RabbitMQ's management
// HTTP API (rabbitmq_management plugin) at rawURL, such as
// "http://user:password@rabbit:15672" (a path prefix is kept), for queues of vhost ("" means
// "/"). It is the only place RabbitMQ reports a queue's unacknowledged messages; its numbers
// are the plugin's statistics, refreshed every collect_statistics_interval (5 s by
// default), so they may lag that much. Credentials in the URL are sent as basic auth and
// never appear in errors.
func NewManagementSource(rawURL, vhost string) (DepthSource, error) {
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%w: %q (want http[s]://user:password@host:15672)", errManagementURL, mask.URL(rawURL))
	}
	s := &managementSource{vhost: vhost, client: &http.Client{Timeout: 10 * time.Second}}
	if s.vhost == "" {
		s.vhost = "/"
	}
	if u.User != nil {
		s.user = u.User.Username()
		s.pass, _ = u.User.Password()
	}
	base := *u
	base.User, base.RawQuery, base.Fragment = nil, "", ""
	base.Path = strings.TrimSuffix(base.Path, "/")
	s.base = &base
	return s, nil
}

// queueStats are the fields of GET /api/queues/{vhost}/{name} sluice reads. A queue the
// statistics have not caught up with yet has none of them.
type queueStats struct {
	Ready     *int64 `json:"messages_ready"`
	Unacked   *int64 `json:"messages_unacknowledged"`
	Consumers *int64 `json:"consumers"`
}

// QueueDepth reads queue's ready and unacknowledged messages and consumers; a queue the
// API does not know (404) is sluice.ErrQueueNotFound.
func (s *managementSource) QueueDepth(ctx context.Context, queue string) (sluice.QueueDepth, error) {
	u := *s.base
	// The vhost "/" must travel as %2F: RawPath keeps that encoding, Path is its decoded form.
	u.Path = s.base.Path + "/api/queues/" + s.vhost + "/" + queue
	u.RawPath = s.base.EscapedPath() + "/api/queues/" + url.PathEscape(s.vhost) + "/" + url.PathEscape(queue)
	u.RawQuery = "columns=messages_ready,messages_unacknowledged,consumers"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return sluice.QueueDepth{}, fmt.Errorf("read depth of queue %q: %w", queue, err)
	}
	if s.user != "" {
		req.SetBasicAuth(s.user, s.pass)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		// The URL in a client error carries no credentials: they are not in s.base.
		return sluice.QueueDepth{}, fmt.Errorf("read depth of queue %q: %w", queue, err)
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound:
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		return sluice.QueueDepth{}, fmt.Errorf("queue %q in vhost %q: %w", queue, s.vhost, sluice.ErrQueueNotFound)
	default:
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		return sluice.QueueDepth{}, fmt.Errorf("read depth of queue %q: %s answered %s", queue, s.base.Host, resp.Status)
	}
	var st queueStats
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&st); err != nil {
		return sluice.QueueDepth{}, fmt.Errorf("read depth of queue %q: decode the management API's answer: %w", queue, err)
	}
	d := sluice.QueueDepth{Ready: deref(st.Ready), Consumers: deref(st.Consumers)}
	if st.Unacked != nil {
		d.Unacked, d.UnackedKnown = *st.Unacked, true
	}
	return d, nil
}

func deref(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}
