// Package amqpurl reads the broker URLs sluice connects to: the default URL and the
// AMQP_URL value, one URL or a comma-separated list of nodes. The broker (broker/amqp's
// Config) and the commands read AMQP_URL the same way through it. Masking a URL's password
// is internal/mask's.
package amqpurl

import "strings"

// Default is the URL used when Config.URLs is empty and AMQP_URL is unset (moved from
// broker/amqp's DefaultURL).
const Default = "amqp://guest:guest@127.0.0.1:5672/"

// Split reads an AMQP_URL value: one URL or a comma-separated list of nodes to fail over
// between. Empty means Default: for the commands, whose AMQP_URL defaults to a local node.
// Moved from broker/amqp's SplitURLs.
func Split(s string) []string {
	if urls := Nodes(s); len(urls) > 0 {
		return urls
	}
	return []string{Default}
}

// Nodes is Split without a default: nil for a value with no URL in it. The library uses
// it, so that no URL given is an error rather than a guess.
func Nodes(s string) []string {
	var urls []string
	for _, u := range strings.Split(s, ",") {
		if u = strings.TrimSpace(u); u != "" {
			urls = append(urls, u)
		}
	}
	return urls
}
