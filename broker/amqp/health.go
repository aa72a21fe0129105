package amqp

// Connected reports whether the publisher's broker holds a live connection right now. It
// does not wait: a layer above (a failover publisher) uses it to see that a cluster it left
// is reachable again.
func (p *Publisher) Connected() bool { return p.conn.connected() }

func (c *connection) connected() bool {
	c.mu.Lock()
	conn := c.conn
	c.mu.Unlock()
	return conn != nil && !conn.IsClosed()
}
