package headers

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/failure"
	"github.com/sluice-go/sluice/internal/topology"
)

// Headers that keep a producer's value of one of sluice's headers apart from sluice's own,
// and the headers that tell sluice's state from a producer's (docs/reliability.md, "Headers a producer
// cannot steer").
const (
	// ProducerOriginalQueue keeps the x-original-queue a message arrived with when it named
	// another queue than the one the message was consumed from. Display only: nothing
	// routes by it.
	ProducerOriginalQueue = "x-producer-original-queue"
	// ProducerFirstFailureTime and ProducerRetryHistory keep the x-first-failure-time and
	// x-retry-history a message arrived with from outside sluice. Display only.
	ProducerFirstFailureTime = "x-producer-first-failure-time"
	ProducerRetryHistory     = "x-producer-retry-history"
	// ArrivedRetryCount is the x-retry-count a message arrived with from outside sluice.
	ArrivedRetryCount = "x-arrived-retry-count"
	// TripAttempts is how many attempts sluice made on the message since it arrived (or
	// was replayed).
	TripAttempts = "x-trip-attempts"
	// ReplayedAt is the time of the message's latest replay.
	ReplayedAt = "x-replayed-at"
	// FailedStage names the step that failed when it was not the handler (the record then
	// names no handler).
	FailedStage = "x-failed-stage"
)

// Stager is an error raised by a step before the handler ran; the failure record names
// FailedStage instead of the handler.
type Stager interface {
	FailedStage() string
}

// Trip is what a message's headers say about its attempts here.
type Trip struct {
	// Arrived is the retry count the message brought from outside sluice.
	Arrived int
	// Made is the number of attempts sluice made before this one.
	Made int
	// Carried is true when the headers are sluice's own retry or replay state (the retry
	// count agrees with the arrived count and the attempts made, or the message is a
	// replay copy with no retry count), false for a message fresh from a producer.
	Carried bool
}

// ReadTrip reads the trip state of md. Counts are parsed like x-retry-count (clamped at
// sluice.MaxRetryCountHeader, garbage as 0). A sluice copy keeps x-retry-count equal to
// x-arrived-retry-count plus x-trip-attempts; headers that disagree came from a producer, and
// the whole retry count counts as arrived.
func ReadTrip(md message.Metadata) Trip {
	count := sluice.RetryCount(md)
	if raw := md.Get(TripAttempts); raw != "" {
		made := parseCount(raw)
		arrived := parseCount(md.Get(ArrivedRetryCount))
		if made > 0 && arrived+made == count {
			return Trip{Arrived: arrived, Made: made, Carried: true}
		}
	} else if md.Get(ReplayedAt) != "" && md.Get(sluice.HeaderRetryCount) == "" {
		return Trip{Carried: true}
	}
	return Trip{Arrived: count}
}

func parseCount(raw string) int {
	return sluice.RetryCount(message.Metadata{sluice.HeaderRetryCount: raw})
}

// StampOrigin sets x-original-queue on md to queue, the queue the message was consumed
// from, whatever the message arrived with. A producer's other value, on a message fresh
// from a producer, is kept as ProducerOriginalQueue.
func StampOrigin(md, prev message.Metadata, queue string, carried bool) {
	if q := prev.Get(sluice.HeaderOriginalQueue); q != "" && q != queue && !carried {
		md.Set(ProducerOriginalQueue, failure.Truncate(q, maxProducerValue))
	}
	md.Set(sluice.HeaderOriginalQueue, queue)
}

// stampTrip writes the trip headers of a failed attempt and moves a producer's failure
// time and history aside; it returns the metadata the history is appended to.
func stampTrip(md, prev message.Metadata, trip Trip) message.Metadata {
	if trip.Arrived > 0 {
		md.Set(ArrivedRetryCount, strconv.Itoa(trip.Arrived))
	} else {
		delete(md, ArrivedRetryCount)
	}
	md.Set(TripAttempts, strconv.Itoa(min(trip.Made+1, sluice.MaxRetryCountHeader)))
	if trip.Carried {
		return prev
	}
	// Kept bounded, as sluice's own are, so the copy stays within RabbitMQ's frame_max.
	if v := prev.Get(FirstFailureTime); v != "" {
		md.Set(ProducerFirstFailureTime, failure.Truncate(v, maxProducerValue))
		delete(md, FirstFailureTime)
	}
	if v := prev.Get(sluice.HeaderRetryHistory); v != "" {
		if h := failure.History(prev); len(h) > 0 {
			b, _ := json.Marshal(h) // cannot fail: plain strings, ints and times
			v = string(b)
		} else {
			v = failure.Truncate(v, maxProducerValue)
		}
		md.Set(ProducerRetryHistory, v)
		delete(md, sluice.HeaderRetryHistory)
	}
	return nil
}

// maxProducerValue bounds a producer's value that sluice keeps under its own name: a queue
// name's limit in AMQP.
const maxProducerValue = 255

// AgeStart is when a message's retry age (Config.MaxTotalAge of package retry) counts
// from: its first failure, or its latest replay when later, both only from sluice's own
// headers. ok is false for a message with neither.
func AgeStart(md message.Metadata, now time.Time) (time.Time, bool) {
	trip := ReadTrip(md)
	if !trip.Carried {
		return time.Time{}, false
	}
	first, ok := failure.Time(md, FirstFailureTime, now)
	if replayed, rok := failure.Time(md, ReplayedAt, now); rok && (!ok || replayed.After(first)) {
		return replayed, true
	}
	return first, ok
}

// RetryNote says how many attempts a dead letter had, in the operator's words: "arrived
// with x-retry-count 99; 1 attempt made here", or "3 attempts made here". Empty for a
// record without trip headers (one written before sluice kept them).
func RetryNote(md message.Metadata) string {
	if md.Get(TripAttempts) == "" {
		return ""
	}
	made := parseCount(md.Get(TripAttempts))
	note := plural(made, "attempt") + " made here"
	if arrived := parseCount(md.Get(ArrivedRetryCount)); arrived > 0 {
		note = fmt.Sprintf("arrived with x-retry-count %d; %s", arrived, note)
	}
	return note
}

func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return strconv.Itoa(n) + " " + word + "s"
}

// OwnOrigin reports whether origin is a queue a dead letter of queue's DLQ can come from:
// queue itself or one of its partitions (Q.pK). Anything else was not recorded by sluice
// and a replay does not go there.
func OwnOrigin(queue, origin string) bool {
	if origin == queue {
		return true
	}
	k, ok := strings.CutPrefix(origin, queue+topology.PartitionInfix)
	if !ok || k == "" || len(k) > 6 {
		return false
	}
	for i := 0; i < len(k); i++ {
		if k[i] < '0' || k[i] > '9' {
			return false
		}
	}
	return true
}

// StampWhere writes where a failure happened: the stage of a Stager error (and no handler,
// which never ran), else the handler's name (and no stage).
func StampWhere(md message.Metadata, err error, handler string) {
	if s, ok := stagerOf(err); ok {
		md.Set(FailedStage, s.FailedStage())
		delete(md, Handler)
		return
	}
	delete(md, FailedStage)
	md.Set(Handler, handler)
}

func stagerOf(err error) (Stager, bool) {
	var s Stager
	return s, errors.As(err, &s)
}
