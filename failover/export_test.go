package failover

// ErrNotConnected is errClusterNotConnected, which a Cluster's publisher returns before the
// cluster's first connection.
var ErrNotConnected = errClusterNotConnected
