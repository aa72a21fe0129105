// Package jaeger reads traces from Jaeger's HTTP query API (/api/traces, the JSON API the
// Jaeger UI uses), for the sluice CLI's trace command and for end-to-end tests that
// check what a message's trace looks like.
package jaeger

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"
)

// DefaultQueryURL is where scripts/jaeger-start.sh serves the query API.
const DefaultQueryURL = "http://127.0.0.1:16686"

// ErrNotFound is returned when Jaeger has no trace with the requested ID.
var ErrNotFound = errors.New("jaeger: trace not found")

// maxResponseBytes bounds what a response may make the client read into memory.
const maxResponseBytes = 64 << 20

// Query selects traces in Search. Service is required.
type Query struct {
	// Service is the service.name whose traces are searched.
	Service string
	// Operation, if set, is a span name the trace must contain.
	Operation string
	// Tags must all match on one span of the trace.
	Tags map[string]string
	// Start and End bound the traces' start times; zero values mean Jaeger's defaults
	// (the last two days, up to now).
	Start, End time.Time
	// Limit is the most traces returned; 0 means Jaeger's default (100).
	Limit int
}

// Client queries one Jaeger. The zero value is not usable: BaseURL is required.
type Client struct {
	// BaseURL is the query service's address, such as DefaultQueryURL.
	BaseURL string
	// HTTPClient is the client requests go through; nil means http.DefaultClient.
	HTTPClient *http.Client
}

// GetTrace fetches the trace traceID from the Jaeger at baseURL with http.DefaultClient.
func GetTrace(ctx context.Context, baseURL, traceID string) (Trace, error) {
	return (&Client{BaseURL: baseURL}).GetTrace(ctx, traceID)
}

// FindTraces returns the traces of service that started within lookback of now and have
// a span carrying all of tags, from the Jaeger at baseURL with http.DefaultClient.
func FindTraces(ctx context.Context, baseURL, service string, tags map[string]string, lookback time.Duration) ([]Trace, error) {
	return (&Client{BaseURL: baseURL}).FindTraces(ctx, service, tags, lookback)
}

// GetTrace fetches one trace. A trace Jaeger does not have yields an error wrapping
// ErrNotFound (spans reach Jaeger a moment after they end: poll for a while).
func (c *Client) GetTrace(ctx context.Context, traceID string) (Trace, error) {
	id, err := normalizeID(traceID, 32)
	if err != nil {
		return Trace{}, fmt.Errorf("jaeger: trace ID %q: %w", traceID, err)
	}
	var resp response
	if err := c.get(ctx, "/api/traces/"+id, nil, &resp); err != nil {
		return Trace{}, err
	}
	traces, err := resp.traces()
	if err != nil {
		return Trace{}, err
	}
	for _, t := range traces {
		if t.TraceID == id {
			return t, nil
		}
	}
	return Trace{}, fmt.Errorf("%w: %s", ErrNotFound, id)
}

// FindTraces returns the traces of service that started within lookback of now and have
// a span carrying all of tags, at most 1000.
func (c *Client) FindTraces(ctx context.Context, service string, tags map[string]string, lookback time.Duration) ([]Trace, error) {
	end := time.Now()
	return c.Search(ctx, Query{Service: service, Tags: tags, Start: end.Add(-lookback), End: end, Limit: 1000})
}

// Search returns the traces q selects.
func (c *Client) Search(ctx context.Context, q Query) ([]Trace, error) {
	if q.Service == "" {
		return nil, errors.New("jaeger: search needs a service name")
	}
	params := url.Values{"service": {q.Service}}
	if q.Operation != "" {
		params.Set("operation", q.Operation)
	}
	if len(q.Tags) > 0 {
		b, err := json.Marshal(q.Tags)
		if err != nil {
			return nil, fmt.Errorf("jaeger: encode tags: %w", err)
		}
		params.Set("tags", string(b))
	}
	if !q.Start.IsZero() {
		params.Set("start", strconv.FormatInt(q.Start.UnixMicro(), 10))
	}
	if !q.End.IsZero() {
		params.Set("end", strconv.FormatInt(q.End.UnixMicro(), 10))
	}
	if q.Limit > 0 {
		params.Set("limit", strconv.Itoa(q.Limit))
	}
	var resp response
	if err := c.get(ctx, "/api/traces", params, &resp); err != nil {
		return nil, err
	}
	return resp.traces()
}

// Services lists the services Jaeger has spans of; it doubles as a reachability check.
func (c *Client) Services(ctx context.Context) ([]string, error) {
	var resp struct {
		Data   []string   `json:"data"`
		Errors []apiError `json:"errors"`
	}
	if err := c.get(ctx, "/api/services", nil, &resp); err != nil {
		return nil, err
	}
	if len(resp.Errors) > 0 {
		return nil, fmt.Errorf("jaeger: services: %s", resp.Errors[0])
	}
	sort.Strings(resp.Data)
	return resp.Data, nil
}

func (c *Client) get(ctx context.Context, path string, params url.Values, into any) error {
	if c.BaseURL == "" {
		return errors.New("jaeger: client has no BaseURL")
	}
	u := strings.TrimRight(c.BaseURL, "/") + path
	if len(params) > 0 {
		u += "?" + params.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return fmt.Errorf("jaeger: request %s: %w", u, err)
	}
	req.Header.Set("Accept", "application/json")
	hc := c.HTTPClient
	if hc == nil {
		hc = http.DefaultClient
	}
	res, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("jaeger: GET %s: %w", u, err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, maxResponseBytes+1))
	if err != nil {
		return fmt.Errorf("jaeger: read response of GET %s: %w", u, err)
	}
	if len(body) > maxResponseBytes {
		return fmt.Errorf("jaeger: response of GET %s exceeds %d bytes", u, maxResponseBytes)
	}
	if res.StatusCode != http.StatusOK {
		var e response
		msg := strings.TrimSpace(string(body))
		if json.Unmarshal(body, &e) == nil && len(e.Errors) > 0 {
			msg = e.Errors[0].String()
		}
		if res.StatusCode == http.StatusNotFound {
			return fmt.Errorf("%w: GET %s: %s", ErrNotFound, u, msg)
		}
		return fmt.Errorf("jaeger: GET %s: %s: %s", u, res.Status, msg)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber() // int64 tag values beyond 2^53 must not be rounded
	if err := dec.Decode(into); err != nil {
		return fmt.Errorf("jaeger: decode response of GET %s: %w", u, err)
	}
	return nil
}

// normalizeID returns id in lower case, left-padded with zeros to n hex digits (Jaeger
// may drop leading zeros).
func normalizeID(id string, n int) (string, error) {
	id = strings.ToLower(strings.TrimSpace(id))
	if id == "" || len(id) > n {
		return "", fmt.Errorf("want 1 to %d hex digits", n)
	}
	for _, r := range id {
		if (r < '0' || r > '9') && (r < 'a' || r > 'f') {
			return "", fmt.Errorf("want 1 to %d hex digits", n)
		}
	}
	return strings.Repeat("0", n-len(id)) + id, nil
}
