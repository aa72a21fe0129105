package testenv

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluice-go/sluice/internal/mask"
)

// ErrVersionUnknown is returned by BrokerVersion when the node answered without naming its
// version.
var ErrVersionUnknown = errors.New("the broker did not report a version")

// BrokerVersion connects to the broker at url (the first of a comma-separated list) and
// returns the version it reports in the connection's server properties ("4.3.6"). The
// connection is closed before it returns; an error never carries url's password.
func BrokerVersion(url string, timeout time.Duration) (string, error) {
	url, _, _ = strings.Cut(url, ",")
	conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(timeout)})
	if err != nil {
		return "", fmt.Errorf("connect to %s: %s", mask.Credentials(url), mask.Credentials(err.Error()))
	}
	defer conn.Close()
	v, _ := conn.Properties["version"].(string)
	if v == "" {
		return "", fmt.Errorf("%s: %w", mask.Credentials(url), ErrVersionUnknown)
	}
	return v, nil
}

// SeriesOf returns a version's major.minor: "4.3" for "4.3.6".
func SeriesOf(version string) string {
	parts := strings.SplitN(version, ".", 3)
	if len(parts) < 2 {
		return version
	}
	return parts[0] + "." + parts[1]
}

// startedLine matches the line a RabbitMQ node writes to its log as it boots:
// "Starting RabbitMQ 4.3.6 on Erlang 29.1.2 [jit]".
var startedLine = regexp.MustCompile(`Starting RabbitMQ (\d+\.\d+\.\d+\S*) on Erlang`)

// LoggedVersion returns the version the node whose log folder is dir last said it was
// starting, from its main log, or "" when no log says it yet.
func LoggedVersion(dir string) string {
	matches, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	version := ""
	var newest time.Time
	for _, m := range matches {
		if strings.HasSuffix(m, "_upgrade.log") {
			continue
		}
		b, err := os.ReadFile(m)
		if err != nil {
			continue
		}
		found := startedLine.FindAllSubmatch(b, -1)
		if len(found) == 0 {
			continue
		}
		fi, err := os.Stat(m)
		if err != nil || (version != "" && fi.ModTime().Before(newest)) {
			continue
		}
		version, newest = string(found[len(found)-1][1]), fi.ModTime()
	}
	return version
}
