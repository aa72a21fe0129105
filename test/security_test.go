package test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	mrand "math/rand/v2"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/internal/mask"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
	"github.com/sluice-go/sluice/middleware/retry"
	"github.com/sluice-go/sluice/router"
)

// logCapture is an io.Writer that several goroutines log to.
type logCapture struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *logCapture) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *logCapture) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// rabbitmqctl runs rabbitmqctl against the shared node of the tests' RabbitMQ version
// (testenv.Ctl: the machine's node on 3.10, the 4.3 node make test starts on 4.3).
func rabbitmqctl(t *testing.T, args ...string) string {
	t.Helper()
	return testenv.Ctl(t, args...)
}

// secretForms are the ways a password can show up in text: as is, and percent-encoded as
// in a URL's user information, a query or a path.
func secretForms(password string) []string {
	forms := []string{password, url.QueryEscape(password), url.PathEscape(password)}
	userinfo := url.UserPassword("u", password).String() // "u:<encoded>"
	return append(forms, strings.TrimPrefix(userinfo, "u:"))
}

// TestPasswordNeverInLogsOrErrors runs a stack as a user with a distinctive password through
// a message, a retried and dead-lettered message, a connection the broker closes (so the
// reconnect path logs), a connect with a wrong password and a URL that does not parse, and
// checks that neither password appears in any log line or error.
func TestPasswordNeverInLogsOrErrors(t *testing.T) {
	r := testenv.NewRabbit(t)
	user := fmt.Sprintf("sluice_test_%06d", mrand.IntN(1e6))
	// Distinctive, and full of characters a URL must percent-encode.
	password := fmt.Sprintf("Pw%06d:/@%%?#&=s3cr3t!", mrand.IntN(1e6))
	wrongPassword := fmt.Sprintf("Wr0ng%06d:/@%%?#s3cr3t", mrand.IntN(1e6))
	rabbitmqctl(t, "add_user", user, password)
	t.Cleanup(func() { rabbitmqctl(t, "delete_user", user) })
	rabbitmqctl(t, "set_permissions", "-p", "/", user, ".*", ".*", ".*")

	base, err := url.Parse(r.URL)
	require.NoError(t, err)
	good := &url.URL{Scheme: "amqp", User: url.UserPassword(user, password), Host: base.Host, Path: "/"}
	wrong := &url.URL{Scheme: "amqp", User: url.UserPassword(user, wrongPassword), Host: base.Host, Path: "/"}

	var logs logCapture
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	var errs []string

	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	b, err := amqp.New(ctx, amqp.Config{URLs: []string{good.String()}, Logger: logger, ReconnectMaxInterval: 500 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })

	e := &env{name: "rabbitmq", broker: b, amqp: b, rabbit: r}
	queue := e.newQueue(t, "test.security")
	handled := make(chan string, 16)
	cfg := router.Config{Logger: logger, Retry: retry.Config{MaxRetries: 1, InitialDelay: 50 * time.Millisecond, Jitter: retry.NoJitter}}
	stack := start(t, e, cfg, func(s *router.Stack) {
		require.NoError(t, s.Handle("security", queue, func(m *message.Message) error {
			handled <- string(m.Payload)
			if string(m.Payload) == "fail" {
				return errors.New("handler refuses this one")
			}
			return nil
		}))
	})
	waitFor := func(payload string) {
		t.Helper()
		deadline := time.After(30 * time.Second)
		for {
			select {
			case p := <-handled:
				if p == payload {
					return
				}
			case <-deadline:
				t.Fatalf("message %q not handled", payload)
			}
		}
	}

	e.publish(t, queue, message.NewMessage("before-loss", []byte("before")))
	waitFor("before")
	e.publish(t, queue, message.NewMessage("failing", []byte("fail")))
	require.Eventually(t, func() bool { return r.Count(topology.DLQ(queue)) == 1 }, 30*time.Second, 50*time.Millisecond, "failing message dead-lettered")

	// Close only this test's connections: other tests share the broker.
	connected := strings.Count(logs.String(), "connected to RabbitMQ")
	closed := 0
	for _, line := range strings.Split(rabbitmqctl(t, "-q", "list_connections", "user", "pid"), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 2 && fields[0] == user {
			rabbitmqctl(t, "close_connection", fields[1], "sluice security test: connection loss")
			closed++
		}
	}
	require.Positive(t, closed, "the stack's connection was listed")
	require.Eventually(t, func() bool {
		return strings.Count(logs.String(), "connected to RabbitMQ") >= connected+closed
	}, 30*time.Second, 50*time.Millisecond, "reconnected after the connection was closed")
	e.publish(t, queue, message.NewMessage("after-loss", []byte("after")))
	waitFor("after")

	// A connect with the wrong password, and URLs that do not parse or parse oddly.
	for _, u := range []string{
		wrong.String(),
		"amqp://" + user + ":" + password + "@" + base.Host + "/%zz",
		"amqp://" + user + ":" + wrongPassword + "@" + base.Host + "/",
		"amqp:" + user + ":" + url.PathEscape(password) + "@" + base.Host,
	} {
		cctx, ccancel := context.WithTimeout(context.Background(), 15*time.Second)
		_, err := amqp.New(cctx, amqp.Config{URLs: []string{u}, Logger: logger})
		ccancel()
		if assert.Error(t, err, "connect with %s must fail", mask.URL(u)) {
			errs = append(errs, err.Error())
		}
	}
	require.NoError(t, stack.Close())
	require.NoError(t, b.Close())

	text := logs.String()
	assert.Contains(t, text, "RabbitMQ connection lost", "the connection loss was logged")
	assert.Contains(t, text, "xxxxx", "URLs are logged, masked")
	for _, form := range append(secretForms(password), secretForms(wrongPassword)...) {
		assert.NotContains(t, text, form, "password in the logs")
		for _, e := range errs {
			assert.NotContains(t, e, form, "password in an error")
		}
	}
	if t.Failed() {
		t.Logf("captured log:\n%s\nerrors:\n%s", text, strings.Join(errs, "\n"))
	}

	t.Run("payments CLI", func(t *testing.T) {
		bin := buildCommand(t, "./cmd/payments")
		q := testenv.Name("test.security.cli")
		r.DeleteQueues(q, topology.DLQ(q), q+".out", q+".out.dlq")
		cliEnv := append(os.Environ(), "PAYMENTS_QUEUE="+q, "PAYMENTS_OUTPUT_QUEUE="+q+".out", "OTEL_TRACES_EXPORTER=none")

		// Wrong password: the command must fail, saying why, without the password.
		cctx, ccancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer ccancel()
		cmd := exec.CommandContext(cctx, bin, "serve", "-v")
		cmd.Env = append(cliEnv, "AMQP_URL="+wrong.String())
		out, err := cmd.CombinedOutput()
		require.Error(t, err, "serve with a wrong password must fail: %s", out)
		assert.Contains(t, string(out), "xxxxx", "the failing URL is named, masked")

		// Right password: serve until it consumes, then stop it.
		var served logCapture
		cmd = exec.CommandContext(cctx, bin, "serve", "-v")
		cmd.Env = append(cliEnv, "AMQP_URL="+good.String())
		cmd.Stdout, cmd.Stderr = &served, &served
		require.NoError(t, cmd.Start())
		ok := assert.Eventually(t, func() bool { return strings.Contains(served.String(), "connected to RabbitMQ") },
			30*time.Second, 50*time.Millisecond, "serve connected")
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		all := string(out) + served.String()
		for _, form := range append(secretForms(password), secretForms(wrongPassword)...) {
			assert.NotContains(t, all, form, "password in the CLI's output")
		}
		if !ok || t.Failed() {
			t.Logf("CLI output:\n%s", all)
		}
	})
}

