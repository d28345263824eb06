package pubsub

import (
	"fmt"

	"github.com/logbus/logbus/internal/core"
)

// The sentinel errors. Match them with errors.Is: every error logbus returns
// wraps one of them (or a context's error) with the topic, partition, offset
// or group it concerns.
var (
	// ErrTopicExists is returned by NewTopic for a name already taken.
	ErrTopicExists = core.ErrTopicExists
	// ErrTopicNotFound is returned for a topic name that was never created
	// (Broker.Lag, Broker.Replay).
	ErrTopicNotFound = core.ErrTopicNotFound
	// ErrClosed is returned by Publish, NewTopic, Subscribe, Stream, Seek and
	// Replay once Close has begun.
	ErrClosed = core.ErrClosed
	// ErrBackpressure is returned by Publish when a Block partition stayed
	// full for the whole BlockTimeout. Nothing was appended.
	ErrBackpressure = core.ErrBackpressure
	// ErrOffsetOutOfRange is returned by Seek for an offset below the earliest
	// retained record or past the end of the partition.
	ErrOffsetOutOfRange = core.ErrOffsetOutOfRange
	// ErrSubscription is returned for an empty group or consumer name, a
	// duplicate consumer, a nil handler, or an unknown group or consumer.
	ErrSubscription = core.ErrSubscription
	// ErrInvalid is returned for an impossible configuration value: a
	// partition count below 1, a negative capacity, a negative retry count, a
	// nil codec, a partition that does not exist.
	ErrInvalid = core.ErrInvalid
	// ErrPermanent is for handlers to wrap when retrying cannot help:
	//
	//	return fmt.Errorf("order %s: unknown currency: %w", id, pubsub.ErrPermanent)
	//
	// The record is dead-lettered after that one attempt.
	ErrPermanent = core.ErrPermanent
)

// DecodeError is the error of a dead letter whose value the topic's codec
// could not decode. Such a record never reaches the handler and is not
// retried: it would fail the same way. It wraps both the codec's error and
// ErrPermanent.
type DecodeError struct {
	Topic     string
	Partition int
	Offset    int64
	Err       error // the codec's error
}

func (e *DecodeError) Error() string {
	return fmt.Sprintf("logbus: decode topic %q partition %d offset %d: %v", e.Topic, e.Partition, e.Offset, e.Err)
}

// Unwrap returns the codec's error and ErrPermanent.
func (e *DecodeError) Unwrap() []error { return []error{e.Err, ErrPermanent} }

// PanicError is the error of a delivery whose handler panicked: the worker
// recovers, keeps running, and counts the attempt as failed. Value is what
// was passed to panic and Stack the handler's stack at that moment; Unwrap
// returns Value when it is an error.
type PanicError = core.PanicError

// ShutdownError is returned by Broker.Close when records were left
// undelivered, because Close's context ended before the drain finished (then
// it wraps the context's error) or because a paused group, or one whose
// consumers all left, could not drain. Unfinished lists each (group, topic,
// partition) with its committed and end offsets.
type ShutdownError = core.ShutdownError

// Unfinished is one partition a group had not finished when the broker
// stopped; see ShutdownError.
type Unfinished = core.Unfinished
