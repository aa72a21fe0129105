package router

import "github.com/sluice-go/sluice/router/internal/rebalance"

// AssignPartitions exposes the rendezvous assignment of partitions to members.
var AssignPartitions = rebalance.Assign

// PartitionHandlerName exposes the name of partition k's handler.
var PartitionHandlerName = partitionHandlerName
