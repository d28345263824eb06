package pubsub

import (
	"errors"
	"fmt"
	"strings"

	"github.com/logbus/logbus/engine"
)

// The sentinel errors. Every error a pubsub call returns wraps one of them
// or a context's error, so errors.Is tells what went wrong; the message
// starts with "logbus: " and the call's own verb, then names the topic,
// group, partition or offset it concerns.
var (
	// ErrTopicExists is returned by [NewTopic] for a name already taken.
	ErrTopicExists = engine.ErrTopicExists
	// ErrTopicNotFound is returned for a topic name that was never created,
	// or was deleted ([Broker.Lag], [Broker.Replay], [Broker.DeleteTopic]),
	// and by every call on the handles of a deleted topic and of its groups.
	ErrTopicNotFound = engine.ErrTopicNotFound
	// ErrClosed is returned by every call that would change something once
	// [Broker.Close] has begun (Publish and the other publishes, [NewTopic],
	// Subscribe, Stream, Seek, Replay, Redrive, DeleteGroup, DeleteTopic,
	// DiscardDeadLetters), by LatestDeadLetters and Ping then too, and by
	// Leave once Close has finished (a consumer may leave while Close
	// drains). It comes before what the call's arguments would otherwise
	// earn, such as [ErrOffsetOutOfRange] or an unknown name, except for
	// arguments that are wrong on any broker: a nil context, a value its
	// codec cannot encode, a nil handler, an invalid option. [Broker.Drain]
	// after Close returns it for the groups Close left behind. The other
	// reads (Lag, Committed, Stats, DeadLetters, Snapshot) keep working, and
	// Pause and Resume do nothing.
	ErrClosed = engine.ErrClosed
	// ErrBackpressure is returned by a publish that waited as long as [Block]
	// allows for room in a full partition; nothing was appended, and the
	// message names the group holding the oldest record. A
	// [Topic.PublishAsync] that waited as long at its topic's
	// [WithMaxInFlight] bound resolves with it too, naming the bound.
	ErrBackpressure = engine.ErrBackpressure
	// ErrOffsetOutOfRange is returned by [Group.Seek] for an offset below the
	// earliest retained record or past the end of the partition.
	ErrOffsetOutOfRange = engine.ErrOffsetOutOfRange
	// ErrSubscription is returned for an empty group or consumer name, a
	// duplicate consumer, a nil handler, options that differ from those of
	// the group being joined ([SubscribeOption]), or an unknown group or
	// consumer; and by every call on the handle of a deleted group
	// ([Broker.DeleteGroup]).
	ErrSubscription = engine.ErrSubscription
	// ErrInvalid is returned for an impossible configuration value or
	// argument: a partition count below 1 or above [MaxPartitions], a
	// negative bound, a negative retry count, a nil codec, context or broker,
	// a partition that does not exist, a value or key its codec cannot
	// encode; and for an option or call the engine cannot honour
	// ([Broker.Capabilities]).
	ErrInvalid = engine.ErrInvalid
	// ErrStalled is returned by [Broker.Drain], and wrapped by Close's
	// [ShutdownError], when a group with lag cannot make progress: it is
	// paused, or has no consumers. The message names the groups.
	ErrStalled = engine.ErrStalled
	// ErrPermanent is for handlers to wrap when retrying cannot help:
	//
	//	return fmt.Errorf("order %s: unknown currency: %w", id, pubsub.ErrPermanent)
	//
	// The record is dead-lettered after that one attempt.
	ErrPermanent = engine.ErrPermanent
	// ErrUnavailable is returned by a remote engine's calls while it
	// cannot reach its server: a lost connection, a server without quorum,
	// a request that timed out. Such an error also wraps the engine's own.
	// [Broker.Ping] reports it; the in-memory engine never returns it.
	ErrUnavailable = engine.ErrUnavailable
	// ErrAborted is wrapped by the error of a record published with
	// [Topic.PublishAsync] that was not stored because a record ahead of it
	// in its partition failed; the error wraps that record's cause too
	// ([ErrBackpressure], say), except [ErrOutcomeUnknown]: an aborted record
	// was not stored.
	ErrAborted = engine.ErrAborted
	// ErrOutcomeUnknown is wrapped by the error of a publish whose record
	// a remote engine sent but whose confirmation never came (a lost
	// connection, a server that did not answer within the engine's
	// bound): the record may or may not be stored. Publishing it again
	// may store it twice. Every other failed publish stored nothing. The
	// in-memory engine never returns it.
	ErrOutcomeUnknown = engine.ErrOutcomeUnknown
)

