package mask_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/sluice-go/sluice/internal/mask"
)

func TestCredentials(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"amqp", "dial amqp://admin:s3cret@rabbit:5672/vhost failed", "dial amqp://admin:xxxxx@rabbit:5672/vhost failed"},
		{"postgres", "postgres://app:pa55@db/app?sslmode=disable", "postgres://app:xxxxx@db/app?sslmode=disable"},
		{"https", `{"hook":"https://bot:tok-123@hooks.example.com/x"}`, `{"hook":"https://bot:xxxxx@hooks.example.com/x"}`},
		{"redis empty user", "redis://:hunter2@cache:6379/0", "redis://:xxxxx@cache:6379/0"},
		{"amqps", "amqps://u:p@h", "amqps://u:xxxxx@h"},
		{"at in password", "amqp://u:p@ss@host/", "amqp://u:xxxxx@host/"},
		{"two urls", "a amqp://a:1@x b postgres://b:2@y", "a amqp://a:xxxxx@x b postgres://b:xxxxx@y"},
		{"percent encoded", "amqp://u:p%40ss@h", "amqp://u:xxxxx@h"},
		{"no password", "amqp://guest@localhost/", "amqp://guest@localhost/"},
		{"no userinfo", "https://example.com/a:b@c", "https://example.com/a:b@c"},
		{"port not password", "http://host:8080/path", "http://host:8080/path"},
		{"plain text", "payment 42 failed", "payment 42 failed"},
		{"empty", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, mask.Credentials(tt.in))
		})
	}
}

func TestSensitiveHeader(t *testing.T) {
	tests := []struct {
		name string
		want bool
	}{
		{"Authorization", true},
		{"proxy-authorization", true},
		{"X-Api-Key", true},
		{"x-apikey", true},
		{"Cookie", true},
		{"Set-Cookie", true},
		{"x-auth-token", true},
		{"x-client-secret", true},
		{"db_password", true},
		{"x-session-id", true},
		{"x-retry-count", false},
		{"x-original-queue", false},
		{"content-type", false},
		{"x-error-message", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, mask.SensitiveHeader(tt.name))
		})
	}
}

func TestHeader(t *testing.T) {
	tests := []struct {
		name, header, value, want string
	}{
		{"sensitive", "Authorization", "Bearer abc.def", "xxxxx"},
		{"sensitive empty", "x-api-key", "", ""},
		{"url in value", "x-db", "postgres://app:pw@db/app", "postgres://app:xxxxx@db/app"},
		{"plain", "x-tenant", "acme", "acme"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, mask.Header(tt.header, tt.value))
		})
	}
}
