package engine

import (
	"errors"
	"fmt"
	"strings"
)

// The sentinel errors. The typed API re-exports these very values, so
// errors.Is works across the boundary, and every engine returns them; every place that returns one
// wraps it with the topic, partition, offset or group it concerns. Their
// texts carry no "logbus:" prefix: the typed API puts it once at the front
// of every error it returns.
var (
	// ErrTopicExists: creating a topic whose name is taken.
	ErrTopicExists = errors.New("topic already exists")
	// ErrTopicNotFound: naming a topic that was never created.
	ErrTopicNotFound = errors.New("topic not found")
	// ErrClosed: the broker is draining or stopped and takes no new work.
	ErrClosed = errors.New("broker closed")
	// ErrBackpressure: a Block partition stayed full for its whole BlockTimeout.
	ErrBackpressure = errors.New("partition full")
	// ErrOffsetOutOfRange: an offset below the earliest retained record or
	// past the end of the partition.
	ErrOffsetOutOfRange = errors.New("offset out of range")
	// ErrSubscription: an empty group or consumer name, a duplicate consumer,
	// a nil handler, options that differ from the group's, or an unknown
	// group or consumer.
	ErrSubscription = errors.New("invalid subscription")
	// ErrInvalid: an impossible configuration value.
	ErrInvalid = errors.New("invalid argument")
	// ErrStalled: Drain found a group with lag that cannot make progress
	// (paused, or without consumers).
	ErrStalled = errors.New("group stalled")
	// ErrPermanent is wrapped by handler errors that retrying cannot fix: the
	// record goes to the dead-letter queue after one attempt.
	ErrPermanent = errors.New("permanent failure")
	// ErrUnavailable: the engine cannot reach what it depends on (a lost
	// connection, a server without quorum, a request that timed out).
	ErrUnavailable = errors.New("engine unavailable")
	// ErrAborted: an asynchronous publish that was not stored because a
	// record ahead of it in its partition failed; the error wraps that
	// record's error too (see [AsyncAppender]).
	ErrAborted = errors.New("aborted: a record ahead of it in its partition failed")
	// ErrOutcomeUnknown: a publish whose record was sent to the server but
	// whose acknowledgement never came: it may or may not be stored.
	ErrOutcomeUnknown = errors.New("outcome unknown: the record may have been stored")
)

// ErrAbandoned is returned by a handler that gives a delivery back without an
// outcome (a Stream closed while it held the delivery). The worker neither
// commits nor counts a failure; the record is delivered again to the
// partition's next owner. It never reaches users.
var ErrAbandoned = errors.New("delivery abandoned")

// ErrNotDelivered is [ErrAbandoned] for a delivery that never reached the
// consumer (a Stream closed before anyone received it): the attempt is not
// counted, so the next delivery carries the same attempt number.
var ErrNotDelivered = fmt.Errorf("%w before it reached the consumer", ErrAbandoned)

// DecodeError is the error of a record whose value the typed layer could
// not decode: its handler returns it without calling the user's code. It
// wraps [ErrPermanent], so an engine dead-letters the record at once (it
// would fail the same way again) and keeps the error as the letter's; an
// engine that stores letters outside the process rebuilds it when it
// reads them back, with Err carrying the codec error's text. The typed
// layer shows it to users as its own DecodeError.
type DecodeError struct {
	Topic     string
	Partition int
	Offset    int64
	Err       error // the codec's error
}

func (e *DecodeError) Error() string {
	return fmt.Sprintf("decode topic %q partition %d offset %d: %v", e.Topic, e.Partition, e.Offset, e.Err)
}

// Unwrap returns the codec's error and [ErrPermanent].
func (e *DecodeError) Unwrap() []error { return []error{e.Err, ErrPermanent} }

// Why a record was dead-lettered, as [DeadLetterKind] tells it from the
// letter's error: the words an engine stores with a letter and the typed
// layer logs.
const (
	KindDecode    = "decode"    // the typed layer could not decode it: a *DecodeError
	KindPanic     = "panic"     // the handler panicked: a *PanicError
	KindPermanent = "permanent" // the handler's error wraps ErrPermanent
	KindExhausted = "exhausted" // every attempt the retry policy allows failed
)

// DeadLetterKind says why a record whose last attempt failed with err was
// dead-lettered: one of the Kind constants, checked in their order.
func DeadLetterKind(err error) string {
	switch {
	case isType[*DecodeError](err):
		return KindDecode
	case isType[*PanicError](err):
		return KindPanic
	case errors.Is(err, ErrPermanent):
		return KindPermanent
	}
	return KindExhausted
}

func isType[E error](err error) bool {
	_, ok := errors.AsType[E](err)
	return ok
}

// PanicError is what a handler's panic becomes: the worker recovers it, keeps
// running, and counts the delivery as a failed attempt.
type PanicError struct {
	Value any    // the value passed to panic
	Stack []byte // the handler goroutine's stack at the panic
}

func (e *PanicError) Error() string {
	return fmt.Sprintf("handler panicked: %v", e.Value)
}

// Unwrap returns the panic value when it is an error, so errors.Is sees
// through a panic(err).
func (e *PanicError) Unwrap() error {
	err, _ := e.Value.(error)
	return err
}

// Unfinished describes one partition a group had not finished when the broker
// stopped.
type Unfinished struct {
	Group     string
	Topic     string
	Partition int
	Committed int64 // the next offset the group would have read
	End       int64 // the offset the next published record would have had
	Running   bool  // a handler was still running when Close returned
}

// ShutdownError is returned by Close when records were left undelivered:
// because the caller's context ended before the drain finished, or because a
// paused or memberless group could not drain at all.
type ShutdownError struct {
	Unfinished []Unfinished
	Err        error // the context's error, or one wrapping ErrStalled
}

func (e *ShutdownError) Error() string {
	var b strings.Builder
	b.WriteString("close left records undelivered")
	if e.Err != nil {
		fmt.Fprintf(&b, " (%v)", e.Err)
	}
	for i, p := range e.Unfinished {
		if i == 0 {
			b.WriteString(": ")
		} else {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "group %q topic %q partition %d committed %d end %d",
			p.Group, p.Topic, p.Partition, p.Committed, p.End)
		if p.Running {
			b.WriteString(" (handler still running)")
		}
	}
	return b.String()
}

func (e *ShutdownError) Unwrap() error { return e.Err }
