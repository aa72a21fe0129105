package retryview_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/cmd/sluice/internal/retryview"
)

func TestEndpointURL(t *testing.T) {
	tests := []struct {
		name, base, want string
		query            map[string][]string
		wantErr          bool
	}{
		{name: "a URL", base: "http://127.0.0.1:9464", want: "http://127.0.0.1:9464/debug/sluice/retries"},
		{name: "a trailing slash and a path", base: "https://ops.example/svc/", want: "https://ops.example/svc/debug/sluice/retries"},
		{name: "a bare METRICS_ADDR", base: "127.0.0.1:9464", want: "http://127.0.0.1:9464/debug/sluice/retries"},
		{name: "a query", base: "http://h:1", query: map[string][]string{"handler": {"pay"}}, want: "http://h:1/debug/sluice/retries?handler=pay"},
		{name: "not http", base: "ftp://x", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := retryview.EndpointURL(tc.base, retryview.RetriesPath, tc.query)
			if tc.wantErr {
				require.ErrorIs(t, err, retryview.ErrNotHTTP)
				assert.Contains(t, err.Error(), tc.base+" is not an http(s) URL")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestSource_Describe(t *testing.T) {
	tests := []struct {
		name string
		src  retryview.Source
		want string
	}{
		{name: "default", want: "the service at " + retryview.DefaultServiceURL + retryview.RetriesPath},
		{name: "service", src: retryview.Source{ServiceURL: "http://ops:pw@svc:9464"}, want: "the service at http://ops:xxxxx@svc:9464" + retryview.RetriesPath},
		{name: "Prometheus", src: retryview.Source{ServiceURL: "http://svc:9464", PrometheusURL: " http://ops:pw@prom:9090 "}, want: "Prometheus at http://ops:xxxxx@prom:9090"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, tc.src.Describe())
		})
	}
}

// names checks that an error names the settings that choose the source.
func names(settings ...string) func(t *testing.T, err error) {
	return func(t *testing.T, err error) {
		for _, s := range settings {
			assert.Contains(t, err.Error(), s)
		}
	}
}

func TestSource_Failures(t *testing.T) {
	notFound := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"error":"no retry statistics"}`))
	}))
	t.Cleanup(notFound.Close)
	tests := []struct {
		name  string
		src   retryview.Source
		want  string
		check func(t *testing.T, err error)
	}{
		{name: "unreachable service", src: retryview.Source{ServiceURL: "http://ops:s3cr3tpw@127.0.0.1:1"},
			want: "cannot reach the service at http://ops:xxxxx@127.0.0.1:1/debug/sluice/retries", check: names("PROMETHEUS_URL", "SLUICE_SERVICE_URL")},
		{name: "unreachable Prometheus", src: retryview.Source{PrometheusURL: "http://ops:s3cr3tpw@127.0.0.1:1"},
			want: "cannot reach Prometheus at http://ops:xxxxx@127.0.0.1:1/api/v1/query", check: names("PROMETHEUS_URL", "SLUICE_SERVICE_URL")},
		{name: "an answer other than 200", src: retryview.Source{ServiceURL: notFound.URL},
			want: "answered 404 Not Found: no retry statistics", check: func(t *testing.T, err error) {
				var he *retryview.HTTPError
				require.True(t, errors.As(err, &he))
				assert.Equal(t, http.StatusNotFound, he.Status)
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.src.Retries(context.Background(), "", time.Hour)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.NotContains(t, err.Error(), "s3cr3tpw")
			if tc.check != nil {
				tc.check(t, err)
			}
		})
	}
}
