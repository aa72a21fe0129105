package console

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// managementTimeout bounds one call to RabbitMQ's management API.
const managementTimeout = 5 * time.Second

// mgmtQueue is a queue as GET /api/queues/{vhost} lists it.
type mgmtQueue struct {
	Name      string `json:"name"`
	Ready     int    `json:"messages_ready"`
	Unacked   int    `json:"messages_unacknowledged"`
	Consumers int    `json:"consumers"`
}

// managementQueues lists the vhost's queues through the management API at
// Config.ManagementURL (credentials in its userinfo).
func (s *Server) managementQueues(ctx context.Context) (map[string]mgmtQueue, error) {
	base, err := url.Parse(s.cfg.ManagementURL)
	if err != nil {
		return nil, fmt.Errorf("management URL: %w", err)
	}
	user := base.User
	base.User = nil
	vhost := s.cfg.VHost
	if vhost == "" {
		vhost = "/"
	}
	u := strings.TrimRight(base.String(), "/") + "/api/queues/" + url.PathEscape(vhost) +
		"?columns=name,messages_ready,messages_unacknowledged,consumers"
	ctx, cancel := context.WithTimeout(ctx, managementTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	if user != nil {
		pw, _ := user.Password()
		req.SetBasicAuth(user.Username(), pw)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("management API at %s: %w", base.Redacted(), err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("management API at %s: GET /api/queues: %s", base.Redacted(), resp.Status)
	}
	var list []mgmtQueue
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		return nil, fmt.Errorf("management API at %s: decode the queue list: %w", base.Redacted(), err)
	}
	byName := make(map[string]mgmtQueue, len(list))
	for _, q := range list {
		byName[q.Name] = q
	}
	return byName, nil
}

// sluiceQueues returns the queues of byName that use sluice's topology: those with a
// Q.dlq beside them.
func sluiceQueues(byName map[string]mgmtQueue, dlqName func(string) string) []string {
	var out []string
	for name := range byName {
		if _, ok := byName[dlqName(name)]; ok {
			out = append(out, name)
		}
	}
	return out
}
