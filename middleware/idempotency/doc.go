// Package idempotency is sluice's in-memory idempotency step: a message whose key was
// already processed is acknowledged without calling the handler, and a message whose key is
// being processed right now is deferred broker-side until that attempt has finished.
//
// # Keys
//
// A message's key is its idempotency-key metadata (sluice.HeaderIdempotencyKey), else what
// the handler's key function derives from it (router.WithIdempotencyKey, else
// Config.KeyFunc; for example the payment_id in the body), else its message id. Keys are
// scoped by handler name. The store keeps 128 bits of each key's SHA-256, not the key.
//
// # States
//
// A key is in flight while an attempt holds it under a lease (Config.Lease), and done for
// Config.TTL after the handler returned nil. Below this step the stack publishes the
// handler's output messages with publisher confirms, so nil means the outputs are on the
// broker. Any error, a deferral from below, or a panic releases the key, so the retry runs.
// A lease whose holder died runs out, and the key can be taken again.
//
// # Guarantees with one instance
//
// While a key is remembered (inside its TTL, not evicted for capacity, process not
// restarted), the handler's work for it succeeds at most once, and never runs in two
// attempts at the same time: a concurrent duplicate is deferred, never waited for. With
// sluice's at-least-once delivery, that is exactly-once processing per key. Memory is bounded by
// Config.MaxKeys; at a steady R messages per second the store remembers a key for
// min(TTL, MaxKeys/R).
//
// What it does not guarantee, even with one instance:
//   - a crash forgets every key completed since the last snapshot (all of them without
//     Config.SnapshotPath; the snapshot is written on Close only) and every key in flight.
//     A message whose handler had done its work but which was not yet acknowledged when
//     the process died is redelivered and runs again. Handlers with external side effects
//     should also pass the key on (a payment gateway's idempotency key, a unique constraint).
//   - an attempt that outlives its lease loses the key: a duplicate may then run beside it.
//     Keep Lease above the handler timeout.
//   - a duplicate arriving after TTL, or after MaxKeys newer keys, runs again.
//
// # Several instances
//
// The store is per process. RabbitMQ spreads a queue's messages over all its consumers,
// so a duplicate may reach another instance, which has never seen the key, and run again
// there (also at the same time as the original). In-memory idempotency stays correct when
// scaling out only if every key is consumed by one instance: partition by key (a
// consistent-hash exchange, or producers routing by a hash of the key to N queues) and
// declare each partition queue with single-active-consumer (x-single-active-consumer), so
// one instance at a time consumes a partition. When a partition fails over, the new
// consumer starts without the old one's keys (unless it loads a snapshot the old one
// wrote), so duplicates around a failover can still run again. Where that is not
// acceptable, the handler's side effect must itself be idempotent.
//
// # Cost
//
// A key costs about 40 bytes of heap (see bench_test.go, which also measures Watermill's
// middleware.Deduplicator). The store has no goroutine and no timer: expired keys are
// ignored when met and swept a few at a time by every operation; Sweep removes all of
// them at once.
//
// # Used alone
//
// In a plain Watermill router the step works as it does in sluice's stack: a duplicate of a
// done key is acked without calling the handler (TestGuard_AloneInAPlainWatermillRouter).
// Only a concurrent duplicate differs: its deferral, without sluice's retry step, is an
// error the router nacks, and the pub/sub redelivers it until the first attempt finishes.
package idempotency