// buildCommand builds the command in dir (relative to the module root) into a temporary
// directory, skipping t when the command or the go tool is not there.
func buildCommand(t *testing.T, dir string) string {
	t.Helper()
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	if _, err := os.Stat(filepath.Join(root, dir)); err != nil {
		t.Skipf("no %s in this tree", dir)
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("go tool not found: %v", err)
	}
	bin := filepath.Join(t.TempDir(), filepath.Base(dir))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, goTool, "build", "-o", bin, dir)
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go build %s: %s", dir, out)
	return bin
}

func TestMaskURLNeverShowsPassword(t *testing.T) {
	tests := []struct {
		name   string
		url    string
		secret string
		want   string // "" means: only check the secret is gone
	}{
		{name: "plain", url: "amqp://guest:s3cret@host:5672/", secret: "s3cret", want: "amqp://guest:xxxxx@host:5672/"},
		{name: "percent-encoded", url: "amqp://u:p%40ss%2Fw0rd@host/vh", secret: "p%40ss%2Fw0rd"},
		{name: "amqps with vhost", url: "amqps://u:hunter2@h:5671/%2f", secret: "hunter2"},
		{name: "no password", url: "amqp://u@host/", want: "amqp://u@host/"},
		{name: "no user information", url: "amqp://host:5672/", want: "amqp://host:5672/"},
		{name: "empty password", url: "amqp://u:@host/", want: "amqp://u:xxxxx@host/"},
		{name: "does not parse", url: "amqp://u:p%zzsecret@host/", secret: "secret", want: "amqp://xxxxx"},
		{name: "opaque form", url: "amqp:u:opaquesecret@host", secret: "opaquesecret", want: "amqp:xxxxx@host"},
		{name: "password read as a port and path", url: "amqp://u:12/pathsecret@host/", secret: "pathsecret", want: "amqp://xxxxx@host/"},
		{name: "unescaped @ in password", url: "amqp://u:p@tsecret@host/", secret: "p@tsecret"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := mask.URL(tt.url)
			if tt.secret != "" {
				assert.NotContains(t, got, tt.secret)
			}
			if tt.want != "" {
				assert.Equal(t, tt.want, got)
			}
		})
	}
}