// DecodeError is the error of a dead letter whose value the topic's codec
// could not decode. Such a record never reaches the handler and is not
// retried: it would fail the same way. It wraps both the codec's error and
// [ErrPermanent].
type DecodeError struct {
	Topic     string
	Partition int
	Offset    int64
	Err       error // the codec's error
}

func (e *DecodeError) Error() string {
	return fmt.Sprintf("logbus: decode topic %q partition %d offset %d: %v", e.Topic, e.Partition, e.Offset, e.Err)
}

// Unwrap returns the codec's error and [ErrPermanent].
func (e *DecodeError) Unwrap() []error { return []error{e.Err, ErrPermanent} }

// PanicError is the error of a delivery whose handler panicked: the worker
// recovers, keeps running, and counts the attempt as failed. Find it in a
// dead letter with errors.AsType[*pubsub.PanicError](letter.Err).
type PanicError struct {
	Value any    // what was passed to panic
	Stack []byte // the handler's stack at the panic
}

func (e *PanicError) Error() string { return fmt.Sprintf("logbus: handler panicked: %v", e.Value) }

// Unwrap returns Value when it is an error, so errors.Is sees through a
// panic(err).
func (e *PanicError) Unwrap() error {
	err, _ := e.Value.(error)
	return err
}

// ShutdownError is what [Broker.Close] returns when records were left
// undelivered. Err says why: the context's error when Close's context
// ended before the drain finished, or an error wrapping [ErrStalled] when a
// paused group, or one whose consumers all left, could not drain at all.
// Unfinished lists each (group, topic, partition) left behind.
type ShutdownError struct {
	Unfinished []Unfinished
	Err        error
}

func (e *ShutdownError) Error() string {
	var b strings.Builder
	b.WriteString("logbus: close left records undelivered")
	if e.Err != nil {
		fmt.Fprintf(&b, " (%v)", e.Err)
	}
	for i, u := range e.Unfinished {
		if i == 0 {
			b.WriteString(": ")
		} else {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "group %q topic %q partition %d committed %d end %d", u.Group, u.Topic, u.Partition, u.Committed, u.End)
		if u.Running {
			b.WriteString(" (handler still running)")
		}
	}
	return b.String()
}

// Unwrap returns Err.
func (e *ShutdownError) Unwrap() error { return e.Err }

// Unfinished is one partition a group had not finished when the broker
// stopped; see [ShutdownError].
type Unfinished struct {
	Group     string
	Topic     string
	Partition int
	Committed int64 // the next offset the group would have read
	End       int64 // the offset the next record would have had
	// Running is set when the partition's handler was still running when
	// Close returned: it ignored its context. It finishes in the background
	// and commits nothing; its record counts as not delivered.
	Running bool
}

// fail returns err, from the engine, as a pubsub error: "logbus: " and the
// call's verb in front, and the engine's error types turned into pubsub's.
// nil stays nil.
func fail(err error, format string, args ...any) error {
	if err == nil {
		return nil
	}
	if se, ok := errors.AsType[*engine.ShutdownError](err); ok {
		out := &ShutdownError{Err: se.Err, Unfinished: make([]Unfinished, len(se.Unfinished))}
		for i, u := range se.Unfinished {
			out.Unfinished[i] = Unfinished(u)
		}
		return out
	}
	return fmt.Errorf("logbus: "+format+": %w", append(args, err)...)
}

// errNilContext is the error of a call given a nil context.
var errNilContext = fmt.Errorf("%w: nil context", ErrInvalid)

// errNoBroker is the error of a call on a Broker that [NewBroker] did not make.
var errNoBroker = fmt.Errorf("%w: a Broker must be made by NewBroker, not declared", ErrInvalid)
