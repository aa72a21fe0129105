package amqp

// Connected reports whether the broker holds a live connection to one of its nodes right
// now. It does not wait: a layer above (a failover publisher) uses it to see that a
// cluster it left is reachable again.
func (b *Broker) Connected() bool { return b.conn.connected() }

// Connected reports whether the publisher's broker holds a live connection right now.
func (p *Publisher) Connected() bool { return p.conn.connected() }

func (c *connection) connected() bool {
	c.mu.Lock()
	conn := c.conn
	c.mu.Unlock()
	return conn != nil && !conn.IsClosed()
}