// testCA is a certificate authority and a server certificate it signed, for a TLS node.
type testCA struct {
	pool                      *x509.CertPool
	caPEM, certPEM, keyPEM    []byte
	caFile, certFile, keyFile string
}

// newTestCA makes a CA and a certificate for "localhost" and 127.0.0.1, written as PEM files
// into dir.
func newTestCA(t *testing.T, dir string) testCA {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "sluice test CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	caCert, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "localhost"},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	require.NoError(t, err)
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)

	ca := testCA{
		pool:    x509.NewCertPool(),
		caPEM:   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		keyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
	}
	ca.pool.AddCert(caCert)
	ca.caFile, ca.certFile, ca.keyFile = filepath.Join(dir, "ca.pem"), filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem")
	for path, b := range map[string][]byte{ca.caFile: ca.caPEM, ca.certFile: ca.certPEM, ca.keyFile: ca.keyPEM} {
		require.NoError(t, os.WriteFile(path, b, 0o600))
	}
	return ca
}

// TestTLSConnection runs a message through the stack over amqps:// to a RabbitMQ node of the
// test's own, with a TLS listener and a certificate from the test's own CA. The shared node
// is not reconfigured.
func TestTLSConnection(t *testing.T) {
	ca := newTestCA(t, t.TempDir())
	tlsPort := testenv.FreePort(t)
	files := map[string][]byte{}
	for _, f := range []string{ca.caFile, ca.certFile, ca.keyFile} {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		files[filepath.Base(f)] = b
	}
	node := testenv.StartNode(t, testenv.NodeOptions{
		Name: fmt.Sprintf("sluice_tls_%06d", mrand.IntN(1e6)),
		Config: []string{
			fmt.Sprintf("listeners.ssl.default = 127.0.0.1:%d", tlsPort),
			"ssl_options.cacertfile = {dir}/ca.pem",
			"ssl_options.certfile = {dir}/server.pem",
			"ssl_options.keyfile = {dir}/server-key.pem",
			"ssl_options.verify = verify_none",
			"ssl_options.fail_if_no_peer_cert = false",
		},
		Files: files,
	})
	t.Logf("TLS node %s booted in %s (AMQP %d, TLS %d)", node.Name, node.StartTime.Round(time.Millisecond), node.Port, tlsPort)

	clientTLS := &tls.Config{RootCAs: ca.pool, MinVersion: tls.VersionTLS12}
	// The node has booted; wait until its TLS listener completes a handshake.
	require.Eventually(t, func() bool {
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", fmt.Sprintf("127.0.0.1:%d", tlsPort), clientTLS.Clone())
		if err != nil {
			return false
		}
		_ = c.Close()
		return true
	}, 30*time.Second, 100*time.Millisecond, "TLS listener up")

	amqpsURL := fmt.Sprintf("amqps://guest:guest@127.0.0.1:%d/", tlsPort)
	logger := testLogger()

	t.Run("an untrusted certificate is refused", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		_, err := amqp.New(ctx, amqp.Config{URLs: []string{amqpsURL}, Logger: logger}) // system roots
		require.Error(t, err)
		assert.Contains(t, err.Error(), "certificate")
	})

	t.Run("a certificate for another name is refused", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		other := &tls.Config{RootCAs: ca.pool, ServerName: "rabbit.example.com"}
		_, err := amqp.New(ctx, amqp.Config{URLs: []string{amqpsURL}, TLS: other, Logger: logger})
		require.Error(t, err)
		assert.Contains(t, err.Error(), "rabbit.example.com")
	})

	t.Run("a message goes through the stack over TLS", func(t *testing.T) {
		// One config for two URLs that name the node differently, as a failover list
		// does: each must be verified against its own host, and the caller's config must
		// not be written to (amqp091 sets ServerName on the config it is given).
		shared := clientTLS.Clone()
		urls := []string{
			fmt.Sprintf("amqps://guest:guest@localhost:%d/", tlsPort),
			amqpsURL,
		}
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		b, err := amqp.New(ctx, amqp.Config{URLs: urls, TLS: shared, Logger: logger})
		require.NoError(t, err)
		t.Cleanup(func() { _ = b.Close() })
		assert.Empty(t, shared.ServerName, "the caller's tls.Config is not modified")

		// The test's own producer and counter use the node's plain port.
		rabbit := node.Rabbit(t)

		e := &env{name: "rabbitmq-tls", broker: b, amqp: b, rabbit: rabbit}
		queue := testenv.Name("test.tls")
		got := make(chan *message.Message, 1)
		start(t, e, router.Config{Logger: logger}, func(s *router.Stack) {
			require.NoError(t, s.Handle("tls", queue, func(m *message.Message) error {
				got <- m
				return nil
			}))
		})
		e.publish(t, queue, message.NewMessage("tls-1", []byte(`{"over":"tls"}`)))
		select {
		case m := <-got:
			assert.Equal(t, "tls-1", m.UUID)
			assert.Equal(t, `{"over":"tls"}`, string(m.Payload))
		case <-time.After(30 * time.Second):
			t.Fatal("message not handled over TLS")
		}
		require.Eventually(t, func() bool { return rabbit.Count(queue) == 0 }, 10*time.Second, 50*time.Millisecond, "acked")

		// sluice's connection is the node's only TLS one (the test's client is plain).
		out, err := node.Ctl("-q", "list_connections", "ssl", "name")
		require.NoError(t, err, out)
		assert.Contains(t, out, "true", "the node lists a TLS connection: %s", out)
	})
}
