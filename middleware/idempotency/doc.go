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
// # The journal
//
// On RabbitMQ the stack (package router) gives each handler's step a journal: the stream
// sluice.idempotency.<queue> (one per partition of a partitioned handler), declared with
// x-max-age = TTL and a 1 GiB size bound. When a key becomes done, its record (the 128-bit
// digest and its expiry, never the key) is appended with publisher confirms, and the
// message is acknowledged only once the record is confirmed; records of attempts that
// finish together share one stream message. Before a handler consumes, its step reads the
// journal from now minus TTL into memory (Guard.Journaled; /readyz says "restoring"
// meanwhile); it then follows the journal, so a key done on another instance is known here
// too. Lookups stay in memory. Config.DisableJournal turns it off. The embedded broker
// (broker/memory) loses its queues with the process, so it keeps no journal.
//
// # Guarantees
//
// With the journal, a key done and acknowledged is never run again within its TTL: not
// after a crash (SIGKILL, OOM kill, a lost node) and restart, not on another instance of
// the service, not on a partition's new owner after a rebalance, unless the journal's
// retention (TTL, or the size bound) dropped its record, or MaxKeys newer keys evicted it
// here. The handler's work for a key succeeds at most once, and never in two attempts at
// the same time on one instance: a concurrent duplicate is deferred, never waited for.
// With sluice's at-least-once delivery, that is exactly-once processing per key.
//
// What it does not guarantee:
//   - the one window left: a handler whose work is done but whose journal record was not
//     yet confirmed when the process died, or when its connection to RabbitMQ was lost (a
//     broker restart): its message was not acknowledged, so it is redelivered and runs
//     again, here or on another instance that takes the redelivery before the record is
//     confirmed. Handlers with external side effects should also pass the key on (a
//     payment gateway's idempotency key, a unique constraint).
//   - after a lost connection the journal's follower resumes after the last record it
//     read, and until it has read what other instances journaled meanwhile
//     (broker.ResyncingJournal: RabbitMQ's stream journal), each message waits before its
//     key is looked up: at most 5 s per loss, so a follower that cannot catch up (its
//     stream refusing appends) delays consuming no longer than that. A key another
//     instance journaled in a longer gap can run again here.
//   - duplicates in flight on two instances at the same instant are not locked across
//     instances: each may run before either's record arrives at the other (within the
//     journal lag, about a millisecond on one host). Partition by key
//     (router.WithPartitions) where that matters.
//   - while the journal cannot be written (stream unavailable, publishes nacked), a
//     message whose work is done is deferred broker-side instead of acknowledged, and its
//     key stays done here, so its redelivery is journaled and acknowledged without running
//     the handler again (Stats.Journal.Unconfirmed, sluice.idempotency.journal.failures).
//     Under a memory or disk alarm (broker.ErrBlocked) the message is acknowledged instead,
//     so the queues drain, and the record follows once the alarm clears: a crash during
//     the alarm forgets those keys (Stats.Journal.BlockedAcks).
//   - an attempt that outlives its lease loses the key: a duplicate may then run beside it.
//     Keep Lease above the handler timeout.
//   - a duplicate arriving after TTL, or after MaxKeys newer keys, runs again. Memory is
//     bounded by MaxKeys; at a steady R messages per second the store remembers a key for
//     min(TTL, MaxKeys/R).
//   - behind router.Middlewares in a router of the user's own, or Guard.Middleware, there
//     is no journal: keys live in this process (see below).
//
// # Without the journal
//
// With Config.DisableJournal, on the embedded broker, or in a plain Watermill router, the
// store is per process: a crash forgets every key completed since the last snapshot (all
// of them without Config.SnapshotPath), and a duplicate that reaches another instance,
// which never saw its key, runs again there. Then in-memory idempotency stays correct
// across instances only if every key is consumed by one instance: partition by key and
// declare each partition with single-active-consumer.
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
