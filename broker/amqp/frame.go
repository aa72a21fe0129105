package amqp

import (
	"sort"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluice-go/sluice/internal/failure"
	"github.com/sluice-go/sluice/internal/headers"
)

// Limits of the AMQP encoding that Marshal keeps to.
const (
	// defaultFrameMax is RabbitMQ's default frame_max, the Marshaler's when FrameMax is 0.
	defaultFrameMax = 131072
	// minFrameMax is AMQP 0-9-1's frame-min-size: every peer accepts frames this large.
	minFrameMax = 4096
	// maxShortstr is the longest AMQP short string: property values and table keys.
	maxShortstr = 255
	// frameOverhead is a frame's type, channel, size and end octets; RabbitMQ refuses a
	// frame whose payload exceeds frame_max minus this.
	frameOverhead = 8
	// headerFrameFixed is a content header's class, weight, body size and property flags.
	headerFrameFixed = 14
	// maxDroppedList bounds headers.Dropped.
	maxDroppedList = 1024
	// maxDroppedName bounds one name in headers.Dropped.
	maxDroppedName = 64
	// droppedReserve is room for the record of what was dropped, which is itself bounded:
	// the entry of a string header (fieldSize's 5 + length) of maxDroppedList bytes.
	droppedReserve = 1 + len(headers.Dropped) + 5 + maxDroppedList
)

// fit drops the largest headers until pub's content header fits in one frame, and records
// what was dropped (here or, in previous, by an earlier copy) in headers.Dropped.
func (m Marshaler) fit(pub *amqp.Publishing, previous string, dropped []string) {
	frameMax := m.FrameMax
	if frameMax <= 0 {
		frameMax = defaultFrameMax
	}
	limit := frameMax - frameOverhead
	reserve := droppedReserve
	if headerFrameSize(*pub) > limit-reserve {
		keys := make([]string, 0, len(pub.Headers))
		for k := range pub.Headers {
			if k != headers.UUID {
				keys = append(keys, k)
			}
		}
		// Producer headers first, sluice's own last; within each, the largest first.
		sort.Slice(keys, func(i, j int) bool {
			oi, oj := sluiceHeaders[keys[i]], sluiceHeaders[keys[j]]
			if oi != oj {
				return oj
			}
			si, sj := entrySize(keys[i], pub.Headers[keys[i]]), entrySize(keys[j], pub.Headers[keys[j]])
			if si != sj {
				return si > sj
			}
			return keys[i] < keys[j]
		})
		size := headerFrameSize(*pub)
		for _, k := range keys {
			if size <= limit-reserve {
				break
			}
			size -= entrySize(k, pub.Headers[k])
			delete(pub.Headers, k)
			dropped = append(dropped, k)
		}
		if size > limit-reserve {
			// Only the id is left and it alone is too large (a frame_max near the AMQP
			// minimum): the id still travels as the message-id property when it fits.
			delete(pub.Headers, headers.UUID)
			dropped = append(dropped, headers.UUID)
		}
	}
	if len(dropped) == 0 && previous == "" {
		return
	}
	names := make([]string, 0, len(dropped)+1)
	if previous != "" {
		names = append(names, previous)
	}
	for _, k := range dropped {
		names = append(names, failure.Truncate(k, maxDroppedName))
	}
	pub.Headers[headers.Dropped] = failure.Truncate(strings.Join(names, ","), maxDroppedList)
}

// sluiceHeaders are the headers sluice writes; Marshal drops them only after every other.
var sluiceHeaders = headers.Set([][]string{headers.RetryState, headers.FailureRecord, headers.Carried}, headers.Dropped)

// headerFrameSize is the payload size of the content header frame amqp091 writes for pub.
func headerFrameSize(pub amqp.Publishing) int {
	n := headerFrameFixed
	for _, s := range []string{pub.ContentType, pub.ContentEncoding, pub.CorrelationId, pub.ReplyTo,
		pub.Expiration, pub.MessageId, pub.Type, pub.UserId, pub.AppId} {
		if s != "" {
			n += 1 + len(s)
		}
	}
	if len(pub.Headers) > 0 {
		n += tableSize(pub.Headers)
	}
	if pub.DeliveryMode > 0 {
		n++
	}
	if pub.Priority > 0 {
		n++
	}
	if !pub.Timestamp.IsZero() {
		n += 8
	}
	return n
}

// tableSize is the encoded size of a field table: its length and its entries.
func tableSize(t amqp.Table) int {
	n := 4
	for k, v := range t {
		n += entrySize(k, v)
	}
	return n
}

func entrySize(k string, v any) int { return 1 + len(k) + fieldSize(v) }

// fieldSize is the encoded size of a field value: its type octet and its value.
func fieldSize(v any) int {
	switch x := v.(type) {
	case nil:
		return 1
	case bool, uint8, int8:
		return 2
	case int16, uint16:
		return 3
	case int, int32, uint32, float32:
		return 5
	case amqp.Decimal:
		return 6
	case int64, float64, time.Time:
		return 9
	case string:
		return 5 + len(x)
	case []byte:
		return 5 + len(x)
	case []any:
		n := 5
		for _, e := range x {
			n += fieldSize(e)
		}
		return n
	case amqp.Table:
		return 1 + tableSize(x)
	default:
		return 0 // not a field amqp091 can write; restoreHeader never makes one
	}
}
